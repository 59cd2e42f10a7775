"""torch.export (model.pt2) and AOTInductor (model.aoti.pt2): exported under the contract's dynamic axes, verified
and benched as runtimes pt2 / aoti, and loaded from a folder only on trust (both files are code)."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import torch
from click.testing import CliRunner

from mhaexport.artifact import ExportFolder, sha256_file, trust
from mhaexport.artifact.details import AotiDetails, Pt2Details
from mhaexport.cli import main
from mhaexport.core.errors import ConfigError
from mhaexport.exporter.pt2 import AOTI_FILE, PT2_FILE, export_pt2
from mhaexport.models.inputs import make_inputs
from mhaexport.verify import verify_folder
from mhaexport.verify.results import CHECKS
from mhaexport.verify.render import markdown

# never the export's example sizes (batch=2, seq=3, past=5); seq=1 and past=0 included
SHAPES = [(1, 1, 0), (3, 7, 0), (1, 1, 13), (2, 5, 9)]


@pytest.fixture(scope="module")
def pt2_folder(tiny, tiny_export, tmp_path_factory):
    """A copy of tiny_export (ONNX + TorchScript) with the tiny model's torch.export program added. Read-only."""
    folder = tmp_path_factory.mktemp("pt2") / "export"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    export_pt2(tiny, folder)
    return folder


@pytest.fixture()
def stranger(monkeypatch):
    """This process has exported nothing: every pt2/aoti file in a folder is someone else's."""
    monkeypatch.setattr(trust, "_own", set())


def test_program_is_recorded_hashed_and_runs_at_unseen_shapes(tiny, pt2_folder):
    manifest = json.loads((pt2_folder / "manifest.json").read_text())
    assert set(manifest["artifacts"]) == {"onnx", "torchscript", "pt2"}  # added beside the others
    entry = manifest["artifacts"]["pt2"]
    assert entry["format"] == "pt2" and entry["file"] == PT2_FILE
    assert entry["files"][PT2_FILE]["sha256"] == sha256_file(pt2_folder / PT2_FILE)
    assert entry["dynamic_axes"] == ["batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"]
    assert entry["io"]["inputs"]["attention_mask"]["shape"] == ["batch_size", "total_sequence_length"]
    with ExportFolder.open(pt2_folder, "pt2") as ef:
        assert isinstance(ef.entry("pt2").details, Pt2Details)
        module = torch.export.load(str(ef.file("pt2"))).module()
    for b, s, p in SHAPES:
        ids, mask, past = make_inputs(tiny.contract, b, s, p, seed=3)
        with torch.no_grad():
            ref, ref_present = tiny.module(ids, mask, past)
            got, present = module(ids, mask, past)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        assert present[1][0].shape == (b, tiny.contract.n_kv_heads, p + s, tiny.contract.head_dim)
        torch.testing.assert_close(present[1][1], ref_present[1][1], atol=1e-5, rtol=0)


def test_trusted_program_passes_every_check(tiny, pt2_folder, stranger):
    report = verify_folder(pt2_folder, loaded=tiny, runtimes=("pt2",), trust_code=True)
    assert report.passed, report.verdict.message
    assert report.runtimes["pt2"].status == "ran" and report.runtimes["pt2"].artifact == "pt2"
    assert {ch: report.results["pt2"][ch].status for ch in CHECKS} == {ch: True for ch in CHECKS}


def test_default_list_leaves_out_a_strangers_program_and_says_why(tiny, pt2_folder, stranger):
    report = verify_folder(pt2_folder, loaded=tiny, checks=("parity",))
    info = report.runtimes["pt2"]
    assert info.status == "skipped"
    assert "is code" in info.reason and "--trust-code" in info.reason
    assert report.results["pt2"] == {}  # not a single check ran on it, so nothing counted as passed
    assert report.passed  # the other default runtimes ran; a default runtime skipped does not fail the verdict
    assert "pt2" in report.verdict.message  # "runtime(s) skipped: ..., pt2"
    assert "pt2" in markdown(report).split("### Details")[1]


def test_own_export_is_loaded_without_trust(tiny, tiny_export, tmp_path):
    folder = tmp_path / "own"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    export_pt2(tiny, folder)  # this process wrote these bytes
    report = verify_folder(folder, loaded=tiny, runtimes=("pt2",), checks=("parity",))
    assert report.runtimes["pt2"].status == "ran" and report.passed


def test_named_runtime_without_trust_is_refused(tiny, pt2_folder, stranger):
    with pytest.raises(ConfigError, match=r"--runtime pt2: not loaded: model\.pt2 .* is code .*--trust-code"):
        verify_folder(pt2_folder, loaded=tiny, runtimes=("pt2",))


@pytest.mark.parametrize("args", [["verify", "{f}", "--runtime", "pt2"],
                                  ["bench", "{f}", "--runtimes", "pt2,ort-cpu", "-o", "{o}"]],
                         ids=["verify", "bench"])
def test_cli_refuses_named_code_runtime_in_one_line(pt2_folder, tmp_path, stranger, args):
    res = CliRunner().invoke(main, [a.format(f=pt2_folder, o=tmp_path) for a in args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("Error: --runtime") and "--trust-code" in lines[-1]
    assert "Traceback" not in res.output
    assert not list(tmp_path.glob("bench.*"))  # refused before any work


def test_bench_times_the_program_beside_ort(pt2_folder, stranger, monkeypatch):
    from mhaexport.bench import BenchConfig, run_bench
    from mhaexport.bench.probes import Bandwidth

    cfg = BenchConfig(prompt_len=8, new_tokens=6, repeats=2, threads=1, long_to=0, runtimes=("pt2", "ort-cpu"),
                      trust_code=True)
    res = run_bench(pt2_folder, cfg, probe=lambda t: Bandwidth({"copy": 10.0}, t, 256, "fake"))
    row = res.get("pt2")
    assert row.ran and row.providers == ["torch.export (cpu)"] and row.load_ms > 0
    assert row.token_p50_ms > 0 and res.get("ort-cpu").token_p50_ms > 0
    untrusted = run_bench(pt2_folder, BenchConfig(prompt_len=8, new_tokens=6, repeats=1, threads=1, long_to=0,
                                                  runtimes=None, max_warmups=2),
                          probe=lambda t: Bandwidth({"copy": 10.0}, t, 256, "fake"))
    assert untrusted.get("pt2").ran is None and "--trust-code" in untrusted.get("pt2").reason
    assert untrusted.get("aoti") is None  # the folder holds no package: not a row of the default run


def test_the_code_runner_feeds_contiguous_tensors(tiny):
    """An AOTInductor package reads its inputs at the strides it was compiled at and checks none (a strided view gave
    max abs 3.6 on the small preset): the runner hands the program contiguous tensors, whatever the loop passes."""
    import numpy as np

    from mhaexport.runners.pt2 import CodeRunner

    c = tiny.contract
    seen = []

    def program(ids, mask, past):
        seen.extend(t.is_contiguous() for t in (ids, mask, *[x for kv in past for x in kv]))
        return tiny.module(ids, mask, past)

    runner = CodeRunner("aoti", c, "unused.pt2")
    runner.module, runner.is_active = program, True
    prompts = np.arange(24, dtype=np.int64).reshape(2, 12) % c.vocab_size
    ids = prompts[:, 4:8]  # the decode loop's slice of a batch: not contiguous
    assert not ids.flags.c_contiguous
    k = torch.zeros(2, c.n_kv_heads, 6, c.head_dim).transpose(2, 3).contiguous().transpose(2, 3)  # strided
    cache = tuple((k, k) for _ in range(c.n_layers))
    runner.step(ids, np.ones((2, 10), dtype=np.int64), cache)
    assert seen and all(seen)


def test_details_are_typed_records():
    from mhaexport.artifact.manifest import ArtifactEntry
    from mhaexport.core.errors import ArtifactError

    files = {AOTI_FILE: {"sha256": "0" * 64, "bytes": 1}}
    entry = {"format": "aoti", "file": AOTI_FILE, "files": files, "device": "cpu", "compile_seconds": 42.9,
             "program_sha256": "ab", "compiler": "g++: gcc version 12.2.0"}
    read = ArtifactEntry.from_dict(entry)
    assert isinstance(read.details, AotiDetails) and read.details.compile_seconds == 42.9
    assert read.to_dict()["compile_seconds"] == 42.9 and read.to_dict()["device"] == "cpu"
    with pytest.raises(ArtifactError, match=r"compile_seconds is '42\.9' \(str\), expected float"):
        ArtifactEntry.from_dict({**entry, "compile_seconds": "42.9"})


USER_MODELS = textwrap.dedent("""
    import dataclasses
    from mhaexport.models.config import PRESETS
    from mhaexport.models.decoder import DecoderLM

    CONFIG = dataclasses.replace(PRESETS["tiny"], name="user")


    class DataDependent(DecoderLM):
        def forward(self, input_ids, attention_mask, past_key_values=()):
            logits, present = super().forward(input_ids, attention_mask, past_key_values)
            if attention_mask.sum() > 0:  # a branch on a tensor's values
                logits = logits * 2
            return logits, present


    class GuardOnLength(DecoderLM):
        def forward(self, input_ids, attention_mask, past_key_values=()):
            logits, present = super().forward(input_ids, attention_mask, past_key_values)
            if input_ids.shape[1] > 4:  # a Python branch on the dynamic sequence length
                logits = logits * 2
            return logits, present


    def data_dependent():
        return DataDependent(CONFIG).eval()


    def guard_on_length():
        return GuardOnLength(CONFIG).eval()
""")


@pytest.mark.parametrize("factory,reason", [
    ("data_dependent", "torch.export cannot take it: forward branches on a tensor's values (data-dependent control "
                       "flow)"),
    ("guard_on_length", "torch.export cannot keep the dynamic axis 'sequence_length': forward fixes or branches on "
                        "that length"),
])
def test_a_model_torch_export_cannot_take_gets_one_line(tmp_path, monkeypatch, factory, reason):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "user_models.py").write_text(USER_MODELS)
    res = CliRunner().invoke(main, ["pt2", "--model", f"user_models.py:{factory}", "-o", "out"])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0]
    assert errors[0].startswith(f"Error: factory:user_models.py:{factory}: {reason}"), errors[0]
    assert not (tmp_path / "out" / PT2_FILE).exists() and not (tmp_path / "out" / "manifest.json").exists()


def test_the_attention_block_exports_and_verifies(tmp_path):
    res = CliRunner().invoke(main, ["pt2", "--module", "attention", "--config", "tiny", "-o", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    from test_cli_json import check_export_json

    check_export_json(res.stdout, "pt2", tmp_path, ["pt2"])
    report = verify_folder(tmp_path, runtimes=("pt2",), trust_code=True)
    assert report.passed, report.verdict.message
    assert report.module == "attention" and report.runtimes["pt2"].providers == ["torch.export (cpu)"]


def test_an_unclassified_failure_names_the_exporter():
    from mhaexport.exporter.pt2 import explain_failure

    assert explain_failure(RuntimeError("boom"), "m") == "m: torch.export.export failed: RuntimeError: boom"


@pytest.mark.slow
def test_all_with_aoti_verifies_both_and_benches_the_package(tmp_path, monkeypatch):
    """mhaexport all --aoti: ONNX, TorchScript, pt2 and an AOTInductor package (a ~50 s compile of tiny on 2 cores)
    verified on every check in one process (its own export: no --trust-code), then benched with --trust-code."""
    from mhaexport.bench import probes
    from mhaexport.bench.probes import Bandwidth

    out = tmp_path / "all"
    res = CliRunner().invoke(main, ["-q", "all", "--config", "tiny", "--aoti", "-o", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    for rt in ("pt2", "aoti"):
        assert report["runtimes"][rt]["status"] == "ran"
        assert {ch: report["results"][rt][ch]["status"] for ch in CHECKS} == {ch: True for ch in CHECKS}
    with ExportFolder.open(out, "aoti") as ef:
        d = ef.entry("aoti").details
        assert isinstance(d, AotiDetails) and d.device == "cpu" and d.compile_seconds > 1
        assert d.program_sha256 == ef.entry("pt2").files[PT2_FILE]["sha256"]
        assert ef.entry("aoti").files[AOTI_FILE]["sha256"] == sha256_file(out / AOTI_FILE)
    monkeypatch.setattr(trust, "_own", set())
    monkeypatch.setattr(probes, "default_probe", lambda t: Bandwidth({"copy": 10.0}, t, 256, "fake"))
    res = CliRunner().invoke(main, ["-q", "bench", str(out), "--runtimes", "ort-cpu,torchscript,pt2,aoti",
                                    "--prompt-len", "8", "--new-tokens", "8", "--repeats", "2", "--long", "0",
                                    "--trust-code", "-o", str(tmp_path / "bench")])
    assert res.exit_code == 0, res.output
    bench = json.loads((tmp_path / "bench" / "bench.json").read_text())
    rows = {r["name"]: r for r in bench["runtimes"]}
    assert all(rows[n]["ran"] and rows[n]["token_p50_ms"] > 0 for n in ("ort-cpu", "torchscript", "pt2", "aoti"))
    assert rows["aoti"]["providers"] == ["AOTInductor (cpu)"]
    assert any("compiled once at export" in n for n in rows["aoti"]["notes"])


@pytest.mark.slow
def test_tiny_llama_exports_and_verifies_on_every_check(tmp_path):
    from mhaexport.models.loading import load_model

    loaded = load_model(config="tiny-llama", random_weights=True)
    export_pt2(loaded, tmp_path)
    report = verify_folder(tmp_path, loaded=loaded, runtimes=("pt2",))
    assert report.passed, report.verdict.message
    assert {ch: report.results["pt2"][ch].status for ch in CHECKS} == {ch: True for ch in CHECKS}


def test_an_hf_llama_program_serves_every_contract_shape(hf_dir):
    """transformers' Llama (one layer, grouped-query attention) under the --hf adapter: one program, no axis narrowed,
    serves the empty-cache prefill (mask width == ids width), the one-token decode step and shapes the export never
    saw, equal to eager (logits and the present cache); and it bisects clean under transformers' module paths."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from mhaexport.exporter.pt2 import export_program
    from mhaexport.models.loading import load_model

    loaded = load_model(hf=str(hf_dir("llama-small")))
    program, _, warns = export_program(loaded)
    assert not any("narrowed" in w for w in warns), warns
    module = program.module()
    for b, s, p in SHAPES:
        ids, mask, past = make_inputs(loaded.contract, b, s, p, seed=5)
        with torch.no_grad():
            ref, ref_present = loaded.module(ids, mask, past)
            got, present = module(ids, mask, past)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(present[0][1], ref_present[0][1], atol=1e-5, rtol=0)
        assert present[0][0].shape == (b, loaded.contract.n_kv_heads, p + s, loaded.contract.head_dim)
    # its nodes keep transformers' module paths: the program bisects module by module (diagnose/bisect_pt2.py)
    from mhaexport.diagnose.bisect_pt2 import bisect_program

    report = bisect_program(program, loaded, batch=2, seq=3, past=4, pad=[0, 2])
    assert report.ok and not report.unmatched, report.summary()
    assert {"hf.model.layers.0.self_attn", "hf.model.layers.0.self_attn.v_proj", "hf.model.layers.0.mlp",
            "hf.lm_head", "output logits"} <= {r.module for r in report.rows}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "gpt2", "mistral", "qwen2", "phi3", "gemma"])
def test_hf_models_export_and_verify_on_every_check(hf_dir, tmp_path, arch):
    """`mhaexport pt2 --hf DIR` on each proved architecture (two layers; ~10 s each on 2 cores: export and verify),
    verified on every check with the dynamic axes kept."""
    pytest.importorskip("transformers")
    res = CliRunner().invoke(main, ["-q", "pt2", "--hf", str(hf_dir(arch, tokenizer=False)), "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["artifacts"]["pt2"]["dynamic_axes"] == ["batch_size", "sequence_length", "past_sequence_length",
                                                            "total_sequence_length"]
    assert not any("narrowed" in w for w in manifest["artifacts"]["pt2"].get("warnings", [])), manifest
    res = CliRunner().invoke(main, ["-q", "verify", str(tmp_path), "--runtime", "pt2", "--trust-code"])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "report-pt2.json").read_text())  # a named --runtime's own report
    assert {ch: report["results"]["pt2"][ch]["status"] for ch in CHECKS} == {ch: True for ch in CHECKS}


@pytest.mark.slow
def test_a_program_that_cannot_serve_the_contract_is_refused_in_one_line(hf_dir, tmp_path, monkeypatch):
    """The --hf adapter as it was before it gathered its positions (a slice of the mask's last `seq` columns, no word
    to torch.export that the mask is past + seq wide; two HF exports, ~15 s): torch's guards narrow
    total_sequence_length to >= 4, and the program made with its suggested fix checks attention_mask width !=
    input_ids width (a non-empty cache): the exporter's run at unseen shapes refuses it in one line, nothing
    written."""
    pytest.importorskip("transformers")
    from mhaexport.core.errors import ExportError
    from mhaexport.models import hf
    from mhaexport.models.loading import load_model

    def sliced_positions(self, input_ids, attention_mask, past_key_values=None):
        T = input_ids.shape[1]
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -T:]
        cache = self._cache_cls(tuple((k, v) for k, v in past_key_values or ()))
        out = self.hf(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                      use_cache=True, return_dict=True, **{self._cache_kw: cache})
        return out.logits, hf._cache_tuples(hf._output_cache(out))

    monkeypatch.setattr(hf.HFCausalLM, "forward", sliced_positions)
    loaded = load_model(hf=str(hf_dir("llama", tokenizer=False)))
    with pytest.raises(ExportError, match=r"^LlamaForCausalLM \(llama\): torch\.export cannot keep the dynamic axes: "
                                          r"the program it makes checks 'attention_mask\.size\(\)\[1\] != "
                                          r"input_ids\.size\(\)\[1\]' and refuses batch=1 seq=7 past=0"):
        export_pt2(loaded, tmp_path)
    assert not (tmp_path / PT2_FILE).exists()
