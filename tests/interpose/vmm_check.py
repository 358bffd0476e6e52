#!/usr/bin/env python3
"""The CUDALLOC_STATS section of the program's own virtual memory.

  vmm_check.py EXE    CUDALLOC_STATS=1, EXE loop: the section of device 0 says that, of 812
                      cuMemCreate calls, all but the few of the first round were cache hits
"""
import os, re, subprocess, sys

# Under a sanitizer (tests/faults/run_sanitized.py) programs run several times slower.
SLOWDOWN = float(os.environ.get('CUDALLOC_TEST_TIMEOUT_MULTIPLIER', '1'))


def main(exe):
    env = dict(os.environ, CUDALLOC_STATS='1')
    p = subprocess.run([exe, 'loop'], env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
    print(p.stderr)
    if p.returncode != 0:
        print('exit status', p.returncode)
        return 1
    if 'virtual memory (cuMemCreate) of the program, device 0' not in p.stderr:
        print('no virtual memory section')
        return 1
    m = re.search(r'creates\s+hits: (\d+)\s+misses: (\d+)\s+reserves\s+hits: (\d+)\s+misses: (\d+)', p.stderr)
    if not m:
        print('no create counts')
        return 1
    hits, misses, reserve_hits, reserve_misses = map(int, m.groups())
    # 203 rounds of 4 buffers; the first round makes the 4 pairs.
    ok = hits + misses == 812 and misses == 4 and reserve_hits + reserve_misses == 812 and reserve_misses == 4
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
