#!/usr/bin/env python3
"""Security checks of the files cudalloc writes (suite 'faults').

  check_security.py symlinks PROGRAM   PROGRAM: test_bad_input (it provokes warnings)
  check_security.py setuid PROBE       PROBE: secure_probe
  check_security.py files PROBE        PROBE: secure_probe

symlinks: CUDALLOC_LOG_FILE and CUDALLOC_TRACE naming a symlink to a victim file: the victim
is untouched and the program still runs; naming a new file: it is created without group/other
write permission.

files: CUDALLOC_LOG_FILE and CUDALLOC_TRACE naming a FIFO that another process holds open
without reading, a hard link to another file, or (as root) a file another user created with
mode 0666: each is refused with a message, nothing is written through it, and the program runs
to its end (a FIFO used to block it for good once the pipe filled). An existing file of the
user's own with one name is still written.

setuid: PROBE copied setuid-root and run as nobody (setpriv) is in secure-execution mode:
load_config() sees no CUDALLOC_* path, and neither the log nor the trace writer creates a file
even when asked directly. Needs root, setpriv and a filesystem without nosuid: skipped (77)
otherwise, or when the kernel did not set AT_SECURE (no_new_privs in a container).
"""

import os
import shutil
import stat
import subprocess
import sys
import tempfile

SKIP = 77


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def symlinks(program):
    with tempfile.TemporaryDirectory(prefix="cudalloc-sec-") as d:
        victim = os.path.join(d, "victim")
        with open(victim, "w") as f:
            f.write("precious\n")
        for var in ("CUDALLOC_LOG_FILE", "CUDALLOC_TRACE"):
            link = os.path.join(d, "link-" + var)
            os.symlink(victim, link)
            env = dict(os.environ, CUDALLOC_LOG_LEVEL="warn")
            env[var] = link
            r = subprocess.run([program, "[double]"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=120)
            with open(victim) as f:
                if f.read() != "precious\n":
                    fail("%s=symlink: the symlink was followed and the victim written" % var)
            if r.returncode != 0:
                fail("%s=symlink: the program failed (%d): %s" % (var, r.returncode, r.stderr.decode()[-800:]))
            print("ok: %s naming a symlink: not followed (%s)" % (
                var, (r.stderr.decode().strip().splitlines() or ["no message"])[0][:160]))
        # New files: created, not world- or group-writable, the log has the warning.
        old = os.umask(0)  # the library's own mode, not the umask, must keep others out
        try:
            log = os.path.join(d, "new.log")
            trace = os.path.join(d, "new.trace")
            env = dict(os.environ, CUDALLOC_LOG_LEVEL="warn", CUDALLOC_LOG_FILE=log, CUDALLOC_TRACE=trace)
            r = subprocess.run([program, "[double]"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=120)
        finally:
            os.umask(old)
        if r.returncode != 0:
            fail("log+trace: the program failed (%d): %s" % (r.returncode, r.stderr.decode()[-800:]))
        made = [p for p in os.listdir(d) if p.startswith("new.")]
        for name in ("new.log",) + tuple(p for p in made if p.startswith("new.trace")):
            path = os.path.join(d, name)
            if not os.path.exists(path):
                fail("%s was not created" % name)
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode & 0o022:
                fail("%s has mode %o (group/other writable)" % (name, mode))
            print("ok: %s created with mode %o" % (name, mode))
        with open(log) as f:
            text = f.read()
        if "cuMemFree" not in text:
            fail("the log file lacks the double-free warning: %r" % text[:300])
        print("ok: the log file holds the warnings (%d lines)" % len(text.splitlines()))
    return 0


def setuid(probe):
    if os.geteuid() != 0:
        print("SKIP: not root")
        return SKIP
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        print("SKIP: no setpriv")
        return SKIP
    d = tempfile.mkdtemp(prefix="cudalloc-setuid-")
    try:
        if os.statvfs(d).f_flag & os.ST_NOSUID:
            print("SKIP: %s is mounted nosuid" % d)
            return SKIP
        os.chmod(d, 0o1777)  # writable by nobody: only secure mode may stop the files
        exe = os.path.join(d, "secure_probe")
        shutil.copy(probe, exe)
        os.chown(exe, 0, 0)
        os.chmod(exe, 0o4755)
        log, trace = os.path.join(d, "probe.log"), os.path.join(d, "probe.trace")
        env = dict(os.environ, CUDALLOC_LOG_FILE=log, CUDALLOC_TRACE=trace)
        # Control: not secure, the same probe writes both files.
        r = subprocess.run([exe, log + ".control", trace + ".control"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=60)
        out = r.stdout.decode()
        if r.returncode != 0 or "AT_SECURE=0" not in out or not os.path.exists(log + ".control") \
                or not os.path.exists(trace + ".control"):
            fail("control run did not write its files: %s %s" % (out, r.stderr.decode()))
        print("ok: control run (AT_SECURE=0) wrote both files")
        r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", exe, log, trace],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        out = r.stdout.decode()
        if "AT_SECURE=1" not in out:
            print("SKIP: the setuid probe did not run in secure-execution mode: %s %s"
                  % (out.strip(), r.stderr.decode().strip()[:300]))
            return SKIP
        if r.returncode != 0:
            fail("secure probe failed: %s %s" % (out, r.stderr.decode()))
        if "log_file='' trace=''" not in out:
            fail("load_config read CUDALLOC_* paths in secure mode: %s" % out)
        for p in (log, trace):
            if os.path.exists(p) or any(n.startswith(os.path.basename(p) + ".") and not n.endswith(".control")
                                        for n in os.listdir(d)):
                fail("%s was written in secure-execution mode" % p)
        print("ok: secure-execution run (AT_SECURE=1): no CUDALLOC_* path read, no log or trace file created")
        print("    " + " | ".join(out.strip().splitlines()))
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_probe(probe, log, trace, warnings):
    """Runs PROBE; returns (stdout, stderr); fails the test if it hangs or fails."""
    try:
        r = subprocess.run([probe, log, trace, str(warnings)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=30)
    except subprocess.TimeoutExpired:
        fail("the program hung with CUDALLOC_LOG_FILE=%s CUDALLOC_TRACE=%s" % (log, trace))
    if r.returncode != 0:
        fail("the probe failed (%d): %s" % (r.returncode, r.stderr.decode()[-800:]))
    return r.stdout.decode(), r.stderr.decode()


def expect_refused(probe, d, path, kind, reason, warnings=1):
    """PROBE with `path` as the log and then as the trace: refused with `reason`."""
    other = os.path.join(d, "other-" + kind)
    out, err = run_probe(probe, path, other + ".trace", warnings)
    if "CUDALLOC_LOG_FILE %s: it %s" % (path, reason) not in err:
        fail("log %s: no refusal naming %r: %s" % (kind, reason, err[:400]))
    if "secure_probe: warning 0" not in err:
        fail("log %s: the warnings did not go to stderr instead" % kind)
    out, err = run_probe(probe, other + ".log", path, 1)
    if "trace_opened=0" not in out or ("trace path %s %s" % (path, reason)) not in out:
        fail("trace %s: not refused with %r: %s" % (kind, reason, out))
    print("ok: %s refused as log and as trace (%s)" % (kind, reason))


def files(probe):
    with tempfile.TemporaryDirectory(prefix="cudalloc-files-") as d:
        # A FIFO another process holds open and never reads: enough warnings to fill its pipe.
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo, 0o600)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            expect_refused(probe, d, fifo, "a FIFO held open", "is not a regular file", warnings=20000)
            try:
                got = os.read(reader, 1 << 16)
            except BlockingIOError:
                got = b""
            if got:
                fail("the FIFO received %d bytes" % len(got))
        finally:
            os.close(reader)

        # A hard link to a file elsewhere: neither appended to nor truncated.
        victim = os.path.join(d, "victim")
        with open(victim, "w") as f:
            f.write("precious\n")
        link = os.path.join(d, "hardlink")
        os.link(victim, link)
        expect_refused(probe, d, link, "a hard link", "has 2 hard links")
        with open(victim) as f:
            if f.read() != "precious\n":
                fail("the hard link's other name was written")

        # Another user's file, world-writable: not adopted.
        if os.geteuid() == 0:
            foreign = os.path.join(d, "foreign")
            with open(foreign, "w"):
                pass
            os.chown(foreign, 65534, 65534)
            os.chmod(foreign, 0o666)
            expect_refused(probe, d, foreign, "another user's file", "is owned by uid 65534")
            if os.path.getsize(foreign) != 0:
                fail("another user's file received %d bytes" % os.path.getsize(foreign))
        else:
            print("skipped: another user's file (needs root to make one)")

        # Control: existing files of the user's own with one name are used (the log appended to,
        # the trace overwritten), and new ones are made 0600.
        log, trace = os.path.join(d, "own.log"), os.path.join(d, "own.trace")
        for p in (log, trace):
            with open(p, "w") as f:
                f.write("old\n")
            os.chmod(p, 0o600)
        out, err = run_probe(probe, log, trace, 3)
        with open(log) as f:
            text = f.read()
        if not text.startswith("old\n") or "secure_probe: warning 2" not in text:
            fail("own log file not appended to: %r" % text[:200])
        with open(trace) as f:
            text = f.read()
        if "trace_opened=1" not in out or not text.startswith("#cudalloc-trace v1"):
            fail("own trace file not written: %s %r" % (out, text[:100]))
        new_log, new_trace = os.path.join(d, "new.log"), os.path.join(d, "new.trace")
        run_probe(probe, new_log, new_trace, 1)
        for p in (new_log, new_trace):
            mode = stat.S_IMODE(os.stat(p).st_mode)
            if mode != 0o600 and mode != 0o600 & ~current_umask():
                fail("%s created with mode %o" % (p, mode))
        print("ok: the user's own files are written; new ones are created 0600")
    return 0


def current_umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    mode, target = sys.argv[1], sys.argv[2]
    if mode == "files":
        return files(target)
    return symlinks(target) if mode == "symlinks" else setuid(target)


if __name__ == "__main__":
    sys.exit(main())
