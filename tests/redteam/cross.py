"""The red team's generator: every field of a source (a report given to ``report merge``, a bench.json, bisect's
report) crossed with every hostile value kind (tests/redteam/values.py), rendered into every sink that source reaches
and held to each sink's checker (tests/redteam/sinks.py). A case is (source, field path, kind); its outcome is
"refused" (the reader said no, in one line: an MhaExportError), or the findings per sink (none: safe). Any other
exception is a crash (exit 3) and fails the case.

A real verify run's report and bench result are made here, in process, with every section a renderer draws (the
runtimes table, parity figures and plots, quality, failed and skipped checks, provider against provider, lint,
merged sources), so each of their fields is a field a crafted file can hold."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator

from redteam.sinks import html_findings, json_findings, markdown_findings, terminal_findings, xml_findings
from redteam.values import NUMBERS, TEXT


def report_doc() -> dict:
    """report.json of a decoder's verify run (eager, ort-cpu ran; ort-cuda skipped; a lossy runtime with quality
    figures; lint findings; provider against provider), as verify writes it."""
    from mhaexport.verify.lint import Finding, LintReport
    from mhaexport.verify.report import ReportModel, RuntimeInfo, SweepInfo, ToleranceInfo, VerifyReport
    from mhaexport.verify.results import CheckResult, CrossResult

    parity = CheckResult("parity", False, {"max_abs": 0.2, "errors": 1, "by_case": [[1, 7, 0, 2e-7], [2, 1, 40, 0.3]],
                                           "per_output": {"logits": {"mean": 1e-7, "median": 1e-7, "p99": 2e-7,
                                                                     "max": 0.2, "mismatch_fraction": 0.01,
                                                                     "atol": 1e-4, "rtol": 1e-3}}},
                         "differs at b=2 seq=1 past=40")
    kv = CheckResult("kv-consistency", True, {"long_to": 127, "worst": 3e-7, "long_max_abs": 3e-7,
                                              "long_by_position": [[p, 1e-7 * (1 + p % 3)] for p in range(40)]}, "ok")
    gen = CheckResult("generation", True, {"tokens": 4, "matched": 4, "step_max_abs": [1e-7, 0.0, 2e-7, 1e-7],
                                           "step_margin": [0.5, 0.02, 1.0, 0.3], "first_divergence": None,
                                           "long_prompt": 64, "long_tokens": 4, "long_matched": 4}, "ok")
    quality = CheckResult("quality", True, {"scheme": "int4 rtn", "sweep": {"top1": 0.99, "positions": 10,
                                                                           "logit_err": 0.01},
                                            "text": {"top1": 0.98, "ppl_ratio": 1.01, "positions": 100,
                                                     "perplexity": 12.5, "eager_perplexity": 12.4},
                                            "thresholds": {"top1": 0.9, "ppl_ratio": 1.1},
                                            "greedy": {"mean": 0.9, "min": 3, "tokens": 8, "prompts": 2},
                                            "not_judged": ["kl: no text"]}, "int4: fine")
    skipped = CheckResult("padding", None, {}, "not run: the file has no padding input")
    serving = CheckResult("continuous-batching", False, {
        "max_abs": 0.2, "floor": 1e-6, "rounding": 1e-7, "allowed": 1e-4, "engine": "its loop",
        "runs": [{"run": "request 1", "prompt": 8, "first_divergence": 3, "margin": 0.1, "tie": False,
                  "max_abs": 0.2}, {"run": "request 2", "prompt": 4, "refused": "the window"}]},
        "request 1 diverges at token 3")
    results = {"eager": {"parity": CheckResult("parity", None, {"not_a_check": "reference"}, "reference"),
                         "kv-consistency": kv, "generation": gen},
               "ort-cpu": {"parity": parity, "kv-consistency": kv, "generation": gen, "padding": skipped,
                           "quality": quality, "continuous-batching": serving}}
    runtimes = {"eager": RuntimeInfo("eager", "ran", providers=["torch (cpu)"], seconds=0.5),
                "ort-cpu": RuntimeInfo("ort-cpu", "ran", providers=["CPUExecutionProvider"], seconds=1.5),
                "ort-cuda": RuntimeInfo("ort-cuda", "skipped", reason="no CUDA device")}
    lint = LintReport(model="model.onnx", findings=[Finding("warning", "fixed-axis", "node_1", "a fixed axis",
                                                            "export with dynamic axes")], rules=["fixed-axis"])
    report = VerifyReport(model=ReportModel(spec="preset:tiny", contract={"n_layers": 2, "windows": [0, 8]}),
                          folder="out/tiny", sweep=SweepInfo(kind="quick", seed=0, cases=9),
                          tolerance=ToleranceInfo(atol=1e-4, rtol=1e-3), runtimes=runtimes, results=results,
                          checks=["parity", "kv-consistency", "generation", "padding", "quality",
                                  "continuous-batching"], lint=lint,
                          cross=[CrossResult("ort-cpu", "eager", True, message="agree within 1e-7")],
                          versions={"onnxruntime": "1.32.0"})
    doc = report.to_dict()
    doc["sources"] = ["host-a: report.json", "host-b: report.json"]
    # the artifacts as a manifest describes them (build_report copies these fields from the folder's manifest)
    doc["artifacts"] = {"onnx": {"format": "onnx", "file": "model.onnx", "dtype": "float32", "seq_dynamic": False,
                                 "static_sizes": {"batch_size": 1, "sequence_length": 8}, "opset": 18,
                                 "attention": "decomposed", "kv_cache": "shared", "producer": "optimum",
                                 "protocol": "concat", "quantization": {"weights": "int4", "label": "int4 rtn"}},
                        "torchscript": {"format": "torchscript", "file": "model.pt", "mode": "trace"}}
    doc["reference"] = {"kind": "recorded", "describe": "recorded 2026-12-06", "keeps": "top 16",
                        "checks": {"parity": "against the record"}}
    doc["memory"] = {"mode": "whole", "cap": 1000, "cap_source": "MemAvailable", "reason": "fits"}
    return doc


def bench_doc() -> dict:
    """bench.json of a run with an ORT row, a skipped row, a long run, notes and versions."""
    from mhaexport.artifact.record import Environment
    from mhaexport.bench import BenchConfig, BenchResult, RuntimeBench
    from mhaexport.bench.result import BandwidthInfo, BenchModel

    bw = BandwidthInfo(read=10.0, probe="sum", threads=1, sum=10.0, mbytes=64, method="numpy sum")
    rows = [RuntimeBench("ort-cpu", ran=True, label="ort-cpu", repeats=1, providers=["CPUExecutionProvider"],
                         token_p50_ms=1.0, token_p90_ms=1.2, decode_total_ms=10.0, positions=[8, 9, 10],
                         per_position_ms=[1.0, 1.1, 1.0], load_ms=20.0, prefill_ms=2.0, ttft_ms=2.5,
                         tokens_per_s=900.0),
            RuntimeBench("ort-cuda", ran=None, reason="no CUDA device", label="ort-cuda")]
    res = BenchResult("out/tiny", BenchConfig(prompt_len=8, new_tokens=8, threads=1),
                      BenchModel("preset:tiny", contract={"windows": [0, 8]}),
                      Environment(host="vm", cpu="x86", date="2026-12-06"), 10.0, bw, 1000, 0.1, rows,
                      notes=["one note"])
    return res.to_dict()


def _paths(doc, at=()) -> Iterator[tuple[tuple, object]]:
    """(path, value) of every leaf (a string or a number) of a JSON document, and ("key", path) for every key."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        if isinstance(k, str):
            yield at + (k,), ("key", k)
        if isinstance(v, (dict, list)):
            yield from _paths(v, at + (k,))
        elif isinstance(v, (str, int, float)) and not isinstance(v, bool):
            yield at + (k,), v


def _set(doc, path: tuple, value, key: bool) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    if key:
        node[value] = node.pop(path[-1])
    else:
        node[path[-1]] = value
    return doc


def _drop(doc, path: tuple) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node.pop(path[-1])
    return doc


def cases(doc: dict, *, numbers: bool = True) -> Iterator[tuple[str, str, dict]]:
    """(field, kind, document) for every leaf and key of ``doc`` and every hostile kind that fits it: text kinds
    for strings and keys, number kinds (and a text) for numbers."""
    for path, value in _paths(doc):
        field = ".".join(map(str, path))
        if isinstance(value, tuple):  # a key: renamed to each hostile text, and left out
            for kind, text in TEXT.items():
                yield f"{field} (key)", kind, _set(doc, path, text, key=True)
            yield field, "missing", _drop(doc, path)
        elif isinstance(value, str):
            for kind, text in TEXT.items():
                yield field, kind, _set(doc, path, text, key=False)
        elif numbers:
            for kind, number in itertools.chain(NUMBERS.items(), [("text", TEXT["md-image"])]):
                yield field, kind, _set(doc, path, number, key=False)


def sample(all_cases, every: int) -> Iterator:
    """Every ``every``-th case (the default run's sample; deterministic)."""
    return itertools.islice(all_cases, 0, None, every)


def render_report(doc: dict) -> dict[str, list[str]] | str:
    """Every sink a report given to ``report merge`` reaches: report.md (alone and merged), report.html, JUnit, the
    terminal; "refused" where the reader refuses the document."""
    from mhaexport.core.errors import MhaExportError
    from mhaexport.terminal import to_terminal
    from mhaexport.verify.html import html
    from mhaexport.verify.junit import to_junit_xml
    from mhaexport.verify.render import cell, markdown
    from mhaexport.verify.report import VerifyReport, merge_reports

    try:
        report = VerifyReport.from_dict(doc)
        merged = merge_reports([report, VerifyReport.from_dict(report_doc())], ["crafted", "own"])
    except MhaExportError:
        return "refused"
    md = markdown(report)
    return {"report.md": markdown_findings(md), "merged report.md": markdown_findings(markdown(merged)),
            "report.html": html_findings(html(report, cell)), "merged report.html": html_findings(html(merged, cell)),
            "JUnit": xml_findings(to_junit_xml(report, md)), "terminal": terminal_findings(to_terminal(md)),
            "terminal (styled)": terminal_findings(_unstyled(to_terminal(md, style=True))),
            "report.json": json_findings(__import__("mhaexport.core.numbers", fromlist=["dumps"]).dumps(
                report.to_dict()))}


def _unstyled(text: str) -> str:
    import click

    return click.unstyle(text)


def render_bench(doc: dict, *, png: bool = False) -> dict[str, list[str]] | str:
    """Every sink a bench.json reaches: bench.md, the bench section of report.md, bench.html, the terminal, bench.png's
    text (``png``: drawn, which takes matplotlib's time)."""
    from mhaexport.bench.html import html
    from mhaexport.bench.render import markdown_body, plot, report_section
    from mhaexport.bench.result import BenchResult
    from mhaexport.core.errors import MhaExportError
    from mhaexport.terminal import to_terminal

    try:
        res = BenchResult.from_dict(doc)
    except MhaExportError:
        return "refused"
    body = markdown_body(res)
    out = {"bench.md": markdown_findings(body), "report.md bench section": markdown_findings(report_section(res)),
           "bench.html": html_findings(html(res)), "terminal": terminal_findings(to_terminal(body))}
    if png:
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as d:
            plot(res, Path(d) / "bench.png")  # must not raise (mathtext, any figure)
    return out


def render_bisect(name: str, rel: object) -> dict[str, list[str]]:
    """bisect's table on the terminal and its Model Explorer node data, for a graph whose value names are ``name``."""
    from mhaexport.core.numbers import dumps
    from mhaexport.diagnose.bisect import BisectReport, TensorDiff
    from mhaexport.diagnose.model_explorer import node_data

    row = TensorDiff(module=f"blocks.0.{name}", onnx_value=name, op=name, position=0, shape=(1,), max_abs=rel,
                     rel=rel)
    rep = BisectReport(model=name, shapes={"batch": 1, "seq": 1, "past": 0}, tol=1e-3, provider="cpu", rows=[row],
                       first_divergent=row, culprit=row, culprit_nodes=[name], unmatched=[name], notes=[name])
    return {"terminal": terminal_findings(rep.summary()), "Model Explorer data": json_findings(dumps(node_data(rep)))}
