"""Now cudalloc.trace.symbols (python/): kept for code that imports ct_symbols."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.realpath(__file__)))), "python"))

from cudalloc.trace.symbols import Symbolizer, format_frame  # noqa: E402,F401
