"""Messages that point at the real cause (issue 19): damage planted in the shipped file (re-hashed), each class
asserted on the check and the words that name it — and the words that must not appear (a tolerance to loosen, a
size baked in)."""

from __future__ import annotations

import pytest

from mhaexport.verify import verify_folder
from mhaexport.verify.checks import parity_over_sweep
from mhaexport.verify.compare import Diff, Tolerance
from mhaexport.verify.sweep import Case
from planted.edit import rehashed_copy
from planted.file_bugs import fp16_cache, position_row, weight_column


def _verify(folder, loaded, *checks):
    return verify_folder(folder, loaded=loaded, runtimes=("ort-cpu",), checks=checks).results["ort-cpu"]


def test_a_real_weight_edit_is_not_offered_a_looser_tolerance_and_names_the_cache_layer(tiny, tiny_export, tmp_path):
    folder = rehashed_copy(tiny_export, tmp_path / "w", weight_column)
    parity = _verify(folder, tiny, "parity")["parity"]
    assert parity.status is False
    assert "not rounding" in parity.message and "not a tolerance to loosen" in parity.message
    assert "would pass" not in parity.message
    # the edit sits in block 0's MLP: layer 0's cache is untouched, layer 1's differs
    assert "present differs at present.1.key" in parity.message and "the others agree" in parity.message
    assert set(parity.figures["present_failing"]) == {"present.1.key", "present.1.value"}


def test_rounding_is_offered_the_atol_that_would_pass(tiny, tiny_export):
    rep = verify_folder(tiny_export, loaded=tiny, atol=0.0, rtol=0.0, runtimes=("ort-cpu",), checks=("parity",))
    parity = rep.results["ort-cpu"]["parity"]
    if parity.figures["max_abs"] == 0:
        pytest.skip("ORT matched eager bit for bit on this machine: nothing to tighten")  # pragma: no cover
    assert "would pass (the size of float32 rounding at this scale)" in parity.message


def test_damage_high_in_the_position_table_is_named_with_its_position_not_a_baked_size(tiny, tiny_export,
                                                                                         tmp_path):
    folder = rehashed_copy(tiny_export, tmp_path / "p", position_row)
    res = _verify(folder, tiny, "parity", "dynamic-shapes")
    dyn = res["dynamic-shapes"]
    assert dyn.status is False and "baked in at export" not in dyn.message
    assert "damage that depends on position or length, first at position 100" in dyn.message
    assert dyn.figures["first_bad_position"] == 100


def test_precision_lost_in_one_layers_cache_fails_the_default_sweep(tiny, tiny_export, tmp_path):
    """It stays within the tolerance on nearly every value (the full sweep found 3 of 1.7 M): the default quick
    sweep fails it by the error's size against float32 rounding, per cache output."""
    folder = rehashed_copy(tiny_export, tmp_path / "c", fp16_cache)
    parity = _verify(folder, tiny, "parity")["parity"]
    assert parity.status is False
    assert parity.message.startswith("precision lost in present.1.key: max abs")
    assert "float32's epsilon at its scale" in parity.message


def test_cases_that_fail_to_run_do_not_hide_the_errors_of_those_that_ran():
    good, bad = Case(1, 4, 0, seed=1), Case(2, 5, 3, seed=2)
    outputs = {good: "ran", bad: RuntimeError("ORT: shape mismatch")}
    tol = Tolerance(1e-4, 1e-3)
    wrong = Diff(max_abs=1.02, max_rel=1.0, mismatched=51, total=100, min_atol=1.02)
    res = parity_over_sweep(outputs, ("logits",), tol, lambda case, out: {"logits": wrong})
    assert res.status is False
    assert res.message.startswith("failed to run at 1 case(s): b=2 seq=5 past=3")
    assert "in the 1 case(s) that ran, 51/100 values differ" in res.message and "1.02" in res.message
    ok = parity_over_sweep(outputs, ("logits",), tol, lambda case, out: {"logits": Diff(total=100)})
    assert "the 1 case(s) that ran agree" in ok.message and ok.status is False


def test_a_long_message_is_cut_at_a_word_and_says_so():
    """ONNX Runtime's messages in one-line findings were cut mid-word at 300 characters; now at a word, with "…"."""
    from mhaexport.core.errors import RuntimeFailure, clip, first_line

    ort = ("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Add node. Name:'node_add_3' "
           "Status Message: ") + "broadcasting dimensions of the past key and the new key do not match " * 6
    line = first_line(RuntimeFailure(ort))
    assert len(line) <= len("RuntimeFailure: ") + 300 and line.endswith("…")
    assert line[:-1].split()[-1] in ort.split()  # the last word shown is a whole word of the message
    assert clip("short message") == "short message" and clip("x" * 400, 100) == "x" * 99 + "…"


def test_tracer_and_jit_warnings_are_one_note_each():
    """A --hf export printed two raw TracerWarnings and torch.jit's deprecation as yellow warnings; now one note
    each (verify runs the trace at other sizes), and a warning of another kind stays a warning."""
    from mhaexport.exporter.common import is_note
    from mhaexport.exporter.torchscript import DEPRECATION_NOTE, _summarize

    got = _summarize(["TracerWarning: torch.tensor results are registered as constants in the trace. You can ...",
                      "TracerWarning: Converting a tensor to a Python boolean might cause the trace to be incorrect.",
                      "UserWarning: torch.jit.trace is deprecated", "UserWarning: something about the model"])
    assert got == ["UserWarning: something about the model",
                   "torch.jit.trace recorded 2 value(s) as constants (TracerWarning: torch.tensor results are "
                   "registered as constants in the trace; ...); verify runs the file at sizes it was not traced at, "
                   "and fails it if one mattered", DEPRECATION_NOTE]
    assert [is_note(w) for w in got] == [False, True, True]
