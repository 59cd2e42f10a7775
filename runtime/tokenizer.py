"""Text in and out of the deploy runtime: the export folder's Hugging Face tokenizer (``tokenizer.json``, through the
``tokenizers`` library) when the ONNX artifact carries one, byte-level (UTF-8 bytes are ids 0..255) otherwise.
Torch-free and transformers-free: ``tokenizers`` alone is enough.

An ONNX export of an ``--hf`` folder copies the folder's :data:`TOKENIZER_FILES` next to ``model.onnx`` and lists
them among the artifact's hashed files, so the runtime, ``mhaexport generate --prompt`` and onnxruntime-genai's
``og.Tokenizer(og.Model(DIR))`` all read the same tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mhaexport.artifact import ExportFolder, read_json, shown_path
from mhaexport.core.errors import MhaExportError, RuntimeInputError
from mhaexport.core.libraries import library_call
from mhaexport.runtime.genai import GENAI_CONFIG
from mhaexport.runtime.genai_config import GenaiConfig, GenaiModel, section
from mhaexport.core.untrusted import load_json, shown

# A Hugging Face tokenizer's files, as an export carries them; tokenizer.json is the one that must be there
# (onnxruntime-genai also reads tokenizer_config.json for the special tokens).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TOKENIZER_JSON = TOKENIZER_FILES[0]
INSTALL_LINE = "pip install tokenizers   (or pip install -e '.[hf]' in the mhaexport checkout)"


class TokenizerUnavailable(MhaExportError):
    """The folder carries a tokenizer but the ``tokenizers`` library cannot be imported."""


def tokenizer_files(folder: str | Path) -> list[Path]:
    """The tokenizer files in ``folder`` (those of :data:`TOKENIZER_FILES` that exist), or [] when it holds no
    ``tokenizer.json``: without it there is nothing to encode with."""
    folder = Path(folder)
    if not (folder / TOKENIZER_JSON).is_file():
        return []
    return [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]


@dataclass
class TextTokenizer:
    """Encode prompts and decode generated ids. ``kind``: "tokenizer.json" or "byte-level"."""

    kind: str
    _tok: Any = None  # a tokenizers.Tokenizer, or None for byte-level
    eos_token_id: int | None = None  # from the model's config (genai_config.json), when a tokenizer is carried
    source: str = TOKENIZER_JSON  # the file, as messages name it

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; a tokenizer.json adds the special tokens its post-processor adds (a BOS, for many
        models), as transformers' tokenizers do by default."""
        if self._tok is None:
            return list(text.encode("utf-8"))
        with library_call("tokenizers", self.source):  # a folder's tokenizer may raise or panic on any input
            return list(self._tok.encode(text).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens skipped (byte-level: ids above 255 are dropped)."""
        ids = [int(t) for t in ids]
        if self._tok is None:
            return bytes(t for t in ids if 0 <= t < 256).decode("utf-8", errors="replace")
        with library_call("tokenizers", self.source):
            return self._tok.decode(ids, skip_special_tokens=True)

    def continuation(self, prompt: Sequence[int], new: Sequence[int]) -> str:
        """The text ``new`` adds after ``prompt``. A tokenizer.json decodes it with the prompt and cuts after the
        prompt's own text, so a tokenizer that spells a leading space into the token (SentencePiece's ▁) keeps it."""
        if self._tok is None:
            return self.decode(new)
        before = self.decode(prompt)
        after = self.decode(list(prompt) + list(new))
        return after[len(before):] if after.startswith(before) else self.decode(new)


def byte_level() -> TextTokenizer:
    """UTF-8 bytes as ids 0..255 (the built-in models' encoding)."""
    return TextTokenizer("byte-level")


def load_tokenizer_file(path: str | Path) -> Any:
    """``tokenizers.Tokenizer.from_file(path)``; TokenizerUnavailable with the install line without the library."""
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise TokenizerUnavailable(f"{path} needs the tokenizers library ({e}): {INSTALL_LINE}") from None
    load_json(path, str(path))  # bounded (size, depth) before tokenizers parses it
    with library_call("tokenizers", shown_path(path)):
        return Tokenizer.from_file(str(path))


def for_folder(export: ExportFolder, artifact: str = "onnx") -> TextTokenizer | None:
    """The tokenizer of an export folder: its ``tokenizer.json`` when ``artifact`` lists it among its (hashed)
    files, byte-level when the vocabulary holds the 256 byte values, else None (no text: token ids only)."""
    entry = export.entry(artifact)
    if TOKENIZER_JSON in entry.files:
        eos = None
        if GENAI_CONFIG in entry.files:  # the model config's ids, written at export
            config = GenaiConfig.from_dict(read_json(export.file(artifact, GENAI_CONFIG), "onnxruntime-genai config"))
            model = section(GenaiModel, config.model)
            eos = model.eos_token_id if model is not None else None
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return TextTokenizer(TOKENIZER_JSON, load_tokenizer_file(export.file(artifact, TOKENIZER_JSON)),
                             eos if isinstance(eos, int) else None, f"{export.path}/{TOKENIZER_JSON}")
    if export.contract.vocab_size >= 256:
        return byte_level()
    return None
