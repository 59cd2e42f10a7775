"""``mhaexport bench``: parse, call the API, print."""

from __future__ import annotations

import click

from mhaexport.commands.options import (_folder_exists, _threads, quiet_option, runtime_option, timeout_option,
                                        trust_code_option)
from mhaexport.commands.output import _progress, _progress_done, _show


@click.command("bench")
@quiet_option
@timeout_option
@click.argument("folder", type=click.Path(file_okay=False), callback=_folder_exists)
@click.option("--prompt-len", type=click.IntRange(min=1), default=None,
              help="Prompt tokens (default 32, shrunk to fit the model's max_positions with the new tokens).")
@click.option("--new-tokens", type=click.IntRange(min=2), default=None,
              help="Tokens generated (default 128, shrunk to fit the model's max_positions).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, callback=_threads,
              help="Threads for torch and ONNX Runtime alike (at most the machine's cores).")
@runtime_option("Runtimes to time (repeat, or a comma list; --runtimes A,B is the same option): eager, "
                "eager-nocache, eager-cuda, torchscript, ort-cpu, ort-bare (a bare session.run loop over the same "
                "file), ort-genai (onnxruntime-genai's loop), ort-cuda, pt2, aoti (with --trust-code), or 'all'. "
                "Default: all but eager-nocache (recompute, O(n^2): slow; ask for it by name); pt2/aoti where the "
                "folder holds them.", "--runtimes")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Timed generations per runtime, round-robin (after untimed warm-ups until two in a row agree "
                   "within 10 %, at most 5).")
@click.option("--sessions", type=click.IntRange(min=1), default=1, show_default=True,
              help="Sessions per loop row (ort-cpu rows, ort-genai): each is warmed up and timed --repeats times, "
                   "in turn; the row's token p50 is the median of its sessions' p50s (identical sessions of one "
                   "file can decode at different speeds). bench.md gives mhaexport's loop / onnxruntime-genai's.")
@click.option("--long", "long_to", type=click.IntRange(min=0), default=0, metavar="POSITION",
              help="Also time one ORT CPU generation per lowering from the prompt up to this position (per-token "
                   "latency against position). Default: 0, off.")
@click.option("--long-repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Long runs per lowering, round-robin; per position, the median.")
@click.option("--opt-levels", default="", metavar="basic,extended,all",
              help="Also time ORT CPU at these graph optimization levels (disable, basic, extended, all; rows "
                   "'ort-cpu@LEVEL').")
@click.option("--profile", is_flag=True, help="Also write ONNX Runtime's profile of the ORT CPU decode (JSON).")
@click.option("--compare", "compare", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Another ONNX export of the same model (another --attention or --dtype; repeat): adds ORT rows "
                   "labelled by lowering, timed round-robin with the rest, and a table of the lowerings.")
@click.option("--lowerings", default=None, metavar="ATTENTION[:DTYPE],..",
              help="Compare these lowerings, e.g. 'decomposed,onnx,ort,fused,ort:float16,shared' ('shared': the "
                   "shared KV cache; 'fused-shared': --attention fused over it): those that neither FOLDER nor a --compare folder holds are exported (once) to "
                   "OUTPUT/lowerings/ATTENTION-DTYPE.")
@click.option("--quantize", "quantize", default=None, metavar="int4,int8",
              help="Time quantized exports of the same model beside the float one: those that neither FOLDER nor a "
                   "--compare folder holds are quantized (once, default settings) to OUTPUT/quantized/SCHEME.")
@click.option("--builder", default=None, metavar="fp32,int4",
              help="Also time onnxruntime-genai's model builder's files of the same Hugging Face model (FOLDER an "
                   "--hf export; onnxruntime-genai installed): built once to OUTPUT/builder/PRECISION, adopted, and "
                   "timed in the same run, rows labelled by producer.")
@click.option("--batches", default=None, metavar="1,4,16",
              help="Also time how cost grows with the batch: per-token latency and tokens/s of every ONNX Runtime row "
                   "(and ort-genai) at each batch size (--prompt-len prompts, --new-tokens tokens), after the main "
                   "rounds; a table in bench.md and bench-scaling.png. Default: off.")
@click.option("--prompts", default=None, metavar="32,512,2048",
              help="Also time the time to first token of every ONNX Runtime row (and ort-genai) at batch 1 for each "
                   "prompt length (one the model cannot hold is a skipped point with its reason). Default: off.")
@click.option("--serving", default=None, metavar="1,4,8",
              help="Also time serving on the ort-cpu row, after the main rounds: continuous batching's tokens/s at "
                   "each number of rows against the plain loop (the same requests one at a time), and speculative "
                   "decoding (prompt lookup) against plain greedy on a repetitive and a non-repetitive prompt. "
                   "Default: off.")
@click.option("--targets", is_flag=True,
              help="Also judge the project's own speed targets (a project benchmark: set for the bench preset and "
                   "the peer comparison) and add their table.")
@click.option("--json", "as_json", is_flag=True, help="Print bench.json's content as one JSON object on stdout.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Where bench.json/bench.md/bench.png (and --profile's trace) go. Default: the export folder (the "
                   "trace is then summed up and not kept).")
@trust_code_option
def bench_cmd(folder, prompt_len, new_tokens, batch, threads, runtimes, repeats, sessions, long_to, long_repeats,
              opt_levels, profile, compare, lowerings, quantize, builder, batches, prompts, serving, targets, as_json,
              output, trust_code) -> None:
    """Time the KV-cache decode loop of an export folder on each runtime; write bench.json, bench.md, bench.png."""
    from mhaexport import api, bench

    result = api.bench(folder, output=output or folder, progress=_progress, lowerings=lowerings, quantize=quantize,
                       builder=builder, prompt_len=prompt_len, new_tokens=new_tokens, batch=batch, threads=threads,
                       runtimes=runtimes or None, repeats=repeats, sessions=sessions, long=long_to,
                       long_repeats=long_repeats,
                       opt_levels=tuple(x.strip() for x in opt_levels.split(",") if x.strip()), profile=profile,
                       profile_dir=output, targets=targets, compare=compare, batches=batches, prompts=prompts,
                       serving=serving, trust_code=trust_code)
    _progress_done()
    if as_json:
        from mhaexport.core.numbers import dumps

        click.echo(dumps(result.to_dict()))
    else:
        _show(bench.markdown_body(result))  # the tables, the floor and the targets (no plot line)
    click.echo("wrote " + ", ".join(str(p) for p in result.written), err=True)
