"""Reader tests for scripts/cudalloc-trace: summary, plot and export on a trace recorded just now
by tests/trace/trace_sample (the real writer) and on the fixtures in tests/trace/data, corrupt
and truncated ones included.

    python3 test_trace_reader.py SCRIPT TRACE_SAMPLE_EXE DATA_DIR
"""

import array
import json
import os
import pickle
import shutil
import subprocess
import sys
import unittest

import trace_test_main  # tests/trace, beside this file

SCRIPT = TRACE_SAMPLE = DATA = None
TMP = None


def run(*args, env=None):
    p = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True,
                       timeout=120, env=env)
    return p.returncode, p.stdout, p.stderr


def without_matplotlib():
    """An environment in which `import matplotlib` fails, as on a machine without it."""
    fake = os.path.join(TMP, "no-matplotlib", "matplotlib")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "__init__.py"), "w") as f:
        f.write("raise ImportError('matplotlib is hidden by the test')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(fake)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("CUDALLOC_TRACE_DEBUG", None)
    return env


def package_module(name):
    """A module of the trace tools' package (python/cudalloc/trace), imported here."""
    import importlib
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.path.join(root, "python") not in sys.path:
        sys.path.insert(0, os.path.join(root, "python"))
    return importlib.import_module("cudalloc.trace." + name)


def data(name):
    return os.path.join(DATA, name)


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


class Sample:
    """One trace recorded by trace_sample with stacks, and the truth it printed."""
    path = None
    truth = None

    @classmethod
    def get(cls):
        if cls.path is None:
            cls.path = os.path.join(TMP, "sample.csv")
            # Deep enough to reach trace_sample's own frames at -O0 too, where 6 frames were all
            # allocator internals and every allocation shared one site.
            p = subprocess.run([TRACE_SAMPLE, cls.path, "--stacks", "16"], capture_output=True,
                               text=True, timeout=120)
            assert p.returncode == 0, p.stderr
            cls.truth = dict(l.split("=", 1) for l in p.stdout.split() if "=" in l)
        return cls.path, cls.truth


class BadInput(unittest.TestCase):
    def check_one_line(self, cmd, words, env=None):
        rc, out, err = run(*cmd, env=env)
        self.assertEqual(rc, 2, (cmd, out, err))
        self.assertNotIn("Traceback", err)
        lines = err.strip().splitlines()
        self.assertEqual(len(lines), 1, (cmd, err))
        self.assertTrue(lines[0].startswith("cudalloc-trace: "), err)
        for w in words:
            self.assertIn(w, lines[0], cmd)

    def check_bad(self, path, *words):
        plot = ["plot", path, "-o", os.path.join(TMP, "x.png")]
        for cmd in (["summary", path], plot,
                    ["export", path, "--format", "chrome", "-o", os.path.join(TMP, "x.json")],
                    ["export", path, "--format", "torch-snapshot", "-o",
                     os.path.join(TMP, "x.pickle")],
                    ["export", path, "--format", "rmm", "-o", os.path.join(TMP, "x.rmm.csv")]):
            self.check_one_line(cmd, words)
        # Without matplotlib, plot still names what is wrong with the input (it once said only
        # that matplotlib was missing when the header was fine).
        self.check_one_line(plot, words, env=without_matplotlib())

    def test_missing_file(self):
        self.check_bad(os.path.join(TMP, "nope.csv"), "cannot open", "No such file")

    def test_directory(self):
        self.check_bad(TMP, "directory")

    def test_empty_file(self):
        p = os.path.join(TMP, "empty.csv")
        open(p, "w").close()
        self.check_bad(p, "empty")

    def test_not_a_trace(self):
        self.check_bad(data("not_a_trace.csv"), "not a cudalloc trace")

    def test_binary_garbage(self):
        p = os.path.join(TMP, "garbage.bin")
        with open(p, "wb") as f:
            f.write(bytes(range(256)) * 10)
        self.check_bad(p, "not a cudalloc trace")

    def test_unknown_version(self):
        self.check_bad(data("bad_version.csv"), "version 2", "not supported")

    def test_truncated_header(self):
        self.check_bad(data("truncated_header.csv"), "truncated")

    def test_corrupt_line_in_the_middle(self):
        self.check_bad(data("corrupt_middle.csv"), "corrupt_middle.csv:10:", "corrupt record")

    def test_bad_number_in_the_middle(self):
        self.check_bad(data("bad_field.csv"), "bad_field.csv:10:", "requested")

    def small_with_field(self, name, column, value):
        """small.csv with one field of its first record replaced; returns (path, line number)."""
        lines = open(data("small.csv")).read().split("\n")
        at = next(i for i, l in enumerate(lines) if l and l[0].isdigit())
        fields = lines[at].split(",")
        fields[column] = value
        lines[at] = ",".join(fields)
        p = os.path.join(TMP, name)
        with open(p, "w") as f:
            f.write("\n".join(lines))
        return p, at + 1

    def test_device_out_of_range(self):
        # A corrupt device field once made the snapshot export build a per-device list 2**64 long
        # (found by tests/fuzz/fuzz_trace_readers.py; the CI runner killed it for memory).
        p, lineno = self.small_with_field("bad_device.csv", 3, "18446744073709551615")
        self.check_bad(p, "bad_device.csv:%d:" % lineno, "device is not an ordinal")

    def test_numbers_past_64_bits(self):
        # A 5,000-digit hex pointer parsed, then the RMM export could not print it in decimal
        # (Python's 4,300-digit limit; found by the trace-reader fuzzer in CI).
        p, lineno = self.small_with_field("huge_ptr.csv", 6, "0x" + "f" * 5000)
        self.check_bad(p, "huge_ptr.csv:%d:" % lineno, "ptr does not fit 64 bits")
        p, lineno = self.small_with_field("huge_size.csv", 7, "1" + "0" * 20)
        self.check_bad(p, "huge_size.csv:%d:" % lineno, "requested does not fit 64 bits")

    def test_long_line_next_to_a_short_one(self):
        # One field too many, then a line without its first: as many fields as two good lines,
        # which the reader's block-at-a-time split once took for two records.
        p = os.path.join(TMP, "misaligned.csv")
        with open(p, "w") as f:
            f.write("#cudalloc-trace v1\n"
                    "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,"
                    "allocated,reserved,extra\n"
                    "10,1,1,0,alloc,0x0,0x10,5,5,ok,0,5,10,\n"
                    "11,1,1,0,alloc,0x0,0x20,5,5,ok,0,5,10,,12\n"
                    "1,1,0,alloc,0x0,0x30,5,5,ok,0,5,10,\n"
                    "# end records=3 dropped=0\n")
        self.check_bad(p, "misaligned.csv:4:", "15 fields, expected 14")

    def test_unwritable_output(self):
        rc, out, err = run("export", data("small.csv"), "--format", "rmm", "-o",
                           os.path.join(TMP, "no", "such", "dir.csv"))
        self.assertEqual(rc, 2)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertNotIn("Traceback", err)

    def test_plot_unwritable_output(self):
        small = data("small.csv")
        a_file = os.path.join(TMP, "a_file")
        open(a_file, "w").close()
        # Checked before the trace is read and before matplotlib is needed.
        checked_first = [
            (os.path.join(TMP, "no", "such", "mem.png"), ["cannot write", "No such file"]),
            (TMP, ["cannot write", "Is a directory"]),
            (os.path.join(a_file, "mem.png"), ["cannot write", "Not a directory"]),
        ]
        for env in (None, without_matplotlib()):
            for o, words in checked_first:
                self.check_one_line(["plot", small, "-o", o], words, env=env)
            self.check_one_line(["plot", small, "-o", os.path.join(TMP, "m.png"), "--dpi", "0"],
                                ["--dpi must be between 1 and"], env=env)
        if not have_matplotlib():
            return
        for o, words in [
                (os.path.join(TMP, "mem.xyz"), ["cannot write", "unknown image format 'xyz'"]),
                # savefig itself fails: nothing can be created in /proc, /dev/full is full.
                ("/proc/cudalloc-trace-test.png", ["cannot write", "No such file"]),
                ("/dev/full", ["cannot write", "No space left"])]:
            self.check_one_line(["plot", small, "-o", o], words)
        rc, out, err = run("plot", small, "-o", os.path.join(TMP, "m.png"), "--dpi", "6000")
        self.assertEqual(rc, 2)
        self.assertNotIn("internal error", err)  # once Agg's "image size too large" ValueError


class Fixture(unittest.TestCase):
    """small.csv: hand-written, with a dropped record and a truncated last line."""

    def test_summary_values(self):
        rc, out, err = run("summary", data("small.csv"))
        self.assertEqual(rc, 0, err)
        self.assertIn("device 0: peak allocated 32.43 MiB (34001408 B) at 0.000003 s", out)
        self.assertIn("peak reserved 50.00 MiB (52428800 B)", out)
        self.assertIn("the last line was truncated", out)
        self.assertIn("dropped 7 records", out)
        self.assertIn("cache hit rate: 50.0% (2 hits, 2 misses)", out)
        self.assertIn("1. 28.61 MiB (30000000 B)", out)
        self.assertIn("python train.py --epochs 1", out)

    def test_summary_json(self):
        rc, out, err = run("summary", data("small.csv"), "--json")
        self.assertEqual(rc, 0, err)
        s = json.loads(out)
        self.assertEqual(s["records"], 14)
        self.assertTrue(s["truncated"])
        self.assertFalse(s["closed_cleanly"])
        self.assertEqual(s["dropped"], 7)
        self.assertEqual(s["counts"]["alloc"], 4)
        self.assertEqual(s["devices"]["0"]["peak_allocated"], 34001408)
        self.assertEqual(s["devices"]["0"]["peak_reserved_ts_ns"], 3100)
        self.assertEqual(s["devices"]["1"]["final_reserved"], 0)
        self.assertEqual(s["largest"][0]["requested"], 30000000)
        self.assertEqual([m["rounded"] for m in s["miss_sizes"]], [30000128, 4000256])
        ph = s["phases"]
        self.assertEqual(list(ph), ["forward", "backward", "optimizer"])
        self.assertEqual(ph["forward"]["allocs"], 2)
        self.assertEqual(ph["forward"]["live_at_end"], 4000000)  # relu's block was freed
        self.assertEqual(ph["optimizer"]["peak_allocated"], 34001408)
        self.assertEqual(len(s["ooms"]), 1)
        # --nvtx-depth 0 keeps the whole range stack.
        rc, out, err = run("summary", data("small.csv"), "--json", "--nvtx-depth", "0")
        self.assertIn("forward/linear1", json.loads(out)["phases"])

    def test_rmm(self):
        out_path = os.path.join(TMP, "small.rmm.csv")
        rc, out, err = run("export", data("small.csv"), "--format", "rmm", "-o", out_path)
        self.assertEqual(rc, 0, err)
        with open(out_path) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "Thread,Time,Action,Pointer,Size,Stream")
        self.assertEqual(lines[1], "4243,10:00:00:000001,allocate,0x7f0000000000,4000000,0")
        actions = [l.split(",")[2] for l in lines[1:]]
        self.assertEqual(actions.count("allocate"), 5)
        self.assertEqual(actions.count("free"), 3)
        rc, out, err = run("export", data("small.csv"), "--format", "rmm", "--device", "1",
                           "-o", out_path)
        with open(out_path) as f:
            self.assertEqual(len(f.read().splitlines()), 3)


class Plot(unittest.TestCase):
    """plot on small.csv with names that matplotlib would otherwise interpret."""

    def small_with(self, name, old, new):
        with open(data("small.csv"), encoding="utf-8") as f:
            text = f.read()
        self.assertIn(old, text)
        p = os.path.join(TMP, name)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new))
        return p

    def test_without_matplotlib(self):
        rc, out, err = run("plot", data("small.csv"), "-o", os.path.join(TMP, "m.png"),
                           env=without_matplotlib())
        self.assertEqual(rc, 2)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("apt-get install python3-matplotlib", err)
        # Whatever Python runs it (a virtualenv, pyenv: no Debian package there).
        self.assertIn("pip install matplotlib", err)

    def test_svg_has_units_and_thread_bands(self):
        if not have_matplotlib():
            self.skipTest("matplotlib is missing for %s" % sys.executable)
        out_path = os.path.join(TMP, "small.svg")
        rc, out, err = run("plot", data("small.csv"), "-o", out_path)
        self.assertEqual(rc, 0, err)
        with open(out_path, encoding="utf-8") as f:
            svg = f.read()
        # matplotlib writes each text of an SVG as a comment beside its glyphs.
        for text in ("reserved / allocated (MiB)", "thread 4243", "thread 4244", "NVTX phase",
                     "forward", "backward", "optimizer", "allocated, device 0"):
            self.assertIn("<!-- %s" % text, svg, text)

    def test_envelope_keeps_every_spike(self):
        # A million records once became a solid block (the largest value per bucket, joined);
        # the envelope keeps the least and the greatest value of each bucket and the line the
        # value at its end.
        import random
        plot = package_module("plot")
        rng = random.Random(3)
        n = 100000
        ts = array.array("q", sorted(rng.randrange(10 ** 9) for _ in range(n)))
        vals = array.array("q", (1000 + rng.randrange(50) for _ in range(n)))
        spikes = rng.sample(range(n), 40)
        for i in spikes:
            vals[i] = 10 ** 6
        vals[n // 2] = 0
        results = [plot._envelope_python(ts, vals, 500)]
        try:
            import numpy
            results.append(tuple(list(map(int, a)) if k else list(a)
                                 for k, a in enumerate(plot._envelope_numpy(numpy, ts, vals, 500))))
        except ImportError:
            pass
        for x, lo, hi, last in results:
            self.assertEqual(len(lo), 500)
            width = (ts[-1] - ts[0]) / 500
            want_hi = {min(int((ts[i] - ts[0]) / width), 499) for i in spikes}
            self.assertEqual({k for k, v in enumerate(hi) if v == 10 ** 6}, want_hi)
            self.assertEqual(min(lo), 0)
            self.assertEqual(last[-1], vals[-1])
            self.assertTrue(all(lo[k] <= last[k] <= hi[k] for k in range(500)))
        if len(results) == 2:
            self.assertEqual(list(map(list, results[0][1:])), list(map(list, results[1][1:])))

    def test_names_are_shown_as_written(self):
        if not have_matplotlib():
            self.skipTest("matplotlib is missing for %s" % sys.executable)
        cases = [
            # $...$ is TeX to matplotlib: a bad formula in an NVTX name or the command line was
            # an "internal error" (a ValueError from its mathtext parser), exit 2, no plot.
            self.small_with("tex_nvtx.csv", "nvtx=forward", "nvtx=$\\frac{$"),
            self.small_with("tex_cmdline.csv", "python train.py", "$\\foo$ train.py"),
            # A label starting with _ was left out of the legend, with a warning on stderr.
            self.small_with("underscore.csv", "nvtx=forward", "nvtx=_forward"),
            # Glyphs the font lacks: drawn as boxes, and no warning per glyph on stderr.
            self.small_with("cjk.csv", "nvtx=forward", "nvtx=\u9806\u4f1d\u64ad\x01"),
        ]
        for p in cases:
            out_path = p + ".png"
            rc, out, err = run("plot", p, "-o", out_path)
            self.assertEqual(rc, 0, (p, err))
            self.assertEqual(err, "", p)
            self.assertEqual(out, "wrote %s\n" % out_path)
            with open(out_path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_output_without_extension_is_png_at_that_path(self):
        if not have_matplotlib():
            self.skipTest("matplotlib is missing for %s" % sys.executable)
        out_path = os.path.join(TMP, "memory")
        rc, out, err = run("plot", data("small.csv"), "-o", out_path)
        self.assertEqual(rc, 0, err)
        with open(out_path, "rb") as f:  # not memory.png, as savefig would name it
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


class Recorded(unittest.TestCase):
    """A trace the C++ writer wrote just now."""

    def test_summary_matches_the_allocator(self):
        path, truth = Sample.get()
        rc, out, err = run("summary", path, "--json")
        self.assertEqual(rc, 0, err)
        s = json.loads(out)
        self.assertFalse(s["truncated"])
        self.assertTrue(s["closed_cleanly"])
        self.assertEqual(s["dropped"], 0)
        self.assertEqual(s["records"], int(truth["records"]))
        self.assertEqual(s["devices"]["0"]["peak_allocated"], int(truth["dev0_peak_allocated"]))
        self.assertEqual(s["devices"]["0"]["peak_reserved"], int(truth["dev0_peak_reserved"]))
        self.assertEqual(s["devices"]["1"]["peak_allocated"], int(truth["dev1_peak_allocated"]))
        self.assertEqual(s["cache_hits"], int(truth["hits"]))
        self.assertEqual(s["cache_misses"], int(truth["misses"]))
        self.assertEqual(s["largest"][0]["requested"], 64 * 1024 * 1024)
        self.assertEqual(s["largest"][0]["nvtx"], "setup")
        self.assertEqual(len(s["ooms"]), int(truth["oom"]))
        self.assertEqual(list(s["phases"]), ["setup", "forward", "backward", "optimizer"])
        self.assertEqual(s["phases"]["forward"]["allocs"], 3 * 24)
        self.assertEqual(s["phases"]["setup"]["live_at_end"], 4 * 10 * 1024 * 1024 + 6000)
        # Stacks were recorded: one site is the single 64 MiB weights allocation, and sites
        # come sorted by bytes.
        self.assertGreater(len(s["sites"]), 1)
        by_bytes = [site["bytes"] for site in s["sites"]]
        self.assertEqual(by_bytes, sorted(by_bytes, reverse=True))
        if shutil.which("addr2line"):
            # Found by the function in its frames, wherever inlining and the optimization level
            # put it in the stack; main calls alloc_weights from two places (4 x 10 MiB, 64 MiB).
            weights = [site for site in s["sites"]
                       if any("alloc_weights" in f["name"] for f in site["frames"])]
            self.assertEqual(len(weights), 2, [site["frames"] for site in s["sites"]])
            weights = [site for site in weights if site["bytes"] == 64 * 1024 * 1024]
        else:
            weights = [site for site in s["sites"] if site["bytes"] == 64 * 1024 * 1024]
        self.assertEqual(len(weights), 1)
        self.assertEqual(weights[0]["allocs"], 1)

    def test_summary_text(self):
        path, truth = Sample.get()
        rc, out, err = run("summary", path)
        self.assertEqual(rc, 0, err)
        self.assertIn("(%s B)" % truth["dev0_peak_allocated"], out)
        self.assertIn("memory by NVTX phase", out)
        self.assertIn("allocation sites by bytes", out)
        rc, out, err = run("summary", path, "--no-symbols")
        self.assertEqual(rc, 0, err)
        self.assertIn("trace_sample+0x", out)  # raw, module-relative PCs

    def test_truncated_copy(self):
        path, truth = Sample.get()
        with open(path, "rb") as f:
            raw = f.read()
        # Cut inside a data record, as a kill in the middle of write(2) would: a few bytes
        # into the first record line that starts past the middle.
        start = raw.index(b"\n", len(raw) // 2) + 1
        while raw[start:start + 1] == b"#":
            start = raw.index(b"\n", start) + 1
        line_end = raw.index(b"\n", start)
        self.assertGreater(line_end - start, 5)
        cut = raw[:start + 5]
        p = os.path.join(TMP, "cut.csv")
        with open(p, "wb") as f:
            f.write(cut)
        rc, out, err = run("summary", p, "--json")
        self.assertEqual(rc, 0, err)
        s = json.loads(out)
        self.assertTrue(s["truncated"])
        self.assertEqual(s["records"], cut.count(b"\n") - sum(
            1 for l in cut.split(b"\n")[:-1] if l.startswith(b"#") or l.startswith(b"ts_ns")))

    def test_torch_snapshot(self):
        path, truth = Sample.get()
        out_path = os.path.join(TMP, "snap.pickle")
        rc, out, err = run("export", path, "--format", "torch-snapshot", "-o", out_path)
        self.assertEqual(rc, 0, err)
        with open(out_path, "rb") as f:
            snap = pickle.load(f)
        self.assertEqual(set(snap), {"segments", "device_traces"})
        rc, out, err = run("summary", path, "--json")
        final = json.loads(out)["devices"]
        per_dev = {}
        for seg in snap["segments"]:
            for k in ("device", "address", "total_size", "allocated_size", "active_size",
                      "requested_size", "stream", "segment_type", "segment_pool_id",
                      "is_expandable", "frames", "blocks"):
                self.assertIn(k, seg)
            self.assertIn(seg["segment_type"], ("small", "large"))
            # Blocks tile the segment exactly (what _memory_viz.segsum asserts).
            cursor = seg["address"]
            for b in seg["blocks"]:
                self.assertEqual(set(b), {"address", "size", "requested_size", "state", "frames"})
                self.assertEqual(b["address"], cursor)
                self.assertIn(b["state"], ("active_allocated", "inactive"))
                cursor += b["size"]
            self.assertEqual(cursor, seg["address"] + seg["total_size"])
            act = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
            self.assertEqual(act, seg["allocated_size"])
            d = per_dev.setdefault(seg["device"], [0, 0])
            d[0] += seg["allocated_size"]
            d[1] += seg["total_size"]
        # The segment state at the end of the trace is the allocator's.
        self.assertEqual(per_dev[0], [final["0"]["final_allocated"], final["0"]["final_reserved"]])
        self.assertEqual(len(snap["device_traces"]), 2)
        actions = [e["action"] for e in snap["device_traces"][0]]
        self.assertEqual(actions.count("alloc"), int(truth["hits"]) + int(truth["misses"]) - 1)
        self.assertEqual(actions.count("alloc"), actions.count("free_requested") +
                         sum(1 for s in snap["segments"] if s["device"] == 0
                             for b in s["blocks"] if b["state"] == "active_allocated"))
        self.assertEqual(actions.count("oom"), 1)
        e = snap["device_traces"][0][1]
        self.assertEqual(set(e) - {"user_metadata"},
                         {"action", "addr", "size", "stream", "frames", "time_us"})
        self.assertEqual(e["user_metadata"], "setup")
        self.assertTrue(e["frames"] and {"filename", "line", "name"} <= set(e["frames"][0]))
        self.assertEqual([e["action"] for e in snap["device_traces"][1]][-5:],
                         ["segment_alloc", "alloc", "free_requested", "free_completed",
                          "segment_free"])

    def test_chrome(self):
        path, truth = Sample.get()
        out_path = os.path.join(TMP, "trace.json")
        rc, out, err = run("export", path, "--format", "chrome", "-o", out_path)
        self.assertEqual(rc, 0, err)
        with open(out_path) as f:
            doc = json.load(f)
        ev = doc["traceEvents"]
        counters = [e for e in ev if e["ph"] == "C" and e["name"] == "device 0 memory"]
        self.assertGreater(len(counters), 10)
        self.assertEqual(max(e["args"]["allocated"] for e in counters),
                         int(truth["dev0_peak_allocated"]))
        self.assertEqual(max(e["args"]["reserved"] for e in counters),
                         int(truth["dev0_peak_reserved"]))
        self.assertEqual(sum(1 for e in ev if e["ph"] == "i" and e["name"].startswith("OOM")), 1)
        self.assertEqual({e["name"] for e in ev if e["ph"] == "X"},
                         {"setup", "forward", "backward", "optimizer"})

    def test_plot(self):
        path, truth = Sample.get()
        out_path = os.path.join(TMP, "mem.png")
        rc, out, err = run("plot", path, "-o", out_path)
        if not have_matplotlib():
            print("plot: matplotlib is missing for %s; checking the message instead "
                  "(apt-get install python3-matplotlib)" % sys.executable)
            self.assertEqual(rc, 2)
            self.assertIn("apt-get install python3-matplotlib", err)
            self.assertEqual(len(err.strip().splitlines()), 1)
            return
        self.assertEqual(rc, 0, err)
        with open(out_path, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(out_path), 10000)
        rc, out, err = run("plot", data("small.csv"), "-o", out_path)
        self.assertEqual(rc, 0, err)

    def test_concurrent_processes_give_separate_readable_files(self):
        base = os.path.join(TMP, "multi.csv")
        procs = [subprocess.Popen([TRACE_SAMPLE, base, "--no-nvtx"], stdout=subprocess.PIPE,
                                  text=True) for _ in range(3)]
        files = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0)
            files.append(dict(l.split("=", 1) for l in out.split() if "=" in l)["file"])
        # Whoever ran alone wrote `base`; any that overlapped wrote base.PID. All are readable.
        for f in set(files):
            self.assertTrue(f == base or f.startswith(base + "."), f)
            rc, out, err = run("summary", f)
            self.assertEqual(rc, 0, err)


def main():
    return trace_test_main.run(globals(), ['SCRIPT', 'TRACE_SAMPLE', 'DATA'], 'cudalloc-trace-reader-')


if __name__ == "__main__":
    sys.exit(main())
