"""`cudalloc-trace`: reads cudalloc allocation traces (CUDALLOC_TRACE=path; format:
docs/trace-format.md).

  cudalloc-trace summary TRACE [--json]
  cudalloc-trace plot TRACE -o memory.png
  cudalloc-trace export TRACE --format torch-snapshot|chrome|rmm -o OUT

TRACE may be gzipped (run.trace.gz). Bad input gets one line on stderr and exit status 2.
"""

import argparse
import os
import sys

PROG = "cudalloc-trace"

MATPLOTLIB_HINT = ("install matplotlib: apt-get install python3-matplotlib or pip install "
                   "matplotlib")


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def common(s):
        s.add_argument("trace", help="the trace (plain or .gz)")
        s.add_argument("--nvtx-depth", type=int, default=1, metavar="N",
                       help="group by the first N components of the NVTX range stack (0: all)")
        s.add_argument("--progress", action="store_true", default=None,
                       help="show a progress bar on stderr even when it is not a terminal")

    s = sub.add_parser("summary", help="peaks, counts, hit rate, largest allocations, misses, "
                                       "allocation sites, memory by NVTX phase")
    common(s)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--no-symbols", action="store_true",
                   help="print raw PCs; open none of the files the trace names")

    s = sub.add_parser("plot", help="a PNG of allocated and reserved over time (matplotlib)")
    common(s)
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--dpi", type=int, default=120)

    s = sub.add_parser("export", help="to a PyTorch memory snapshot, a Chrome trace, RMM's CSV")
    common(s)
    s.add_argument("--format", required=True, choices=["torch-snapshot", "chrome", "rmm"])
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--no-symbols", action="store_true",
                   help="raw PCs as frames; open none of the files the trace names")
    s.add_argument("--device", type=int, default=None, help="rmm: only this device's calls")
    return p


def _main(argv):
    args = build_parser().parse_args(argv)
    from .reader import TraceError, open_trace
    from . import progress
    try:
        trace = open_trace(args.trace)
        bar = progress.attach(trace, "%s %s" % (args.command, os.path.basename(args.trace)),
                              args.progress)
        try:
            if args.command == "summary":
                from . import summary
                summary.run(trace, args, sys.stdout)
            elif args.command == "plot":
                from . import plot
                try:
                    plot.run(trace, args, sys.stdout)
                except plot.MissingMatplotlib:
                    bar.close()
                    sys.stderr.write("%s: plot needs matplotlib, which %s cannot import; %s\n"
                                     % (PROG, sys.executable or "python3", MATPLOTLIB_HINT))
                    return 2
            elif args.command == "export":
                from . import export
                export.run(trace, args, sys.stdout, bar)
        finally:
            bar.close()
    except TraceError as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        return 2
    return 0


def main(argv=None):
    """The command line; returns the exit status (0, or 2 on bad input or usage)."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (| head): nothing more to say, and nothing to flush.
        try:
            sys.stdout = None
        finally:
            os._exit(0)
    except OSError as e:
        sys.stderr.write("%s: %s%s\n" % (PROG, e.strerror or e,
                                         (": " + str(e.filename)) if e.filename else ""))
        return 2
    except MemoryError:
        sys.stderr.write("%s: out of memory\n" % PROG)
        return 2
    except Exception as e:  # never a traceback for the user; CUDALLOC_TRACE_DEBUG=1 shows it
        if os.environ.get("CUDALLOC_TRACE_DEBUG"):
            raise
        sys.stderr.write("%s: internal error: %s: %s (CUDALLOC_TRACE_DEBUG=1 shows where)\n"
                         % (PROG, type(e).__name__, e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
