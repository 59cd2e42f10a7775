"""Deploy from Python, text in and text out: ``mhaexport.runtime.load(folder)`` and its ``generate`` / ``stream``,
on the one decode loop and the folder's tokenizer, torch-free."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mhaexport.runtime as rt
from mhaexport.core.errors import RuntimeInputError
from mhaexport.runtime import GenerationConfig, Generator
from mhaexport.runtime.model import _Pieces
from mhaexport.runtime.tokenizer import byte_level


@pytest.fixture(scope="module")
def model(tiny_export):
    return rt.load(tiny_export)


def test_text_in_text_out_is_the_decode_loops_greedy_continuation(model, tiny_export):
    text = model.generate("The river ", max_new_tokens=12)
    ids = list(b"The river ")
    want = Generator(tiny_export).generate([ids], GenerationConfig(max_new_tokens=12)).tokens[0]
    assert isinstance(text, str) and text == byte_level().continuation(ids, want)
    assert model.generate(ids, max_new_tokens=12) == want  # ids in: the new ids out
    assert model.generate(["The river ", "ab"], max_new_tokens=12)[0] == text  # a batch: one str each
    assert model.generate([ids, [5, 6]], max_new_tokens=12)[0] == want
    res = model.generate("The river ", max_new_tokens=12, return_result=True)
    assert res.texts == [text] and res.stop_reason == "max_new_tokens" and res.providers == ["CPUExecutionProvider"]


def test_stream_yields_the_same_text_piece_by_piece(model):
    pieces = list(model.stream("The river ", max_new_tokens=12))
    assert len(pieces) > 1 and "".join(pieces) == model.generate("The river ", max_new_tokens=12)
    said = []
    sampled = model.generate("The river ", max_new_tokens=12, do_sample=True, temperature=0.9, seed=5,
                             streamer=said.append)
    assert "".join(said) == sampled  # a callable streamer sees every piece, sampling too


def test_a_put_end_streamer_gets_the_prompt_then_each_token(model):
    class Recorder:  # transformers' BaseStreamer protocol (TextStreamer, TextIteratorStreamer)
        def __init__(self):
            self.calls = []

        def put(self, value):
            self.calls.append(np.asarray(value).tolist())

        def end(self):
            self.calls.append("end")

    rec = Recorder()
    new = model.generate([7, 8, 9], max_new_tokens=5, streamer=rec)
    assert rec.calls == [[7, 8, 9], *[[t] for t in new], "end"]
    rec = Recorder()
    both = model.generate([[7, 8, 9], [4, 5, 6]], max_new_tokens=3, streamer=rec)
    assert rec.calls[0] == [[7, 8, 9], [4, 5, 6]] and rec.calls[-1] == "end" and len(rec.calls) == 2 + 3
    assert [c[0] for c in rec.calls[1:-1]] == both[0] and [c[1] for c in rec.calls[1:-1]] == both[1]
    with pytest.raises(RuntimeInputError, match="prompts of one length"):  # a ragged batch: one line, not numpy's
        model.generate([[7, 8, 9], [5]], max_new_tokens=3, streamer=Recorder())


def test_an_unfinished_character_is_held_back_until_its_bytes_are_there():
    pieces = _Pieces(byte_level(), list(b"caf"))
    assert [pieces.add(t) for t in "é!".encode()] == ["", "é", "!"] and pieces.rest() == ""


def test_bad_inputs_are_one_line_errors(model):
    with pytest.raises(RuntimeInputError, match="give a str, a list of str, a list of token ids"):
        model.generate(3.5)
    with pytest.raises(RuntimeInputError, match="a text streamer takes one prompt"):
        model.generate(["a", "b"], streamer=print)
    with pytest.raises(RuntimeInputError, match="outside the vocabulary"):
        model.generate([[999]])
    with pytest.raises(RuntimeInputError, match="max_new_tokens must be >= 1"):  # raised in the worker, told here
        list(model.stream("x", max_new_tokens=0))


def test_the_deploy_api_imports_no_torch(tiny_export):
    code = (f"import sys, mhaexport.runtime as rt; m = rt.load({str(tiny_export)!r}); "
            "print(m.generate('ab', max_new_tokens=3)); assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
