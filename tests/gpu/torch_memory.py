"""Live device memory of a workload under PyTorch's allocator and under cudalloc.

    python3 tests/gpu/torch_memory.py --workloads llama-train[,unet-train...] --out FILE.json
        [--lib build/shim/libcudalloc.so] [--cudalloc-conf CONF]... [--settings default,expandable,cudalloc]
        [--repeat N] [--timeout S] [--dry-run] [--device cpu --tiny]

Each run is a fresh process running one workload of collect_traces.py (the same functions), with
the same seeds and deterministic kernels, under one setting:

  default             PyTorch's caching allocator
  expandable          PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cudalloc CONF       PYTORCH_NO_CUDA_MEMORY_CACHING=1, LD_PRELOAD=LIB, CUDALLOC_STATS=1 and
                      CUDALLOC_CONF=CONF, once per --cudalloc-conf (passed through untouched;
                      '' is cudalloc's defaults)

Per run: the device's peak memory in use as the driver sees it, polled through NVML
(libnvidia-ml.so.1) every millisecond from this process, outside the workload's, less the
figure once the workload's CUDA context exists and before its model is built (the process waits
for this one to read it); the same from cudaMemGetInfo at step boundaries, a coarser fallback
(under cudalloc its free figure counts cudalloc's idle cache as free: peaks of allocated, not
reserved); PyTorch's max_memory_allocated/reserved where its cache is on; cudalloc's peak
allocated and reserved from its CUDALLOC_STATS summary; each step's loss as a float hex string
(bit for bit) and time; whether the losses equal the first run's. Unavailable figures are null
in the JSON and n/a in the table. The JSON goes to FILE.json, the children's stderr to
FILE.json.logs/, a table to stdout; the exit status is 1 if a run failed or losses differ.

Runs never overlap (NVML sees the whole device: nothing else should use the GPU meanwhile); each
has a timeout, and its process group is killed on timeout, on error and on exit.
"""
import argparse
import ctypes
import datetime
import json
import os
import queue
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))
import collect_traces  # noqa: E402

TAG = "TORCH_MEMORY "  # the child's protocol lines on stdout
GiB = float(1 << 30)
CLEARED = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
           "LD_PRELOAD", "CUDALLOC_CONF", "CUDALLOC_STATS", "CUDALLOC_TRACE", "CUDALLOC_NO_CACHING")


# --- the child: one workload under one setting

def emit(kind, obj):
    sys.stdout.write(TAG + kind + " " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def child(a):
    try:  # dies with the parent, even one killed outright
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if a.handshake and os.getppid() == 1:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import workloads
    workloads.prepare(torch, a.device)
    cuda = a.device == "cuda"
    base = {"device": a.device, "torch": torch.__version__}
    if cuda:
        # Creates the context first: the parent's baseline includes it, not the model.
        free, total = torch.cuda.mem_get_info()
        base.update(free=free, total=total, gpu=torch.cuda.get_device_name(0))
    emit("BASELINE", base)
    if a.handshake:
        sys.stdin.readline()  # the parent reads the driver's figure meanwhile

    def on_step(i, loss, seconds):
        rec = {"step": i, "loss": float(loss).hex(), "ms": round(1000 * seconds, 3)}
        if cuda:
            rec["free"] = torch.cuda.mem_get_info()[0]
        emit("STEP", rec)

    rt = workloads.Runtime(torch, a.device, a.tiny, on_step)
    t0 = time.time()
    collect_traces.run_workload(a.workload, torch, rt)
    rt.sync()
    res = {"seconds": round(time.time() - t0, 2), "losses": [v.hex() for v in rt.losses],
           "step_ms": [round(1000 * t, 3) for t in rt.step_s]}
    if cuda and os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        res.update(max_memory_allocated=torch.cuda.max_memory_allocated(),
                   max_memory_reserved=torch.cuda.max_memory_reserved())
    emit("RESULT", res)


# --- the parent

class Nvml:
    """nvmlDeviceGetMemoryInfo through ctypes; raises OSError where NVML is missing."""

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def __init__(self, index):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        self.handle = ctypes.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(self.handle))
        if rc != 0:
            raise OSError("nvmlDeviceGetHandleByIndex_v2(%d) returned %d" % (index, rc))
        self.used()

    def used(self):
        m = self._Memory()
        rc = self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(m))
        if rc != 0:
            raise OSError("nvmlDeviceGetMemoryInfo returned %d" % rc)
        return m.used


class Poller(threading.Thread):
    """Samples NVML's used bytes every `period` seconds until stopped; keeps the peak."""

    def __init__(self, nvml, period):
        super().__init__(daemon=True)
        self.nvml, self.period = nvml, period
        self.peak, self.samples, self.peak_at = 0, 0, None
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop_event.is_set():
            used = self.nvml.used()
            self.samples += 1
            if used > self.peak:
                self.peak, self.peak_at = used, time.monotonic() - self.t0
            time.sleep(self.period)

    def stop(self):
        self.stop_event.set()
        self.join(5)
        return time.monotonic() - self.t0


_RUNNING = set()  # children's process groups, killed on any exit


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        pass
    _RUNNING.discard(p)


def _on_signal(signum, _frame):
    for p in list(_RUNNING):
        kill_group(p)
    sys.exit(128 + signum)


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def cudalloc_peaks(text):
    """Peak allocated and reserved bytes from CUDALLOC_STATS=1's table(s) at exit (as
    scripts/bench reads them), or None."""
    peaks = {}
    for line in text.splitlines():
        m = re.match(r"^\|\s*(Allocated|Reserved) memory\s", line)
        if not m:
            continue
        values = re.findall(r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)\b", line)
        if len(values) >= 2:  # current, peak, total
            v = int(float(values[1][0]) * _UNITS[values[1][1]])
            key = m.group(1).lower()
            peaks[key] = max(peaks.get(key, 0), v)
    if "allocated" not in peaks or "reserved" not in peaks:
        return None
    return peaks


def nondeterministic_ops(text):
    """The ops PyTorch warned have no deterministic implementation (they may make losses differ
    between runs whatever the allocator)."""
    return sorted(set(re.findall(r"(\w+) does not have a deterministic implementation", text)))


def settings(a, lib):
    out = []
    names = [s for s in a.settings.split(",") if s]
    if "default" in names:
        out.append(("default", {}))
    if "expandable" in names:
        out.append(("expandable", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))
    if "cudalloc" in names:
        for conf in a.cudalloc_conf or ["expandable_segments:true"]:
            out.append(("cudalloc " + (conf or "(defaults)"),
                        {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "LD_PRELOAD": lib, "CUDALLOC_STATS": "1",
                         "CUDALLOC_CONF": conf}))
    return out


def child_cmd(a, workload, handshake=True):
    cmd = [sys.executable, HERE, "--child"] + (["--handshake"] if handshake else [])
    cmd += ["--workload", workload, "--device", a.device]
    return cmd + (["--tiny"] if a.tiny else [])


def child_env(extra):
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_one(a, workload, name, extra, nvml, log_path):
    """One child; returns its record."""
    rec = {"setting": name, "env": extra, "error": None, "steps": [], "nvml": nvml is not None}
    used_before = nvml.used() if nvml else None
    t_start = time.monotonic()
    deadline = t_start + a.timeout
    with open(log_path, "w") as err:
        p = subprocess.Popen(child_cmd(a, workload), env=child_env(extra), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    _RUNNING.add(p)
    lines = queue.Queue()

    def reader():
        for raw in p.stdout:
            lines.put(raw.decode("utf-8", "replace").rstrip("\n"))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    poller, other, baseline = None, [], None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                line = lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                break
            if not line.startswith(TAG):
                other.append(line)
                continue
            kind, _, body = line[len(TAG):].partition(" ")
            obj = json.loads(body)
            if kind == "BASELINE":
                rec["child"] = obj
                if nvml:
                    time.sleep(0.05)
                    baseline = nvml.used()
                    poller = Poller(nvml, a.poll_ms / 1000.0)
                    poller.start()
                try:
                    p.stdin.write(b"go\n")
                    p.stdin.flush()
                except OSError:
                    pass  # it died; its exit status tells
            elif kind == "STEP":
                rec["steps"].append(obj)
            elif kind == "RESULT":
                rec.update(obj)
        p.wait(max(1.0, deadline - time.monotonic()))
    except (TimeoutError, subprocess.TimeoutExpired):
        rec["error"] = "timed out after %ds" % a.timeout
    finally:
        polled = poller.stop() if poller else None
        kill_group(p)  # also whatever the child left in its group
    rec["rc"] = p.returncode
    rec["wall_s"] = round(time.monotonic() - t_start, 2)
    with open(log_path, errors="replace") as f:
        text = f.read()
    if rec["error"] is None and (p.returncode != 0 or "losses" not in rec):
        tail = (text.strip().splitlines() or other or [""])[-3:]
        rec["error"] = "rc=%s: %s" % (p.returncode, " | ".join(tail)[-500:])
    rec["stdout_other"] = other[-20:]
    rec["nondeterministic_ops"] = nondeterministic_ops(text)
    # The driver's view: peak in use less the baseline (the context and whatever else was there).
    rec["device_used_before_child"] = used_before
    rec["baseline_used"] = baseline
    rec["context_bytes"] = baseline - used_before if baseline is not None and used_before is not None else None
    if poller is not None and poller.samples:
        rec["nvml_peak"] = max(0, poller.peak - baseline)
        rec["nvml_samples"] = poller.samples
        rec["nvml_mean_period_ms"] = round(1000 * polled / poller.samples, 3) if polled else None
        rec["nvml_peak_at_s"] = round(poller.peak_at, 3) if poller.peak_at is not None else None
    else:
        rec["nvml_peak"] = None
    free0 = rec.get("child", {}).get("free")
    frees = [s["free"] for s in rec["steps"] if "free" in s]
    rec["step_boundary_peak"] = max(0, free0 - min(frees)) if free0 is not None and frees else None
    peaks = cudalloc_peaks(text) if "LD_PRELOAD" in extra else None
    rec["cudalloc_peak_allocated"] = peaks["allocated"] if peaks else None
    rec["cudalloc_peak_reserved"] = peaks["reserved"] if peaks else None
    ms = rec.get("step_ms") or []
    # The first step also loads kernels and creates library handles: left out where there are more.
    rec["median_step_ms"] = round(statistics.median(ms[1:] if len(ms) > 1 else ms), 3) if ms else None
    return rec


def gib(v):
    return "n/a" if v is None else "%.3f" % (v / GiB)


def table(doc):
    head = ("workload", "setting", "driver peak", "at steps", "torch alloc/resv", "cudalloc alloc/resv",
            "median ms", "losses", "status")
    rows = [head]
    for w, wd in doc["workloads"].items():
        for r in wd["runs"]:
            torch_fig = ("%s/%s" % (gib(r.get("max_memory_allocated")), gib(r.get("max_memory_reserved")))
                         if r.get("max_memory_reserved") is not None else "n/a")
            cud = ("%s/%s" % (gib(r["cudalloc_peak_allocated"]), gib(r["cudalloc_peak_reserved"]))
                   if r.get("cudalloc_peak_reserved") is not None else "n/a")
            rows.append((w, r["setting"] + ("" if r.get("round", 0) == 0 else " #%d" % (r["round"] + 1)),
                         gib(r["nvml_peak"]), gib(r["step_boundary_peak"]), torch_fig, cud,
                         "n/a" if r.get("median_step_ms") is None else "%.1f" % r["median_step_ms"],
                         r.get("losses_vs_first", "n/a"), r["error"] or "ok"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head) - 1)]
    out = []
    for row in rows:
        out.append("  ".join(str(c).ljust(widths[i]) for i, c in enumerate(row[:-1])) + "  " + str(row[-1]))
    return "\n".join(out) + "\n(GiB; driver peak: NVML, less the baseline; at steps: cudaMemGetInfo at "\
        "step ends; n/a: not available)"


def compare_losses(runs):
    ref = next((r.get("losses") for r in runs if r.get("losses")), None)
    for r in runs:
        ls = r.get("losses")
        if not ls or ref is None:
            r["losses_vs_first"] = "n/a"
        elif ls == ref:
            r["losses_vs_first"] = "same"
        else:
            diff = next((i for i, (x, y) in enumerate(zip(ls, ref)) if x != y), min(len(ls), len(ref)))
            r["losses_vs_first"] = "differ at step %d" % diff


def nvml_index():
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", "--workload", dest="workloads", help="comma-separated, from: "
                    + ", ".join(collect_traces.WORKLOADS))
    ap.add_argument("--out", help="the JSON file")
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "shim", "libcudalloc.so"))
    ap.add_argument("--cudalloc-conf", action="append", metavar="CONF",
                    help="a CUDALLOC_CONF to run under (repeatable; default expandable_segments:true)")
    ap.add_argument("--settings", default="default,expandable,cudalloc",
                    help="which of default, expandable, cudalloc to run")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every setting, interleaved")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--poll-ms", type=float, default=1.0, help="NVML polling period")
    ap.add_argument("--nvml-index", type=int, help="NVML's index of the GPU (default: the first of "
                    "CUDA_VISIBLE_DEVICES, else 0)")
    ap.add_argument("--dry-run", action="store_true", help="print the runs' commands only")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes, 2 steps (with --device cpu: "
                    "tests this script's runs without a GPU)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--handshake", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.workload = a.workloads  # a child runs one
        child(a)
        return 0
    if not a.workloads or not (a.out or a.dry_run):
        ap.error("--workloads and --out are required (--out not with --dry-run)")
    if a.device == "cpu" and not a.tiny:
        ap.error("--device cpu needs --tiny")
    names = [w for w in a.workloads.split(",") if w]
    for w in names:
        if w not in collect_traces.WORKLOADS:
            ap.error("unknown workload %s (one of %s)" % (w, ", ".join(collect_traces.WORKLOADS)))
    lib = os.path.abspath(a.lib)
    runs = settings(a, lib)
    if not runs:
        ap.error("no setting to run (--settings)")
    plan = [(w, rnd, name, extra) for w in names for rnd in range(a.repeat)
            for name, extra in (runs if rnd % 2 == 0 else runs[::-1])]
    if a.dry_run:
        for w, rnd, name, extra in plan:
            envs = " ".join("%s=%s" % (k, shlex.quote(v)) for k, v in
                            sorted(dict(extra, CUBLAS_WORKSPACE_CONFIG=":4096:8").items()))
            print("# %s, %s%s\nenv %s %s" % (w, name, "" if rnd == 0 else " round %d" % (rnd + 1), envs,
                                            " ".join(shlex.quote(c) for c in child_cmd(a, w, False))))
        if any("LD_PRELOAD" in e for _, _, _, e in plan) and not os.path.exists(lib):
            print("# note: %s does not exist yet" % lib)
        return 0
    if any("LD_PRELOAD" in e for _, _, _, e in plan) and not os.path.exists(lib):
        ap.error("%s missing: build first (or --settings default,expandable)" % lib)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    try:
        nvml = Nvml(a.nvml_index if a.nvml_index is not None else nvml_index())
        nvml_note = "NVML device %d" % (a.nvml_index if a.nvml_index is not None else nvml_index())
    except (OSError, AttributeError) as e:
        nvml, nvml_note = None, "NVML unavailable (%s): driver peaks n/a" % e
    sys.stderr.write("torch_memory: %s\n" % nvml_note)
    logs = a.out + ".logs"
    os.makedirs(logs, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    doc = {"started_utc": started.isoformat(timespec="seconds"), "command": " ".join(sys.argv),
           "device": a.device, "tiny": a.tiny, "lib": lib, "nvml": nvml_note, "poll_ms": a.poll_ms,
           "workloads": {w: {"kind": collect_traces.WORKLOADS[w][0],
                             "description": collect_traces.WORKLOADS[w][1], "runs": []} for w in names}}
    try:
        for i, (w, rnd, name, extra) in enumerate(plan):
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            log_path = os.path.join(logs, "%s.%s.%d.stderr" % (w, slug, rnd))
            sys.stderr.write("[%d/%d] %s, %s ... " % (i + 1, len(plan), w, name))
            sys.stderr.flush()
            rec = run_one(a, w, name, extra, nvml, log_path)
            rec["round"] = rnd
            rec["stderr_log"] = log_path
            doc["workloads"][w]["runs"].append(rec)
            sys.stderr.write("%s, %.1fs\n" % (rec["error"] or "driver peak %s GiB" % gib(rec["nvml_peak"]),
                                             rec["wall_s"]))
    finally:
        for p in list(_RUNNING):
            kill_group(p)
    bad = 0
    for wd in doc["workloads"].values():
        compare_losses(wd["runs"])
        bad += sum(1 for r in wd["runs"] if r["error"] or r["losses_vs_first"].startswith("differ"))
    doc["seconds"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 1)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(table(doc))
    print("json: %s" % a.out)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
