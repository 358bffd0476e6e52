"""Symbolizes the raw return addresses of `stack=` with the `#map` lines of the trace.

addr2line (binutils) does the work when it is installed and symbols are asked for; without it,
or for an address no mapping covers, a frame is its raw hex PC (module-relative where a mapping
covers it).

Nothing the trace names is opened unless symbols are asked for, and then only regular files:
a trace is input like any other, and a `#map` line may name a FIFO or a device, whose open()
would block or act.
"""

import bisect
import os
import shutil
import stat
import subprocess


def _open_regular(path):
    """A file descriptor of `path` if it is a regular file, else None (never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _elf_type(path):
    """2 (ET_EXEC: absolute addresses) or 3 (ET_DYN: load-relative); None when unreadable."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        h = os.pread(fd, 18, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(h) < 18 or h[:4] != b"\x7fELF":
        return None
    little = h[5] == 1
    return int.from_bytes(h[16:18], "little" if little else "big")


class Symbolizer:
    def __init__(self, maps, use_addr2line=True):
        # One entry per distinct mapping; the load base of a file is its lowest mapping start.
        seen = set()
        self._ranges = []
        base = {}
        for start, end, offset, path in maps:
            if (start, end, path) in seen:
                continue
            seen.add((start, end, path))
            self._ranges.append((start, end, offset, path))
            if offset == 0 and (path not in base or start < base[path]):
                base[path] = start
        self._ranges.sort()
        self._starts = [r[0] for r in self._ranges]
        self._base = base
        self._open_files = use_addr2line
        self._addr2line = shutil.which("addr2line") if use_addr2line else None
        self._cache = {}
        self._elf = {}

    @property
    def available(self):
        return self._addr2line is not None

    def _absolute(self, path):
        """Whether the object's addresses are absolute (ET_EXEC); read only with symbols on."""
        if not self._open_files:
            return False
        t = self._elf.get(path)
        if t is None:
            t = self._elf[path] = _elf_type(path)
        return t == 2

    def _locate(self, pc):
        i = bisect.bisect_right(self._starts, pc) - 1
        if i < 0:
            return None
        start, end, offset, path = self._ranges[i]
        if pc >= end or not path.startswith("/"):
            return None
        if self._absolute(path):
            return path, pc
        b = self._base.get(path, start - offset)
        return path, pc - b

    def resolve(self, pcs):
        """Fills the cache for `pcs` (an iterable of ints), one addr2line run per object file."""
        todo = {}
        for pc in set(pcs):
            if pc in self._cache:
                continue
            loc = self._locate(pc - 1 if pc > 0 else pc)  # a return address: look at the call
            if loc is None or self._addr2line is None or not self._regular(loc[0]):
                self._cache[pc] = self._raw(pc, loc)
                continue
            todo.setdefault(loc[0], []).append((pc, loc[1]))
        for path, items in todo.items():
            addrs = ["0x%x" % rel for _, rel in items]
            try:
                out = subprocess.run([self._addr2line, "-f", "-C", "-e", path] + addrs,
                                     stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                     errors="replace", timeout=120).stdout.splitlines()
            except (OSError, subprocess.SubprocessError):
                out = []
            for i, (pc, rel) in enumerate(items):
                if 2 * i + 1 < len(out):
                    func, fileline = out[2 * i], out[2 * i + 1]
                    fname, _, line = fileline.rpartition(":")
                    line = line.split()[0] if line else "0"
                    if func == "??" and fname in ("??", ""):
                        self._cache[pc] = self._raw(pc, (path, rel))
                        continue
                    self._cache[pc] = {
                        "name": func if func != "??" else "0x%x" % pc,
                        "filename": fname if fname not in ("??", "") else path,
                        "line": int(line) if line.isdigit() else 0,
                    }
                else:
                    self._cache[pc] = self._raw(pc, (path, rel))

    def _regular(self, path):
        """addr2line is given regular files only (it would open a FIFO and wait)."""
        key = ("reg", path)
        ok = self._elf.get(key)
        if ok is None:
            fd = _open_regular(path)
            ok = fd is not None
            if ok:
                os.close(fd)
            self._elf[key] = ok
        return ok

    @staticmethod
    def _raw(pc, loc):
        if loc is None:
            return {"name": "0x%x" % pc, "filename": "??", "line": 0}
        return {"name": "%s+0x%x" % (os.path.basename(loc[0]), loc[1]), "filename": loc[0],
                "line": 0}

    def frame(self, pc):
        if pc not in self._cache:
            self.resolve([pc])
        return self._cache[pc]

    def frames(self, pcs):
        return [self.frame(pc) for pc in pcs]


def format_frame(f):
    if f["line"]:
        return "%s (%s:%d)" % (f["name"], f["filename"], f["line"])
    if f["filename"] != "??":
        return "%s (%s)" % (f["name"], f["filename"])
    return f["name"]
