"""``mhaexport.version`` is :mod:`mhaexport.core.version` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import version as _module

sys.modules[__name__] = _module
