"""`cudalloc-trace export`: to a PyTorch memory snapshot, a Chrome/Perfetto trace, RMM's CSV."""

import bisect
import contextlib
import json
import os
import pickle
import stat
import sys
import tempfile
import time

from ct_reader import TraceError, phase_of
from ct_symbols import Symbolizer

SMALL_SEGMENT = 2 * 1024 * 1024  # PyTorch's small-pool segments are 2 MiB


# --- PyTorch memory snapshot (torch.cuda.memory._snapshot(); pytorch.org/memory_viz)

class _State:
    """Segments and live blocks per device, replayed from the records."""

    def __init__(self):
        self.segs = {}    # device -> {address: [size, stream]}
        self.blocks = {}  # device -> {address: (size, requested, stream, stack)}

    def seg_alloc(self, d, addr, size, stream):
        self.segs.setdefault(d, {})[addr] = [size, stream]

    def seg_free(self, d, addr, size):
        segs = self.segs.get(d, {})
        if addr in segs and segs[addr][0] == size:
            del segs[addr]
            return
        end = addr + size
        for base in [b for b, (sz, _) in segs.items() if b < end and b + sz > addr]:
            sz, stream = segs.pop(base)
            if base < addr:
                segs[base] = [addr - base, stream]
            if base + sz > end:
                segs[end] = [base + sz - end, stream]

    def alloc(self, d, addr, size, requested, stream, stack):
        self.blocks.setdefault(d, {})[addr] = (size, requested, stream, stack)

    def free(self, d, addr):
        return self.blocks.get(d, {}).pop(addr, None)


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


def torch_snapshot(trace, frames_of):
    state = _State()
    traces = {}  # device -> [entries]

    def entry(d, action, addr, size, stream, ts_ns, stack, nvtx=None, **more):
        e = {"action": action, "addr": addr, "size": size, "stream": _stream_int(stream),
             "frames": stack, "time_us": ts_ns // 1000}
        if nvtx:
            e["user_metadata"] = nvtx
        e.update(more)
        traces.setdefault(d, []).append(e)

    for r in trace.records():
        ev, d = r.event, r.device
        if ev == "dropped" or r.result != "ok" and ev != "oom":
            continue
        stack = r.extra.get("stack", "")
        nv = r.nvtx
        if ev == "segment_alloc":
            state.seg_alloc(d, r.ptr, r.requested, r.stream)
            entry(d, "segment_alloc", r.ptr, r.requested, r.stream, r.ts_ns, stack, nv)
        elif ev == "segment_free":
            state.seg_free(d, r.ptr, r.requested)
            entry(d, "segment_free", r.ptr, r.requested, r.stream, r.ts_ns, stack, nv)
        elif ev == "alloc":
            state.alloc(d, r.ptr, r.rounded, r.requested, r.stream, stack)
            entry(d, "alloc", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
        elif ev == "free":
            state.free(d, r.ptr)
            entry(d, "free_requested", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
            entry(d, "free_completed", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
        elif ev == "passthrough_alloc":
            state.seg_alloc(d, r.ptr, r.rounded, r.stream)
            state.alloc(d, r.ptr, r.rounded, r.requested, r.stream, stack)
            entry(d, "segment_alloc", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
            entry(d, "alloc", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
        elif ev == "passthrough_free":
            state.free(d, r.ptr)
            state.seg_free(d, r.ptr, r.rounded)
            entry(d, "free_requested", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
            entry(d, "free_completed", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
            entry(d, "segment_free", r.ptr, r.rounded, r.stream, r.ts_ns, stack, nv)
        elif ev == "oom":
            # device_free: what the device still had free is not in the trace.
            entry(d, "oom", 0, r.requested, r.stream, r.ts_ns, stack, nv, device_free=0)

    segments = []
    devices = set(state.segs) | set(state.blocks) | set(traces)
    for d in sorted(devices):
        blocks = state.blocks.get(d, {})
        addrs = sorted(blocks)
        used = set()
        segs = sorted(state.segs.get(d, {}).items())
        # Live blocks outside every known segment (records lost, trace started late) get a
        # segment of their own so the snapshot stays consistent.
        starts = [b for b, _ in segs]
        for a in addrs:
            i = bisect.bisect_right(starts, a) - 1
            if i < 0 or a >= segs[i][0] + segs[i][1][0]:
                segs.append((a, [blocks[a][0], blocks[a][2]]))
        segs.sort()
        for base, (size, stream) in segs:
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
                                       "state": "inactive", "frames": []})
                out_blocks.append({"address": a, "size": bsize, "requested_size": min(breq, bsize),
                                   "state": "active_allocated", "frames": bstack})
                used.add(a)
                alloc_sz += bsize
                req_sz += min(breq, bsize)
                cursor = a + bsize
            if cursor < end:
                out_blocks.append({"address": cursor, "size": end - cursor, "requested_size": 0,
                                   "state": "inactive", "frames": []})
            segments.append({
                "device": d, "address": base, "total_size": size, "allocated_size": alloc_sz,
                "active_size": alloc_sz, "requested_size": req_sz, "stream": _stream_int(stream),
                "segment_type": "small" if size <= SMALL_SEGMENT else "large",
                "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                "blocks": out_blocks})

    ndev = (max(devices) + 1) if devices else 0
    device_traces = [traces.get(d, []) for d in range(ndev)]
    # Frames: raw stacks -> symbolized frame dicts, shared between entries.
    cache = {}

    def conv(stack):
        if not stack:
            return []
        f = cache.get(stack)
        if f is None:
            f = cache[stack] = frames_of([int(pc, 16) for pc in stack.split("/") if pc])
        return f

    for seg in segments:
        for b in seg["blocks"]:
            b["frames"] = conv(b["frames"])
    for entries in device_traces:
        for e in entries:
            e["frames"] = conv(e["frames"])
    return {"segments": segments, "device_traces": device_traces}


def export_torch(trace, args):
    sym = None

    def frames_of(pcs):
        nonlocal sym
        if sym is None:
            sym = Symbolizer(trace.maps, use_addr2line=not args.no_symbols)
        sym.resolve(pcs)
        return sym.frames(pcs)

    snap = torch_snapshot(trace, frames_of)
    incomplete = _incomplete(trace)
    if incomplete:
        snap["cudalloc_trace"] = incomplete  # PyTorch's readers look up only the keys they know
    with _output(args.output, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    n = sum(len(t) for t in snap["device_traces"])
    return "%d segments, %d trace entries" % (len(snap["segments"]), n)


# --- Chrome / Perfetto trace JSON

def export_chrome(trace, args):
    n = 0
    with _output(args.output, "w") as f:
        f.write('{"displayTimeUnit":"ms","traceEvents":[\n')
        first = True

        def emit(obj):
            nonlocal first, n
            f.write(("" if first else ",\n") + json.dumps(obj, separators=(",", ":")))
            first = False
            n += 1

        def phase_slice(name, pid, tid, start_ns, end_ns):
            # Integer nanoseconds until here, so that one slice ends exactly where the next starts.
            emit({"name": name, "ph": "X", "ts": start_ns / 1000.0,
                  "dur": (end_ns - start_ns) / 1000.0, "pid": pid, "tid": tid, "cat": "nvtx"})

        pid = None
        last = {}
        # NVTX range stacks are per thread: a track per (pid, tid), holding [phase or None,
        # ns where that phase started, or where the thread's last slice ended].
        phases = {}
        last_ns = 0
        for r in trace.records():
            if pid is None:
                pid = r.pid
                cmd = trace.header.get("cmdline", "")
                emit({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                      "args": {"name": "cudalloc %d %s" % (pid, cmd[:80])}})
            us = r.ts_ns / 1000.0
            last_ns = max(last_ns, r.ts_ns)
            if r.event == "dropped":
                emit({"name": "records dropped", "ph": "i", "s": "p", "ts": us, "pid": r.pid,
                      "tid": 0, "args": {"count": r.count}})
                continue
            key = r.device
            vals = (r.allocated, r.reserved)
            if last.get(key) != vals:
                last[key] = vals
                emit({"name": "device %d memory" % r.device, "ph": "C", "ts": us, "pid": r.pid,
                      "args": {"allocated": r.allocated, "reserved": r.reserved}})
            if r.event == "oom":
                emit({"name": "OOM: %d bytes" % r.requested, "ph": "i", "s": "p", "ts": us,
                      "pid": r.pid, "tid": r.tid,
                      "args": {"device": r.device, "requested": r.requested,
                               "rounded": r.rounded, "allocated": r.allocated,
                               "reserved": r.reserved, "nvtx": r.nvtx or ""}})
            p = phase_of(r.nvtx, args.nvtx_depth)
            track = (r.pid, r.tid)
            cur = phases.get(track)
            if cur is None:
                if p is None:
                    continue
                emit({"name": "thread_name", "ph": "M", "pid": r.pid, "tid": r.tid,
                      "args": {"name": "thread %d (NVTX phases)" % r.tid}})
                cur = phases[track] = [None, r.ts_ns]
            if p != cur[0]:
                # With clock=monotonic ts_ns may step back (across threads, or a clock change):
                # a slice never ends before it starts, nor starts before the last one ended.
                now = max(r.ts_ns, cur[1])
                if cur[0] is not None:
                    phase_slice(cur[0], r.pid, r.tid, cur[1], now)
                cur[0], cur[1] = p, now
        for (p_id, tid), (p, start_ns) in phases.items():
            if p is not None:  # still open: up to the end of the trace
                phase_slice(p, p_id, tid, start_ns, max(last_ns, start_ns))
        incomplete = _incomplete(trace)
        if incomplete and pid is not None:
            # Marks where the recorded history stops, on the timeline itself.
            emit({"name": "trace %s" % ("truncated" if trace.truncated else "not closed"),
                  "ph": "i", "s": "g", "ts": last_ns / 1000.0, "pid": pid, "tid": 0,
                  "args": {"why": incomplete["incomplete"]}})
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
    with _output(args.output, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        for r in trace.records():
            if r.result != "ok":
                continue
            if r.event in ("alloc", "passthrough_alloc"):
                action = "allocate"
            elif r.event in ("free", "passthrough_free"):
                action = "free"
            else:
                continue
            if args.device is not None and r.device != args.device:
                continue
            if origin is None:  # header comments are read as the records are
                try:
                    origin = int(trace.header.get("origin_realtime_ns", "0") or 0)
                except ValueError:
                    origin = 0  # a corrupt origin: times from the trace start
            wall = origin + r.ts_ns
            try:
                tm = time.gmtime(wall // 1000000000)
            except (OverflowError, OSError, ValueError):  # a corrupt origin or timestamp
                tm = time.gmtime(0)
            when = "%02d:%02d:%02d:%06d" % (tm.tm_hour, tm.tm_min, tm.tm_sec,
                                           (wall % 1000000000) // 1000)
            f.write("%d,%s,%s,0x%x,%d,%d\n" % (r.tid, when, action, r.ptr, r.requested,
                                               _stream_int(r.stream)))
            n += 1
    return "%d allocate/free lines" % n


FORMATS = {"torch-snapshot": export_torch, "chrome": export_chrome, "rmm": export_rmm}


def run(trace, args, out):
    try:
        what = FORMATS[args.format](trace, args)
    except OSError as e:
        if getattr(e, "filename", None) == args.output:
            raise TraceError("cannot write %s: %s" % (args.output, e.strerror)) from None
        raise
    out.write("wrote %s (%s)\n" % (args.output, what))
    incomplete = _incomplete(trace)
    if incomplete:
        # The export holds only what was recorded: say so, as summary does (rmm has no place for
        # it in the file).
        sys.stderr.write("cudalloc-trace: warning: %s: %s; the export stops there\n"
                         % (trace.path, incomplete["incomplete"]))
