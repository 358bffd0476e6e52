"""The `cudalloc` command: runs a command with libcudalloc.so preloaded.

    cudalloc [--conf S] [--no-caching] [--trace FILE [--trace-nvtx]] [--stats] [--lib PATH]
             [--build DIR] -- COMMAND ARGS...
    cudalloc --version

With no command it replays a bundled training trace through the allocator on a simulated
device and prints the memory report (no GPU needed), where the replay tools are installed.

The library is, in order: --lib, $CUDALLOC_LIB, --build DIR's, the one installed with this
launcher (meson install), a source tree's build/ (python/cudalloc run from a checkout), then
lib/ folders of the installation prefixes around this package and the interpreter.
"""

import importlib.util
import os
import sys
import sysconfig

from cudalloc import __version__

PROG = "cudalloc"
LIB_NAME = "libcudalloc.so"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
USAGE = ("usage: cudalloc [--conf S] [--no-caching] [--trace FILE [--trace-nvtx]] [--stats] "
         "[--lib PATH] [--build DIR] -- COMMAND ARGS...\n"
         "       cudalloc --version")


def _fail(message, status=2):
    sys.stderr.write("%s: %s\n" % (PROG, message))
    return status


def _source_root():
    """The checkout this package runs from (python/cudalloc in it), else None."""
    root = os.path.dirname(os.path.dirname(PACKAGE_DIR))
    if os.path.isfile(os.path.join(root, "meson.build")) and os.path.isdir(os.path.join(root, "shim")):
        return root
    return None


def _prefix_candidates():
    """lib/ folders under the prefixes this package and the interpreter are installed in."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    prefixes = []
    here = PACKAGE_DIR
    for _ in range(6):  # <prefix>/lib/python3.X/site-packages/cudalloc at most
        here = os.path.dirname(here)
        prefixes.append(here)
    prefixes += [sys.prefix, sys.base_prefix, "/usr/local", "/usr"]
    seen = set()
    for prefix in prefixes:
        for libdir in ("lib", "lib64", os.path.join("lib", multiarch) if multiarch else None):
            if libdir is None:
                continue
            path = os.path.join(prefix, libdir, LIB_NAME)
            if path not in seen:
                seen.add(path)
                yield path


def find_library(lib=None, build=None, installed=None):
    """The library to preload (an absolute path), or None."""
    if lib:
        return os.path.abspath(lib)
    env = os.environ.get("CUDALLOC_LIB")
    if env:
        return os.path.abspath(env)
    if build:
        return os.path.join(os.path.abspath(build), "shim", LIB_NAME)
    if installed and os.path.isfile(installed):
        return installed
    root = _source_root()
    if root is not None:
        path = os.path.join(root, "build", "shim", LIB_NAME)
        if os.path.isfile(path):
            return path
    for path in _prefix_candidates():
        if os.path.isfile(path):
            return path
    return None


def _replay_demo(conf, build, data_dir, bin_dir):
    """No command: replay the bundled trace, where the replay tools can be found."""
    root = _source_root()
    trace = None
    for d in (data_dir, os.path.join(root, "data", "traces") if root else None):
        if d and os.path.isfile(os.path.join(d, "demo-training.trace")):
            trace = os.path.join(d, "demo-training.trace")
            break
    binary = None
    for d in (os.path.join(build, "tools") if build else None, bin_dir,
              os.path.join(root, "build", "tools") if root else None):
        if d and os.path.isfile(os.path.join(d, "cudalloc-replay")):
            binary = os.path.join(d, "cudalloc-replay")
            break
    if importlib.util.find_spec("cudalloc.replay") is not None:
        replay = [sys.executable, "-m", "cudalloc.replay"]
    elif root is not None and os.path.isfile(os.path.join(root, "scripts", "replay")):
        replay = [sys.executable, os.path.join(root, "scripts", "replay")]
    else:
        replay = None
    if trace is None or binary is None or replay is None:
        sys.stderr.write(USAGE + "\n")
        return _fail("no command given (and no replay tools to show the bundled trace with)")
    print("cudalloc: no command given; replaying the bundled training trace on the simulated device")
    print("          (" + USAGE.split("\n")[0][len("usage: "):] + ")")
    sys.stdout.flush()
    args = replay + ["--replay-bin", binary] + (["--conf", conf] if conf else []) + [trace]
    os.execv(args[0], args)


def main(argv=None, lib=None, python_dir=None, data_dir=None, bin_dir=None):
    """The command. The installed bin/cudalloc passes where it put the library (`lib`), the
    Python package (`python_dir`, added to the command's PYTHONPATH so that it can import
    cudalloc) and the data; a console-script install passes nothing."""
    argv = list(sys.argv[1:] if argv is None else argv)
    conf = trace = build = explicit_lib = None
    no_caching = stats = trace_nvtx = False
    while argv:
        a = argv[0]
        if a == "--":
            argv.pop(0)
            break
        if not a.startswith("-"):
            break
        argv.pop(0)
        name, eq, value = a.partition("=")
        if name in ("--conf", "--trace", "--build", "--lib"):
            if not eq:
                if not argv:
                    return _fail("%s needs a value" % name)
                value = argv.pop(0)
            if name == "--conf":
                conf = value
            elif name == "--trace":
                trace = value
            elif name == "--build":
                build = value
            else:
                explicit_lib = value
        elif a == "--no-caching":
            no_caching = True
        elif a == "--trace-nvtx":
            trace_nvtx = True
        elif a == "--stats":
            stats = True
        elif a == "--version":
            found = find_library(explicit_lib or lib, build)
            print("cudalloc %s" % __version__)
            print("library: %s" % (found if found and os.path.isfile(found) else "not found"))
            return 0
        elif a in ("-h", "--help"):
            print(USAGE)
            return 0
        else:
            sys.stderr.write(USAGE + "\n")
            return _fail("unknown option " + a)

    if not argv:
        return _replay_demo(conf, build, data_dir, bin_dir)

    path = find_library(explicit_lib, build, installed=lib)
    if path is None or not os.path.isfile(path):
        return _fail("cannot find %s%s (install cudalloc with meson, build it with ninja, or name "
                     "it with --lib or CUDALLOC_LIB)" % (LIB_NAME, " at " + path if path else ""), 1)
    env = os.environ
    # Absolute paths: the program may change directory before it loads a library or opens its
    # trace (at its first CUDA call).
    env["LD_PRELOAD"] = path + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    if conf:
        env["CUDALLOC_CONF"] = conf
    if no_caching:
        env["CUDALLOC_NO_CACHING"] = "1"
    if trace:
        env["CUDALLOC_TRACE"] = os.path.abspath(trace)
    if stats:
        env["CUDALLOC_STATS"] = "1"
    if trace_nvtx:
        if not env.get("CUDALLOC_TRACE"):
            return _fail("--trace-nvtx needs --trace FILE (or CUDALLOC_TRACE)")
        env["CUDALLOC_CONF"] = (env["CUDALLOC_CONF"] + "," if env.get("CUDALLOC_CONF") else "") + "trace_nvtx:true"
        # The library does this itself at load time; never replace another tool's injection.
        env.setdefault("NVTX_INJECTION64_PATH", path)
    pkg_parent = python_dir or (os.path.dirname(PACKAGE_DIR) if _source_root() else None)
    if pkg_parent:
        env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        return _fail("cannot run %s: %s" % (argv[0], e.strerror or e), 127)


if __name__ == "__main__":
    sys.exit(main())
