"""Issue 38: verify within a memory cap — the plan made before any weight is read (whole / mapped / refused with one
line), the cap read from cgroups, weights that are pages (eager's over a file map, ONNX Runtime's external data
mapped), and a verify run under a real cgroup memory cap (slow; the fast tests prove the mapping itself)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from mhaexport.core import machine
from mhaexport.core.errors import ConfigError
from mhaexport.verify import memory
from mhaexport.verify.memory import (BASELINE_BYTES, MAPPED, WHOLE, Weights, activation_bytes, parse_size,
                                     plan_memory)

GB = 2**30
MB = 2**20


@pytest.mark.parametrize("text,want", [("1.5G", int(1.5 * GB)), ("800M", 800 * MB), ("2GiB", 2 * GB),
                                       ("1073741824", GB), ("64k", 64 * 1024), (123, 123)])
def test_sizes_parse(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "lots", "1.5Q", "-1G", "0", "G"])
def test_a_bad_size_is_refused_in_one_line(text):
    with pytest.raises(ConfigError, match="--memory") as e:
        parse_size(text)
    assert "\n" not in str(e.value)


def _weights(eager=GB, ort=GB, ort_mappable=True, **kw) -> Weights:
    return Weights(eager=eager, ort=ort, ort_mappable=ort_mappable, **kw)


def test_the_plan_keeps_weights_whole_when_they_fit():
    plan = plan_memory(_weights(), 100 * MB, 8 * GB, "test")
    assert plan.mode == WHOLE
    assert plan.need_whole == BASELINE_BYTES + 100 * MB + 2 * GB
    assert plan.skipped == {}


def test_the_plan_maps_weights_when_only_that_fits():
    cap = BASELINE_BYTES + 300 * MB
    plan = plan_memory(_weights(), 100 * MB, cap, "the cgroup's memory limit")
    assert plan.mode == MAPPED
    assert plan.need_whole > cap >= plan.need_mapped == BASELINE_BYTES + 100 * MB
    assert "the cgroup's memory limit" in plan.summary() and "mapped" in plan.summary()


def test_no_cap_known_keeps_weights_whole_and_mapped_forces_the_map():
    assert plan_memory(_weights(), 0, None, "none").mode == WHOLE
    forced = plan_memory(_weights(), 0, 64 * GB, "test", forced=True)
    assert forced.mode == MAPPED and forced.forced and "--mapped" in forced.reason


def test_a_run_that_cannot_fit_even_mapped_is_refused_before_work_in_one_line():
    acts = GB
    with pytest.raises(ConfigError) as e:
        plan_memory(_weights(), acts, BASELINE_BYTES + acts // 2, "--memory 0.9G", largest_case="b=1 seq=2048 past=0",
                    sweep="full")
    line = str(e.value)
    assert "\n" not in line
    assert "even with its weights memory-mapped" in line and "b=1 seq=2048 past=0" in line
    assert "--sweep quick" in line and "--memory above" in line and "--memory 0.9G" in line


def test_weights_inside_model_onnx_count_as_anonymous_and_the_refusal_says_how_to_map_them():
    w = _weights(ort=GB, ort_mappable=False)
    plan = plan_memory(w, 0, BASELINE_BYTES + GB + 100 * MB, "test")
    assert plan.mode == MAPPED and plan.need_mapped == BASELINE_BYTES + GB
    with pytest.raises(ConfigError, match="MHAEXPORT_EXTERNAL_DATA_BYTES=0"):
        plan_memory(w, 0, BASELINE_BYTES + GB // 2, "test")


def test_a_runtime_that_loads_whole_is_skipped_with_its_reason_when_it_does_not_fit_mapped():
    w = _weights(whole_only={"torchscript": GB, "ort-genai": 10 * MB})
    plan = plan_memory(w, 0, BASELINE_BYTES + 500 * MB, "test")
    assert plan.mode == MAPPED
    assert set(plan.skipped) == {"torchscript"}
    assert "loads its weights whole" in plan.skipped["torchscript"]


def test_the_largest_activations_are_the_longest_case():
    from mhaexport.core.iospec import ModelContract
    from mhaexport.verify.sweep import build_sweep

    c = ModelContract(n_layers=2, n_heads=4, head_dim=16, vocab_size=32000, max_positions=512)
    quick, spilled, name = activation_bytes(c, build_sweep(c, "quick"))
    assert 0 < spilled < quick  # the mapped mode holds one call's working memory, not the outputs
    assert name == "b=1 seq=512 past=0"
    assert quick >= 512 * 32000 * 4  # at least one copy of its logits
    bigger = ModelContract(n_layers=2, n_heads=4, head_dim=16, vocab_size=64000, max_positions=512)
    assert activation_bytes(bigger, build_sweep(bigger, "quick"))[0] > quick


def test_the_cap_is_read_from_cgroup_v1_and_v2(tmp_path):
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.stat").write_text("cache 0\nhierarchical_memory_limit 1610612736\n")
    (tmp_path / "cg1").write_text("12:memory:/job\n3:cpu,cpuacct:/job\n")
    assert machine._cgroup_limit(str(tmp_path / "cg1"), str(v1)) == 1610612736
    (v1 / "memory" / "job" / "memory.stat").write_text(f"hierarchical_memory_limit {2**63 - 4096}\n")
    assert machine._cgroup_limit(str(tmp_path / "cg1"), str(v1)) is None  # v1's "no limit"
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("memory\n")
    (v2 / "a" / "memory.max").write_text("800000000\n")
    (v2 / "a" / "b" / "memory.max").write_text("max\n")
    (tmp_path / "cg2").write_text("0::/a/b\n")
    assert machine._cgroup_limit(str(tmp_path / "cg2"), str(v2)) == 800000000  # the parent's limit holds


def test_an_onnx_session_with_mapped_weights_turns_prepacking_off():
    from mhaexport.runtime.session import SessionConfig, _session_options

    assert _session_options(SessionConfig(mmap_weights=True)).get_session_config_entry(
        "session.disable_prepacking") == "1"
    with pytest.raises(Exception):  # not set: ONNX Runtime has no such entry
        _session_options(SessionConfig()).get_session_config_entry("session.disable_prepacking")


def test_mapped_builtin_weights_are_the_seeded_ones_from_the_cache(tmp_path, monkeypatch):
    from mhaexport.models import stream
    from mhaexport.models.loading import load_model

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    whole = load_model("tiny", random_weights=True)
    mapped = load_model("tiny", random_weights=True, mapped=True)
    assert mapped.fingerprint == whole.fingerprint
    path = stream.seeded_cache_path(mapped.config)
    assert path.is_file() and tmp_path / "cache" in path.parents
    first = next(mapped.module.parameters())
    assert not first.untyped_storage().resizable()  # a view of the file's map, not torch's own memory
    path.write_bytes(b"not a safetensors file")  # a damaged cache file is written again
    again = load_model("tiny", random_weights=True, mapped=True)
    assert again.fingerprint == whole.fingerprint and stream.read_header(path)[0] % stream.ALIGN == 0


def test_a_mapped_checkpoint_is_the_same_model(tmp_path, monkeypatch):
    import torch

    from mhaexport.models.loading import load_model

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    whole = load_model("tiny", random_weights=True)
    ckpt = tmp_path / "w.pt"
    torch.save({k: v + 0.5 for k, v in whole.module.state_dict().items()}, ckpt)
    a = load_model("tiny", checkpoint=ckpt)
    b = load_model("tiny", checkpoint=ckpt, mapped=True)
    assert b.notes == [] and a.fingerprint == b.fingerprint and a.checkpoint_sha256 == b.checkpoint_sha256
    legacy = tmp_path / "legacy.pt"
    torch.save(whole.module.state_dict(), legacy, _use_new_zipfile_serialization=False)
    c = load_model("tiny", checkpoint=legacy, mapped=True)  # torch cannot map the legacy format: loaded whole
    assert c.fingerprint == whole.fingerprint and "loaded whole" in c.notes[0]


def test_a_run_that_cannot_fit_is_refused_before_the_model_is_rebuilt(tiny_export, monkeypatch, tmp_path):
    from mhaexport import api
    from mhaexport.models import loading

    def never(*a, **k):
        raise AssertionError("the eager model was rebuilt before the plan refused")

    monkeypatch.setattr(loading, "load_recorded", never)
    with pytest.raises(ConfigError, match=r"even with its weights memory-mapped .* the cap is 0\.01 GB"):
        api.verify(tiny_export, memory="10M", output=tmp_path / "r")
    refused = json.loads((tmp_path / "r" / "report.json").read_text())
    assert refused["verdict"]["status"] == "refused" and "--memory above" in refused["refused"]


def test_the_cli_refuses_a_cap_too_small_with_exit_2_and_one_line(tiny_export, tmp_path):
    from click.testing import CliRunner

    from mhaexport.cli import main

    res = CliRunner().invoke(main, ["verify", str(tiny_export), "--memory", "10M", "-o", str(tmp_path / "r")])
    assert res.exit_code == 2, res.output
    assert "even with its weights memory-mapped" in res.output
    bad = CliRunner().invoke(main, ["verify", str(tiny_export), "--memory", "lots"])
    assert bad.exit_code == 2 and "expected a size" in bad.output


def test_mapped_verify_reports_its_plan_and_peak(tiny_export, tmp_path, monkeypatch, one_thread):
    from mhaexport import api

    monkeypatch.setenv("MHAEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    report = api.verify(tiny_export, runtimes=["eager", "ort-cpu"], mapped=True)
    assert report, report.verdict.message
    assert report.memory.mode == MAPPED and report.memory.forced
    assert report.memory.peak_rss > 0
    d = report.to_dict()["memory"]
    assert d["mode"] == "mapped" and d["cap"] and d["parts"]["eager_weights"] > 0
    from mhaexport.verify.render import markdown

    assert "**Memory:** weights mapped" in markdown(report)


# A fast proof that the weights are pages: a child process maps a 256 MB model both ways and reports RssAnon.
_MAPPED_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np, onnx
    from onnx import helper, TensorProto, numpy_helper
    from onnx.external_data_helper import convert_model_to_external_data
    from mhaexport.runtime.session import SessionConfig, open_session
    from mhaexport.models.loading import load_model

    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    from mhaexport.models.config import load_config
    from mhaexport.models.stream import cached_seeded

    out, cfg = sys.argv[1], sys.argv[2]
    cached_seeded(load_config(cfg))  # written once (one tensor at a time), as a first mapped run does
    base = anon()
    loaded = load_model(config=cfg, mapped=True)  # the seeded weights mapped from the cache
    with __import__("torch").no_grad():
        loaded.module(*__import__("mhaexport.models.inputs", fromlist=["x"]).make_inputs(loaded.contract, 1, 8, 0))
    eager = anon() - base
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1024, 8192), dtype=np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8192])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    convert_model_to_external_data(m, location="w.data", size_threshold=0)
    onnx.save(m, out + "/m.onnx")
    del w, g, m
    before = anon()
    s = open_session(out + "/m.onnx", SessionConfig(threads=1, mmap_weights=True))[0]
    s.run(None, {"x": np.ones((1, 1024), np.float32)})
    print(json.dumps({"eager": eager, "ort": anon() - before}))
""")


def test_mapped_weights_stay_out_of_anonymous_memory(tmp_path):
    cfg = tmp_path / "wide.json"  # ~80 MB of float32 weights, mostly the (tied) embedding
    cfg.write_text(json.dumps({"vocab_size": 16000, "d_model": 1024, "n_heads": 8, "n_layers": 1, "d_ff": 2048,
                               "max_positions": 64}))
    env = {**os.environ, "MHAEXPORT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _MAPPED_CHILD, str(tmp_path), str(cfg)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    grew = json.loads(res.stdout.strip().splitlines()[-1])
    assert grew["eager"] < 16 * MB, grew  # of ~80 MB of weights (whole, RssAnon would grow by all of them)
    assert grew["ort"] < 8 * MB, grew  # of 32 MB of external data


def _cgroup_v1() -> Path | None:
    root = Path("/sys/fs/cgroup/memory")
    return root if (root / "cgroup.procs").exists() and os.access(root, os.W_OK) else None


@pytest.mark.slow
def test_verify_under_a_real_cgroup_cap_below_the_weights_it_holds(tmp_path):
    """A built-in model whose eager and ONNX weights together (~0.64 GB, the ONNX file's in external data) exceed
    what a 0.85 GB cgroup leaves above the ~0.4 GB baseline: whole, the kernel would kill the run; verify plans
    the mapped mode by itself and passes inside the cap. ~30 s with its export on a 2-core machine (45 s before the
    mapped mode spilled its outputs), minutes under load (the cap evicts the mapped pages, which are read again):
    slow. A cap below one copy of the weights needs a model over the ~0.4 GB baseline, each call re-reading it."""
    root = _cgroup_v1()
    if root is None:
        pytest.skip("no writable cgroup v1 memory controller at /sys/fs/cgroup/memory (needs root)")
    env = {**os.environ, "MHAEXPORT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "MHAEXPORT_EXTERNAL_DATA_BYTES": "0"}
    cfg = tmp_path / "narrow.json"
    cfg.write_text(json.dumps({"vocab_size": 65536, "d_model": 1024, "n_heads": 8, "n_layers": 1, "d_ff": 4096,
                               "max_positions": 64}))
    cli = [sys.executable, "-m", "mhaexport"]
    subprocess.run(cli + ["onnx", "--config", str(cfg), "-o", str(tmp_path / "m"), "-q"], env=env, check=True,
                   capture_output=True, timeout=600)
    group = root / f"mhaexport-test-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"cannot create a memory cgroup: {e}")
    cap = int(0.85 * GB)
    try:
        (group / "memory.limit_in_bytes").write_text(str(cap))
        cap = int((group / "memory.limit_in_bytes").read_text())  # the kernel rounds it to pages
        run = f"echo $$ > {group}/cgroup.procs && exec \"$@\""
        res = subprocess.run(["sh", "-c", run, "sh", *cli, "verify", str(tmp_path / "m"), "--runtime",
                              "eager,ort-cpu", "-o", str(tmp_path / "r")], env=env, capture_output=True, text=True,
                             timeout=900)
    finally:
        group.rmdir()
    assert res.returncode == 0, res.stdout[-1500:] + res.stderr[-1500:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    plan = report["memory"]
    assert plan["mode"] == "mapped" and plan["cap"] == cap and "cgroup" in plan["cap_source"]
    held = plan["parts"]["eager_weights"] + plan["parts"]["ort_weights"]
    assert held > cap - BASELINE_BYTES and plan["need_whole"] > cap


def test_a_quantized_files_weights_stay_packed_in_the_mapped_mode_where_they_fit():
    """Unpacked, MatMulNBits dequantizes every weight on every call (a 1.1 B int4 decode step: 5.0 s against
    0.06 s packed): the mapped mode keeps a quantized file's weights packed where the packed copies fit the cap."""
    w = _weights(eager=32 * GB, ort=6 * GB, ort_packed=12 * GB)  # an 8 B int4 file and its float-activation twin
    plan = plan_memory(w, 100 * MB, 22 * GB, "MemAvailable")
    assert plan.mode == MAPPED and plan.ort_packed and "packed in memory (12.00 GB)" in plan.reason
    tight = plan_memory(w, 100 * MB, 8 * GB, "the cgroup's memory limit")
    assert tight.mode == MAPPED and not tight.ort_packed and "left unpacked" in tight.reason
    assert not plan_memory(_weights(eager=32 * GB, ort=32 * GB), 0, 22 * GB, "test").ort_packed  # a float file
    assert not plan_memory(_weights(ort_packed=2 * GB), 0, 64 * GB, "test").ort_packed  # whole: packed anyway


def test_a_mapped_session_keeps_prepacking_only_when_asked():
    from mhaexport.runtime.session import SessionConfig, _session_options

    def prepacking_off(cfg: SessionConfig) -> bool:
        try:
            return _session_options(cfg).get_session_config_entry("session.disable_prepacking") == "1"
        except RuntimeError:  # not set: ONNX Runtime's default, on
            return False

    assert prepacking_off(SessionConfig(mmap_weights=True))
    assert not prepacking_off(SessionConfig(mmap_weights=True, packed_weights=True))
    assert not prepacking_off(SessionConfig())


class _Entry:
    def __init__(self, details, files):
        self.details, self.files, self.dtype = details, files, "float32"


class _Folder:
    def __init__(self, entry):
        self._entry = entry

    def has(self, art):
        return art == "onnx"

    def entry(self, art):
        return self._entry


def test_a_quantized_record_written_before_it_held_its_own_weight_bytes():
    """Such a record carried its float source's weight bytes as its own: ONNX Runtime's are then the files', the
    float model's (eager's) the recorded ones."""
    from mhaexport.artifact.details import OnnxDetails, QuantSource, Quantization, float_weight_bytes, onnx_weights

    files = {"model.onnx": {"bytes": 4_000_000}, "model.onnx.data": {"bytes": 6_000_000_000}}
    old = OnnxDetails(weight_bytes=32_000_000_000, external_data=True,
                      quantization=Quantization(weights="int4", bits=4, source=QuantSource(folder="../f")))
    ef = _Folder(_Entry(old, files))
    assert onnx_weights(ef) == (6_004_000_000, True) and float_weight_bytes(ef) == 32_000_000_000
    new = OnnxDetails(weight_bytes=6_003_000_000, external_data=True,
                      quantization=Quantization(weights="int4", bits=4,
                                                source=QuantSource(folder="../f", weight_bytes=32_000_000_000)))
    ef = _Folder(_Entry(new, files))
    assert onnx_weights(ef) == (6_003_000_000, True) and float_weight_bytes(ef) == 32_000_000_000
