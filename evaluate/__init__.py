"""Evaluation: how good a file's predictions are on a text, per runtime (``mhaexport eval``: perplexity, bits per
token and per byte, perplexity.py). Stands on verification's runner registry and the text scoring it shares with
the quality check (mhaexport.verify.quality); verification never imports it.
"""
