"""``mhaexport.untrusted`` is :mod:`mhaexport.core.untrusted` (the ground floor, core/): this name stays importable and
is the same module object."""

import sys

from mhaexport.core import untrusted as _module

sys.modules[__name__] = _module
