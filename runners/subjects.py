"""How a runtime is driven, which is what its checks are given: a runner's ``checked_as`` (the one table of checks,
verify/suite.py, has one entry per check for each): contract calls (every decoder runtime but ort-genai),
onnxruntime-genai's own loop (ort-genai: traces of it), the attention block's module contract."""

CONTRACT, LOOP, MODULE = "contract", "loop", "module"
