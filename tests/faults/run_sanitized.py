#!/usr/bin/env python3
"""Runs a meson build's tests under a sanitizer with cudalloc preloaded the way that works.

`meson test --wrapper` cannot help here: the wrapper process itself starts with the test's
LD_PRELOAD (an instrumented cudalloc) and crashes before it can change anything. This runner
reads the tests from `meson introspect --tests` and starts each one with its environment
adjusted:
  --preload-first LIB     LIB goes first in LD_PRELOAD (the sanitizer runtime must be loaded
                          before a library that interposes dlsym)
  --cudalloc PATH         the preloaded libcudalloc.so is replaced by PATH (another build)
  --env K=V               extra environment (ASAN_OPTIONS, SOAK_SECONDS, ...)
  --suite S / --test NAME which tests (repeatable; default all); --exclude NAME leaves one out
Prints one line per test and "N passed, N failed, N skipped"; exit 1 if any failed.
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builddir")
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--test", action="append", default=[])
    ap.add_argument("--exclude", action="append", default=[], help="test names to leave out")
    ap.add_argument("--preload-first", default=None)
    ap.add_argument("--cudalloc", default=None)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout-multiplier", type=float, default=4)
    a = ap.parse_args()
    tests = json.loads(subprocess.check_output(["meson", "introspect", "--tests", a.builddir]))
    chosen = []
    for t in tests:
        suites = [s.split(":")[-1] for s in t.get("suite", [])]
        if t["name"] in a.exclude:
            continue
        if (a.suite or a.test) and not (set(suites) & set(a.suite) or t["name"] in a.test):
            continue
        chosen.append(t)
    extra = dict(kv.split("=", 1) for kv in a.env)
    # The checks that run a program of their own scale their timeouts by this too.
    extra.setdefault("CUDALLOC_TEST_TIMEOUT_MULTIPLIER", str(a.timeout_multiplier))

    def run(t):
        env = dict(os.environ)
        env.update(t.get("env") or {})
        env.update(extra)
        pre = env.get("LD_PRELOAD", "")
        if pre:
            if a.cudalloc:
                pre = re.sub(r"\S*/libcudalloc\.so", a.cudalloc, pre)
            if a.preload_first:
                pre = a.preload_first + " " + pre
            env["LD_PRELOAD"] = pre
        cmd = t["cmd"]
        if a.cudalloc:
            # Checks that take the library's path as an argument must see the one preloaded.
            cmd = [re.sub(r"^\S*/libcudalloc\.so$", a.cudalloc, c) for c in cmd]
        timeout = (t.get("timeout") or 30) * a.timeout_multiplier
        start = time.monotonic()
        try:
            r = subprocess.run(cmd, env=env, cwd=t.get("workdir") or a.builddir, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout)
            rc, out = r.returncode, r.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            rc, out = "timeout", (e.stdout or b"").decode(errors="replace")
        return t, rc, out, time.monotonic() - start

    passed = failed = skipped = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        for t, rc, out, took in pool.map(run, chosen):
            expected_fail = t.get("should_fail", False)
            if rc == 77:
                skipped += 1
                verdict = "SKIP"
            elif (rc == 0) != expected_fail:
                passed += 1
                verdict = "OK"
            else:
                failed += 1
                verdict = "FAIL (%s)" % rc
            print("%-40s %-12s %6.1fs" % (t["name"], verdict, took), flush=True)
            if verdict.startswith("FAIL"):
                print("\n".join("  | " + line for line in out.splitlines()[-60:]))
            elif t["name"].startswith("soak"):
                print("\n".join("  " + line for line in out.splitlines() if line.startswith("soak:")))
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
