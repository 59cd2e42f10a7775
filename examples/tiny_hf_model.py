"""A tiny random Hugging Face Llama, saved like a `save_pretrained` folder, to try `--hf` without a download.

    python examples/tiny_hf_model.py my-model      # then: mhaexport all --hf ./my-model -o out/hf
    python examples/tiny_hf_model.py my-mistral --window 8   # a Mistral: every layer attends to the last 8 tokens

2 layers, hidden 64, 4 query heads sharing 2 key/value heads (head size 16), 64 positions, seeded random weights,
and a byte-level BPE tokenizer (300 tokens) trained on the repository's data/*.txt: tokenizer.json and
tokenizer_config.json beside the weights. Needs the `hf` extra (transformers, tokenizers). The same model as the
tests' `llama` (tests/hf_models.py). With ``--window W``: a Mistral of the same sizes whose every layer attends to a
sliding window of W tokens, with 128 positions (so verify's sweep runs far past the window) and query/key
projections drawn with std 0.3 (random init alone leaves every score near 0, where a dropped window would not show);
the tests' ``mistral-window``.
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


def main(folder: str, window: int | None = None) -> None:
    out = Path(folder)
    sizes = dict(vocab_size=320, max_position_embeddings=64, num_hidden_layers=2, hidden_size=64,
                 intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                 pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if window:
        cfg = transformers.MistralConfig(**{**sizes, "max_position_embeddings": 128}, sliding_window=window)
    else:
        cfg = transformers.LlamaConfig(**sizes)
    torch.manual_seed(0)
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    if window:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    param.normal_(0.0, 0.3)
    model.save_pretrained(str(out))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(sorted(str(p) for p in DATA.glob("*.txt")),
              trainers.BpeTrainer(vocab_size=300, show_progress=False, special_tokens=[t for t, _ in SPECIALS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_position_embeddings,
              **{f"{name}_token": token for token, name in SPECIALS}}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    what = f"Mistral (sliding window {window})" if window else "Llama"
    print(f"wrote a tiny random {what} and its tokenizer to {out}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) == 3 and args[1] == "--window" and args[2].isdigit() and int(args[2]) > 0:
        main(args[0], int(args[2]))
    elif len(args) == 1:
        main(args[0])
    else:
        sys.exit("usage: python examples/tiny_hf_model.py FOLDER [--window W]")
