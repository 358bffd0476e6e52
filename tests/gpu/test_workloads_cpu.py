"""Tests the workloads of collect_traces.py / workloads.py and the runs of torch_memory.py on the
CPU, where there is no GPU: ddp_train.py's verdict on rank reports written here (no torch
needed); each workload at tiny size through collect_traces.py's worker
processes; the same losses through torch_memory.py's; torch_memory.py's figures n/a without
NVML, and polled through a stand-in libnvidia-ml.so.1 (built with cc) where one is given; its
--dry-run passing CUDALLOC_CONF through untouched. Skipped where torch does not import.

    python3 tests/gpu/test_workloads_cpu.py [--lib build/shim/libcudalloc.so]

With --lib (or a built build/shim/libcudalloc.so), torch_memory.py's cudalloc setting runs too:
the CPU-only process loads the library and must still give the same losses.
Prints PASS/FAIL per check and "N passed, N failed, N skipped"; exit 1 if any failed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

FAKE_NVML = r"""
typedef struct { unsigned long long total, free, used; } mem_t;
static volatile unsigned long long calls;
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { (void)i; *h = (void *)1; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
  (void)h;
  calls++;
  m->total = 1ull << 36;
  m->used = (1ull << 30) + calls * 4096;  /* grows with every sample: the peak is the last one */
  m->free = m->total - m->used;
  return 0;
}
"""


class Checks:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def check(self, name, ok, detail=""):
        print("%s %s%s" % ("PASS" if ok else "FAIL", name, "  (%s)" % detail if detail else ""), flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def skip(self, name, why):
        print("SKIP %s  (%s)" % (name, why), flush=True)
        self.skipped += 1


def run(cmd, env=None, timeout=600):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    return r.returncode, r.stdout.decode("utf-8", "replace")


def ddp_check(c, py):
    """ddp_train.py check (the GPU suite's verdict on the ranks' reports), on reports written
    here: it needs no torch."""
    tmp = tempfile.mkdtemp(prefix="ddp-check-")
    mib = 1 << 20
    served = {"cudalloc": True, "allocations": 900, "peak_allocated": 80 * mib, "peak_reserved": 100 * mib}
    job = dict(served, allocations=12, held=128 * mib, sums_right=True, outside=300 * mib, peak_reserved=160 * mib)
    cases = [
        ("served", [served, served], [], 0, "rank1 900 allocations"),
        ("native_report", [served, {"cudalloc": False}], [], 1, "rank1: cudalloc was not loaded"),
        ("too_few_allocations", [served, dict(served, allocations=40)], [], 1, "rank1 40 allocations"),
        ("one_rank", [served], [], 1, "1 rank reports"),
        ("allreduce", [job, job], ["--min-allocs", "5"], 0, "reserved 160 MiB for 128 MiB of tensors"),
        ("allreduce_nccl_counted", [job, dict(job, peak_reserved=428 * mib)], ["--min-allocs", "5"], 1,
         "reserved 428 MiB"),
        ("allreduce_wrong_sums", [job, dict(job, sums_right=False)], ["--min-allocs", "5"], 1, "WRONG SUMS"),
    ]
    try:
        for name, ranks, extra, want_rc, want_text in cases:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            for i, r in enumerate(ranks):
                with open(os.path.join(d, "rank%d.json" % i), "w") as f:
                    json.dump(r, f)
            rc, out = run([py, os.path.join(HERE, "ddp_train.py"), "check", d] + extra)
            c.check("ddp_check_" + name, rc == want_rc and want_text in out, "rc=%d: %s" % (rc, out.strip()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "shim", "libcudalloc.so"))
    a = ap.parse_args()
    c = Checks()
    py = sys.executable
    ddp_check(c, py)
    try:
        import torch  # noqa: F401
    except ImportError as e:
        c.skip("workloads_cpu", "torch does not import for %s: %s" % (py, e))
        print("%d passed, %d failed, %d skipped" % (c.passed, c.failed, c.skipped))
        return 0
    import workloads
    names = list(workloads.NEW_WORKLOADS)
    tmp = tempfile.mkdtemp(prefix="workloads-cpu-")
    try:
        # 1. Every workload, tiny, through collect_traces.py's worker processes.
        rc, out = run([py, os.path.join(HERE, "collect_traces.py"), "--out", os.path.join(tmp, "ct"),
                       "--device", "cpu", "--tiny"])
        ct_losses = {}
        for w in names:
            line = next((l for l in out.splitlines() if l.split(" ")[1:2] == [w + ":"]), "")
            ok = line.startswith("ok ")
            if ok:
                ct_losses[w] = line.split("losses ", 1)[1].rsplit(",", 1)[0].split()
            c.check("collect_traces_tiny_" + w, ok, line or out.strip()[-300:])
        c.check("collect_traces_tiny_exit", rc == 0, "rc=%d" % rc)
        # A full-size-only workload is refused on the CPU, not run.
        rc, out = run([py, os.path.join(HERE, "collect_traces.py"), "--out", os.path.join(tmp, "ct2"),
                       "--device", "cpu", "--tiny", "--workloads", "gpt2-train"])
        c.check("collect_traces_tiny_refuses_full_only", rc == 2 and "no tiny size" in out, out.strip()[-200:])

        # 2. torch_memory.py: every workload once, no NVML here: driver figures null, the same
        # losses as collect_traces.py's workers gave.
        tm = os.path.join(HERE, "torch_memory.py")
        out_json = os.path.join(tmp, "tm.json")
        settings = "default,expandable"
        extra = []
        if os.path.exists(a.lib):
            settings += ",cudalloc"
            extra = ["--lib", a.lib, "--cudalloc-conf", "expandable_segments:true"]
        else:
            c.skip("torch_memory_cudalloc_cpu", "%s not built" % a.lib)
        env = dict(os.environ)
        env.pop("LD_LIBRARY_PATH", None)
        rc, out = run([py, tm, "--workloads", ",".join(names), "--device", "cpu", "--tiny",
                       "--settings", settings, "--out", out_json, "--timeout", "300"] + extra, env=env)
        c.check("torch_memory_cpu_exit", rc == 0, out.strip().splitlines()[-1] if rc == 0 else out[-800:])
        if os.path.exists(out_json):
            doc = json.load(open(out_json))
            for w in names:
                runs = doc["workloads"][w]["runs"]
                errs = [r["error"] for r in runs if r["error"]]
                same = all(r.get("losses") == ct_losses.get(w) for r in runs)
                na = all(r["nvml_peak"] is None and r["step_boundary_peak"] is None for r in runs)
                c.check("torch_memory_cpu_" + w, not errs and same and na and len(runs) == len(settings.split(",")),
                        "errors %s; losses as collect_traces': %s; figures n/a: %s" % (errs, same, na))

        # 3. A stand-in NVML: the poller samples it and reports a peak above the baseline.
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            c.skip("torch_memory_nvml_poll", "no C compiler")
        else:
            src = os.path.join(tmp, "nvml.c")
            with open(src, "w") as f:
                f.write(FAKE_NVML)
            rc, out = run([cc, "-shared", "-fPIC", "-o", os.path.join(tmp, "libnvidia-ml.so.1"), src])
            env = dict(os.environ, LD_LIBRARY_PATH=tmp)
            out_json = os.path.join(tmp, "tm-nvml.json")
            rc, out = run([py, tm, "--workloads", "unet-train", "--device", "cpu", "--tiny", "--settings",
                           "default", "--out", out_json], env=env)
            r = json.load(open(out_json))["workloads"]["unet-train"]["runs"][0] if os.path.exists(out_json) else {}
            c.check("torch_memory_nvml_poll", rc == 0 and (r.get("nvml_peak") or 0) > 0
                    and r.get("nvml_samples", 0) > 10 and r.get("baseline_used") is not None,
                    "peak %s B over %s samples, every %s ms" % (r.get("nvml_peak"), r.get("nvml_samples"),
                                                               r.get("nvml_mean_period_ms")))

        # 4. --dry-run: the commands, CUDALLOC_CONF passed through as given.
        conf = "expandable_segments:true,page_stitching:true"
        rc, out = run([py, tm, "--workloads", "llama-train", "--dry-run", "--cudalloc-conf", conf,
                       "--lib", "/nonexistent/libcudalloc.so"])
        c.check("torch_memory_dry_run", rc == 0 and ("CUDALLOC_CONF=" + conf) in out
                and out.count("--child") == 3 and "PYTORCH_NO_CUDA_MEMORY_CACHING=1" in out, out[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed, %d skipped" % (c.passed, c.failed, c.skipped))
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
