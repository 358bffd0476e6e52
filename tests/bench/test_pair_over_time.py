#!/usr/bin/env python3
"""scripts/pair-over-time --parse on canned bench_pairs --repeat lines: the baseline is the 10th
percentile of the references, a timing is quiet only when both of its references are within the
margin, the medians are of the right timings per library, process medians are taken per process,
and input it cannot use (a line without references, an empty file, a missing file, a bad --lib)
gives one line and exit status 2."""
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = sys.argv[1]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def timing(lib, process, ns, before, after, size=512, use_async=0):
    return (f"lib={lib} process={process} pair size={size} async={use_async} median_ns={ns} p99_ns={ns + 40} "
            f"reference_before_ns={before:.2f} reference_after_ns={after:.2f}")


with tempfile.TemporaryDirectory() as tmp:
    raw = os.path.join(tmp, "raw.txt")
    lines = []
    # 20 references at 8.0 make the baseline 8.0 (limit 8.4 at 5%). cudalloc: process 1 quiet at
    # 110/120/130 and slow at 200 (after-reference high) and 210 (before-reference high);
    # process 2 quiet at 140. floor: all quiet.
    lines += [timing("cudalloc", 1, ns, 8.0, 8.0) for ns in (110, 120, 130)]
    lines += [timing("cudalloc", 1, 200, 8.0, 10.0), timing("cudalloc", 1, 210, 9.5, 8.0)]
    lines += [timing("cudalloc", 2, 140, 8.2, 8.3)]
    lines += [timing("floor", p, 80 + p, 8.0, 8.0) for p in (1, 2, 3, 4)]
    with open(raw, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(tmp, "s.json")
    r = run("--parse", raw, "--json", out)
    check(r.returncode == 0, f"exit 0 on good input ({r.returncode}: {r.stderr})")
    s = json.load(open(out))
    check(s["reference_baseline_ns"] == 8.0, f"baseline 8.0 ({s['reference_baseline_ns']})")
    check(abs(s["quiet_limit_ns"] - 8.4) < 1e-9, f"limit 8.4 ({s['quiet_limit_ns']})")
    g = {x["lib"]: x for x in s["groups"]}
    c = g["cudalloc"]
    check(c["timings"] == 6 and c["processes"] == 2, f"cudalloc counts {c['timings']} {c['processes']}")
    check(c["quiet_timings"] == 4 and c["quiet_median_ns"] == 125, f"quiet 4 timings, median 125 ({c})")
    check(c["slow_timings"] == 2 and c["slow_median_ns"] == 205, f"slow 2 timings, median 205 ({c})")
    check(c["median_ns"] == 135, f"median of all 135 ({c['median_ns']})")
    # process 1: median of 110,120,130,200,210 = 130; process 2: 140 -> 135
    check(c["median_of_process_medians_ns"] == 135, f"median of process medians 135 ({c})")
    f = g["floor"]
    check(f["quiet_timings"] == 4 and f["slow_timings"] == 0 and f["slow_median_ns"] is None, f"floor all quiet ({f})")
    check("quiet 4 (67%) median 125 ns; slow 2 median 205 ns" in r.stdout, f"report line ({r.stdout})")

    check("speedup_over_native" not in c, "no speed-up without a native run")

    # With a native run of the same size and order: its median over each library's.
    with open(raw, "a") as f:
        f.write("\n".join(timing("native", p, 600, 8.0, 8.0) for p in (1, 2)) + "\n")
        f.write(timing("native", 3, 900, 9.9, 9.9) + "\n")
    r = run("--parse", raw, "--json", out)
    g = {x["lib"]: x for x in json.load(open(out))["groups"]}
    check(g["native"]["median_ns"] == 600 and "speedup_over_native" not in g["native"], f"native group ({g['native']})")
    check(g["cudalloc"]["speedup_over_native"] == round(600 / 135, 2), f"speed-up of all timings ({g['cudalloc']})")
    check(g["cudalloc"]["quiet_speedup_over_native"] == round(600 / 125, 2), f"quiet speed-up ({g['cudalloc']})")
    check("faster than native" in r.stdout, f"report names the speed-up ({r.stdout})")
    with open(raw, "w") as f:
        f.write("\n".join(lines) + "\n")

    # A gzipped RAW reads the same (docs/results keeps them so).
    import gzip
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
        dst.write(src.read())
    r = run("--parse", raw + ".gz", "--json", out)
    c = {x["lib"]: x for x in json.load(open(out))["groups"]}["cudalloc"]
    check(r.returncode == 0 and c["quiet_median_ns"] == 125, f"gzipped input ({r.stderr})")
    with open(raw + "x.gz", "wb") as f:
        f.write(b"not gzip")
    r = run("--parse", raw + "x.gz")
    check(r.returncode == 2 and "cannot read" in r.stderr, f"a broken .gz: exit 2 ({r.returncode}: {r.stderr})")

    # A wider margin counts the 9.5 reference as quiet.
    r = run("--parse", raw, "--quiet-margin", "0.2", "--json", out)
    c = {x["lib"]: x for x in json.load(open(out))["groups"]}["cudalloc"]
    check(c["quiet_timings"] == 5, f"margin 20%: 5 quiet ({c})")

    bad = os.path.join(tmp, "bad.txt")
    with open(bad, "w") as f:
        f.write(lines[0] + "\nlib=cudalloc process=1 pair size=512 async=0 median_ns=120 p99_ns=150\n")
    r = run("--parse", bad)
    check(r.returncode == 2 and "line 2" in r.stderr and r.stderr.count("\n") == 1,
          f"a line without references: exit 2, one line ({r.returncode}: {r.stderr})")
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    r = run("--parse", empty)
    check(r.returncode == 2 and "no timing" in r.stderr, f"empty input: exit 2 ({r.returncode}: {r.stderr})")
    r = run("--parse", os.path.join(tmp, "none.txt"))
    check(r.returncode == 2 and "cannot read" in r.stderr, f"missing file: exit 2 ({r.returncode}: {r.stderr})")
    r = run("--build", tmp, "--processes", "1")
    check(r.returncode == 2 and "missing" in r.stderr, f"a build without bench_pairs: exit 2 ({r.stderr})")
    r = run("--build", tmp, "--lib", "variant")
    check(r.returncode == 2 and "NAME=PATH" in r.stderr, f"--lib without a path: exit 2 ({r.stderr})")
    r = run("--build", tmp, "--lib", "floor=/x.so")
    check(r.returncode == 2 and "taken" in r.stderr, f"--lib with a taken name: exit 2 ({r.stderr})")
    fake = os.path.join(tmp, "build")  # a bundle whose files exist (never run: the check comes first)
    for part in ("gpu/bench_pairs", "shim/libcudalloc.so", "bench/libfloor_interposer.so"):
        os.makedirs(os.path.dirname(os.path.join(fake, part)), exist_ok=True)
        open(os.path.join(fake, part), "w").close()
    r = run("--build", fake, "--lib", "v=" + os.path.join(tmp, "none.so"))
    check(r.returncode == 2 and "none.so missing" in r.stderr, f"--lib with no such file: exit 2 ({r.stderr})")

print(f"{'FAILED' if failures else 'ok'}: {len(failures)} failures")
sys.exit(1 if failures else 0)
