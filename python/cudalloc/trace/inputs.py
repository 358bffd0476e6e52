"""Inputs of `cudalloc-replay` (python/cudalloc/replay.py): allocation histories converted to
its canonical op stream.

The canonical op stream (documented at the top of tools/cudalloc_replay.cpp and in
tools/README.md) is one op per line:

    a <id> <bytes> <stream|-> [async]
    f <id> <stream|-> [async]

Supported inputs (each may be gzipped):
  cudalloc          cudalloc's own trace format v1 (docs/trace-format.md), read by the trace
                    reader (reader.py) as the other trace tools read it
  pytorch-snapshot  a pickle written by torch.cuda.memory._dump_snapshot (segments + device_traces)
  rmm               RMM logging_resource_adaptor CSV (Thread,Time,Action,Pointer,Size,Stream)
  ops               the canonical op stream itself (passed through)

Every problem with an input raises InputError with a one-line message; nothing else escapes.
Python standard library only.
"""

import csv
import io
import pickle
import re
import zlib

from .reader import TraceError, open_trace, read_all, _gunzipped

FORMATS = ("cudalloc", "pytorch-snapshot", "rmm", "ops")

NO_STREAM = "-"


class InputError(Exception):
    """A problem with the input, described in one line."""


class Converted:
    """The op stream of one input, plus what the conversion noticed."""

    def __init__(self, fmt):
        self.format = fmt
        self.lines = []    # ops not yet joined into chunks
        self.chunks = []   # joined ops ("a 1 512 0x0\n..."), before self.lines
        self.notes = []    # one-line remarks for stderr
        self.allocs = 0
        self.frees = 0

    def seal(self):
        """Joins the ops so far into one chunk: a string per op costs more than its text."""
        if self.lines:
            self.lines.append("")
            self.chunks.append("\n".join(self.lines))
            self.lines = []

    def text(self):
        self.seal()
        return "".join(self.chunks)

    def write_to(self, f):
        """Writes the op stream to a binary file."""
        self.seal()
        for c in self.chunks:
            f.write(c.encode())


class OpBuilder:
    """Turns (address, size, stream) events into ops with ids; an address maps to the id of the
    allocation live at it, so reused addresses get fresh ids."""

    def __init__(self, out):
        self.out = out
        self.live = {}  # address -> (id, stream)
        self.next_id = 1
        self.implied_frees = 0
        self.unknown_frees = 0

    def alloc(self, addr, size, stream, is_async=False):
        old = self.live.pop(addr, None)
        if old is not None:
            # The free of the previous allocation at this address was lost (dropped records,
            # a history ring buffer that wrapped): free it here, on its own stream.
            self.implied_frees += 1
            self.out.lines.append("f %d %s" % (old[0], old[1]))
            self.out.frees += 1
        i = self.next_id
        self.next_id += 1
        self.live[addr] = (i, stream)
        self.out.lines.append("a %d %d %s%s" % (i, size, stream, " async" if is_async else ""))
        self.out.allocs += 1

    def free(self, addr, stream, is_async=False):
        entry = self.live.pop(addr, None)
        if entry is None:
            # Passed on with an id that was never allocated: cudalloc-replay counts and reports
            # it as an input error and skips it.
            self.unknown_frees += 1
            i = self.next_id
            self.next_id += 1
        else:
            i = entry[0]
        self.out.lines.append("f %d %s%s" % (i, stream, " async" if is_async else ""))
        self.out.frees += 1

    def finish(self, what):
        if self.implied_frees:
            self.out.notes.append("%d allocations reused a live address; their earlier %s was "
                                  "missing and is implied" % (self.implied_frees, what))
        if self.unknown_frees:
            self.out.notes.append("%d frees of addresses that were not allocated in the input"
                                  % self.unknown_frees)


def _stream_text(value):
    if value is None:
        return NO_STREAM
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("stream is not an integer")
    if value < 0:
        value &= (1 << 64) - 1
    return "0x%x" % value


def _hex(text):
    """An address or stream: 0x-prefixed hex, bare hex with a letter, or decimal; 64 bits at most."""
    text = text.strip()
    if text.lower().startswith("0x"):
        value = int(text[2:], 16)
    elif text in ("", "-"):
        raise ValueError("empty")
    elif re.fullmatch(r"[0-9a-fA-F]+", text) and re.search(r"[a-fA-F]", text):
        value = int(text, 16)
    else:
        value = int(text, 10)
    if value >= 1 << 64:
        raise ValueError("does not fit 64 bits")
    return value


def _decode(raw, name):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError("%s: not UTF-8 text (byte %d)" % (name, e.start)) from None


# --- detection

def detect(head, name):
    """The format of an input from its first bytes (up to 4 KiB, gunzipped)."""
    if not head.strip():
        raise InputError("%s: empty input" % name)
    if head[:1] == b"\x80":
        return "pytorch-snapshot"
    text = head[:4096].decode("utf-8", errors="replace")
    if text.startswith("#cudalloc-trace"):
        return "cudalloc"
    first = ""
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            first = line.strip()
            break
    if first.replace(" ", "").lower().startswith("thread,time,action"):
        return "rmm"
    if re.match(r"^[af]\s+\d+\s", first + " "):
        return "ops"
    raise InputError("%s: unknown input format (expected a cudalloc trace, a PyTorch memory snapshot "
                     "pickle, an RMM log CSV or an op stream); pass --input-format" % name)


# --- cudalloc trace v1, through the trace reader

def convert_cudalloc_stream(f, name, device=None, progress=None):
    """f: a binary stream (gunzipped or not) of a cudalloc trace."""
    try:
        trace = open_trace(name, fileobj=f)
    except TraceError as e:
        raise InputError(str(e)) from None
    if progress is not None:
        progress(trace)
    per_device = {}   # device -> (Converted, OpBuilder)
    alloc_counts = {}
    dropped = 0
    try:
        for b in trace.batches():
            for d, ev, stream, ptr, req, res, extra in zip(b.device, b.event, b.stream, b.ptr,
                                                           b.requested, b.result, b.extra):
                if ev == "dropped":
                    text = extra.get("count", "0")
                    dropped += int(text) if text.isdigit() else 0
                    continue
                if res != "ok":
                    continue  # the program got nothing (or freed nothing): nothing to replay
                is_alloc = ev == "alloc" or ev == "passthrough_alloc"
                if not is_alloc and ev != "free" and ev != "passthrough_free":
                    continue
                cb = per_device.get(d)
                if cb is None:
                    out = Converted("cudalloc")
                    cb = per_device[d] = (out, OpBuilder(out))
                s = NO_STREAM if stream is None else "0x%x" % stream
                is_async = extra.get("async") == "1" if extra else False
                if is_alloc:
                    alloc_counts[d] = alloc_counts.get(d, 0) + 1
                    if req > 0:
                        cb[1].alloc(ptr, req, s, is_async)
                else:
                    cb[1].free(ptr, s, is_async)
            for out, _ in per_device.values():
                out.seal()
    except TraceError as e:
        raise InputError(str(e)) from None
    notes = []
    if trace.truncated:
        notes.append("%s: skipped the truncated last line" % name)
    pick = Converted("cudalloc")
    dev = _pick_device(pick, name, device, alloc_counts)
    out, ops = per_device.get(dev, (Converted("cudalloc"), None))
    if ops is not None:
        ops.finish("free record")
    out.notes = notes + pick.notes + out.notes
    if dropped:
        out.notes.append("the trace writer dropped %d records: the replay misses them" % dropped)
    return out


def convert_cudalloc(raw, name, device=None):
    return convert_cudalloc_stream(io.BytesIO(raw), name, device)


def _pick_device(out, name, device, counts):
    """counts: device -> allocations there."""
    if device is not None:
        if device not in counts:
            raise InputError("%s: no allocations on device %d (devices: %s)"
                             % (name, device, ", ".join(map(str, sorted(counts))) or "none"))
        return device
    if not counts:
        return 0
    best = max(sorted(counts), key=lambda d: counts[d])
    if len(counts) > 1:
        out.notes.append("replaying device %d only (allocations on devices %s); pass --device"
                         % (best, ", ".join(map(str, sorted(counts)))))
    return best


def _count(devices):
    counts = {}
    for d in devices:
        counts[d] = counts.get(d, 0) + 1
    return counts


# --- PyTorch memory snapshot

class _SnapshotUnpickler(pickle.Unpickler):
    """Snapshots hold only dicts, lists, str, int, float, bool and None; those need no globals.
    A few builtin container constructors are allowed for older pickle protocols; every other
    global (and so any code) is refused."""

    _ALLOWED = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "str", "int",
                                         "float", "bool")} | {("__builtin__", n) for n in (
                                         "dict", "list", "tuple", "set", "frozenset", "str", "int",
                                         "float", "bool", "unicode", "long")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            import builtins
            return getattr(builtins, {"unicode": "str", "long": "int"}.get(name, name))
        raise pickle.UnpicklingError("global '%s.%s' is not allowed in a memory snapshot" % (module, name))

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not allowed in a memory snapshot")


_ACTIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")


def _int_field(d, key, name, what):
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError("%s: %s has no integer '%s'" % (name, what, key))
    return v


def convert_snapshot(raw, name, device=None):
    out = Converted("pytorch-snapshot")
    try:
        snap = _SnapshotUnpickler(io.BytesIO(raw)).load()
    except RecursionError:
        raise InputError("%s: corrupt PyTorch snapshot (nested too deeply)" % name) from None
    except Exception as e:  # pickle raises many kinds on corrupt or truncated data
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError("%s: unreadable PyTorch snapshot pickle (%s)" % (name, msg)) from None
    if not isinstance(snap, dict) or not isinstance(snap.get("device_traces"), list) \
            or not isinstance(snap.get("segments", []), list):
        raise InputError("%s: not a PyTorch memory snapshot (expected a dict with 'segments' and "
                         "'device_traces')" % name)
    traces = snap["device_traces"]
    per_device_allocs = []
    for d, trace in enumerate(traces):
        if not isinstance(trace, list):
            raise InputError("%s: device_traces[%d] is not a list" % (name, d))
        for e in trace:
            if not isinstance(e, dict):
                raise InputError("%s: device_traces[%d] holds a %s, not a trace entry"
                                 % (name, d, type(e).__name__))
            if e.get("action") == "alloc":
                per_device_allocs.append(d)
    if not per_device_allocs:
        raise InputError("%s: the snapshot has no allocation history (record it with "
                         "torch.cuda.memory._record_memory_history before the run)" % name)
    dev = _pick_device(out, name, device, _count(per_device_allocs))
    trace = traces[dev]

    events = []  # (is_alloc, addr, size, stream)
    for i, e in enumerate(trace):
        action = e.get("action")
        if action not in ("alloc", "free_completed"):
            continue  # free_requested, segment_*, oom, snapshot: not program allocations
        what = "device_traces[%d][%d] (%s)" % (dev, i, action)
        addr = _int_field(e, "addr", name, what)
        size = _int_field(e, "size", name, what)
        try:
            stream = _stream_text(e.get("stream", 0))
        except ValueError:
            raise InputError("%s: %s has a bad 'stream'" % (name, what)) from None
        events.append((action == "alloc", addr, size, stream))

    # Blocks live when the trace window opened: those freed in the trace without being allocated
    # there, and those still allocated at the snapshot that the trace never mentions.
    prelude = {}  # addr -> (size, stream)
    seen = set()
    live = set()
    for is_alloc, addr, size, stream in events:
        if is_alloc:
            live.add(addr)
        elif addr in live:
            live.discard(addr)
        elif addr not in seen:
            prelude[addr] = (size, stream)
        seen.add(addr)
    for si, seg in enumerate(snap.get("segments", [])):
        if not isinstance(seg, dict):
            raise InputError("%s: segments[%d] is not a dict" % (name, si))
        if seg.get("device", dev) != dev:
            continue
        blocks = seg.get("blocks", [])
        if not isinstance(blocks, list):
            raise InputError("%s: segments[%d].blocks is not a list" % (name, si))
        offset = seg.get("address", 0) if isinstance(seg.get("address", 0), int) else 0
        try:
            seg_stream = _stream_text(seg.get("stream", 0))
        except ValueError:
            raise InputError("%s: segments[%d] has a bad 'stream'" % (name, si)) from None
        for bi, b in enumerate(blocks):
            if not isinstance(b, dict):
                raise InputError("%s: segments[%d].blocks[%d] is not a dict" % (name, si, bi))
            what = "segments[%d].blocks[%d]" % (si, bi)
            size = _int_field(b, "size", name, what)
            addr = b.get("address", offset)
            if isinstance(addr, bool) or not isinstance(addr, int):
                raise InputError("%s: %s has a bad 'address'" % (name, what))
            offset = addr + size
            if b.get("state") not in _ACTIVE_STATES or addr in seen:
                continue
            req = b.get("requested_size")
            if isinstance(req, int) and not isinstance(req, bool) and 0 < req <= size:
                size = req
            prelude[addr] = (size, seg_stream)

    ops = OpBuilder(out)
    for addr in sorted(prelude):
        size, stream = prelude[addr]
        ops.alloc(addr, size, stream)
    if prelude:
        out.notes.append("%d blocks were live when the trace window opened: allocated first" % len(prelude))
    for is_alloc, addr, size, stream in events:
        if is_alloc:
            if size > 0:
                ops.alloc(addr, size, stream)
        else:
            ops.free(addr, stream)
    ops.finish("free_completed entry")
    return out


# --- RMM logging_resource_adaptor CSV

def convert_rmm(raw, name, device=None):
    out = Converted("rmm")
    text = _decode(raw, name)
    truncated = bool(text) and not text.endswith("\n")
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:  # e.g. a NUL byte or an unterminated quote at the end
        raise InputError("%s: not a readable CSV file (%s)" % (name, e)) from None
    header_at = None
    for i, row in enumerate(rows):
        if row and "".join(row).strip():
            header_at = i
            break
    if header_at is None:
        raise InputError("%s: empty RMM log" % name)
    header = [c.strip().lower() for c in rows[header_at]]
    need = ["thread", "time", "action", "pointer", "size", "stream"]
    if header[:len(need)] != need:
        raise InputError("%s:%d: not an RMM log header (expected Thread,Time,Action,Pointer,Size,Stream)"
                         % (name, header_at + 1))
    ops = OpBuilder(out)
    failures = 0
    last = len(rows) - 1
    for i in range(header_at + 1, len(rows)):
        row = rows[i]
        lineno = i + 1
        if not row or not "".join(row).strip():
            continue
        try:
            if len(row) < 6:
                raise ValueError("expected 6 fields, got %d" % len(row))
            action = row[2].strip().lower()
            ptr = _hex(row[3])
            size = int(row[4].strip())
            if size < 0:
                raise ValueError("negative size")
            stream_field = row[5].strip()
            stream = _stream_text(_hex(stream_field)) if stream_field else "0x0"
            if action not in ("allocate", "free", "deallocate", "allocate failure", "free failure",
                              "deallocate failure"):
                raise ValueError("unknown action %r" % row[2].strip())
        except ValueError as e:
            if truncated and i == last:
                out.notes.append("%s: skipped the truncated last line" % name)
                break
            raise InputError("%s:%d: bad RMM log row (%s)" % (name, lineno, e)) from None
        if action.endswith("failure"):
            failures += 1
        elif action == "allocate":
            if size > 0:
                ops.alloc(ptr, size, stream, True)
        else:
            ops.free(ptr, stream, True)
    ops.finish("free")
    if failures:
        out.notes.append("%d failed allocations in the log were not replayed" % failures)
    return out


# --- the canonical op stream itself

def convert_ops(raw, name, device=None):
    out = Converted("ops")
    for lineno, line in enumerate(_decode(raw, name).splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s[0] not in "af" or len(s) < 2 or not s[1].isspace():
            raise InputError("%s:%d: bad op %r" % (name, lineno, s[:80]))
        if s[0] == "a":
            out.allocs += 1
        else:
            out.frees += 1
        out.lines.append(s)
    return out




CONVERTERS = {
    "cudalloc": convert_cudalloc,
    "pytorch-snapshot": convert_snapshot,
    "rmm": convert_rmm,
    "ops": convert_ops,
}


def convert(raw, name, fmt="auto", device=None):
    """raw: the input's bytes (gzipped or not). Returns a Converted; raises InputError."""
    return convert_stream(io.BytesIO(raw), name, fmt, device)


def convert_stream(f, name, fmt="auto", device=None, progress=None):
    """f: a binary stream of the input (gzipped or not). A cudalloc trace is read as it
    streams; the other formats are read whole. progress(trace) is called with a cudalloc
    trace before its records are read. Returns a Converted; raises InputError."""
    try:
        f = _gunzipped(f)
        head = f.peek(4096)[:4096] if hasattr(f, "peek") else b""
    except (OSError, EOFError, zlib.error) as e:
        raise InputError("%s: not a readable gzip file (%s)" % (name, e)) from None
    if fmt in (None, "auto"):
        fmt = detect(head, name)
    if fmt not in CONVERTERS:
        raise InputError("unknown input format %r (one of: auto, %s)" % (fmt, ", ".join(FORMATS)))
    if fmt == "cudalloc":
        return convert_cudalloc_stream(f, name, device, progress)
    try:
        raw = read_all(f, name)
    except TraceError as e:
        raise InputError(str(e)) from None
    if not raw.strip():
        raise InputError("%s: empty input" % name)
    return CONVERTERS[fmt](raw, name, device)
