"""The default sweep catches what the full one does (issue 19): every class of damage planted in the shipped file
(tests/planted/file_bugs.py) fails the same checks under `--sweep quick` as under `--sweep full`, and a correct
file passes both. Slow: the full sweep runs 57 shapes per class."""

from __future__ import annotations

import pytest

from mhaexport.verify import verify_folder
from planted.edit import rehashed_copy
from planted.file_bugs import FILE_BUGS


def _failed(folder, loaded, sweep: str) -> set[str]:
    rep = verify_folder(folder, loaded=loaded, runtimes=("ort-cpu",), sweep=sweep)
    return {name for name, r in rep.results["ort-cpu"].items() if r.status is False}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(FILE_BUGS))
def test_quick_fails_what_full_fails(bug, tiny, tiny_export, tmp_path):
    folder = rehashed_copy(tiny_export, tmp_path / bug, FILE_BUGS[bug])
    quick, full = _failed(folder, tiny, "quick"), _failed(folder, tiny, "full")
    assert full, f"{bug}: the full sweep finds nothing"
    assert full <= quick, f"{bug}: only --sweep full fails {sorted(full - quick)}"


@pytest.mark.slow
def test_a_correct_file_passes_both(tiny, tiny_export):
    assert not _failed(tiny_export, tiny, "quick") and not _failed(tiny_export, tiny, "full")
