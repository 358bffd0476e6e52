#!/usr/bin/env python3
"""Bounded random-mutation fuzzing of the Python trace readers.

Targets (all in-process, so that an exception is seen as the exception it is; the CLIs turn any
unexpected exception into "internal error", exit 2, which would hide a bug):
  * cudalloc.trace.cli.main() (python/, what scripts/cudalloc-trace runs): summary,
    summary --json, plot (its input checks and collection; without matplotlib it then exits 2
    with its one-line message), export torch-snapshot|chrome|rmm
  * cudalloc.trace.inputs.convert() (scripts/replay's converters): auto-detection and every
    input format (cudalloc trace, PyTorch snapshot pickle, RMM CSV, the op stream), plain and
    gzipped
and, every --cli-every cases, the real command lines as subprocesses (exit status 0 or 2, no
"Traceback" on stderr).

Seeds: the trace and replay fixtures of the repository, the head of data/traces/demo-training.trace,
tests/fuzz/corpus/trace_readers/*, a trace with stacks (malformed `stack=` fields among the
hostile values). Mutations: bit flips, byte and line insertion, deletion,
duplication and shuffling, truncation, field replacement with hostile values (huge, negative,
NaN, empty, non-ASCII, very long), splicing of two inputs.

Pass: every case returns 0 or 2 (cudalloc-trace) / a result or InputError (replay_inputs). A
failing input is saved under --crash-dir with its traceback. Exit 0 if clean, 1 otherwise.

Usage: fuzz_trace_readers.py [--seconds 60] [--seed N] [--crash-dir DIR] [--cli-every 200]
"""

import argparse
import contextlib
import gzip
import glob
import io
import os
import pickle
import random
import resource
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "scripts")
sys.path.insert(0, os.path.join(ROOT, "python"))

from cudalloc.trace import inputs as replay_inputs  # noqa: E402


def load_cli():
    from cudalloc.trace import cli
    return cli


# What the evil pickle's command prints if a reader ever runs it (see seeds()).
PWNED_MARK = "PWNED-BY-42"

HOSTILE = [b"", b"-1", b"0", b"18446744073709551615", b"18446744073709551616", b"99999999999999999999999",
           b"0x", b"0xffffffffffffffffffff", b"nan", b"inf", b"-0", b"1e400", b"\xff\xfe", b"\x00",
           b"A" * 5000, b",,,,", b"\"", b"'", b"=", b"nvtx=" + b"/" * 300, b"stack=" + b"0x1;" * 200,
           b"alloc", b"free", b"segment_alloc", b"oom", b"ok", b"-", b"#cudalloc-trace v1", b"#cudalloc-trace v999",
           # matplotlib reads $...$ in a label or title as TeX, and hides labels starting with _.
           b"nvtx=$\\foo$", b"nvtx=_phase", b"cmdline=$\\frac{$",
           # stack= frames that are not hex addresses (once a ValueError out of summary and the
           # snapshot export instead of a file:line message).
           b"stack=0xzz", b"stack=zz/0x1", b"stack=0x1//x", b"stack=12345", b"stack=0x" + b"f" * 40]


STACK_TRACE = (b"#cudalloc-trace v1\n"
               b"ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,"
               b"reserved,extra\n"
               b"#map 7f0000000000-7f0000100000 r-xp 00000000 08:01 42 /nonexistent/libx.so\n"
               b"10,1,1,0,segment_alloc,0x0,0x7f0000000000,2097152,2097152,ok,0,0,2097152,\n"
               b"20,1,1,0,alloc,0x0,0x7f0000000000,1000,1024,ok,0,1024,2097152,"
               b"nvtx=fwd;stack=0x7f0000001234/0x7f0000005678\n"
               b"30,1,1,0,free,0x0,0x7f0000000000,1000,1024,ok,0,0,2097152,stack=0x7f0000001234\n"
               b"# end records=3 dropped=0\n")


def seeds():
    out = []
    for pattern in ["tests/trace/data/*.csv", "tests/replay/fixtures/*", "tests/fuzz/corpus/trace_readers/*"]:
        for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
            if os.path.isfile(path) and os.path.getsize(path) < 512 * 1024:
                with open(path, "rb") as f:
                    out.append((os.path.relpath(path, ROOT), f.read()))
    demo = os.path.join(ROOT, "data", "traces", "demo-training.trace")
    if os.path.isfile(demo):
        with open(demo, "rb") as f:
            head = b"".join(f.readline() for _ in range(400))
        out.append(("demo-training.trace[:400 lines]", head))
    # A trace with stacks and #map lines, for the stack= mutations.
    out.append(("stacks.trace", STACK_TRACE))
    out.append(("stacks.trace.gz", gzip.compress(STACK_TRACE)))
    # A pickle that would run a command if the snapshot reader were not restricted.
    # The shell computes the marker (PWNED_MARK): a reader's error message that quotes the
    # input holds the command's text, never its output.
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo PWNED-BY-$((6*7)) >&2",))
    out.append(("evil.pickle", pickle.dumps({"segments": [], "device_traces": [[Evil()]]})))
    return out


def mutate(rng, data, pool):
    data = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(10)
        if kind == 0 and data:  # bit flips
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(data))
                data[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:  # truncate
            del data[rng.randrange(len(data)):]
        elif kind == 2:  # insert hostile bytes
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.choice(HOSTILE)
        elif kind == 3 and data:  # delete a range
            i = rng.randrange(len(data))
            del data[i:i + rng.randint(1, 64)]
        elif kind in (4, 5):  # line operations
            lines = bytes(data).split(b"\n")
            if not lines:
                continue
            op = rng.randrange(4)
            i = rng.randrange(len(lines))
            if op == 0:
                lines.insert(rng.randrange(len(lines) + 1), lines[i])
            elif op == 1:
                del lines[i]
            elif op == 2:
                j = rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines[i:i] = [lines[i]] * rng.randint(2, 50)
            data = bytearray(b"\n".join(lines))
        elif kind == 6:  # replace one comma/blank separated field
            lines = bytes(data).split(b"\n")
            i = rng.randrange(len(lines))
            sep = b"," if b"," in lines[i] else b" "
            fields = lines[i].split(sep)
            fields[rng.randrange(len(fields))] = rng.choice(HOSTILE)
            lines[i] = sep.join(fields)
            data = bytearray(b"\n".join(lines))
        elif kind == 7:  # splice with another input
            other = rng.choice(pool)[1]
            if other:
                a = rng.randrange(len(data) + 1)
                b = rng.randrange(len(other) + 1)
                data = bytearray(bytes(data[:a]) + other[b:])
        elif kind == 8 and data:  # overwrite a byte with an interesting one
            data[rng.randrange(len(data))] = rng.choice(b"\x00\xff\n\r,:=x-#\x80")
        else:  # CRLF, or no final newline
            data = bytearray(bytes(data).replace(b"\n", b"\r\n")) if rng.random() < 0.5 else data.rstrip(b"\n")
        if len(data) > 2 * 1024 * 1024:
            del data[2 * 1024 * 1024:]
    return bytes(data)


class Failure(Exception):
    pass


# Bugs found by this harness in code outside tests/ (reported, not yet fixed there). The CLIs
# turn them into "internal error", exit 2 (no traceback), so the user-facing contract holds;
# they are listed, counted and printed as KNOWN rather than failing the stage. Set
# FUZZ_STRICT=1 to fail on them too. Key: (exception class name, file, function of the frame
# that raised). Remove an entry once its bug is fixed.
KNOWN = {}  # every bug this harness found so far is fixed; add entries here, with a comment


def signature(exc):
    tb = traceback.extract_tb(exc.__traceback__)
    frame = tb[-1] if tb else None
    return (type(exc).__name__, os.path.basename(frame.filename) if frame else "", frame.name if frame else "")


def run_cli(cli, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    if rc not in (0, 2):
        raise Failure("cudalloc-trace %s returned %r; stderr: %s" % (" ".join(argv), rc, err.getvalue()[-500:]))
    if "Traceback" in err.getvalue():
        raise Failure("traceback on stderr: %s" % err.getvalue()[-2000:])


def one_case(cli, rng, path, data, tmp):
    with open(path, "wb") as f:
        f.write(data)
    # replay_inputs: auto-detection, then each format explicitly.
    for fmt in ["auto"] + list(replay_inputs.FORMATS):
        try:
            conv = replay_inputs.convert(data, "fuzz-input", fmt)
            conv.text()
        except replay_inputs.InputError as e:
            if "\n" in str(e):
                raise Failure("InputError is not one line: %r" % str(e)[:300])
    # cudalloc-trace.
    cmd = rng.choice([["summary"], ["summary", "--json"], ["plot"],
                      ["export", "--format", "torch-snapshot"], ["export", "--format", "chrome"],
                      ["export", "--format", "rmm"]])
    if cmd[0] == "plot":  # plot has no --no-symbols
        argv = ["plot", path, "-o", os.path.join(tmp, "out.png")]
    else:
        argv = [cmd[0], path, "--no-symbols"] + cmd[1:]
    if cmd[0] == "export":
        argv += ["-o", os.path.join(tmp, "out")]
    run_cli(cli, argv)


def run_subprocess_checks(path, tmp, replay_bin):
    cmds = [[sys.executable, os.path.join(SCRIPTS, "cudalloc-trace"), "summary", path, "--no-symbols"],
            [sys.executable, os.path.join(SCRIPTS, "cudalloc-trace"), "export", path, "--format", "rmm",
             "-o", os.path.join(tmp, "sub.csv"), "--no-symbols"],
            [sys.executable, os.path.join(SCRIPTS, "cudalloc-trace"), "plot", path,
             "-o", os.path.join(tmp, "sub.png")]]
    if replay_bin:
        cmds.append([sys.executable, os.path.join(SCRIPTS, "replay"), path, "--replay-bin", replay_bin,
                     "--quiet", "--total", "4GiB"])
    env = dict(os.environ)
    env.pop("CUDALLOC_TRACE_DEBUG", None)
    for c in cmds:
        r = subprocess.run(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, timeout=120,
                           preexec_fn=lift_memory_limit)
        err = r.stderr.decode(errors="replace")
        if r.returncode not in (0, 2) or "Traceback" in err or "internal error" in err or PWNED_MARK in err:
            raise Failure("%s: exit %d, stderr %s" % (" ".join(c[1:3]), r.returncode, err[-1500:]))


# The readers run in this process under an address-space limit, so that an input which makes one
# of them allocate without bound is a MemoryError, saved with its input like any other finding,
# instead of the whole harness being killed by the kernel with nothing to reproduce it from.
MEMORY_LIMIT = 4 << 30


def limit_memory():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard)
    if soft == resource.RLIM_INFINITY or soft > want:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def lift_memory_limit():
    # The subprocess checks include cudalloc-replay, whose simulated device reserves address space.
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--crash-dir", default=None)
    ap.add_argument("--cli-every", type=int, default=200)
    ap.add_argument("--replay-bin", default=os.environ.get("CUDALLOC_REPLAY_BIN"))
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)
    # Printed first: a run that dies anyway can be repeated with --seed.
    print("fuzz_trace_readers: seed %d" % seed, flush=True)
    limit_memory()
    cli = load_cli()
    pool = seeds()
    crash_dir = a.crash_dir or tempfile.mkdtemp(prefix="fuzz-trace-crashes-")
    failures = 0
    known = {}
    strict = os.environ.get("FUZZ_STRICT") == "1"
    cases = 0
    subprocess_cases = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-trace-") as tmp:
        path = os.path.join(tmp, "input")
        # Every seed unmutated first.
        work = [(name, data) for name, data in pool]
        while True:
            if work:
                name, data = work.pop(0)
            else:
                if time.monotonic() - start >= a.seconds:
                    break
                name, base = rng.choice(pool)
                data = mutate(rng, base, pool)
            cases += 1
            try:
                one_case(cli, rng, path, data, tmp)
                if a.cli_every > 0 and cases % a.cli_every == 0:
                    subprocess_cases += 1
                    run_subprocess_checks(path, tmp, a.replay_bin)
            except Exception as e:  # Failure, or any exception out of the readers
                sig = signature(e)
                if sig in KNOWN and not strict:
                    if sig not in known:
                        os.makedirs(crash_dir, exist_ok=True)
                        with open(os.path.join(crash_dir, "known-%s-%s" % (sig[1], sig[2])), "wb") as f:
                            f.write(data)
                    known[sig] = known.get(sig, 0) + 1
                    continue
                failures += 1
                os.makedirs(crash_dir, exist_ok=True)
                out = os.path.join(crash_dir, "crash-%d" % failures)
                with open(out, "wb") as f:
                    f.write(data)
                with open(out + ".txt", "w") as f:
                    f.write("from seed input %s (seed %d)\n" % (name, seed))
                    f.write(traceback.format_exc())
                sys.stderr.write("FAIL (from %s): %s: %s -> %s\n" % (name, type(e).__name__,
                                                                     str(e).splitlines()[0][:200] if str(e) else "",
                                                                     out))
                if failures >= 20:
                    break
    elapsed = time.monotonic() - start
    for sig, n in sorted(known.items()):
        print("KNOWN (not counted as a failure; FUZZ_STRICT=1 to fail): %s: %d cases" % (KNOWN[sig], n))
    print("fuzz_trace_readers: %d cases (%d also as subprocesses) in %.1f s, seed %d, %d failures"
          % (cases, subprocess_cases, elapsed, seed, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
