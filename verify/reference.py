"""A recorded eager reference: eager's outputs over verify's sweep (and its greedy generations) written into the
folder beside the ONNX file (``reference.json``, its index, + ``reference.npz``, its arrays; hashed in the manifest
under the ONNX artifact like its other files), so that a later verify judges the file without torch or the original
weights.

What a record keeps (:func:`recording`), per sweep case: the logits — every one where the vocabulary is at most
:data:`FULL_VOCAB`, else the top :data:`TOP_K` (values and indices) per position plus each position's logsumexp
(the softmax's normalizer: the mass of the whole row) and the case's max |logit| (parity's rounding scale); the
KV cache (present) — all of it while the sweep's caches hold at most :data:`PRESENT_FULL_FLOATS` values, else
:data:`PRESENT_POSITIONS` key positions per case. Per greedy generation the generation check runs on eager (a short
and a long prompt, the deploy loop's two rows): the prompt, the tokens and each step's logits (top-k likewise).
And what it was made from: the model's fingerprint and weights' sha256, the sweep (kind, seed, tokens, case names),
the sha256 of every file of the ONNX artifact it judges, mhaexport's, torch's and numpy's versions, the date.

:class:`RecordedContext` is the decoder's check context served by a record: ``reference(case)`` is the recorded
case, ``compare`` judges a runtime's outputs on what was kept, ``greedy_reference`` returns the recorded
generation. :func:`load` refuses (one line, exit 2) a record of other weights, another sweep or another file.
Read as untrusted input: the index through the bounded JSON reader, the arrays with ``allow_pickle=False`` after
their sizes are bounded, every shape checked against the case it claims to be.
"""

from __future__ import annotations

import datetime
import io
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mhaexport.artifact import schema
from mhaexport.core.errors import ArtifactError, MhaExportError
from mhaexport.core.untrusted import load_json, shown
from mhaexport.verify.compare import Diff, Tolerance, compare
from mhaexport.verify.results import CaseRun, Context, non_finite
from mhaexport.verify.sweep import Case

PREFIX = "reference."  # the record's files, beside model.onnx (plain names: no folder to create in the user's)
INDEX = f"{PREFIX}json"
ARRAYS = f"{PREFIX}npz"
KIND = "reference"
VERSION = 1
FULL_VOCAB = 4096  # logits kept whole up to this vocabulary size
TOP_K = 32  # else the top-k logits per position (values + indices), with the logsumexp
PRESENT_FULL_FLOATS = 1 << 21  # the sweep's whole KV cache kept up to this many values (8 MB of float32)
PRESENT_POSITIONS = 4  # else this many key positions per case (first, two between, last)
MAX_ARRAY_BYTES = 1 << 30  # a record's arrays, uncompressed, at most this (a hostile zip cannot inflate past it)

class NotRecorded(MhaExportError):
    """A reference the record does not hold (a case or a prompt it was not made for)."""


def torch_missing() -> str | None:
    """Why torch cannot be imported here (one line), or None."""
    try:
        import torch  # noqa: F401 (imported to know: where it is, eager's verify imports it next anyway)
    except ImportError as e:
        return str(e).splitlines()[0] if str(e) else "torch is not installed"
    return None


def has_record(ef) -> bool:
    """Whether the folder's ONNX artifact lists a recorded reference."""
    return ef.has("onnx") and INDEX in ef.entry("onnx").files


def judged_files(ef) -> dict[str, str]:
    """{name: sha256} of the ONNX artifact's files the outputs depend on (the graph and its external data; not its
    JSON configs, not the record itself)."""
    return {n: m["sha256"] for n, m in ef.entry("onnx").files.items()
            if not n.startswith(PREFIX) and not n.endswith(".json")}


# ---- what is kept --------------------------------------------------------------------------------------------------

def _keep_logits(logits: np.ndarray, full: bool, prefix: str, out: dict[str, np.ndarray]) -> None:
    """(..., V) logits into ``out``: whole, or top-k values + indices, logsumexp and max |logit|."""
    logits = np.asarray(logits, dtype=np.float32)
    if full:
        out[f"{prefix}.logits"] = logits
        return
    k = min(TOP_K, logits.shape[-1])
    idx = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(logits, idx, -1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    out[f"{prefix}.topk_indices"] = np.take_along_axis(idx, order, -1).astype(np.int32)
    out[f"{prefix}.topk_values"] = np.take_along_axis(vals, order, -1)
    out[f"{prefix}.lse"] = _lse(logits).astype(np.float32)
    out[f"{prefix}.absmax"] = np.array(float(np.abs(logits).max(initial=0.0)), dtype=np.float32)


def _lse(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    return (np.log(np.exp(x - m).sum(axis=-1)) + m[..., 0])


def key_positions(total: int) -> np.ndarray:
    """The key positions a sampled present keeps: first, last and evenly between (at most PRESENT_POSITIONS)."""
    return np.unique(np.linspace(0, total - 1, PRESENT_POSITIONS).round().astype(np.int64))


@dataclass
class Recording:
    """A record ready to be written: its index (a JSON dict) and arrays."""

    index: dict
    arrays: dict[str, np.ndarray]

    def files(self) -> dict[str, bytes]:
        buf = io.BytesIO()
        np.savez_compressed(buf, **self.arrays)
        from mhaexport.core.numbers import dumps

        return {INDEX: (dumps(self.index, indent=1, sort_keys=True) + "\n").encode(), ARRAYS: buf.getvalue()}


def recording(ef, ctx: Context, cases: list[Case], greedies: list[tuple[str, np.ndarray, int]], *, sweep: str,
              seed: int) -> Recording:
    """The record of eager's references in ``ctx`` (an eager verify's context, its references memoized or computed
    now) for ``cases`` and the generation check's ``greedies`` ((key, prompt, n))."""
    from mhaexport.core.env import tool_versions
    from mhaexport.verify.checks import reference_greedy

    c = ctx.contract
    full_logits = c.vocab_size <= FULL_VOCAB
    floats = sum(2 * c.n_layers * cs.batch * c.n_kv_heads * (cs.past + cs.seq) * c.head_dim for cs in cases)
    full_present = floats <= PRESENT_FULL_FLOATS
    arrays: dict[str, np.ndarray] = {}
    for i, case in enumerate(cases):
        logits, present = ctx.reference(case)
        _keep_logits(logits, full_logits, f"case{i}", arrays)
        stacked = np.stack([np.stack([np.asarray(k), np.asarray(v)]) for k, v in present]).astype(np.float32)
        if not full_present:  # (L, 2, B, H, S, D) -> the sampled key positions
            pos = key_positions(case.past + case.seq)
            stacked = stacked[..., pos, :]
            arrays[f"case{i}.present_positions"] = pos
        arrays[f"case{i}.present"] = stacked
    for key, prompt, n in greedies:
        g = reference_greedy(ctx, key, prompt, n)
        arrays[f"greedy.{key}.prompt"] = np.asarray(prompt, dtype=np.int64).reshape(-1)
        arrays[f"greedy.{key}.tokens"] = np.asarray(g.tokens, dtype=np.int64)
        _keep_logits(np.stack(g.logits), full_logits, f"greedy.{key}", arrays)
    versions = tool_versions()
    index = {
        "schema": schema.tag(KIND, VERSION),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "made_with": {k: versions.get(k) for k in ("mhaexport", "torch", "numpy", "python")},
        "model": {"fingerprint": ef.model.fingerprint, "weights_sha256": ef.model.weights_sha256,
                  "spec": ef.model.spec},
        "files": judged_files(ef),
        "sweep": {"kind": sweep, "seed": seed, "tokens": ctx.gen_tokens, "cases": [cs.name for cs in cases]},
        "cases": [cs.to_dict() for cs in cases],
        "greedy": [key for key, _, _ in greedies],
        "keeps": {"logits": "all" if full_logits else f"top-{min(TOP_K, c.vocab_size)}", "vocab": c.vocab_size,
                  "present": "all" if full_present else f"{PRESENT_POSITIONS} key positions per case"},
    }
    return Recording(index, arrays)


def cases_of(ctx: Context, runners: list) -> list[Case]:
    """The cases a record holds: the sweep's, and each runtime's own (a static export runs one case at its sizes)."""
    out = list(ctx.cases)
    for runner in runners[1:]:
        out += [cs for cs in ctx.cases_for(runner) if cs not in out]
    return out


def write(ef, made: Recording) -> dict:
    """Publish ``made`` into ``ef``'s folder as files of its ONNX artifact (a record there before is replaced; the
    staged publish: as before or as after), provided the ONNX files still hold the bytes it was made for. Returns
    what the report says: the files, their bytes, what they keep."""
    from mhaexport.artifact.folder import add_files

    files = made.files()
    add_files(ef.path, "onnx", files, drop_prefix=PREFIX, expect=made.index["files"],
              purpose="record the eager reference")
    k = made.index["keeps"]
    return {"files": list(files), "bytes": sum(len(b) for b in files.values()),
            "keeps": f"logits: {k['logits']} of {k['vocab']}; present: {k['present']}"}


# ---- reading it back -----------------------------------------------------------------------------------------------

@dataclass
class RecordedCase:
    """One case's recorded eager outputs: logits whole or top-k (+ logsumexp, max |logit|), present whole or at
    ``positions``."""

    logits: np.ndarray | None
    topk_values: np.ndarray | None
    topk_indices: np.ndarray | None
    lse: np.ndarray | None
    absmax: float
    present: np.ndarray  # (L, 2, B, H, S or P, D)
    positions: np.ndarray | None

    def compare(self, actual, tol: Tolerance, rows: np.ndarray, keys: np.ndarray) -> dict[str, Diff]:
        """{"logits", "present"}: a runtime's outputs of this case against what was kept (see the module doc)."""
        la, pa = actual
        la = np.asarray(la)
        tl = tol.for_output("logits")
        if self.logits is not None:
            d = compare(la, self.logits, tl, rows[:, :, None])
        elif la.ndim != 3 or la.shape[:2] != self.topk_values.shape[:2] or la.shape[2] <= int(self.topk_indices.max(
                initial=0)):
            d = Diff(float("inf"), float("inf"), 1, 1, float("inf"))
        else:
            got = np.take_along_axis(la, self.topk_indices.astype(np.int64), -1)
            d = compare(got, self.topk_values, tl, rows[:, :, None])
            # the normalizer over the whole vocabulary: |dlse| <= max |dlogit| <= atol + rtol * max |logit|
            d = d.merge(compare(_lse(la), self.lse, Tolerance(tl.atol + tl.rtol * self.absmax, 0.0), rows))
        tp = tol.for_output("present")
        if len(pa) != self.present.shape[0]:
            return {"logits": d, "present": Diff(float("inf"), float("inf"), 1, 1, float("inf"))}
        kmask = keys if self.positions is None else keys[:, self.positions]
        pd = Diff()
        for (ka, va), want in zip(pa, self.present):
            for a, e in ((ka, want[0]), (va, want[1])):
                a = np.asarray(a)
                if self.positions is not None:
                    if a.ndim != 4 or a.shape[2] <= int(self.positions.max(initial=0)):
                        pd = pd.merge(Diff(float("inf"), float("inf"), 1, 1, float("inf")))
                        continue
                    a = a[:, :, self.positions, :]
                pd = pd.merge(compare(a, e, tp, kmask[:, None, :, None]))
        return {"logits": d, "present": pd}


@dataclass
class RecordedReference:
    """A folder's recorded reference, read and checked (:func:`load`)."""

    index: dict
    cases: dict[Case, RecordedCase]
    greedy: dict[str, tuple[np.ndarray, list[int], np.ndarray]]  # key -> (prompt, tokens, (n, V) logits)
    topk: bool

    @property
    def date(self) -> str:
        return str(self.index.get("date"))

    def describe(self) -> str:
        """"recorded <date> from <fingerprint> (mhaexport X, torch Y)"."""
        made = self.index.get("made_with") or {}
        return (f"recorded {self.date} from {self.index['model']['fingerprint']} (mhaexport {made.get('mhaexport')}, "
                f"torch {made.get('torch')})")

    def keeps(self) -> dict[str, str]:
        k = self.index["keeps"]
        logits = "every logit" if k["logits"] == "all" else f"the {k['logits']} logits and logsumexp per position"
        present = "whole" if k["present"] == "all" else f"at {k['present']}"
        return {"logits": logits, "present": present}

    def how(self, check: str) -> str:
        """How ``check`` is judged from this record (the suite's ``recorded`` column, filled in)."""
        from mhaexport.verify.suite import CHECK_FUNCS

        row = CHECK_FUNCS.get(check)
        return row.recorded_reason.format(**self.keeps()) if row is not None else "n/a"


def _where(ef, name: str) -> str:
    return str(ef.path / name)


def _field(index: dict, key: str, kind: type, where: str) -> Any:
    value = index.get(key)
    if not isinstance(value, kind):
        raise ArtifactError(f"{where}: {key}: expected {kind.__name__}, found {type(value).__name__}")
    return value


def load(ef, contract, *, sweep: str, seed: int, tokens: int, cases: list[Case],
         greedies: list[tuple[str, np.ndarray, int]]) -> RecordedReference:
    """The folder's record, checked against what this verify will ask of it: the model (fingerprint), the ONNX
    artifact's files (sha256), the sweep (kind, seed, tokens, its cases) — a ReferenceMismatch (exit 2, one line)
    otherwise; a malformed record is an ArtifactError naming the field."""
    from mhaexport.core.errors import ReferenceMismatch

    where = _where(ef, INDEX)
    index = load_json(ef.file("onnx", INDEX).read_bytes(), where)
    schema.version_of(index, KIND, (VERSION,), where)
    model = _field(index, "model", dict, where)
    if model.get("fingerprint") != ef.model.fingerprint or model.get("weights_sha256") != ef.model.weights_sha256:
        raise ReferenceMismatch(f"{where} was recorded from other weights (fingerprint "
                                f"{shown(str(model.get('fingerprint')))}, this folder's model is "
                                f"{ef.model.fingerprint}): record it again with `mhaexport verify --record`")
    files = _field(index, "files", dict, where)
    now = judged_files(ef)
    if files != now:
        changed = sorted(set(files) ^ set(now) | {n for n in files if n in now and files[n] != now[n]})
        raise ReferenceMismatch(f"{where} was recorded for another file: {shown(', '.join(changed[:3]))} changed "
                                "since (sha256): record it again with `mhaexport verify --record`")
    sw = _field(index, "sweep", dict, where)
    asked = {"kind": sweep, "seed": seed, "tokens": tokens}
    if any(sw.get(k) != v for k, v in asked.items()):
        raise ReferenceMismatch(f"{where} was recorded for --sweep {shown(str(sw.get('kind')))} --seed "
                                f"{shown(str(sw.get('seed')))} --tokens {shown(str(sw.get('tokens')))}, this verify "
                                f"asks --sweep {sweep} --seed {seed} --tokens {tokens}: verify with the record's, or "
                                "record this sweep")
    names = [cs.name for cs in cases]
    if sw.get("cases") != names:
        raise ReferenceMismatch(f"{where} was recorded over other cases than this mhaexport's {sweep} sweep at seed "
                                f"{seed} ({len(sw.get('cases') or [])} recorded, {len(names)} now): record it again")
    keeps = _field(index, "keeps", dict, where)
    topk = keeps.get("logits") != "all"
    arrays = _arrays(ef, where)
    c = contract
    out: dict[Case, RecordedCase] = {}
    for i, case in enumerate(cases):
        out[case] = _case(arrays, f"case{i}", case, c, topk, where)
    greedy = {}
    for key, prompt, n in greedies:
        p = _array(arrays, f"greedy.{key}.prompt", np.int64, (prompt.size,), where)
        toks = _array(arrays, f"greedy.{key}.tokens", np.int64, (n,), where)
        if any(a.size and (a.min() < 0 or a.max() >= c.vocab_size) for a in (p, toks)):
            raise ArtifactError(f"{where}: greedy.{key}: token ids out of the vocabulary")
        logits = _logits(arrays, f"greedy.{key}", (n,), c.vocab_size, topk, where)
        greedy[key] = (p, toks.tolist(), logits)
    return RecordedReference(index, out, greedy, topk)


def _arrays(ef, where: str) -> dict[str, np.ndarray]:
    path = ef.file("onnx", ARRAYS)
    try:
        with zipfile.ZipFile(path) as z:
            size = sum(i.file_size for i in z.infolist())
        if size > MAX_ARRAY_BYTES:
            raise ArtifactError(f"{_where(ef, ARRAYS)}: {size} bytes uncompressed, over the record's limit "
                                f"{MAX_ARRAY_BYTES}: refused")
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ArtifactError(f"{_where(ef, ARRAYS)}: not a record's arrays ({shown(why)})") from None


def _array(arrays: dict, key: str, dtype, shape: tuple, where: str) -> np.ndarray:
    a = arrays.get(key)
    if a is None:
        raise ArtifactError(f"{where}: the record has no {key}")
    if a.dtype.kind != np.dtype(dtype).kind or tuple(a.shape) != tuple(shape):
        raise ArtifactError(f"{where}: {key} is {a.dtype}{list(a.shape)}, expected {np.dtype(dtype)}{list(shape)}")
    return a.astype(dtype, copy=False)


def _logits(arrays: dict, prefix: str, lead: tuple, vocab: int, topk: bool, where: str) -> np.ndarray:
    """Whole logits (lead + (V,)); from a top-k record, the (lead + (V,)) array with -inf beyond the top-k."""
    if not topk:
        return _array(arrays, f"{prefix}.logits", np.float32, lead + (vocab,), where)
    k = min(TOP_K, vocab)
    idx = _array(arrays, f"{prefix}.topk_indices", np.int32, lead + (k,), where).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= vocab):
        raise ArtifactError(f"{where}: {prefix}.topk_indices out of the vocabulary")
    vals = _array(arrays, f"{prefix}.topk_values", np.float32, lead + (k,), where)
    out = np.full(lead + (vocab,), -np.inf, dtype=np.float32)
    np.put_along_axis(out, idx, vals, -1)
    return out


def _case(arrays: dict, prefix: str, case: Case, c, topk: bool, where: str) -> RecordedCase:
    lead = (case.batch, case.seq)
    total = case.past + case.seq
    pos = arrays.get(f"{prefix}.present_positions")
    if pos is not None:
        pos = _array(arrays, f"{prefix}.present_positions", np.int64, (len(key_positions(total)),), where)
        if pos.size and (pos.min() < 0 or pos.max() >= total):
            raise ArtifactError(f"{where}: {prefix}.present_positions out of the case's {total} keys")
    s = total if pos is None else pos.size
    present = _array(arrays, f"{prefix}.present", np.float32,
                     (c.n_layers, 2, case.batch, c.n_kv_heads, s, c.head_dim), where)
    if not topk:
        logits = _array(arrays, f"{prefix}.logits", np.float32, lead + (c.vocab_size,), where)
        return RecordedCase(logits, None, None, None, float(np.abs(logits).max(initial=0.0)), present, pos)
    k = min(TOP_K, c.vocab_size)
    idx = _array(arrays, f"{prefix}.topk_indices", np.int32, lead + (k,), where)
    if idx.size and (idx.min() < 0 or idx.max() >= c.vocab_size):
        raise ArtifactError(f"{where}: {prefix}.topk_indices out of the vocabulary")
    return RecordedCase(None, _array(arrays, f"{prefix}.topk_values", np.float32, lead + (k,), where), idx,
                        _array(arrays, f"{prefix}.lse", np.float32, lead, where),
                        float(_array(arrays, f"{prefix}.absmax", np.float32, (), where)), present, pos)


@dataclass(kw_only=True)
class RecordedContext(Context):
    """The decoder's check context with eager's references served by a record (eager is never run)."""

    record: RecordedReference = field(default=None)  # type: ignore[assignment]

    @property
    def recorded(self) -> RecordedReference:  # the checks ask ``ctx.recorded is not None``
        return self.record

    def reference(self, case: Case):
        got = self.record.cases.get(case)
        if got is None:
            raise NotRecorded(f"the record holds no eager reference for {case.name} (it was made for "
                              f"{len(self.record.cases)} sweep cases)")
        return got

    def summarize(self, runner, case: Case, out, ref, runs) -> CaseRun:
        """What the sweep keeps of a runtime's run of ``case`` against the record (``ref``: its
        :class:`RecordedCase`): non-finite counts, the contract's shapes, the recorded scale (max |eager logits|)
        and {kind: Diff} on what was kept; no per-present-output figures and no first bad position (a top-k record
        cannot say it)."""
        if not isinstance(ref, RecordedCase):
            return super().summarize(runner, case, out, ref, runs)
        run = CaseRun(non_finite=non_finite(self.named_outputs(out)), shape_problem=self.shape_problem(case, out))
        if self.compared(runner):
            run.scale = ref.absmax
            run.by_kind = ref.compare(out, self.tol, case.real_rows(), case.real_keys())
        return run

    def compare(self, case: Case, actual, expected, tol: Tolerance) -> dict[str, Diff]:
        if isinstance(expected, RecordedCase):
            return expected.compare(actual, tol, case.real_rows(), case.real_keys())
        return super().compare(case, actual, expected, tol)

    def greedy_reference(self, key: str, prompt: np.ndarray, n: int):
        from mhaexport.verify.checks import Greedy

        got = self.record.greedy.get(key)
        if got is None:
            raise NotRecorded(f"the record holds no greedy generation {key!r}")
        p, tokens, logits = got
        if p.tolist() != np.asarray(prompt).reshape(-1).tolist() or len(tokens) != n:
            raise NotRecorded(f"the record's greedy generation {key!r} was made from another prompt or length: "
                              "record it again with this mhaexport")
        return Greedy(tokens, list(logits))

    def ref_compare(self, got: np.ndarray, ref: np.ndarray, tol: Tolerance) -> Diff:
        if not self.record.topk:
            return compare(got, ref, tol)
        sel = np.isfinite(ref)
        return compare(np.asarray(got)[sel], ref[sel], tol)

