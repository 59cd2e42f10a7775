"""The ground floor: what every room stands on and nothing above it — errors and exit codes, the ONNX
I/O names and contracts, dtypes, devices, progress, the environment, graph helpers, shown-text escaping and the
version. It imports nothing of mhaexport outside itself (tests/test_layers.py)."""
