"""``mhaexport bench``: the request checked before any work, its export steps (lowerings, quantized files, the
builder's), the lengths fitted to the model, then the timed run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mhaexport.verbs.common import Progress, _budgeted, _names, _renamed, _say, writable_output

if TYPE_CHECKING:  # pragma: no cover
    from mhaexport.bench import BenchResult


@_budgeted
def bench(folder: str | Path, *, output: str | Path | None = None, progress: Progress | None = None,
          lowerings: str | Sequence[str] | None = None, quantize: str | Sequence[str] | None = None,
          builder: str | Sequence[str] | None = None, trust_code: bool = False, **config: Any) -> BenchResult:
    """``mhaexport bench``: time the KV-cache decode loop of an export folder on each runtime. ``config``: fields
    of :class:`mhaexport.bench.BenchConfig` (prompt_len, new_tokens, batch, threads, runtimes, repeats, long, ...;
    ``runtimes=["all"]``: every runtime, pt2/aoti with ``trust_code``; ``batches=[1, 4, 16]`` /
    ``prompts=[32, 512, 2048]``, or the CLI's "1,4,16": how cost grows; ``serving=[1, 4, 8]``: continuous batching
    at those rows and speculative decoding against the plain loop (bench.serving); ``targets=True``: the project's speed
    targets; the default runtimes leave out eager-nocache). ``long`` is the CLI's ``--long`` (BenchConfig's
    ``long_to``; ``long_to=`` still works, deprecated).

    The export steps of the CLI's ``--lowerings`` / ``--quantize`` / ``--builder`` (names or one comma list each):
    the same model in other lowerings ("decomposed", "onnx", "ort", "fused", "shared", "fused-shared", each with an
    optional ":DTYPE"), quantized ("int4", "int8", default settings) and built by onnxruntime-genai's model builder
    ("fp32", "int4"; FOLDER an --hf export) are exported once into ``output`` (FOLDER when None: lowerings/,
    quantized/, builder/) unless FOLDER, a ``compare`` folder or an earlier run holds them, and timed beside it.

    Everything is checked before any work (ConfigError in one line). Each folder is opened (hash-checked) once and
    every snapshot goes when the run ends, on errors too. ``output``: also write bench.json / bench.md / bench.png
    (bench-scaling.png) there (``result.written``: their paths). Returns the BenchResult (``.get(name)``: a row;
    ``.scaling``: how cost grows; ``mhaexport.bench.markdown_body(result)``: bench.md's tables)."""
    import dataclasses

    from mhaexport import bench as _bench
    from mhaexport.artifact import OpenFolders
    from mhaexport.bench.config import AOTI, PT2

    if "long_to" in config:  # the CLI's --long; long_to is its deprecated alias
        config["long"] = _renamed("long", config.pop("long", None), "long_to", config.pop("long_to"))
    if "long" in config:
        config["long_to"] = config.pop("long")
    for key in ("runtimes", "opt_levels", "compare"):  # a bare string is one name (one folder)
        if key in config:
            names = _names(config[key], key, paths=key == "compare")
            config[key] = names if names is not None or key == "runtimes" else ()
    for key in ("batches", "prompts", "serving"):  # "1,4,16" or [1, 4, 16]: ConfigError in one line naming the point
        if key in config:
            config[key] = _bench.parse_points(config[key], key)
    if "runtimes" in config and config["runtimes"] == ("all",):  # every runtime; the code ones (pt2, aoti) on trust
        config["runtimes"] = tuple(r for r in _bench.ALL_RUNTIMES if trust_code or r not in (PT2, AOTI))
    # --prompt-len / --new-tokens not given: their defaults, shrunk to fit the model once its folder is open
    defaulted = {k for k in ("prompt_len", "new_tokens") if config.get(k, None) is None}
    config = {k: v for k, v in config.items() if k not in defaulted}
    cfg = _bench.BenchConfig(**config, trust_code=trust_code)  # checked when made: the one check of the request
    steps = _bench_steps(lowerings, quantize, builder)
    out_dir = Path(output if output is not None else folder)
    if output is not None or any(steps):
        from mhaexport.outputs import check_outputs, resolved

        if output is not None:
            check_outputs({f"-o (its {n})": out_dir / n for n in ("bench.json", "bench.md", "bench.png")},
                          reading=[folder, *cfg.compare])
        writable_output(out_dir, " (give -o DIR to write the bench results elsewhere)"
                  if resolved(out_dir) == resolved(folder) else "")
    wanted, schemes, precisions = steps
    fitted = None
    with OpenFolders() as reads:
        ef = reads.open(folder)
        cfg, fitted = _fit_lengths(cfg, defaulted, ef.contract.max_positions)
        if fitted:
            _say(progress)(fitted)
        if precisions:
            from mhaexport.exporter.peer import hf_source

            hf_source(ef)  # an --hf folder, its Hugging Face folder still there: else one line, before any work
        for step, todo in ((_lowerings, wanted), (_quantized, schemes), (_builder, precisions)):
            if todo:
                found = step(ef, todo, out_dir, cfg, progress, reads)
                cfg = dataclasses.replace(cfg, compare=cfg.compare + tuple(str(f) for f in found))
        result = _bench.run_bench(ef, cfg, progress=progress, reads=reads)
    if fitted:
        result.notes.insert(0, fitted)
    if output is not None:
        result.written = _bench.write_bench(result, output)
    return result


def _fit_lengths(cfg: Any, defaulted: set[str], max_positions: int) -> tuple[Any, str | None]:
    """bench's prompt and new tokens within the model's ``max_positions``: a length left at its default (in
    ``defaulted``) shrinks to fit, and says so (the returned line); a length given that cannot fit is the run's
    one-line refusal later. (cfg, the line or None)."""
    import dataclasses

    p, n = cfg.prompt_len, cfg.new_tokens
    if p + n <= max_positions or not defaulted:
        return cfg, None
    if "prompt_len" in defaulted:
        p = max(1, min(p, max_positions // 4, max_positions - (2 if "new_tokens" in defaulted else n)))
    if "new_tokens" in defaulted:
        n = max(2, min(n, max_positions - p))
    if p + n > max_positions:  # the given length leaves no room: refused by the run, naming both
        return cfg, None
    said = [f"--{k.replace('_', '-')} {v} (default {getattr(cfg, k)})" for k, v in (("prompt_len", p),
                                                                                      ("new_tokens", n))
            if k in defaulted and v != getattr(cfg, k)]
    return (dataclasses.replace(cfg, prompt_len=p, new_tokens=n),
            f"{' and '.join(said)}: the defaults shrunk to fit the model's max_positions={max_positions}")


def _bench_steps(lowerings: Any, quantize: Any, builder: Any) -> tuple[list, list, list]:
    """bench's export steps, checked before any work: the (attention, dtype) lowerings, the QuantConfigs, the
    builder's precisions."""
    def text(value: Any, arg: str) -> str | None:
        names = _names(value, arg)
        return ",".join(names) if names else None

    wanted, schemes, precisions = [], [], []
    if (given := text(lowerings, "lowerings")) is not None:
        from mhaexport.exporter.variants import parse_lowerings

        wanted = parse_lowerings(given)
    if (given := text(quantize, "quantize")) is not None:
        from mhaexport.exporter.quantize import QuantConfig

        schemes = [QuantConfig(weights=s) for s in dict.fromkeys(x.strip() for x in given.split(",") if x.strip())]
    if (given := text(builder, "builder")) is not None:
        from mhaexport.exporter.peer import check_precisions

        precisions = check_precisions(given)
    return wanted, schemes, precisions


def _lowerings(ef, wanted, out_dir, cfg, progress, reads) -> list[Path]:
    from mhaexport.exporter.variants import export_lowerings

    return export_lowerings(ef, wanted, out_dir, have=cfg.compare, progress=progress, trust_code=cfg.trust_code,
                            reads=reads)


def _quantized(ef, schemes, out_dir, cfg, progress, reads) -> list[Path]:
    from mhaexport.exporter.quantize import export_quantized

    return export_quantized(ef, schemes, out_dir, have=cfg.compare, progress=progress, reads=reads)


def _builder(ef, precisions, out_dir, cfg, progress, reads) -> list[Path]:
    from mhaexport.exporter.peer import export_builder

    return export_builder(ef, precisions, out_dir, progress=progress, trust_code=cfg.trust_code, reads=reads)
