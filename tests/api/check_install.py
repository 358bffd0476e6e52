#!/usr/bin/env python3
"""meson install into a temporary destdir, then use the installed tree.

    check_install.py BUILD_DIR PROJECT_VERSION

Checks: the library, header, pkg-config file, launcher, cudalloc-replay, Python package, docs and
LICENSE are installed; the library still needs only the C library's parts; the installed
launcher runs `python3 -c "import cudalloc; print(cudalloc.is_active())"` with the installed
library preloaded and prints True, and says its version; a C program builds against the
installed header and pkg-config file and runs with the installed library.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

BUILD, VERSION = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print("%s %s" % ("PASS" if cond else "FAIL", what))
    if not cond:
        failures.append(what)


def one(root, pattern):
    found = glob.glob(os.path.join(root, pattern), recursive=True)
    return found[0] if found else None


with tempfile.TemporaryDirectory(prefix="cudalloc-install-") as dest:
    # --no-rebuild: meson test has built what is installed (this test depends on it), and a
    # rebuild here would build the whole project.
    p = subprocess.run(["meson", "install", "-C", BUILD, "--destdir", dest, "--quiet", "--no-rebuild"],
                       capture_output=True, text=True)
    check(p.returncode == 0, "meson install --destdir")
    if p.returncode != 0:
        print(p.stdout + p.stderr)
        sys.exit(1)
    lib = one(dest, "**/lib*/**/libcudalloc.so") or one(dest, "**/libcudalloc.so")
    header = one(dest, "**/include/cudalloc/cudalloc.h")
    pc = one(dest, "**/pkgconfig/cudalloc.pc")
    launcher = one(dest, "**/bin/cudalloc")
    replay = one(dest, "**/bin/cudalloc-replay")
    engine = one(dest, "**/libexec/cudalloc/cudalloc-replay")
    trace_tool = one(dest, "**/bin/cudalloc-trace")
    package = one(dest, "**/cudalloc/__init__.py")
    for path, what in ((lib, "library"), (header, "header"), (pc, "pkg-config file"), (launcher, "launcher"),
                       (replay, "cudalloc-replay"), (engine, "replay engine"), (trace_tool, "cudalloc-trace"),
                       (package, "Python package"),
                       (one(dest, "**/share/doc/cudalloc/README.md"), "README"),
                       (one(dest, "**/share/doc/cudalloc/LICENSE"), "LICENSE"),
                       (one(dest, "**/share/doc/cudalloc/trace-format.md"), "trace format"),
                       (one(dest, "**/cudalloc/launcher.py"), "launcher module"),
                       (one(dest, "**/cudalloc/torch.py"), "torch shim")):
        check(path is not None, "installed: " + what)
    if failures:
        sys.exit(1)
    check(os.access(launcher, os.X_OK), "bin/cudalloc is executable")
    # The installed tools on the installed demo trace, from another folder, no build tree.
    demo = one(dest, "**/share/cudalloc/demo-training.trace")
    tool_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDALLOC_REPLAY_BIN")}
    for cmd, what in (([trace_tool, "summary", "--no-symbols", demo], "reserved"),
                      ([replay, demo, "--quiet", "--format", "json"], "peak_reserved")):
        p = subprocess.run(cmd, capture_output=True, text=True, env=tool_env, cwd=dest)
        check(p.returncode == 0 and what in p.stdout, "installed %s runs: %s" % (os.path.basename(cmd[0]),
                                                                              p.stderr.strip()[-200:]))
    out = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    check(all(n.startswith(("libc.so", "libm.so", "libdl.so", "libpthread.so", "ld-linux")) for n in needed),
          "installed library needs only %s" % needed)
    # From another folder, with the build tree out of reach: found relative to the launcher.
    env = dict(os.environ)
    for var in ("LD_PRELOAD", "PYTHONPATH", "CUDALLOC_LIB"):
        env.pop(var, None)
    p = subprocess.run([launcher, "--", "/usr/bin/python3", "-c",
                        "import cudalloc, os; print(cudalloc.is_active()); print(cudalloc.__file__); "
                        "print(os.environ['LD_PRELOAD'])"],
                       capture_output=True, text=True, env=env, cwd=dest)
    lines = p.stdout.split("\n")
    print(p.stdout + p.stderr)
    check(p.returncode == 0 and lines[0] == "True", "installed launcher: cudalloc.is_active() is True")
    check(len(lines) > 2 and lines[1].startswith(dest) and lines[2] == os.path.realpath(lib),
          "the installed package and library were used")
    p = subprocess.run([launcher, "--version"], capture_output=True, text=True, env=env)
    check(p.stdout.startswith("cudalloc %s\nlibrary: %s" % (VERSION, os.path.realpath(lib))),
          "cudalloc --version: %r" % p.stdout)
    # A C program against the installed header and pkg-config file.
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is not None:
        src = os.path.join(dest, "use.c")
        with open(src, "w") as f:
            f.write('#include <cudalloc/cudalloc.h>\n#include <stdio.h>\n'
                    'int main(void) { int64_t v = -1; int s = cudalloc_stat(CUDALLOC_CURRENT_DEVICE, '
                    '"allocated_bytes.all.current", &v);\n'
                    '  printf("%s %d %lld\\n", cudalloc_version(), s, (long long)v); return s; }\n')
        pc_env = dict(env, PKG_CONFIG_PATH=os.path.dirname(pc))
        prefix = os.path.dirname(os.path.dirname(os.path.dirname(header)))  # <prefix>/include/cudalloc/
        flags = subprocess.run(["pkg-config", "--define-variable=prefix=" + prefix, "--cflags", "--libs", "cudalloc"],
                               capture_output=True, text=True, env=pc_env)
        check(flags.returncode == 0, "pkg-config cudalloc: %s" % flags.stdout.strip())
        exe = os.path.join(dest, "use")
        b = subprocess.run([cc, src, "-o", exe] + flags.stdout.split(), capture_output=True, text=True)
        check(b.returncode == 0, "a C program builds against the installed header: %s" % b.stderr.strip())
        if b.returncode == 0:
            r = subprocess.run([exe], capture_output=True, text=True,
                               env=dict(env, LD_LIBRARY_PATH=os.path.dirname(lib)))
            check(r.returncode == 0 and r.stdout.strip() == "%s 0 0" % VERSION, "it runs: %r" % r.stdout)

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
