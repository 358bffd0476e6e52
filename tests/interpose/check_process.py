#!/usr/bin/env python3
"""Process-level checks of libcudalloc.so.

  check_process.py needed LIB          NEEDED entries only among libc/libm/libdl/libpthread/libstdc++/libgcc_s (+ ld-linux)
  check_process.py bad_config EXE      a malformed CUDALLOC_CONF: exit status 1 and one line on stderr
  check_process.py bad_config_no_cuda EXE   ... but a process that never touches CUDA is unchanged
"""
import os, re, subprocess, sys

# ld-linux is the program interpreter, in every dynamically linked process already; a
# thread_local in code compiled with the global-dynamic TLS model makes it NEEDED.
ALLOWED = ('libc.so', 'libm.so', 'libdl.so', 'libpthread.so', 'libstdc++.so', 'libgcc_s.so', 'ld-linux')
BAD_CONF = 'max_split_size_mb:banana'


def needed(lib):
    out = subprocess.run(['readelf', '-d', lib], capture_output=True, text=True, check=True).stdout
    libs = re.findall(r'\(NEEDED\)\s+Shared library: \[([^\]]+)\]', out)
    bad = [l for l in libs if not l.startswith(ALLOWED)]
    print('NEEDED:', ' '.join(libs))
    if bad:
        print('not allowed:', bad)
        return 1
    return 0


def bad_config(exe, touches_cuda=True):
    env = dict(os.environ, CUDALLOC_CONF=BAD_CONF)
    p = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=30)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    print('rc', p.returncode, 'stderr:', lines)
    if not touches_cuda:
        return 0 if p.returncode == 0 and not lines else 1
    if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith('cudalloc:'):
        return 1
    return 0


if __name__ == '__main__':
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == 'needed':
        sys.exit(needed(arg))
    if mode == 'bad_config':
        sys.exit(bad_config(arg))
    if mode == 'bad_config_no_cuda':
        sys.exit(bad_config(arg, touches_cuda=False))
    sys.exit('unknown mode ' + mode)
