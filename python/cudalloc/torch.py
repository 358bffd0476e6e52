"""Opt-in: torch.cuda's memory functions report cudalloc's figures.

With PyTorch's own cache off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and cudalloc underneath,
torch.cuda.memory_allocated() and its kin say 0: PyTorch counts nothing. After

    import cudalloc.torch
    cudalloc.torch.install()

they return cudalloc's figures, so existing scripts print real numbers. install() does nothing
(and returns False) when cudalloc is not loaded in the process. uninstall() puts the originals
back.
"""

import importlib
import os
import sys
import warnings

from cudalloc import api

# The functions replaced, in torch.cuda and in torch.cuda.memory (where scripts also call them).
NAMES = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
         "memory_stats", "memory_summary", "empty_cache", "reset_peak_memory_stats")

_saved = {}  # (module, name) -> the original function


def _replacements():
    def empty_cache():
        api.empty_cache()  # torch.cuda.empty_cache returns None

    def memory_summary(device=None, abbreviated=False):
        return api.memory_summary(device, abbreviated)

    def memory_stats(device=None):
        return api.memory_stats(device)

    def reset_peak_memory_stats(device=None):
        api.reset_peak_memory_stats(device)

    return {
        "memory_allocated": lambda device=None: api.memory_allocated(device),
        "max_memory_allocated": lambda device=None: api.max_memory_allocated(device),
        "memory_reserved": lambda device=None: api.memory_reserved(device),
        "max_memory_reserved": lambda device=None: api.max_memory_reserved(device),
        "memory_stats": memory_stats,
        "memory_summary": memory_summary,
        "empty_cache": empty_cache,
        "reset_peak_memory_stats": reset_peak_memory_stats,
    }


def _torch(torch_module):
    if torch_module is not None:
        return torch_module
    return sys.modules.get("torch") or importlib.import_module("torch")


def install(torch_module=None):
    """Replaces torch.cuda's memory functions with cudalloc's; True if it did. Only when cudalloc
    is active: otherwise torch keeps its own (and its figures stay PyTorch's)."""
    if not api.is_active():
        return False
    torch = _torch(torch_module)
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        warnings.warn("cudalloc.torch.install(): PyTorch's own cache is on, so cudalloc sees its "
                      "segments, not its tensors; set PYTORCH_NO_CUDA_MEMORY_CACHING=1 for "
                      "per-tensor figures", RuntimeWarning, stacklevel=2)
    modules = [torch.cuda]
    memory = getattr(torch.cuda, "memory", None)
    if memory is not None and memory is not torch.cuda:
        modules.append(memory)
    for name, fn in _replacements().items():
        fn.__name__ = name
        fn.__qualname__ = name
        fn.__doc__ = "cudalloc's %s (cudalloc.torch.install)" % name
        for module in modules:
            if not hasattr(module, name) and module is not torch.cuda:
                continue
            _saved.setdefault((module, name), getattr(module, name, None))
            setattr(module, name, fn)
    return True


def uninstall():
    """Puts back what install() replaced."""
    for (module, name), fn in list(_saved.items()):
        if fn is None:
            delattr(module, name)
        else:
            setattr(module, name, fn)
    _saved.clear()


def installed():
    return bool(_saved)
