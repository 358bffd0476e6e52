#!/usr/bin/env python3
"""Statistics and trace of pinned host memory, and the statistics of a destroyed context.

  host_check.py stats EXE          CUDALLOC_STATS=1, EXE pairs: the exit summary has the pinned
                                   host memory rows with 3003 host allocations, nearly all hits
  host_check.py ctx_destroy EXE    CUDALLOC_STATS=1, EXE ctx_destroy: the created context's
                                   summary is printed when it is destroyed (its 3 allocations),
                                   the primary context's at exit, each once
  host_check.py traced EXE SCRIPTS CUDALLOC_TRACE, EXE pairs: host_alloc/host_free/
                                   host_segment_alloc records (device -1, no stream), and
                                   scripts/cudalloc-trace summary still reads the trace
"""
import os, re, subprocess, sys, tempfile

# Under a sanitizer (tests/faults/run_sanitized.py) programs run several times slower.
SLOWDOWN = float(os.environ.get('CUDALLOC_TEST_TIMEOUT_MULTIPLIER', '1'))


def run(argv, **extra):
    env = dict(os.environ, **extra)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60 * SLOWDOWN)
    if p.returncode != 0:
        print(p.stderr)
        print('exit status', p.returncode)
        sys.exit(1)
    return p.stderr


def stats(exe):
    err = run([exe, 'pairs'], CUDALLOC_STATS='1')
    print(err)
    m = re.search(r'host allocs: (\d+)\s+hits: (\d+) \(after a fence: (\d+)\)\s+misses: (\d+)\s+frees: (\d+)', err)
    if not m or 'pinned host memory' not in err:
        print('no pinned host memory rows')
        return 1
    allocs, hits, _, misses, frees = map(int, m.groups())
    # 3 warm-up rounds of 2 and 1000 rounds of 3 allocations.
    ok = allocs == 3006 and frees == 3006 and misses <= 4 and hits == allocs - misses
    d = re.search(r'driver allocs: (\d+)', err)
    ok = ok and d is not None and int(d.group(1)) == misses
    return 0 if ok else 1


def ctx_destroy(exe):
    err = run([exe, 'ctx_destroy'], CUDALLOC_STATS='1')
    print(err)
    gone = err.find('is being destroyed')
    if gone < 0:
        print('no summary when the context was destroyed')
        return 1
    tables = [m.start() for m in re.finditer(r'cudalloc memory summary', err)]
    # The destroyed context's table right after its line, the primary context's at exit.
    if len(tables) != 2 or not tables[0] > gone:
        print('expected 2 summaries, the first after the destruction line:', tables)
        return 1
    first = err[tables[0]:tables[1]]
    m = re.search(r'Allocations\s+(\d+)\s+(\d+)\s+(\d+)', first)
    if not m or int(m.group(3)) != 3:
        print('the destroyed context did not report its 3 allocations')
        return 1
    if 'pinned host memory' not in first:
        print('the destroyed context did not report its pinned host memory')
        return 1
    return 0


def traced(exe, scripts):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, 'host.trace')
        run([exe, 'pairs'], CUDALLOC_TRACE=path)
        counts = {}
        with open(path) as f:
            for line in f:
                if line.startswith('#') or line.startswith('ts_ns'):
                    continue
                fields = line.rstrip('\n').split(',')
                ev = fields[4]
                counts[ev] = counts.get(ev, 0) + 1
                if ev.startswith('host_') and (fields[3] != '-1' or fields[5] != '-'):
                    print('host record with a device or a stream:', line)
                    return 1
        print(counts)
        if counts.get('host_alloc', 0) != 3006 or counts.get('host_free', 0) != 3006:
            return 1
        if counts.get('host_segment_alloc', 0) < 2:
            return 1
        p = subprocess.run([sys.executable, os.path.join(scripts, 'cudalloc-trace'), 'summary', path],
                           capture_output=True, text=True, timeout=60 * SLOWDOWN)
        print(p.stdout, p.stderr)
        return p.returncode


def main():
    mode = sys.argv[1]
    if mode == 'stats':
        return stats(sys.argv[2])
    if mode == 'ctx_destroy':
        return ctx_destroy(sys.argv[2])
    if mode == 'traced':
        return traced(sys.argv[2], sys.argv[3])
    return 2


if __name__ == '__main__':
    sys.exit(main())
