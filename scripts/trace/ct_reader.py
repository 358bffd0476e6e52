"""The trace reader, now cudalloc.trace.reader (python/): kept for the tests and scripts that
import ct_reader from scripts/trace."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__)))), "python"))

from cudalloc.trace.reader import *  # noqa: E402,F401,F403
from cudalloc.trace.reader import (Record, Trace, TraceError, fmt_bytes, open_trace,  # noqa: E402,F401
                                   phase_of)
