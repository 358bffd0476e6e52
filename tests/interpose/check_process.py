#!/usr/bin/env python3
"""Process-level checks of libcudalloc.so.

  check_process.py needed LIB          NEEDED entries only among libc/libm/libdl/libpthread (+ ld-linux):
                                       the C++ runtime is linked in, not loaded into the host
  check_process.py bad_config EXE      a malformed CUDALLOC_CONF: exit status 1 and one line on stderr
  check_process.py bad_config_no_cuda EXE   ... but a process that never touches CUDA is unchanged
  check_process.py traced EXE [ARGS]   CUDALLOC_TRACE + CUDALLOC_STATS: a closed trace with the
                                       program's allocations, and the summary table at exit
  check_process.py traced_passthrough EXE [ARGS]   the same with CUDALLOC_NO_CACHING=1
  check_process.py oom_records N EXE [ARGS]   CUDALLOC_TRACE + CUDALLOC_STATS: the program exits 0,
                                       and its trace and its statistics at exit count N out-of-memory
                                       failures (a request served after a retry is none)
  check_process.py no_vmm EXE [ARGS]   expandable_segments:true with device 1 lacking virtual memory
                                       (no_vmm.cpp): the program exits 0, one warning names device 1,
                                       device 1's trace records are plain segments (device 0's are
                                       expandable), and device 1's statistics say expandable is off
  check_process.py forgotten SCRIPTS EXE [ARGS]   CUDALLOC_TRACE: the program's device-1 context went
                                       with blocks live and cached; read with scripts/trace, the
                                       trace frees every block and segment of device 1, its totals
                                       end at zero, and an export holds nothing of it
  check_process.py profiled EXE [ARGS] CUDALLOC_PROFILE=1: every hook call of passthrough_check
                                       counted (51 cuMemAlloc, 50 cuMemFree, its segment); unset or
                                       0, no profile is printed
"""
import os, re, subprocess, sys, tempfile

# Under a sanitizer (tests/faults/run_sanitized.py) programs run several times slower.
SLOWDOWN = float(os.environ.get('CUDALLOC_TEST_TIMEOUT_MULTIPLIER', '1'))

ALLOWED = ('libc.so', 'libm.so', 'libdl.so', 'libpthread.so', 'ld-linux')
BAD_CONF = 'max_split_size_mb:banana'
CUDA_ERROR_NOT_INITIALIZED = 3  # cuda.h


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
    p = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=30 * SLOWDOWN)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    print('rc', p.returncode, 'stderr:', lines)
    if not touches_cuda:
        return 0 if p.returncode == 0 and not lines else 1
    if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith('cudalloc:'):
        return 1
    return 0


def bad_config_atexit(exe):
    """A refused configuration exits; exit handlers' CUDA calls get CUDA_ERROR_NOT_INITIALIZED
    instead of waiting for the initialisation lock the exiting thread held (a hang before)."""
    env = dict(os.environ, CUDALLOC_CONF=BAD_CONF)
    try:
        p = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=20 * SLOWDOWN)
    except subprocess.TimeoutExpired:
        print('FAIL: the program hung at exit (the late CUDA calls waited for the init lock)')
        return 1
    err = [l for l in p.stderr.splitlines() if l.strip()]
    out = p.stdout.splitlines()
    print('rc', p.returncode, 'stderr:', err, 'stdout:', out)
    late = [l for l in out if ': cuMemAlloc ' in l]
    want = 'cuMemAlloc %d cuMemFree %d' % (CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED)
    checks = {
        'exit status 1': p.returncode == 1,
        'one error line': len(err) == 1 and err[0].startswith('cudalloc:') and BAD_CONF.split(':')[0] in err[0],
        'three late callers': sorted(l.split(':')[0] for l in late) ==
            ['atexit handler', 'static destructor', 'thread started during exit'],
        'each refused': all(l.endswith(want) for l in late),
    }
    print(checks)
    return 0 if all(checks.values()) else 1


def tiny_limit(exe):
    """A per-device limit below the smallest segment is named at start-up, once per device,
    and every allocation then fails as out of memory (the program is told why)."""
    env = dict(os.environ, CUDALLOC_CONF='per_process_memory_fraction:1e-300', CUDALLOC_LOG_LEVEL='warn')
    p = subprocess.run([exe, 'caching'], env=env, capture_output=True, text=True, timeout=30 * SLOWDOWN)
    warned = [l for l in p.stderr.splitlines() if 'below the smallest segment' in l]
    print('rc', p.returncode, 'warnings:', warned)
    return 0 if len(warned) == 1 and 'device 0' in warned[0] and 'CUDA_ERROR_OUT_OF_MEMORY' in warned[0] else 1


def traced(argv, passthrough=False):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        env = dict(os.environ, CUDALLOC_TRACE=path, CUDALLOC_STATS='1')
        if passthrough:
            env['CUDALLOC_NO_CACHING'] = '1'
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
        print('rc', p.returncode)
        if p.returncode != 0:
            print(p.stdout, p.stderr)
            return 1
        lines = open(path).read().splitlines()
        events = [l.split(',')[4] for l in lines[2:] if l and not l.startswith('#')]
        want = 'passthrough_alloc' if passthrough else 'alloc'
        checks = {
            'header': lines[:1] == ['#cudalloc-trace v1'],
            'columns': len(lines) > 1 and lines[1].startswith('ts_ns,pid,tid,device,event'),
            want + ' records': events.count(want) > 0,
            'free records': sum(e.endswith('free') for e in events) > 0,
            'closed': any(l.startswith('# end records=') for l in lines),
            'summary at exit': passthrough or 'cudalloc memory summary' in p.stderr,
        }
        if passthrough:
            checks.update(passthrough_ledger(lines))
        print(checks, 'events:', {e: events.count(e) for e in set(events)})
        return 0 if all(checks.values()) else 1


def passthrough_ledger(lines):
    """Passthrough records carry what the driver's calls do not say: a free's size and device
    (those of its allocation), and each device's running total in allocated and reserved."""
    live, totals, ok = {}, {}, {'free sizes': True, 'devices': True, 'totals': True}
    devices = set()
    for l in lines[2:]:
        if not l or l.startswith('#'):
            continue
        f = l.split(',')
        dev, event, ptr, requested, result = int(f[3]), f[4], f[6], int(f[7]), f[9]
        allocated, reserved = int(f[11]), int(f[12])
        if result != 'ok' or not event.startswith('passthrough'):
            continue
        devices.add(dev)
        if event == 'passthrough_alloc':
            live[ptr] = (requested, dev)
            totals[dev] = totals.get(dev, 0) + requested
        else:
            want = live.pop(ptr, None)
            ok['free sizes'] &= want is not None and requested == want[0]
            ok['devices'] &= want is not None and dev == want[1]
            totals[dev] = totals.get(dev, 0) - requested
        ok['totals'] &= allocated == reserved == totals[dev]
    ok['device 1 seen'] = 1 in devices
    return ok


def oom_records(want, argv):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        env = dict(os.environ, CUDALLOC_TRACE=path, CUDALLOC_STATS='1')
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
        print('rc', p.returncode)
        print(p.stderr)
        if p.returncode != 0:
            return 1
        lines = open(path).read().splitlines()
        records = sum(1 for l in lines[2:] if l and not l.startswith('#') and l.split(',')[4] == 'oom')
        counted = [int(n) for n in re.findall(r'OOMs: (\d+)', p.stderr)]
        print('oom records', records, 'OOMs in the summaries', counted, 'want', want)
        return 0 if records == want and counted and sum(counted) == want else 1


def no_vmm(argv):
    MiB = 1 << 20
    note = 'expandable_segments ignored: the device has no virtual memory management'
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        env = dict(os.environ, CUDALLOC_TRACE=path, CUDALLOC_STATS='1', CUDALLOC_LOG_LEVEL='warn',
                   CUDALLOC_CONF='expandable_segments:true', FAKE_CUDA_DEVICES='2', FAKE_CUDA_NO_VMM='1')
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
        print('rc', p.returncode)
        print(p.stderr)
        if p.returncode != 0:
            return 1
        segments = {0: [], 1: []}
        for l in open(path).read().splitlines()[2:]:
            f = l.split(',')
            if l and not l.startswith('#') and f[4] == 'segment_alloc':
                segments.setdefault(int(f[3]), []).append(int(f[8]) // MiB)
        warnings = [l for l in p.stderr.splitlines() if 'expandable_segments is ignored' in l]
        summaries = re.split(r'(?= cudalloc memory summary, device )', p.stderr)[1:]
        noted = {}
        for t in summaries:
            dev = int(re.match(r' cudalloc memory summary, device (\d+)', t).group(1))
            noted.setdefault(dev, []).append(note in t)
        checks = {
            'one warning, for device 1': len(warnings) == 1 and 'device 1' in warnings[0],
            'device 0 expandable (8 MiB mapped)': segments[0] == [8],
            'device 1 plain segments': sorted(segments[1]) == [2, 2, 20, 30],
            'device 1 summaries note it': noted.get(1) == [True, True],
            'device 0 summary does not': noted.get(0) == [False],
        }
        print(checks, 'segments (MiB):', segments, 'summaries noting it:', noted)
        return 0 if all(checks.values()) else 1


def forgotten(scripts, argv):
    sys.path.insert(0, os.path.join(scripts, 'trace'))
    import ct_export, ct_reader
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        p = subprocess.run(argv, env=dict(os.environ, CUDALLOC_TRACE=path), capture_output=True,
                           text=True, timeout=60 * SLOWDOWN)
        print('rc', p.returncode, p.stderr.strip())
        if p.returncode != 0:
            return 1
        dev1 = [r for r in ct_reader.open_trace(path).records() if r.device == 1 and r.result == 'ok']
        n = {e: sum(1 for r in dev1 if r.event == e) for e in ('alloc', 'free', 'segment_alloc', 'segment_free')}
        seg_bytes = {e: sum(r.requested for r in dev1 if r.event == e) for e in ('segment_alloc', 'segment_free')}
        # The export replays segments and live blocks from the records: a block never freed
        # would show as live, in a segment of its own if its segment's end was recorded.
        snap = ct_export.torch_snapshot(ct_reader.open_trace(path), lambda pcs: [])
        left = [(hex(s['address']), s['total_size'], len(s['blocks'])) for s in snap['segments'] if s['device'] == 1]
        last = dev1[-1] if dev1 else None
        checks = {
            'device 1 traced': n['alloc'] >= 6 and n['segment_alloc'] >= 3,
            'every block freed': n['free'] == n['alloc'],
            'every segment given back': seg_bytes['segment_alloc'] == seg_bytes['segment_free'],
            'totals end at zero': last is not None and last.allocated == 0 and last.reserved == 0,
            'nothing of device 1 in the export': not left,
        }
        print(checks, n, seg_bytes, 'last', last, 'left', left)
        return 0 if all(checks.values()) else 1


def profiled(argv):
    counts = {}
    for value in ('1', '0', None):
        env = dict(os.environ)
        env.pop('CUDALLOC_PROFILE', None)
        if value is not None:
            env['CUDALLOC_PROFILE'] = value
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
        if p.returncode != 0:
            print('rc', p.returncode, p.stdout, p.stderr)
            return 1
        counts[value] = {m.group(1).strip(): int(m.group(2))
                         for m in re.finditer(r'^  (\S.*?)\s+(\d+) calls', p.stderr, re.M)}
        counts[value]['header'] = int('cudalloc profile' in p.stderr)
    print(counts)
    on = counts['1']
    ok = (on.get('header') == 1 and on.get('cuMemAlloc') == 51 and on.get('cuMemFree') == 50 and
          on.get('segment alloc', 0) >= 1 and counts['0'] == {'header': 0} and counts[None] == {'header': 0})
    return 0 if ok else 1


if __name__ == '__main__':
    mode, arg = sys.argv[1], sys.argv[2]
    if mode == 'traced':
        sys.exit(traced(sys.argv[2:]))
    if mode == 'traced_passthrough':
        sys.exit(traced(sys.argv[2:], passthrough=True))
    if mode == 'oom_records':
        sys.exit(oom_records(int(arg), sys.argv[3:]))
    if mode == 'no_vmm':
        sys.exit(no_vmm(sys.argv[2:]))
    if mode == 'forgotten':
        sys.exit(forgotten(arg, sys.argv[3:]))
    if mode == 'profiled':
        sys.exit(profiled(sys.argv[2:]))
    if mode == 'needed':
        sys.exit(needed(arg))
    if mode == 'bad_config':
        sys.exit(bad_config(arg))
    if mode == 'tiny_limit':
        sys.exit(tiny_limit(arg))
    if mode == 'bad_config_atexit':
        sys.exit(bad_config_atexit(arg))
    if mode == 'bad_config_no_cuda':
        sys.exit(bad_config(arg, touches_cuda=False))
    sys.exit('unknown mode ' + mode)
