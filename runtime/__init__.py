"""The deploy path: an ONNX Runtime session over an export folder, the one runner protocol and the one KV-cache
decode loop. Imports numpy and onnxruntime only, never torch (tests/test_runtime.py proves it in a subprocess)::

    from mhaexport.runtime import Generator, GenerationConfig, SamplingConfig
    gen = Generator("artifacts/onnx", providers=["cpu"])
    result = gen.generate([[5, 17, 42]], GenerationConfig(max_new_tokens=32))
    result.tokens, result.stop_reason

Text in, text out, streaming (:mod:`mhaexport.runtime.model`)::

    model = mhaexport.runtime.load("artifacts/onnx")
    model.generate("The river ", max_new_tokens=32)       # the continuation
    for piece in model.stream("The river "): ...          # pieces of it as they are decoded
    model.serve(["The river ", "Once "], rows=4)         # continuous batching: tokens of each request streamed
    model.generate("The river ", draft="prompt-lookup")   # speculative decoding: the same tokens, fewer calls
    model.engine                                          # "onnxruntime-genai" where it runs the folder, else
                                                          # "mhaexport" (load(..., engine=...) forces either)
"""

from mhaexport.runtime.decode import (STOP_EOS, STOP_MAX_NEW, STOP_MAX_POS, DecodeLoop, DecodeState,
                                      GenerationConfig, GenerationResult, left_pad, pad_prompts)
from mhaexport.runtime.engine import ENGINES, open_generator
from mhaexport.runtime.feed import Feed
from mhaexport.runtime.genai import GenAIGenerator
from mhaexport.runtime.generator import Generator
from mhaexport.runtime.model import TextModel, load
from mhaexport.runtime.ort import OrtRunner
from mhaexport.runtime.runner import Runner, skipped
from mhaexport.runtime.sampling import SamplingConfig, filtered_probs, next_tokens
from mhaexport.runtime.serve import Request, Scheduler, Served, serve
from mhaexport.runtime.session import SessionConfig, provider_unavailable, resolve_providers
from mhaexport.runtime.speculative import DraftModel, PromptLookup, speculative_generate

__all__ = ["DecodeLoop", "DecodeState", "ENGINES", "Feed", "GenAIGenerator", "GenerationConfig", "GenerationResult",
           "Generator", "OrtRunner", "Runner", "STOP_EOS", "STOP_MAX_NEW", "STOP_MAX_POS", "SamplingConfig",
           "SessionConfig", "open_generator",
           "filtered_probs", "left_pad", "next_tokens", "pad_prompts", "provider_unavailable", "resolve_providers",
           "skipped", "TextModel", "load", "Request", "Scheduler", "Served", "serve", "DraftModel", "PromptLookup",
           "speculative_generate"]
