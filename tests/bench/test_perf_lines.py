#!/usr/bin/env python3
"""scripts/perf-lines on a perf script output made here for the built libcudalloc.so: the samples
of the library are found wherever it was mapped, from the symbol+offset perf printed (with or
without a parameter list); samples of other objects are left out; a line's cost is its samples
times the sampling period over the units; --against puts the line that grew most first; and a
file that cannot be read, or one with no sample in the library, gives one line and exit status 2."""
import os
import re
import subprocess
import sys
import tempfile

SCRIPT, LIB = sys.argv[1], sys.argv[2]
BASE = 0x7F3A12340000  # where the "GPU machine" mapped it


def address(name):
    out = subprocess.run(["nm", "-C", "--defined-only", LIB], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1] in "tT" and parts[2].split("(")[0] == name:
            return int(parts[0], 16)
    raise SystemExit(f"test: {name} not in {LIB}")


def sample(addr, off, sym, dso=None):
    return f"    {BASE + addr + off:x} {sym}+0x{off:x} ({dso or '/remote/carry/' + os.path.basename(LIB)})\n"


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}")


alloc_v2 = address("cuMemAlloc_v2")
allocate = address("cudalloc::DeviceAllocator::allocate")
with tempfile.TemporaryDirectory() as d:
    one = os.path.join(d, "one.txt")
    with open(one, "w") as f:
        f.writelines([sample(alloc_v2, 4, "cuMemAlloc_v2")] * 3)
        # perf printed this one with its parameters
        f.writelines([sample(allocate, 8, "cudalloc::DeviceAllocator::allocate(unsigned long, unsigned long, unsigned long*, bool)")] * 5)
        f.writelines([sample(0, 16, "cudaMalloc", "/remote/bench_pairs")] * 50)  # another object
    # 10 kHz, 100,000 pairs: a sample is 1 ns a pair
    r = run(one, "--lib", LIB, "--units", "100000")
    check(r.returncode == 0, f"runs: {r.stderr.strip()}")
    rows = {m.group(2).split("@")[0]: float(m.group(1))
            for m in re.finditer(r"^\s*([0-9.]+)\s+(\S.*)$", r.stdout, re.M) if "in all" not in m.group(2)}
    print(r.stdout)
    check(any(k.startswith("cuMemAlloc_v2") and abs(v - 3.0) < 1e-9 for k, v in rows.items()),
          "cuMemAlloc_v2's 3 samples give 3.00 ns a pair")
    check(any("allocate" in k and abs(v - 5.0) < 1e-9 for k, v in rows.items()),
          "DeviceAllocator::allocate's 5 samples, named with parameters, give 5.00 ns a pair")
    check(re.search(r"^\s*8\.00\s+in all$", r.stdout, re.M) is not None, "the other object's 50 samples are left out")

    two = os.path.join(d, "two.txt")
    with open(two, "w") as f:
        f.writelines([sample(alloc_v2, 4, "cuMemAlloc_v2")] * 3)
        f.writelines([sample(allocate, 8, "cudalloc::DeviceAllocator::allocate")] * 25)
    r = run(two, "--lib", LIB, "--units", "100000", "--against", one, "--against-units", "100000")
    print(r.stdout)
    body = [l for l in r.stdout.splitlines()[1:] if "in all" not in l]
    check(r.returncode == 0 and body and "allocate" in body[0] and body[0].split()[:2] == ["25.00", "5.00"],
          "--against: the line that grew (5 -> 25 ns) comes first")

    r = run(os.path.join(d, "missing.txt"), "--lib", LIB, "--units", "1")
    check(r.returncode == 2 and r.stderr.startswith("perf-lines: cannot read"), "a missing file: one line, status 2")
    other = os.path.join(d, "other.txt")
    with open(other, "w") as f:
        f.writelines([sample(0, 16, "cudaMalloc", "/remote/bench_pairs")] * 5)
    r = run(other, "--lib", LIB, "--units", "1")
    check(r.returncode == 2 and "no samples in" in r.stderr, "no sample in the library: one line, status 2")

print(f"{'FAILED ' + str(len(failures)) if failures else 'all passed'}")
sys.exit(1 if failures else 0)
