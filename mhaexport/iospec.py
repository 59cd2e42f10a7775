"""``mhaexport.iospec`` is :mod:`mhaexport.core.iospec` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import iospec as _module

sys.modules[__name__] = _module
