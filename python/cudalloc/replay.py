"""Replay an allocation trace through cudalloc's allocator on a simulated device (no GPU).

    cudalloc-replay TRACE [--conf S ...] [--limit SIZE] [--min-memory] [--format table|json|csv]

TRACE is a cudalloc trace (CUDALLOC_TRACE, docs/trace-format.md), a PyTorch memory snapshot
(torch.cuda.memory._dump_snapshot), an RMM logging_resource_adaptor CSV, or cudalloc-replay's
canonical op stream, each plain or gzipped (gpt2-train.pickle.gz); the format is detected, or
named with --input-format. The input is converted to the op stream (cudalloc.trace.inputs; a
cudalloc trace is read by the same reader as cudalloc-trace's) and replayed by
build/tools/cudalloc-replay, which is built with ninja if it is missing; --replay-bin names
another binary.

Prints per setting: peak allocated, peak reserved, utilization, segments, device calls, OOM
events, cache hit rate and (with --min-memory) the smallest limit under which the trace completes.
Exit status: 0 on success, 2 on bad usage or bad input (one line on stderr).
"""

import argparse
import os
import subprocess
import sys

from .trace import inputs as replay_inputs
from .trace import progress as _progress

# The source tree's root, where build/tools/cudalloc-replay is looked for.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROG = "replay"



def fail(msg):
    sys.stderr.write("%s: %s\n" % (PROG, msg))
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own prints the usage too)
        fail(message + " (see --help)")


def find_binary(explicit):
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            fail("--replay-bin %s is not an executable file" % explicit)
        return explicit
    env = os.environ.get("CUDALLOC_REPLAY_BIN")
    if env:
        return find_binary(env)
    build = os.path.join(ROOT, "build")
    binary = os.path.join(build, "tools", "cudalloc-replay")
    if os.path.isfile(os.path.join(build, "build.ninja")):
        # Keeps the binary current; a no-op when it is.
        try:
            r = subprocess.run(["ninja", "-C", build, "tools/cudalloc-replay"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        except OSError as e:
            r = None
            err = "cannot run ninja (%s)" % e.strerror
        else:
            err = "" if r.returncode == 0 else "ninja -C build tools/cudalloc-replay failed"
        if err:
            if os.access(binary, os.X_OK):
                sys.stderr.write("%s: warning: %s; using the existing %s\n"
                                 % (PROG, err, os.path.relpath(binary)))
            else:
                if r is not None:
                    tail = r.stdout.decode("utf-8", "replace").strip().splitlines()[-15:]
                    sys.stderr.write("\n".join(tail) + "\n")
                fail(err)
    if not os.access(binary, os.X_OK):
        fail("cudalloc-replay is not built: run 'meson setup build && ninja -C build "
             "tools/cudalloc-replay', or pass --replay-bin")
    return binary


def _main(argv):
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="trace file ('-' for stdin)")
    p.add_argument("--input-format", default="auto", choices=("auto",) + replay_inputs.FORMATS)
    p.add_argument("--conf", action="append", default=[],
                   help="CUDALLOC_CONF setting; repeatable, one result row each")
    p.add_argument("--limit", help="memory limit (bytes, or e.g. 512MiB, 8GiB)")
    p.add_argument("--min-memory", action="store_true",
                   help="find by bisection the smallest limit under which the trace completes")
    p.add_argument("--resolution", help="bisection resolution (default 2MiB)")
    p.add_argument("--total", help="simulated device memory (default 80GiB)")
    p.add_argument("--format", default="table", choices=("table", "json", "csv"))
    p.add_argument("--gpu-lag", help="the simulated device runs N ops behind the program (a GPU-bound "
                   "program: freed blocks wait for it; default 0)")
    p.add_argument("--as-cudamalloc", action="store_true",
                   help="every allocation a cudaMalloc and every free a cudaFree (a framework with its cache off)")
    p.add_argument("--blocking-streams", action="store_true",
                   help="the program has no non-blocking stream (PyTorch on one GPU): cudalloc's device "
                   "fences order reuse, so cudaFree'd blocks need not wait for the device")
    p.add_argument("--device", type=int, help="device ordinal to replay (default: the busiest)")
    p.add_argument("--replay-bin", help="cudalloc-replay binary to use")
    p.add_argument("--emit-ops", metavar="FILE",
                   help="write the canonical op stream to FILE ('-': stdout) and do not replay")
    p.add_argument("--quiet", action="store_true", help="no conversion notes on stderr")
    p.add_argument("--progress", action="store_true", default=None,
                   help="a progress bar on stderr while a trace is read, even when stderr is "
                   "not a terminal")
    a = p.parse_args(argv)

    name = "stdin" if a.input == "-" else a.input
    try:
        if a.input == "-":
            f = sys.stdin.buffer
        else:
            if os.path.isdir(a.input):
                fail("cannot read %s: Is a directory" % name)
            f = open(a.input, "rb")
    except OSError as e:
        fail("cannot read %s: %s" % (name, e.strerror or e))
    bars = []

    def progress(trace):
        bars.append(_progress.attach(trace, "reading %s" % os.path.basename(name), a.progress))

    try:
        converted = replay_inputs.convert_stream(f, name, a.input_format, a.device, progress)
    except replay_inputs.InputError as e:
        fail(str(e))
    except MemoryError:
        fail("%s: out of memory while reading the input" % name)
    except OSError as e:
        fail("cannot read %s: %s" % (name, e.strerror or e))
    finally:
        for b in bars:
            b.close()
        if f is not sys.stdin.buffer:
            f.close()

    def notes():
        if not a.quiet:
            for note in converted.notes:
                sys.stderr.write("%s: note: %s\n" % (PROG, note))

    if a.emit_ops:
        if a.emit_ops == "-":
            converted.write_to(sys.stdout.buffer)
            sys.stdout.flush()
        else:
            try:
                with open(a.emit_ops, "wb") as out:
                    converted.write_to(out)
            except OSError as e:
                fail("cannot write %s: %s" % (a.emit_ops, e.strerror or e))
        notes()
        return 0
    if converted.allocs == 0:
        fail("%s: no allocations to replay" % name)

    cmd = [find_binary(a.replay_bin), "--format", a.format,
           "--label", "%s (%s)" % (os.path.basename(name), converted.format)]
    for c in a.conf:
        cmd += ["--conf", c]
    for opt, val in (("--limit", a.limit), ("--total", a.total), ("--resolution", a.resolution),
                     ("--gpu-lag", a.gpu_lag)):
        if val is not None:
            cmd += [opt, val]
    if a.min_memory:
        cmd.append("--min-memory")
    if a.as_cudamalloc:
        cmd.append("--as-cudamalloc")
    if a.blocking_streams:
        cmd.append("--blocking-streams")
    cmd.append("-")
    sys.stdout.flush()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE)
    except OSError as e:
        fail("cannot run %s: %s" % (cmd[0], e.strerror or e))
    try:
        # The op stream goes out a chunk at a time, never as one more copy of all of it.
        converted.write_to(proc.stdin)
        converted = _Notes(converted.notes)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # cudalloc-replay stopped reading: its exit status and message say why
    rc = proc.wait()
    if rc < 0:
        fail("cudalloc-replay died of signal %d" % -rc)
    if rc == 0:
        notes()  # after the report; left out when cudalloc-replay failed (its one line is enough)
    return rc


class _Notes:
    """What is kept of a conversion once its ops are sent."""

    def __init__(self, notes):
        self.notes = notes


def main(argv=None):
    """The command line; returns the exit status."""
    if argv is None:
        argv = sys.argv[1:]
    try:
        return _main(argv)
    except SystemExit as e:
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # never a traceback: one line, exit 2
        sys.stderr.write("%s: internal error: %s: %s\n"
                         % (PROG, type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
        return 2



if __name__ == "__main__":
    sys.exit(main())
