"""``mhaexport verify``: its options (shared with ``all``), parse, call the API, print (the report, bisect's
findings, the verdict's exit)."""

from __future__ import annotations

import functools

import click

from mhaexport.commands.options import (SEED, _model_args, _regular_file, _remember, _state, model_options,
                                        quiet_option, runtime_option, timeout_option, trust_code_option)
from mhaexport.commands.output import _finish, _progress, _progress_done, _show_record, _warn, _wrote, render_markdown
from mhaexport.core.errors import MhaExportError, raise_for_verdict


def _parse_tolerance(ctx, param, values: tuple[str, ...]) -> dict | None:
    """("1e-4", "logits=1e-3") -> {None: 1e-4, "logits": 1e-3}; None when not given."""
    if not values:  # nothing to parse: import nothing (a bad FOLDER is refused before verify's imports)
        return None
    from mhaexport.core.iospec import OUTPUT_KINDS

    out: dict = {}
    for v in values:
        key, _, num = v.rpartition("=")
        key = key.strip() or None
        if key is not None and key not in OUTPUT_KINDS:
            raise click.BadParameter(f"{v!r}: OUTPUT must be one of {', '.join(OUTPUT_KINDS)}")
        try:
            x = float(num)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected a number or OUTPUT=number, e.g. logits=1e-3") from None
        if not x >= 0:
            raise click.BadParameter(f"{v!r}: a tolerance must be >= 0")
        out[key] = x
    return out or None


def _parse_quality(ctx, param, values: tuple[str, ...]) -> dict | None:
    """("top1=0.9", "kl_mean=0.05") -> {"top1": 0.9, "kl_mean": 0.05}; None when not given."""
    if not values:
        return None
    from mhaexport.core.errors import ConfigError
    from mhaexport.verify.quality import QUALITY_FIGURES, check_threshold

    out: dict = {}
    for v in values:
        key, _, num = v.partition("=")
        key = key.strip()
        if key not in QUALITY_FIGURES:
            raise click.BadParameter(f"{v!r}: FIGURE must be one of {', '.join(QUALITY_FIGURES)}")
        try:
            out[key] = float(num)
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected FIGURE=number, e.g. top1=0.9") from None
        try:
            check_threshold(key, out[key])
        except ConfigError as e:
            raise click.BadParameter(str(e).removeprefix("--quality ")) from None
    return out or None


def _quality_settings(quality: dict | None, text_file: str | None):
    """verify's QualitySettings from --quality / --text (None when neither was given)."""
    if quality is None and text_file is None:
        return None
    from mhaexport.verify.quality import QualitySettings

    if text_file is None:
        return QualitySettings(overrides=quality)
    from mhaexport.api import read_text

    return QualitySettings(overrides=quality, text=read_text(text_file), text_source=text_file)


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--json: kept in the CliState for the verb's printing (verify, all)."""
    if value:
        _state(ctx).json = True


def _remember_junit(ctx: click.Context, param: click.Parameter, value: str | None):
    """--junit FILE: checked before any work (its folder may be made by the run, e.g. inside -o, but what exists of
    its path must be writable folders); kept in ctx.meta for the verb."""
    if value is not None:
        from mhaexport.api import check_junit

        try:
            check_junit(value)
        except MhaExportError as e:
            raise click.BadParameter(str(e.cli).removeprefix("--junit "), param_hint="--junit") from None
    return _remember(ctx, param, value)


def _parse_memory(ctx, param, value):
    """--memory SIZE: refused at parsing when it is no size (the API checks it again)."""
    if value is None:
        return None
    from mhaexport.verify.memory import parse_size

    try:
        parse_size(value)
    except MhaExportError as e:
        raise click.BadParameter(str(e).removeprefix("--memory "), param_hint="--memory") from None
    return value


def verify_options(f):
    """--sweep / --seed / --atol / --rtol / --runtime / --tokens: how verify checks an export."""

    @click.option("--sweep", type=click.Choice(["quick", "full"]), default="quick", show_default=True,
                  help="Input shapes: quick (9 shapes, seconds) or full (57 shapes incl. random ones).")
    @click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the input sweep (0 to 2**32-1).")
    @click.option("--atol", multiple=True, metavar="[OUTPUT=]X", callback=_parse_tolerance,
                  help="Absolute tolerance, for every output or per output: --atol 1e-4 --atol logits=1e-3 "
                       "(OUTPUT: logits or present; default by dtype: float32 1e-4, float16 1e-2).")
    @click.option("--rtol", multiple=True, metavar="[OUTPUT=]X", callback=_parse_tolerance,
                  help="Relative tolerance, likewise (default by dtype: float32 1e-3, float16 1e-2).")
    @runtime_option("Runtimes to verify (repeat, or a comma list): eager, torchscript, ort-cpu, ort-cuda, and on "
                    "request eager-cuda, onnx-reference, ort-genai; pt2 and aoti (torch.export, AOTInductor: with "
                    "--trust-code on `verify`). Default: eager, torchscript, ort-cpu, ort-cuda, and pt2/aoti where "
                    "the folder holds them. An attention block (--module attention) adds torch-mha: torch's own "
                    "attention with the same weights.")
    @click.option("--tokens", "gen_tokens", type=click.IntRange(min=1), default=None,
                  help="Greedy tokens for the generation check (default: 8 quick, 32 full).")
    @click.option("--memory", "memory", metavar="SIZE", default=None, callback=_parse_memory,
                  help="The memory verify may use, e.g. 1.5G or 800M (default: the machine's: the cgroup's limit or "
                       "MemAvailable, the smaller). verify plans before loading: weights whole when they fit, "
                       "memory-mapped when only that fits, exit 2 when even that cannot (docs/verify.md).")
    @click.option("--mapped", "mapped", is_flag=True, default=False,
                  help="Hold the weights memory-mapped (eager's built-in decoder, ONNX Runtime's external data) "
                       "whatever fits.")
    @click.option("--quality", "quality", multiple=True, metavar="FIGURE=X", callback=_parse_quality,
                  help="Override a lossy artifact's threshold (repeat): top1, greedy (at least), kl_mean, kl_p99, "
                       "logit_err, ppl_ratio (at most), e.g. --quality top1=0.9. Defaults per scheme (docs/quantize.md).")
    @click.option("--text", "quality_text", type=click.Path(dir_okay=False), default=None, callback=_regular_file,
                  help="Real text for a lossy artifact's quality figures (UTF-8 bytes; byte-level models). Default: "
                       "the held-out text of the shipped weights.")
    @click.option("--junit", metavar="FILE.xml", type=click.Path(dir_okay=False), default=None, expose_value=False,
                  callback=_remember_junit,
                  help="Also write the verdict as JUnit XML (one test case per runtime x check) for CI test reports.")
    @click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_remember_json,
                  help="Print the report (report.json's content) as one JSON object on stdout instead of its table; "
                       "progress and the verdict line stay on stderr, the exit code is the verdict's.")
    @timeout_option
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


def _parse_case(ctx, param, value):
    """--case B,S,P: batch, new tokens, cached tokens."""
    if value is None:
        return None
    parts = value.split(",")
    try:
        b, s, p = (int(x) for x in parts)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected B,S,P (batch, sequence, past), e.g. 1,121,7") from None
    return b, s, p  # (the API checks the sizes)


def _show_bisect(run) -> None:
    """verify --bisect's findings (:class:`mhaexport.api.VerifyRun` with its ``bisect``), then its exit: verify's
    verdict, 1 also when bisect found a difference."""
    from mhaexport.diagnose.model_explorer import NODE_DATA, how_to_open

    _progress_done()
    followed, report = run.bisect.followed, run.bisect.report
    if followed is not None:
        click.echo(followed.summary())
    if report is not None:
        click.echo(report.summary())
        if report.kind == "onnx" and run.written:  # Model Explorer's node data
            click.echo(f"wrote {run.written[0]}: {how_to_open(report.model, run.written[0])}")
        elif report.kind == "onnx" and run.folder is not None:
            click.echo(f"(-o DIR writes DIR/{NODE_DATA}: this divergence on the graph, for Model Explorer)")
    raise_for_verdict(*run.exit)


@click.command("verify")
@quiet_option
@click.argument("folder", required=False, type=click.Path())
@model_options
@verify_options
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Where report.json, report.md and report.html go (default: FOLDER, where a run of named "
                   "--runtime's writes report-RUNTIMES.json/.md/.html instead, never replacing the full report; with "
                   "model options only: not written); with --bisect, where bisect-node-data.json goes (Model "
                   "Explorer's view of the divergence). For FILE.onnx: the folder it is adopted into (default: FILE's "
                   "folder/mhaexport).")
@click.option("--bisect", "bisect_", is_flag=True, default=False,
              help="Verify plus a diagnosis: take verify's verdict (FOLDER's report since its export, or a verify "
                   "run now; the exit is that verdict's, 1 also when bisect finds a difference) and follow the check "
                   "that failed in its protocol (a deploy loop's ragged batch step by step), else compare the ONNX "
                   "graph's intermediate values with eager PyTorch's, module by module, and name the first block and "
                   "tensor that diverge. Runs at the case parity failed at unless --case says. The "
                   "torch.export program (model.pt2) instead with --runtime pt2, in a folder without an ONNX file, "
                   "or when FOLDER's report has its parity failing and no ONNX Runtime's (with --trust-code).")
@click.option("--case", "case", default=None, metavar="B,S,P", callback=_parse_case,
              help="With --bisect: the batch, sequence and past to bisect at, e.g. --case 1,121,7.")
@click.option("--record", "record", is_flag=True, default=False,
              help="Also write eager's outputs over this sweep into FOLDER (reference.json + reference.npz, hashed "
                   "in the manifest): a later verify judges the ONNX file from them without torch or the weights "
                   "(docs/verify.md).")
@click.option("--reference", "reference", type=click.Choice(["auto", "eager", "recorded"]), default="auto",
              show_default=True,
              help="Where eager's outputs come from: eager (run the model), recorded (FOLDER's record, no torch), "
                   "auto (the record when torch cannot be imported here and FOLDER holds one, else eager).")
@trust_code_option
def verify_cmd(folder, config, model, checkpoint, hf, sweep, seed, atol, rtol, runtimes, gen_tokens, quality,
               quality_text, output, bisect_=False, case=None, trust_code=False, record=False,
               reference="auto", memory=None, mapped=False) -> None:
    """Verify an export FOLDER (ONNX and/or TorchScript) against eager PyTorch on every runtime, or, with
    --config/--model/--hf only, export both formats to a temporary folder first and verify that (one of the two is
    required: verify alone verifies nothing and exits 2). A folder refused before any check (a file that does not
    match its manifest, a name leaving it) is a verdict too: exit 2, with its report in -o and the --junit file. FOLDER with
    --model/--config/--checkpoint/--hf re-points the folder at its model (accepted when it is the same model: the
    fingerprints of contract and weights match).

    FILE.onnx with --hf/--model/--config: an ONNX decoder another tool exported (onnxruntime-genai's model
    builder, Optimum, a plain torch.onnx.export) is adopted into a folder (-o; links to the file, the manifest
    records its layout and hashes) and verified against that model, driven in its producer's cache and padding
    protocol (the verdict) and also in the plain one (findings). generate and bench then run on that folder.

    Checks per runtime: parity, finite, causality, kv-consistency, padding, dynamic-shapes, generation; a quantized
    (lossy) artifact gets quality against eager fp32 instead of exact parity, and its invariants against itself;
    an attention block on its own (--module attention): parity (against eager and torch's own attention), finite,
    causality, cache-consistency, demonstration.
    Exit 0 passed, 1 a check failed, 2 bad input, 4 not verified (a --runtime asked for could not run here)."""
    from mhaexport import api
    from mhaexport.core.errors import ReportNotWritten

    ctx = click.get_current_context()
    try:  # verify's modules import once the input is checked: a missing FOLDER is refused at once
        run = api.verify_run(folder, output, **_model_args(config, model, checkpoint, hf), runtimes=runtimes or None,
                             sweep=sweep, seed=seed, atol=atol, rtol=rtol, tokens=gen_tokens,
                             quality=_quality_settings(quality, quality_text), junit=_state(ctx).junit,
                             trust_code=trust_code, bisect=bisect_, case=case, markdown=render_markdown,
                             progress=_progress, reference=reference, record=record,
                             memory=memory, mapped=mapped)
    except ReportNotWritten as e:  # what could be written is said before the error
        for line in _wrote(e.written):
            click.echo(line, err=True)
        raise
    if run.adopted is not None:
        details = run.adopted.manifest.artifacts["onnx"].details
        click.echo(f"Adopted {folder} ({details.producer} layout, driven as {details.cache.kind} cache, "
                   f"{details.cache.padding} padding) into {run.adopted.folder}", err=True)
        _warn(run.adopted)
    for rec in run.exported:  # a temporary export's warnings
        _show_record(rec, as_json=True)
    if run.bisect is not None:
        _show_bisect(run)
        return
    _progress_done()  # the report starts on a line of its own
    _finish(run.report, render_markdown(run.report), _wrote(run.written))
