"""``mhaexport.dtypes`` is :mod:`mhaexport.core.dtypes` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import dtypes as _module

sys.modules[__name__] = _module
