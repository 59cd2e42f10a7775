"""Text for measuring a model: the held-out part of ``data/`` and how text becomes token ids.

``weights/small-heldout.txt`` is exactly the last 5 % of the corpus ``scripts/train_default.py`` reads (``data/*.txt``
joined by blank lines, split at ``int(0.95 * len)``): the validation split the shipped ``small`` weights never
trained on (``tests/test_quality.py`` checks it byte for byte). It sits next to the weights, outside ``data/``, so
the training glob never reads it and an installed package has it. Perplexity on it is a held-out figure for the
shipped weights; for any other byte-level model it is just English prose.

Only byte-level models (``vocab_size == 256``) read text here: a byte is a token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mhaexport.core.errors import RuntimeInputError
from mhaexport.core.iospec import ModelContract

HELDOUT_FILE = Path(__file__).parent / "weights" / "small-heldout.txt"
HELDOUT_FRACTION = 0.05  # scripts/train_default.py's validation split: the corpus' last 5 %
BYTE_VOCAB = 256


def heldout_text() -> bytes:
    """The held-out text of the shipped ``small`` weights (1377 bytes of English prose)."""
    return HELDOUT_FILE.read_bytes()


def split_corpus(corpus: bytes) -> tuple[bytes, bytes]:
    """(train, held-out) as scripts/train_default.py splits the joined corpus."""
    split = int(len(corpus) * (1 - HELDOUT_FRACTION))
    return corpus[:split], corpus[split:]


def is_byte_level(contract: ModelContract) -> bool:
    return contract.vocab_size == BYTE_VOCAB


def text_ids(text: bytes, contract: ModelContract) -> np.ndarray:
    """Text as the model's token ids: its bytes, for a byte-level model; RuntimeInputError for any other (no
    tokenizer here) and for text shorter than two tokens (nothing to predict)."""
    if not is_byte_level(contract):
        raise RuntimeInputError(f"text needs a tokenizer: the model's vocabulary has {contract.vocab_size} ids, and "
                                f"only byte-level models (vocab_size {BYTE_VOCAB}) read text as bytes here")
    if len(text) < 2:
        raise RuntimeInputError(f"the text has {len(text)} byte(s): at least 2 are needed to predict one")
    return np.frombuffer(text, dtype=np.uint8).astype(np.int64)
