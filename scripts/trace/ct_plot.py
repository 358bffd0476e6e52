"""`cudalloc-trace plot`: allocated and reserved bytes over time, NVTX phases shaded."""

import os
import warnings

from ct_reader import TraceError, phase_of

MAX_POINTS = 20000  # per series; longer traces keep the maximum of each time bucket
MAX_DPI = 1000      # the figure is 12x5 inches; Agg refuses images past 2**16 pixels a side


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


def _downsample(ts, vals):
    if len(ts) <= MAX_POINTS:
        return ts, vals
    t0, t1 = ts[0], ts[-1]
    width = (t1 - t0) / MAX_POINTS or 1
    out_t, out_v = [], []
    bucket, best_t, best_v = None, None, None
    for t, v in zip(ts, vals):
        b = int((t - t0) / width)
        if b != bucket:
            if bucket is not None:
                out_t.append(best_t)
                out_v.append(best_v)
            bucket, best_t, best_v = b, t, v
        elif v > best_v:
            best_t, best_v = t, v
    out_t.append(best_t)
    out_v.append(best_v)
    return out_t, out_v


def collect(trace, nvtx_depth=1):
    series = {}  # device -> (ts, allocated, reserved)
    ooms = []
    spans = []   # [start_s, end_s, phase]
    cur = None
    last_t = 0.0
    for r in trace.records():
        if r.event == "dropped":
            continue
        t = r.ts_ns / 1e9
        if r.event == "oom":
            ooms.append(t)
        last_t = max(last_t, t)
        s = series.get(r.device)
        if s is None:
            s = series[r.device] = ([], [], [])
        s[0].append(t)
        s[1].append(r.allocated)
        s[2].append(r.reserved)
        phase = phase_of(r.nvtx, nvtx_depth)
        if phase != (cur[2] if cur else None):
            if cur is not None:
                cur[1] = t
                spans.append(cur)
            cur = [t, t, phase] if phase is not None else None
    if cur is not None:
        cur[1] = last_t
        spans.append(cur)
    return series, spans, ooms


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
    series, spans, ooms = collect(trace, args.nvtx_depth)
    if not series:
        raise TraceError("%s: no allocator events to plot" % trace.path)
    if plt is None:
        raise MissingMatplotlib()
    with warnings.catch_warnings():
        # A name in characters the font lacks (CJK, control bytes) is drawn as boxes; the
        # warning for each glyph would bury the one line this command prints.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from")
        try:
            _draw(plt, trace, args, fmt, series, spans, ooms)
        finally:
            plt.close("all")
    out.write("wrote %s\n" % args.output)


def _draw(plt, trace, args, fmt, series, spans, ooms):
    peak = max(max(s[2]) if s[2] else 0 for s in series.values())
    unit, div = ("GiB", 1024.0 ** 3) if peak >= 1024 ** 3 else ("MiB", 1024.0 ** 2)
    fig, ax = plt.subplots(figsize=(12, 5))
    colors = {}
    cmap = plt.get_cmap("tab10")
    for start, end, phase in spans:
        if phase not in colors:
            colors[phase] = cmap((len(colors) + 3) % 10)
        ax.axvspan(start, max(end, start + 1e-9), color=colors[phase], alpha=0.15, lw=0,
                   label="_nolegend_")
    for device, (ts, alloc, resv) in sorted(series.items()):
        ta, va = _downsample(ts, alloc)
        tr, vr = _downsample(ts, resv)
        ax.step(tr, [v / div for v in vr], where="post", label="reserved, device %d" % device)
        ax.step(ta, [v / div for v in va], where="post", label="allocated, device %d" % device)
    for i, t in enumerate(ooms):
        ax.axvline(t, color="red", lw=1, ls="--", label="out of memory" if i == 0 else "_nolegend_")
    from matplotlib.patches import Patch
    handles, labels = ax.get_legend_handles_labels()
    for phase, c in colors.items():
        handles.append(Patch(color=c, alpha=0.3))
        labels.append(_literal(phase))
    ax.legend(handles, labels, loc="upper left", fontsize="small")
    ax.set_xlabel("time since cudalloc was loaded (s)")
    ax.set_ylabel(unit)
    title = "device memory: %s" % _literal(trace.path)
    cmd = trace.header.get("cmdline")
    if cmd:
        title += "\n" + _literal(cmd if len(cmd) < 100 else cmd[:97] + "...")
    ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    try:
        fig.savefig(args.output, dpi=args.dpi, format=fmt)
    except OSError as e:
        raise TraceError("cannot write %s: %s" % (args.output, e.strerror or e)) from None
