"""Now cudalloc.trace.plot (python/): kept for code that imports ct_plot. collect() returns
what it used to: ({device: (seconds, allocated, reserved)}, [[start_s, end_s, phase]], ooms)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__)))), "python"))

from cudalloc.trace import plot as _plot  # noqa: E402
from cudalloc.trace.plot import MissingMatplotlib, run  # noqa: E402,F401


def collect(trace, nvtx_depth=1):
    series, phases, ooms = _plot.collect(trace, nvtx_depth)
    out = {d: ([t / 1e9 for t in s.ts], list(s.allocated), list(s.reserved))
           for d, s in series.items()}
    spans = sorted([start / 1e9, end / 1e9, phase]
                   for tid_spans in phases.spans.values() for start, end, phase in tid_spans)
    return out, spans, [t / 1e9 for t in ooms]
