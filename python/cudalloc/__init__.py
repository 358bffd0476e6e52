"""cudalloc from Python: the figures and controls of the caching allocator preloaded into this
process, under the names torch.cuda uses (memory_allocated, memory_summary, empty_cache, ...).

    import cudalloc
    if cudalloc.is_active():
        print(cudalloc.memory_summary())

Without libcudalloc.so in the process, is_active() is False and the figure functions raise
RuntimeError. cudalloc.torch.install() makes torch.cuda's memory functions report cudalloc's
figures (for PyTorch running with its own cache off over cudalloc).
"""

from cudalloc.api import (  # noqa: F401
    CudallocError,
    api_version,
    empty_cache,
    flush_trace,
    get_memory_limit,
    get_per_process_memory_fraction,
    is_active,
    library_version,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    phase,
    reset_peak_memory_stats,
    set_memory_limit,
    set_per_process_memory_fraction,
    trace_path,
)

__version__ = "0.1.0"  # meson.build's project version (tests/api checks they agree)
