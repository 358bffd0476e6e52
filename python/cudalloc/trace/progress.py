"""Progress bars on stderr (tqdm) for reading long traces: shown when stderr is a terminal or
--progress is given, and simply absent when tqdm is not installed."""

import sys


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def bar(total, desc, enabled=None, unit="B"):
    """A bar with .update(n) and .close(). enabled None: only when stderr is a terminal."""
    if enabled is None:
        try:
            enabled = sys.stderr.isatty()
        except (AttributeError, ValueError):
            enabled = False
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024,
                file=sys.stderr, leave=False, dynamic_ncols=True, mininterval=0.25)


def attach(trace, desc, enabled=None):
    """A bar over the bytes of `trace` as its records are read; returns it (close it after)."""
    b = bar(trace.size, desc, enabled)
    if not isinstance(b, _NoBar):
        trace.set_progress(b.update, b.close)
    return b
