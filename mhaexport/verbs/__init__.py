"""The Python API's verbs, one module per verb group; :mod:`mhaexport.api` is their one public face (import from
there: ``mhaexport.api.export_onnx``, ``mhaexport.verify``). common.py holds what every verb checks and loads."""
