"""Reads cudalloc allocation traces (docs/trace-format.md, version 1).

    from ct_reader import open_trace, TraceError
    t = open_trace("trace.csv")        # reads and checks the header; raises TraceError
    for r in t.records():              # Record objects, in file order
        ...
    t.comments, t.maps, t.truncated    # filled in as records() runs

Every problem with the input is a TraceError with a one-line message (file and line number
included); a truncated last line (a process killed mid-write) is skipped, not an error.
"""

import os

FORMAT_MAGIC = "#cudalloc-trace v"
SUPPORTED_VERSIONS = (1,)
COLUMNS = ("ts_ns", "pid", "tid", "device", "event", "stream", "ptr", "requested", "rounded",
           "result", "hit", "allocated", "reserved", "extra")
EVENTS = ("alloc", "free", "segment_alloc", "segment_free", "cache_release", "oom",
          "passthrough_alloc", "passthrough_free", "dropped")
# Pinned host memory (device -1): records() leaves them out unless Trace.host is set, so that
# readers of device memory need not know them.
HOST_EVENTS = ("host_alloc", "host_free", "host_segment_alloc", "host_segment_free")
RESULTS = ("ok", "invalid_value", "out_of_memory", "device_error", "deinitialized")
NO_STREAM = None  # the `-` stream: cudaMalloc/cudaFree, no stream


class TraceError(Exception):
    """Bad input: the message is one line meant for the user."""


class Record:
    __slots__ = ("ts_ns", "pid", "tid", "device", "event", "stream", "ptr", "requested",
                 "rounded", "result", "hit", "allocated", "reserved", "extra", "lineno")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    @property
    def nvtx(self):
        return self.extra.get("nvtx")

    @property
    def is_async(self):
        return self.extra.get("async") == "1"

    @property
    def stack(self):
        """Raw return addresses, innermost first ([] when none were recorded)."""
        s = self.extra.get("stack")
        if not s:
            return []
        return [int(pc, 16) for pc in s.split("/") if pc]

    @property
    def count(self):
        """For `dropped` records: how many records the writer lost (0 if the field is corrupt)."""
        text = self.extra.get("count", "0")
        return int(text) if text.isdigit() else 0

    def __repr__(self):
        return "Record(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


def _parse_extra(text):
    out = {}
    if not text:
        return out
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError("bad extra field %r" % item)
        out[key] = value
    return out


# Every numeric field is written from a 64-bit integer; a longer one is corrupt (and an integer
# of thousands of digits cannot even be printed back in decimal by the exporters).
U64_LIMIT = 1 << 64


def _int(text, name):
    try:
        value = int(text, 10)
    except ValueError:
        raise ValueError("%s is not a number: %r" % (name, text[:40])) from None
    if not -U64_LIMIT < value < U64_LIMIT:
        raise ValueError("%s does not fit 64 bits: %r" % (name, text[:40]))
    return value


# Device ordinals: -1 marks records that belong to no device (dropped-record counts). The bound
# keeps a corrupt field from sizing per-device tables (a 2**64 ordinal made the snapshot export
# build a list that long); CUDA numbers devices well below it.
MAX_DEVICE = 1 << 16


def _device(text):
    d = _int(text, "device")
    if not -1 <= d < MAX_DEVICE:
        raise ValueError("device is not an ordinal: %r" % text)
    return d


def _hex(text, name):
    if not text.startswith("0x"):
        raise ValueError("%s is not a hex address: %r" % (name, text))
    try:
        value = int(text, 16)
    except ValueError:
        raise ValueError("%s is not a hex address: %r" % (name, text[:40])) from None
    if value >= U64_LIMIT:
        raise ValueError("%s does not fit 64 bits: %r" % (name, text[:40]))
    return value


class Trace:
    def __init__(self, path, f, version, columns, first_lineno):
        self.path = path
        self._f = f
        self.version = version
        self.columns = columns
        self._index = {c: i for i, c in enumerate(columns)}
        self._lineno = first_lineno
        self.comments = []   # "# ..." lines without the "# " prefix
        self.maps = []       # (start, end, offset, path) from "#map" lines
        self.truncated = False
        self.ended = False   # the writer closed the trace ("# end ..." seen)
        self._consumed = False
        self.host = False  # records() yields host records too

    @property
    def header(self):
        """`key=value` pairs of the comment lines seen so far (pid, cmdline, start_time...)."""
        out = {}
        for c in self.comments:
            if c.startswith("cmdline="):
                out["cmdline"] = c[len("cmdline="):]
                continue
            for word in c.split():
                k, sep, v = word.partition("=")
                if sep:
                    out.setdefault(k, v)
        return out

    def _comment(self, line):
        if line.startswith("#map "):
            parts = line[5:].split(None, 5)
            # start-end perms offset dev inode [path]
            if len(parts) >= 6 and "-" in parts[0]:
                try:
                    a, b = parts[0].split("-", 1)
                    self.maps.append((int(a, 16), int(b, 16), int(parts[2], 16), parts[5].strip()))
                except ValueError:
                    pass
            return
        text = line[1:].lstrip(" ")
        if text.startswith("end "):
            self.ended = True
        self.comments.append(text)

    def records(self):
        """Yields every record; raises TraceError on a corrupt line."""
        if self._consumed:
            raise RuntimeError("records() can be iterated once")
        self._consumed = True
        idx = self._index
        ncols = len(self.columns)
        get = [idx[c] for c in COLUMNS]
        lineno = self._lineno
        try:
            for raw in self._f:
                lineno += 1
                if not raw.endswith(b"\n"):
                    # The last line of a trace whose writer was killed mid-write.
                    self.truncated = True
                    break
                line = raw[:-1].decode("utf-8", "replace")
                if line.endswith("\r"):
                    line = line[:-1]
                if not line:
                    continue
                if line[0] == "#":
                    self._comment(line)
                    continue
                if "\0" in line:
                    raise TraceError("%s:%d: corrupt record (NUL bytes)" % (self.path, lineno))
                fields = line.split(",")
                if len(fields) != ncols:
                    raise TraceError("%s:%d: corrupt record: %d fields, expected %d" %
                                     (self.path, lineno, len(fields), ncols))
                try:
                    rec = self._record([fields[i] for i in get], lineno)
                except ValueError as e:
                    raise TraceError("%s:%d: corrupt record: %s" % (self.path, lineno, e)) from None
                if rec.event in HOST_EVENTS and not self.host:
                    continue
                yield rec
        finally:
            self._f.close()

    @staticmethod
    def _record(v, lineno):
        ev = v[4]
        if ev not in EVENTS and ev not in HOST_EVENTS:
            raise ValueError("unknown event %r" % ev)
        res = v[9]
        if res not in RESULTS:
            raise ValueError("unknown result %r" % res)
        if v[10] not in ("0", "1"):
            raise ValueError("hit is not 0 or 1: %r" % v[10])
        return Record(
            ts_ns=_int(v[0], "ts_ns"), pid=_int(v[1], "pid"), tid=_int(v[2], "tid"),
            device=_device(v[3]), event=ev,
            stream=None if v[5] == "-" else _hex(v[5], "stream"),
            ptr=_hex(v[6], "ptr"), requested=_int(v[7], "requested"),
            rounded=_int(v[8], "rounded"), result=res, hit=v[10] == "1",
            allocated=_int(v[11], "allocated"), reserved=_int(v[12], "reserved"),
            extra=_parse_extra(v[13]), lineno=lineno)


def open_trace(path):
    """Opens a trace and checks its two header lines. Raises TraceError."""
    try:
        if os.path.isdir(path):
            raise TraceError("%s: is a directory, not a cudalloc trace" % path)
        f = open(path, "rb")
    except OSError as e:
        raise TraceError("cannot open %s: %s" % (path, e.strerror or e)) from None
    try:
        first = f.readline()
        if not first:
            raise TraceError("%s: empty file, not a cudalloc trace" % path)
        text = first.decode("utf-8", "replace").rstrip("\r\n")
        if not text.startswith(FORMAT_MAGIC):
            raise TraceError("%s: not a cudalloc trace (the first line is not '#cudalloc-trace v1')"
                             % path)
        try:
            version = int(text[len(FORMAT_MAGIC):])
        except ValueError:
            raise TraceError("%s: not a cudalloc trace (bad version in %r)" % (path, text)) from None
        if version not in SUPPORTED_VERSIONS:
            raise TraceError("%s: trace format version %d is not supported (this reader knows %s)"
                             % (path, version, ", ".join(map(str, SUPPORTED_VERSIONS))))
        second = f.readline()
        if not second.endswith(b"\n"):
            raise TraceError("%s: truncated before the column line" % path)
        columns = tuple(second.decode("utf-8", "replace").rstrip("\r\n").split(","))
        missing = [c for c in COLUMNS if c not in columns]
        if missing:
            raise TraceError("%s:2: bad column line (missing %s)" % (path, ", ".join(missing)))
    except BaseException:
        f.close()
        raise
    return Trace(path, f, version, columns, 2)


def fmt_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n


def phase_of(nvtx, depth=1):
    """The phase a record belongs to: the first `depth` components of its NVTX range stack."""
    if not nvtx:
        return None
    if depth <= 0:
        return nvtx
    return "/".join(nvtx.split("/")[:depth])
