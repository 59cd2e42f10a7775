"""``mhaexport.errors`` is :mod:`mhaexport.core.errors` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import errors as _module

sys.modules[__name__] = _module
