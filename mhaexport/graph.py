"""``mhaexport.graph`` is :mod:`mhaexport.core.graph` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import graph as _module

sys.modules[__name__] = _module
