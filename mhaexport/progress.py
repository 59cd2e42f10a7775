"""``mhaexport.progress`` is :mod:`mhaexport.core.progress` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import progress as _module

sys.modules[__name__] = _module
