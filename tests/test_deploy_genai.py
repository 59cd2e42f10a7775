"""The deploy API and `mhaexport generate` on onnxruntime-genai's own loop: chosen where it is installed and the
folder's genai_config.json passes the genai-config check (engine="auto"), forced either way, visible (the model's
engine and reason, each result's, a line of the CLI), the same greedy tokens as mhaexport's loop, streaming on both,
its own sampler, the calls it cannot run as ours (run on ours under auto), and only the snapshot loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import mhaexport
import mhaexport.runtime as rt
from mhaexport.cli import main
from mhaexport.core.errors import ArtifactError, RuntimeInputError, RuntimeOptionError
from mhaexport.runtime import GenerationConfig
from mhaexport.runtime.engine import open_generator
from planted.edit import edited_genai_config

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed: its engine cannot run")

GENAI, OURS = "onnxruntime-genai", "mhaexport"


@pytest.fixture(scope="module")
def both(tiny_export):
    return rt.load(tiny_export, threads=1), rt.load(tiny_export, threads=1, engine=OURS)


def test_auto_picks_onnxruntime_genai_and_says_why(both):
    genai, ours = both
    assert genai.engine == GENAI and "passes the genai-config check" in genai.engine_reason
    assert ours.engine == OURS and "asked" in ours.engine_reason
    res = genai.generate([5, 17, 42], max_new_tokens=4, return_result=True)
    assert res.engine == GENAI and res.providers == ["CPUExecutionProvider"] and len(res.tokens[0]) == 4
    assert GENAI in repr(genai)


def test_greedy_batch_and_streaming_are_the_same_on_both_engines(both):
    genai, ours = both
    prompts = [[5, 17, 42], [1, 2], [9, 8, 7, 6, 5]]
    eos = genai.eos_token_id  # its loop always has one (the config's); give ours the same
    a = genai.generate(prompts, max_new_tokens=6, eos_token_id=eos, return_result=True)
    b = ours.generate(prompts, max_new_tokens=6, eos_token_id=eos, return_result=True)
    assert a.tokens == b.tokens and (a.stop_reason, a.message) == (b.stop_reason, b.message)
    assert len(a.step_s) == 5 and a.prefill_s > 0 and a.first_token_s >= a.prefill_s  # timed as ours is
    said = {}
    for model in both:  # a callable gets text pieces; stream() yields them
        said[model.engine] = list(model.stream("ab", max_new_tokens=5, eos_token_id=eos))
    assert said[GENAI] == said[OURS] and "".join(said[GENAI]) == genai.generate("ab", max_new_tokens=5,
                                                                               eos_token_id=eos)
    steps = []
    genai.generate([[5, 17, 42], [1, 2, 3]], max_new_tokens=3, streamer=type(
        "Put", (), {"put": lambda self, v: steps.append(np.asarray(v).tolist()), "end": lambda self: None})())
    assert steps[0] == [[5, 17, 42], [1, 2, 3]] and [len(s) for s in steps[1:]] == [2, 2, 2]


def test_an_eos_asked_stops_its_loop_where_it_stops_ours(both):
    genai, ours = both
    first = ours.generate([5, 17, 42], max_new_tokens=3)[0]
    for model in both:
        res = model.generate([5, 17, 42], max_new_tokens=8, eos_token_id=first, return_result=True)
        assert res.tokens == [[first]] and res.stop_reason == "eos", model.engine


def test_sampling_on_onnxruntime_genai_is_its_own_seeded_rng(both):
    genai, _ = both
    opts = dict(max_new_tokens=8, do_sample=True, temperature=1.5, seed=3)
    a, b = genai.generate([[5, 17, 42]], **opts), genai.generate([[5, 17, 42]], **opts)
    assert a == b and len(a[0]) == 8  # the same seed repeats its tokens (not mhaexport's sampler's: its own RNG)
    seeds = {tuple(genai.generate([[5, 17, 42]], **{**opts, "seed": s})[0]) for s in range(6)}
    assert len(seeds) > 1  # and the seed reaches it
    assert len(genai.generate([[1]], **{**opts, "seed": 2 ** 32 - 1})[0]) == 8  # our seed range, taken mod 2**31


def test_calls_its_loop_would_generate_otherwise_run_on_ours_under_auto(tiny_export, both):
    genai, ours = both
    pad = genai.generator.pad_token_id
    res = genai.generate([5, 6, pad], max_new_tokens=3, return_result=True)  # trailing pad id: padding to og
    assert res.engine == OURS and "reads trailing pad tokens as right padding" in res.message
    assert res.tokens == ours.generate([[5, 6, pad]], max_new_tokens=3, eos_token_id=genai.eos_token_id,
                                       return_result=True).tokens
    forced = rt.load(tiny_export, engine=GENAI)
    with pytest.raises(RuntimeInputError, match="trailing pad tokens"):
        forced.generate([5, 6, pad], max_new_tokens=3)
    limit = genai.generator.context_length
    prompt = [7] * (limit - 1)  # ours: the prefill's token and one step at the last position
    auto = genai.generate(prompt, max_new_tokens=3, return_result=True)
    assert auto.engine == OURS and auto.stop_reason == "max_positions" and len(auto.tokens[0]) == 2
    res = forced.generate(prompt, max_new_tokens=3, return_result=True)  # its max_length stops a token earlier
    assert res.engine == GENAI and res.stop_reason == "max_positions" and res.tokens[0] == auto.tokens[0][:1]


def test_a_config_the_check_refuses_is_not_deployed_on_onnxruntime_genai(tiny_export, tmp_path):
    folder = edited_genai_config(tiny_export, tmp_path / "sampling", lambda c: c["search"].update(do_sample=True))
    model = rt.load(folder)
    assert model.engine == OURS and "search.do_sample" in model.engine_reason
    with pytest.raises(ArtifactError, match="genai-config check: search.do_sample"):
        rt.load(folder, engine=GENAI)
    cuda = edited_genai_config(tiny_export, tmp_path / "cuda", lambda c: c["model"]["decoder"]["session_options"]
                               .update(provider_options=[{"cuda": {}}]))
    model = rt.load(cuda)  # its loop would run another provider than the one asked
    assert model.engine == OURS and "runs the decoder on cuda" in model.engine_reason


def test_what_only_our_loop_takes_picks_it_or_is_refused(tiny_export, monkeypatch):
    assert rt.load(tiny_export, opt_level="basic").engine == OURS  # a session option of ours
    with pytest.raises(RuntimeOptionError, match="options of mhaexport's ONNX Runtime session"):
        rt.load(tiny_export, engine=GENAI, opt_level="basic")
    with pytest.raises(RuntimeOptionError, match="engine='fast': one of auto, mhaexport, onnxruntime-genai"):
        rt.load(tiny_export, engine="fast")
    from mhaexport.runtime import genai as genai_mod

    def missing():
        raise genai_mod.GenAIUnavailable("onnxruntime_genai cannot be imported (ImportError: planted); install it")

    monkeypatch.setattr(genai_mod, "import_og", missing)
    monkeypatch.setattr("mhaexport.runtime.engine.import_og", missing)
    model = rt.load(tiny_export)
    assert model.engine == OURS and "cannot be imported" in model.engine_reason
    with pytest.raises(genai_mod.GenAIUnavailable):
        rt.load(tiny_export, engine=GENAI)


def test_a_file_onnxruntime_genai_cannot_load(tiny_export, monkeypatch):
    from mhaexport.core.errors import RuntimeFailure
    from mhaexport.runtime import genai as genai_mod

    def broken(*a, **k):
        raise RuntimeError("Load model from x failed:Protobuf parsing failed.\nmore")

    monkeypatch.setattr(genai_mod, "genai_model", broken)
    model = rt.load(tiny_export)  # auto: mhaexport's loop, which loads it (or says why in its own words)
    assert model.engine == OURS and "onnxruntime-genai cannot load" in model.engine_reason
    with pytest.raises(RuntimeFailure, match="onnxruntime-genai cannot load .*Protobuf parsing failed.$"):
        rt.load(tiny_export, engine=GENAI)


def test_onnxruntime_genai_loads_the_snapshot_not_the_folder(tiny_export, monkeypatch):
    from mhaexport.runtime import genai as genai_mod

    seen = []
    real = genai_mod.genai_model
    monkeypatch.setattr(genai_mod, "genai_model", lambda folder, *a, **k: seen.append(folder) or real(folder, *a, **k))
    gen = open_generator(tiny_export, engine=GENAI)
    assert seen == [gen.export.root] and gen.export.root != tiny_export  # the checked copy, never the user's folder
    assert (gen.export.root / "genai_config.json").is_file()


def test_the_cli_and_the_api_say_which_engine_ran(tiny_export):
    args = ["generate", str(tiny_export), "--prompt-ids", "5,17,42", "--max-new-tokens", "4", "--threads", "1"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "engine: onnxruntime-genai (auto: onnxruntime-genai" in r.stderr
    outs = {e: json.loads(CliRunner().invoke(main, [*args, "--json", "--engine", e]).stdout) for e in (GENAI, OURS)}
    assert outs[GENAI]["engine"] == GENAI and outs[OURS]["engine"] == OURS
    assert outs[GENAI]["tokens"] == outs[OURS]["tokens"]
    r = CliRunner().invoke(main, [*args, "--engine", "fast"])
    assert r.exit_code == 2 and "'fast' is not one of" in r.output
    res = mhaexport.generate(tiny_export, prompt_ids=[[5, 17, 42]], max_new_tokens=4, engine=OURS)
    assert res.engine == OURS and res.tokens == [outs[OURS]["tokens"]]


def test_its_deploy_path_imports_no_torch_no_onnx_no_verify(tiny_export):
    code = (f"import sys, mhaexport.runtime as rt; m = rt.load({str(tiny_export)!r}, threads=1); "
            "assert m.engine == 'onnxruntime-genai', m.engine_reason; m.generate('ab', max_new_tokens=3); "
            "heavy = ('torch', 'onnx', 'mhaexport.verify', 'mhaexport.exporter'); "
            "print('LOADED:' + ','.join(sorted(k for k in sys.modules if any(k == h or k.startswith(h + '.') "
            "for h in heavy))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "LOADED:\n" in r.stdout, r.stdout
