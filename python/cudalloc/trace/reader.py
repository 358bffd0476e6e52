"""Reads cudalloc allocation traces (docs/trace-format.md, version 1), streaming.

    from cudalloc.trace.reader import open_trace, TraceError
    t = open_trace("run.trace")        # or run.trace.gz; reads and checks the header
    for r in t.records():              # Record tuples, in file order
        ...
    for b in t.batches():              # or column batches: b.ts_ns, b.event, ... (lists)
        ...
    t.comments, t.maps, t.truncated    # filled in as the records are read

Every problem with the input is a TraceError with a one-line message (file and line number
included); a truncated last line (a process killed mid-write) is skipped, not an error.

The file is read in blocks of lines that are split and converted a column at a time: a
column's distinct values are converted once each, which is what makes a million records cheap
(sizes, events, streams, pids and extra fields repeat). A block that does not look like plain
records (comment lines, CR, NUL, a wrong field count, a value the fast conversion refuses)
goes through the line-by-line path, which gives the exact message for the first bad line.
"""

import collections
import gzip
import io
import os
import stat
import zlib

FORMAT_MAGIC = "#cudalloc-trace v"
SUPPORTED_VERSIONS = (1,)
COLUMNS = ("ts_ns", "pid", "tid", "device", "event", "stream", "ptr", "requested", "rounded",
           "result", "hit", "allocated", "reserved", "extra")
EVENTS = ("alloc", "free", "segment_alloc", "segment_free", "cache_release", "oom",
          "passthrough_alloc", "passthrough_free", "dropped")
# Pinned host memory (device -1): batches() and records() leave them out unless Trace.host is
# set, so that readers of device memory need not know them.
HOST_EVENTS = ("host_alloc", "host_free", "host_segment_alloc", "host_segment_free")
RESULTS = ("ok", "invalid_value", "out_of_memory", "device_error", "deinitialized")
NO_STREAM = None  # the `-` stream: cudaMalloc/cudaFree, no stream
GZIP_MAGIC = b"\x1f\x8b"

# Bytes read at a time: large enough that per-block costs vanish, small enough that a block's
# split fields stay in cache and the memory they take is small.
BLOCK_BYTES = 1 << 20


class TraceError(Exception):
    """Bad input: the message is one line meant for the user."""


class Record(collections.namedtuple("Record", COLUMNS + ("lineno",))):
    """One trace record. `extra` is a dict shared between records with the same field: read it,
    never change it."""
    __slots__ = ()

    @property
    def nvtx(self):
        return self.extra.get("nvtx")

    @property
    def is_async(self):
        return self.extra.get("async") == "1"

    @property
    def stack(self):
        """Return addresses, innermost first ([] when none were recorded)."""
        return stack_pcs(self.extra.get("stack"))

    @property
    def count(self):
        """For `dropped` records: how many records the writer lost (0 if the field is corrupt)."""
        text = self.extra.get("count", "0")
        return int(text) if text.isdigit() else 0


def stack_pcs(text):
    """The PCs of a `stack=` value (checked when the record was read)."""
    if not text:
        return []
    return [int(pc, 16) for pc in text.split("/") if pc]


EMPTY_EXTRA = {}


def parse_extra(text):
    """The `extra` field as a dict. Raises ValueError on a malformed field."""
    out = {}
    if not text:
        return out
    for item in text.split(";"):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError("bad extra field %r" % item[:60])
        if key == "stack":
            _check_stack(value)
        out[key] = value
    return out


def _check_stack(value):
    for pc in value.split("/"):
        if not pc:
            continue
        if not pc.startswith("0x"):
            raise ValueError("stack holds a frame that is not a hex address: %r" % pc[:40])
        try:
            v = int(pc, 16)
        except ValueError:
            raise ValueError("stack holds a frame that is not a hex address: %r" % pc[:40]) from None
        if not 0 <= v < U64_LIMIT:
            raise ValueError("stack holds a frame that does not fit 64 bits: %r" % pc[:40])


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
        raise ValueError("%s is not a hex address: %r" % (name, text[:40]))
    try:
        value = int(text, 16)
    except ValueError:
        raise ValueError("%s is not a hex address: %r" % (name, text[:40])) from None
    if value >= U64_LIMIT:
        raise ValueError("%s does not fit 64 bits: %r" % (name, text[:40]))
    return value


def _stream(text):
    return None if text == "-" else _hex(text, "stream")


def _event(text):
    if text not in EVENTS and text not in HOST_EVENTS:
        raise ValueError("unknown event %r" % text[:40])
    return text


def _result(text):
    if text not in RESULTS:
        raise ValueError("unknown result %r" % text[:40])
    return text


def _hit(text):
    if text not in ("0", "1"):
        raise ValueError("hit is not 0 or 1: %r" % text[:40])
    return text == "1"


# Per column, in the order a line's fields are checked (so the first bad field of a line is the
# one reported, as it always was): the converter of one decoded field.
_CHECK_ORDER = ("event", "result", "hit", "ts_ns", "pid", "tid", "device", "stream", "ptr",
                "requested", "rounded", "allocated", "reserved", "extra")
_CONVERT = {
    "ts_ns": lambda t: _int(t, "ts_ns"), "pid": lambda t: _int(t, "pid"),
    "tid": lambda t: _int(t, "tid"), "device": _device, "event": _event, "stream": _stream,
    "ptr": lambda t: _hex(t, "ptr"), "requested": lambda t: _int(t, "requested"),
    "rounded": lambda t: _int(t, "rounded"), "result": _result, "hit": _hit,
    "allocated": lambda t: _int(t, "allocated"), "reserved": lambda t: _int(t, "reserved"),
    "extra": parse_extra,
}
# Columns whose values are mostly distinct: converted straight, not through a table.
_DECIMAL_WIDE = ("ts_ns", "allocated", "reserved")


class Batch:
    """Consecutive records as columns (lists of converted values, one entry per record).
    `lineno(i)` is the line number of record i."""
    __slots__ = COLUMNS + ("n", "_first", "_linenos")

    def lineno(self, i):
        return self._linenos[i] if self._linenos is not None else self._first + i

    def rows(self):
        """Record tuples."""
        cols = [getattr(self, c) for c in COLUMNS]
        if self._linenos is not None:
            lines = self._linenos
        else:
            lines = range(self._first, self._first + self.n)
        return map(Record._make, zip(*cols, lines))


def _without_host(b):
    keep = [i for i, ev in enumerate(b.event) if ev not in HOST_EVENTS]
    if len(keep) == b.n:
        return b
    out = Batch()
    for c in COLUMNS:
        col = getattr(b, c)
        setattr(out, c, [col[i] for i in keep])
    out.n = len(keep)
    out._first = 0
    out._linenos = [b.lineno(i) for i in keep]
    return out


class _Bad(Exception):
    """A field the fast conversion refused, at row `index` of the block."""

    def __init__(self, index):
        super().__init__(index)
        self.index = index


def _convert_column(name, col, cache):
    """Converts one column of decoded fields. Raises _Bad(first bad row)."""
    fn = _CONVERT[name]
    n = len(col)
    if name in _DECIMAL_WIDE:
        try:
            out = list(map(int, col))
            if out and (min(out) <= -U64_LIMIT or max(out) >= U64_LIMIT):
                raise ValueError
            return out
        except ValueError:
            pass  # find the bad row below
    else:
        table = cache.get(name)
        if table is None or len(table) > 1 << 16:
            table = cache[name] = {}
        try:
            for v in set(col) - table.keys():
                table[v] = fn(v)
            return list(map(table.__getitem__, col))
        except ValueError:
            pass
    for i in range(n):
        try:
            fn(col[i])
        except ValueError:
            raise _Bad(i) from None
    raise AssertionError("no bad field in a column that failed to convert")


class Trace:
    def __init__(self, path, f, version, columns, first_lineno, size=None):
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
        self.host = False  # batches() and records() yield host records too
        self.size = size     # bytes of the file (compressed, for .gz), when known
        self._progress = None
        self._done = None
        self._tables = {}    # column -> {field text: value}, kept across blocks

    def set_progress(self, callback, done=None):
        """callback(n) is called with the number of (file) bytes read since the last call, and
        done() once the records have been read (a bar goes before the output comes)."""
        self._progress = callback
        self._done = done

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

    def _blocks(self):
        """Yields (text of whole lines, first line number); sets .truncated."""
        f = self._f
        raw = getattr(f, "fileobj", None)  # a GzipFile's compressed stream, for progress
        pos = raw.tell() if raw is not None and self._progress else 0
        lineno = self._lineno + 1
        carry = b""
        while True:
            chunk = f.read(BLOCK_BYTES)
            if self._progress is not None:
                if raw is not None:
                    now = raw.tell()
                    self._progress(now - pos)
                    pos = now
                else:
                    self._progress(len(chunk))
            if not chunk:
                break
            chunk = carry + chunk
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:
                carry = chunk
                continue
            carry = chunk[cut:]
            text = chunk[:cut].decode("utf-8", "replace")
            yield text, lineno
            lineno += text.count("\n")
        if carry:
            # The last line of a trace whose writer was killed mid-write.
            self.truncated = True

    def batches(self):
        """Yields Batch objects covering every record; raises TraceError on a corrupt line."""
        if self._consumed:
            raise RuntimeError("a trace's records can be read once")
        self._consumed = True
        try:
            for text, lineno in self._blocks():
                for b in self._parse_block(text, lineno):
                    if not self.host and "host_" in text:
                        b = _without_host(b)
                    if b.n:
                        yield b
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError("%s: cannot read: %s" % (self.path, getattr(e, "strerror", None) or e)) \
                from None
        finally:
            self._f.close()
            if self._done is not None:
                self._done()

    def records(self):
        """Yields every record (Record tuples); raises TraceError on a corrupt line."""
        for b in self.batches():
            yield from b.rows()

    def _parse_block(self, text, lineno):
        # Comment lines (the header's, #map lines written at each flush, the end line) are
        # handled in place; the runs of records between them take the fast path.
        if text[0] != "#" and "\n#" not in text:
            yield from self._fast_run(text, lineno)
            return
        pos, n = 0, len(text)
        while pos < n:
            if text[pos] == "#":
                end = text.index("\n", pos)
                line = text[pos:end]
                self._comment(line[:-1] if line.endswith("\r") else line)
                pos = end + 1
                lineno += 1
                continue
            nxt = text.find("\n#", pos)
            end = n if nxt < 0 else nxt + 1
            run = text[pos:end]
            yield from self._fast_run(run, lineno)
            lineno += run.count("\n")
            pos = end

    def _fast_run(self, text, lineno):
        """Whole lines with no comment line among them."""
        ncols = len(self.columns)
        if "\r" in text or "\0" in text or "\n\n" in text or text[0] == "\n":
            yield from self._slow_block(text, lineno)
            return
        nlines = text.count("\n")
        # Each newline starts the first field of the next line ("\n123", which int() reads as
        # 123): the fields line up with the columns only if every such field falls in the
        # first column, which a line too long next to one too short would not.
        flat = text.replace("\n", ",\n").split(",")
        flat.pop()  # the newline that ends the block
        if len(flat) != nlines * ncols:
            yield from self._slow_block(text, lineno)
            return
        first = flat[0::ncols]
        if "".join(first).count("\n") != nlines - 1:
            yield from self._slow_block(text, lineno)
            return
        cols = {c: flat[self._index[c]::ncols] for c in COLUMNS}
        if self.columns[0] not in _DECIMAL_WIDE and self.columns[0] in cols:
            cols[self.columns[0]] = [v.lstrip("\n") for v in first]
        b = self._make_batch(cols, nlines, None, lineno)
        if b is None:
            yield from self._slow_block(text, lineno)
            return
        yield b

    def _make_batch(self, cols, n, linenos, first):
        b = Batch()
        b.n = n
        b._first = first
        b._linenos = linenos
        try:
            for c in _CHECK_ORDER:
                setattr(b, c, _convert_column(c, cols[c], self._tables))
        except _Bad:
            return None
        return b

    def _slow_block(self, text, lineno):
        """Line by line: comments in place, exact messages. Yields batches of records."""
        ncols = len(self.columns)
        get = [self._index[c] for c in COLUMNS]
        rows = []
        linenos = []
        lines = text.split("\n")
        lines.pop()
        for line in lines:
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                lineno += 1
                continue
            if line[0] == "#":
                if rows:
                    yield self._rows_batch(rows, linenos)
                    rows, linenos = [], []
                self._comment(line)
                lineno += 1
                continue
            if "\0" in line:
                raise TraceError("%s:%d: corrupt record (NUL bytes)" % (self.path, lineno))
            fields = line.split(",")
            if len(fields) != ncols:
                raise TraceError("%s:%d: corrupt record: %d fields, expected %d" %
                                 (self.path, lineno, len(fields), ncols))
            v = [fields[i] for i in get]
            for c in _CHECK_ORDER:
                try:
                    _CONVERT[c](v[COLUMNS.index(c)])
                except ValueError as e:
                    raise TraceError("%s:%d: corrupt record: %s" % (self.path, lineno, e)) from None
            rows.append(v)
            linenos.append(lineno)
            lineno += 1
        if rows:
            yield self._rows_batch(rows, linenos)

    def _rows_batch(self, rows, linenos):
        cols = dict(zip(COLUMNS, map(list, zip(*rows))))
        b = self._make_batch(cols, len(rows), linenos, linenos[0])
        assert b is not None, "checked rows failed to convert"
        return b


def _gunzipped(f):
    """`f` (binary, with peek() or made to have it), gunzipped when it starts with the gzip
    magic."""
    if not hasattr(f, "peek"):
        f = io.BufferedReader(f)
    try:
        head = f.peek(2)[:2]
    except OSError:
        f.close()
        raise
    if head == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


def open_input(path):
    """A binary stream of `path` ('-': stdin), gunzipped when it starts with the gzip magic.
    Raises OSError."""
    if path == "-":
        import sys
        return _gunzipped(sys.stdin.buffer)
    return _gunzipped(open(path, "rb"))


def read_all(f, name):
    """All the (gunzipped) bytes of a stream from open_input(); a corrupt or cut gzip stream is
    a TraceError."""
    try:
        return f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError("%s: not a readable gzip file (%s)" % (name, e)) from None
    finally:
        f.close()


def open_trace(path, fileobj=None):
    """Opens a trace (plain or gzipped) and checks its two header lines. Raises TraceError.
    fileobj: read from it (a binary stream, gunzipped already or not) instead of opening
    `path`, which then only names the input in messages."""
    size = None
    if fileobj is not None:
        try:
            st = os.fstat(fileobj.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else None
        except (OSError, AttributeError, ValueError, io.UnsupportedOperation):
            pass
        f = _gunzipped(fileobj)
    else:
        try:
            if os.path.isdir(path):
                raise TraceError("%s: is a directory, not a cudalloc trace" % path)
            f = open_input(path)
            try:
                size = os.fstat((getattr(f, "fileobj", None) or f).fileno()).st_size
            except (OSError, AttributeError, io.UnsupportedOperation):
                pass
        except OSError as e:
            raise TraceError("cannot open %s: %s" % (path, e.strerror or e)) from None
    try:
        try:
            first = f.readline()
            second = f.readline() if first.endswith(b"\n") else b""
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError("%s: cannot read: %s" % (path, getattr(e, "strerror", None) or e)) \
                from None
        if not first:
            raise TraceError("%s: empty file, not a cudalloc trace" % path)
        text = first.decode("utf-8", "replace").rstrip("\r\n")
        if not text.startswith(FORMAT_MAGIC):
            raise TraceError("%s: not a cudalloc trace (the first line is not '#cudalloc-trace v1')"
                             % path)
        try:
            version = int(text[len(FORMAT_MAGIC):])
        except ValueError:
            raise TraceError("%s: not a cudalloc trace (bad version in %r)"
                             % (path, text[:60])) from None
        if version not in SUPPORTED_VERSIONS:
            raise TraceError("%s: trace format version %d is not supported (this reader knows %s)"
                             % (path, version, ", ".join(map(str, SUPPORTED_VERSIONS))))
        if not second.endswith(b"\n"):
            raise TraceError("%s: truncated before the column line" % path)
        columns = tuple(second.decode("utf-8", "replace").rstrip("\r\n").split(","))
        missing = [c for c in COLUMNS if c not in columns]
        if missing:
            raise TraceError("%s:2: bad column line (missing %s)" % (path, ", ".join(missing)))
    except BaseException:
        f.close()
        raise
    return Trace(path, f, version, columns, 2, size)


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
