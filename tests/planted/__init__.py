"""Models under the decoder contract with one classic bug planted each (bugs.py), and correct ones written
differently from the built-in decoder (good.py). Used as user factories: ``tests/planted/bugs.py:mask_zero``."""
