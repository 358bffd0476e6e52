#!/usr/bin/env python3
"""Runs nvtx_check with CUDALLOC_TRACE: the NVTX checks pass and the trace has the program's
cached allocations and the segments (the allocator's one observer feeds both)."""
import os, subprocess, sys, tempfile

# Under a sanitizer (tests/faults/run_sanitized.py) programs run several times slower.
SLOWDOWN = float(os.environ.get('CUDALLOC_TEST_TIMEOUT_MULTIPLIER', '1'))

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, 'run.trace')
    p = subprocess.run(sys.argv[1:], env=dict(os.environ, CUDALLOC_TRACE=path),
                       capture_output=True, text=True, timeout=60 * SLOWDOWN)
    print('rc', p.returncode, p.stderr.strip())
    if p.returncode != 0:
        sys.exit(1)
    lines = open(path).read().splitlines()
    events = [l.split(',')[4] for l in lines[2:] if l and not l.startswith('#')]
    counts = {e: events.count(e) for e in set(events)}
    print(counts)
    ok = counts.get('alloc', 0) > 1000 and counts.get('segment_alloc', 0) > 0 and \
        counts.get('segment_free', 0) > 0 and counts.get('passthrough_alloc', 0) == 0
    sys.exit(0 if ok else 1)
