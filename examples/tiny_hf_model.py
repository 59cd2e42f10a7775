"""A tiny random Hugging Face Llama, saved like a `save_pretrained` folder, to try `--hf` without a download.

    python examples/tiny_hf_model.py my-model      # then: mhaexport all --hf ./my-model -o out/hf

2 layers, hidden 64, 4 query heads sharing 2 key/value heads (head size 16), 64 positions, seeded random weights,
and a byte-level BPE tokenizer (300 tokens) trained on the repository's data/*.txt: tokenizer.json and
tokenizer_config.json beside the weights. Needs the `hf` extra (transformers, tokenizers). The same model as the
tests' `llama` (tests/hf_models.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

DATA = Path(__file__).resolve().parent.parent / "data"
SPECIALS = [("<pad>", "pad"), ("<s>", "bos"), ("</s>", "eos")]  # ids 0, 1, 2


def main(folder: str) -> None:
    out = Path(folder)
    cfg = transformers.LlamaConfig(vocab_size=320, max_position_embeddings=64, num_hidden_layers=2, hidden_size=64,
                                   intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(str(out))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(sorted(str(p) for p in DATA.glob("*.txt")),
              trainers.BpeTrainer(vocab_size=300, show_progress=False, special_tokens=[t for t, _ in SPECIALS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64,
              **{f"{name}_token": token for token, name in SPECIALS}}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    print(f"wrote a tiny random Llama and its tokenizer to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/tiny_hf_model.py FOLDER")
    main(sys.argv[1])
