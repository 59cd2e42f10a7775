"""Weight-only quantization of an ONNX export folder: ``mhaexport quantize DIR -o OUT --weights int4|int8``.

The graph work is ONNX Runtime's own quantizer (``onnxruntime.quantization.MatMulNBitsQuantizer``, round to
nearest, blockwise): every MatMul with a constant weight becomes ``com.microsoft.MatMulNBits`` (4- or 8-bit weights
in blocks of ``block_size`` along K, one float scale per block, accuracy level 4 = int8 activations on CPU), and,
when embeddings are not kept in float, every Gather of a constant table becomes ``GatherBlockQuantized`` (int4).
Around it, mhaexport does three things the quantizer does not:

- **unties the LM head**: a tied head is exported as ``MatMul(h, Transpose(embedding table))``: its weight is not
  a constant initializer, so the quantizer would leave it in float (the largest matrix of a small-vocabulary-
  heavy model such as the ``bench`` preset: 65 MB of its 166 MB read per token). The Transpose of a constant is
  folded into a constant of its own, which the head's MatMul then reads and the quantizer quantizes; the Gather
  keeps the original table (float, or int4 with ``keep_float`` not naming embeddings);
- **chooses precision per layer** by the module scopes torch.onnx records on each node
  (``pkg.torch.onnx.name_scopes``): ``keep_float`` (``embeddings``: the gathered token and position tables,
  ``lm_head``) stays float, and with ``int4`` the first ``int8_blocks`` decoder blocks get 8-bit weights (the first
  block is the most sensitive: measured on the trained default model, see docs/DESIGN.md);
- **writes a normal export folder**: model.onnx (+ genai_config.json), and a manifest whose ONNX artifact records
  the scheme (``quantization``), the source folder with its model.onnx sha256, the weight bytes one decode step
  reads, and the same model record as the source (same fingerprint: verify rebuilds the same eager fp32 model
  as its reference, bench compares the folders as one model).

Nothing here judges quality: ``mhaexport verify`` reads ``quantization`` from the manifest and runs the lossy
checks against eager fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from mhaexport.artifact import ArtifactEntry, ExportFolder, Manifest, OpenFolders, shown_path, stage_artifact
from mhaexport.artifact.details import OnnxDetails, QuantSource, Quantization
from mhaexport.artifact.files import DATA_FILE, ONNX_FILE, external_data_threshold
from mhaexport.core.env import tool_versions
from mhaexport.core.errors import ArtifactError, ConfigError, ExportError, first_line
from mhaexport.exporter.quantize_stream import StoredModel, WeightStore
from mhaexport.exporter.records import Replaced, record_dict
from mhaexport.core.progress import Step
from mhaexport.core.graph import GraphIndex, name_scopes, weights_read
from mhaexport.runtime.genai import GENAI_CONFIG
from mhaexport.runtime.tokenizer import TOKENIZER_FILES

# The weight schemes and their bits per weight. (tests/test_quantize.py plants a too-coarse quantization by
# pointing "int4" at 2 bits here: verify must fail it on quality, whatever the manifest calls it.)
BITS = {"int4": 4, "int8": 8}
WEIGHTS = tuple(BITS)
FLOAT_GROUPS = ("embeddings", "lm_head")  # what keep_float may name
# the block sizes ONNX Runtime's MatMulNBits quantizer takes (MLAS MlasQuantizeBlockwise refuses any other, 512 too)
BLOCK_SIZES = (16, 32, 64, 128, 256)
# The default block per scheme: the fastest that passes verify's quality gate on the trained default model.
# Measured (docs/measurements/fused-2026-12-01.md): int4 on the bench-size Llama's fused export, per-token p50
# against the builder's int4 (blocks of 32) in one run: b32 1.03 x, b64 0.94 x, b128 0.87-0.91 x, b256 0.84-0.87 x
# (b128 and b256 within noise of each other; b128 kept: the finer blocks, the wider gate margin, top-1 0.892 vs
# 0.889); b128 without the int8 first block fails the gate (top-1 0.834 < 0.85). int8 in blocks of 128 fails the
# int8 gate (greedy agreement 13.4 of 32 < 16), in blocks of 32 it passes (23.1): int8 keeps 32.
# Re-measured per recipe in ONNX Runtime's profile of a decode step (docs/measurements/int4-and-export-2026-12-02.md,
# scripts/measure_int4.py): against b128, b32 costs 12-41 % of a step, b64 10-21 %, b256 is within 1-3 %; the builder's
# file (b32) takes 1.02-1.13 x this default's step.
DEFAULT_BLOCK_SIZE = {"int4": 128, "int8": 32}
ACCURACY_LEVELS = (0, 1, 2, 3, 4)  # MatMulNBits: 0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations
# int4's default: the first decoder block in 8 bits. On the trained default model (held-out text) all-int4 agrees
# with eager's top-1 at 0.876 (KL mean 0.055); with block 0 in int8, 0.909 (KL 0.021), for ~5 % more weight bytes
# per token on the bench preset. Keeping any other single block in float moved top-1 by less than 0.01.
# int4's first decoder blocks in 8 bits: the first two, and never every block (a model of n blocks: at most n - 1).
# Measured on the trained default model (4 blocks, blocks of 128): block 0 in int8 top-1 0.892, blocks 0-1 0.913 —
# issue 12's int4 target is top-1 >= 0.90 — and on the bench-size random Llama blocks 0-1 took the relative logit
# error from 0.294 to 0.242, back under the gate's 0.3, for 7 % more bytes (docs/measurements/peer-targets-*.md).
# Their cost in a decode step: 3.4 % (2 threads) to 15.5 % (1 thread); without them the trained model fails the gate
# (text top-1 0.834 < 0.85; docs/measurements/int4-and-export-2026-12-02.md).
DEFAULT_INT8_BLOCKS = {"int4": 2, "int8": 0}
# the smoke run's stand-in of a one-file quantized model: its weights external data inside model.onnx (never published)
SMOKE_FILE = ".smoke.onnx"


# a quantized file's bytes against its float32 source's, at most (int4 with its float embedding table and int8 blocks:
# 0.20 at 8 B, 0.19 at 1.1 B; int8 ~0.27): the room quantize asks beside the reader's snapshot
OUTPUT_FRACTION = {"int4": 0.3, "int8": 0.4}


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize. ``int8_blocks`` None means the scheme's default (int4: the first 2 blocks, at most all but
    one: :meth:`check_model` resolves it for a model; int8: 0)."""

    weights: str = "int4"  # "int4" | "int8"
    block_size: int | None = None  # weights per scale, along K: one of BLOCK_SIZES; None: the scheme's default
    symmetric: bool = True  # no zero points (int4: values -8..7 times the block's scale)
    accuracy_level: int = 4  # MatMulNBits' compute type on CPU: 4 = int8 activations (fastest: 0/1 = float, 4-5 x)
    keep_float: tuple[str, ...] = ("embeddings",)  # gathered tables stay float: a decode step reads one row
    int8_blocks: int | None = None  # int4: the first N decoder blocks get 8-bit weights

    def __post_init__(self) -> None:
        """A QuantConfig is checked when it is made (ConfigError naming the bad field and what is valid): a request
        is checked once, before any work, and the functions that take one trust it."""
        if self.block_size is None and self.weights in DEFAULT_BLOCK_SIZE:
            object.__setattr__(self, "block_size", DEFAULT_BLOCK_SIZE[self.weights])
        if isinstance(self.keep_float, list):
            object.__setattr__(self, "keep_float", tuple(self.keep_float))
        self._check()

    @property
    def bits(self) -> int:
        return BITS[self.weights]

    @property
    def first_int8_blocks(self) -> int:
        return DEFAULT_INT8_BLOCKS[self.weights] if self.int8_blocks is None else self.int8_blocks

    def check(self) -> QuantConfig:
        """The config itself (it was checked when it was made)."""
        return self

    def _check(self) -> None:
        if self.weights not in BITS:
            raise ConfigError(f"--weights {self.weights!r}: expected one of {', '.join(WEIGHTS)}")
        bs = self.block_size
        if not isinstance(bs, int) or bs not in BLOCK_SIZES:
            raise ConfigError(f"--block-size {bs}: ONNX Runtime's MatMulNBits takes only "
                              f"{', '.join(map(str, BLOCK_SIZES))}")
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise ConfigError(f"--accuracy-level {self.accuracy_level}: one of {', '.join(map(str, ACCURACY_LEVELS))}"
                              " (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8)")
        bad = [g for g in self.keep_float if g not in FLOAT_GROUPS]
        if bad:
            raise ConfigError(f"--keep-float {','.join(bad)}: expected a comma list of {', '.join(FLOAT_GROUPS)}, "
                              "or none")
        if self.int8_blocks is not None and self.int8_blocks < 0:
            raise ConfigError(f"--int8-blocks {self.int8_blocks}: a count of decoder blocks, >= 0")
        if self.int8_blocks is not None and self.weights != "int4":
            raise ConfigError(f"--int8-blocks {self.int8_blocks} applies to --weights int4 (it puts the first blocks "
                              f"in 8 bits); with --weights {self.weights} every block already is")

    def check_model(self, n_layers: int) -> QuantConfig:
        """``int8_blocks`` within the model's ``n_layers`` decoder blocks (ConfigError). Returns
        the config for that model: the default ``int8_blocks`` resolved (int4: 2, at most n_layers - 1)."""
        if self.int8_blocks is not None and self.int8_blocks > n_layers:
            raise ConfigError(f"--int8-blocks {self.int8_blocks}: the model has {n_layers} decoder block(s)")
        if self.int8_blocks is None and self.weights == "int4":
            return dataclasses.replace(self, int8_blocks=min(DEFAULT_INT8_BLOCKS["int4"], max(n_layers - 1, 0)))
        return self

    def label(self) -> str:
        """"int4 b32 sym acc4 (block 0 int8; float: embeddings)"."""
        extra = []
        if self.weights == "int4" and self.first_int8_blocks:
            n = self.first_int8_blocks
            extra.append("block 0 int8" if n == 1 else f"blocks 0-{n - 1} int8")
        extra.append(f"float: {', '.join(self.keep_float) or 'none'}")
        return (f"{self.weights} b{self.block_size} {'sym' if self.symmetric else 'asym'} acc{self.accuracy_level} "
                f"({'; '.join(extra)})")


@dataclass
class QuantizeRecord:
    """What ``quantize_folder`` wrote (returned to the CLI, which decides what to show)."""

    folder: Path
    files: list[str]
    seconds: float
    quantization: Quantization
    warnings: list[str] = field(default_factory=list)
    manifest: Manifest | None = None  # the folder's manifest as published
    replaced: Replaced | None = None  # the other model the folder held (``replace``), else None
    artifact: str = "onnx"

    def to_dict(self) -> dict:
        """The record for scripts (``--json``): :func:`mhaexport.exporter.records.record_dict`."""
        return record_dict(self)


# ---- reading the graph -----------------------------------------------------------------------------------------

def block_index(node: onnx.NodeProto) -> int | None:
    """The decoder block a node belongs to, from its module scopes: 'blocks.3' (or 'model.layers.3') -> 3."""
    for scope in name_scopes(node):
        if m := re.search(r"(?:^|\.)(\d+)$", scope):
            return int(m.group(1))
    return None


def lm_head_node(model: onnx.ModelProto) -> onnx.NodeProto | None:
    """The MatMul that computes ``logits`` (walking back from the output through Add / Reshape / Cast / Identity)."""
    g = GraphIndex(model.graph)
    name = next((o.name for o in model.graph.output if o.name == "logits"), None)
    seen = 0
    while name in g.producer and seen < 8:
        node = g.producer[name]
        if node.op_type in ("MatMul", "MatMulNBits"):
            return node
        if node.op_type not in ("Add", "Reshape", "Cast", "Identity"):
            return None
        name = next((i for i in node.input if i and i not in g.initializers), None)
        seen += 1
    return None


def untie_lm_head(model: onnx.ModelProto, fold: Callable | None = None) -> list[str]:
    """Fold each Transpose of a constant that feeds a MatMul's weight into a constant of its own, so the MatMul's
    weight is an initializer (a tied LM head reads Transpose(embedding table)). Nodes without a name get one (the
    quantizer selects nodes by name). ``fold(value, perm, name)``: the folded tensor made elsewhere (a streamed run's
    :meth:`~mhaexport.exporter.quantize_stream.WeightStore.fold_transposed`; None: folded here, in memory). Returns
    the MatMuls whose weight was folded."""
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    ir_model = ir.serde.deserialize_model(model)
    g = ir_model.graph
    for i, node in enumerate(g):
        if not node.name:
            node.name = f"mhaexport_{node.op_type}_{i}"
    untied = []
    for node in list(g):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        src = node.inputs[0]
        if src is None or src.const_value is None:
            continue
        out = node.outputs[0]
        users = [(u.node, u.idx) for u in out.uses()]
        if not users or not all(n.op_type == "MatMul" and idx == 1 for n, idx in users):
            continue
        perm = node.attributes.get("perm")
        perm = perm.as_ints() if perm is not None else None
        name = f"{src.name}.untied"
        tensor = fold(src, perm, name) if fold is not None else None
        if tensor is None:
            tensor = ir.tensor(np.ascontiguousarray(np.transpose(src.const_value.numpy(), perm)), name=name)
        value = ir.val(name, const_value=tensor)
        g.register_initializer(value)
        out.replace_all_uses_with(value)
        untied += [n.name for n, _ in users]
    RemoveUnusedNodesPass()(ir_model)
    rewritten = ir.serde.serialize_model(ir_model)
    model.CopyFrom(rewritten)
    return untied


def _op_key(n: onnx.NodeProto) -> str:
    bits = next((a.i for a in n.attribute if a.name == "bits"), 4 if n.op_type == "GatherBlockQuantized" else None)
    return f"{n.op_type}/{bits}" if bits is not None else n.op_type


def quantized_nodes(model: onnx.ModelProto) -> dict[str, int]:
    """How many weight nodes ended in each form: 'MatMulNBits/4', 'MatMulNBits/8', 'GatherBlockQuantized/4', and the
    float ones left: 'MatMul (float weight)', 'Gather (float table)'."""
    inits = {i.name for i in model.graph.initializer}
    c: Counter[str] = Counter()
    for n in model.graph.node:
        if n.op_type in ("MatMulNBits", "GatherBlockQuantized"):
            c[_op_key(n)] += 1
        elif n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits:
            c["MatMul (float weight)"] += 1
        elif n.op_type == "Gather" and n.input[0] in inits:
            c["Gather (float table)"] += 1
    return dict(sorted(c.items()))


# ---- quantizing --------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quantizer_logs() -> Iterator[list[str]]:
    """Collect onnxruntime.quantization's log warnings instead of letting them reach the terminal."""
    caught: list[str] = []

    class _ToList(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            caught.append(record.getMessage())

    loggers = [logging.getLogger(n) for n in ("onnxruntime.quantization.matmul_nbits_quantizer",
                                              "onnxruntime.quantization", "onnxruntime")]
    handler = _ToList(level=logging.WARNING)
    saved = [(lg.propagate, lg.level, list(lg.handlers)) for lg in loggers]
    for lg in loggers:
        for h in list(lg.handlers):
            lg.removeHandler(h)
        lg.addHandler(handler)
        lg.propagate = False
    try:
        yield caught
    finally:
        for lg, (prop, level, handlers) in zip(loggers, saved):
            lg.removeHandler(handler)
            for h in handlers:
                lg.addHandler(h)
            lg.propagate, lg.level = prop, level


def _quantizer_class():
    """onnxruntime's MatMulNBitsQuantizer, imported without the side effect of its module: it calls
    ``logging.basicConfig(level=INFO)``, which would make every library's INFO log print to the terminal."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
    return MatMulNBitsQuantizer


def block_for(k: int, block: int) -> int:
    """The block of a weight whose quantized axis holds ``k`` values: ``block``, or where ``k`` is smaller the largest
    block MatMulNBits takes that fits (a block longer than the axis is padded: the tiny preset's 64-wide layers in
    blocks of 128 read 1.9 x the bytes of blocks of 64)."""
    fits = [b for b in BLOCK_SIZES if b <= k] or [min(BLOCK_SIZES)]
    return block if k >= block else max(fits)


def _run_pass(model: onnx.ModelProto, bits: int, cfg: QuantConfig, names: set[str], sizes: dict[str, int],
              ops: tuple[str, ...], store: WeightStore | None = None) -> onnx.ModelProto:
    """ORT's quantizer on the nodes ``names`` (MatMuls, and Gathers where ``ops`` has them) at ``bits``, once per
    block size :func:`block_for` gives them (``sizes``: each weight node's length along its quantized axis);
    ``store``: the weights one at a time (:mod:`mhaexport.exporter.quantize_stream`)."""
    groups: dict[int, set[str]] = {}
    for name in names:
        groups.setdefault(block_for(sizes[name], cfg.block_size), set()).add(name)
    for block, group in sorted(groups.items()):
        model = _run_quantizer(model, bits, dataclasses.replace(cfg, block_size=block),
                               sorted(set(sizes) - group), ops, store)
    return model


def _run_quantizer(model: onnx.ModelProto, bits: int, cfg: QuantConfig, exclude: list[str],
                   ops: tuple[str, ...], store: WeightStore | None = None) -> onnx.ModelProto:
    q = _quantizer_class()(model, bits=bits, block_size=cfg.block_size, is_symmetric=cfg.symmetric,
                             accuracy_level=cfg.accuracy_level or None, nodes_to_exclude=exclude,
                             op_types_to_quantize=ops, quant_axes=(("MatMul", 0), ("Gather", 1)))
    if store is not None:  # each node's weight read in before it is quantized, what it makes spilled after
        q.node_quantizer = store.feeding(q.node_quantizer)
    q.process()
    return q.model.model


def quantize_model(model: onnx.ModelProto, cfg: QuantConfig, store: WeightStore | None = None
                   ) -> tuple[onnx.ModelProto, dict, list[str]]:
    """Quantize ``model`` (a float ONNX decoder) as ``cfg`` says: untie the LM head, then ORT's quantizer once for
    the 8-bit layers and once for the 4-bit ones. Returns the model, what was done (for the manifest) and warnings.
    ``store``: ``model``'s large weights are held there, not in the message, and are read one at a time (the
    result's too: :class:`~mhaexport.exporter.quantize_stream.WeightStore`); None: every weight in the message."""
    warns: list[str] = []
    untied = untie_lm_head(model, store.fold_transposed if store is not None else None)
    inits = {i.name for i in model.graph.initializer}
    weight_mm = [n for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in inits]
    tables = [n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits]
    head = lm_head_node(model)
    head_name = head.name if head is not None and head.op_type == "MatMul" else None
    float_names = set()
    if "lm_head" in cfg.keep_float and head_name:
        float_names.add(head_name)
    keep_tables = "embeddings" in cfg.keep_float or cfg.bits != 4
    if "embeddings" not in cfg.keep_float and cfg.bits != 4:
        warns.append(f"embeddings stay float with --weights {cfg.weights}: ONNX Runtime quantizes gathered tables "
                     "to 4 bits only (GatherBlockQuantized)")
    eight: set[str] = set()
    if cfg.bits == 8:
        eight = {n.name for n in weight_mm if n.name not in float_names}
    elif cfg.first_int8_blocks:
        blocks = {n.name: block_index(n) for n in weight_mm}
        if all(b is None for b in blocks.values()):
            warns.append(f"--int8-blocks {cfg.first_int8_blocks}: no node carries a decoder block in its module "
                         "scopes; every layer is int4")
        eight = {name for name, b in blocks.items()
                 if b is not None and b < cfg.first_int8_blocks and name not in float_names}
    rest = {n.name for n in weight_mm if n.name not in float_names and n.name not in eight}
    shapes = {i.name: tuple(i.dims) for i in model.graph.initializer}
    # each weight node's length along its quantized axis: K of a MatMul's (K, N) weight, a gathered row's width
    sizes = {n.name: shapes[n.input[1]][0] for n in weight_mm}
    sizes.update({n.name: shapes[n.input[0]][-1] for n in tables})
    with _quantizer_logs() as logs:
        if eight:
            model = _run_pass(model, 8, cfg, eight, sizes, ("MatMul",), store)
        if rest or not keep_tables:
            ops = ("MatMul",) if keep_tables else ("MatMul", "Gather")
            model = _run_pass(model, cfg.bits, cfg, rest | (set() if keep_tables else {n.name for n in tables}),
                              sizes, ops, store)
    warns += [w for w in logs if "opset" not in w]  # the int4-type opset bump is expected and checked below
    done = {
        **dataclasses.asdict(cfg), "keep_float": list(cfg.keep_float),
        "int8_blocks": cfg.first_int8_blocks if cfg.weights == "int4" else None, "bits": cfg.bits, "label": cfg.label(),
        "method": "round to nearest, blockwise (onnxruntime.quantization.MatMulNBitsQuantizer)",
        "lm_head": ("kept float" if head_name in float_names else
                    f"untied and quantized ({'int8' if head_name in eight else cfg.weights})" if head_name in untied
                    else f"quantized ({'int8' if head_name in eight else cfg.weights})") if head_name else "not found",
        "nodes": quantized_nodes(model),
    }
    return model, done, warns


def _smoke_run(path: Path, contract) -> None:
    """Load the quantized file in ONNX Runtime CPU, its external data memory-mapped (no packed copies), and run it
    once (finite logits), or ExportError."""
    from mhaexport.core import iospec
    from mhaexport.runners.registry import graph_runner
    from mhaexport.runtime.feed import Feed

    runner = graph_runner("quantized", contract, str(path), Feed.contract(contract.n_layers),  # the contract's calls
                          mapped=True)
    try:
        ids, mask, past = iospec.dummy_inputs(contract, 1, 2, 1, seed=0)
        logits = runner.activate().run(ids, mask, past)[0]
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
        raise ExportError(f"ONNX Runtime cannot run the quantized model: {first_line(e)}") from None
    finally:
        runner.deactivate()
    if not np.isfinite(logits).all():
        raise ExportError("the quantized model computes non-finite logits")


def load_with_data(path: Path) -> onnx.ModelProto:
    """The ONNX file with its external data read into the tensors. Not ``onnx.load``: its loader refuses a data
    file with more than one hard link ("a potential hardlink attack"), which an adopted folder's files may have (they
    hard-link the producer's); the data file named by each tensor must lie beside the model file."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    path = Path(path)
    try:  # a file whose hashes match its manifest can still be no model (re-hashed after it was broken)
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, onnx's own, OSError
        raise ArtifactError(f"{shown_path(path)} is not a readable ONNX model: {type(e).__name__}: {e}") from None
    if not model.graph.node:
        raise ArtifactError(f"{shown_path(path)} is not a readable ONNX model: it holds no graph")
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = ExternalDataInfo(t)
        if Path(info.location).name != info.location:
            raise ArtifactError(f"{shown_path(path)}: tensor {t.name} names external data {info.location!r} outside "
                                "the model's folder")
        with open(path.parent / info.location, "rb") as f:
            f.seek(int(info.offset or 0))
            t.raw_data = f.read(int(info.length)) if info.length else f.read()
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]
    return model


def reproduce(ef: ExportFolder) -> tuple[StoredModel | None, StoredModel | None, str]:
    """Re-run the quantize recipe ``ef``'s manifest records on the float source it records: (the shipped model, the
    rebuilt one, a note on the versions). When the recipe cannot be re-run the rebuilt model is None and the note
    says why (another tool quantized the file; the source folder gone; its file not the one quantized, by sha256):
    the shipped model then goes to the check against the reference model's weights. Both models are
    :class:`~mhaexport.exporter.quantize_stream.StoredModel` objects: graphs whose large tensors stay in their files
    (the rebuilt one's in a staging file, quantized one weight at a time), each read when compared."""
    entry = ef.entry("onnx")
    q = entry.details.quantization
    if q is None:
        return None, None, "not quantized"
    shipped = StoredModel.of(ef.file("onnx"))
    if not isinstance(q.source, QuantSource) or not q.source.folder:
        return shipped, None, f"quantized by another tool ({q.source or 'no recipe recorded'}): no recipe to re-run"
    src_dir = (ef.path / q.source.folder).resolve()
    try:
        src = ExportFolder.open(src_dir, "onnx")
    except ArtifactError as e:
        return shipped, None, f"its float source {src_dir} cannot be read ({e})"
    with src:
        s_entry = src.entry("onnx")
        if s_entry.files[s_entry.file]["sha256"] != q.source.onnx_sha256:
            return shipped, None, (f"its float source {src_dir} holds another model.onnx than the one quantized "
                                   f"(sha256 {s_entry.files[s_entry.file]['sha256'][:12]}…, recorded "
                                   f"{str(q.source.onnx_sha256)[:12]}…)")
        cfg = QuantConfig(weights=q.weights or "int4", block_size=q.block_size or 32,
                          symmetric=bool(q.symmetric) if q.symmetric is not None else True,
                          accuracy_level=q.accuracy_level if q.accuracy_level is not None else 4,
                          keep_float=tuple(q.keep_float or ()), int8_blocks=q.int8_blocks)
        cfg = cfg.check_model(src.contract.n_layers)  # a default left unrecorded resolved as quantize resolves it
        store = WeightStore()
        rebuilt, _, _ = quantize_model(store.source(src.file("onnx")), cfg, store)
        rebuilt = StoredModel(rebuilt, store)
    here = tool_versions().get("onnxruntime")
    note = "" if q.onnxruntime in (None, here) else (f"quantized with onnxruntime {q.onnxruntime}, re-run with "
                                                     f"{here}")
    return shipped, rebuilt, note


def quantize_folder(folder: str | Path | ExportFolder, out_dir: str | Path, cfg: QuantConfig = QuantConfig(),
                    progress: Callable[[str], None] | None = None) -> QuantizeRecord:
    """Quantize ``folder``'s float32 ONNX export into ``out_dir`` (a new export folder of the same model). ``folder``:
    a path (opened here, its snapshot removed when done) or an opened ExportFolder (used as it is).

    ArtifactError: no ONNX export, a hash mismatch, ``out_dir`` is ``folder``; ExportError: the source is already
    quantized or not float32, or ONNX Runtime cannot run the result; ConfigError: ``cfg`` against the model."""
    if not isinstance(folder, ExportFolder):
        # what follows the snapshot on its file system: the spilled quantized weights and the file written from them
        with ExportFolder.open(folder, "onnx", then_writes=2 * OUTPUT_FRACTION[cfg.weights]) as src:
            return quantize_folder(src, out_dir, cfg, progress)
    say = progress or (lambda _m: None)
    started = time.perf_counter()
    src = folder
    cfg = cfg.check_model(src.contract.n_layers)  # src.contract: ArtifactError for a block on its own (--module)
    out = Path(out_dir)
    if out.resolve() == src.path.resolve():
        raise ArtifactError(f"-o {out} is the source folder: write the quantized export to another folder (the float "
                            "export stays the reference bench and verify compare it with)")
    entry = src.entry("onnx")
    if not isinstance(entry.details, OnnxDetails):
        raise ArtifactError(f"{src.path}: its onnx entry holds {entry.format} details")
    if entry.details.quantization:
        raise ExportError(f"{src.path} is already quantized ({entry.details.quantization.label}): quantize "
                          "the float export it was made from")
    if entry.dtype != "float32":
        raise ExportError(f"{src.path} holds a {entry.dtype} export: quantize reads float32 exports")
    say(Step(f"reading {shown_path(src.file('onnx'))}'s graph (its weights stay in the file) ...", 0, 3))
    with WeightStore() as store:
        model = store.source(src.file("onnx"))
        source_read = weights_read(model)
        say(Step(f"quantizing ({cfg.label()}) with onnxruntime's MatMulNBitsQuantizer, one weight at a time ...", 1, 3))
        model, done, warns = quantize_model(model, cfg, store)
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
        done.update(weights_read=weights_read(model),
                    source={"folder": os.path.relpath(src.path.resolve(), out.resolve()),
                            "onnx_sha256": entry.files[entry.file]["sha256"], "fingerprint": src.model.fingerprint,
                            "weights_read": source_read, "weight_bytes": entry.details.weight_bytes},
                    onnxruntime=tool_versions().get("onnxruntime"))
        size = store.inline_bytes(model)  # what the message would hold with every weight inside it
        with stage_artifact(out, "onnx", purpose="quantize onnx", expected_bytes=size) as staged:
            # as the export decides: external data above the threshold; each tensor written from the store
            external = size > external_data_threshold()
            smoke = staged.dir / (ONNX_FILE if external else SMOKE_FILE)  # its weights memory-mapped, either way
            files = store.write(model, staged.dir / ONNX_FILE, external=external, data_file=DATA_FILE,
                                stand_in=None if external else smoke)
            del model
            store.close()  # the float source's descriptors and the staging file: done with
            say(Step("checking that ONNX Runtime runs it ...", 2, 3))
            try:
                _smoke_run(smoke, src.contract)
            finally:
                if smoke.name == SMOKE_FILE:
                    smoke.unlink(missing_ok=True)
            for name in (GENAI_CONFIG, *TOKENIZER_FILES):  # an --hf export's tokenizer travels with the model
                if name in entry.files:
                    shutil.copyfile(src.file("onnx", name), staged.dir / name)
                    files.append(name)
            made_by = f"mhaexport quantize from {entry.details.exporter or 'an ONNX export'}"
            details = dataclasses.replace(entry.details, opset=opset, quantization=Quantization.from_dict(done),
                                          external_data=DATA_FILE in files, weight_bytes=size, exporter=made_by)
            new = ArtifactEntry(format="onnx", file=ONNX_FILE, dtype=entry.dtype, io=entry.io,
                                seq_dynamic=entry.seq_dynamic, static_sizes=entry.static_sizes,
                                versions=tool_versions(), export_seconds=round(time.perf_counter() - started, 3),
                                warnings=list(warns), details=details)
            manifest = staged.publish(src.model.relocated(src.path, out), new, files,
                                      owned=(GENAI_CONFIG, DATA_FILE, *TOKENIZER_FILES))
    return QuantizeRecord(out, files, time.perf_counter() - started, details.quantization, warns, manifest)


def export_quantized(folder: str | Path | ExportFolder, schemes: list[str] | list[QuantConfig], out_dir: str | Path,
                     have: tuple[str, ...] | list[str] = (), progress: Callable[[str], None] | None = None,
                     reads: OpenFolders | None = None) -> list[Path]:
    """For `mhaexport bench --quantize int4,int8`: the export folder holding each scheme (a name: default settings) of
    ``folder``'s model — one of ``have`` when it already does, else out_dir/quantized/SCHEME, quantized there unless a
    hash-checked quantization of the same model and settings is already there. Returns them in ``schemes``' order.
    ``reads``: the command's :class:`~mhaexport.artifact.OpenFolders` (each folder opened once; it closes them)."""
    from mhaexport.artifact import same_model_folders

    say = progress or (lambda _m: None)
    configs = [s if isinstance(s, QuantConfig) else QuantConfig(weights=s) for s in schemes]  # checked when made
    with OpenFolders() as own:
        reads = reads or own
        src = reads.open(folder)
        known: dict[str, Path] = {}
        for other, m in same_model_folders(src.path, src, have, reads):
            q = m.artifacts["onnx"].details.quantization
            if q and q.label:
                known.setdefault(q.label, other)
        out = []
        for cfg in configs:
            if cfg.label() in known:
                out.append(known[cfg.label()])
                continue
            sub = Path(out_dir) / "quantized" / cfg.weights
            def same(m, label=cfg.label()) -> bool:  # another model or scheme: quantized anew below
                q = m.artifacts["onnx"].details.quantization
                return m.model.fingerprint == src.model.fingerprint and bool(q) and q.label == label

            if reads.reusable(sub, same):
                say(f"reusing {sub} ({cfg.label()})")
                out.append(sub)
                continue
            say(f"quantizing {cfg.label()} -> {sub} ...")
            quantize_folder(src, sub, cfg)
            out.append(sub)
    return out
