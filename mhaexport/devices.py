"""``mhaexport.devices`` is :mod:`mhaexport.core.devices` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import devices as _module

sys.modules[__name__] = _module
