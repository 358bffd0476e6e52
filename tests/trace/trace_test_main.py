"""The main of the trace tools' tests: the command line's paths into the test module's globals,
a scratch directory in TMP (removed at the end), then unittest over the rest of the arguments."""
import shutil
import sys
import tempfile
import unittest


def run(module_globals, names, prefix):
    if len(sys.argv) < len(names) + 1:
        sys.stderr.write(module_globals.get("__doc__") or "")
        return 2
    module_globals.update(zip(names, sys.argv[1:len(names) + 1]))
    module_globals["TMP"] = tempfile.mkdtemp(prefix=prefix)
    try:
        prog = unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[len(names) + 1:], exit=False)
        return 0 if prog.result.wasSuccessful() else 1
    finally:
        shutil.rmtree(module_globals["TMP"], ignore_errors=True)
