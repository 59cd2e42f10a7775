"""``mhaexport eval`` and ``mhaexport generate``: parse, call the API, print."""

from __future__ import annotations

import click

from mhaexport.commands.options import (SEED, TEXT_MAX_BYTES, _folder_exists, _regular_file, _threads, quiet_option,
                                        runtime_option, timeout_option, trust_code_option)
from mhaexport.commands.output import _progress, _progress_done, _show
from mhaexport.core.errors import raise_for_verdict
from mhaexport.core.untrusted import shown


@click.command("eval")
@quiet_option
@timeout_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("--text", "text_file", type=click.Path(dir_okay=False), default=None, callback=_regular_file,
              help="Text to score (UTF-8 bytes; byte-level models). Default: the held-out text of the shipped "
                   "weights (models/weights/small-heldout.txt), which they never trained on.")
@runtime_option("Runtime(s) to score on (repeat, or a comma list): eager, torchscript, ort-cpu, ort-cuda, "
                "eager-cuda, onnx-reference. Default: ort-cpu.")
@click.option("--window", type=click.IntRange(min=2), default=None,
              help="Tokens per window (default: the model's max_positions).")
@click.option("--stride", type=click.IntRange(min=1), default=None,
              help="Tokens a window advances (default: half a window; = window: consecutive windows).")
@click.option("--max-bytes", type=click.IntRange(min=2, max=1 << 30), default=TEXT_MAX_BYTES, show_default=True,
              help="Refuse a --text file larger than this (it is scored token by token: 1 MiB takes minutes).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@trust_code_option
def eval_cmd(folder, text_file, runtimes, window, stride, max_bytes, as_json, trust_code) -> None:
    """Perplexity (and bits per byte) of an export FOLDER on text, on any runtime. Exit 0 when every runtime asked
    for ran, 1 when one failed, 4 when one could not run here."""
    from mhaexport.core.numbers import dumps

    from mhaexport import api

    text = None if text_file is None else api.read_text(text_file, max_bytes, "--max-bytes")
    report = api.evaluate(folder, text, text_source=text_file, runtimes=runtimes or None, window=window,
                          stride=stride, trust_code=trust_code, progress=_progress)
    _progress_done()
    if as_json:
        click.echo(dumps(report.to_dict(), indent=1))
    else:
        _show(report.to_markdown())
    raise_for_verdict(*api.eval_verdict(report))


def _parse_ids(ctx, param, values: tuple[str, ...]) -> list[list[int]]:
    rows = []
    for v in values:
        try:
            rows.append([int(t) for t in v.replace(" ", "").split(",") if t != ""])
        except ValueError:
            raise click.BadParameter(f"{v!r}: expected comma-separated integers like 5,17,42") from None
    return rows


@click.command("generate")
@timeout_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("--prompt", "prompts", multiple=True, metavar="TEXT",
              help="Prompt text, encoded with the folder's tokenizer.json (an --hf export) or as UTF-8 bytes "
                   "(byte-level models, vocab >= 256). Repeat for a batch.")
@click.option("--prompt-ids", "prompt_ids", multiple=True, metavar="5,17,42", callback=_parse_ids,
              help="Prompt token ids. Repeat for a batch (left-padded).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0 = greedy; otherwise sample from softmax(logits / T).")
@click.option("--top-k", type=click.IntRange(min=1), default=None, help="Sample among the k most likely tokens.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=None,
              help="Sample among the smallest set of tokens whose probability reaches p.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the sampler (0 to 2**32-1).")
@click.option("--eos-id", type=click.IntRange(min=0), default=None,
              help="Stop a row when it produces this id. Default: the model config's eos id for a folder with a "
                   "tokenizer.json (an --hf export), none otherwise.")
@click.option("--provider", "providers", multiple=True, default=("cpu",), show_default=True,
              metavar="cpu|cuda|NAME", help="ONNX Runtime execution provider(s), in order of preference.")
@click.option("--threads", type=click.IntRange(min=1), default=None, callback=_threads,
              help="ONNX Runtime intra-op threads (at most the machine's cores).")
@click.option("--engine", type=click.Choice(["auto", "mhaexport", "onnxruntime-genai"]), default="auto",
              show_default=True,
              help="Whose decode loop: onnxruntime-genai's where it is installed and the folder's genai_config.json "
                   "passes the genai-config check (auto), or mhaexport's. Greedy tokens are the same; sampling "
                   "draws from each loop's own random generator.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: tokens, text, stop reason, providers, engine.")
@trust_code_option
def generate_cmd(folder, prompts, prompt_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_id, providers,
                 threads, engine, as_json, trust_code) -> None:
    """Generate from an ONNX export with ONNX Runtime (no torch): prefill, then KV-cache decode.

    With --json, "tokens" is the list of new ids for one prompt, or a list of such lists for several.
    """
    from mhaexport.core.numbers import dumps

    from mhaexport import api

    result = api.generate(folder, prompts, prompt_ids=prompt_ids, max_new_tokens=max_new_tokens,
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, eos_id=eos_id,
                          providers=providers, threads=threads, engine=engine, trust_code=trust_code)
    for w in result.warnings:
        click.secho(shown(f"warning: {w}"), fg="yellow", err=True)
    if as_json:
        click.echo(dumps(result.to_dict(result.texts)))
        return
    click.echo(shown(f"providers: {', '.join(result.providers)}"), err=True)
    click.echo(shown(f"engine: {result.engine} ({result.engine_reason})"), err=True)
    for i, toks in enumerate(result.tokens):
        if i < len(prompts):
            click.echo(prompts[i] + result.texts[i])
        else:
            click.echo(",".join(map(str, toks)))
    click.echo(shown(result.message), err=True)
