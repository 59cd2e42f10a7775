"""The runners room: every runtime by name and the runner that drives it, shared by verify, bench, eval and diagnose.

- :mod:`~mhaexport.runners.names`: the runtime names, :data:`~mhaexport.runners.names.RUNTIMES` (which runtimes each
  verb accepts and runs unless told), the one refusal of an unknown name, the session a runtime name gets;
- :mod:`~mhaexport.runners.registry`: runtime name -> its runner, as (runtime, protocol) pairs (``runner_for``,
  ``deploy_of``, ``without_cache``): every verb builds its runners there;
- the runners that are not the deploy runtime's own (:mod:`mhaexport.runtime`): the decoder's torch and reference
  runners (``decoder.py``), the attention block's (``block.py``), torch.export / AOTInductor code loaded on trust
  (``pt2.py``), onnxruntime-genai's loop (``genai.py``); torch's thread count (``threads.py``) and how each runner
  is checked (``subjects.py``).

It stands on runtime, artifact and core only (never on verify, whose checks drive these runners), so the exporter's
lowering self-check takes its runners here too. Torch is imported lazily, inside the runners that need it.
"""
