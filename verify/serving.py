"""The serving checks: what a serving stack does with the file, each request held to its run alone (the suite's
``contract`` subject; onnxruntime-genai's loop: verify/genai_serving.py). Every runtime runs them in its file's own
protocol (the deploy loop's: a shared or window cache's buffers in place), through the runtime's loops
(:mod:`mhaexport.runtime.serve`, :mod:`mhaexport.runtime.speculative`, :meth:`DecodeLoop.fork`):

- ``continuous-batching``: requests of different prompt lengths arrive at given decode steps over two rows; a row
  retires at its request's eos or budget and the next request takes it. Each request's tokens and logits against
  the same request generated alone.
- ``speculative``: greedy speculative decoding against plain greedy decoding of the same prompt — prompt lookup on a
  repetitive and a random prompt, the file as its own draft model, and a scripted drafter that proposes the
  target's runner-up token where its margin is smallest (a near-tie must be rejected) and wrong tokens between
  agreeing ones (partial acceptance: the cache rewound).
- ``prefix-reuse``: a prefix's cache computed once and reused by two requests — forked and advanced in turn (each
  writes its own positions after the prefix), and as two rows of a continuous batch — each against the request
  computed alone.

**Noise and bugs.** A request's logits in a batch (or k + 1 positions in one call, or a chunked prefill) differ from
alone by rounding: other shapes, other reduction orders. Eager's own difference over the same requests is the
*floor*, measured first; a runtime passes when every request's tokens are its tokens alone — a divergence where the
run alone's margin between its token and the one chosen is within the allowance passes as a near-tie — and its
logits differ by at most the *allowance*: :data:`NOISE_FACTOR` x max(floor, the artifact dtype's epsilon x the
logits' largest magnitude) — for a lossy file with int8 activations at least the allowance its other
self-comparisons use (a requantization step: :func:`mhaexport.verify.quality.self_tolerance`). Both figures are in
the result; each request's first divergence is in its figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mhaexport.core.errors import MhaExportError
from mhaexport.core.iospec import WINDOW_SLACK, ModelContract
from mhaexport.runners.names import EAGER
from mhaexport.runners.plan import BLOCK, order_of, run_plan
from mhaexport.runners.tape import Recorder, Tape, Untaped, tape_unsupported
from mhaexport.runtime.decode import STOP_MAX_POS, DecodeLoop, GenerationConfig, GenerationResult
from mhaexport.runtime.runner import Runner
from mhaexport.runtime.serve import Request, Scheduler, alone
from mhaexport.runtime.speculative import DraftModel, PromptLookup, speculative_generate
from mhaexport.verify.compare import rounded
from mhaexport.verify.figures import ServingFigures
from mhaexport.verify.results import CONTINUOUS_BATCHING, PREFIX_REUSE, SPECULATIVE, CheckResult, Context
from mhaexport.verify.windows import BEYOND, crossing

# a runtime's serving difference passes up to this many times the larger of eager's floor and its dtype's rounding
# at the logits' scale: measured on the presets, the floor and every runtime's difference stay within ~3 x the
# dtype's rounding (docs/measurements/serving-2026-12-06.md); a planted bug differs by 10^4-10^7 x
NOISE_FACTOR = 100.0
ROWS = 2  # the continuous batch's rows
DRAFT_TOKENS = 4  # speculative decoding's drafts per call


@dataclass
class Run:
    """One request (or one generation) of a serving run against the same request alone: tokens and each token's
    (V,) logits, both ways; where it came from (the figures' row)."""

    label: str
    got_tokens: list[int]
    got_logits: list[np.ndarray]
    want_tokens: list[int]
    want_logits: list[np.ndarray]
    info: dict = field(default_factory=dict)

    @property
    def divergence(self) -> int | None:
        """The first token index where the serving run's token differs from alone's (or one ran longer), or None."""
        for i, (a, b) in enumerate(zip(self.got_tokens, self.want_tokens)):
            if a != b:
                return i
        if len(self.got_tokens) != len(self.want_tokens):
            return min(len(self.got_tokens), len(self.want_tokens))
        return None

    def max_abs(self) -> float:
        """The largest logits difference at each token up to and including the first divergence (inf where either
        side is not finite: NaN is never equal)."""
        d = self.divergence
        upto = min(len(self.got_logits), len(self.want_logits), len(self.got_tokens) if d is None else d + 1)
        worst = 0.0
        for a, b in zip(self.got_logits[:upto], self.want_logits[:upto]):
            err = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
            worst = max(worst, float(err.max()) if np.isfinite(err).all() else float("inf"))
        return worst

    def scale(self) -> float:
        """The largest finite |logit| of the runs alone (the dtype's rounding is taken at it)."""
        return max((float(np.abs(b[np.isfinite(b)]).max(initial=0.0)) for b in self.want_logits), default=0.0)


# ---- the runs ---------------------------------------------------------------------------------------------------

def _loop_of(runner: Runner, ctx: Context) -> DecodeLoop:
    """The decode loop in the file's own protocol (the registry's deploy runner of a shared file's session)."""
    twin = ctx.deploy(runner) if ctx.deploy is not None else None
    return DecodeLoop(twin if twin is not None else runner)


def _tokens(rng: np.random.Generator, c: ModelContract, n: int) -> list[int]:
    return rng.integers(1, c.vocab_size, n).tolist()


def _window_reach(c: ModelContract) -> int:
    """The positions a serving run must reach for a windowed model: past every window's buffer of a window cache
    (W + WINDOW_SLACK slots, where its eviction runs) by BEYOND — the same runs for every runtime and cache kind, so
    eager's floor is measured on them; 0 without windows."""
    if not c.windowed:
        return 0
    return min(max(c.windows) + WINDOW_SLACK + BEYOND, c.max_positions - 1)


def batching_requests(c: ModelContract, seed: int) -> list[Request]:
    """Four requests over two rows: prompts of different lengths arriving at steps 0, 0, 1 and 3, one of them long
    enough to pass every window (a window cache: its buffers)."""
    rng = np.random.default_rng(seed)
    L = max(3, min(10, c.max_positions // 4))
    first = max(6, _window_reach(c) - L + 1)
    shapes = [(L, min(first, c.max_positions - L)), (2, 8), (max(1, L - 3), 4), (5, 5)]
    return [Request(_tokens(rng, c, p), min(n, c.max_positions - p), a)
            for (p, n), a in zip(shapes, (0, 0, 1, 3))]


def run_batching(runner: Runner, ctx: Context) -> list[Run]:
    """The continuous batch of :func:`batching_requests` (eos: a token the second request generates alone, so it
    retires early) against each request alone."""
    loop = _loop_of(runner, ctx)
    reqs = batching_requests(ctx.contract, ctx.seed + 61)
    probe = alone(loop, reqs[1]).tokens[0]
    eos = next((t for t in probe[1:] if t != probe[0]), None)
    cfg = GenerationConfig(eos_token_id=eos)
    # each row's cache as long as the runner takes (not just what the requests need): a row that holds more than its
    # request then shows as the request's tokens diverging, not as a row overflowing
    sched = Scheduler(loop, ROWS, cfg, keep_logits=True, positions=loop.runner.max_length)
    for _ in sched.run(reqs):
        pass
    runs = []
    for i, (r, out) in enumerate(zip(reqs, sched.outcomes)):
        a = alone(loop, r, cfg, keep_logits=True)
        runs.append(Run(f"request {i}", out.tokens, out.logits, a.tokens[0], [lg[0] for lg in a.step_logits],
                        {"prompt": len(r.prompt), "arrival": r.arrival, "joined": out.joined, "row": out.row,
                         "finished": out.finished}))
    return runs


class Scripted:
    """A drafter that replays a plain run's tokens with planted disagreements: at the ``closest`` indices (the plain
    run's smallest top-1 margins) the target's runner-up instead (a near-tie the target must reject), and every
    third round a wrong second draft (partial acceptance)."""

    name = "scripted"

    def __init__(self, prompt_len: int, tokens: list[int], runner_up: dict[int, int], vocab: int) -> None:
        self.P, self.tokens, self.runner_up, self.vocab, self.rounds = prompt_len, tokens, runner_up, vocab, 0

    def propose(self, sequence, k: int) -> list[int]:
        at = len(sequence) - self.P  # the index of the next token the target chooses
        self.rounds += 1
        out = []
        for j in range(at, min(at + k, len(self.tokens))):
            if j in self.runner_up:
                out.append(self.runner_up[j])
            elif self.rounds % 3 == 0 and j == at + 1:
                out.append((self.tokens[j] + 1) % self.vocab)
            else:
                out.append(self.tokens[j])
        return out


def speculative_prompts(c: ModelContract, seed: int) -> tuple[list[int], list[int], int]:
    """A repetitive prompt (a 4-gram over and over: prompt lookup finds drafts), a random one, and the tokens to
    generate (past every window: a window cache's buffers too)."""
    rng = np.random.default_rng(seed)
    gram = _tokens(rng, c, 4)
    P = max(4, min(12, c.max_positions // 4))
    repetitive = (gram * P)[:P]
    n = max(10, _window_reach(c) - P + 1)
    return repetitive, _tokens(rng, c, max(2, P - 4)), max(1, min(n, c.max_positions - P - DRAFT_TOKENS - 1))


def run_speculative(runner: Runner, ctx: Context) -> list[Run]:
    """Speculative generations (prompt lookup x two prompts, the file as its own draft model, the scripted drafter)
    against plain greedy decoding of the same prompt."""
    loop = _loop_of(runner, ctx)
    c = ctx.contract
    repetitive, rand, n = speculative_prompts(c, ctx.seed + 67)
    cfg = GenerationConfig(max_new_tokens=n)
    plain = {name: loop.generate([p], cfg, keep_logits=True) for name, p in (("repetitive", repetitive),
                                                                              ("random", rand))}
    want = {name: ([*r.tokens[0]], [lg[0] for lg in r.step_logits]) for name, r in plain.items()}
    toks, lgs = want["random"]
    margins = [float(np.sort(lg)[-1] - np.sort(lg)[-2]) for lg in lgs]
    closest = sorted(range(1, len(lgs)), key=lambda i: margins[i])[:3]  # index 0 is the prefill's: never drafted
    runner_up = {i: int(np.argsort(lgs[i])[-2]) for i in closest}
    plans = [("prompt-lookup", "repetitive", PromptLookup()), ("prompt-lookup", "random", PromptLookup()),
             ("draft-model", "random", DraftModel(DecodeLoop(loop.runner))),
             ("scripted", "random", Scripted(len(rand), toks, runner_up, c.vocab_size))]
    runs = []
    for drafter, prompt, d in plans:
        p = repetitive if prompt == "repetitive" else rand
        res: GenerationResult = speculative_generate(loop, p, cfg, d, k=DRAFT_TOKENS, keep_logits=True)
        s = res.speculative
        info = {"drafter": drafter, "prompt_kind": prompt, "prompt": len(p), "drafted": s["drafted"],
                "accepted": s["accepted"],
                "rounds": s["rounds"], "target_calls": s["target_calls"]}
        if drafter == "scripted":
            info["near_ties"] = [rounded(margins[i]) for i in closest]
        if res.stop_reason == STOP_MAX_POS:
            info["stopped"] = res.message
        runs.append(Run(f"{drafter} on the {prompt} prompt", res.tokens[0], [lg[0] for lg in res.step_logits],
                        *want[prompt], info))
    return runs


def run_prefix(runner: Runner, ctx: Context) -> list[Run]:
    """A prefix's cache reused by two requests — forked, each fed its own tokens and decoded in turn; and as two
    rows of a continuous batch given the prefix — each against the whole request alone."""
    loop = _loop_of(runner, ctx)
    c = ctx.contract
    rng = np.random.default_rng(ctx.seed + 71)
    n = 6
    P = max(6, _window_reach(c) - 5 - n + 1)  # past every window's buffer (a windowed model)
    P = max(1, min(P, c.max_positions - 5 - n))
    prefix = _tokens(rng, c, P)
    suffixes = [_tokens(rng, c, 3), _tokens(rng, c, 5)]
    cfg = GenerationConfig(max_new_tokens=n)
    alone_runs = [loop.generate([prefix + s], cfg, keep_logits=True) for s in suffixes]
    # forked: the prefix once, each request's suffix fed into its own fork, then one decode step each in turn
    _, base = loop.prefill(np.asarray([prefix], np.int64), np.ones((1, P), np.int64), P + 5 + n)
    states, tokens, logits = [], [[], []], [[], []]
    for j, s in enumerate(suffixes):
        lg, st = loop.feed(np.asarray([s], np.int64), loop.fork(base))
        states.append(st)
        logits[j].append(np.asarray(lg[0, -1], np.float64))
        tokens[j].append(int(np.argmax(lg[0, -1])))
    for _ in range(n - 1):
        for j in range(2):
            lg, states[j] = loop.decode_one_token(np.asarray([tokens[j][-1]]), states[j])
            logits[j].append(np.asarray(lg[0], np.float64))
            tokens[j].append(int(np.argmax(lg[0])))
    runs = [Run(f"forked request {j}", tokens[j], logits[j], alone_runs[j].tokens[0],
                [lg[0] for lg in alone_runs[j].step_logits], {"prompt": P + len(s), "prefix": P, "way": "forked"})
            for j, s in enumerate(suffixes)]
    sched = Scheduler(loop, ROWS, cfg, keep_logits=True, prefixes=[prefix])
    for _ in sched.run([Request(prefix + s, n) for s in suffixes]):
        pass
    runs += [Run(f"batched request {j}", out.tokens, out.logits, alone_runs[j].tokens[0],
                 [lg[0] for lg in alone_runs[j].step_logits],
                 {"prompt": P + len(suffixes[j]), "prefix": out.prefix, "way": "batched", "row": out.row})
             for j, out in enumerate(sched.outcomes)]
    return runs


RUNS = {CONTINUOUS_BATCHING: run_batching, SPECULATIVE: run_speculative, PREFIX_REUSE: run_prefix}
WHAT = {CONTINUOUS_BATCHING: "in a continuous batch", SPECULATIVE: "decoded speculatively",
        PREFIX_REUSE: "after a reused prefix's cache"}
AGAINST = {CONTINUOUS_BATCHING: "its run alone", SPECULATIVE: "plain greedy decoding",
           PREFIX_REUSE: "the whole request alone"}


def taped(check: str, runner: Runner, ctx: Context) -> tuple[list[Run] | None, str]:
    """``check``'s runs on ``runner`` with every call run as one plan, block by block (runners/tape.py: eager's calls
    the guess, the runtime's own outputs confirmed call by call), or (None, why not): the runner runs them itself.
    The same runs either way — a loop that asks for a call not planned is run on the runner (a wrong guess costs
    time, never a result)."""
    order, why = order_of(runner)
    if order != BLOCK:
        return None, why or "the runtime runs call by call"
    why = tape_unsupported(runner) or ("it runs in its file's own protocol" if ctx.deploy is not None
                                       and ctx.deploy(runner) is not None else None)
    if why:
        return None, why
    if runner.name == EAGER or ctx.recorded is not None or ctx.eager is None:
        return None, "no eager calls to plan from"
    floor(check, ctx)  # eager's runs (memoized), its logits kept
    guesses = ctx._ref.get(("serving-guesses", check))
    if not guesses:
        return None, "eager's logits were not kept (over the guesses' budget)"
    tape = Tape(runner, guesses)
    try:
        RUNS[check](tape, ctx)
    except (Untaped, MhaExportError, ValueError) as e:
        return None, f"eager's calls could not be planned ({e})"
    results = run_plan(runner, tape.calls)
    failed = next((r.error for r in results if r.error is not None), None)
    if failed is not None:
        return None, "a planned call failed (run call by call to report it)"
    confirm = Tape(runner, [r.logits for r in results], tape.calls)
    try:
        runs = RUNS[check](confirm, ctx)
    except (Untaped, MhaExportError, ValueError) as e:
        return None, f"the runtime left eager's calls ({e})"
    if len(confirm.calls) != len(tape.calls):
        return None, f"the runtime made {len(confirm.calls)} of the {len(tape.calls)} calls planned"
    return runs, ""


# ---- the judgement ----------------------------------------------------------------------------------------------

def floor(check: str, ctx: Context) -> float | None:
    """Eager's own serving difference over the same requests (memoized), None where eager's runs are not here (a
    recorded reference) or eager does not pass its own check (then it is no floor of noise)."""
    if ctx.recorded is not None or ctx.eager is None:
        return None
    key = ("serving-floor", check)
    if key not in ctx._ref:
        # its logits call by call where a file runs block by block: that runtime's tape guesses them (taped above)
        eager = Recorder(ctx.eager) if getattr(ctx.eager, "keep_guesses", False) else ctx.eager
        runs = RUNS[check](eager, ctx)
        if isinstance(eager, Recorder) and not eager.full:
            ctx._ref[("serving-guesses", check)] = eager.logits
        scale = max((r.scale() for r in runs), default=0.0)
        d = max((r.max_abs() for r in runs), default=0.0)
        clean = all(r.divergence is None for r in runs)
        ctx._ref[key] = (d, runs) if clean and d <= NOISE_FACTOR * _EPS["float32"] * max(scale, 1.0) else (None, runs)
    return ctx._ref[key][0]


_EPS = {"float32": float(np.finfo(np.float32).eps), "float16": float(np.finfo(np.float16).eps),
        "bfloat16": 2.0 ** -7}


def judge_runs(check: str, runner: Runner, ctx: Context, runs: list[Run], order: str | None = None) -> CheckResult:
    """``runs`` judged as the module says: tokens equal (near-ties within the allowance pass), logits within the
    allowance; the figures: each run's first divergence and max abs, the runtime's worst, eager's floor, the
    allowance."""
    eps = _EPS.get(runner.dtype, _EPS["float32"])
    scale = max((r.scale() for r in runs), default=0.0)
    base = None if runner.name == EAGER else floor(check, ctx)
    rounding = eps * max(scale, 1.0)
    allowed = NOISE_FACTOR * max(base or 0.0, rounding)
    # a lossy file whose activations are int8 moves by a requantization step wherever a batch's rows or a call's
    # positions change (another GEMM, other scales): held to the allowance its other self-comparisons use
    requant = ctx.tol.for_output("logits").atol if ctx.lossy is not None else 0.0
    allowed = max(allowed, requant)
    rows, bad, ties, worst = [], [], 0, 0.0
    for r in runs:
        d, err = r.divergence, r.max_abs()
        worst = max(worst, err)
        row = {"run": r.label, **r.info, "tokens": len(r.want_tokens), "first_divergence": d, "max_abs": rounded(err)}
        if d is not None:
            if d < len(r.want_logits) and d < len(r.got_tokens):
                ref = np.asarray(r.want_logits[d], np.float64)
                margin = float(ref.max() - ref[r.got_tokens[d]])
                row["margin"] = rounded(margin)
                if margin <= allowed and err <= allowed:
                    row["tie"] = True
                    ties += 1
                else:
                    bad.append(f"{r.label} diverges from {AGAINST[check]} at token {d} (margin {margin:.3g}, logits "
                               f"max abs {err:.3g})")
            else:
                stop = f" ({r.info['stopped']})" if r.info.get("stopped") else ""
                bad.append(f"{r.label} stops after {len(r.got_tokens)} tokens where {AGAINST[check]} gives "
                           f"{len(r.want_tokens)}{stop}")
        elif err > allowed:
            bad.append(f"{r.label}: same tokens but logits differ by {err:.3g}")
        rows.append(row)
    fig = ServingFigures.of(runs=rows, max_abs=rounded(worst), floor=None if base is None else rounded(base),
                            rounding=rounded(rounding), allowed=rounded(allowed), ties=ties or None,
                            protocol=_loop_of(runner, ctx).protocol.name, order=order)
    floor_text = ("eager's own difference" if runner.name == EAGER else
                  f"eager's floor {base:.3g}" if base is not None else "no eager floor here")
    if requant and allowed == requant:
        floor_text += f"; a lossy file's requantization allowance {requant:.3g}"
    longest = max((r.info.get("prompt", 0) + len(r.want_tokens) - 1 for r in runs), default=None)
    if bad:
        return crossing(CheckResult(check, False, fig, f"{bad[0]}{f' (+{len(bad) - 1} more)' if len(bad) > 1 else ''}"
                                                       f"; allowed {allowed:.3g} ({floor_text}, rounding "
                                                       f"{rounding:.3g})"), ctx.contract, longest)
    tie = f", {ties} near-tie(s)" if ties else ""
    return crossing(CheckResult(check, True, fig, f"{len(runs)} runs {WHAT[check]} equal {AGAINST[check]}{tie}: max "
                                                  f"abs {worst:.3g} ({floor_text}; allowed {allowed:.3g})"),
                    ctx.contract, longest)


def _check(check: str):
    def run(runner: Runner, ctx: Context) -> CheckResult:
        if runner.fixed is not None:
            return CheckResult(check, None, {"static": True}, f"n/a: static export (runs only at "
                                                              f"seq={runner.fixed[0]} past={runner.fixed[1]})")
        if runner.name == EAGER and ctx.recorded is None:
            floor(check, ctx)
            return judge_runs(check, runner, ctx, ctx._ref[("serving-floor", check)][1])
        runs, why = taped(check, runner, ctx) if getattr(runner, "block_order", False) else (None, "")
        order = BLOCK if runs is not None else (f"call by call ({why})" if why else None)
        return judge_runs(check, runner, ctx, runs if runs is not None else RUNS[check](runner, ctx), order)

    run.__name__ = f"check_{check.replace('-', '_')}"
    run.__doc__ = f"The {check} check of a contract runtime (see the module)."
    return run


check_continuous_batching = _check(CONTINUOUS_BATCHING)
check_speculative = _check(SPECULATIVE)
check_prefix_reuse = _check(PREFIX_REUSE)
