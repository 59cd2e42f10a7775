"""Weights that never sit whole in memory: the built-in decoder's seeded weights drawn one tensor at a time, written
to a safetensors file as they are drawn, and a model whose parameters are that file memory-mapped (file-backed pages
the kernel reads on use and may drop again under a memory cap — nothing is copied into anonymous memory).

- :func:`param_specs` — every state-dict entry's name, shape and dtype, from a model built on the meta device (no
  weights allocated);
- :func:`seeded_tensors` — the same numbers :meth:`DecoderLM.reset_parameters` draws, in its draw order, one tensor at
  a time (tied embeddings: the LM head's draw is made and dropped, as there);
- :func:`write_safetensors` — a safetensors-layout file from any (name, tensor) stream (mhaexport's own staging and
  cache files: page-aligned with gaps and a tied head's two names on one copy, which the ``safetensors`` library and
  ``torch.load`` refuse — never offered to users as a checkpoint): the header from the specs first, each
  tensor written at its offset as it arrives, then dropped (peak: the largest tensor);
- :func:`mmap_state` / :func:`mmap_model` — a state dict of read-only tensors over the file's pages, and a
  :class:`DecoderLM` whose parameters are those tensors (built on meta, loaded with ``assign``);
- :func:`streamed_sha256` — :func:`mhaexport.models.loading.weights_sha256` of such a state without materialising it;
- :func:`staging_file` / :func:`restaged` — any (name, tensor) stream staged in an unlinked file and mapped; a model
  over such a file converted to another dtype the same way (``--dtype float16`` of a streamed export).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import hmac
import json
import mmap
import os
import struct
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
from torch import nn

from mhaexport.models.config import DecoderConfig
from mhaexport.models.decoder import DecoderLM

# safetensors' dtype names (its format spec)
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}
_TORCH_DTYPES = {v: k for k, v in _ST_DTYPES.items()}
ALIGN = 4096  # each tensor's data starts on a page: a memory map of one tensor never shares a page with another


def meta_model(cfg: DecoderConfig) -> DecoderLM:
    """The built-in decoder with every parameter on the meta device: its structure, no weights (reset_parameters
    draws nothing there)."""
    with torch.device("meta"):
        return DecoderLM(cfg)


def param_specs(cfg: DecoderConfig) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of every state-dict entry of the built-in decoder, in state-dict order (a tied LM head
    is its own entry, as in ``state_dict()``)."""
    return [(n, tuple(t.shape), t.dtype) for n, t in meta_model(cfg).state_dict(keep_vars=True).items()]


def _default_init(module: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters a module gets from its own reset_parameters (norms: ones and zeros), made on the CPU for that
    module alone (a copy of the meta module, given storage)."""
    if not any(True for _ in module.parameters(recurse=False)):
        return {}
    clone = copy.deepcopy(module)
    for child in list(clone._modules):
        clone._modules[child] = None  # only this module's own parameters
    clone = clone.to_empty(device="cpu")
    if hasattr(clone, "reset_parameters"):
        with torch.no_grad():
            clone.reset_parameters()
    return {n: p.detach() for n, p in clone.named_parameters(recurse=False)}


def seeded_tensors(cfg: DecoderConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The built-in decoder's seeded weights (:meth:`DecoderLM.reset_parameters`) one tensor at a time, in its draw
    order: the same numbers, never more than one drawn tensor held here. A tied LM head yields its name with the
    embedding's tensor again (the state dict's two keys, one tensor)."""
    model = meta_model(cfg)
    gen = torch.Generator().manual_seed(cfg.seed)
    drawn: set[str] = set()
    tied = "lm_head.weight" if cfg.tie_embeddings else None
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            w = torch.randn(module.weight.shape, generator=gen).mul_(0.02)  # in place: the same numbers, one copy
            name = f"{dot}weight"
            if name != tied:
                drawn.add(name)
                yield name, w
            del w
            if getattr(module, "bias", None) is not None:
                drawn.add(f"{dot}bias")
                yield f"{dot}bias", torch.zeros(module.bias.shape)
        elif not isinstance(module, DecoderLM):
            for n, t in _default_init(module).items():
                if f"{dot}{n}" not in drawn and n != "sinks":
                    drawn.add(f"{dot}{n}")
                    yield f"{dot}{n}", t
    for i, block in enumerate(model.blocks):  # sinks after every other weight, as reset_parameters draws them
        if block.attn.sinks is not None:
            yield f"blocks.{i}.attn.sinks", torch.randn(block.attn.sinks.shape, generator=gen)
    if tied:
        yield tied, None  # the embedding's tensor: written once, named twice (see write_safetensors)


def _header(specs: list[tuple[str, tuple[int, ...], torch.dtype]], aliases: dict[str, str]) -> tuple[bytes, dict]:
    """The safetensors header (JSON, padded so the data starts on a page) and each tensor's (start, end) offsets
    within the data section; an alias shares its target's bytes (both names in the header, one copy of the data)."""
    offsets: dict[str, tuple[int, int]] = {}
    at = 0
    for name, shape, dtype in specs:
        if name in aliases:
            continue
        at = -(-at // ALIGN) * ALIGN
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        offsets[name] = (at, at + nbytes)
        at += nbytes
    for name, target in aliases.items():
        offsets[name] = offsets[target]
    meta = {"__metadata__": {"format": "pt", "writer": "mhaexport.models.stream"}}
    for name, shape, dtype in specs:
        meta[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": list(offsets[name])}
    raw = json.dumps(meta, separators=(",", ":")).encode()
    pad = (-(8 + len(raw))) % ALIGN
    return raw + b" " * pad, offsets


def write_safetensors(path: str | Path, specs: list[tuple[str, tuple[int, ...], torch.dtype]],
                      tensors: Iterable[tuple[str, torch.Tensor | None]],
                      aliases: dict[str, str] | None = None) -> Path:
    """Write ``tensors`` (any order; each (name, tensor) is written at its offset and dropped) as a safetensors file
    whose header is ``specs``; ``aliases``: names stored as another name's bytes (a tied head), whose stream entry
    may be (name, None). Written to a temporary file beside ``path`` and renamed: never a half-written file. Each
    tensor's data starts on a page boundary. Every spec must arrive exactly once (ValueError otherwise)."""
    path = Path(path)
    aliases = dict(aliases or {})
    header, offsets = _header(specs, aliases)
    shapes = {n: (s, d) for n, s, d in specs}
    seen: set[str] = set()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            base = 8 + len(header)
            for name, t in tensors:
                if name in aliases:
                    seen.add(name)
                    continue
                if name not in shapes or name in seen:
                    raise ValueError(f"write_safetensors: {name!r} is {'written twice' if name in seen else 'not in the specs'}")
                shape, dtype = shapes[name]
                if t is None or tuple(t.shape) != shape or t.dtype != dtype:
                    raise ValueError(f"write_safetensors: {name!r} is {None if t is None else (tuple(t.shape), t.dtype)}, "
                                     f"the header says {(shape, dtype)}")
                f.seek(base + offsets[name][0])
                if t.numel():
                    f.write(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)
                seen.add(name)
            missing = [n for n, _, _ in specs if n not in seen]
            if missing:
                raise ValueError(f"write_safetensors: no tensor arrived for {', '.join(missing[:3])}")
            end = base + max((e for _, e in offsets.values()), default=0)
            f.truncate(end)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_seeded(cfg: DecoderConfig, path: str | Path) -> Path:
    """The built-in decoder's seeded weights as a safetensors file at ``path``, drawn and written one tensor at a
    time (the tied LM head an alias of the embedding)."""
    aliases = {"lm_head.weight": "tok_emb.weight"} if cfg.tie_embeddings else {}
    return write_safetensors(path, param_specs(cfg), seeded_tensors(cfg), aliases)


def read_header(path: str | Path, *, foreign: bool = False) -> tuple[int, dict]:
    """(where the data starts, the header's entries) of a safetensors file; ValueError on a malformed one. The header
    is read by mhaexport's strict JSON reader (a key twice — which two parsers would read differently — or a NaN
    token refused). ``foreign``: a file from outside (an ``--hf`` folder's), which our mapped reader accepts only when
    the safetensors library accepts it too — the library validates it first (its header's offsets, dtypes and shapes
    against the bytes: ``safe_open``), and whose header our JSON reader refuses is UntrustedInput (a refusal: no
    other parser reads it instead). mhaexport's own staging files alias a tied head's bytes, which the library
    does not take: they are ours, written here."""
    from mhaexport.core.errors import MhaExportError
    from mhaexport.core.untrusted import load_json

    if foreign:
        _library_accepts(path)
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than its header's length)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100_000_000):
            raise ValueError(f"{path}: its header says {n} bytes, the file holds {size}")
        try:
            meta = load_json(f.read(n), f"{path}: its header")
        except MhaExportError as e:
            if foreign:  # a folder's file our strict reader refuses (a key twice): refused, never read by a laxer one
                raise
            raise ValueError(str(e)) from None
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: its header is not a JSON object")
    meta.pop("__metadata__", None)
    return 8 + n, meta


def _library_accepts(path: str | Path) -> None:
    """ValueError unless the safetensors library opens ``path`` (the parser transformers' loader uses); nothing
    where the library is not installed (the built-in decoder's own files, written here)."""
    try:
        from safetensors import safe_open
    except ImportError:
        return
    try:
        with safe_open(str(path), framework="numpy"):
            pass
    except BaseException as e:  # noqa: BLE001 - its errors, and a Rust panic (a BaseException)
        if isinstance(e, (KeyboardInterrupt, SystemExit, MemoryError)):
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: the safetensors library refuses it ({first})") from None


def mmap_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The file's tensors as read-only views of one memory map (no copy: file-backed pages, read on use); names
    that share bytes (a tied head) are one tensor."""
    base, meta = read_header(path)
    return _state_over(path, np.memmap(path, dtype=np.uint8, mode="r"), base, meta)


def mmap_model(cfg: DecoderConfig, path: str | Path) -> DecoderLM:
    """The built-in decoder whose parameters are ``path``'s tensors, memory-mapped (:func:`mmap_state`): built on
    meta, loaded with ``assign`` (strict: every name, no extra); eval mode."""
    return model_over(cfg, mmap_state(path))


def streamed_sha256(state: dict[str, torch.Tensor], weights: "WeightsFile | None" = None, *,
                    as_float32: bool = False) -> str:
    """:func:`mhaexport.models.loading.weights_sha256` of a state dict, reading one tensor at a time (a memory-mapped
    state's pages are read once and may be dropped again); a tensor that lies in ``weights``' map is read from the
    file by offset instead (:meth:`WeightsFile.read_tensor`: the map's pages never touched). ``as_float32``: a
    bfloat16/float16 tensor hashed as its float32 values (read by offset, converted, one at a time)."""
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        t = t.detach()
        if as_float32 and t.dtype in (torch.bfloat16, torch.float16):  # hashed as the float32 values it stands for
            t = (weights.read_tensor(t) if weights is not None and weights.where(t) is not None else t).float()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if not t.numel():
            continue
        at = weights.where(t) if weights is not None else None
        if at is not None:  # 64 MB at a time, by offset
            offset, nbytes = at
            for i in range(0, nbytes, 64 << 20):
                h.update(weights._pread(offset + i, min(64 << 20, nbytes - i)).data)
            continue
        flat = t.reshape(-1)
        step = max(1, (64 << 20) // max(1, t.element_size()))
        for i in range(0, flat.numel(), step):  # 64 MB at a time
            h.update(flat[i:i + step].cpu().contiguous().view(torch.uint8).numpy().data)
    return h.hexdigest()


class WeightsFile:
    """A safetensors file open for the length of an export: its tensors memory-mapped (:attr:`state`, what a model
    over the file holds) and read again by offset with ``os.pread`` (:meth:`read_view`, :meth:`sha256`), which copies
    one tensor into memory the caller drops, never touching the map's pages — so the process's resident set never
    holds the file. ``unlink``: remove the file once open (a staging file: gone when this object is, even on a
    crash; the map and the descriptor keep its data until then)."""

    def __init__(self, path: str | Path, *, unlink: bool = False, foreign: bool = False) -> None:
        self.path = Path(path)
        self.fd = -1  # owned from the moment it is open: close() closes it once, whoever calls it first
        self._unlink_at_close = False
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            self.base, self.meta = read_header(self.path, foreign=foreign)
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
            self.state = _state_over(self.path, self._mm, self.base, self.meta)
        except BaseException:
            os.close(fd)  # never owned: closed here, once (close() and __del__ see -1)
            raise
        self.fd = fd
        if unlink:
            try:
                self.path.unlink(missing_ok=True)
            except OSError:  # a file open elsewhere cannot be removed on Windows: removed at close instead
                self._unlink_at_close = True
        self._lock = threading.Lock()
        self._start = self._mm.ctypes.data
        self._end = self._start + self._mm.size

    def close(self, _close=os.close) -> None:
        """Close the descriptor, once (later calls do nothing), and remove a staging file Windows kept. (``_close``:
        bound when the class is made, so that a file still open when the interpreter exits closes while ``os`` is
        already gone.)"""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)
            if self._unlink_at_close:
                self._mm = self.state = None
                self.path.unlink(missing_ok=True)

    def __enter__(self) -> WeightsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0:
            self.close()

    def _pread(self, offset: int, nbytes: int) -> np.ndarray:
        """``nbytes`` of the file from ``offset``, read into a new buffer (uint8)."""
        buf = np.empty(nbytes, np.uint8)
        view, done = memoryview(buf), 0
        while done < nbytes:
            if hasattr(os, "preadv"):
                n = os.preadv(self.fd, [view[done:]], offset + done)
            else:  # no positional read (Windows): seek and read under a lock
                with self._lock:
                    os.lseek(self.fd, offset + done, os.SEEK_SET)
                    chunk = os.read(self.fd, min(nbytes - done, 1 << 30))
                    n = len(chunk)
                    view[done:done + n] = chunk
            if n <= 0:
                raise OSError(f"{self.path}: short read at byte {offset + done}")
            done += n
        return buf

    def offset_of(self, address: int, span: int) -> int | None:
        """The file offset of the bytes at ``address`` (``span`` long) when they lie in this file's map, else None."""
        if self._start <= address and address + span <= self._end:
            return address - self._start
        return None

    def read_view(self, address: int, shape: tuple[int, ...], strides: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray | None:
        """A contiguous copy of the (possibly strided: a transposed weight) array of ``dtype`` at ``address`` in this
        file's map (``strides`` in bytes, >= 0), read from the file by offset; None when it is not in the map."""
        itemsize = np.dtype(dtype).itemsize
        if any(s < 0 for s in strides):
            return None
        span = (sum((n - 1) * s for n, s in zip(shape, strides)) + itemsize) if all(shape) else 0
        offset = self.offset_of(address, span)
        if offset is None:
            return None
        raw = self._pread(offset, span).view(dtype) if span else np.empty(0, dtype)
        view = np.lib.stride_tricks.as_strided(raw, shape, strides) if span else raw.reshape(shape)
        if view.flags.c_contiguous:
            return view
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return torch.from_numpy(view).contiguous().numpy()  # torch's blocked copy: ~3x numpy's on a transpose
        except (TypeError, ValueError):  # a dtype torch does not take (ml_dtypes' bfloat16)
            return np.ascontiguousarray(view)

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name`` as a new (writable, anonymous-memory) tensor read from the file."""
        entry = self.meta[name]
        start, end = (int(x) for x in entry["data_offsets"])
        dtype = _TORCH_DTYPES[entry["dtype"]]
        raw = torch.from_numpy(self._pread(self.base + start, end - start))
        return raw.view(dtype).reshape([int(x) for x in entry["shape"]])

    def where(self, t: torch.Tensor) -> tuple[int, int] | None:
        """(file offset, byte count) of a contiguous CPU tensor whose bytes lie in this file's map, else None."""
        if t.device.type != "cpu" or not t.is_contiguous() or not t.numel():
            return None
        nbytes = t.numel() * t.element_size()
        offset = self.offset_of(t.data_ptr(), nbytes)
        return None if offset is None else (offset, nbytes)

    def read_tensor(self, t: torch.Tensor) -> torch.Tensor | None:
        """A copy of ``t`` (a tensor over this file's map: a parameter of a model over :attr:`state`) read from the
        file by offset, in memory the caller drops; None when ``t`` is not in the map."""
        at = self.where(t)
        if at is None:
            return None
        return torch.from_numpy(self._pread(*at)).view(t.dtype).reshape(t.shape)

    def model(self, cfg: DecoderConfig) -> DecoderLM:
        """The built-in decoder over :attr:`state` (as :func:`mmap_model`)."""
        return model_over(cfg, self.state)

    def release(self, tensors: Iterable[torch.Tensor]) -> None:
        """Drop the pages of ``tensors`` (those over this file's map) from this process (``MADV_DONTNEED``): a
        forward that read them leaves them in the page cache, not in the resident set; the next read maps them
        again. A no-op where the platform has no ``madvise``."""
        mm = getattr(self._mm, "_mmap", None)
        if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        for t in tensors:
            at = self.where(t)
            if at is None:
                continue
            start = at[0] // mmap.PAGESIZE * mmap.PAGESIZE
            mm.madvise(mmap.MADV_DONTNEED, start, at[0] + at[1] - start)

    @contextlib.contextmanager
    def released_after_use(self, module: nn.Module) -> Iterator[None]:
        """While inside, each module's own parameters over this file have their pages dropped (:meth:`release`) once
        its forward returns: a forward over the mapped model holds one module's weights resident at a time."""
        def drop(mod, _args, _out) -> None:
            self.release(mod.parameters(recurse=False))

        handles = [m.register_forward_hook(drop) for m in module.modules()
                   if any(True for _ in m.parameters(recurse=False))]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self.release(module.parameters())


def _state_over(path, mm: np.memmap, base: int, meta: dict) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    by_offset: dict[tuple[int, int], torch.Tensor] = {}
    for name, entry in meta.items():
        dtype = _TORCH_DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: {name!r} has dtype {entry.get('dtype')!r}, which mhaexport does not read")
        start, end = (int(x) for x in entry["data_offsets"])
        shape = [int(x) for x in entry["shape"]]
        key = (start, end)
        if key in by_offset and end > start:
            state[name] = by_offset[key]
            continue
        if not 0 <= start <= end <= mm.size - base:
            raise ValueError(f"{path}: {name!r}'s data lies outside the file")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "The given NumPy array is not writable": nothing writes to it
            raw = torch.from_numpy(mm[base + start:base + end])
        t = raw.view(dtype).reshape(shape) if end > start else torch.empty(shape, dtype=dtype)
        by_offset[key] = state[name] = t
    return state


def model_over(cfg: DecoderConfig, state: dict[str, torch.Tensor], *, strict: bool = True) -> DecoderLM:
    """The built-in decoder whose parameters are ``state``'s tensors as they are (built on meta, loaded with
    ``assign``: a memory-mapped state stays mapped); a tied head is the embedding's tensor; eval mode."""
    model = meta_model(cfg)
    model.load_state_dict(state, strict=strict, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.tok_emb.weight
    return model.eval()


def staging_file(specs: list[tuple[str, tuple[int, ...], torch.dtype]],
                 tensors: Iterable[tuple[str, torch.Tensor | None]], *, aliases: dict[str, str] | None = None,
                 folder: str | Path | None = None) -> WeightsFile:
    """``tensors`` written one at a time (:func:`write_safetensors`, header ``specs``) to a staging file in ``folder``
    (default: the temporary folder, ``TMPDIR``), opened and unlinked (:class:`WeightsFile`: gone with it)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".mhaexport-weights-", suffix=".safetensors")
    os.close(fd)
    try:
        write_safetensors(tmp, specs, tensors, aliases)
        return WeightsFile(tmp, unlink=True)
    finally:
        Path(tmp).unlink(missing_ok=True)


def staged_weights(cfg: DecoderConfig, tensors: Iterable[tuple[str, torch.Tensor | None]] | None = None, *,
                   dtype: torch.dtype | None = None, folder: str | Path | None = None) -> WeightsFile:
    """The built-in decoder's weights written to a staging file (:func:`staging_file`): ``tensors`` (name, tensor)
    in any order — a checkpoint's, read one at a time — or, when None, the seeded init (:func:`seeded_tensors`);
    ``dtype``: floating tensors converted to it as they are written. The tied LM head is stored once."""
    specs = param_specs(cfg)
    if dtype is not None:
        specs = [(n, s, dtype if d.is_floating_point else d) for n, s, d in specs]
    aliases = {"lm_head.weight": "tok_emb.weight"} if cfg.tie_embeddings else {}
    stream = seeded_tensors(cfg) if tensors is None else tensors

    def converted():
        for name, t in stream:
            if t is not None and dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            yield name, t

    return staging_file(specs, converted(), aliases=aliases, folder=folder)


def restaged(module: nn.Module, weights: WeightsFile, dtype: torch.dtype, *,
             folder: str | Path | None = None) -> tuple[WeightsFile, nn.Module]:
    """What ``copy.deepcopy(module).to(dtype)`` gives, without the model in memory: ``module``'s parameters (over
    ``weights``' map, read by offset; any other from memory) converted to ``dtype`` one at a time into a new staging
    file, and a copy of ``module`` whose parameters are that file mapped (a tied parameter stays one parameter),
    its buffers converted by ``.to(dtype)`` as there. Any model: the built-in decoder, a transformers model."""
    params = dict(module.named_parameters())  # a tied parameter once, under its first name
    specs = [(n, tuple(p.shape), dtype if p.is_floating_point() else p.dtype) for n, p in params.items()]

    def tensors():
        for (name, p), (_, _, want) in zip(params.items(), specs):
            t = weights.read_tensor(p)
            yield name, (p.detach() if t is None else t).to(want)

    new = staging_file(specs, tensors(), folder=folder)
    try:
        memo = {id(p): nn.Parameter(new.state[n], requires_grad=p.requires_grad) for n, p in params.items()}
        return new, copy.deepcopy(module, memo).to(dtype)
    except BaseException:
        new.close()
        raise


def seeded_cache_path(cfg: DecoderConfig) -> Path:
    """Where the seeded weights of ``cfg`` are cached to be memory-mapped: ``weights/seeded-<key>.safetensors`` in
    this user's cache (:func:`mhaexport.artifact.cache.cache_root`: never inside a folder being read), keyed by the
    sha256 of the config (seed included) and torch's version (its generator draws the numbers)."""
    from mhaexport.artifact.cache import cache_root

    key = hashlib.sha256(json.dumps({"config": cfg.to_dict(), "torch": torch.__version__, "format": ALIGN},
                                    sort_keys=True).encode()).hexdigest()
    return cache_root() / "weights" / f"seeded-{key}.safetensors"


def cached_seeded(cfg: DecoderConfig, *, rebuild: bool = False) -> Path:
    """The seeded weights of ``cfg`` as a safetensors file in the cache (:func:`seeded_cache_path`), written once
    (:func:`write_seeded`: atomic, so never half there) with an integrity stamp beside it, as the optimized-graph
    cache's: an HMAC under this user's key (:func:`mhaexport.artifact.cache.cache_key`) of the config's key and the
    file's sha256. A file whose stamp does not check (written by anyone else, changed since, a link, a folder others
    can write), that does not read as that model's, or ``rebuild`` is written again — verify's eager reference is
    never weights someone else put there."""
    from mhaexport.artifact.cache import cache_key, cache_root, stamp, usable
    from mhaexport.artifact.files import atomic_write_bytes, sha256_file

    path = seeded_cache_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp_file = path.with_suffix(".stamp")
    root = cache_root()
    try:
        key = cache_key(root) if usable(root, [path, stamp_file]) else None
    except OSError:
        key = None
    if not rebuild and key is not None and path.is_file() and stamp_file.is_file():
        try:
            _, meta = read_header(path)
            want = {n: [list(s), _ST_DTYPES[d]] for n, s, d in param_specs(cfg)}
            if ({n: [e.get("shape"), e.get("dtype")] for n, e in meta.items()} == want and hmac.compare_digest(
                    stamp_file.read_text().strip(), stamp(key, path.stem, sha256_file(path)))):
                return path
        except (ValueError, OSError):
            pass
    if key is None:  # not this user's private cache: written where only this process reads it
        path = Path(tempfile.mkdtemp(prefix="mhaexport-seeded-")) / path.name
        return write_seeded(cfg, path)
    stamp_file.unlink(missing_ok=True)
    out = write_seeded(cfg, path)
    atomic_write_bytes(stamp_file, (stamp(key, path.stem, sha256_file(out)) + "\n").encode())
    return out
