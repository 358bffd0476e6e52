"""Now cudalloc.trace.summary (python/): kept for code that imports ct_summary."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__)))), "python"))

from cudalloc.trace.summary import print_summary, run, summarize  # noqa: E402,F401
