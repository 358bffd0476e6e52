"""`cudalloc-trace export`: to a PyTorch memory snapshot, a Chrome/Perfetto trace, RMM's CSV.

Every format is written as the records are read: the snapshot's trace entries go to a
temporary file per device as pickled runs of entries, and the pickle is assembled from them at
the end, so a million records never sit in memory as a million dicts.
"""

import bisect
import contextlib
import json
import os
import pickle
import shutil
import stat
import sys
import tempfile
import time

from .reader import TraceError, phase_of, stack_pcs
from .symbols import Symbolizer

SMALL_SEGMENT = 2 * 1024 * 1024  # PyTorch's small-pool segments are 2 MiB
SMALL_SIZE = 1024 * 1024         # requests up to this come from the small pool


def _stream_int(s):
    return 0 if s is None else s


@contextlib.contextmanager
def _output(path, mode):
    """A file that becomes `path` only once the export has succeeded: a failed export (a corrupt
    record halfway, a full disk) leaves no half-written file and keeps the previous one."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        # /dev/stdout, /dev/null, a FIFO: nothing to replace (a directory fails in open()).
        with open(path, mode) as f:
            yield f
        return
    target = os.path.realpath(path)  # through a symlink, as open() writes
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target),
                                   prefix=".%s." % os.path.basename(target), suffix=".tmp")
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    try:
        with os.fdopen(fd, mode) as f:
            # mkstemp's file is 0600: keep the old file's mode, or take the one open() would give.
            if st is not None:
                perms = stat.S_IMODE(st.st_mode)
            else:
                umask = os.umask(0)
                os.umask(umask)
                perms = 0o666 & ~umask
            os.fchmod(f.fileno(), perms)
            yield f
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _incomplete(trace):
    """How the trace ends short (as `summary` says it), or None; known once records() is done."""
    if trace.truncated:
        why = "the last line was truncated (skipped)"
    elif not trace.ended:
        why = "the trace was not closed (the process died or is still running)"
    else:
        return None
    return {"incomplete": why, "truncated": trace.truncated, "closed_cleanly": trace.ended}




# --- PyTorch memory snapshot (torch.cuda.memory._snapshot(); pytorch.org/memory_viz)
#
# What PyTorch writes and its viewer (torch/utils/viz/MemoryViz.js) reads: `segments`, the
# state at the end, one per cudaMalloc'd segment or, for expandable segments, one per
# contiguous mapped range of a reserved range (is_expandable: True), each tiled by its blocks
# (size: the block's, requested_size: what was asked); and `device_traces`, one list of
# entries per device, whose alloc/free entries carry the requested size and whose expandable
# segments grow and shrink by segment_map/segment_unmap entries.
#
# The trace records each mapped chunk of an expandable segment as a segment_alloc and has no
# record of the reserved range, so the export tells the two kinds apart by what only
# expandable segments do: a block that runs from one mapped chunk into the next.

# Pickle protocol 2 encodes a list as EMPTY_LIST, BINPUT 0, then runs of MARK..APPENDS (or an
# item and APPEND); without the first two opcodes the rest appends to the list on top of the
# unpickler's stack. Memo slots set by one run are read by that run only.
_LIST_HEAD = pickle.dumps([], 2)[2:-1]


def _body(obj):
    """The pickle opcodes that push `obj` (no protocol header, no STOP)."""
    return pickle.dumps(obj, 2)[2:-1]


def _appends(items):
    """The pickle opcodes that append `items` to the list on top of the stack."""
    b = _body(items)
    assert b.startswith(_LIST_HEAD), "unexpected pickle encoding of a list"
    return b[len(_LIST_HEAD):]


class _DeviceTrace:
    """One device's trace entries: pickled runs in a temporary file, and the segment entries
    (few) kept aside until it is known whether they are segment maps or segment allocations."""

    RUN = 4096  # entries pickled at a time

    def __init__(self):
        self.spool = tempfile.TemporaryFile()
        self.pieces = []   # (offset, length) of a pickled run, or a segment entry (a dict)
        self.pending = []  # entries not yet pickled; `frames` raw stack text where stacks is set
        self.stacks = False
        self.count = 0

    def add_segment(self, entry):
        self.count += 1
        self.pieces.append(entry)

    def flush(self, frames):
        pending = self.pending
        if not pending:
            return
        if self.stacks:
            frames.prepare(e["frames"] for e in pending if e["frames"].__class__ is str)
            for e in pending:
                if e["frames"].__class__ is str:
                    e["frames"] = frames(e["frames"])
            self.stacks = False
        data = _appends(pending)
        self.count += len(pending)
        pending.clear()
        off = self.spool.tell()
        self.spool.write(data)
        self.pieces.append((off, len(data)))


class _Segments:
    """Segments (or mapped chunks) and live blocks of one device at the current record."""

    def __init__(self):
        self.chunks = {}     # address -> [size, stream]: allocator segments / mapped chunks
        self.starts = []     # sorted addresses of self.chunks
        self.big = set()     # chunk addresses that held a block past the small-pool size
        self.passthrough = {}  # address -> [size, stream]: cudaMalloc'd outside the pools
        self.blocks = {}     # address -> (size, requested, stream, stack)

    def seg_alloc(self, addr, size, stream):
        if addr not in self.chunks:
            bisect.insort(self.starts, addr)
        self.chunks[addr] = [size, stream]

    def seg_free(self, addr, size):
        chunks = self.chunks
        if addr in chunks and chunks[addr][0] == size:
            del chunks[addr]
            self.starts.pop(bisect.bisect_left(self.starts, addr))
            return
        # A free that covers part of a segment, or several: keep what lies outside it.
        end = addr + size
        for base in [b for b, (sz, _) in chunks.items() if b < end and b + sz > addr]:
            sz, stream = chunks.pop(base)
            if base < addr:
                chunks[base] = [addr - base, stream]
            if base + sz > end:
                chunks[end] = [base + sz - end, stream]
        self.starts = sorted(chunks)

    def note_big(self, addr):
        """A block past the small-pool size was cut at addr: its chunk is of the large pool."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0:
            self.big.add(self.starts[i])

    def final_segments(self, expandable):
        """[(base, size, stream, is_expandable, big)] at the end of the trace."""
        out = []
        items = sorted(self.chunks.items())
        if expandable:
            run = None
            for base, (size, stream) in items:
                if run is not None and run[0] + run[1] == base and run[2] == stream:
                    run[1] += size
                    run[4] = run[4] or base in self.big
                    continue
                if run is not None:
                    out.append(tuple(run))
                run = [base, size, stream, True, base in self.big]
            if run is not None:
                out.append(tuple(run))
        else:
            out = [(base, size, stream, False, size > SMALL_SEGMENT)
                   for base, (size, stream) in items]
        out += [(base, size, stream, False, size > SMALL_SEGMENT)
                for base, (size, stream) in self.passthrough.items()]
        return sorted(out)


def _segment_dicts(d, state, expandable):
    blocks = state.blocks
    addrs = sorted(blocks)
    segs = state.final_segments(expandable)
    # Live blocks outside every known segment (records lost, trace started late) get a segment
    # of their own so the snapshot stays consistent.
    starts = [s[0] for s in segs]
    extra = []
    for a in addrs:
        i = bisect.bisect_right(starts, a) - 1
        if i < 0 or a >= segs[i][0] + segs[i][1]:
            size = blocks[a][0]
            extra.append((a, size, blocks[a][2], False, size > SMALL_SEGMENT))
    segs = sorted(segs + extra)
    out = []
    used = set()
    for base, size, stream, is_exp, big in segs:
        end = base + size
        out_blocks = []
        cursor = base
        alloc_sz = req_sz = 0
        i = bisect.bisect_left(addrs, base)
        while i < len(addrs) and addrs[i] < end:
            a = addrs[i]
            i += 1
            if a in used or a < cursor:
                continue
            bsize, breq, _, bstack = blocks[a]
            bsize = min(bsize, end - a)
            if a > cursor:
                out_blocks.append({"address": cursor, "size": a - cursor, "requested_size": 0,
                                   "state": "inactive", "frames": ""})
            req = min(breq, bsize)
            out_blocks.append({"address": a, "size": bsize, "requested_size": req,
                               "state": "active_allocated", "frames": bstack})
            used.add(a)
            alloc_sz += bsize
            req_sz += req
            cursor = a + bsize
        if cursor < end:
            out_blocks.append({"address": cursor, "size": end - cursor, "requested_size": 0,
                               "state": "inactive", "frames": ""})
        out.append({
            "device": d, "address": base, "total_size": size, "allocated_size": alloc_sz,
            "active_size": alloc_sz, "requested_size": req_sz, "stream": _stream_int(stream),
            "segment_type": "large" if big else "small",
            "segment_pool_id": (0, 0), "is_expandable": is_exp, "frames": [],
            "blocks": out_blocks})
    return out


class _Frames:
    """Raw `stack=` text -> frame dicts, resolved a run of entries at a time (one addr2line per
    object file per run, not per stack)."""

    def __init__(self, trace, symbolize):
        self.trace = trace
        self.symbolize = symbolize
        self.sym = None
        self.cache = {"": []}

    def prepare(self, stacks):
        new = [s for s in set(stacks) if s not in self.cache]
        if not new:
            return
        if self.sym is None:
            self.sym = Symbolizer(self.trace.maps, use_addr2line=self.symbolize)
        pcs = {s: stack_pcs(s) for s in new}
        self.sym.resolve(pc for p in pcs.values() for pc in p)
        for s, p in pcs.items():
            self.cache[s] = self.sym.frames(p)

    def __call__(self, stack):
        return self.cache[stack]


def export_torch(trace, args):
    frames = _Frames(trace, not args.no_symbols)
    devices = {}   # device -> _DeviceTrace
    states = {}    # device -> _Segments
    expandable = False
    no_frames = frames("")
    bisect_right = bisect.bisect_right

    for b in trace.batches():
        for ts, d, ev, stream, ptr, req, rnd, res, hit, extra in zip(
                b.ts_ns, b.device, b.event, b.stream, b.ptr, b.requested, b.rounded, b.result,
                b.hit, b.extra):
            if res != "ok" and ev != "oom" or ev == "dropped" or ev == "cache_release":
                continue
            dt = devices.get(d)
            if dt is None:
                dt = devices[d] = _DeviceTrace()
                states[d] = _Segments()
            st = states[d]
            if extra:
                stack = extra.get("stack", "")
                nv = extra.get("nvtx")
            else:
                stack, nv = "", None
            e = {"action": ev, "addr": ptr, "size": req, "stream": 0 if stream is None else stream,
                 "frames": stack or no_frames, "time_us": ts // 1000}
            if stack:
                dt.stacks = True
            if nv:
                e["user_metadata"] = nv
            if ev == "alloc":
                if not hit and rnd > SMALL_SIZE:
                    st.note_big(ptr)
                if not expandable:
                    # Does the block run past the end of the chunk it starts in?
                    starts = st.starts
                    i = bisect_right(starts, ptr) - 1
                    if i >= 0:
                        end = starts[i] + st.chunks[starts[i]][0]
                        if ptr < end < ptr + rnd:
                            expandable = True
                st.blocks[ptr] = (rnd, req, stream, stack)
                dt.pending.append(e)
            elif ev == "free":
                st.blocks.pop(ptr, None)
                e["action"] = "free_requested"
                e2 = e.copy()
                e2["action"] = "free_completed"
                dt.pending.append(e)
                dt.pending.append(e2)
            elif ev == "segment_alloc" or ev == "segment_free":
                if ev == "segment_alloc":
                    st.seg_alloc(ptr, req, stream)
                else:
                    st.seg_free(ptr, req)
                dt.flush(frames)
                if stack:
                    frames.prepare([stack])
                    e["frames"] = frames(stack)
                dt.add_segment(e)
            elif ev == "passthrough_alloc":
                st.passthrough[ptr] = [rnd, stream]
                st.blocks[ptr] = (rnd, req, stream, stack)
                e["action"], e["size"] = "segment_alloc", rnd
                e2 = e.copy()
                e2["action"], e2["size"] = "alloc", req
                dt.pending.append(e)
                dt.pending.append(e2)
            elif ev == "passthrough_free":
                st.blocks.pop(ptr, None)
                st.passthrough.pop(ptr, None)
                for action, size in (("free_requested", req), ("free_completed", req),
                                     ("segment_free", rnd)):
                    e = e.copy()
                    e["action"], e["size"] = action, size
                    dt.pending.append(e)
            elif ev == "oom":
                # device_free: what the device still had free is not in the trace.
                e["addr"] = 0
                e["device_free"] = 0
                dt.pending.append(e)
            if len(dt.pending) >= dt.RUN:
                dt.flush(frames)
    for dt in devices.values():
        dt.flush(frames)

    segments = []
    for d in sorted(states):
        segs = _segment_dicts(d, states[d], expandable)
        frames.prepare(b["frames"] for s in segs for b in s["blocks"])
        for s in segs:
            for blk in s["blocks"]:
                blk["frames"] = frames(blk["frames"])
        segments += segs
    incomplete = _incomplete(trace)
    ndev = (max(devices) + 1) if devices else 0
    n = 0
    with _output(args.output, "wb") as f:
        f.write(b"\x80\x02}(")                       # PROTO 2, EMPTY_DICT, MARK
        f.write(_body("segments") + _body(segments))
        f.write(_body("device_traces") + b"]")       # EMPTY_LIST
        for d in range(ndev):
            f.write(b"]")
            dt = devices.get(d)
            if dt is not None:
                n += dt.count
                for piece in dt.pieces:
                    if isinstance(piece, dict):
                        if expandable and piece["action"] in ("segment_alloc", "segment_free"):
                            piece["action"] = ("segment_map" if piece["action"] == "segment_alloc"
                                               else "segment_unmap")
                        f.write(_appends([piece]))
                    else:
                        dt.spool.seek(piece[0])
                        _copy(dt.spool, f, piece[1])
                dt.spool.close()
            f.write(b"a")                            # APPEND to device_traces
        if incomplete:
            # PyTorch's readers look up only the keys they know.
            f.write(_body("cudalloc_trace") + _body(incomplete))
        f.write(b"u.")                               # SETITEMS, STOP
    what = "%d segments, %d trace entries" % (len(segments), n)
    if expandable:
        what += ", expandable segments"
    return what


def _copy(src, dst, n):
    while n > 0:
        chunk = src.read(min(n, 1 << 20))
        if not chunk:
            raise OSError("temporary file ended early")
        dst.write(chunk)
        n -= len(chunk)
# --- Chrome / Perfetto trace JSON

def export_chrome(trace, args):
    n = 0
    with _output(args.output, "w") as f:
        f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        buf = []

        def emit(obj):
            buf.append(json.dumps(obj, separators=(",", ":")))

        def phase_slice(name, pid, tid, start_ns, end_ns):
            # Integer nanoseconds until here, so that one slice ends exactly where the next starts.
            emit({"name": name, "ph": "X", "ts": start_ns / 1000.0,
                  "dur": (end_ns - start_ns) / 1000.0, "pid": pid, "tid": tid, "cat": "nvtx"})

        def flush():
            nonlocal n
            if buf:
                f.write((",\n" if n else "") + ",\n".join(buf))
                n += len(buf)
                buf.clear()

        pid = None
        last = {}
        # NVTX range stacks are per thread: a track per (pid, tid), holding [phase or None,
        # ns where that phase started, or where the thread's last slice ended].
        phases = {}
        phase_cache = {}
        last_ns = 0
        # The counter event, the one of almost every record, formatted by hand (as json.dumps
        # would: floats by their repr).
        counter = ('{"name":"device %d memory","ph":"C","ts":%r,"pid":%d,'
                   '"args":{"allocated":%d,"reserved":%d}}')
        for b in trace.batches():
            if pid is None:
                pid = b.pid[0]
                cmd = trace.header.get("cmdline", "")
                emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                      "args": {"name": "cudalloc %d %s" % (pid, cmd[:80])}})
            for ts, rpid, tid, d, ev, req, rnd, alloc, resv, extra in zip(
                    b.ts_ns, b.pid, b.tid, b.device, b.event, b.requested, b.rounded,
                    b.allocated, b.reserved, b.extra):
                us = ts / 1000.0
                if ts > last_ns:
                    last_ns = ts
                if ev == "dropped":
                    text = extra.get("count", "0")
                    emit({"name": "records dropped", "ph": "i", "s": "p", "ts": us, "pid": rpid,
                          "tid": 0, "args": {"count": int(text) if text.isdigit() else 0}})
                    continue
                prev = last.get(d)
                if prev is None or prev[0] != alloc or prev[1] != resv:
                    last[d] = (alloc, resv)
                    buf.append(counter % (d, us, rpid, alloc, resv))
                nvtx = extra.get("nvtx") if extra else None
                if ev == "oom":
                    emit({"name": "OOM: %d bytes" % req, "ph": "i", "s": "p", "ts": us,
                          "pid": rpid, "tid": tid,
                          "args": {"device": d, "requested": req, "rounded": rnd,
                                   "allocated": alloc, "reserved": resv, "nvtx": nvtx or ""}})
                if nvtx:
                    p = phase_cache.get(nvtx)
                    if p is None:
                        p = phase_cache[nvtx] = phase_of(nvtx, args.nvtx_depth)
                else:
                    p = None
                track = (rpid, tid)
                cur = phases.get(track)
                if cur is None:
                    if p is None:
                        continue
                    emit({"name": "thread_name", "ph": "M", "pid": rpid, "tid": tid,
                          "args": {"name": "thread %d (NVTX phases)" % tid}})
                    cur = phases[track] = [None, ts]
                if p != cur[0]:
                    # With clock=monotonic ts_ns may step back (across threads, or a clock
                    # change): a slice never ends before it starts, nor starts before the last
                    # one ended.
                    now = max(ts, cur[1])
                    if cur[0] is not None:
                        phase_slice(cur[0], rpid, tid, cur[1], now)
                    cur[0], cur[1] = p, now
            flush()
        for (p_id, tid), (p, start_ns) in phases.items():
            if p is not None:  # still open: up to the end of the trace
                phase_slice(p, p_id, tid, start_ns, max(last_ns, start_ns))
        incomplete = _incomplete(trace)
        if incomplete and pid is not None:
            # Marks where the recorded history stops, on the timeline itself.
            emit({"name": "trace %s" % ("truncated" if trace.truncated else "not closed"),
                  "ph": "i", "s": "g", "ts": last_ns / 1000.0, "pid": pid, "tid": 0,
                  "args": {"why": incomplete["incomplete"]}})
        flush()
        f.write("\n]")
        if incomplete:
            f.write(',"otherData":%s' % json.dumps(incomplete, separators=(",", ":")))
        f.write("}\n")
    return "%d trace events" % n


# --- RMM logging_resource_adaptor CSV (what RMM's REPLAY_BENCHMARK reads)

def export_rmm(trace, args):
    origin = None
    try:
        origin = int(trace.header.get("origin_realtime_ns", ""))
    except ValueError:
        pass
    n = 0
    clock = {}  # second -> "HH:MM:SS" (records come thousands to a second)
    with _output(args.output, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for b in trace.batches():
            lines = []
            for tid, ts, d, ev, stream, ptr, req, res in zip(
                    b.tid, b.ts_ns, b.device, b.event, b.stream, b.ptr, b.requested, b.result):
                if res != "ok":
                    continue
                if ev == "alloc" or ev == "passthrough_alloc":
                    action = "allocate"
                elif ev == "free" or ev == "passthrough_free":
                    action = "free"
                else:
                    continue
                if args.device is not None and d != args.device:
                    continue
                if origin is None:  # header comments are read as the records are
                    try:
                        origin = int(trace.header.get("origin_realtime_ns", "0") or 0)
                    except ValueError:
                        origin = 0  # a corrupt origin: times from the trace start
                wall = origin + ts
                sec = wall // 1000000000
                hms = clock.get(sec)
                if hms is None:
                    try:
                        tm = time.gmtime(sec)
                    except (OverflowError, OSError, ValueError):  # a corrupt origin or stamp
                        tm = time.gmtime(0)
                    if len(clock) > 4096:
                        clock.clear()
                    hms = clock[sec] = "%02d:%02d:%02d" % (tm.tm_hour, tm.tm_min, tm.tm_sec)
                lines.append("%d,%s:%06d,%s,0x%x,%d,%d\n" % (
                    tid, hms, (wall % 1000000000) // 1000, action, ptr, req,
                    0 if stream is None else stream))
            f.write("".join(lines))
            n += len(lines)
    return "%d allocate/free lines" % n


FORMATS = {"torch-snapshot": export_torch, "chrome": export_chrome, "rmm": export_rmm}


def run(trace, args, out, bar=None):
    try:
        what = FORMATS[args.format](trace, args)
    except OSError as e:
        if getattr(e, "filename", None) == args.output:
            raise TraceError("cannot write %s: %s" % (args.output, e.strerror)) from None
        raise
    if bar is not None:
        bar.close()
    out.write("wrote %s (%s)\n" % (args.output, what))
    incomplete = _incomplete(trace)
    if incomplete:
        # The export holds only what was recorded: say so, as summary does (rmm has no place for
        # it in the file).
        sys.stderr.write("cudalloc-trace: warning: %s: %s; the export stops there\n"
                         % (trace.path, incomplete["incomplete"]))
