"""Real-size random Llama folders, written the way ``save_pretrained`` lays them out, without holding the model.

Nothing is downloaded and no model is built: the tensors a Llama checkpoint holds are made one shard at a time from a
seeded generator (normal, std 0.02 like transformers' init; norms ones) and saved with the ``safetensors`` library in
shards of at most ``shard_bytes`` with ``model.safetensors.index.json`` — so an 8 B model (16 GB of bfloat16) takes
one shard's memory to make. Shapes are the published configs' (:data:`SHAPES`); ``positions`` sets
``max_position_embeddings`` (it changes no weight: RoPE has none), which sizes verify's longest prompt and its decode
sweep — on a 2-core machine the published 8,192 (Llama 3) would make verify's cases, not the weights, the cost.

``python -m tests.big_models llama-3-8b FOLDER`` (or ``tinyllama-1b``) writes one from the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# the published configs' shapes (Meta-Llama-3-8B, TinyLlama-1.1B): what a checkpoint's tensors are
SHAPES = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
                       bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False),
    "tinyllama-1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                         num_key_value_heads=4, vocab_size=32000, rope_theta=10000.0, rms_norm_eps=1e-5,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
}
STD = 0.02


def tensor_specs(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor a LlamaForCausalLM checkpoint of ``cfg`` holds, in the model's order."""
    d, f, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    hd = d // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], d))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (d,)),
                (p + "self_attn.q_proj.weight", (d, d)), (p + "self_attn.k_proj.weight", (kv, d)),
                (p + "self_attn.v_proj.weight", (kv, d)), (p + "self_attn.o_proj.weight", (d, d)),
                (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                (p + "mlp.down_proj.weight", (d, f))]
    out += [("model.norm.weight", (d,))]
    if not cfg.get("tie_word_embeddings"):
        out += [("lm_head.weight", (cfg["vocab_size"], d))]
    return out


def parameters(cfg: dict) -> int:
    n = 0
    for _, shape in tensor_specs(cfg):
        k = 1
        for s in shape:
            k *= s
        n += k
    return n


def write_random_llama(folder: str | Path, shape: str = "tinyllama-1b", *, positions: int = 128, seed: int = 0,
                       dtype: str = "bfloat16", shard_bytes: int = 2 << 30) -> Path:
    """A ``save_pretrained``-like folder of a random Llama of ``shape`` (:data:`SHAPES`) in ``dtype``: config.json,
    generation_config.json, shards ``model-0000i-of-0000n.safetensors`` of at most ``shard_bytes`` and their index.
    One shard is in memory at a time."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "max_position_embeddings": positions, "torch_dtype": dtype, "attention_bias": False, "mlp_bias": False,
           "initializer_range": STD, "use_cache": True, **SHAPES[shape]}
    tdtype = getattr(torch, dtype)
    itemsize = torch.empty((), dtype=tdtype).element_size()
    specs = tensor_specs(cfg)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, s in specs:
        n = itemsize
        for k in s:
            n *= k
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, s))
        size += n
    gen = torch.Generator().manual_seed(seed)
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, s in shard:
            if name.endswith("norm.weight"):
                t = torch.ones(s, dtype=tdtype)
            else:
                t = torch.empty(s, dtype=tdtype)
                for row in range(0, s[0], 4096):  # float32 noise a slice at a time, not the whole tensor
                    t[row:row + 4096] = (torch.randn((min(4096, s[0] - row),) + s[1:], generator=gen) * STD)
            tensors[name] = t
            weight_map[name] = file
            total += t.numel() * itemsize
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}, indent=2))
    return folder


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: python -m tests.big_models {{{','.join(SHAPES)}}} FOLDER [POSITIONS]")
    out = write_random_llama(sys.argv[2], sys.argv[1], positions=int(sys.argv[3]) if len(sys.argv) > 3 else 128)
    cfg = json.loads((out / "config.json").read_text())
    print(f"wrote {out}: {sys.argv[1]}, {parameters(cfg) / 1e9:.2f} B parameters")
