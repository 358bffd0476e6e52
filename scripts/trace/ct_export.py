"""Now cudalloc.trace.export (python/): kept for code that imports ct_export."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__)))), "python"))

import argparse  # noqa: E402
import pickle  # noqa: E402
import tempfile  # noqa: E402

from cudalloc.trace.export import FORMATS, export_chrome, export_rmm, export_torch, run  # noqa: E402,F401


def torch_snapshot(trace, frames_of=None):
    """The snapshot dict of a trace (frames as raw PCs; frames_of is no longer used)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "snapshot.pickle")
        export_torch(trace, argparse.Namespace(output=out, no_symbols=True))
        with open(out, "rb") as f:
            return pickle.load(f)
