"""Exporters (ONNX, TorchScript) and the export folder's manifest.

This package's __init__ imports nothing heavy: ``mhaexport.exporter.manifest`` is torch-free and is read by the
deploy runtime. Import ``mhaexport.exporter.onnx`` / ``.torchscript`` for the exporters (they import torch).
"""
