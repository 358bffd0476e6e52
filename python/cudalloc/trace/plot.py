"""`cudalloc-trace plot`: allocated and reserved bytes over time, with the NVTX phases of each
thread as bands under it.

A long trace is drawn per time bucket: the band between the smallest and the largest value the
series took in the bucket, and a line through the value at the end of each bucket, so that a
million records stay readable and peaks stay visible. numpy does the bucketing when it is
installed; a pure-Python loop does the same without it.
"""

import array
import os
import warnings

from .reader import TraceError, phase_of

BUCKETS = 2000      # per series: the figure is about 1400 pixels wide
MAX_DPI = 1000      # the figure is 12 inches wide; Agg refuses images past 2**16 pixels a side
MAX_THREADS = 8     # phase bands drawn (the threads with the most phase time)
MAX_SPANS = 4000    # phase spans per thread before they are merged per bucket


class MissingMatplotlib(Exception):
    pass


def _check_output(path):
    """Output problems are reported as export reports them, and before a long trace is read."""
    if os.path.isdir(path):
        raise TraceError("cannot write %s: Is a directory" % path)
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise TraceError("cannot write %s: %s" % (path, "Not a directory" if os.path.exists(parent)
                                                  else "No such file or directory"))


def _format_of(path):
    """The image format savefig will use: the extension's, PNG when there is none (given to
    savefig explicitly, so that `-o mem` writes `mem`, not `mem.png`)."""
    ext = os.path.splitext(os.path.basename(path))[1][1:].lower()
    if not ext:
        return "png"
    from matplotlib.backend_bases import FigureCanvasBase
    supported = FigureCanvasBase.get_supported_filetypes()
    if ext not in supported:
        raise TraceError("cannot write %s: unknown image format %r (known: %s)"
                         % (path, ext, ", ".join(sorted(supported))))
    return ext


def _literal(text):
    """Text from the trace (NVTX names, the command line, the path) shown as it is: matplotlib
    reads $...$ as TeX (a bad formula was a ValueError) and hides legend labels starting with _."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _import_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingMatplotlib() from None
    return plt


def _numpy():
    try:
        import numpy
        return numpy
    except ImportError:
        return None


class Series:
    """One device's (ts_ns, allocated, reserved), as compact arrays."""

    def __init__(self):
        self.ts = array.array("q")
        self.allocated = array.array("q")
        self.reserved = array.array("q")


class Phases:
    """NVTX phase spans per thread: tid -> [[start_ns, end_ns, phase], ...]."""

    def __init__(self):
        self.spans = {}
        self.open = {}   # tid -> [start_ns, phase]

    def note(self, tid, ts, phase):
        cur = self.open.get(tid)
        if cur is None:
            if phase is not None:
                self.open[tid] = [ts, phase]
            return
        if phase != cur[1]:
            start = cur[0]
            self.spans.setdefault(tid, []).append((start, max(ts, start), cur[1]))
            if phase is None:
                del self.open[tid]
            else:
                cur[0], cur[1] = max(ts, start), phase

    def close(self, end_ns):
        for tid, (start, phase) in self.open.items():
            self.spans.setdefault(tid, []).append((start, max(end_ns, start), phase))
        self.open = {}


def collect(trace, nvtx_depth=1):
    series = {}  # device -> Series
    ooms = []
    phases = Phases()
    cache = {}
    last_ts = 0
    for b in trace.batches():
        last_ts = max(last_ts, max(b.ts_ns))
        devices = set(b.device)
        if len(devices) == 1 and -1 not in devices:
            s = series.get(b.device[0])
            if s is None:
                s = series[b.device[0]] = Series()
            s.ts.extend(b.ts_ns)
            s.allocated.extend(b.allocated)
            s.reserved.extend(b.reserved)
        else:
            for d, ev, ts, a, r in zip(b.device, b.event, b.ts_ns, b.allocated, b.reserved):
                if ev == "dropped":
                    continue
                s = series.get(d)
                if s is None:
                    s = series[d] = Series()
                s.ts.append(ts)
                s.allocated.append(a)
                s.reserved.append(r)
        if "oom" in b.event:
            ooms.extend(ts for ev, ts in zip(b.event, b.ts_ns) if ev == "oom")
        # Phases: skipped for a batch with no NVTX field while no thread is in a phase.
        if phases.open or any("nvtx" in e for e in {id(e): e for e in b.extra}.values()):
            open_ = phases.open
            for ev, tid, ts, e in zip(b.event, b.tid, b.ts_ns, b.extra):
                nvtx = e.get("nvtx") if e else None
                if nvtx:
                    p = cache.get(nvtx)
                    if p is None:
                        p = cache[nvtx] = phase_of(nvtx, nvtx_depth)
                else:
                    p = None
                cur = open_.get(tid)
                if cur is None:
                    if p is None:
                        continue
                elif cur[1] == p:
                    continue  # the thread stays in its phase
                if ev != "dropped":
                    phases.note(tid, ts, p)
    phases.close(last_ts)
    return series, phases, ooms


def envelope(ts, values, buckets=BUCKETS):
    """(x, lo, hi, last) per time bucket of a step series, or None when it is short enough to
    draw as it is. x holds bucket starts (ns) and one more for the end; lo/hi the least and
    greatest value the series held during the bucket (the one carried in included); last its
    value at the end of the bucket."""
    n = len(ts)
    if n <= 2 * buckets:
        return None
    np = _numpy()
    if np is not None:
        return _envelope_numpy(np, ts, values, buckets)
    return _envelope_python(ts, values, buckets)


def _envelope_numpy(np, ts, values, nb):
    t = np.frombuffer(ts, dtype=np.int64)
    v = np.frombuffer(values, dtype=np.int64)
    if np.any(t[1:] < t[:-1]):  # clock=monotonic may step back a little across threads
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    t0, t1 = int(t[0]), int(t[-1])
    width = max((t1 - t0) / nb, 1e-9)
    b = np.minimum(((t - t0) / width).astype(np.int64), nb - 1)
    starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
    ends = np.r_[starts[1:], len(v)] - 1
    bk = b[starts]
    lo = np.minimum.reduceat(v, starts)
    hi = np.maximum.reduceat(v, starts)
    last_b = np.zeros(nb, dtype=np.int64)
    last_b[bk] = v[ends]
    have = np.zeros(nb, dtype=bool)
    have[bk] = True
    idx = np.where(have, np.arange(nb), 0)
    np.maximum.accumulate(idx, out=idx)
    last = last_b[idx]                      # empty buckets hold the value carried in
    carried = np.r_[v[0], last[:-1]]
    lo_all = last.copy()
    hi_all = last.copy()
    lo_all[bk] = np.minimum(lo, carried[bk])
    hi_all[bk] = np.maximum(hi, carried[bk])
    x = t0 + np.arange(nb + 1) * width
    return x, lo_all, hi_all, last


def _envelope_python(ts, values, nb):
    pairs = zip(ts, values)
    if any(a > b for a, b in zip(ts, ts[1:])):
        pairs = sorted(pairs, key=lambda p: p[0])
    else:
        pairs = list(pairs)
    t0, t1 = pairs[0][0], pairs[-1][0]
    width = max((t1 - t0) / nb, 1e-9)
    lo = [None] * nb
    hi = [None] * nb
    last = [None] * nb
    for t, v in pairs:
        i = min(int((t - t0) / width), nb - 1)
        if last[i] is None:
            lo[i] = hi[i] = v
        elif v < lo[i]:
            lo[i] = v
        elif v > hi[i]:
            hi[i] = v
        last[i] = v
    cur = pairs[0][1]
    for i in range(nb):
        if last[i] is None:
            lo[i] = hi[i] = last[i] = cur
        else:
            lo[i] = min(lo[i], cur)
            hi[i] = max(hi[i], cur)
            cur = last[i]
    x = [t0 + k * width for k in range(nb + 1)]
    return x, lo, hi, last


def _merge_spans(spans, t0, t1, nb=BUCKETS):
    """Too many spans to draw: per time bucket, the phase that covered most of it."""
    width = max((t1 - t0) / nb, 1e-9)
    cover = [dict() for _ in range(nb)]
    for start, end, phase in spans:
        i = min(int((start - t0) / width), nb - 1)
        j = min(int((end - t0) / width), nb - 1)
        for k in range(i, j + 1):
            lo = max(start, t0 + k * width)
            hi = min(end, t0 + (k + 1) * width)
            if hi > lo:
                cover[k][phase] = cover[k].get(phase, 0) + (hi - lo)
    out = []
    for k, c in enumerate(cover):
        if not c:
            continue
        phase = max(c, key=c.get)
        start = t0 + k * width
        if out and out[-1][2] == phase and abs(out[-1][1] - start) < width / 2:
            out[-1] = (out[-1][0], start + width, phase)
        else:
            out.append((start, start + width, phase))
    return out


def run(trace, args, out):
    # Bad output and bad input are reported as summary and export report them, whether or not
    # matplotlib is there; a missing matplotlib is reported once both are known to be fine.
    if not 1 <= args.dpi <= MAX_DPI:
        raise TraceError("--dpi must be between 1 and %d, not %d" % (MAX_DPI, args.dpi))
    _check_output(args.output)
    try:
        plt = _import_pyplot()
    except MissingMatplotlib:
        plt = None
    fmt = _format_of(args.output) if plt is not None else None
    series, phases, ooms = collect(trace, args.nvtx_depth)
    if not series:
        raise TraceError("%s: no allocator events to plot" % trace.path)
    if plt is None:
        raise MissingMatplotlib()
    with warnings.catch_warnings():
        # A name in characters the font lacks (CJK, control bytes) is drawn as boxes; the
        # warning for each glyph would bury the one line this command prints.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
        try:
            _draw(plt, trace, args, fmt, series, phases, ooms)
        finally:
            plt.close("all")
    out.write("wrote %s\n" % args.output)


def _draw(plt, trace, args, fmt, series, phases, ooms):
    peak = max(max(s.reserved) if s.reserved else 0 for s in series.values())
    peak = max(peak, max(max(s.allocated) if s.allocated else 0 for s in series.values()))
    unit, div = ("GiB", 1024.0 ** 3) if peak >= 1024 ** 3 else ("MiB", 1024.0 ** 2)
    threads = sorted(phases.spans, key=lambda tid: -sum(e - s for s, e, _ in phases.spans[tid]))
    threads = sorted(threads[:MAX_THREADS])
    if threads:
        fig, (ax, bands) = plt.subplots(
            2, 1, figsize=(12, 5 + 0.3 * len(threads)), sharex=True,
            gridspec_kw={"height_ratios": [5, max(0.6, 0.35 * len(threads))]})
    else:
        fig, ax = plt.subplots(figsize=(12, 5))
        bands = None
    cmap = plt.get_cmap("tab10")
    for k, (device, s) in enumerate(sorted(series.items())):
        for name, vals, color in (("reserved", s.reserved, cmap((2 * k) % 10)),
                                  ("allocated", s.allocated, cmap((2 * k + 1) % 10))):
            label = "%s, device %d" % (name, device)
            env = envelope(s.ts, vals)
            if env is None:
                ax.step([t / 1e9 for t in s.ts], [v / div for v in vals], where="post",
                        color=color, label=label)
                continue
            x, lo, hi, last = env
            xs = [t / 1e9 for t in x]
            lo = [v / div for v in lo]
            hi = [v / div for v in hi]
            ax.fill_between(xs, lo + lo[-1:], hi + hi[-1:], step="post", color=color, alpha=0.3,
                            lw=0, label="_nolegend_")
            ax.step(xs[1:], [v / div for v in last], where="pre", color=color, lw=0.8,
                    label=label + " (band: min-max per %s)" % _duration(x[1] - x[0]))
    for i, t in enumerate(ooms):
        ax.axvline(t / 1e9, color="red", lw=1, ls="--",
                   label="out of memory" if i == 0 else "_nolegend_")
    ax.legend(loc="upper left", fontsize="small")
    ax.set_ylabel("reserved / allocated (%s)" % unit)
    ax.set_ylim(bottom=0)
    title = "device memory: %s" % _literal(trace.path)
    cmd = trace.header.get("cmdline")
    if cmd:
        title += "\n" + _literal(cmd if len(cmd) < 100 else cmd[:97] + "...")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    last_ax = ax
    if bands is not None:
        _draw_bands(plt, bands, phases, threads, cmap)
        last_ax = bands
    last_ax.set_xlabel("time since cudalloc was loaded (s)")
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=args.dpi, format=fmt)
    except OSError as e:
        raise TraceError("cannot write %s: %s" % (args.output, e.strerror or e)) from None


def _draw_bands(plt, ax, phases, threads, cmap):
    from matplotlib.patches import Patch
    colors = {}
    t0 = min(s for tid in threads for s, _, _ in phases.spans[tid])
    t1 = max(e for tid in threads for _, e, _ in phases.spans[tid])
    for row, tid in enumerate(threads):
        spans = phases.spans[tid]
        if len(spans) > MAX_SPANS:
            spans = _merge_spans(spans, t0, t1)
        by_phase = {}
        for start, end, phase in spans:
            if phase not in colors:
                colors[phase] = cmap((len(colors) + 4) % 10)
            by_phase.setdefault(phase, []).append((start / 1e9, max(end - start, 1) / 1e9))
        for phase, xr in by_phase.items():
            ax.broken_barh(xr, (row - 0.4, 0.8), facecolors=colors[phase], lw=0)
    ax.set_yticks(range(len(threads)))
    ax.set_yticklabels(["thread %d" % tid for tid in threads], fontsize="small")
    ax.set_ylim(-0.6, len(threads) - 0.4)
    ax.set_ylabel("NVTX phase")
    handles = [Patch(color=c) for c in colors.values()]
    labels = [_literal(p) for p in colors]
    ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small",
              ncol=1 if len(labels) <= 8 else 2)


def _duration(ns):
    if ns >= 1e9:
        return "%.3g s" % (ns / 1e9)
    if ns >= 1e6:
        return "%.3g ms" % (ns / 1e6)
    if ns >= 1e3:
        return "%.3g us" % (ns / 1e3)
    return "%.3g ns" % ns
