"""Evaluation: how good a file's predictions are on a text, per runtime (``mhaexport eval``: perplexity, bits per
token and per byte, perplexity.py). Evaluate owns its scoring (scoring.py: perplexity, KL, logit error, top-1 and
greedy agreement), which stands below verification: verify's quality check imports it, and nothing else of evaluate;
perplexity.py stands on verification's runner registry.
"""
