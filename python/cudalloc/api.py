"""cudalloc's figures and controls from Python, through its C API (include/cudalloc/cudalloc.h).

The library is found among the symbols already in the process (ctypes.CDLL(None)): it is
there when the program runs under the `cudalloc` launcher or with LD_PRELOAD naming
libcudalloc.so. Nothing here loads it: a library loaded only for these calls would not serve
the program's memory, and its figures would be zeros that look real.
"""

import contextlib
import ctypes

__all__ = [
    "CudallocError", "is_active", "api_version", "library_version",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_stats", "memory_summary", "empty_cache", "reset_peak_memory_stats",
    "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "set_memory_limit", "get_memory_limit", "flush_trace", "trace_path", "phase",
]

# include/cudalloc/cudalloc.h
_OK = 0
_NOT_LOADED = 1
_INVALID_DEVICE = 3
_INVALID_VALUE = 4
_UNKNOWN_KEY = 5
_CURRENT_DEVICE = -1
_ALL_DEVICES = -2
_API_VERSION = 1  # the version this module was written against

NOT_LOADED_MESSAGE = ("cudalloc is not loaded in this process: run the program under the cudalloc "
                      "launcher (cudalloc -- python ...) or with LD_PRELOAD=/path/to/libcudalloc.so")


class CudallocError(RuntimeError):
    """A call the library refused; `status` is its cudalloc_status."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


_lib = None


def _signatures(lib):
    c_int, c_size, c_i64, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_int64, ctypes.c_char_p
    sig = {
        "cudalloc_api_version": ([], c_int),
        "cudalloc_version": ([], c_char_p),
        "cudalloc_status_string": ([c_int], c_char_p),
        "cudalloc_stat": ([c_int, c_char_p, ctypes.POINTER(c_i64)], c_int),
        "cudalloc_stat_count": ([], c_size),
        "cudalloc_stat_name": ([c_size], c_char_p),
        "cudalloc_stats": ([c_int, ctypes.POINTER(c_i64), c_size], c_int),
        "cudalloc_memory_summary": ([c_int, ctypes.c_char_p, c_size, ctypes.POINTER(c_size)], c_int),
        "cudalloc_reset_peak_memory_stats": ([c_int], c_int),
        "cudalloc_empty_cache": ([c_int, ctypes.POINTER(c_size)], c_int),
        "cudalloc_set_memory_fraction": ([c_int, ctypes.c_double], c_int),
        "cudalloc_get_memory_fraction": ([c_int, ctypes.POINTER(ctypes.c_double)], c_int),
        "cudalloc_set_memory_limit": ([c_int, c_size], c_int),
        "cudalloc_get_memory_limit": ([c_int, ctypes.POINTER(c_size)], c_int),
        "cudalloc_trace_flush": ([], c_int),
        "cudalloc_trace_path": ([ctypes.c_char_p, c_size, ctypes.POINTER(c_size)], c_int),
        "cudalloc_phase_push": ([c_char_p], c_int),
        "cudalloc_phase_pop": ([], c_int),
    }
    for name, (args, res) in sig.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res


def _library():
    """The process's cudalloc, or None. Looked up again until found (it may be dlopen'ed later)."""
    global _lib
    if _lib is None:
        try:
            proc = ctypes.CDLL(None)
            proc.cudalloc_api_version  # noqa: B018 -- AttributeError when absent
            _signatures(proc)
        except (OSError, AttributeError):
            return None
        _lib = proc
    return _lib


def _need():
    lib = _library()
    if lib is None:
        raise RuntimeError(NOT_LOADED_MESSAGE)
    return lib


def _check(lib, status):
    if status == _OK:
        return
    text = lib.cudalloc_status_string(status).decode("utf-8", "replace")
    if status in (_INVALID_DEVICE, _INVALID_VALUE):
        raise ValueError("cudalloc: " + text)
    if status == _UNKNOWN_KEY:
        raise KeyError(text)
    raise CudallocError(status, "cudalloc: " + text)


def _device(device, allow_all=False):
    """None, an int, "cuda:N" or a torch.device-like object (its .index) as an ordinal."""
    if device is None:
        return _CURRENT_DEVICE
    if allow_all and device == "all":
        return _ALL_DEVICES
    if isinstance(device, str):
        if device == "cuda":
            return _CURRENT_DEVICE
        try:
            index = int(device[5:] if device.startswith("cuda:") else device)
        except ValueError:
            raise ValueError("cudalloc: not a CUDA device: %r" % (device,)) from None
    else:
        index = getattr(device, "index", device)
        if index is None:  # torch.device("cuda"): the current device
            return _CURRENT_DEVICE
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError("cudalloc: not a CUDA device: %r" % (device,))
    return index


def is_active():
    """True when libcudalloc.so is loaded in this process (not whether CUDA has been used)."""
    return _library() is not None


def api_version():
    """The library's C API version (cudalloc_api_version)."""
    return _need().cudalloc_api_version()


def library_version():
    """The loaded library's release, "MAJOR.MINOR.PATCH"."""
    return _need().cudalloc_version().decode()


def memory_stats(device=None):
    """All statistics of a device, under torch.cuda.memory_stats()'s key names, sorted."""
    lib = _need()
    n = lib.cudalloc_stat_count()
    values = (ctypes.c_int64 * n)()
    _check(lib, lib.cudalloc_stats(_device(device), values, n))
    return dict(sorted((lib.cudalloc_stat_name(i).decode(), values[i]) for i in range(n)))


def _stat(key, device):
    lib = _need()
    value = ctypes.c_int64()
    _check(lib, lib.cudalloc_stat(_device(device), key.encode(), ctypes.byref(value)))
    return value.value


def memory_allocated(device=None):
    """Bytes in blocks handed to the program (after size-class rounding)."""
    return _stat("allocated_bytes.all.current", device)


def max_memory_allocated(device=None):
    return _stat("allocated_bytes.all.peak", device)


def memory_reserved(device=None):
    """Bytes held from the device: in use, cached, or waiting for a fence."""
    return _stat("reserved_bytes.all.current", device)


def max_memory_reserved(device=None):
    return _stat("reserved_bytes.all.peak", device)


def _text(lib, call):
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        length = ctypes.c_size_t()
        _check(lib, call(buf, size, ctypes.byref(length)))
        if length.value < size:
            return buf.value.decode("utf-8", "replace")
        size = length.value + 1  # the text grew between the calls: once more


def memory_summary(device=None, abbreviated=False):
    """The memory_summary-style table CUDALLOC_STATS prints at exit. `abbreviated` is accepted
    for torch.cuda.memory_summary's signature; the table is always the same."""
    lib = _need()
    dev = _device(device)
    return _text(lib, lambda buf, size, length: lib.cudalloc_memory_summary(dev, buf, size, length))


def empty_cache(device="all"):
    """Gives idle cached memory back to the driver after pending frees, on every device by
    default (as torch.cuda.empty_cache). Returns the bytes given back."""
    lib = _need()
    released = ctypes.c_size_t()
    _check(lib, lib.cudalloc_empty_cache(_device(device, allow_all=True), ctypes.byref(released)))
    return released.value


def reset_peak_memory_stats(device=None):
    lib = _need()
    _check(lib, lib.cudalloc_reset_peak_memory_stats(_device(device, allow_all=True)))


def set_per_process_memory_fraction(fraction, device=None):
    """Limits what the process may reserve on the device to `fraction` (0 < f <= 1) of it, as
    CUDALLOC_CONF's per_process_memory_fraction; beyond it allocations fail (out of memory)."""
    lib = _need()
    _check(lib, lib.cudalloc_set_memory_fraction(_device(device), float(fraction)))


def get_per_process_memory_fraction(device=None):
    lib = _need()
    out = ctypes.c_double()
    _check(lib, lib.cudalloc_get_memory_fraction(_device(device), ctypes.byref(out)))
    return out.value


def set_memory_limit(limit_bytes, device=None):
    """Caps what the process may reserve on the device, in bytes (memory_limit_mb); 0: no cap."""
    lib = _need()
    _check(lib, lib.cudalloc_set_memory_limit(_device(device), int(limit_bytes)))


def get_memory_limit(device=None):
    """The limit in force on the device, in bytes."""
    lib = _need()
    out = ctypes.c_size_t()
    _check(lib, lib.cudalloc_get_memory_limit(_device(device), ctypes.byref(out)))
    return out.value


def flush_trace():
    """Writes the trace records queued so far (CUDALLOC_TRACE) to the file; returns its path."""
    lib = _need()
    _check(lib, lib.cudalloc_trace_flush())
    return trace_path()


def trace_path():
    """The trace file of this process, None when it is not traced."""
    lib = _need()
    length = ctypes.c_size_t()
    status = lib.cudalloc_trace_path(None, 0, ctypes.byref(length))
    if status == 6:  # CUDALLOC_ERROR_NOT_TRACING
        return None
    _check(lib, status)
    return _text(lib, lib.cudalloc_trace_path)


@contextlib.contextmanager
def phase(name):
    """Marks a phase of the program ("forward"); nested phases join with "/". Traced
    allocations made inside carry it (the trace's nvtx= field). Without cudalloc in the process
    this does nothing, so that marked programs also run without it. Also a decorator."""
    lib = _library()
    if lib is None:
        yield
        return
    _check(lib, lib.cudalloc_phase_push(str(name).encode("utf-8", "replace")))
    try:
        yield
    finally:
        lib.cudalloc_phase_pop()
