"""Bisect of a torch.export program (model.pt2): its FX nodes keep their module scopes (nn_module_stack), so the
program's values are compared with eager's module by module, as the ONNX graph's are; a weight planted in the saved
program only is named, and verify --bisect picks the program when the folder's report has it failing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from planted.edit import rehash

from mhaexport.artifact import trust
from mhaexport.cli import main
from mhaexport.exporter.pt2 import PT2_FILE, export_pt2
from mhaexport.diagnose.bisect_pt2 import bisect_program, bisect_target

PLANTED = "blocks.1.attn.W_v"


@pytest.fixture(scope="module")
def pt2_folder(tiny, tiny_export, tmp_path_factory):
    """tiny_export (ONNX + TorchScript) with the tiny model's program added. Read-only."""
    folder = tmp_path_factory.mktemp("bisect-pt2") / "export"
    shutil.copytree(tiny_export, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    export_pt2(tiny, folder)
    return folder


@pytest.fixture(scope="module")
def planted(pt2_folder, tmp_path_factory):
    """A copy whose saved program has one input feature's column of blocks.1.attn.W_v changed (a whole output row
    would vanish in the next LayerNorm), re-hashed as a pipeline editing the file would: a bug only the program has."""
    folder = tmp_path_factory.mktemp("bisect-pt2-planted") / "export"
    shutil.copytree(pt2_folder, folder, ignore=shutil.ignore_patterns(".snapshot-*", ".staging-*"))
    program = torch.export.load(str(folder / PT2_FILE))
    with torch.no_grad():
        program.state_dict[f"{PLANTED}.weight"][:, 0] += 0.5  # (out, in): input feature 0
    torch.export.save(program, folder / PT2_FILE)
    rehash(folder, (PT2_FILE,), artifact="pt2")
    return folder


def test_a_clean_program_bisects_clean_module_by_module(tiny, pt2_folder):
    program = torch.export.load(str(pt2_folder / PT2_FILE))
    report = bisect_program(program, tiny, batch=3, seq=6, past=4, pad=[0, 2, 7])
    assert report.ok and not report.unmatched, report.summary()
    modules = {r.module for r in report.rows}
    assert {"tok_emb", "blocks.0.attn.W_q", "blocks.1.attn", "blocks.1", "ln_f", "lm_head", "output logits",
            "output present.1.value"} <= modules
    assert max(r.rel for r in report.rows) < 1e-6
    assert "max|pt2 - eager|" in report.summary() and report.kind == "pt2"


def test_a_weight_planted_in_the_saved_program_is_named(planted, stranger):
    args = ["verify", str(planted), "--bisect", "--runtime", "pt2", "--case", "2,5,9"]
    refused = CliRunner().invoke(main, args)  # the planted file is no export of this process: code, not loaded
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.strip().splitlines()[-1].startswith("Error: --bisect of the torch.export program: not "
                                                              "loaded: model.pt2")
    res = CliRunner().invoke(main, args + ["--trust-code"])
    assert res.exit_code == 1, res.output
    assert "at batch=2 seq=5 past=9 (--case)" in res.stdout
    assert f"culprit in block blocks.1: {PLANTED}: input agrees" in res.stdout
    assert f"program nodes of {PLANTED} itself: aten.linear" in res.stdout
    assert f"the torch.export program diverges from eager PyTorch at {PLANTED}" in res.stderr


def test_verify_bisect_picks_the_program_its_report_has_failing(planted, tmp_path, stranger):
    folder = tmp_path / "export"
    shutil.copytree(planted, folder)
    assert bisect_target(folder) == "onnx"  # no report yet: the ONNX file, as before
    res = CliRunner().invoke(main, ["verify", str(folder), "--runtime", "pt2", "--trust-code", "--sweep", "quick"])
    assert res.exit_code == 1, res.output  # parity (and more) fail on the program only
    report = json.loads((folder / "report-pt2.json").read_text())
    assert report["results"]["pt2"]["parity"]["status"] is False
    assert bisect_target(folder) == "pt2"
    res = CliRunner().invoke(main, ["verify", str(folder), "--bisect", "--trust-code"])
    assert res.exit_code == 1, res.output
    assert "pt2's worst parity case in report-pt2.json" in res.stdout
    assert f"culprit in block blocks.1: {PLANTED}" in res.stdout


def test_an_aoti_package_is_not_bisected_in_one_line(pt2_folder):
    res = CliRunner().invoke(main, ["verify", str(pt2_folder), "--bisect", "--runtime", "aoti"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines()[-1] == (
        "Error: --bisect --runtime aoti: an AOTInductor package keeps no module scopes (one compiled library); "
        "bisect the program it was compiled from: --runtime pt2")


@pytest.fixture()
def stranger(monkeypatch):
    """This process has exported nothing: every pt2 file in a folder is someone else's."""
    monkeypatch.setattr(trust, "_own", set())
