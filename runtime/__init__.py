"""The deploy path: an ONNX Runtime session over an export folder and its KV-cache decode loop.

Imports numpy and onnxruntime only, never torch (tests/test_runtime.py proves it in a subprocess)::

    from mhaexport.runtime import Generator, GenerationConfig, SamplingConfig
    gen = Generator("artifacts/onnx", providers=["cpu"])
    result = gen.generate([[5, 17, 42]], GenerationConfig(max_new_tokens=32))
    result.tokens, result.stop_reason
"""

from mhaexport.runtime.generator import (DecodeState, GenerationConfig, GenerationResult, Generator, STOP_EOS,
                                         STOP_MAX_NEW, STOP_MAX_POS)
from mhaexport.runtime.sampling import SamplingConfig, filtered_probs, next_tokens
from mhaexport.runtime.session import SessionConfig, create_session, resolve_providers

__all__ = ["DecodeState", "GenerationConfig", "GenerationResult", "Generator", "SamplingConfig", "SessionConfig",
           "STOP_EOS", "STOP_MAX_NEW", "STOP_MAX_POS", "create_session", "filtered_probs", "next_tokens",
           "resolve_providers"]
