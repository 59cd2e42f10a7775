"""The serving checks of onnxruntime-genai's loop (``ort-genai``, the suite's ``loop`` subject), where its API drives
it (onnxruntime-genai 0.18), each request held to the same request in its own plain loop (:func:`genai_trace`, which
also gives the logits the tie rule reads):

- ``continuous-batching``: its ``og.Engine`` with the requests of verify/serving.py arriving at the same steps. For
  a file without PagedAttention (every mhaexport export: no ``engine.dynamic_batching``) the Engine runs *static*
  batches: requests that arrive while a batch runs wait for it to end (its paged, dynamic path is continuous). Each
  request's tokens against its run alone; the Engine hands out tokens, not logits.
- ``speculative``: its own speculative decoding — n-gram lookup (``ngram_size``) on a repetitive and a random
  prompt, and a draft model (``model.draft``, the same file overlaid on the config) — against its plain greedy loop.
- ``prefix-reuse``: its ``Generator.rewind_to``: a request decoded after a prefix, the generator rewound to the
  prefix and a second request fed after it, against the second request alone (its Engine reuses no prefix for a
  file without PagedAttention: ``cached_prompt_tokens`` stays 0).

Judged as verify/serving.py judges tokens: equal, a divergence within the allowance of the run alone's margin a
near-tie (eager's floor is the contract runtimes'; here the allowance is the dtype's rounding at the logits' scale).
"""

from __future__ import annotations

import json

import numpy as np

from mhaexport.core.errors import MhaExportError, RuntimeFailure, first_line
from mhaexport.runners.genai import GenAIRunner
from mhaexport.verify.figures import ServingFigures
from mhaexport.verify.genai_runtime import _ids_of
from mhaexport.verify.results import CONTINUOUS_BATCHING, PREFIX_REUSE, SPECULATIVE, CheckResult, Context
from mhaexport.verify.serving import _EPS, AGAINST, NOISE_FACTOR, WHAT, Run, batching_requests, speculative_prompts

ENGINE_STATIC = ("og.Engine, static batches (a file without PagedAttention: requests arriving during a batch wait for "
                 "it)")


def _og():
    from mhaexport.runtime.genai import import_og

    return import_og()


def _allowed_ids(runner: GenAIRunner, ctx: Context) -> np.ndarray:
    model = runner.model_section
    special = set().union(*map(_ids_of, (model.bos_token_id, model.eos_token_id, model.pad_token_id)))
    return np.array([i for i in range(ctx.contract.vocab_size) if i not in special])


def _clean(tokens: list[int], allowed: np.ndarray, seed: int) -> list[int]:
    """``tokens`` with each special id (onnxruntime-genai reads a pad id in a prompt as padding) replaced."""
    ok = set(allowed.tolist())
    rng = np.random.default_rng(seed)
    return [t if t in ok else int(rng.choice(allowed)) for t in tokens]


def _model(runner: GenAIRunner, eos: int | None, overlay: dict | None = None):
    """onnxruntime-genai's Model of the folder, its loop stopping at ``eos`` (None: the config's, which every run
    compared shares), with ``overlay`` on its config's ``model`` section."""
    og = _og()
    from mhaexport.runtime.genai import check_options

    check_options(runner.root, runner.shown, trust_code=runner.trust_code)
    config = og.Config(str(runner.root))
    model = {} if eos is None else {"eos_token_id": int(eos)}
    model.update(overlay or {})
    # ONNX Runtime's own error lines stay quiet: what fails is this check's result (its Engine's known defect too)
    model["decoder"] = {"session_options": {"log_severity_level": 4}}
    config.overlay(json.dumps({"model": model}))
    return og.Model(config)


def _alone(model, prompt: list[int], n: int, pad: int, eos: int | None) -> tuple[list[int], list[np.ndarray]]:
    """The request in onnxruntime-genai's plain loop: its tokens (eos included) and each token's logits."""
    from mhaexport.runtime.genai import genai_trace

    tr = genai_trace(model, [prompt], n, pad, eos)
    toks = tr.tokens[0][:n]
    if eos is not None and eos in toks:
        toks = toks[:toks.index(eos) + 1]
    return toks, [np.asarray(lg, np.float64) for lg in tr.logits[0][:len(toks)]]


def judge_tokens(check: str, runner: GenAIRunner, ctx: Context, runs: list[Run], engine: str,
                 what: str | None = None) -> CheckResult:
    """Each run's tokens against its plain loop's: equal, or diverging at a near-tie of the plain loop's logits."""
    scale = max((r.scale() for r in runs), default=0.0)
    rounding = _EPS.get(runner.dtype, _EPS["float32"]) * max(scale, 1.0)
    allowed = NOISE_FACTOR * rounding
    rows, bad, ties = [], [], 0
    for r in runs:
        d = r.divergence
        row = {"run": r.label, **r.info, "tokens": len(r.want_tokens), "first_divergence": d}
        if d is not None:
            if d < len(r.want_logits) and d < len(r.got_tokens):
                ref = r.want_logits[d]
                margin = float(ref.max() - ref[r.got_tokens[d]])
                row["margin"] = float(f"{margin:.3g}")
                if margin <= allowed:
                    row["tie"] = True
                    ties += 1
                else:
                    bad.append(f"{r.label} diverges from {AGAINST[check]} at token {d} (margin {margin:.3g})")
            else:
                bad.append(f"{r.label} stops after {len(r.got_tokens)} tokens where {AGAINST[check]} gives "
                           f"{len(r.want_tokens)}")
        rows.append(row)
    fig = ServingFigures.of(runs=rows, rounding=float(f"{rounding:.3g}"), allowed=float(f"{allowed:.3g}"),
                            ties=ties or None, engine=engine)
    if bad:
        return CheckResult(check, False, fig, f"onnxruntime-genai ({engine}): {bad[0]}"
                                              f"{f' (+{len(bad) - 1} more)' if len(bad) > 1 else ''}")
    tie = f", {ties} near-tie(s)" if ties else ""
    return CheckResult(check, True, fig, f"onnxruntime-genai ({engine}): {len(runs)} runs {what or WHAT[check]} "
                                         f"equal {AGAINST[check]} in its plain loop{tie}")


def _guarded(check: str, body):
    def run(runner: GenAIRunner, ctx: Context) -> CheckResult:
        try:
            return body(runner, ctx)
        except MhaExportError:
            raise
        except Exception as e:  # noqa: BLE001 - onnxruntime-genai's own exceptions: its loop failing is a result
            raise RuntimeFailure(f"onnxruntime-genai failed: {first_line(e)}") from None

    run.__name__ = f"check_{check.replace('-', '_')}"
    run.__doc__ = body.__doc__
    return run


def _batching(runner: GenAIRunner, ctx: Context) -> CheckResult:
    """og.Engine over the requests of verify/serving.py's continuous batch (static batches for this file)."""
    og = _og()
    allowed = _allowed_ids(runner, ctx)
    reqs = batching_requests(ctx.contract, ctx.seed + 61)
    prompts = [_clean(list(r.prompt), allowed, ctx.seed + i) for i, r in enumerate(reqs)]
    pad = runner.model_section.pad_token_id if isinstance(runner.model_section.pad_token_id, int) else 0
    probe_model = _model(runner, None)
    probe, _ = _alone(probe_model, prompts[1], reqs[1].max_new_tokens, pad, None)
    eos = next((t for t in probe[1:] if t != probe[0]), None)
    model = _model(runner, eos)
    share = bool(runner.search.past_present_share_buffer)
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(64)
    handles, got, joined, step = {}, {i: [] for i in range(len(reqs))}, {}, 0
    waiting = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival, i))
    flag = {name: int(getattr(og.EngineEventFlags, name)) for name in ("TOKEN", "TURN_FINISHED", "FAILED")}
    finished = 0
    while waiting or engine.has_pending_requests():
        while waiting and reqs[waiting[0]].arrival <= step:
            i = waiting.pop(0)
            request = engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(reqs[i].max_new_tokens)
            options.set_do_sample(False)
            request.begin_turn(np.asarray(prompts[i], np.int32), options)
            handles[i] = request
        if not engine.has_pending_requests():
            step = reqs[waiting[0]].arrival
            continue
        for ev in engine.run(buffer):
            flags = int(ev.flags)
            if flags & flag["FAILED"]:
                for h in handles.values():
                    h.close()
                if not share and finished:  # onnxruntime-genai's own defect, named (a later version may not have it)
                    return _concat_defect(og, ServingFigures.of(engine=ENGINE_STATIC),
                                          f"{ev.error_code.name} once a co-scheduled request ended")
                raise RuntimeFailure(f"onnxruntime-genai's Engine failed: {ev.error_code.name}")
            i = next((k for k, h in handles.items() if ev.request is not None and _same(ev.request, h)), None)
            if i is None:
                continue
            if flags & flag["TOKEN"]:
                joined.setdefault(i, step)
                got[i].append(int(ev.token))
            if flags & flag["TURN_FINISHED"]:  # (at eos it hands out no token, as its Generator appends none)
                finished += 1
        step += 1
        if step > 10_000:
            raise RuntimeFailure("onnxruntime-genai's Engine did not finish its requests in 10,000 steps")
    for h in handles.values():
        h.close()
    runs = []
    for i, r in enumerate(reqs):
        toks, lgs = _alone(model, prompts[i], r.max_new_tokens, pad, eos)
        runs.append(Run(f"request {i}", got[i], [], toks, lgs, {"prompt": len(prompts[i]), "arrival": r.arrival,
                                                                "joined": joined.get(i)}))
    res = judge_tokens(CONTINUOUS_BATCHING, runner, ctx, runs, ENGINE_STATIC, "co-scheduled in its Engine")
    if res.status is False and not share:
        return _concat_defect(og, res.figures, f"a shorter row's tokens diverge: {res.message.split('): ', 1)[-1]}")
    return res


def _concat_defect(og, figures: ServingFigures, what: str) -> CheckResult:
    """onnxruntime-genai's Engine on a file without past_present_share_buffer (a concat cache): its static batches
    lay each row's mask out packed from column 0, which a concat cache reads column by column (a shorter row's new
    key is at the last column, masked out), and a request that ends before the others fails the batch — its own
    defect whatever the file (tests/test_genai_serving.py pins both), so not run, never passed."""
    return CheckResult(CONTINUOUS_BATCHING, None, figures,
                       f"not run: onnxruntime-genai {getattr(og, '__version__', '')}'s Engine cannot batch a file "
                       f"without past_present_share_buffer ({what}; its static batches pack each row's mask from "
                       "column 0, which a concat cache reads column by column, and a request that ends first fails "
                       "the batch); a shared-buffer export (--kv-cache shared) runs in its Engine")


def _same(a, b) -> bool:
    try:
        return a == b
    except Exception:  # noqa: BLE001 - handles without equality
        return a is b


def _speculative(runner: GenAIRunner, ctx: Context) -> CheckResult:
    """onnxruntime-genai's n-gram speculative decoding on a repetitive and a random prompt, and its draft-model
    decoding with the file as its own draft (``model.draft`` overlaid), against its plain greedy loop."""
    og = _og()
    allowed = _allowed_ids(runner, ctx)
    repetitive, rand, n = speculative_prompts(ctx.contract, ctx.seed + 67)
    repetitive, rand = _clean(repetitive, allowed, ctx.seed), _clean(rand, allowed, ctx.seed + 1)
    pad = runner.model_section.pad_token_id if isinstance(runner.model_section.pad_token_id, int) else 0
    plain_model = _model(runner, None)
    decoder = runner.config.get("model", {}).get("decoder", {}) if isinstance(runner.config, dict) else {}
    draft_model = _model(runner, None, {"draft": decoder})
    runs, refused = [], []
    for label, model, prompt, options in (
            ("n-gram lookup on the repetitive prompt", plain_model, repetitive, {"ngram_size": 3,
                                                                                 "max_draft_tokens": 4}),
            ("n-gram lookup on the random prompt", plain_model, rand, {"ngram_size": 3, "max_draft_tokens": 4}),
            ("the file as its own draft model", draft_model, rand, {"max_draft_tokens": 4})):
        want, lgs = _alone(plain_model, prompt, n, pad, None)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, do_sample=False)
        params.set_speculative_options(**options)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray(prompt, np.int32))
        try:
            while not gen.is_done():
                gen.generate_next_token()
        except Exception as e:  # noqa: BLE001 - its refusal to rewind past a window cache's slack: said, not judged
            if "Cannot rewind" not in str(e):
                raise
            refused.append({"run": label, "prompt": len(prompt), "refused": first_line(e)})
            continue
        got = [int(t) for t in gen.get_sequence(0)][len(prompt):len(prompt) + n]
        stats = gen.get_speculative_stats()
        runs.append(Run(label, got, [], want, lgs, {"prompt": len(prompt),
                                                    "drafted": int(stats.get("draft_tokens_proposed", 0)),
                                                    "accepted": int(stats.get("draft_tokens_accepted", 0))}))
    if not runs:
        return CheckResult(SPECULATIVE, None, ServingFigures.of(runs=refused), f"not run: onnxruntime-genai "
                                                                               f"refused every run: {refused[0]['refused']}")
    res = judge_tokens(SPECULATIVE, runner, ctx, runs, "og.Generator with set_speculative_options")
    if refused:  # onnxruntime-genai refuses to take back positions its window cache evicted: its own rule, named
        res.figures.runs = res.figures.runs + refused
        res.message += (f"; {len(refused)} run(s) refused by onnxruntime-genai (a rewind past its window cache's "
                        f"slack): {refused[0]['refused']}")
    return res


def _prefix(runner: GenAIRunner, ctx: Context) -> CheckResult:
    """onnxruntime-genai's Generator rewound to a prefix (``rewind_to``) and fed a second request's tokens after it,
    against each request alone."""
    og = _og()
    allowed = _allowed_ids(runner, ctx)
    rng = np.random.default_rng(ctx.seed + 71)
    c, n = ctx.contract, 6
    prefix = rng.choice(allowed, size=max(4, min(8, c.max_positions // 8))).tolist()
    suffixes = [rng.choice(allowed, size=3).tolist(), rng.choice(allowed, size=5).tolist()]
    pad = runner.model_section.pad_token_id if isinstance(runner.model_section.pad_token_id, int) else 0
    model = _model(runner, None)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prefix) + max(map(len, suffixes)) + n, do_sample=False)
    gen = og.Generator(model, params)
    runs = []
    for j, s in enumerate(suffixes):
        if j:
            gen.rewind_to(len(prefix))
            gen.append_tokens(np.asarray(s, np.int32))
        else:
            gen.append_tokens(np.asarray(prefix + s, np.int32))
        for _ in range(n):
            gen.generate_next_token()
        got = [int(t) for t in gen.get_sequence(0)][len(prefix) + len(s):len(prefix) + len(s) + n]
        want, lgs = _alone(model, prefix + s, n, pad, None)
        runs.append(Run(f"request {j}" + (" after rewind_to(prefix)" if j else ""), got, [], want, lgs,
                        {"prompt": len(prefix) + len(s), "prefix": len(prefix)}))
    return judge_tokens(PREFIX_REUSE, runner, ctx, runs, "og.Generator.rewind_to (its Engine reuses no prefix of "
                                                         "this file: cached_prompt_tokens 0)")


check_continuous_batching = _guarded(CONTINUOUS_BATCHING, _batching)
check_speculative = _guarded(SPECULATIVE, _speculative)
check_prefix_reuse = _guarded(PREFIX_REUSE, _prefix)
