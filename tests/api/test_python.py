#!/usr/bin/env python3
"""The cudalloc Python package (python/cudalloc) on the CPU.

    test_python.py SOURCE_ROOT LIBCUDALLOC PROJECT_VERSION

Each case runs in a child Python process: without the library (figures raise, is_active is
False, phases do nothing, the torch shim stays out), with it preloaded over the fake driver
(LD_LIBRARY_PATH names the fake libcuda: figures follow allocations made through ctypes, a
limit makes the next allocation fail, the torch shim reports cudalloc's figures through a fake
torch module), the launcher, and the versions (package, pyproject, meson, library) agreeing.
"""
import os
import re
import subprocess
import sys
import textwrap

ROOT, LIB, VERSION = sys.argv[1], sys.argv[2], sys.argv[3]
PYDIR = os.path.join(ROOT, "python")
failures = []

# Allocates through the preloaded library's exported driver hooks, the fake driver underneath.
DRIVER = textwrap.dedent("""
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    proc = ctypes.CDLL(None)
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    def alloc(n):
        p = ctypes.c_uint64()
        r = proc.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n))
        return r, p.value
    def free(p):
        assert proc.cuMemFree_v2(ctypes.c_uint64(p)) == 0
    MiB = 1 << 20
""")

FAKE_TORCH = textwrap.dedent("""
    import sys, types
    torch = types.ModuleType("torch")
    torch.cuda = types.ModuleType("torch.cuda")
    torch.cuda.memory = types.ModuleType("torch.cuda.memory")
    for _m in (torch.cuda, torch.cuda.memory):
        for _n in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
            setattr(_m, _n, lambda device=None: 0)
        _m.memory_stats = lambda device=None: {}
        _m.memory_summary = lambda device=None, abbreviated=False: "torch's own"
        _m.empty_cache = lambda: None
        _m.reset_peak_memory_stats = lambda device=None: None
    ORIGINAL = torch.cuda.memory_allocated
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
""")


def run(name, code, preload, env_extra=None, argv=None, expect=0):
    env = dict(os.environ, PYTHONPATH=PYDIR, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = LIB
    env.update(env_extra or {})
    p = subprocess.run(argv or [sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    ok = p.returncode == expect
    print("%s %s" % ("PASS" if ok else "FAIL", name))
    if not ok:
        print(textwrap.indent(p.stdout + p.stderr, "    "))
        failures.append(name)
    return p


run("absent: is_active False, figures raise, phase and shim inert", FAKE_TORCH + textwrap.dedent("""
    import cudalloc, cudalloc.torch
    assert cudalloc.is_active() is False
    for fn in (cudalloc.memory_allocated, cudalloc.max_memory_allocated, cudalloc.memory_reserved,
               cudalloc.max_memory_reserved, cudalloc.memory_stats, cudalloc.memory_summary,
               cudalloc.empty_cache, cudalloc.reset_peak_memory_stats):
        try:
            fn()
        except RuntimeError as e:
            assert "cudalloc is not loaded in this process" in str(e), e
        else:
            raise AssertionError("%s answered without the library" % fn.__name__)
    try:
        cudalloc.set_per_process_memory_fraction(0.5)
        raise AssertionError("set_per_process_memory_fraction without the library")
    except RuntimeError:
        pass
    with cudalloc.phase("forward"):
        pass
    assert cudalloc.torch.install() is False
    assert torch.cuda.memory_allocated is ORIGINAL
"""), preload=False)

run("present: figures, peaks, empty_cache, limit, phases", DRIVER + textwrap.dedent("""
    import cudalloc
    assert cudalloc.is_active()
    assert cudalloc.api_version() >= 1
    assert cudalloc.library_version() == cudalloc.__version__
    base = cudalloc.memory_allocated()
    r, a = alloc(30 * MiB)
    assert r == 0
    assert cudalloc.memory_allocated() == base + 30 * MiB, cudalloc.memory_allocated()
    assert cudalloc.memory_allocated(0) == cudalloc.memory_allocated("cuda:0")
    class Dev:  # a torch.device stand-in
        index = 0
    assert cudalloc.memory_allocated(Dev()) == base + 30 * MiB
    assert cudalloc.memory_reserved() >= 30 * MiB
    stats = cudalloc.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "active_bytes.all.current", "num_alloc_retries", "num_ooms",
                "num_device_alloc", "num_device_free"):
        assert key in stats, key
    assert stats["allocated_bytes.all.current"] == base + 30 * MiB
    assert list(stats) == sorted(stats)
    free(a)
    assert cudalloc.memory_allocated() == base
    assert cudalloc.max_memory_allocated() >= 30 * MiB
    reserved = cudalloc.memory_reserved()
    cudalloc.reset_peak_memory_stats()
    assert cudalloc.max_memory_allocated() == cudalloc.memory_allocated()
    assert cudalloc.max_memory_reserved() == reserved
    text = cudalloc.memory_summary()
    assert "cudalloc memory summary, device 0" in text and "Reserved memory" in text, text
    released = cudalloc.empty_cache()
    assert released >= 30 * MiB and cudalloc.memory_reserved() == reserved - released
    assert cudalloc.memory_stats()["num_device_free"] >= 1
    cudalloc.set_per_process_memory_fraction(0.25)   # of 2048 MiB
    assert cudalloc.get_per_process_memory_fraction() == 0.25
    assert cudalloc.get_memory_limit() == 512 * MiB
    r, _ = alloc(600 * MiB)
    assert r == 2, r  # CUDA_ERROR_OUT_OF_MEMORY
    assert cudalloc.memory_stats()["num_ooms"] == 1
    r, a = alloc(100 * MiB)
    assert r == 0
    free(a)
    for bad in (0, 1.5, float("nan")):
        try:
            cudalloc.set_per_process_memory_fraction(bad)
            raise AssertionError("fraction %r taken" % bad)
        except ValueError:
            pass
    try:
        cudalloc.memory_allocated(9)
        raise AssertionError("device 9 of 1")
    except ValueError:
        pass
    with cudalloc.phase("forward"):
        with cudalloc.phase("attn"):
            r, a = alloc(1000)
    r2, b = alloc(3000)
    free(a); free(b)
    path = cudalloc.flush_trace()
    lines = [l.split(",") for l in open(path) if not l.startswith(("#", "ts_ns"))]
    extra = {(l[4], l[7]): l[13].strip() for l in lines}
    assert extra[("alloc", "1000")] == "nvtx=forward/attn", extra
    assert extra[("alloc", "3000")] == "", extra
    try:
        @cudalloc.phase("step")
        def step():
            raise KeyError("inside")
        step()
    except KeyError:
        pass
    with cudalloc.phase("after"):  # the failed step popped its phase
        pass
    print("ok")
"""), preload=True, env_extra={"CUDALLOC_TRACE": os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                             "cudalloc-api-python-%d.trace" % os.getpid())})

run("passthrough: figures refused, not zeros", DRIVER + textwrap.dedent("""
    import cudalloc
    assert cudalloc.is_active()
    r, a = alloc(MiB)
    try:
        cudalloc.memory_allocated()
        raise AssertionError("a figure in passthrough mode")
    except cudalloc.CudallocError as e:
        assert "passthrough" in str(e), e
"""), preload=True, env_extra={"CUDALLOC_NO_CACHING": "1"})

run("torch shim: torch.cuda reports cudalloc's figures", DRIVER + FAKE_TORCH + textwrap.dedent("""
    import cudalloc, cudalloc.torch
    assert cudalloc.torch.install() is True
    r, a = alloc(8 * MiB)
    assert torch.cuda.memory_allocated() == cudalloc.memory_allocated() >= 8 * MiB
    assert torch.cuda.memory.memory_allocated(0) == cudalloc.memory_allocated(0)
    assert torch.cuda.max_memory_allocated() >= 8 * MiB
    assert torch.cuda.memory_reserved() >= 8 * MiB and torch.cuda.max_memory_reserved() >= 8 * MiB
    assert torch.cuda.memory_stats()["allocated_bytes.all.current"] >= 8 * MiB
    assert "cudalloc memory summary" in torch.cuda.memory_summary(abbreviated=True)
    free(a)
    assert torch.cuda.empty_cache() is None
    assert torch.cuda.memory_reserved() == 0
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == 0
    cudalloc.torch.uninstall()
    assert torch.cuda.memory_allocated is ORIGINAL and torch.cuda.memory_allocated() == 0
"""), preload=True)

p = run("launcher: runs Python with the library preloaded and the package importable", None, preload=False,
        argv=[sys.executable, "-m", "cudalloc.launcher", "--lib", LIB, "--",
              sys.executable, "-c", "import cudalloc, os; print(cudalloc.is_active(), os.environ['LD_PRELOAD'])"],
        env_extra={"PYTHONPATH": PYDIR})
if p.returncode == 0 and p.stdout.split()[:2] != ["True", LIB]:
    print("FAIL launcher output: %r" % p.stdout)
    failures.append("launcher output")
p = run("launcher --version", None, preload=False,
        argv=[sys.executable, "-m", "cudalloc.launcher", "--lib", LIB, "--version"])
if p.returncode == 0 and not p.stdout.startswith("cudalloc %s\nlibrary: %s" % (VERSION, LIB)):
    print("FAIL --version output: %r" % p.stdout)
    failures.append("launcher --version output")
p = run("launcher: a missing library is an error", None, preload=False, expect=1,
        argv=[sys.executable, "-m", "cudalloc.launcher", "--lib", "/nonexistent/libcudalloc.so", "--", "true"])
if "cannot find libcudalloc.so" not in p.stderr:
    print("FAIL missing library message: %r" % p.stderr)
    failures.append("launcher missing library message")
p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "cudalloc"), "--version"], capture_output=True, text=True)
if p.stdout.strip() != "cudalloc %s" % VERSION:
    print("FAIL scripts/cudalloc --version: %r %r" % (p.stdout, p.stderr))
    failures.append("scripts/cudalloc --version")

# One version everywhere: meson.build, pyproject.toml, the package.
sys.path.insert(0, PYDIR)
import cudalloc  # noqa: E402
pyproject = open(os.path.join(ROOT, "pyproject.toml")).read()
m = re.search(r'^version = "([^"]+)"', pyproject, re.M)
if cudalloc.__version__ != VERSION or m is None or m.group(1) != VERSION:
    print("FAIL versions: package %s, pyproject %s, meson %s" % (cudalloc.__version__, m and m.group(1), VERSION))
    failures.append("versions")

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
