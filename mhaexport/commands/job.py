"""``mhaexport all``, the main job: parse, call the API (each stage a ``[k/n]`` line), print."""

from __future__ import annotations

import click

from mhaexport.commands.options import (_model_args, _state, _typed, lowering_options, model_options, quiet_option,
                                        replace_option)
from mhaexport.commands.output import _finish, _progress, _progress_done, _show_record, _wrote
from mhaexport.commands.verify import _quality_settings, verify_options


@click.command("all")
@quiet_option
@model_options
@verify_options
@lowering_options
@click.option("--target", type=click.Choice(["portable", "ort-cpu", "ort-cuda"]), default=None,
              help="The runtime the ONNX file is for (as `mhaexport onnx --target`): portable (the default), ort-cpu "
                   "(fused, shared cache, int4; its float source in OUTPUT-float32), ort-cuda (fused, shared, "
                   "float16).")
@click.option("--pt2", "pt2", is_flag=True, default=False,
              help="Also export with torch.export (model.pt2) and verify it as runtime pt2.")
@click.option("--aoti", "aoti", is_flag=True, default=False,
              help="Also export with torch.export and compile it with AOTInductor for CPU (model.pt2 and "
                   "model.aoti.pt2), verified as runtimes pt2 and aoti.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="artifacts/default", show_default=True,
              help="Folder for model.onnx, model.pt, manifest.json, report.json and report.md.")
@replace_option
def all_cmd(config, model, checkpoint, hf, sweep, seed, atol, rtol, runtimes, gen_tokens, quality, quality_text,
            opset, attention, dtype, output, pt2=False, aoti=False, replace=False, target=None, memory=None,
            mapped=False) -> None:
    """The main job: export ONNX and TorchScript into one folder, verify both against eager, write the report
    (:func:`mhaexport.api.all`)."""
    from mhaexport import api
    from mhaexport.core.progress import Stage
    from mhaexport.verify.render import markdown as render_markdown

    quiet = _state().quiet

    def progress(msg: str) -> None:
        if isinstance(msg, Stage):
            _progress_done()
            if not quiet:
                click.secho(f"[{msg.index}/{msg.total}] {msg}", err=True, bold=True)
        else:
            _progress(msg)

    given = _typed(attention=attention, dtype=dtype) if target else {"attention": attention, "dtype": dtype}
    run = api.all(output, **_model_args(config, model, checkpoint, hf), runtimes=runtimes or None, sweep=sweep,
                  seed=seed, atol=atol, rtol=rtol, tokens=gen_tokens, quality=_quality_settings(quality, quality_text),
                  opset=opset, **given, target=target, pt2=pt2, aoti=aoti, replace=replace,
                  junit=_state().junit, progress=progress, memory=memory, mapped=mapped)
    _progress_done()
    for rec in run.records:
        _show_record(rec, as_json=True)
    _finish(run.report, render_markdown(run.report), _wrote(run.written))
