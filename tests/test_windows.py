"""Sliding windows, local/global layers, softcaps, query scales and sinks (issue 37): the contract's fields, the
mask predicates, the built-in decoder's presets and every lowering's guard."""

from __future__ import annotations

import pytest

from mhaexport.core.errors import ConfigError
from mhaexport.core.iospec import ModelContract, ModuleContract


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
    block = ModuleContract(d_model=8, n_heads=2, mask="causal", max_positions=16)  # the block alone: the mask only
    assert block.score_features == {} and block.windows is None and not block.windowed


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


def _gqa_alone(local_window_size: int, T: int = 12, D: int = 8):
    """com.microsoft.GroupQueryAttention on its own (one head, no past) with ``local_window_size``: (y, q, k, v)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper as h

    node = h.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tot"], ["y", "ok", "ov"],
                       domain="com.microsoft", num_heads=1, kv_num_heads=1, local_window_size=local_window_size)
    ins = [h.make_tensor_value_info(x, TP.FLOAT, None) for x in ("q", "k", "v", "pk", "pv")]
    ins += [h.make_tensor_value_info(x, TP.INT32, None) for x in ("sl", "tot")]
    outs = [h.make_tensor_value_info(x, TP.FLOAT, None) for x in ("y", "ok", "ov")]
    model = h.make_model(h.make_graph([node], "gqa", ins, outs),
                         opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, T, D)).astype(np.float32) * 3 for _ in range(2))  # (B, T, H*D)
    v = rng.standard_normal((1, T, D)).astype(np.float32)
    empty = np.zeros((1, 1, 16, D), np.float32)  # (B, H_kv, max_cache, D)
    y = sess.run(None, dict(q=q, k=k, v=v, pk=empty, pv=empty, sl=np.array([T - 1], np.int32),
                            tot=np.array(T, np.int32)))[0]
    return y, q, k, v


@pytest.mark.parametrize("window", [3, 5])
def test_gqa_local_window_size_is_the_contracts_window(window):
    """The lowering writes local_window_size = W (rules.gqa_local_window); onnxruntime's kernel must then see the
    same W keys (the current one included) as the model's sliding_window rule, and W - 1 must not."""
    import numpy as np
    import torch

    from mhaexport.exporter.lowering.rules import gqa_local_window
    from mhaexport.models.attention import build_causal_mask

    assert gqa_local_window(0, (window, 0)) == window and gqa_local_window(1, (window, 0)) == -1
    T = 12
    allowed = build_causal_mask(T, 0, torch.ones(1, T, dtype=torch.long), window=window)[0, 0].numpy()  # (T, S)
    for lws, same in ((gqa_local_window(0, (window,)), True), (window - 1, False)):
        y, q, k, v = _gqa_alone(lws, T)
        scores = np.where(allowed, q[0] @ k[0].T / np.sqrt(8), -1e30)  # (T, S)
        p = np.exp(scores - scores.max(1, keepdims=True))
        want = (p / p.sum(1, keepdims=True)) @ v[0]  # (T, D)
        assert (np.abs(want - y[0]).max() < 1e-4) == same


@pytest.mark.parametrize("attention,kv_cache,preset,feature", [
    ("onnx", "concat", "tiny-gemma", "attn_softcap=0.02 of layer 0"),
    ("fused", "concat", "tiny-sinks", "attn_sinks=True of layer 0"),
    ("ort", "concat", "tiny-gemma", "attn_softcap=0.02 of layer 0"),
])
def test_a_lowering_that_cannot_express_a_feature_refuses_naming_it(tmp_path, attention, kv_cache, preset, feature):
    """Refused in one line, exit 2, before any export work; nothing is written."""
    from click.testing import CliRunner

    from mhaexport.cli import main

    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["-q", "onnx", "--config", preset, "--attention", attention, "--kv-cache", kv_cache,
                                  "--opset", "23", "--output", str(out)])
    assert r.exit_code == 2, r.output
    assert feature in r.output and "export with --attention decomposed" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (out / "model.onnx").exists()


def test_every_lowering_expresses_the_window_and_scale():
    from mhaexport.exporter.lowering.guard import refuse_unexpressible
    from mhaexport.models.config import PRESETS
    from mhaexport.models.loading import load_model

    c = load_model(config="tiny-window").contract
    assert c.windows == (8, 8) and PRESETS["tiny-gemma"].layer_windows == (8, 0)
    for attention in ("decomposed", "onnx", "ort", "fused"):
        for kv in ("concat", "shared"):
            refuse_unexpressible(c, attention, kv)  # no refusal: the window travels (bias or local_window_size)


def test_genai_sliding_window_is_checked_per_layer_against_the_graph():
    """A config that says 8 over a graph that says -1 fails naming the layer; the writer writes no entry for a
    full-length cache, and the checker accepts exactly that."""
    from mhaexport.runtime.genai_config import GqaWindow, GraphIO, sliding_window_entry, window_findings

    c = ModelContract(2, 4, 16, 256, 128, n_kv_heads=2, windows=(8, 0))
    assert sliding_window_entry(c) is None  # mhaexport's caches are full-length: onnxruntime-genai must not slide
    entry = sliding_window_entry(c, window_sized_cache=True)
    assert entry["window_size"] == 8 and entry["layers"] == [0]
    dec = {"num_hidden_layers": 2, "sliding_window": entry}
    builder = GraphIO(windows={0: GqaWindow(8, sliding_window_cache=1), 1: GqaWindow(-1)})
    assert window_findings(dec, builder, c) == []
    dropped = GraphIO(windows={0: GqaWindow(-1, sliding_window_cache=1), 1: GqaWindow(-1)})
    (f,) = window_findings(dec, dropped, c)
    assert "(layer 0)" in f.field and "window 8" in f.message and "local_window_size -1" in f.message
    unlisted = {"num_hidden_layers": 2, "sliding_window": {**entry, "layers": []}}  # [] means every layer
    assert any("(layer 1)" in f.field and "full attention" in f.message for f in window_findings(unlisted, builder, c))
    full_cache = GraphIO(windows={})  # a concat cache: the window is in the graph's mask
    assert "full-length" in window_findings(dec, full_cache, c)[0].message
    assert window_findings({"num_hidden_layers": 2}, full_cache, c) == []


def test_lint_flags_a_window_dropped_or_shifted_per_layer():
    from onnx import TensorProto as TP
    from onnx import helper as h

    from mhaexport.verify.lint import lint_model

    def graph(sizes):
        nodes = [h.make_node("GroupQueryAttention", ["q", "k", "v", f"past_key_values.{i}.key",
                                                     f"past_key_values.{i}.value", "sl", "tot"],
                             [f"y{i}", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
                             num_heads=4, kv_num_heads=2, local_window_size=w) for i, w in enumerate(sizes)]
        ins = [h.make_tensor_value_info(n, TP.FLOAT, None) for n in ("q", "k", "v")]
        return h.make_model(h.make_graph(nodes, "g", ins, [h.make_tensor_value_info("y0", TP.FLOAT, None)]),
                            opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)])

    c = ModelContract(2, 4, 16, 256, 128, n_kv_heads=2, windows=(8, 0))

    def window_findings(sizes):
        return [f for f in lint_model(graph(sizes), contract=c).findings if f.rule == "window"]

    assert window_findings([8, -1]) == []
    for sizes, says in (([-1, -1], "dropped"), ([9, -1], "shifted by +1"), ([7, -1], "shifted by -1"),
                        ([8, 8], "does not have")):
        (f,) = window_findings(sizes)
        assert f.severity == "error" and says in f.message and "layer" in f.node
    assert [f for f in lint_model(graph([-1, -1])).findings if f.rule == "window"] == []  # no contract: not judged


def test_bisect_names_the_layer_and_the_mask_feature_a_graph_dropped_or_shifted():
    """bisect reads each GroupQueryAttention's window and softcap against the contract: the layer and the feature
    that differ are named from the node's attributes, whatever case the numbers were compared at."""
    from onnx import helper as h

    from mhaexport.diagnose.bisect import BisectReport, mask_diffs

    def graph(sizes, caps=(50.0, 50.0)):
        nodes = [h.make_node("GroupQueryAttention", ["q", "k", "v", f"past_key_values.{i}.key",
                                                     f"past_key_values.{i}.value", "sl", "tot"],
                             [f"y{i}"], name=f"gqa{i}", domain="com.microsoft", num_heads=4, kv_num_heads=2,
                             local_window_size=w, **({"softcap": cap} if cap else {}))
                 for i, (w, cap) in enumerate(zip(sizes, caps))]
        return h.make_graph(nodes, "g", [], [])

    c = ModelContract(2, 4, 16, 256, 128, n_kv_heads=2, windows=(0, 8), attn_softcap=50.0)
    assert mask_diffs(graph([-1, 8]), c) == []
    for sizes, caps, layer, feature, says in (
            ([-1, -1], (50.0, 50.0), 1, "sliding window", "dropped"),
            ([-1, 9], (50.0, 50.0), 1, "sliding window", "shifted by +1"),
            ([-1, 7], (50.0, 50.0), 1, "sliding window", "shifted by -1"),
            ([8, 8], (50.0, 50.0), 0, "sliding window", "does not have"),
            ([-1, 8], (50.0, 0.0), 1, "attention softcap", "dropped")):
        (d,) = mask_diffs(graph(sizes, caps), c)
        assert (d.layer, d.feature) == (layer, feature) and says in d.note, d
        report = BisectReport("m.onnx", {"batch": 1, "seq": 4, "past": 3}, 1e-3, "cpu", masks=[d])
        assert f"layer {layer} (blocks.{layer}): {feature} differs: the graph's GroupQueryAttention gqa{layer}" \
            in report.summary()


def _gqa_cache(sliding_window_cache: int, W: int, H: int = 4, KV: int = 2, D: int = 8):
    """One GroupQueryAttention (window W) over a buffer bound as past and present, as an ORT session."""
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper as h

    ins = [h.make_tensor_value_info(n, TP.FLOAT, [1, None, w]) for n, w in (("q", H * D), ("k", KV * D), ("v", KV * D))]
    ins += [h.make_tensor_value_info(n, TP.FLOAT, [1, KV, None, D]) for n in ("pk", "pv")]
    ins += [h.make_tensor_value_info("sl", TP.INT32, [1]), h.make_tensor_value_info("tot", TP.INT32, [])]
    node = h.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "sl", "tot"], ["y", "ok", "ov"],
                       domain="com.microsoft", num_heads=H, kv_num_heads=KV, local_window_size=W,
                       sliding_window_cache=sliding_window_cache)
    model = h.make_model(h.make_graph([node], "g", ins, [h.make_tensor_value_info(n, TP.FLOAT, None)
                                                         for n in ("y", "ok", "ov")]),
                         opset_imports=[h.make_opsetid("", 18), h.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_a_window_sized_cache_decodes_like_a_full_length_one_past_its_slots():
    """GroupQueryAttention's sliding_window_cache=1 (what --kv-cache window writes on a windowed layer): a buffer of
    W + 4 slots, decoded 40 tokens one at a time, gives the full-length cache's outputs, and its rows [0, L) hold the
    L most recent keys (ONNX Runtime's documented L(T): eviction reclaims C - W + 1 slots at once)."""
    import numpy as np

    W, C, N = 8, 12, 40
    full, win = _gqa_cache(0, W), _gqa_cache(1, W)
    rng = np.random.default_rng(0)
    bf = [np.zeros((1, 2, 64, 8), np.float32)] * 2
    bw = [np.zeros((1, 2, C, 8), np.float32)] * 2
    for t in range(N):
        x = {n: rng.standard_normal((1, 1, w)).astype(np.float32) for n, w in (("q", 32), ("k", 16), ("v", 16))}
        x |= {"sl": np.array([t], np.int32), "tot": np.array(t + 1, np.int32)}
        yf, *bf = full.run(None, {**x, "pk": bf[0], "pv": bf[1]})
        yw, *bw = win.run(None, {**x, "pk": bw[0], "pv": bw[1]})
        np.testing.assert_allclose(yw, yf, atol=1e-6)
        T, G = t + 1, C - W + 1
        L = T if T <= C else T - G * -(-(T - C) // G)
        assert bw[0].shape[2] == C and W <= L or L == T
        np.testing.assert_array_equal(bw[0][:, :, :L], bf[0][:, :, T - L:T])
    assert L < N  # it evicted


def test_window_cache_buffers_and_deploy_steps_reach_past_the_window_sized_slots():
    from mhaexport.exporter.onnx import window_slots
    from mhaexport.verify.windows import deploy_steps

    gemma = ModelContract(2, 4, 16, 256, 128, n_kv_heads=2, windows=(8, 0))
    assert window_slots(gemma, 128) == [24, 0] and window_slots(gemma, 20) == [20, 0]
    assert deploy_steps(gemma, (24, 0), 10, 4) == 18  # 10 + 18 = 28 positions: past the 24 slots
    assert deploy_steps(gemma, None, 10, 4) == 4 and deploy_steps(gemma, (0, 0), 10, 4) == 4

    class Feed:  # what the protocol reads of a window cache's feed
        window_slots, n_layers, shared, max_cache = (24, 0), 2, True, 128
    from mhaexport.runtime.protocol import SharedBuffer
    # a windowed layer's buffer is its W + 16 slots even for a shorter loop (the op refuses one below its window)
    assert SharedBuffer(Feed()).layer_slots(10) == [24, 10] and SharedBuffer(Feed()).layer_slots(100) == [24, 100]


def test_kv_cache_window_refuses_a_model_without_a_window(tmp_path):
    from click.testing import CliRunner

    from mhaexport.cli import main

    r = CliRunner().invoke(main, ["onnx", "--config", "tiny", "--kv-cache", "window", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--kv-cache window: the model has no sliding window" in r.output, r.output
    assert not (tmp_path / "x" / "model.onnx").exists()


def test_a_window_cache_an_older_onnxruntime_cannot_load_is_refused_naming_the_option_and_the_version(monkeypatch):
    """onnxruntime-gpu 1.31 (the newest GPU wheel on 2026-12-04) does not know GroupQueryAttention's
    sliding_window_cache: the export's self-check refuses under --kv-cache window, naming what it needs."""
    import importlib

    from mhaexport.core.errors import ExportError, RuntimeFailure
    from mhaexport.runners import registry

    self_check = importlib.import_module("mhaexport.exporter.lowering.self_check")  # the module, not its function

    class Broken:
        def activate(self):
            return self

        def run(self, *a):
            raise RuntimeFailure("ONNX Runtime cannot load model.onnx: INVALID_GRAPH: In Node, GroupQueryAttention")

    monkeypatch.setattr(registry, "graph_runner", lambda *a, **k: Broken())
    monkeypatch.setattr(self_check, "_session_source", lambda m: m)
    c = ModelContract(2, 2, 4, 10, 64, windows=(8, 0))
    with pytest.raises(ExportError, match=r"^--kv-cache window: .*GroupQueryAttention.*onnxruntime >= 1\.32; this is"):
        self_check.self_check_shared(b"d", b"l", c, "float32", seq=4, past=0, max_cache=64, option="--kv-cache window")
    with pytest.raises(ExportError, match=r"^--kv-cache shared: ") as e:
        self_check.self_check_shared(b"d", b"l", c, "float32", seq=4, past=0, max_cache=64)
    assert "1.32" not in str(e.value)
