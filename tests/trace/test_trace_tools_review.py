"""Tests of the trace tools for defects a review proved, one class each: the cases failed before
their fix. TRACE_SAMPLE_EXE writes the traces (the real writer), REPLAY_BIN is cudalloc-replay,
CUDALLOC_LIB the preload library for scripts/cudalloc.

    python3 test_trace_tools_review.py TRACE_SAMPLE_EXE REPLAY_BIN CUDALLOC_LIB [unittest args]
"""

import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import unittest

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


def run(*args):
    p = subprocess.run([sys.executable] + list(args), capture_output=True, encoding="utf-8",
                       errors="replace", timeout=300)
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
        # Writers before cd1ca42 copied /proc/self/cmdline as is: here an argument in Latin-1.
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
