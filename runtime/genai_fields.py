"""Every field of onnxruntime-genai's ``genai_config.json``, classified: the one table that says what a folder's
config may ask of onnxruntime-genai, and :func:`refuse_unsafe`, which holds a config to it before
``og.Model`` loads it. Torch-free (pure Python).

onnxruntime-genai believes its config. Most fields are data the genai-config check compares with the graph and the
model (numbers, I/O names, search settings); a few make it read a file (a name: kept inside the folder); and some
make it load code or write files — ``custom_ops_library`` (a native library it ``dlopen``s), ``enable_profiling``
(a trace file wherever its prefix says), the ONNX Runtime config entries any other session option becomes
(``session.*``/``ep.*``: optimized-model paths, EP context files), the run options (run config entries) and the
providers' own options (``backend_path``, cache folders). Those pass only with ``--trust-code`` (the user vouches
for the folder); a field this table does not know is refused the same way, so a field a newer onnxruntime-genai
adds is classified here before a folder can use it (tests/test_genai_fields.py holds this table to the list of
fields in onnxruntime-genai's own parser, tests/data/genai_config_fields.txt).

The classes (docs/untrusted-folders.md, "Verifying folders you did not make", has the table per input):

- ``number``: an int/float/bool setting (bounded by the genai-config check against the graph and the model);
- ``data``: a graph I/O name, an enum, a token id list — read, compared, never a path;
- ``name``: a file or folder name onnxruntime-genai opens relative to the folder: a plain relative name inside it
  (:func:`mhaexport.artifact.confine.check_name`), always — ``--trust-code`` does not let a folder read outside;
- ``text``: free text (``log_id``) that only reaches onnxruntime-genai's logs;
- ``code``: loads code, writes files or names a path: refused unless ``--trust-code``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mhaexport.artifact.confine import check_name
from mhaexport.core.errors import UnsafeFolder, UntrustedCode

NUMBER, DATA, NAME, TEXT, CODE = "number", "data", "name", "text", "code"
CLASSES = (NUMBER, DATA, NAME, TEXT, CODE)
TRUST_FLAG = "--trust-code"
WHERE = "genai_config.json"

# An element of the config: key -> a class, or "@Element" (an object, or an array of them, read as that element).
# "*": any other key of a free-form element. The element names are onnxruntime-genai's parser's (config.cpp's
# ``<Name>_Element``), so the vendored list of its fields maps line by line onto this table.
_IO = {"session_options": "@SessionOptions", "run_options": "@RunOptions"}
_MODEL_NUMBERS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "head_size")


def _names(*keys: str) -> dict[str, str]:
    return {k: DATA for k in keys}


FIELDS: dict[str, dict[str, str]] = {
    "Root": {"model": "@Model", "search": "@Search", "speculative": "@Speculative", "engine": "@Engine"},
    "Model": {
        "type": DATA, "tokenizer_dir": NAME, "eos_token_id": DATA, "tdt_durations": DATA,
        **{k: NUMBER for k in ("vocab_size", "context_length", "pad_token_id", "bos_token_id",
                                "decoder_start_token_id", "sep_token_id", "image_token_id", "audio_token_id",
                                "boa_token_id", "video_token_id", "vision_start_token_id", "num_mels", "fft_size",
                                "hop_length", "win_length", "preemph", "log_eps", "norm_eps", "subsampling_factor",
                                "left_context", "conv_context", "pre_encode_cache_size", "sample_rate",
                                "chunk_samples", "blank_id", "max_symbols_per_step", "left_context_samples",
                                "right_context_samples")},
        "encoder": "@Encoder", "decoder": "@Decoder", "draft": "@Decoder", "vision": "@Vision",
        "embedding": "@Embedding", "speech": "@Speech", "joiner": "@Joiner", "vad": "@VAD", "mtp": "@Mtp"},
    "Encoder": {"filename": NAME, **{k: NUMBER for k in _MODEL_NUMBERS}, **_IO,
                "inputs": "@EncoderInputs", "outputs": "@EncoderOutputs"},
    "Decoder": {"filename": NAME, **{k: NUMBER for k in _MODEL_NUMBERS}, "conv_cache_size": NUMBER, **_IO,
                "inputs": "@DecoderInputs", "outputs": "@DecoderOutputs", "sliding_window": "@SlidingWindow",
                "pipeline": "@Pipeline", "layer_types": DATA, "shared_initializers": "@SharedInitializer"},
    "Mtp": {"filename": NAME, "num_hidden_layers": NUMBER, "num_key_value_heads": NUMBER, "head_size": NUMBER,
            "main_hidden_states": DATA, **_IO, "inputs": "@MtpInputs", "outputs": "@MtpOutputs",
            "shared_initializers": "@SharedInitializer"},
    "Vision": {"filename": NAME, "config_filename": NAME, "adapter_filename": NAME, "spatial_merge_size": NUMBER,
               "tokens_per_second": NUMBER, "patch_size": NUMBER, "num_visual_tokens": NUMBER, "window_size": NUMBER,
               **_IO, "inputs": "@VisionInputs", "outputs": "@VisionOutputs", "pipeline": "@VisionPipeline"},
    "Speech": {"filename": NAME, "config_filename": NAME, "adapter_filename": NAME, **_IO,
               "inputs": "@SpeechInputs", "outputs": "@SpeechOutputs"},
    "Joiner": {"filename": NAME, **_IO, "inputs": "@JoinerInputs", "outputs": "@JoinerOutputs"},
    "VAD": {"filename": NAME, "threshold": NUMBER, "silence_duration_ms": NUMBER, "prefix_padding_ms": NUMBER,
            **_IO},
    "Embedding": {"filename": NAME, **_IO, "inputs": "@EmbeddingInputs", "outputs": "@EmbeddingOutputs"},
    "Pipeline": {"*": "@PipelineModel"},  # keys: the pipeline's model names
    "PipelineModel": {"filename": NAME, "run_on_prompt": NUMBER, "run_on_token_gen": NUMBER, "is_lm_head": NUMBER,
                      "inherit_session_options": NUMBER, "reset_session_idx": NUMBER, **_IO,
                      "output_names_forwarder": "@StringStringMap", "inputs": DATA, "outputs": DATA},
    "VisionPipeline": {"*": "@VisionPipelineModel"},
    "VisionPipelineModel": {"filename": NAME, "run_on_cpu": NUMBER, **_IO, "inputs": DATA, "outputs": DATA},
    "StringStringMap": {"*": DATA},
    "SharedInitializer": {"name": DATA, "data_file": NAME, "offset": NUMBER, "length": NUMBER, "data_type": DATA,
                          "shape": DATA},
    "SlidingWindow": {"window_size": NUMBER, "pad_value": NUMBER, "alignment": DATA, "slide_key_value_cache": NUMBER,
                      "slide_inputs": NUMBER, "cache_slack": NUMBER, "layers": DATA},
    "EncoderInputs": _names("input_ids", "inputs_embeds", "attention_mask", "position_ids", "audio_features",
                            "input_lengths", "cache_last_channel", "cache_last_time", "cache_last_channel_len",
                            "lang_id"),
    "EncoderOutputs": _names("encoder_hidden_states", "encoder_outputs", "output_lengths", "cache_last_channel_next",
                             "cache_last_time_next", "cache_last_channel_len_next", "cross_present_key_names",
                             "cross_present_value_names"),
    "DecoderInputs": _names("input_ids", "inputs_embeds", "attention_mask", "position_ids", "past_key_names",
                            "past_value_names", "past_names", "cross_past_key_names", "cross_past_value_names",
                            "past_sequence_length", "current_sequence_length", "total_sequence_length",
                            "encoder_hidden_states", "encoder_attention_mask", "rnn_states_prev",
                            "past_key_values_length", "cache_indirection", "cumulative_sequence_lengths",
                            "past_sequence_lengths", "block_table", "block_table_windowed", "attention_metadata",
                            "past_conv_names", "hidden_states", "targets", "lstm_hidden_state", "lstm_cell_state",
                            "per_layer_inputs", "targets_length"),
    "DecoderOutputs": _names("logits", "present_key_names", "present_value_names", "present_names",
                             "output_cross_qk_names", "rnn_states", "present_conv_names", "hidden_states", "outputs",
                             "lstm_hidden_state", "lstm_cell_state", "outputs_length"),
    "MtpInputs": _names("input_ids", "hidden_states", "attention_mask", "position_ids", "past_key_names",
                        "past_value_names"),
    "MtpOutputs": _names("logits", "hidden_states", "present_key_names", "present_value_names"),
    "VisionInputs": _names("pixel_values", "pixel_position_ids", "image_sizes", "image_grid_thw", "attention_mask"),
    "VisionOutputs": _names("image_features"),
    "SpeechInputs": _names("audio_embeds", "attention_mask", "audio_sizes", "audio_projection_mode"),
    "SpeechOutputs": _names("audio_features"),
    "JoinerInputs": _names("encoder_outputs", "decoder_outputs"),
    "JoinerOutputs": _names("logits"),
    "EmbeddingInputs": _names("input_ids", "image_features", "audio_features"),
    "EmbeddingOutputs": _names("inputs_embeds", "per_layer_inputs"),
    "SessionOptions": {
        "log_id": TEXT, "intra_op_num_threads": NUMBER, "inter_op_num_threads": NUMBER, "log_severity_level": NUMBER,
        "log_verbosity_level": NUMBER, "enable_cpu_mem_arena": NUMBER, "enable_mem_pattern": NUMBER,
        "graph_optimization_level": DATA,
        "enable_profiling": CODE,  # its value is the trace file's path prefix: writes files where it says
        "custom_ops_library": CODE,  # a native library onnxruntime-genai loads (its initializer runs)
        "provider_options": "@ProviderOptionsArray",
        # any other key becomes an ONNX Runtime session config entry (AddConfigEntry): optimized-model and EP
        # context paths among them; those of ONNX_CONFIG_ENTRIES are allowed, the rest are code
        "*": CODE},
    "RunOptions": {"*": CODE},  # run config entries (AddRunConfigEntry), keys and values free
    "ProviderOptionsArray": {"*": "@ProviderOptions"},  # keys: provider names (cuda, dml, qnn, webgpu, ...)
    # a provider's own options (strings): paths among them (QNN's backend_path loads a library, cache folders);
    # those of PROVIDER_OPTIONS are allowed, the rest are code
    "ProviderOptions": {"device_filtering_options": "@DeviceFilteringOptions", "*": CODE},
    "DeviceFilteringOptions": {"hardware_device_type": DATA, "hardware_device_id": NUMBER,
                               "hardware_vendor_id": NUMBER},
    "Search": {k: NUMBER for k in ("min_length", "max_length", "batch_size", "num_beams", "num_return_sequences",
                                   "top_k", "top_p", "temperature", "repetition_penalty", "length_penalty",
                                   "no_repeat_ngram_size", "diversity_penalty", "random_seed", "chunk_size",
                                   "do_sample", "past_present_share_buffer", "early_stopping", "blank_penalty")},
    "Speculative": {k: NUMBER for k in ("max_draft_tokens", "ngram_size", "ngram_chained_lookup", "min_adaptive_k",
                                        "cooldown")},
    "Engine": {"dynamic_batching": "@DynamicBatching", "static_batching": "@StaticBatching"},
    "DynamicBatching": {k: NUMBER for k in ("block_size", "num_blocks", "gpu_utilization_factor", "max_batch_size",
                                            "max_scheduled_tokens")},
    "StaticBatching": {"max_batch_size": NUMBER},
}

# ONNX Runtime session config entries a folder may set (flags that neither name a path nor load anything)
ONNX_CONFIG_ENTRIES = frozenset({"session.intra_op.allow_spinning", "session.inter_op.allow_spinning",
                                 "session.disable_prepacking", "session.use_env_allocators",
                                 "session.set_denormal_as_zero", "session.disable_cpu_ep_fallback"})
# a provider's options a folder may set (numbers and flags; no path, no library), by onnxruntime-genai's name
PROVIDER_OPTIONS = {
    "cuda": frozenset({"enable_cuda_graph", "device_id", "enable_skip_layer_norm_strict_mode", "use_tf32",
                       "prefer_nhwc", "gpu_mem_limit", "arena_extend_strategy", "cudnn_conv_algo_search",
                       "do_copy_in_default_stream", "cudnn_conv_use_max_workspace", "tunable_op_enable",
                       "tunable_op_tuning_enable"}),
    "dml": frozenset({"device_id", "performance_preference", "device_filter", "disable_metacommands",
                      "enable_graph_capture"}),
    "webgpu": frozenset({"enableGraphCapture", "validationMode", "preferredLayout"}),
}


@dataclass(frozen=True)
class Field:
    """One field a config holds: its dotted path, the parser element and key that read it, and its class."""

    path: str
    element: str
    key: str
    cls: str
    value: object


def classify(element: str, key: str) -> str | None:
    """The class of ``key`` in onnxruntime-genai's parser element ``element`` ("@Child" for a nested element), or
    None when this table does not know it."""
    known = FIELDS.get(element, {})
    return known.get(key, known.get("*"))


def walk(config: object) -> list[Field]:
    """Every leaf field of a genai_config.json document (a dict), classified; a key :data:`FIELDS` does not know
    gets the class None. Objects and arrays of objects are followed into the element that parses them."""
    out: list[Field] = []

    def visit(node: object, element: str, path: str, depth: int) -> None:
        if depth > 32:  # deeper than any element nesting onnxruntime-genai parses
            out.append(Field(path, element, "", None, "(nested too deep)"))
            return
        if isinstance(node, list):
            for i, item in enumerate(node):
                visit(item, element, f"{path}[{i}]", depth + 1)
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            key = str(key)
            where = f"{path}.{key}" if path else key
            cls = classify(element, key)
            if isinstance(cls, str) and cls.startswith("@"):
                child = cls[1:]
                if isinstance(value, (dict, list)):
                    visit(value, child, where, depth + 1)
                else:
                    out.append(Field(where, element, key, DATA, value))
                continue
            out.append(Field(where, element, key, cls, value))

    visit(config, "Root", "", 0)
    return out


def _allowed_code(f: Field, path_parts: list[str]) -> bool:
    """Whether a ``code``-class catch-all field is on the allow-list: a flag-only ONNX Runtime config entry, or a
    provider option known to be a number or flag."""
    if f.element == "SessionOptions":
        return f.key in ONNX_CONFIG_ENTRIES
    if f.element == "ProviderOptions":
        provider = path_parts[-2].split("[")[0].lower() if len(path_parts) > 1 else ""
        return f.key in PROVIDER_OPTIONS.get(provider, frozenset())
    return False


def unsafe_fields(config: object) -> list[tuple[Field, str]]:
    """The fields of ``config`` that load code, write files or name a path (class ``code`` and not allow-listed),
    or that this table does not know, each with why; names are not among them (:func:`refuse_unsafe` checks them
    first)."""
    out = []
    for f in walk(config):
        if f.cls is None:
            out.append((f, "is not a field mhaexport knows (onnxruntime-genai's parser as of 0.16; "
                           "runtime/genai_fields.py)"))
        elif f.cls == CODE and not _allowed_code(f, f.path.split(".")):
            why = {"custom_ops_library": "loads a native library (its code runs)",
                   "enable_profiling": "writes a profile trace where its prefix says"}.get(f.key)
            if why is None:
                why = ("is an ONNX Runtime config entry mhaexport does not allow from a folder (it may name a path or "
                       "a library)" if f.element in ("SessionOptions", "RunOptions") else
                       "is a provider option mhaexport does not allow from a folder (it may name a path or a library)")
            out.append((f, why))
    return out


def refuse_unsafe(config: object, folder: object, trust_code: bool = False) -> None:
    """Hold a genai_config.json document (of the folder ``folder``, as messages name it) to :data:`FIELDS`:
    UnsafeFolder for a name that leaves the folder (always), UntrustedCode for the first field that loads code,
    writes files, names a path or is unknown, unless ``trust_code`` (the user's ``--trust-code``)."""
    for f in walk(config):
        if f.cls == NAME:
            check_name(f.value, f"{folder}/{WHERE}: {f.path}")
    if trust_code:
        return
    bad = unsafe_fields(config)
    if bad:
        f, why = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise UntrustedCode(f"{folder}/{WHERE}: {f.path} {why}: refused{more}; mhaexport lets a folder's "
                            f"onnxruntime-genai options load code or write files only when you ask — pass "
                            f"{TRUST_FLAG} if the folder is yours")
