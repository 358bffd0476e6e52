"""The input converters of scripts/replay, now cudalloc.trace.inputs (python/): kept so that
code importing replay_inputs from scripts/ still finds them."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                                "python"))

from cudalloc.trace.inputs import *  # noqa: E402,F401,F403
from cudalloc.trace.inputs import (FORMATS, InputError, Converted, OpBuilder,  # noqa: E402,F401
                                   convert, convert_stream, detect)
