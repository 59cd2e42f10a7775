"""Tiny random Hugging Face causal LMs and a tokenizer trained here, saved like `save_pretrained` folders.

Nothing is downloaded: each model is built from its config class with seeded random weights; the tokenizer is a
byte-level BPE that the `tokenizers` library trains on the repository's data/*.txt (300 tokens: the 256 byte
symbols, 3 specials, 41 merges).
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 320  # >= the tokenizer's 300 ids
POSITIONS = 64
TOKENIZER_VOCAB = 300
SPECIALS = {"pad": ("<pad>", 0), "bos": ("<s>", 1), "eos": ("</s>", 2)}
IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _common(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int | None = None) -> dict:
    out = dict(vocab_size=VOCAB, max_position_embeddings=POSITIONS, num_hidden_layers=layers, hidden_size=hidden,
               intermediate_size=2 * hidden, num_attention_heads=heads, **IDS)
    if kv_heads is not None:
        out["num_key_value_heads"] = kv_heads
    return out


WINDOW = 8  # the windowed families' sliding window: far inside WINDOW_POSITIONS, so verify's sweep crosses it
WINDOW_POSITIONS = 128


def _windowed(layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> dict:
    return {**_common(layers, hidden, heads, kv_heads), "max_position_embeddings": WINDOW_POSITIONS}


def configs():
    """{name: config} for the proved architectures (transformers imported here, so a missing one skips cleanly)."""
    import transformers as T

    return {
        "gpt2": T.GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_embd=64, n_layer=2, n_head=4, **IDS),
        # grouped-query attention: 4 query heads share 2 key/value heads
        "llama": T.LlamaConfig(**_common(kv_heads=2)),
        # no sliding window: every position attends to the whole cache, as the contract's cache holds it
        "mistral": T.MistralConfig(**_common(kv_heads=2), sliding_window=None),
        "qwen2": T.Qwen2Config(**_common(kv_heads=2)),
        "phi3": T.Phi3Config(**_common(kv_heads=2), sliding_window=None),
        # multi-query attention (1 key/value head) and an explicit head_dim
        "gemma": T.GemmaConfig(**_common(kv_heads=1), head_dim=16),
        # the fast test's model: the smallest Llama that still has grouped-query attention
        "llama-small": T.LlamaConfig(**_common(layers=1, hidden=32, kv_heads=2)),
        # --- sliding windows (issue 37): 2 layers, window 8, 128 positions; the layer pattern is each config
        # class's own (layer_types where it has one), never set here but for Gemma 3's 2-layer local/global mix
        "mistral-window": T.MistralConfig(**_windowed(), sliding_window=WINDOW),  # every layer windowed
        "phi3-window": T.Phi3Config(**_windowed(), sliding_window=WINDOW),
        # local then global; scores and logits capped with tanh; queries scaled by 1/sqrt(64), not 1/sqrt(16)
        "gemma2-window": T.Gemma2Config(**_windowed(), head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=64,
                                        attn_logit_softcapping=5.0, final_logit_softcapping=3.0),
        # a second RoPE base for the local layer (rope_parameters per layer type)
        "gemma3-window": T.Gemma3TextConfig(**_windowed(), head_dim=16, sliding_window=WINDOW,
                                            query_pre_attn_scalar=64, layer_types=["sliding_attention",
                                                                                   "full_attention"]),
        # Qwen's rule: layers from max_window_layers on are windowed (Qwen2Config builds layer_types from it)
        "qwen2-window": T.Qwen2Config(**_windowed(), use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=1),
        "qwen3-window": T.Qwen3Config(**_windowed(), head_dim=16, use_sliding_window=True, sliding_window=WINDOW,
                                      max_window_layers=1),
        # local/global with a learned sink per head, and a mixture of 4 experts (2 per token)
        "gpt-oss-window": T.GptOssConfig(**_windowed(), head_dim=16, sliding_window=WINDOW, num_local_experts=4,
                                         num_experts_per_tok=2),
    }


PROVED = ("gpt2", "llama", "mistral", "qwen2", "phi3", "gemma")
WINDOWED = ("mistral-window", "phi3-window", "gemma2-window", "gemma3-window", "qwen2-window", "qwen3-window",
            "gpt-oss-window")
# random init leaves attention scores near 0 (every mask then looks right): the windowed models' query and key
# projections get this std, and gpt-oss's sinks std 1
ATTENTION_STD = 0.3


def config_summary(cfg) -> dict:
    """The sizes of a tiny config, for the measurements table."""
    keys = ("model_type", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings")
    return {k: getattr(cfg, k, None) for k in keys if getattr(cfg, k, None) is not None}


def train_tokenizer(folder: str | Path) -> None:
    """A byte-level BPE trained on data/*.txt, saved as tokenizer.json + tokenizer_config.json (bos/eos/pad)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB, show_progress=False,
                                  special_tokens=[t for t, _ in sorted(SPECIALS.values(), key=lambda x: x[1])],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(sorted(str(p) for p in (ROOT / "data").glob("*.txt")), trainer)
    for name, (token, want) in SPECIALS.items():
        assert tok.token_to_id(token) == want, (name, tok.token_to_id(token))
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": POSITIONS,
              **{f"{name}_token": token for name, (token, _) in SPECIALS.items()}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def save_tiny(name: str, folder: str | Path, *, tokenizer: bool = True, seed: int = 0) -> Path:
    """Build architecture ``name`` with seeded random weights and save it (and the tokenizer) into ``folder``."""
    import torch
    import transformers

    cfg = configs()[name]
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if name in WINDOWED:
        scale_attention(model)
    folder = Path(folder)
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(str(folder))
    if tokenizer:
        train_tokenizer(folder)
    return folder


def scale_attention(model, std: float = ATTENTION_STD) -> None:
    """Query/key projections drawn with ``std`` and attention sinks with std 1 (seeded by the caller)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                param.normal_(0.0, std)
            elif name.endswith(".sinks"):
                param.normal_(0.0, 1.0)


def export_plain(loaded, path: str | Path) -> Path:
    """A plain ``torch.onnx.export`` of a loaded model (the dynamo exporter, dynamic axes, no input or output names
    given: they are whatever the exporter calls them), as a user without mhaexport would make one."""
    import torch

    from mhaexport.core import iospec
    from mhaexport.exporter.onnx import dynamic_shapes

    c = loaded.contract
    ids, mask, past = iospec.dummy_inputs(c, 2, 3, 2, seed=0)
    args = (torch.from_numpy(ids), torch.from_numpy(mask),
            tuple((torch.from_numpy(k), torch.from_numpy(v)) for k, v in past))
    with torch.no_grad():
        prog = torch.onnx.export(loaded.module, args, dynamo=True, opset_version=18,
                                 dynamic_shapes=dynamic_shapes(c.n_layers, True))
    prog.save(str(path))
    return Path(path)


def beyond_window(folder: str | Path, hf_folder: str | Path, seq: int = 3 * WINDOW, seed: int = 0) -> float:
    """Max abs difference between an export's logits (ONNX Runtime on CPU, driven as its folder says) and
    transformers' own forward of the model in ``hf_folder``, over one unpadded prompt's positions from WINDOW on."""
    import numpy as np
    import torch
    import transformers

    from mhaexport.artifact import ExportFolder
    from mhaexport.runners.registry import runner_for

    rng = np.random.default_rng(seed)
    ids = rng.integers(3, TOKENIZER_VOCAB, size=(1, seq), dtype=np.int64)
    mask = np.ones((1, seq), dtype=np.int64)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_folder), attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    ef = ExportFolder.open(folder, "onnx")
    try:
        runner = runner_for(ef, "ort-cpu", ef.contract)
        runner.activate()
        try:
            got = runner.run(ids, mask)[0]
        finally:
            runner.deactivate()
    finally:
        ef.close()
    return float(np.abs(got[:, WINDOW:] - want[:, WINDOW:]).max())
