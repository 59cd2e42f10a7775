"""``verify --bisect`` follows the check that failed. Bisect's module-by-module comparison answers "where does one
call of the graph depart from eager?" — the question a parity failure asks. Two other failures ask another:

- **a deploy-loop failure** (kv-consistency, padding or generation failed in the loop generate and bench run —
  buffers reused in place over a ragged right-padded batch — while parity passed): :func:`bisect_deploy` runs that
  protocol, rows together, and compares each step's logits and each layer's cache with eager fed each row's
  tokens alone: the first step, row and tensor that differ;
- **a weights failure** (a quantized tensor differs from its recipe): the weights check's tensor and block, and
  the module that tensor belongs to (its node's scope, read from the float source when the quantizer dropped it).

:func:`followed_failure` reads the folder's verify report (written since its last export) to choose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from mhaexport.core.errors import MhaExportError
from mhaexport.core.untrusted import shown

DEPLOY_CHECKS = ("kv-consistency", "padding", "generation")


@dataclass
class FollowReport:
    """What bisect found when it followed a failed check: ``ok`` when the followed protocol agrees with eager."""

    check: str  # the check followed: "weights", or "kv-consistency" (... failed in the deploy loop)
    runtime: str
    protocol: str
    ok: bool
    lines: list[str] = field(default_factory=list)
    where: str = ""  # the one-line location of the first difference
    figures: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        return "\n".join(shown(line) for line in [f"bisect follows {self.runtime}'s {self.check} check: "
                                                   f"{self.protocol}"] + self.lines)  # each line one line


@dataclass
class BisectRun:
    """What ``verify --bisect`` found (:func:`mhaexport.api.bisect_folder`): the failed check it followed (``followed``;
    None when there was none to follow) and bisect's module-by-module comparison (``report``, a
    :class:`~mhaexport.diagnose.bisect.BisectReport`; None when the followed check's own bisect found the difference).
    True when neither found one."""

    followed: FollowReport | None
    report: object | None
    verdict: object | None = None  # verify's verdict (a Verdict) bisect followed; its exit is bisect's
    verified: str = ""  # where that verdict came from: a report's name, or "verify run now"

    @property
    def ok(self) -> bool:
        return (self.verdict is None or bool(self.verdict)) and all(
            r is None or r.ok for r in (self.followed, self.report))

    def __bool__(self) -> bool:
        return self.ok

    def summary(self) -> str:
        return "\n".join(r.summary() for r in (self.followed, self.report) if r is not None)

    @property
    def found(self) -> str | None:
        """Where bisect found a difference, in one line (the followed check's first difference, the module the
        graph or program first diverges at, a mask the graph holds otherwise than the model), None when it found
        none."""
        found = None
        f, r = self.followed, self.report
        if f is not None and not f.ok:
            found = f"bisect followed {f.runtime}'s {f.check} check: the first difference is {f.where}"
        if r is not None and not r.ok:
            where = r.culprit or r.first_divergent
            step = f", step '{r.step.step}'" if r.step is not None and r.steps_module == where.module else ""
            s = r.shapes
            fused = f" inside its fused {r.fused_op}" if getattr(r, "fused_op", None) else ""
            what = "the torch.export program" if r.kind == "pt2" else "the ONNX graph"
            found = (f"{what} diverges from eager PyTorch at {where.module}{fused} ({where.onnx_value}, rel err "
                     f"{where.rel:.1e}){step} at batch={s['batch']} seq={s['seq']} past={s['past']}")
        if r is not None and r.kind == "onnx" and r.masks:  # a window or softcap, whatever the case
            mask = f"the graph's mask differs from the model's at {r.masks[0].line()}"
            found = f"{found}; {mask}" if found else mask
        return found

    @property
    def exit(self) -> tuple[int, str]:
        """(code, message) of ``verify --bisect``: verify's verdict (1 failed, 4 not verified), and 1 also when bisect
        found a difference in a passing one (:func:`mhaexport.core.errors.raise_for_verdict` makes it the exit)."""
        found, v = self.found, self.verdict
        said = "; ".join(x for x in (None if v is None or v else f"verify ({self.verified}): {v.message}", found)
                         if x)
        return (1 if found is not None else (v.code if v is not None else 0)), said


CONTRACT_RUNTIMES = ("ort-cpu", "ort-cuda")  # runtimes verify drives in the contract's protocol (parity's)


def newest_report(folder):
    """(name, VerifyReport) of the folder's newest verify report written since its last export (report.json or a
    ``--runtime`` run's report-*.json; an unreadable one is passed over); None when there is none."""
    from mhaexport.artifact import ExportFolder
    from mhaexport.verify.report import read_report_in

    folder = folder.path if isinstance(folder, ExportFolder) else Path(folder)
    exported = (folder / "manifest.json").stat().st_mtime
    reports = sorted((p for p in folder.glob("report*.json") if p.lstat().st_mtime >= exported),
                     key=lambda p: p.lstat().st_mtime, reverse=True)
    for path in reports:
        try:  # read confined: a link in the folder is refused (passed over), never followed
            report = read_report_in(folder, path.name)
        except MhaExportError:
            continue
        if report is not None:
            return path.name, report
    return None


def failure_to_follow(report) -> tuple[str, str, object] | None:
    """(kind, runtime, CheckResult) of the failed check of a verify report that bisect follows, in that check's
    protocol: ("parity", ...) when a contract runtime's parity failed (bisect's module comparison, at its worst
    case), else ("weights", ...) when a quantized tensor differs from its recipe, else ("deploy", ...) when a check
    run in a deploy protocol failed — the deploy loop's kv-consistency, padding or generation (a ragged batch over
    a shared buffer), or any of onnxruntime-genai's (its generator drives the file that way); None when nothing
    bisect can follow failed."""
    ort = {rt: checks for rt, checks in report.results.items() if rt.startswith("ort-") and ":" not in rt}

    def failed(rt, name):
        r = ort[rt].get(name)
        return r if r is not None and r.status is False else None

    for rt in sorted(ort, key=lambda r: r != "ort-cpu"):
        if rt in CONTRACT_RUNTIMES and failed(rt, "parity") is not None:  # (a failed result is falsy)
            return "parity", rt, failed(rt, "parity")
    for rt in ort:
        if failed(rt, "weights") is not None:
            return "weights", rt, failed(rt, "weights")
    for rt in sorted(ort, key=lambda r: r != "ort-cpu"):  # ort-cpu's own deploy loop first: it replays exactly
        for name in ("parity",) + DEPLOY_CHECKS:
            r = failed(rt, name)
            if r is not None and (rt not in CONTRACT_RUNTIMES or "deploy loop" in r.message
                                  or "deploy" in str(getattr(r.figures, "protocol", None) or "")):
                return "deploy", rt, r
    return None


def followed_failure(folder) -> tuple[str, str, object] | None:
    """(kind, runtime, CheckResult) of the failure bisect should follow in the folder's newest verify report written
    since its last export: ("weights", ...) or ("deploy", ...) as :func:`failure_to_follow` says; None when parity
    failed (bisect's own question), nothing followable failed, or no such report."""
    found = newest_report(folder)
    failure = failure_to_follow(found[1]) if found is not None else None
    return failure if failure is not None and failure[0] != "parity" else None


def follow_weights(folder, runtime: str, result) -> FollowReport:
    """The weights check's first difference — tensor, role, block — and the module holding that tensor."""
    from mhaexport.artifact import opened
    from mhaexport.diagnose.bisect import _module_paths, _quantized_scope_hints, BLOCK_RE
    from mhaexport.core.graph import name_scopes
    from mhaexport.runners.wire import read_graph

    first = str(getattr(result.figures, "first_difference", None) or result.message)
    tensor = first.split(" ", 1)[0]
    module = None
    with opened(folder, "onnx") as ef:
        entry = ef.entry("onnx")
        nodes = read_graph(ef.file("onnx"))[0].graph.node
        hints, _ = _quantized_scope_hints(ef, entry, nodes)
        for n in nodes:
            if tensor in n.input:
                paths = _module_paths(name_scopes(n) or hints.get(n.name))
                module = paths[-1] if paths else f"{n.op_type} {n.name}"
                break
    block = BLOCK_RE.match(module or "")
    where = f"{tensor} of {module}" if module else tensor
    lines = [f"first difference: {first}",
             f"culprit{f' in block {block.group(1)}' if block else ''}: {module or 'a tensor no module scope names'}: "
             f"its quantized weight {tensor} differs from the recorded recipe re-run on its source"]
    return FollowReport("weights", runtime, "the quantized weights against their recipe", False, lines, where,
                        {"tensor": tensor, "module": module, "first_difference": first})


def bisect_deploy(folder, loaded=None, *, n_new: int = 4, seed: int = 0, tol: float | None = None,
                  runtime: str = "ort-cpu", check: str = "kv-consistency") -> FollowReport:
    """Run the folder's ONNX file in the deploy loop (the runner generate and bench use: a shared cache's buffers
    reused in place, a ragged batch padded as the loop pads it, rows together) and compare, step by step, each row's
    logits and each layer's cache (its real positions) with eager fed that row's tokens alone. The first step, row
    and tensor beyond ``tol`` (relative to max|eager|; default: 1e-3, 1e-2 for float16, a quantized scheme's
    logit error) are named."""
    from mhaexport.artifact import opened
    from mhaexport.models.loading import check_same_model, load_recorded
    from mhaexport.runtime.decode import DecodeLoop, pad_prompts
    from mhaexport.diagnose.attention_steps import relative_error
    from mhaexport.diagnose.bisect import _quantization, quantized_tolerance
    from mhaexport.verify.checks import ragged_prompts
    from mhaexport.runners.names import ORT_CPU
    from mhaexport.runners.registry import DEPLOY, runner_for

    with opened(folder, "onnx") as ef:
        if loaded is None:
            loaded = load_recorded(ef)
        else:
            check_same_model(loaded, ef.model)
        c = loaded.contract
        entry = ef.entry("onnx")
        if tol is None:
            quant = _quantization(entry)
            tol = quantized_tolerance(quant)[0] if quant else (1e-2 if entry.dtype != "float32" else 1e-3)
        twin = runner_for(ef, ORT_CPU, c, protocol=DEPLOY)  # the file in its own protocol, as generate drives it
        twin.activate()
        try:
            prompts = [p.tolist() for p in ragged_prompts(SimpleNamespace(contract=c), n_new, seed + 43)]
            padding = twin.protocol.padding  # the protocol the deploy loop drives the file in
            ids, mask, lengths = pad_prompts(prompts, c.vocab_size, c.max_positions, 0, side=padding)
            loop = DecodeLoop(twin)
            logits, state = loop.prefill(ids, mask, ids.shape[1] + n_new)
            steps = []  # (logits (B, V), cache per layer ((B, H, S, D), ...), the mask so far)
            tokens = [[] for _ in prompts]
            for i in range(n_new):
                steps.append((np.asarray(logits), twin.cache_numpy(state.cache), state.attention_mask.copy()))
                nxt = np.argmax(logits, axis=-1)  # greedy, as verify's deploy check
                for b, t in enumerate(nxt.tolist()):
                    tokens[b].append(int(t))
                if i + 1 < n_new:
                    logits, state = loop.decode_one_token(nxt, state)
        finally:
            twin.deactivate()
    shared = twin.protocol.in_place  # rows packed from slot 0 in one buffer per layer
    protocol = (f"the deploy loop ({'one buffer per layer reused in place, ' if shared else ''}a ragged "
                f"{padding}-padded batch of {len(prompts)} rows of {[len(p) for p in prompts]} tokens, rows "
                f"together, {n_new} steps)")
    rows_out: list[tuple[int, int, str, float, float]] = []  # (step, row, tensor, rel, max_abs)
    first = None
    for b, p in enumerate(prompts):
        seq = np.array([p + tokens[b][:n_new - 1]], dtype=np.int64)  # (1, S)
        ref_logits, ref_present = _eager(loaded.module, seq)
        for i, (lg, cache, m) in enumerate(steps):
            S = len(p) + i  # positions row b holds after step i
            real = np.arange(S) if shared else np.nonzero(m[b])[0]  # the row's slots: packed, or where its mask is 1
            compared = []  # in the order the graph computes them: each layer's cache, then the logits
            for layer, (k, v) in enumerate(cache):
                for name, got, want in ((f"present.{layer}.key", k, ref_present[layer][0]),
                                        (f"present.{layer}.value", v, ref_present[layer][1])):
                    compared.append((name, *relative_error(got[b][:, real], want[0][:, :S])))
            compared.append(("logits", *relative_error(lg[b], ref_logits[0, S - 1])))
            for name, a, r in compared:
                rows_out.append((i, b, name, r, a))
                if not r <= tol and (first is None or (i, b) < first[:2]):
                    first = (i, b, name, r, a)
    lines = [f"  {'step':<10} {'row':<14} {'tensor':<20} {'rel err':>9}"]
    worst = {}
    for i, b, name, r, a in rows_out:  # one line per (step, row): its worst tensor
        if (i, b) not in worst or r > worst[(i, b)][1]:
            worst[(i, b)] = (name, r)
    for (i, b), (name, r) in sorted(worst.items()):
        mark = "  <-- first difference" if first is not None and (i, b) == first[:2] else ""
        lines.append(f"  {'prefill' if i == 0 else f'decode {i}':<10} {f'{b} ({len(prompts[b])} tokens)':<14} "
                     f"{name:<20} {r:9.1e}{mark}")
    fig = {"prompts": [len(p) for p in prompts], "steps": n_new, "tol": tol}
    if first is None:
        lines.append(f"no difference: every step's logits and cache of every row within {tol:.0e} of eager")
        return FollowReport(check, runtime, protocol, True, lines, "", fig)
    i, b, name, r, a = first
    step = "the prefill" if i == 0 else f"decode step {i}"
    where = f"{step}, row {b} ({len(prompts[b])} tokens), {name}"
    earlier = [x for x in rows_out if (x[0], x[1]) < (i, b)]
    agree = (f" (everything before it agrees: worst {max(x[3] for x in earlier):.1e})" if earlier else "")
    lines.append(f"first difference: {where}: rel err {r:.1e} (max abs {a:.3g}){agree}")
    others = sorted({x[2] for x in rows_out if (x[0], x[1]) == (i, b) and not x[3] <= tol})
    lines.append(f"  at that step and row, differing: {', '.join(others)}")
    fig.update(step=i, row=b, tensor=name, rel=float(r))
    return FollowReport(check, runtime, protocol, False, lines, where, fig)


def _eager(module, seq: np.ndarray):
    """Eager's logits (1, S, V) and present ((1, H, S, D) key, value per layer) for one row of tokens."""
    import torch

    with torch.no_grad():
        logits, present = module(torch.from_numpy(seq), torch.ones_like(torch.from_numpy(seq)), None)
    return logits.float().numpy(), [(k.float().numpy(), v.float().numpy()) for k, v in present]


def follow(folder, loaded=None, *, seed: int = 0, failure=None) -> FollowReport | None:
    """What ``verify --bisect`` runs first: the failed check it should follow (``failure``: :func:`failure_to_follow`
    of verify's report; default: the folder's newest report's) — a weights or a deploy-loop failure — bisected in
    that check's terms; None when there is none to follow (parity failed, or nothing followable): bisect's module
    comparison answers then. ``folder`` (here and in the functions it calls): a path, opened and closed here, or an
    opened ExportFolder, used as it is."""
    found = followed_failure(folder) if failure is None else failure
    if found is None or found[0] == "parity":
        return None
    kind, runtime, result = found
    if kind == "weights":
        return follow_weights(folder, runtime, result)
    return bisect_deploy(folder, loaded, seed=seed, runtime=runtime, check=result.check)
