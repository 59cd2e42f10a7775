"""Exporters: ONNX (``mhaexport.exporter.onnx``, with attention lowerings and precision), TorchScript
(``.torchscript``) and onnxruntime-genai's config (``.genai``). They write export folders through
:mod:`mhaexport.artifact`. This __init__ imports nothing heavy; the exporters import torch.
"""
