"""Diagnosis: where a failing export goes wrong, after verification said *that* it does.

``bisect`` (bisect.py) compares every module's output of eager against the exported file's values and names the
first that diverges; ``follow`` (follow.py) re-runs the check that failed in its own protocol (a weights failure,
onnxruntime-genai's deploy loop) and names the tensor or step; ``attention_steps`` looks inside one attention
module (scores, scale, mask, softmax, weighted sum, output projection). Stands on verification's runners and
comparisons (mhaexport.verify); verification never imports it.
"""
