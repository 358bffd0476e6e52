"""Tests of the trace tools for defects a review proved, one class each: the cases failed before
their fix. TRACE_SAMPLE_EXE writes the traces (the real writer), REPLAY_BIN is cudalloc-replay,
CUDALLOC_LIB the preload library for scripts/cudalloc.

    python3 test_trace_tools_review.py TRACE_SAMPLE_EXE REPLAY_BIN CUDALLOC_LIB [unittest args]
"""

import gzip
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

import memviz_check  # tests/trace, beside this file
import trace_test_main  # tests/trace, beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CT = os.path.join(ROOT, "scripts", "cudalloc-trace")
REPLAY = os.path.join(ROOT, "scripts", "replay")
FRAG = os.path.join(ROOT, "scripts", "fragmentation-report")
LAUNCHER = os.path.join(ROOT, "scripts", "cudalloc")
DATA = os.path.join(HERE, "data")

TRACE_SAMPLE = REPLAY_BIN = CUDALLOC_LIB = None
TMP = None


def run(*args, timeout=300, env=None):
    p = subprocess.run([sys.executable] + list(args), capture_output=True, encoding="utf-8",
                       errors="replace", timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def record(path, *more):
    """A trace written by trace_sample (the real writer) at `path` (str or bytes)."""
    p = subprocess.run([TRACE_SAMPLE, path] + list(more), capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return path


_sample = None


def sample():
    """The bytes of one complete trace_sample trace, with NVTX phases."""
    global _sample
    if _sample is None:
        with open(record(os.path.join(TMP, "sample.csv")), "rb") as f:
            _sample = f.read()
    return _sample


def write(name, raw):
    p = os.path.join(TMP, name)
    with open(p, "wb") as f:
        f.write(raw)
    return p


class ReplayInput(unittest.TestCase):
    def test_last_line_cut_inside_a_utf8_character(self):
        name = "\u9806\u4f1d\u64ad".encode()  # 3 bytes a character
        raw = sample().replace(b"nvtx=forward", b"nvtx=" + name)
        at = raw.index(b"nvtx=" + name, raw.index(b",alloc,0x7f00"))
        # Killed one byte into the first character of the name.
        p = write("cut_utf8.csv", raw[:at + len(b"nvtx=") + 1])
        rc, out, err = run(REPLAY, p, "--replay-bin", REPLAY_BIN, "--format", "json")
        self.assertEqual(rc, 0, err)
        self.assertIn("truncated last line", err)
        self.assertGreater(json.loads(out)["input"]["allocs"], 0)

    def test_non_utf8_command_line(self):
        # Older writers copied /proc/self/cmdline as is: here an argument in Latin-1.
        # Written into the header by hand, as the writer now replaces such bytes.
        raw = sample()
        at = raw.index(b"# cmdline=")
        end = raw.index(b"\n", at)
        path = write("cmdline.csv", raw[:end] + b" caf\xe9.txt" + raw[end:])
        rc, out, err = run(REPLAY, path, "--replay-bin", REPLAY_BIN)
        self.assertEqual(rc, 0, err)
        self.assertNotIn("UTF-8", err)
        rc, out, err = run(CT, "summary", path)
        self.assertEqual(rc, 0, err)
        self.assertIn("caf\ufffd.txt", out)


FORMATS = (("torch-snapshot", "snap.pickle"), ("chrome", "trace.json"), ("rmm", "rmm.csv"))


def load_output(fmt, path):
    if fmt == "torch-snapshot":
        with open(path, "rb") as f:
            return pickle.load(f)
    if fmt == "chrome":
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return f.read()


def cut_in_a_record(raw):
    """The first half of a trace, cut a few bytes into a record (a writer killed mid-write)."""
    half = raw[:len(raw) // 2]
    return half[:half.rfind(b"\n") + 5]


class ExportIncomplete(unittest.TestCase):
    def check(self, path, words):
        for fmt, out_name in FORMATS:
            out_path = os.path.join(TMP, "incomplete." + out_name)
            rc, out, err = run(CT, "export", path, "--format", fmt, "-o", out_path,
                               "--no-symbols")
            self.assertEqual(rc, 0, (fmt, err))
            self.assertIn(words, err, fmt)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            doc = load_output(fmt, out_path)
            if fmt == "torch-snapshot":
                self.assertTrue(doc["cudalloc_trace"]["incomplete"], doc.get("cudalloc_trace"))
            elif fmt == "chrome":
                self.assertTrue(doc["otherData"]["incomplete"], doc.get("otherData"))
                marks = [e for e in doc["traceEvents"] if e["name"].startswith("trace ")]
                self.assertEqual(len(marks), 1, marks)

    def test_truncated_last_line(self):
        self.check(write("half.csv", cut_in_a_record(sample())), "truncated")

    def test_not_closed(self):
        # Whole lines, but no "# end" line: the process died between two writes.
        raw = sample()
        self.check(write("unclosed.csv", raw[:raw.index(b"# end")]), "not closed")

    def test_complete_trace_is_quiet(self):
        p = write("whole.csv", sample())
        for fmt, out_name in FORMATS:
            out_path = os.path.join(TMP, "whole." + out_name)
            rc, out, err = run(CT, "export", p, "--format", fmt, "-o", out_path, "--no-symbols")
            self.assertEqual((rc, err), (0, ""), fmt)
            doc = load_output(fmt, out_path)
            if fmt == "torch-snapshot":
                self.assertEqual(set(doc), {"segments", "device_traces"})
            elif fmt == "chrome":
                self.assertNotIn("otherData", doc)


class ExportOutput(unittest.TestCase):
    def test_failed_export_keeps_the_previous_file(self):
        good = write("good.csv", sample())
        outdir = os.path.join(TMP, "exports")
        os.makedirs(outdir, exist_ok=True)
        for fmt, out_name in FORMATS:
            out_path = os.path.join(outdir, out_name)
            rc, out, err = run(CT, "export", good, "--format", fmt, "-o", out_path,
                               "--no-symbols")
            self.assertEqual(rc, 0, err)
            with open(out_path, "rb") as f:
                before = f.read()
            rc, out, err = run(CT, "export", os.path.join(DATA, "corrupt_middle.csv"),
                               "--format", fmt, "-o", out_path, "--no-symbols")
            self.assertEqual(rc, 2, (fmt, out, err))
            with open(out_path, "rb") as f:
                self.assertEqual(f.read(), before, fmt)
            load_output(fmt, out_path)
        self.assertEqual(sorted(os.listdir(outdir)), sorted(n for _, n in FORMATS))

    def test_failed_export_leaves_no_file(self):
        out_path = os.path.join(TMP, "never.json")
        rc, out, err = run(CT, "export", os.path.join(DATA, "corrupt_middle.csv"), "--format",
                           "chrome", "-o", out_path)
        self.assertEqual(rc, 2, err)
        self.assertFalse(os.path.exists(out_path))

    def test_output_through_a_symlink_and_to_a_device(self):
        good = write("good2.csv", sample())
        real = os.path.join(TMP, "real.rmm.csv")
        link = os.path.join(TMP, "link.rmm.csv")
        open(real, "w").close()
        os.symlink(real, link)
        rc, out, err = run(CT, "export", good, "--format", "rmm", "-o", link)
        self.assertEqual(rc, 0, err)
        self.assertTrue(os.path.islink(link))
        with open(real) as f:
            self.assertTrue(f.read().startswith("Thread,Time,Action"))
        rc, out, err = run(CT, "export", good, "--format", "chrome", "-o", os.devnull)
        self.assertEqual(rc, 0, err)
        self.assertFalse(os.path.isfile(os.devnull))
        rc, out, err = run(CT, "export", good, "--format", "rmm", "-o", "/dev/stdout")  # a pipe
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith("Thread,Time,Action"), out[:200])

    def test_existing_file_keeps_its_mode(self):
        good = write("good4.csv", sample())
        out_path = os.path.join(TMP, "private.rmm.csv")
        open(out_path, "w").close()
        os.chmod(out_path, 0o600)
        rc, out, err = run(CT, "export", good, "--format", "rmm", "-o", out_path)
        self.assertEqual(rc, 0, err)
        self.assertEqual(os.stat(out_path).st_mode & 0o777, 0o600)

    def test_new_file_mode_follows_the_umask(self):
        good = write("good3.csv", sample())
        out_path = os.path.join(TMP, "mode.rmm.csv")
        old = os.umask(0o022)
        try:
            rc, out, err = run(CT, "export", good, "--format", "rmm", "-o", out_path)
        finally:
            os.umask(old)
        self.assertEqual(rc, 0, err)
        self.assertEqual(os.stat(out_path).st_mode & 0o777, 0o644)


HEADER = ("#cudalloc-trace v1\n"
          "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,"
          "reserved,extra\n"
          "# options stack_depth=0 nvtx=1 ring_capacity=16384 clock=monotonic\n")


def chrome_slices(test, records):
    """Exports a trace of `records` (ts, tid, nvtx) to Chrome JSON; returns its NVTX slices."""
    lines = []
    for i, (ts, tid, nvtx) in enumerate(records):
        lines.append("%d,7,%d,0,alloc,-,0x%x,10,10,ok,0,%d,%d,nvtx=%s\n"
                     % (ts, tid, 0x1000 * (i + 1), 10 * (i + 1), 10 * (i + 1), nvtx))
    p = write("phases.csv", (HEADER + "".join(lines) +
                             "# end records=%d dropped=0\n" % len(records)).encode())
    out_path = os.path.join(TMP, "phases.json")
    rc, out, err = run(CT, "export", p, "--format", "chrome", "-o", out_path)
    test.assertEqual(rc, 0, err)
    with open(out_path) as f:
        return [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]


class ChromePhases(unittest.TestCase):
    def check_tracks(self, slices):
        by_tid = {}
        for e in slices:
            self.assertGreaterEqual(e["dur"], 0, e)
            by_tid.setdefault(e["tid"], []).append(e)
        for tid, track in by_tid.items():
            track.sort(key=lambda e: e["ts"])
            for a, b in zip(track, track[1:]):  # one after the other, never overlapping
                self.assertLessEqual(a["ts"] + a["dur"], b["ts"] + 1e-9, (tid, a, b))
        return {tid: [e["name"] for e in sorted(t, key=lambda e: e["ts"])]
                for tid, t in by_tid.items()}

    def test_clock_steps_back_across_threads(self):
        slices = chrome_slices(self, [(1000, 7, "forward"), (900, 8, "backward")])
        self.assertEqual(self.check_tracks(slices), {7: ["forward"], 8: ["backward"]})

    def test_each_thread_has_its_own_track(self):
        slices = chrome_slices(self, [
            (1000, 7, "forward"), (1100, 8, "backward"), (1200, 7, "forward"),
            (1300, 8, "optimizer"), (1400, 7, "backward"), (1500, 8, "optimizer")])
        self.assertEqual(self.check_tracks(slices),
                         {7: ["forward", "backward"], 8: ["backward", "optimizer"]})
        fwd = next(e for e in slices if e["name"] == "forward")
        self.assertEqual((fwd["ts"], fwd["dur"]), (1.0, 0.4))

    def test_clock_steps_back_in_one_thread(self):
        slices = chrome_slices(self, [(1000, 7, "forward"), (800, 7, "backward"),
                                      (1200, 7, "optimizer")])
        self.assertEqual(self.check_tracks(slices), {7: ["forward", "backward", "optimizer"]})


class FragmentationReport(unittest.TestCase):
    def traces_with(self, name, mangle):
        """A copy of data/traces whose figures name one workload, its trace mangled."""
        src = os.path.join(ROOT, "data", "traces")
        d = tempfile.mkdtemp(dir=TMP, prefix="traces-")
        with open(os.path.join(src, "pytorch-figures.json")) as f:
            figs = json.load(f)
        figs["workloads"] = {name: figs["workloads"][name]}
        with open(os.path.join(d, "pytorch-figures.json"), "w") as f:
            json.dump(figs, f)
        trace = figs["workloads"][name]["trace"]
        with open(os.path.join(src, trace), "rb") as f:
            raw = f.read()
        with open(os.path.join(d, trace), "wb") as f:
            f.write(mangle(raw))
        return d, trace

    def check(self, mangle, words):
        d, trace = self.traces_with("bert-infer", mangle)
        rc, out, err = run(FRAG, "--traces", d, "--check", "--replay-bin", REPLAY_BIN,
                           "--jobs", "1")
        self.assertEqual(rc, 2, (out, err))
        self.assertNotIn("Traceback", err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("fragmentation-report: "), err)
        self.assertIn(trace, lines[0])
        self.assertIn(words, lines[0])

    def test_truncated_gz(self):
        self.check(lambda raw: raw[:len(raw) // 2], "gzip")

    def test_corrupt_gz(self):
        # The header is fine; the deflate stream is garbage.
        self.check(lambda raw: raw[:10] + bytes(range(256)) * 4, "gzip")

    def test_bad_gzip_header(self):
        self.check(lambda raw: raw[:2] + b"\x09" + raw[3:], "gzip")  # method 9: unknown


STACK_HEADER = ("#cudalloc-trace v1\n"
                "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,"
                "reserved,extra\n"
                "# options stack_depth=4 nvtx=0 ring_capacity=16384 clock=tsc\n")


def stack_trace(name, stack, maps=""):
    """A small trace whose allocation has `stack` as its stack= field; `maps`: #map lines."""
    text = (STACK_HEADER + maps +
            "10,1,1,0,segment_alloc,0x0,0x7f0000000000,2097152,2097152,ok,0,0,2097152,\n"
            "20,1,1,0,alloc,0x0,0x7f0000000000,1000,1024,ok,0,1024,2097152,stack=%s\n"
            "30,1,1,0,free,0x0,0x7f0000000000,1000,1024,ok,0,0,2097152,\n"
            "# end records=3 dropped=0\n" % stack)
    return write(name, text.encode())


ALL_COMMANDS = [["summary"], ["summary", "--no-symbols"], ["summary", "--json"],
                ["export", "--format", "torch-snapshot"],
                ["export", "--format", "torch-snapshot", "--no-symbols"],
                ["export", "--format", "chrome"], ["export", "--format", "rmm"], ["plot"]]


def command(cmd, path, out_name):
    if cmd[0] == "plot":
        return ["plot", path, "-o", os.path.join(TMP, out_name + ".png")]
    argv = [cmd[0], path] + cmd[1:]
    if cmd[0] == "export":
        argv += ["-o", os.path.join(TMP, out_name)]
    return argv


class StackField(unittest.TestCase):
    """A stack= field that is not a list of hex addresses is a corrupt field like any other:
    file:line and exit 2 (summary and the snapshot export said "internal error: ValueError")."""

    def test_non_hex_stack(self):
        for stack in ("0xzz", "zz/0x1", "0x7f00/garbage", "12345", "0x" + "f" * 40):
            p = stack_trace("bad_stack.csv", stack)
            for cmd in ALL_COMMANDS:
                rc, out, err = run(CT, *command(cmd, p, "bad_stack.out"))
                self.assertEqual(rc, 2, (stack, cmd, out, err))
                self.assertNotIn("internal error", err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn("bad_stack.csv:5: corrupt record: stack", err, (stack, cmd))

    def test_good_stack_still_reads(self):
        p = stack_trace("good_stack.csv", "0x7f0000001234/0x7f0000005678")
        rc, out, err = run(CT, "summary", p, "--json", "--no-symbols")
        self.assertEqual(rc, 0, err)
        self.assertEqual(json.loads(out)["sites"][0]["stack"], ["0x7f0000001234", "0x7f0000005678"])


class MapNamesAFifo(unittest.TestCase):
    """A #map line may name anything: summary and export opened each named file to read its ELF
    type, and a FIFO there made them wait forever, --no-symbols or not."""

    def test_fifo_in_map_lines(self):
        fifo = os.path.join(TMP, "a-fifo")
        if not os.path.exists(fifo):
            os.mkfifo(fifo)
        maps = "#map 7f0000000000-7f0000100000 r-xp 00000000 08:01 42 %s\n" % fifo
        p = stack_trace("fifo_map.csv", "0x7f0000001234/0x7f0000005678", maps)
        for cmd in ALL_COMMANDS:
            rc, out, err = run(CT, *command(cmd, p, "fifo.out"), timeout=60)
            if cmd[0] == "plot" and rc == 2 and "matplotlib" in err:
                continue
            self.assertEqual(rc, 0, (cmd, err))
        # The frames are the raw, module-relative PCs: the FIFO was not read.
        rc, out, err = run(CT, "summary", p, "--json", timeout=60)
        frames = json.loads(out)["sites"][0]["frames"]
        self.assertEqual(frames[0]["name"], "a-fifo+0x1233")


class ExpandableExport(unittest.TestCase):
    """The snapshot export of expandable segments, checked by what PyTorch's viewer computes
    from it (memviz_check): each mapped chunk was a segment of its own (157 instead of 5),
    never expandable, blocks spanning chunks were cut, and the segment view showed 742 MiB
    allocated at the end where 1.55 GiB were live; the sizes were the rounded ones."""

    traces = {}

    def trace(self, label, *conf):
        if label not in self.traces:
            path = os.path.join(TMP, "demo-%s.trace" % label)
            p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_demo_trace.py"),
                                "--replay-bin", REPLAY_BIN, "-o", path] + list(conf),
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.traces[label] = path
        return self.traces[label]

    def export(self, path):
        out_path = path + ".pickle"
        rc, out, err = run(CT, "export", path, "--format", "torch-snapshot", "-o", out_path,
                           "--no-symbols")
        self.assertEqual((rc, err), (0, ""))
        with open(out_path, "rb") as f:
            return pickle.load(f)

    def check(self, path):
        snap = self.export(path)
        got = memviz_check.check(snap)
        truth = memviz_check.trace_truth(path)
        self.assertEqual(got["reserved_end"], truth["reserved_end"])
        self.assertEqual(got["allocated_end"], truth["live_requested_end"])
        self.assertEqual(got["timeline_live_end"], truth["live_requested_end"])
        self.assertEqual(got["timeline_peak"], truth["peak_requested"])
        self.assertEqual((got["segments_at_start"], got["blocks_at_start"]), (0, 0))
        return snap, got

    def test_expandable(self):
        snap, got = self.check(self.trace("expandable", "--conf", "expandable_segments:true"))
        # One segment per reserved range: (stream '-', legacy stream, copy stream) x pools.
        self.assertEqual(got["segments"], 5)
        self.assertEqual(got["expandable_segments"], 5)
        self.assertIn("segment_map", got["actions"])
        self.assertNotIn("segment_alloc", got["actions"])
        self.assertGreater(got["allocated_end"], 1.5 * 2 ** 30)
        kinds = sorted(s["segment_type"] for s in snap["segments"])
        self.assertEqual(kinds, ["large", "large", "small", "small", "small"])

    def test_expandable_with_unmaps(self):
        # Under a limit the allocator unmaps free chunks again: segment_unmap entries, and
        # ranges with holes.
        snap, got = self.check(self.trace("expandable-limit", "--conf",
                                          "expandable_segments:true", "--limit", "4.5GiB"))
        self.assertIn("segment_unmap", got["actions"])
        self.assertTrue(all(s["is_expandable"] for s in snap["segments"]))

    def test_plain_segments(self):
        snap, got = self.check(self.trace("plain"))
        self.assertEqual(got["expandable_segments"], 0)
        self.assertIn("segment_alloc", got["actions"])
        self.assertNotIn("segment_map", got["actions"])

    def test_requested_sizes(self):
        snap = self.export(self.trace("plain"))
        entries = snap["device_traces"][0]
        with open(self.trace("plain")) as f:
            # An allocation whose size rounding changes.
            first = next(v for v in (l.split(",") for l in f)
                         if len(v) == 14 and v[4] == "alloc" and v[7] != v[8])
        alloc = next(e for e in entries if e["action"] == "alloc"
                     and e["addr"] == int(first[6], 16) and e["time_us"] == int(first[0]) // 1000)
        self.assertEqual(alloc["size"], int(first[7]))
        blocks = [b for s in snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated"]
        self.assertTrue(any(b["requested_size"] < b["size"] for b in blocks))


class Gzipped(unittest.TestCase):
    def test_every_command_reads_gz(self):
        plain = write("gz.csv", sample())
        packed = write("gz.csv.gz", gzip.compress(sample()))
        rc, a, err = run(CT, "summary", plain, "--json", "--no-symbols")
        self.assertEqual(rc, 0, err)
        rc, b, err = run(CT, "summary", packed, "--json", "--no-symbols")
        self.assertEqual(rc, 0, err)
        a, b = json.loads(a), json.loads(b)
        a.pop("file"), b.pop("file")
        self.assertEqual(a, b)
        for cmd in ALL_COMMANDS[3:]:
            rc, out, err = run(CT, *command(cmd, packed, "gz.out"))
            if cmd[0] == "plot" and rc == 2 and "matplotlib" in err:
                continue
            self.assertEqual(rc, 0, (cmd, err))

    def test_corrupt_gz(self):
        packed = gzip.compress(sample())
        for name, data in (("cut.csv.gz", packed[:len(packed) // 2]),
                           ("garbage.csv.gz", packed[:10] + bytes(range(256)) * 4)):
            p = write(name, data)
            for cmd in (["summary", p], ["export", p, "--format", "chrome", "-o",
                                         os.path.join(TMP, "gz.json")]):
                rc, out, err = run(CT, *cmd)
                self.assertEqual(rc, 2, (name, err))
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertNotIn("internal error", err)
                self.assertIn(name, err)


class Progress(unittest.TestCase):
    def test_progress_bar_on_request_only(self):
        p = write("progress.csv", sample())
        rc, out, err = run(CT, "summary", p, "--no-symbols")
        self.assertEqual((rc, err), (0, ""))   # stderr is not a terminal: no bar
        try:
            import tqdm  # noqa: F401
        except ImportError:
            tqdm = None
        rc, out, err = run(CT, "summary", p, "--no-symbols", "--progress")
        self.assertEqual(rc, 0, err)
        if tqdm is not None:
            self.assertIn("summary progress.csv", err)
        # Without tqdm, --progress is no error: the bar is left out.
        fake = os.path.join(TMP, "no-tqdm", "tqdm")
        os.makedirs(fake, exist_ok=True)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write("raise ImportError('tqdm is hidden by the test')\n")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(fake))
        rc, out, err = run(CT, "summary", p, "--no-symbols", "--progress", env=env)
        self.assertEqual((rc, err), (0, ""))
        self.assertIn("peak allocated", out)


class Launcher(unittest.TestCase):
    """scripts/cudalloc with relative --build and --trace: a child that changes directory
    still has cudalloc preloaded and writes its trace where it was asked to."""

    def test_relative_paths_become_absolute(self):
        work = tempfile.mkdtemp(dir=TMP, prefix="launcher-")
        # A folder of prebuilt files (scripts/gpu-bundle's layout): nothing to build.
        os.makedirs(os.path.join(work, "bundle", "shim"))
        shutil.copy(CUDALLOC_LIB, os.path.join(work, "bundle", "shim", "libcudalloc.so"))
        os.makedirs(os.path.join(work, "elsewhere"))
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "NVTX_INJECTION64_PATH", "CUDALLOC_TRACE",
                            "CUDALLOC_CONF")}
        child = ('cd elsewhere && printf "%s\\n" "LD_PRELOAD=$LD_PRELOAD" '
                 '"CUDALLOC_TRACE=$CUDALLOC_TRACE" "NVTX=$NVTX_INJECTION64_PATH" && /bin/true')
        p = subprocess.run(["bash", LAUNCHER, "--build", "bundle", "--trace", "t.csv",
                            "--trace-nvtx", "--", "sh", "-c", child],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("cannot be preloaded", p.stderr)
        got = dict(l.split("=", 1) for l in p.stdout.splitlines())
        lib = os.path.join(work, "bundle", "shim", "libcudalloc.so")
        self.assertEqual(os.path.realpath(got["LD_PRELOAD"]), os.path.realpath(lib))
        self.assertTrue(os.path.isabs(got["LD_PRELOAD"]), got)
        self.assertEqual(got["NVTX"], got["LD_PRELOAD"])
        self.assertTrue(os.path.isabs(got["CUDALLOC_TRACE"]), got)
        self.assertEqual(os.path.realpath(got["CUDALLOC_TRACE"]),
                         os.path.realpath(os.path.join(work, "t.csv")))
        # --trace=FILE too.
        p = subprocess.run(["bash", LAUNCHER, "--build", "bundle", "--trace=t2.csv", "--",
                            "sh", "-c", 'echo "$CUDALLOC_TRACE"'],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(os.path.realpath(p.stdout.strip()),
                         os.path.realpath(os.path.join(work, "t2.csv")))


def main():
    return trace_test_main.run(globals(), ['TRACE_SAMPLE', 'REPLAY_BIN', 'CUDALLOC_LIB'], 'cudalloc-trace-review-')


if __name__ == "__main__":
    sys.exit(main())
