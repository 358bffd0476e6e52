#!/usr/bin/env python3
"""pip install --no-build-isolation of the Python side into a fresh venv, offline.

    check_pip.py SOURCE_ROOT LIBCUDALLOC

The project's pyproject.toml, README and python/ are copied to a temporary folder (setuptools
writes its scratch folders beside pyproject.toml) and installed into a venv made with
--system-site-packages; the venv's cudalloc then imports, says it is not active, and its
console-script launcher runs Python with the library preloaded. Skipped (77) without venv/pip.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT, LIB = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what, out=""):
    print("%s %s" % ("PASS" if cond else "FAIL", what))
    if not cond:
        print(out)
        failures.append(what)


with tempfile.TemporaryDirectory(prefix="cudalloc-pip-") as tmp:
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, name), src)
    shutil.copytree(os.path.join(ROOT, "python"), os.path.join(src, "python"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = os.path.join(tmp, "venv")
    p = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], capture_output=True, text=True)
    pip = os.path.join(venv, "bin", "pip")
    if p.returncode != 0 or not os.path.exists(pip):
        print("SKIP: no venv with pip here:", p.stderr.strip())
        sys.exit(77)
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    env.pop("LD_PRELOAD", None)
    p = subprocess.run([pip, "install", "--no-build-isolation", src], capture_output=True, text=True, env=env)
    check(p.returncode == 0, "pip install --no-build-isolation (offline)", p.stdout + p.stderr)
    if failures:
        sys.exit(1)
    py = os.path.join(venv, "bin", "python")
    p = subprocess.run([py, "-c", "import cudalloc, cudalloc.torch, cudalloc.launcher; "
                        "print(cudalloc.__file__); print(cudalloc.is_active())"],
                       capture_output=True, text=True, env=env, cwd=tmp)
    lines = p.stdout.split("\n")
    check(p.returncode == 0 and lines[0].startswith(venv) and lines[1] == "False",
          "the venv imports its installed cudalloc, inactive", p.stdout + p.stderr)
    for script in ("cudalloc", "cudalloc-trace", "cudalloc-replay"):
        check(os.path.exists(os.path.join(venv, "bin", script)), "console script " + script)
    p = subprocess.run([os.path.join(venv, "bin", "cudalloc"), "--lib", LIB, "--", py, "-c",
                        "import cudalloc; print(cudalloc.is_active())"], capture_output=True, text=True, env=env)
    check(p.returncode == 0 and p.stdout.strip() == "True", "the venv's launcher preloads the library",
          p.stdout + p.stderr)

print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
