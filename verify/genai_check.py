"""The ``genai-config`` check: the ``genai_config.json`` onnxruntime-genai reads, field by field, against the graph
it drives, the manifest that vouches for the file, the model it claims to be and the tokenizer that ships with it.

onnxruntime-genai believes its config: a ``context_length`` below the model's positions makes it refuse lengths the
model handles, one above them feeds positions the model never learned; wrong head or layer counts size its cache
wrong; a ``past_present_share_buffer`` the graph cannot honour feeds it a buffer it does not write; a name template
that misses the graph's inputs leaves a cache unfed; ``search`` defaults (sampling, a repetition penalty, beams)
make what it generates differ from greedy decoding — which is what verify proves. Each finding names the field.

:func:`config_findings` needs the config and the graph only (``mhaexport lint`` runs it on a folder on its own);
given the model's contract, the manifest's file and cache layout and the tokenizer's ids it checks those too
(verify's ``genai-config`` check, :func:`check_genai_config`). Reads JSON and the graph's I/O: no torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mhaexport.core.errors import ArtifactError, UntrustedInput
from mhaexport.core.untrusted import load_json
# the findings themselves are the deploy runtime's too (torch- and onnx-free): imported from there, names kept here
from mhaexport.runtime.genai_config import (CACHE_OPS_IN_PLACE, DEFAULT_NAMES, GENAI_CHECK, GENAI_CONFIG,  # noqa: F401
                                            OTHER_FED, AttentionAttrs, ConfigFinding, Expected, GqaWindow,
                                            GraphIO, config_findings,
                                            deploy_findings, findings_for, folder_expected, manifest_graph,
                                            model_special_ids, tokenizer_special_ids)


def read_graph_io(path: str | Path) -> GraphIO:
    """The :class:`GraphIO` of the ONNX file at ``path`` (its external data not loaded)."""
    from mhaexport.runners.wire import read_graph

    try:
        model = read_graph(path)[0]
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise ArtifactError(f"{path} is not a readable ONNX model: {type(e).__name__}: {e}") from None
    return graph_io_of(model)


def graph_io_of(model) -> GraphIO:
    """The :class:`GraphIO` of an onnx.ModelProto: its I/O shapes, op types and first attention op's head counts."""
    import onnx

    def shape(vi) -> list:
        return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in vi.type.tensor_type.shape.dim]

    io = GraphIO({vi.name: shape(vi) for vi in model.graph.input}, {vi.name: shape(vi) for vi in model.graph.output},
                 {n.op_type for n in model.graph.node})
    for n in model.graph.node:
        if n.op_type in ("GroupQueryAttention", "MultiHeadAttention", "Attention", "PagedAttention"):
            io.attention = AttentionAttrs(n.op_type, **{a.name: onnx.helper.get_attribute_value(a)
                                                        for a in n.attribute
                                                        if a.name in ("num_heads", "kv_num_heads", "q_num_heads")})
            break
    io.windows = gqa_windows(model.graph)
    return io


def gqa_windows(graph) -> dict[int, GqaWindow]:
    """Per layer (its past_key_values.{i}.key input, the 4th input of GroupQueryAttention) the window attributes
    of its GroupQueryAttention: local_window_size (-1: full) and sliding_window_cache (0 unless set)."""
    import onnx

    out: dict[int, GqaWindow] = {}
    for n in graph.node:
        if n.op_type != "GroupQueryAttention" or len(n.input) < 4:
            continue
        m = re.fullmatch(r"past_key_values\.(\d+)\.key", n.input[3])
        if m is None:
            continue
        window = out[int(m.group(1))] = GqaWindow()
        for a in n.attribute:
            if a.name in ("local_window_size", "sliding_window_cache"):
                setattr(window, a.name, int(onnx.helper.get_attribute_value(a)))
    return out


def folder_findings(ef, contract=None, model_config: Any = None) -> list[ConfigFinding] | None:
    """The findings on an opened export folder's genai_config.json; None when its ONNX artifact ships none."""
    entry = ef.entry("onnx")
    if GENAI_CONFIG not in entry.files:
        return None
    path = ef.file("onnx", GENAI_CONFIG)
    try:
        cfg = load_json(Path(path), GENAI_CONFIG)
    except UntrustedInput as e:
        return [ConfigFinding("genai_config.json", str(e))]
    graph = read_graph_io(ef.file("onnx"))
    exp = folder_expected(ef, contract, model_config)
    return findings_for(cfg, graph, exp)


def result_of(findings: list[ConfigFinding] | None):
    """The ``genai-config`` CheckResult of the findings (None: no config shipped, not run)."""
    from mhaexport.verify.figures import GenaiConfigFigures
    from mhaexport.verify.results import CheckResult

    if findings is None:
        return CheckResult(GENAI_CHECK, None, {}, f"not run: the folder ships no {GENAI_CONFIG}")
    errors = [f for f in findings if f.severity == "error"]
    fig = GenaiConfigFigures.of(findings=[{"field": f.field, "message": f.message, "severity": f.severity}
                                          for f in findings], fields=sorted({f.field for f in errors}))
    if not errors:
        return CheckResult(GENAI_CHECK, True, fig, f"{GENAI_CONFIG} describes the file, the model and greedy "
                                                   "decoding")
    more = f" (+{len(errors) - 2} more)" if len(errors) > 2 else ""
    return CheckResult(GENAI_CHECK, False, fig, f"{GENAI_CONFIG}: " + "; ".join(f.line() for f in errors[:2]) + more)


def check_genai_config(runner, ctx):
    """verify's ``genai-config``: one result for the folder (computed once), shown on each runtime that runs its
    ONNX file (eager is the reference and TorchScript has no config: the suite's row, verify/suite.py)."""
    from mhaexport.verify.results import CheckResult

    produce = getattr(ctx, "genai_config", None)
    if produce is None:
        return CheckResult(GENAI_CHECK, None, {}, f"not run: the folder ships no {GENAI_CONFIG}")
    if GENAI_CHECK not in ctx._ref:
        ctx._ref[GENAI_CHECK] = produce()
    return ctx._ref[GENAI_CHECK]


def ships_genai(ef) -> bool:
    """True when the opened folder's ONNX artifact ships a genai_config.json (the manifest hashes it)."""
    return ef.has("onnx") and GENAI_CONFIG in ef.entry("onnx").files


def genai_result(ef, loaded):
    """verify's ``genai-config`` result for an opened folder and its eager model, computed now (while the
    snapshot is open); returned by a callable, as the Context keeps it."""
    try:
        result = result_of(folder_findings(ef, loaded.contract, getattr(loaded.module, "config", None)))
    except ArtifactError as e:  # an unreadable ONNX file: the ONNX runtimes report it, once, as a load failure
        from mhaexport.verify.results import CheckResult

        result = CheckResult(GENAI_CHECK, None, {}, f"not run: {str(e).splitlines()[0]}")
    return lambda: result


def lint_findings(model, file: Path, ef=None) -> list[ConfigFinding] | None:
    """The config on its own (``mhaexport lint``): the genai_config.json beside ``model``'s ``file`` against the graph
    (and, for an opened export folder ``ef``, its manifest's file, cache layout and shipped tokenizer); None when
    there is none (or, beside a bare file, it names another file of the folder)."""
    path = ef.file("onnx", GENAI_CONFIG) if ef is not None and ships_genai(ef) else Path(file).parent / GENAI_CONFIG
    if ef is None and not path.is_file():
        return None
    if ef is not None and not ships_genai(ef):
        return None
    try:
        cfg = load_json(Path(path), GENAI_CONFIG)
    except UntrustedInput as e:
        return [ConfigFinding("genai_config.json", str(e))]
    from mhaexport.runtime.genai_config import GenaiConfig, GenaiDecoder, GenaiModel, section

    top = section(GenaiConfig, cfg)
    cfg_model = section(GenaiModel, top.model) if top is not None else None
    decoder = section(GenaiDecoder, cfg_model.decoder) if cfg_model is not None else None
    named = decoder.filename if decoder is not None else None
    if ef is None and isinstance(named, str) and named != Path(file).name:
        return None  # it describes another file of the folder
    exp = folder_expected(ef) if ef is not None else Expected()
    return findings_for(cfg, graph_io_of(model), exp)
