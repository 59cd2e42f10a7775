"""``mhaexport.env`` is :mod:`mhaexport.core.env` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import env as _module

sys.modules[__name__] = _module
