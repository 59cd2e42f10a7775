"""Adopt an ONNX decoder exported by another tool (onnxruntime-genai's model builder, Optimum, a plain
torch.onnx.export) into an export folder, so verify, generate and bench run on it as on mhaexport's own exports.

The folder hard-links the foreign file (and its external data, genai_config.json and tokenizer) instead of copying
it where the file system allows (a builder's file may hold gigabytes), and copies it elsewhere; never a symlink. Its manifest records the model the file claims to be (``--hf``,
``--model``, ``--config``: the eager reference, as for an export), the file's hashes (a file rebuilt since is
refused like any altered export), the file's :class:`~mhaexport.runtime.foreign.Layout` under ``details.layout``
(the names that stand for the contract's I/O) and its producer's cache and padding protocol where every ONNX entry
keeps its own (``kv_cache``, ``max_cache``, ``padding``): :class:`~mhaexport.runtime.feed.Feed` reads them back.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import onnx

from mhaexport.core import iospec
from mhaexport.artifact import stage_artifact
from mhaexport.artifact.details import CacheLayout, OnnxDetails, Quantization, WeightsRead
from mhaexport.artifact.files import refuse_link
from mhaexport.core.libraries import library_call
from mhaexport.core.errors import ArtifactError, UnsafeFolder
from mhaexport.exporter.common import ExportRecord, finish, previous_model
from mhaexport.core.graph import weights_read
from mhaexport.models.loading import LoadedModel
from mhaexport.runtime.foreign import GENAI_CONFIG, Layout, detect_layout
from mhaexport.runtime.tokenizer import tokenizer_files
from mhaexport.runners.wire import read_graph

ADOPTED_DIR = "mhaexport"  # default folder of an adoption: beside the file, FILE's folder / ADOPTED_DIR
# com.microsoft / ONNX ops whose presence makes a graph's weights quantized (lossy): name -> what they hold
QUANT_OPS = {"MatMulNBits": "int{bits} blocks of {block_size}", "GatherBlockQuantized": "int{bits} embedding",
             "DynamicQuantizeMatMul": "int8", "MatMulInteger": "int8", "QLinearMatMul": "int8",
             "DequantizeLinear": "quantized constants"}


def default_folder(path: str | Path) -> Path:
    """Where ``verify FILE.onnx`` adopts FILE by default: a folder beside it."""
    return Path(path).resolve().parent / ADOPTED_DIR


def _external_files(path: Path) -> list[str]:
    """The external-data files the graph references (relative to its folder), in first-reference order."""
    with library_call("onnx", path):  # another tool's file: its parse failure is the file's
        model = read_graph(path)[0]
    found: list[str] = []

    def tensors():
        yield from model.graph.initializer
        for node in model.graph.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    yield attr.t

    for t in tensors():
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in t.external_data if e.key == "location"), None)
            if loc and loc not in found:
                found.append(loc)
    for loc in found:
        if Path(loc).is_absolute() or ".." in Path(loc).parts or not (path.parent / loc).is_file():
            raise ArtifactError(f"{path}: its external data {loc!r} is not a file beside it")
    return found


def quantization_of(path: Path) -> Quantization | None:
    """What makes the graph's weights lossy, from its ops (None: none of :data:`QUANT_OPS`), as mhaexport's own
    quantization record says it: the scheme (``weights``: int4 / int8, from the first quantized MatMul's bits),
    ``block_size`` and ``accuracy_level`` (4: int8 activations, which verify's self-comparisons allow for), a
    label, the op counts and the weight bytes a decode step reads (``weights_read``, as quantize records its own).
    verify then judges the file by quality against eager fp32, not exact parity."""
    with library_call("onnx", path):  # another tool's file: its parse failure is the file's
        model = read_graph(path)[0]
    counts: dict[str, int] = {}
    op, attrs = None, {}  # the first quantized MatMul and its attributes
    for node in model.graph.node:
        if node.op_type in QUANT_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
            if op is None and node.op_type in ("MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul",
                                               "QLinearMatMul"):
                op = node.op_type
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if not counts:
        return None
    bits = int(attrs["bits"]) if "bits" in attrs else 4 if op in (None, "MatMulNBits") else 8
    # weights_read: bench's bytes per token (packed weights, scales, zero points)
    q = Quantization(weights=f"int{bits}", ops=counts, source="the graph's quantized ops (adopted file)",
                     weights_read=WeightsRead(**weights_read(model)))
    if op == "MatMulNBits":
        q.block_size, q.accuracy_level = int(attrs.get("block_size", 0)), int(attrs.get("accuracy_level", 0))
    q.label = QUANT_OPS.get(op or "", "quantized").format(bits=bits, block_size="?" if q.block_size is None
                                                          else q.block_size)
    return q


def _check_sizes(layout: Layout, loaded: LoadedModel, path: Path) -> list[str]:
    """The file must be an export of the model it is verified against: its layers, KV heads, head size and
    vocabulary are the model's. Fills what the file leaves unsaid from the model's contract; returns notes."""
    c = loaded.contract
    notes = []
    if not layout.head_dim:
        layout.head_dim = c.head_dim
        notes.append("head size not stated by the file: taken from the model")
    if not layout.n_kv_heads:
        layout.n_kv_heads = c.n_kv_heads
        notes.append("key/value heads not stated by the file: taken from the model")
    if not layout.vocab_size:
        layout.vocab_size = c.vocab_size
    if not layout.n_heads:  # the cache shows key/value heads only; the query heads are the model's
        layout.n_heads = c.n_heads
    theirs = {"layers": layout.n_layers, "key/value heads": layout.n_kv_heads, "head size": layout.head_dim,
              "vocabulary": layout.vocab_size, "query heads": layout.n_heads}
    ours = {"layers": c.n_layers, "key/value heads": c.n_kv_heads, "head size": c.head_dim,
            "vocabulary": c.vocab_size, "query heads": c.n_heads}
    off = [f"{k} {theirs[k]} (the model: {ours[k]})" for k in theirs if theirs[k] != ours[k]]
    if off:
        raise ArtifactError(f"{path} is not an export of {loaded.label}: the file has {', '.join(off)}")
    if layout.max_positions and layout.max_positions != c.max_positions:
        notes.append(f"the producer's context length is {layout.max_positions}, the model's max_positions "
                     f"{c.max_positions}: verify uses the smaller")
    layout.max_positions = min(layout.max_positions or c.max_positions, c.max_positions)
    return notes


def _link_or_copy(src: Path, dst: Path) -> None:
    """``dst`` as a hard link of ``src`` (free on the same file system: a builder's file may hold gigabytes), else a
    copy — never a symlink: a folder's files are its own, and readers refuse a symlink (docs/DESIGN.md, "Folders from
    elsewhere"). Readers copy what they hash, so sharing the inode cannot change what they judge."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def adopt_onnx(loaded: LoadedModel, path: str | Path, out_dir: str | Path | None = None, *,
               replace: bool = False) -> ExportRecord:
    """Record the ONNX file ``path`` (made by another tool) in ``out_dir`` (default :func:`default_folder`) as the
    ONNX artifact of ``loaded``: hard links to (or copies of) the file and its companions, its layout and hashes in
    the manifest.

    ArtifactError (one line) when the file cannot be mapped onto the contract or is not an export of ``loaded``
    (another number of layers, heads, head size or vocabulary). UnsafeFolder when the folder is a symlink; an
    ArtifactError when it holds another model's export, unless ``replace`` (a folder mhaexport manages itself, as
    the peer comparison's builder folders)."""
    started = time.perf_counter()
    path = Path(path).resolve()
    if path.suffix != ".onnx" or not path.is_file():
        raise ArtifactError(f"{path} is not an ONNX file (*.onnx)")
    out = refuse_link(Path(out_dir) if out_dir is not None else default_folder(path), "the adopted folder")
    out = out.resolve()  # a real folder (never written through a link into another export)
    if out == path.parent:
        raise ArtifactError(f"-o {out}: the adopted folder links to the file's, so it must be another folder "
                            f"(default: {default_folder(path)})")
    prev = previous_model(out)  # nor over another model's export: adoption replaces nothing
    if prev is not None and not replace and (prev.fingerprint != loaded.fingerprint or prev.module):
        raise ArtifactError(f"{out} holds {prev.what}, {prev.spec} (fingerprint {prev.fingerprint}); adopting "
                            f"{path.name} as {loaded.spec} (fingerprint {loaded.fingerprint}) there would replace "
                            "it: refused (give -o DIR, another folder)")
    layout, cache = detect_layout(path, max_positions=loaded.contract.max_positions)
    notes = _check_sizes(layout, loaded, path) + list(layout.notes)
    names = [path.name] + _external_files(path)
    if (path.parent / GENAI_CONFIG).is_file():
        names.append(GENAI_CONFIG)  # onnxruntime-genai reads the folder as its producer wrote it
    names += [p.name for p in tokenizer_files(path.parent) if p.name not in names]
    for name in names[1:]:  # the companions the file's folder supplies: read there, never through a link
        if (path.parent / name).is_symlink():
            raise UnsafeFolder(f"{path.parent / name} is a symlink; mhaexport adopts the files beside {path.name} only "
                               "when they are in that folder, never through a link: refused")
    quant = quantization_of(path)
    details = OnnxDetails(
        producer=layout.producer, adopted_from=str(path), layout=layout,
        # a shared buffer's slots: the producer's context length, at most the model's (_check_sizes)
        cache=CacheLayout(cache.kind, layout.max_positions if cache.shared else None, cache.padding),
        attention="as exported", quantization=quant,
        opset=next((o.version for o in read_graph(path)[0].opset_import
                    if o.domain in ("", "ai.onnx")), None),
        dynamic_axes=[iospec.BATCH, iospec.SEQ, iospec.PAST, iospec.TOTAL],
        exporter=f"{layout.producer} (adopted by mhaexport: not exported here)",
    )
    with stage_artifact(out, "onnx", purpose=f"adopt {path.name}") as staged:
        for name in names:
            _link_or_copy(path.parent / name, staged.dir / name)
        return finish(loaded, staged, fmt="onnx", main_file=path.name, files=names, dtype=layout.dtype,
                      details=details, started=started, warns=notes, seq_dynamic=True)

