#!/usr/bin/env python3
"""trace_nvtx: cudalloc as the NVTX injection of an unmodified program (nvtx_phases.cpp).

  check_nvtx_phases.py phases EXE LIB SCRIPTS_DIR   each record carries its thread's range stack;
                                                    the trace readers group by it
  check_nvtx_phases.py preset_self EXE LIB          NVTX_INJECTION64_PATH already names this
                                                    library (a symlink to it): kept, phases recorded
  check_nvtx_phases.py foreign EXE OTHER_LIB        NVTX_INJECTION64_PATH names another injection:
                                                    left alone, it gets the calls, no phases, one
                                                    info line says why
  check_nvtx_phases.py off EXE                      trace_nvtx off, or no trace: the variable is
                                                    never set, records carry no phase
  check_nvtx_phases.py no_cuda EXE LIB              NVTX without CUDA: no driver, no thread, no trace
  check_nvtx_phases.py sanitizer_in_path EXE LIB    the library preloaded from a folder whose name
                                                    holds "sanitizer": it is the injection it set,
                                                    not compute-sanitizer's (no nvtx mode)
"""
import collections, json, os, shutil, subprocess, sys, tempfile

# Under a sanitizer (tests/faults/run_sanitized.py) programs run several times slower.
SLOWDOWN = float(os.environ.get('CUDALLOC_TEST_TIMEOUT_MULTIPLIER', '1'))

CONF = 'trace_nvtx:true'


def run(argv, trace=None, conf=CONF, injection=None, level=None, preload=None):
    env = dict(os.environ)
    if preload:
        env['LD_PRELOAD'] = preload
    env.pop('NVTX_INJECTION64_PATH', None)
    env.pop('CUDALLOC_TRACE', None)
    env.pop('CUDALLOC_CONF', None)
    if trace:
        env['CUDALLOC_TRACE'] = trace
    if conf:
        env['CUDALLOC_CONF'] = conf
    if injection:
        env['NVTX_INJECTION64_PATH'] = injection
    if level:
        env['CUDALLOC_LOG_LEVEL'] = level
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
    print('$', ' '.join(argv), 'rc', p.returncode)
    if p.stderr.strip():
        print(p.stderr.strip())
    return p


def parse_output(out):
    env, expected, other = None, collections.defaultdict(list), None
    for line in out.splitlines():
        f = line.split(' ')
        if f[0] == 'ENV':
            env = line[4:]
        elif f[0] == 'E':
            expected[int(f[1])].append((f[2], f[3], ' '.join(f[4:])))
        elif f[0] == 'OTHER_PUSHES':
            other = int(f[1])
    return env, expected, other


def trace_records(path):
    lines = open(path, encoding='utf-8').read().splitlines()
    cols = lines[1].split(',')
    recs = []
    for l in lines[2:]:
        if not l or l.startswith('#'):
            continue
        r = dict(zip(cols, l.split(',')))
        r['extra'] = dict(kv.split('=', 1) for kv in r['extra'].split(';') if kv)
        recs.append(r)
    return lines, recs


def compare(expected, recs):
    """Per thread, the alloc/free records in order must be the program's, with its phases."""
    got = collections.defaultdict(list)
    for r in recs:
        if r['event'] in ('alloc', 'free'):
            got[int(r['tid'])].append((r['event'], r['ptr'], r['extra'].get('nvtx', '-')))
    ok = True
    if set(got) != set(expected):
        print('threads: trace has', sorted(got), 'program printed', sorted(expected))
        ok = False
    for tid, want in expected.items():
        have = got.get(tid, [])
        if have != want:
            ok = False
            print('thread %d differs:' % tid)
            for i in range(max(len(have), len(want))):
                h = have[i] if i < len(have) else None
                w = want[i] if i < len(want) else None
                print('  %s %r %s %r' % ('  ' if h == w else '!!', w, '<- trace:', h))
    n = sum(len(v) for v in expected.values())
    print('records compared: %d on %d threads, phases: %s' % (
        n, len(expected), sorted({e[2] for v in expected.values() for e in v})))
    return ok and n > 0


def check_readers(path, expected, scripts_dir):
    """`cudalloc-trace summary` and the chrome export group by the first range; the plot's spans
    cover each phase."""
    want = collections.Counter(p.split('/')[0] for v in expected.values()
                               for ev, _, p in v if ev == 'alloc' and p != '-')
    p = subprocess.run([sys.executable, os.path.join(scripts_dir, 'cudalloc-trace'), 'summary',
                        path, '--json'], capture_output=True, text=True, timeout=60 * SLOWDOWN)
    if p.returncode != 0:
        print('summary failed:', p.stderr)
        return False
    phases = json.loads(p.stdout)['phases']
    have = {k: v['allocs'] for k, v in phases.items()}
    print('summary phases (allocs):', have)
    ok = have == dict(want)
    t = subprocess.run([sys.executable, os.path.join(scripts_dir, 'cudalloc-trace'), 'summary',
                        path], capture_output=True, text=True, timeout=60 * SLOWDOWN)
    ok = ok and t.returncode == 0 and 'memory by NVTX phase' in t.stdout and 'forward' in t.stdout
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, 'run.json')
        e = subprocess.run([sys.executable, os.path.join(scripts_dir, 'cudalloc-trace'), 'export',
                            path, '--format', 'chrome', '-o', out], capture_output=True, text=True,
                           timeout=60 * SLOWDOWN)
        ok = ok and e.returncode == 0
        if e.returncode == 0:
            doc = json.load(open(out, encoding='utf-8'))
            events = doc['traceEvents'] if isinstance(doc, dict) else doc
            chrome = {ev.get('name') for ev in events if ev.get('cat') == 'nvtx'}
            print('chrome phases:', sorted(chrome))
            ok = ok and chrome == set(want)
    sys.path.insert(0, os.path.join(scripts_dir, 'trace'))
    from ct_reader import open_trace
    from ct_plot import collect
    _, spans, _ = collect(open_trace(path))
    span_phases = {s[2] for s in spans}
    print('plot spans:', sorted(span_phases))
    return ok and span_phases == set(want)


def phases(exe, lib, scripts_dir, injection=None):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        p = run([exe, 'phases'], trace=path, injection=injection(d) if injection else None)
        if p.returncode != 0:
            return 1
        env, expected, _ = parse_output(p.stdout)
        want_env = injection(d) if injection else os.path.realpath(lib)
        lines, recs = trace_records(path)
        checks = {
            'NVTX_INJECTION64_PATH': env == want_env,
            'options nvtx=1': any(l.startswith('# options') and ' nvtx=1' in l for l in lines),
            'closed': any(l.startswith('# end records=') for l in lines),
            'records match': compare(expected, recs),
        }
        if scripts_dir:
            checks['readers'] = check_readers(path, expected, scripts_dir)
        print(checks, 'ENV', env)
        return 0 if all(checks.values()) else 1


def preset_self(exe, lib):
    def link(d):
        l = os.path.join(d, 'link-to-cudalloc.so')
        if not os.path.exists(l):
            os.symlink(os.path.realpath(lib), l)
        return l
    return phases(exe, lib, None, injection=link)


def no_phases(p, path):
    env, expected, other = parse_output(p.stdout)
    _, recs = trace_records(path)
    return env, other, compare(expected, recs) and not any('nvtx' in r['extra'] for r in recs)


def foreign(exe, other_lib):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        p = run([exe, 'foreign'], trace=path, injection=other_lib, level='info')
        if p.returncode != 0:
            return 1
        env, other, clean = no_phases(p, path)
        off_lines = [l for l in p.stderr.splitlines() if 'NVTX phases are off' in l]
        checks = {
            'variable left alone': env == other_lib,
            'the other injection got the pushes': (other or 0) > 0,
            'no phases, records intact': clean,
            'one info line': len(off_lines) == 1 and other_lib in off_lines[0],
        }
        print(checks)
        return 0 if all(checks.values()) else 1


def off(exe):
    with tempfile.TemporaryDirectory() as d:
        results = {}
        for name, conf, trace in (('trace without trace_nvtx', None, True),
                                  ('trace_nvtx:false', 'trace_nvtx:false', True),
                                  ('trace_nvtx without a trace', CONF, False)):
            path = os.path.join(d, name.replace(' ', '_') + '.trace')
            p = run([exe, 'none'], trace=path if trace else None, conf=conf)
            env = parse_output(p.stdout)[0]
            ok = p.returncode == 0 and env == '-'
            if trace and ok:
                ok = no_phases(p, path)[2]
            if not trace:
                ok = ok and not os.path.exists(path)
            results[name] = ok
        print(results)
        return 0 if all(results.values()) else 1


def no_cuda(exe, lib):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        p = run([exe, 'no-cuda'], trace=path)
        env = parse_output(p.stdout)[0]
        checks = {'rc 0 (no driver, one thread)': p.returncode == 0,
                  'injection set': env == os.path.realpath(lib),
                  'no trace file': not os.path.exists(path)}
        print(checks)
        return 0 if all(checks.values()) else 1


def sanitizer_in_path(exe, lib):
    with tempfile.TemporaryDirectory() as d:
        folder = os.path.join(d, 'sanitizer-builds')
        os.mkdir(folder)
        copy = os.path.join(folder, os.path.basename(lib))
        shutil.copyfile(lib, copy)
        path = os.path.join(d, 'run.trace')
        p = run([exe, 'phases'], trace=path, conf=CONF + ',expandable_segments:true', level='info',
                preload=copy)
        if p.returncode != 0:
            return 1
        env, expected, _ = parse_output(p.stdout)
        _, recs = trace_records(path)
        checks = {
            'NVTX_INJECTION64_PATH': env == os.path.realpath(copy),
            'no nvtx mode': not any('nvtx mode' in l for l in p.stderr.splitlines()),
            'expandable segments kept': 'expandable_segments=true' in p.stderr and
                                        'expandable segments are turned off' not in p.stderr,
            'records match': compare(expected, recs),
        }
        print(checks)
        return 0 if all(checks.values()) else 1


if __name__ == '__main__':
    mode, args = sys.argv[1], sys.argv[2:]
    fn = {'phases': lambda: phases(*args), 'preset_self': lambda: preset_self(*args),
          'foreign': lambda: foreign(*args), 'off': lambda: off(*args),
          'no_cuda': lambda: no_cuda(*args), 'sanitizer_in_path': lambda: sanitizer_in_path(*args)}.get(mode)
    sys.exit(fn() if fn else 'unknown mode ' + mode)
