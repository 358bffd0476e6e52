#!/usr/bin/env python3
"""The trace writer under load, through the preloaded library (trace_client.cpp).

  check_trace_stress.py MODE EXE SCRIPTS_DIR REPLAY_BIN

  threads     8 threads at once: every line parses, each thread's records are its calls in
              order, allocs and frees balance per address in file order, `# end records=N
              dropped=0` counts the lines
  overflow    the writer held back: each lane keeps ring_capacity records (its first ones), the
              `dropped` records count the rest, `# end dropped=` equals their sum, and records
              plus dropped are every call
  processes   4 processes tracing to one path at once: one writes `path`, the others `path.PID`,
              each file complete (its own records, `# end`) and read by `cudalloc-trace summary`
  killed      SIGKILL while tracing: the file as left, and a copy cut mid-line, are read by
              `cudalloc-trace summary` and `replay` with exit status 0
  stacks      trace_stacks:4: alloc records carry stack= (1 to 4 PCs inside the #map lines) and
              `cudalloc-trace summary` reports allocation sites
"""
import collections, json, os, re, signal, subprocess, sys, tempfile, time

COLUMNS = ('ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,'
           'reserved,extra')
EVENTS = {'alloc', 'free', 'segment_alloc', 'segment_free', 'cache_release', 'oom',
          'passthrough_alloc', 'passthrough_free', 'dropped'}
RESULTS = {'ok', 'invalid_value', 'out_of_memory', 'device_error', 'deinitialized'}
EXTRA_KEYS = ('async', 'nvtx', 'stack', 'count')  # in this order when present
HEX = re.compile(r'0x[0-9a-f]+$')
END = re.compile(r'# end records=(\d+) dropped=(\d+)$')


class Trace:
    """A trace file read strictly: every line after the header is a comment or a record."""

    def __init__(self, path, allow_truncated=False):
        self.path = path
        self.lines = open(path, encoding='utf-8').read().split('\n')
        self.truncated = self.lines[-1] != ''  # no newline after the last line
        if self.lines[-1] == '':
            self.lines.pop()
        self.errors = []
        self.records, self.comments, self.maps = [], [], []
        self.end = None
        if self.lines[:2] != ['#cudalloc-trace v1', COLUMNS]:
            self.errors.append('header %r' % self.lines[:2])
        body = self.lines[2:]
        for i, l in enumerate(body):
            if l.startswith('#map '):
                self.maps.append(l[5:])
            elif l.startswith('#'):
                self.comments.append(l)
                m = END.match(l)
                if m:
                    self.end = (int(m.group(1)), int(m.group(2)))
            else:
                try:
                    self.records.append(parse_record(l))
                except ValueError as e:
                    if allow_truncated and self.truncated and i == len(body) - 1:
                        continue
                    self.errors.append('line %d: %s: %r' % (i + 3, e, l[:200]))
        self.header = {}
        for c in self.comments:
            for kv in c[1:].split():
                k, sep, v = kv.partition('=')
                if sep and k in ('pid', 'ppid', 'stack_depth', 'ring_capacity', 'clock'):
                    self.header[k] = v
        self.kept = [r for r in self.records if r['event'] != 'dropped']
        self.dropped = sum(int(r['extra']['count']) for r in self.records if r['event'] == 'dropped')


def parse_record(line):
    f = line.split(',')
    if len(f) != 14:
        raise ValueError('%d fields' % len(f))
    r = {'ts_ns': int(f[0]), 'pid': int(f[1]), 'tid': int(f[2]), 'device': int(f[3]),
         'event': f[4], 'stream': f[5], 'ptr': f[6], 'requested': int(f[7]),
         'rounded': int(f[8]), 'result': f[9], 'hit': f[10], 'allocated': int(f[11]),
         'reserved': int(f[12])}
    if r['event'] not in EVENTS or r['result'] not in RESULTS or r['hit'] not in ('0', '1'):
        raise ValueError('event/result/hit')
    if r['ts_ns'] < 0 or not HEX.match(r['ptr']) or not (r['stream'] == '-' or HEX.match(r['stream'])):
        raise ValueError('ts/ptr/stream')
    extra = collections.OrderedDict()
    for item in f[13].split(';') if f[13] else []:
        k, sep, v = item.partition('=')
        if not sep or k not in EXTRA_KEYS or k in extra:
            raise ValueError('extra %r' % item)
        extra[k] = v
    if list(extra) != [k for k in EXTRA_KEYS if k in extra]:
        raise ValueError('extra order')
    if 'stack' in extra and not all(HEX.match(pc) for pc in extra['stack'].split('/')):
        raise ValueError('stack')
    if r['event'] == 'dropped' and not extra.get('count', '').isdigit():
        raise ValueError('dropped without count')
    r['extra'] = extra
    return r


def trace_env(trace, conf=None):
    """The environment of a traced client: CUDALLOC_TRACE, and CUDALLOC_CONF only if given."""
    env = dict(os.environ, CUDALLOC_TRACE=trace)
    env.pop('CUDALLOC_CONF', None)
    if conf:
        env['CUDALLOC_CONF'] = conf
    return env


def run(argv, trace, conf=None, timeout=60):
    t0 = time.time()
    p = subprocess.run(argv, env=trace_env(trace, conf), capture_output=True, text=True, timeout=timeout)
    print('$', ' '.join(argv[1:]), 'rc', p.returncode, '%.1f s' % (time.time() - t0))
    if p.stderr.strip():
        print(p.stderr.strip()[-2000:])
    return p


def expected_calls(out):
    """The client's E lines: tid -> [(event, ptr, stream)] in call order."""
    calls = collections.defaultdict(list)
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == 'E':
            calls[int(f[1])].append((f[2], f[3], f[4]))
    return calls


def calls_of(records):
    got = collections.defaultdict(list)
    for r in records:
        if r['event'] in ('alloc', 'free'):
            got[r['tid']].append((r['event'], r['ptr'], r['stream']))
    return got


def same_calls(want, got):
    """Per thread, the same (event, ptr, stream) in the same order: the stream column holds the
    program's own handle ('-' for cuMemAlloc/cuMemFree), as docs/trace-format.md says."""
    if set(want) != set(got):
        return False
    return all(got[tid] == calls for tid, calls in want.items())


def balance(records):
    """Walks the file in order: a block is allocated only while not live, freed only while live;
    nothing is live at the end. Returns the first problem, or None."""
    live = set()
    for r in records:
        if r['result'] != 'ok' or r['event'] not in ('alloc', 'free'):
            continue
        key = (r['device'], r['ptr'])
        if r['event'] == 'alloc':
            if key in live:
                return 'allocated twice: %s (tid %d, ts %d)' % (r['ptr'], r['tid'], r['ts_ns'])
            live.add(key)
        elif key not in live:
            return 'freed while not live: %s (tid %d, ts %d)' % (r['ptr'], r['tid'], r['ts_ns'])
        else:
            live.discard(key)
    return 'live at the end: %d blocks' % len(live) if live else None


def in_order(records):
    """Per thread, ts_ns never decreases; with clock=tsc, not down the whole file either."""
    last = {}
    for r in records:
        if r['ts_ns'] < last.get(r['tid'], 0):
            return False
        last[r['tid']] = r['ts_ns']
    return True


def file_order(t):
    return t.header.get('clock') != 'tsc' or all(
        a['ts_ns'] <= b['ts_ns'] for a, b in zip(t.kept, t.kept[1:]))


def closed(t):
    """`# end records=N dropped=M`: the last line, N the record lines, M the dropped counts."""
    return (t.end is not None and END.match(t.lines[-1]) is not None and
            t.end == (len(t.kept), t.dropped))


def report(checks, *more):
    print(checks, *more)
    return 0 if all(checks.values()) else 1


def summary_text(scripts, path, *extra):
    """`cudalloc-trace summary PATH EXTRA...`, the completed process."""
    p = subprocess.run([sys.executable, os.path.join(scripts, 'cudalloc-trace'), 'summary', path,
                        *extra], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        print('summary of %s: rc %d %s' % (path, p.returncode, p.stderr.strip()))
    return p


def summary(scripts, path):
    """The --json summary as a dict; None if the command failed."""
    p = summary_text(scripts, path, '--json')
    return json.loads(p.stdout) if p.returncode == 0 else None


def replay(scripts, replay_bin, path):
    p = subprocess.run([sys.executable, os.path.join(scripts, 'replay'), path, '--replay-bin',
                        replay_bin, '--format', 'json'], capture_output=True, text=True, timeout=60)
    print('replay of %s: rc %d %s' % (os.path.basename(path), p.returncode, p.stderr.strip()[-500:]))
    return p.returncode == 0


def threads(exe, scripts, replay_bin):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        p = run([exe, 'threads', '8', '4000', '2000'], path)
        if p.returncode != 0:
            return 1
        want = expected_calls(p.stdout)
        t = Trace(path)
        got = calls_of(t.kept)
        pid = int(t.header.get('pid', -1))
        differ = [tid for tid in want if got.get(tid, []) != want[tid]]
        problem = balance(t.kept)
        checks = {
            'every line parses': not t.errors,
            '8 threads of calls': len(want) == 8 and all(len(v) == 2 * 6000 for v in want.values()),
            'each thread its calls, in order': same_calls(want, got),
            'one pid': p.returncode == 0 and all(r['pid'] == pid for r in t.records),
            'ts_ns in order per thread': in_order(t.kept),
            'ts_ns in file order (tsc)': file_order(t),
            'allocs and frees balance': problem is None,
            'nothing dropped': t.dropped == 0 and len(t.kept) == len(t.records),
            '# end records=N matches': closed(t),
        }
        return report(checks, t.errors[:5], 'differ:', differ[:3], problem, 'end', t.end,
                      'records', len(t.kept), 'events',
                      dict(collections.Counter(r['event'] for r in t.records)))


def overflow(exe, scripts, replay_bin):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        # single_stream: a cudaFree'd block is reused at once, so the allocator cuts no segment
        # after a thread's first allocation and every record past the ring is one of the calls.
        # With fences, a slow run (TSan) cut segments late and their dropped records counted too.
        p = run([exe, 'overflow', '2', '20000'], path, conf='single_stream:true')
        if p.returncode != 0:
            return 1
        # Under single_stream a cudaMalloc'd block belongs to the legacy stream: its records name 0x0.
        want = {tid: [(e, ptr, '0x0' if s == '-' else s) for e, ptr, s in v]
                for tid, v in expected_calls(p.stdout).items()}
        t = Trace(path)
        cap = int(t.header.get('ring_capacity', 0))
        got = calls_of(t.kept)
        per_thread = collections.Counter(r['tid'] for r in t.kept)
        # Each lane keeps its first `cap` records; every call beyond them is a dropped record.
        # (Segment records come with the first allocation, among the kept ones.)
        lost = sum(len(v) - len(got.get(tid, [])) for tid, v in want.items())
        s = summary(scripts, path)
        checks = {
            'every line parses': not t.errors,
            '3 threads, each past the ring': len(want) == 3 and cap > 0 and
                                             all(len(v) > cap for v in want.values()),
            'each lane kept ring_capacity records': set(per_thread) == set(want) and
                                                    all(n == cap for n in per_thread.values()),
            'kept records are the first calls': all(got.get(tid) == v[:len(got.get(tid, []))]
                                                     for tid, v in want.items()),
            'dropped records count every lost call': t.dropped == lost and lost > 0,
            '# end records=N dropped=M matches': closed(t),
            'summary reports the drops': s is not None and s['dropped'] == t.dropped,
        }
        return report(checks, t.errors[:5], 'ring_capacity', cap, 'end', t.end, 'kept',
                      dict(per_thread), 'dropped', t.dropped, 'lost calls', lost)


def processes(exe, scripts, replay_bin, n=4):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        procs = [subprocess.Popen([exe, 'hold', '2000'], env=trace_env(path), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(n)]
        # All hold their trace open before any goes on to finish.
        ready = [pr.stdout.readline().split() for pr in procs]
        outs = []
        for pr in procs:
            out, err = pr.communicate('go\n', timeout=60)
            outs.append(out)
            if err.strip():
                print(err.strip()[-1000:])
        pids = [pr.pid for pr in procs]
        print('ready:', ready, 'rc:', [pr.returncode for pr in procs])
        files = sorted(os.listdir(d))
        want_files = {'run.trace'} | {'run.trace.%d' % pid for pid in pids}
        owners = {}
        per_file = {}
        for name in files:
            t = Trace(os.path.join(d, name))
            owner = int(t.header.get('pid', -1))
            owners[name] = owner
            mine = pids.index(owner) if owner in pids else None
            want = expected_calls(outs[mine]) if mine is not None else {}
            s = summary(scripts, t.path)
            per_file[name] = {
                'parses': not t.errors,
                'its own records': mine is not None and all(r['pid'] == owner for r in t.records)
                                   and calls_of(t.kept) == want and len(want) == 1,
                'closed': closed(t) and t.dropped == 0,
                'summary': s is not None and s['records'] == len(t.records) and s['closed_cleanly'],
            }
        checks = {
            'all ran': all(pr.returncode == 0 for pr in procs) and
                       all(r[:1] == ['READY'] for r in ready),
            'one file each': len(files) == n and set(files) <= want_files and
                             sorted(owners.values()) == sorted(pids),
            'path.PID for all but the first': all(name == 'run.trace' or name == 'run.trace.%d' %
                                                  owners[name] for name in files),
            'each complete and readable': all(all(v.values()) for v in per_file.values()),
        }
        return report(checks, files, per_file)


def killed(exe, scripts, replay_bin):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        pr = subprocess.Popen([exe, 'loop', '5000'], env=trace_env(path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        ready = pr.stdout.readline().split()
        # Kill once the writer has written the first pairs, while it still records more.
        deadline = time.time() + 15
        while time.time() < deadline and open(path, 'rb').read().count(b'\n') < 10000:
            time.sleep(0.02)
        time.sleep(0.05)
        pr.send_signal(signal.SIGKILL)
        pr.wait(timeout=30)
        print('ready:', ready, 'rc', pr.returncode)
        t = Trace(path, allow_truncated=True)
        # The same file cut in the middle of its last record.
        cut = os.path.join(d, 'cut.trace')
        data = open(path, 'rb').read()
        last = data.rstrip(b'\n').rfind(b'\n')
        with open(cut, 'wb') as f:
            f.write(data[:last + 1 + (len(data) - last) // 2])
        tc = Trace(cut, allow_truncated=True)
        s, sc = summary(scripts, path), summary(scripts, cut)
        text = summary_text(scripts, cut)
        checks = {
            'killed': pr.returncode == -signal.SIGKILL and ready[:1] == ['READY'],
            'records up to the kill': len(t.kept) >= 10000 and not t.errors,
            'no end line': t.end is None and not any(c.startswith('# signal') for c in t.comments),
            'summary reads it': s is not None and not s['closed_cleanly'] and
                                s['records'] == len(t.records),
            'replay reads it': replay(scripts, replay_bin, path),
            'cut copy: last line skipped': tc.truncated and not tc.errors and sc is not None
                                           and sc['truncated'] and sc['records'] == len(tc.records),
            'cut copy: summary text says so': text.returncode == 0 and 'truncated' in text.stdout,
            'cut copy: replay reads it': replay(scripts, replay_bin, cut),
        }
        return report(checks, 'records', len(t.kept), 'cut records', len(tc.kept))


def stacks(exe, scripts, replay_bin):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'run.trace')
        p = run([exe, 'stacks'], path, conf='trace_stacks:4')
        if p.returncode != 0:
            return 1
        want = expected_calls(p.stdout)
        t = Trace(path)
        ranges = []
        for m in t.maps:
            lo, hi = m.split()[0].split('-')
            ranges.append((int(lo, 16), int(hi, 16), m.split()[-1]))

        def mapped(pc):
            return any(lo <= pc < hi for lo, hi, _ in ranges)

        allocs = [r for r in t.kept if r['event'] == 'alloc']
        pcs = [[int(pc, 16) for pc in r['extra'].get('stack', '').split('/') if pc] for r in allocs]
        s = summary(scripts, path)
        text = summary_text(scripts, path)
        sites = s['sites'] if s else []
        checks = {
            'every line parses': not t.errors,
            'options stack_depth=4': t.header.get('stack_depth') == '4',
            '#map lines': any('libcudalloc' in r[2] for r in ranges),
            'records are the calls': same_calls(want, calls_of(t.kept)) and len(allocs) == 40,
            'alloc records carry stack=': all(1 <= len(st) <= 4 for st in pcs),
            'PCs inside mapped files': all(mapped(pc) for st in pcs for pc in st),
            '# end': closed(t),
            'summary: sites cover the allocs': len(sites) >= 1 and
                                               sum(x['allocs'] for x in sites) == len(allocs),
            'summary: sites have frames': all(len(x['frames']) == len(x['stack']) >= 1 for x in sites),
            'summary text: allocation sites': text.returncode == 0 and
                                              'allocation sites by bytes' in text.stdout,
        }
        return report(checks, t.errors[:5], 'sites:',
                      [(x['allocs'], x['stack']) for x in sites],
                      text.stdout[text.stdout.find('allocation sites'):][:600])


if __name__ == '__main__':
    mode, args = sys.argv[1], sys.argv[2:]
    fn = {'threads': threads, 'overflow': overflow, 'processes': processes, 'killed': killed,
          'stacks': stacks}.get(mode)
    sys.exit(fn(*args) if fn else 'unknown mode ' + mode)
