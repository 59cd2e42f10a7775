"""Sliding windows, local/global layers, softcaps, query scales and sinks (issue 37): the contract's fields, the
mask predicates, the built-in decoder's presets and every lowering's guard."""

from __future__ import annotations

import pytest

from mhaexport.errors import ConfigError
from mhaexport.iospec import ModelContract


def test_contract_records_score_features_only_when_set():
    plain = ModelContract(2, 2, 4, 10, 64)
    assert plain.to_dict() == {"n_layers": 2, "n_heads": 2, "head_dim": 4, "vocab_size": 10, "max_positions": 64}
    assert plain.score_features == {}
    c = ModelContract(2, 2, 4, 10, 64, windows=(8, 0), attn_softcap=50, final_softcap=30.0, attn_scale=0.25,
                      attn_sinks=True)
    d = c.to_dict()
    assert d["windows"] == [8, 0] and d["attn_softcap"] == 50.0 and d["attn_sinks"] is True
    assert ModelContract.from_dict(d) == c
    with pytest.raises(ConfigError, match="attn_softcap must be a positive finite number"):
        ModelContract(2, 2, 4, 10, 64, attn_softcap=-1.0)


def test_contract_of_reads_the_config_names():
    import torch.nn as nn

    from mhaexport.models.loading import contract_of

    m = nn.Module()
    m.config = {"n_layers": 2, "n_heads": 2, "head_dim": 4, "vocab_size": 10, "max_positions": 64,
                "layer_windows": [4, 0], "attn_softcap": 20.0, "final_softcap": None, "attn_scale": 0.5,
                "attn_sinks": True}
    c = contract_of(m)
    assert c.windows == (4, 0) and c.attn_softcap == 20.0 and c.final_softcap is None and c.attn_scale == 0.5
    assert c.attn_sinks
