#!/usr/bin/env python3
"""scripts/bench --report on a results file made here: the driver-API table (--details) and its
target row follow from the figures in the file, a size with no driver figure gets no row, a check
made at several sizes is one target row judged on its worst size, a model run at a fixed batch gets
rows of its own, a model whose rounds spread past the noise bound is shown but not judged, the
thread-scaling rows come with the host's ceiling, the floor's rows give cudalloc's share and the
bound on the 10x target, --section writes between its markers and keeps the rest of the page,
--mix-only replaces the mix rows alone, and a results file that cannot be read or a malformed
--batch gives one line and a non-zero exit status."""
import json
import os
import subprocess
import sys
import tempfile

BENCH = sys.argv[1]
NOT_MEASURED = "not measured"


def pair(size, ns, is_async, driver=False):
    row = {"kind": "pair", "size": float(size), "async": float(is_async), "median_ns": float(ns),
           "p99_ns": float(2 * ns), "runs": 3.0}
    if driver:
        row["driver"] = 1.0
    return row


POOL = {512: 900.0, 65536: 700.0}          # cudaMallocAsync through the runtime
OURS = {512: 150.0, 65536: 160.0}          # cudalloc, cudaMalloc path
OURS_ASYNC = {512: 120.0, 65536: 110.0}    # cudalloc, async path
D_POOL, D_OURS, D_OURS_ASYNC = 640.0, 70.0, 58.0  # through the driver API, 512 B only


def results():
    def variant(table, is_async):
        return {"pairs": [pair(s, ns, is_async) for s, ns in table.items()], "mix": [], "threads": []}
    return {
        "command": "scripts/bench --quick --no-torch",
        "device": {"gpu": "Test GPU, 0.0, 1024 MiB", "torch": "none", "date": "2026-01-01"},
        "skipped": {},
        "micro": {
            "cudaMallocAsync": variant(POOL, 1),
            "cudalloc": variant(OURS, 0),
            "cudalloc async": variant(OURS_ASYNC, 1),
            "driver": {
                "cudaMallocAsync": {"pairs": [pair(512, D_POOL, 1, True)]},
                "cudalloc": {"pairs": [pair(512, D_OURS, 0, True)]},
                "cudalloc async": {"pairs": [pair(512, D_OURS_ASYNC, 1, True)]},
            },
        },
    }


def report(path, out, *extra):
    return subprocess.run([sys.executable, BENCH, "--report", path, "--markdown", out, "--details", *extra],
                          capture_output=True, text=True, timeout=60)


def report_lines(res, src, out, what):
    """Writes res to src, reports it to out and gives the report's lines; fails on an error exit."""
    with open(src, "w") as f:
        json.dump(res, f)
    p = report(src, out)
    if p.returncode != 0:
        fails(f"--report {what}: exit {p.returncode}: {p.stderr}")
    return open(out).read().splitlines()


def fails(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main():
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "r.json"), os.path.join(d, "r.md")
        with open(src, "w") as f:
            json.dump(results(), f)
        p = report(src, out)
        if p.returncode != 0:
            fails(f"--report exit {p.returncode}: {p.stderr}")
        md = open(out).read().splitlines()

        # The driver table: one row, for 512 B, with the runtime's share of the async pair.
        rows = [l for l in md if l.startswith("| 512 B |") and f"{D_POOL:.0f} ns" in l]
        if len(rows) != 1:
            fails(f"expected one driver-API row for 512 B, got {rows}")
        share = OURS_ASYNC[512] - D_OURS_ASYNC
        want = (f"| 512 B | {D_POOL:.0f} ns / {2 * D_POOL:.0f} ns | {D_OURS:.0f} ns / {2 * D_OURS:.0f} ns "
                f"| {D_OURS_ASYNC:.0f} ns / {2 * D_OURS_ASYNC:.0f} ns | {share:.0f} ns |")
        if rows[0] != want:
            fails(f"driver row\n  got  {rows[0]}\n  want {want}")
        start = md.index("## The same pairs through the driver API (median / p99)")
        table_end = next(i for i in range(start + 1, len(md)) if md[i].startswith("## "))
        if any(l.startswith("| 65536 B |") for l in md[start:table_end]):
            fails("a size with no driver-API figures got a row in the driver table")

        # Its target row: the pool against the faster of the two cudalloc paths.
        ratio = D_POOL / min(D_OURS, D_OURS_ASYNC)
        met = "yes" if ratio >= 10 else "no"
        target = [l for l in md if l.startswith("| ... the same through the driver API")]
        want = (f"| ... the same through the driver API (cuMemAlloc/cuMemAllocAsync, no runtime) "
                f"| {ratio:.1f}x over 1 size; worst 512 B: {min(D_OURS, D_OURS_ASYNC):.0f} ns vs {D_POOL:.0f} ns | {met} |")
        if target != [want]:
            fails(f"driver target rows\n  got  {target}\n  want {[want]}")
        # The runtime row still compares the runtime figures: one row for both sizes, its range
        # and its worst size.
        r = {s: POOL[s] / min(OURS[s], OURS_ASYNC[s]) for s in POOL}
        worst = min(r, key=r.get)
        want = (f"| cached pair >= 10x faster than the warm cudaMallocAsync pool | {r[worst]:.1f}-{max(r.values()):.1f}x "
                f"over 2 sizes; worst {worst} B: {min(OURS[worst], OURS_ASYNC[worst]):.0f} ns vs {POOL[worst]:.0f} ns "
                f"| {'yes' if min(r.values()) >= 10 else 'no'} |")
        if want not in md:
            fails(f"runtime target row missing: {want}")
        # Without --details the driver table is left out; its target row stays.
        p = subprocess.run([sys.executable, BENCH, "--report", src, "--markdown", out],
                           capture_output=True, text=True, timeout=60)
        text = open(out).read()
        if p.returncode != 0 or "## The same pairs through the driver API" in text \
                or "| ... the same through the driver API" not in text:
            fails("without --details: the driver table is still there, or its target row is gone")

        # Without a driver section there is no driver table and no driver target row.
        res = results()
        del res["micro"]["driver"]
        with open(src, "w") as f:
            json.dump(res, f)
        p = report(src, out)
        text = open(out).read()
        if p.returncode != 0 or "through the driver API" in text:
            fails("a results file without driver figures still got a driver table or target")

        # A model run at a fixed batch (--batch) is its own row, in the step table and in the
        # target rows, with the figures of the file.
        steps = {"native caching": 100.0, "no caching + cudalloc": 102.5,
                 "no caching + cudalloc expandable": 105.0, "cudaMallocAsync backend": 101.0}
        res = results()
        res["torch"] = {"gpt2 batch 32": {m: {"median_step_ms": v, "rounds": [v]} for m, v in steps.items()}}
        md = report_lines(res, src, out, "with a batch row")
        want = ("| PyTorch without caching under cudalloc within 3% of PyTorch's allocator (gpt2 batch 32) "
                "| +2.5% (102.50 vs 100.00 ms) | yes |")
        if want not in md:
            fails(f"parity row for the batch run missing: {want}")
        want = "| ... and faster than backend:cudaMallocAsync (gpt2 batch 32) | 102.50 vs 101.00 ms | no |"
        if want not in md:
            fails(f"cudaMallocAsync row for the batch run missing: {want}")
        want = "| expandable segments cost at most 2% per step (gpt2 batch 32) | +2.4% | no |"
        if want not in md:
            fails(f"expandable row for the batch run missing: {want}")
        if not any(l.startswith("| gpt2 batch 32 | 100.00 ms |") for l in md):
            fails("the step table has no row for gpt2 batch 32")
        # A model whose rounds of one mode spread past NOISE_SPREAD (host-bound steps) is shown
        # in the step table but not judged: one row names it; one within it is judged, in the same file.
        res = results()
        res["torch"] = {
            "gpt2": {m: {"median_step_ms": v, "rounds": [v, v * 1.3]} for m, v in steps.items()},
            "gpt2 batch 32": {m: {"median_step_ms": v, "rounds": [v, v * 1.01]} for m, v in steps.items()}}
        md = report_lines(res, src, out, "with a noisy model")
        noisy = [l for l in md if "(gpt2)" in l and l.startswith("| ")]
        if noisy:
            fails(f"rows of a model whose rounds spread 30% are judged: {noisy}")
        if "| (not judged, host noise: rounds of one mode more than 5% apart) | gpt2 | - |" not in md:
            fails("no row names the model not judged for host noise")
        if not any(l.startswith("| gpt2 | 100.00 ms |") for l in md):
            fails("the step table has no row for the noisy model")
        want = "| expandable segments cost at most 2% per step (gpt2 batch 32) | +2.4% | no |"
        if want not in md:
            fails(f"a model within the spread is no longer judged: {want}")
        every = [l for l in md if "on every model" in l]
        if not every or "host noise: gpt2" not in every[0] or not every[0].endswith("| no |"):
            fails(f"the every-model row does not name the noisy model apart from the missed one: {every}")
        # The thread-scaling rows, with the host's ceiling (core_pairs private_loop) beside them.
        res = results()
        res["micro"]["cudalloc async"]["threads"] = [
            {"threads": 1.0, "size": 65536.0, "async": 1.0, "pairs_per_s": 10e6, "runs": 3.0},
            {"threads": 8.0, "size": 65536.0, "async": 1.0, "pairs_per_s": 45e6, "runs": 3.0}]
        res["micro"]["core"] = [
            {"name": "private_loop", "threads": 1.0, "ns_per_pair": 7.0, "pairs_per_s": 140e6},
            {"name": "private_loop", "threads": 8.0, "ns_per_pair": 11.0, "pairs_per_s": 700e6}]
        md = report_lines(res, src, out, "with thread rows")
        for want in ("| 8 threads >= 5x the throughput of 1 (cudalloc async) | 4.5x | no |",
                     "| (the host's ceiling: thread-private work, core_pairs private_loop, 8 threads vs 1) | 5.0x | - |"):
            if want not in md:
                fails(f"thread scaling row missing: {want}")

        # The floor (bench/floor_interposer.cpp): its table gives cudalloc's share of each pair,
        # and the bound row the warm pool over the floor's async pair, for the sizes it measured.
        res = results()
        res["micro"]["floor"] = {"floor": {"pairs": [pair(65536, 100.0, 0)]},
                                 "floor async": {"pairs": [pair(65536, 70.0, 1)]}}
        md = report_lines(res, src, out, "with floor rows")
        for want in ("| 65536 B | 100 ns / 200 ns | 160 ns / 320 ns | 60 ns | 70 ns / 140 ns | 110 ns / 220 ns | 40 ns |",
                     "| (the most any interposer could reach: the warm pool over the floor's async pair, "
                     "bench/floor_interposer.cpp) | 10.0x over 1 size; worst 65536 B: floor 70 ns | - |"):
            if want not in md:
                fails(f"floor row missing: {want}")
        if any("the most any interposer could reach" in l and "512 B" in l for l in md):
            fails("a bound row for a size the floor did not measure")

        # Both sides in one process (bench_pairs --vs-pool, --threads-ab): the table, and target
        # rows judged from the ratios of the file, met and missed.
        res = results()
        res["micro"]["same_process"] = {
            "vs_pool": [{"kind": "vs_pool", "size": 512.0, "ours_median_ns": 60.0, "ours_p99_ns": 90.0,
                         "pool_median_ns": 690.0, "pool_p99_ns": 760.0, "direct_median_ns": 630.0,
                         "direct_p99_ns": 700.0, "ratio": 11.5, "direct_ratio": 10.5, "runs": 3.0},
                        {"kind": "vs_pool", "size": 65536.0, "ours_median_ns": 70.0, "ours_p99_ns": 95.0,
                         "pool_median_ns": 630.0, "pool_p99_ns": 710.0, "ratio": 9.0, "runs": 3.0}],
            "vs_pool native": [{"kind": "vs_pool", "size": 512.0, "ours_median_ns": 600.0, "ours_p99_ns": 700.0,
                                "pool_median_ns": 612.0, "pool_p99_ns": 705.0, "ratio": 1.02, "runs": 1.0}],
            "threads_ab": {"cudalloc": [{"kind": "threads_ab", "a": 1.0, "b": 8.0, "a_pairs_per_s": 8e6,
                                         "b_pairs_per_s": 44e6, "ratio": 5.5, "runs": 3.0}],
                           "cudalloc async": [{"kind": "threads_ab", "a": 1.0, "b": 8.0, "a_pairs_per_s": 12e6,
                                               "b_pairs_per_s": 48e6, "ratio": 4.0, "runs": 3.0}]},
            "threads_seq": {"cudalloc": [{"kind": "threads_seq", "threads": 8.0, "cpus": "0,2,4,6,8,10,12,14",
                                          "alone_pairs_per_s": 7e6, "together_pairs_per_s": 42e6, "ratio": 6.0,
                                          "runs": 3.0}],
                            "native cudaMallocAsync": [{"kind": "threads_seq", "threads": 8.0, "cpus": "0,1",
                                                        "alone_pairs_per_s": 1.5e6, "together_pairs_per_s": 0.9e6,
                                                        "ratio": 0.6, "runs": 3.0}],
                            "thread-private work, no allocator": [
                                {"kind": "threads_seq", "threads": 8.0, "private": 1.0, "cpus": "0,1",
                                 "alone_pairs_per_s": 50e6, "together_pairs_per_s": 360e6, "ratio": 7.2,
                                 "runs": 3.0}]}}
        md = report_lines(res, src, out, "with same-process rows")
        # The driver pool's row is a comparison, not a target of cudalloc's.
        if any("pinned a vCPU each" in l and "native" in l for l in md):
            fails("the native pool's pinned threads got a target row")
        for want in ("| 512 B | 60 ns / 90 ns | 690 ns / 760 ns | 630 ns / 700 ns | 11.5x | 10.5x | 1.02 |",
                     f"| 65536 B | 70 ns / 95 ns | 630 ns / 710 ns | {NOT_MEASURED} | 9.0x | {NOT_MEASURED} "
                     f"| {NOT_MEASURED} |",
                     "| cudalloc | 8,000,000 | 44,000,000 | 5.50x |",
                     "| ... the same, both in one process in alternating blocks (async path) | 9.0-10.5x over 2 sizes; "
                     "worst 65536 B: 70 ns vs 630 ns | no |",
                     "| ... the same, 1 and 8 threads alternating in one process (cudalloc) | 5.5x | yes |",
                     "| ... the same, 1 and 8 threads alternating in one process (cudalloc async) | 4.0x | no |",
                     "| ... the same 8 threads pinned a vCPU each, all at once against one at a time (cudalloc) | 6.0x | yes |",
                     "| cudalloc | 7,000,000 | 42,000,000 | 6.00x |",
                     "| native cudaMallocAsync | 1,500,000 | 900,000 | 0.60x |",
                     "| (the host's ceiling measured the same way: thread-private work, no allocator, 8 pinned threads) "
                     "| 7.2x | - |"):
            if want not in md:
                fails(f"same-process row missing: {want}")
        md = report_lines(results(), src, out, "without same-process rows")
        if any("one process" in l for l in md):
            fails("a results file without same-process figures got same-process rows")

        # A malformed --batch is refused before anything runs.
        for bad in ("vgg=4", "bert=0", "bert"):
            p = subprocess.run([sys.executable, BENCH, "--batch", bad, "--report", src, "--markdown", out],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 2 or "--batch" not in p.stderr or "Traceback" in p.stderr:
                fails(f"--batch {bad}: exit {p.returncode}, stderr {p.stderr!r}")

        # The mix table has a row per live-block count, with rows of the median of several runs
        # and rows of older files, from one run, alike.
        def mix_row(live, ns, runs=None):
            row = {"kind": "mix", "live": float(live), "median_ns": float(ns), "p99_ns": float(4 * ns)}
            if runs is not None:
                row["runs"] = float(runs)
            return row
        for runs in (3, None):
            res = results()
            res["micro"]["cudalloc"]["mix"] = [mix_row(1000, 300, runs), mix_row(100000, 330, runs)]
            md = report_lines(res, src, out, f"with mix rows of {runs} runs")
            if not any(l.startswith("| 100000 |") and "330 ns / 1320 ns" in l for l in md):
                fails(f"mix rows with runs={runs}: no 100000 row with its figures")

        # --mix-only runs the mix of each variant and the same-process mix, at each --mix-live
        # count, and puts their rows in place of the mix rows of --out, keeping the rest of it.
        fake = os.path.join(d, "fake-build")
        os.makedirs(os.path.join(fake, "gpu"))
        os.makedirs(os.path.join(fake, "bench"))
        exe = os.path.join(fake, "gpu", "bench_pairs")
        with open(exe, "w") as f:
            f.write("#!/usr/bin/env python3\n"
                    "import os, sys\n"
                    "a = sys.argv[1:]\n"
                    "live = a[a.index('--mix') + 1]\n"
                    "ns = 100 + int(live) // 100 + (7 if '--async' in a else 0)"
                    " + (1000 if 'LD_PRELOAD' not in os.environ else 0)\n"
                    "paths = ['async=0', 'async=1', 'async=1 pool=1', 'async=0 harness=1'] if '--vs-pool' in a"
                    " else ['async=%d' % ('--async' in a)]\n"
                    "n = os.path.join(os.path.dirname(sys.argv[0]), 'runs')\n"
                    "k = int(open(n).read()) + 1 if os.path.exists(n) else 0\n"
                    "open(n, 'w').write(str(k))\n"
                    "for p in paths:\n"  # a mean of its own each run: the median of 3 still merges them
                    "    print('mix live=%s %s median_ns=%d p99_ns=%d mean_ns=%d' % (live, p, ns, 4 * ns, 2 * ns + k))\n")
        os.chmod(exe, 0o755)
        with open(os.path.join(fake, "bench", "torch_pairs"), "w") as f:
            f.write("#!/bin/sh\nexit 3\n")  # PyTorch's case fails: its rows read not measured
        os.chmod(os.path.join(fake, "bench", "torch_pairs"), 0o755)
        res = results()
        res["micro"]["cudalloc"]["mix"] = [mix_row(100000, 999)]
        res["micro"]["PyTorch caching (C++)"] = {"pairs": [], "mix": [mix_row(1000, 999)], "threads": []}
        with open(src, "w") as f:
            json.dump(res, f)
        env = dict(os.environ, LD_PRELOAD="")
        env.pop("LD_PRELOAD")
        p = subprocess.run([sys.executable, BENCH, "--build", fake, "--mix-only", "--mix-live", "1000,10000",
                            "--out", src], capture_output=True, text=True, timeout=120, env=env)
        if p.returncode != 0:
            fails(f"--mix-only: exit {p.returncode}: {p.stderr[-600:]}")
        got = json.load(open(src))
        before = results()["micro"]
        if got["micro"]["cudalloc"]["pairs"] != before["cudalloc"]["pairs"] or \
                got["micro"]["cudalloc"]["threads"] != before["cudalloc"]["threads"]:
            fails("--mix-only changed the pair or thread rows")
        lives = sorted(int(r["live"]) for r in got["micro"]["cudalloc"]["mix"])
        if lives != [1000, 10000] or "--mix-only" not in got["command"]:
            fails(f"--mix-only: cudalloc's mix rows {got['micro']['cudalloc']['mix']}, command {got['command']!r}")
        if any(r.get("runs") != 3.0 for r in got["micro"]["cudalloc"]["mix"]):
            fails(f"--mix-only: cudalloc's mix rows are not the median of 3 runs: {got['micro']['cudalloc']['mix']}")
        if got["micro"]["PyTorch caching (C++)"]["mix"]:
            fails("--mix-only kept the mix rows of a variant whose mix failed now")
        if [r["median_ns"] for r in got["micro"]["cudalloc async"]["mix"]] != [117.0, 207.0]:
            fails(f"--mix-only: async rows {got['micro']['cudalloc async']['mix']}")
        short = {(int(r["live"]), int(r.get("async", 0)), int(r.get("pool", 0)), int(r.get("harness", 0)))
                 for r in got["micro"]["short"]["mix"]}
        if short != {(l, a, p, h) for l in (1000, 10000) for a, p, h in ((0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 0, 1))}:
            fails(f"--mix-only: same-process mix rows {sorted(short)}")
        md = report_lines(got, src, out, "after --mix-only")
        if not any(l.startswith("| 10,000-live mix within 20% of the 1,000-live mix per op (cudalloc) |")
                   and "200 ns vs 110 ns" in l for l in md):
            fails(f"--mix-only: no target row for the 10,000-live mix in {[l for l in md if 'live mix' in l]}")

        # --section: the tables go between the page's markers, one heading level down, without the
        # title; the rest of the page stays. A page without the markers is refused and left as it was.
        with open(src, "w") as f:
            json.dump(results(), f)
        page = ["# Page", "", "text before", "<!-- scripts/bench gpu begin -->", "old table",
                "<!-- scripts/bench gpu end -->", "text after", ""]
        with open(out, "w") as f:
            f.write("\n".join(page))
        p = subprocess.run([sys.executable, BENCH, "--report", src, "--markdown", out, "--section", "gpu"],
                           capture_output=True, text=True, timeout=60)
        md = open(out).read().splitlines()
        if p.returncode != 0 or md[:4] != page[:4] or md[-2:] != page[-3:-1] or "old table" in md \
                or "# Benchmarks" in md or "### Allocate+free pair, one thread (median / p99)" not in md:
            fails(f"--section: exit {p.returncode}, {p.stderr!r}, page {md[:6]} ... {md[-3:]}")
        with open(out, "w") as f:
            f.write("# Page without markers\n")
        p = subprocess.run([sys.executable, BENCH, "--report", src, "--markdown", out, "--section", "gpu"],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 2 or "Traceback" in p.stderr or open(out).read() != "# Page without markers\n":
            fails(f"--section without markers: exit {p.returncode}, stderr {p.stderr!r}")

        # The short-lived tables come from micro.short: a loop row per (size, pairs) with each
        # path's mean, cudalloc's and the floor's (rows without "lib" are cudalloc's), the mix per
        # path, the threads' better round per path and library; a cell that was not run reads
        # "not measured", and a results file without them gets no such table.
        res = results()
        sizes = [512, 2048]
        loops = [{"kind": "short", "size": float(sz), "pairs": 200.0, "path": path, "mean_ns": float(sz // 8 + k),
                  "runs": 3.0} for sz in sizes for k, path in enumerate(("cudaMalloc", "pool"))]
        floor_loop = {"kind": "short", "size": 512.0, "pairs": 200.0, "path": "cudaMalloc", "mean_ns": 61.0,
                      "runs": 3.0, "lib": "floor"}
        mix = [{"kind": "mix", "live": 1000.0, "async": float(a), "pool": float(p), "median_ns": 300.0 + a + p,
                "mean_ns": 400.0 + a + p} for a, p in ((0, 0), (1, 0), (1, 1))]
        mix[0].pop("pool")  # as bench_pairs prints it: pool=1 only on the pool's line
        mix.append({"kind": "mix", "live": 1000.0, "async": 0.0, "harness": 1.0, "median_ns": 40.0,
                    "mean_ns": 45.0})  # the harness alone: the last column
        threads = [{"kind": "short_threads", "threads": 8.0, "path": path, "round": float(r),
                    "pairs_per_s": 1000.0 * (r + 1) + k} for r in (0, 1) for k, path in enumerate(("cudaMalloc", "pool"))]
        floor_threads = [{"kind": "short_threads", "threads": 8.0, "path": "cudaMalloc", "round": float(r),
                          "pairs_per_s": 5000.0 + r, "lib": "floor"} for r in (0, 1)]
        res["micro"]["short"] = {"loops": loops + [floor_loop], "mix": mix, "threads": threads + floor_threads}
        md = report_lines(res, src, out, "short tables")
        bench_mod = {"__file__": BENCH, "__name__": "bench"}
        exec(compile(open(BENCH).read().split("\ndef main():")[0], BENCH, "exec"), bench_mod)
        fmt_ns = bench_mod["fmt_ns"]
        for sz in sizes:
            by_path = {r["path"]: r["mean_ns"] for r in loops if r["size"] == sz}
            floor = fmt_ns(floor_loop["mean_ns"]) if sz == 512 else NOT_MEASURED
            want = (f"| {sz} B | 200 | {fmt_ns(by_path['cudaMalloc'])} | {floor} | {NOT_MEASURED} | {NOT_MEASURED} "
                    f"| {fmt_ns(by_path['pool'])} |")
            if want not in md:
                fails(f"short loop row {want!r} not in {md}")
        want = "| 1,000 | " + " | ".join(f"{fmt_ns(r['mean_ns'])} / {fmt_ns(r['median_ns'])}" for r in mix) + " |"
        if want not in md:
            fails(f"short mix row {want!r} not in {md}")
        best = {path: max(r["pairs_per_s"] for r in threads if r["path"] == path) for path in ("cudaMalloc", "pool")}
        want = f"| 8 | {best['cudaMalloc']:,.0f} | {5001:,.0f} | {best['pool']:,.0f} |"
        if want not in md:
            fails(f"short threads row {want!r} not in {md}")
        if any(l.startswith("## Short loops") for l in report_lines(results(), src, out, "no short tables")):
            fails("a results file without micro.short got a short-loop table")

        # Pinned host pairs and CuPy: one row per size with the speedup; one row per mode with
        # the checksum compared with native's; absent parts say so.
        res = results()
        res["host"] = {"native": [{"kind": "host", "size": 4096.0, "mean_ns": 800000.0}],
                       "cudalloc": [{"kind": "host", "size": 4096.0, "mean_ns": 400.0}]}
        res["cupy"] = {"native": {"round_ms": 200.0, "checksum": "0x1p+0"},
                       "cudalloc": {"round_ms": 50.0, "checksum": "0x1p+1"}}
        md = report_lines(res, src, out, "host and CuPy tables")
        for want in (f"| 4096 B | {fmt_ns(800000.0)} | {fmt_ns(400.0)} | 2000x |", "| cudalloc | 50.0 ms | 4.00x | no |"):
            if want not in md:
                fails(f"row {want!r} not in {md}")
        md = report_lines(results(), src, out, "no host or CuPy results")
        if sum(l.startswith(NOT_MEASURED.capitalize()) for l in md) < 2:
            fails(f"missing host and CuPy results not reported as such: {md}")

        # Unreadable input (truncated, or JSON of another shape): one line on stderr, exit
        # status 2, no traceback.
        for bad in ('{"micro": ', '{"device": "a string", "micro": {}}', '[1, 2]'):
            with open(src, "w") as f:
                f.write(bad)
            p = report(src, out)
            lines = [l for l in p.stderr.splitlines() if l.strip()]
            if p.returncode != 2 or len(lines) != 1 or "Traceback" in p.stderr:
                fails(f"results file {bad!r}: exit {p.returncode}, stderr {p.stderr!r}")
    print("ok")


main()
