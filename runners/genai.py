"""The ``ort-genai`` runtime: onnxruntime-genai's own generator on the folder, as deployed — its genai_config.json,
its search options, its cache handling (share buffer or not), its right padding of a batch.

onnxruntime-genai exposes no contract call (ids, mask, past -> logits, present): only its loop. So its runner is
checked as the suite's ``loop`` subject: what verify's checks of it (verify/genai_runtime.py) are given is a few
traces of that loop, run once per runner.
"""

from __future__ import annotations

from pathlib import Path

from mhaexport.core.errors import ProviderUnavailable, RuntimeInputError, UntrustedInput
from mhaexport.runners.names import ORT_GENAI
from mhaexport.runners.subjects import LOOP
from mhaexport.runtime.genai_config import GENAI_CONFIG, GenaiConfig, GenaiModel, GenaiSearch, section
from mhaexport.runtime.runner import Runner
from mhaexport.core.untrusted import load_json


def genai_unavailable() -> str | None:
    """Why onnxruntime-genai cannot run here (it cannot be imported), or None."""
    from mhaexport.runtime.genai import GenAIUnavailable, import_og

    try:
        import_og()
    except GenAIUnavailable as e:
        return str(e)
    return None


class GenAIRunner(Runner):
    """onnxruntime-genai's Model over the folder's checked snapshot (``root``: genai_config.json and the files it
    names). ``ours``: verify's own ONNX Runtime runner of the same file (the in-loop reference of kv-consistency).
    Checked as the suite's ``loop`` subject: it provides traces of its loop (verify/genai_runtime.py), not contract
    calls."""

    checked_as = LOOP

    def __init__(self, contract, root: str | Path, config: dict, *, dtype: str = "float32",
                 ours: Runner | None = None, trust_code: bool = False, shown: object = None,
                 threads: int | None = None) -> None:
        super().__init__(ORT_GENAI, contract, dtype=dtype)
        self.root = Path(root)
        self.trust_code, self.shown = trust_code, shown  # its options may load code only with --trust-code
        self.config = config  # genai_config.json as read; its sections typed below (values unchecked: the check's)
        self.threads = threads  # its decoder session's intra-op threads (bench's --threads); None: its default
        self.ours = ours
        self.model = None
        self.traces: dict | None = None

    def activate_impl(self) -> None:
        from mhaexport.runtime.genai import GenAIUnavailable, genai_model, import_og

        try:
            og = import_og()
        except GenAIUnavailable as e:
            raise ProviderUnavailable(str(e)) from None
        self.model = genai_model(self.root, self.threads, trust_code=self.trust_code, shown=self.shown)
        self.providers = [f"onnxruntime-genai {getattr(og, '__version__', '')} (its generator, "
                          f"past_present_share_buffer={bool(self.search.past_present_share_buffer)})"]
        if self.ours is not None:
            self.ours.activate()

    @property
    def model_section(self) -> GenaiModel:
        """The config's ``model`` section as a record (an empty one when it is no object)."""
        return section(GenaiModel, GenaiConfig.from_dict(self.config).model) or GenaiModel()

    @property
    def search(self) -> GenaiSearch:
        """The config's ``search`` section as a record, onnxruntime-genai's defaults where a key is absent."""
        return section(GenaiSearch, GenaiConfig.from_dict(self.config).search) or GenaiSearch()

    def deactivate_impl(self) -> None:
        self.model = None
        if self.ours is not None:
            self.ours.deactivate()

    def run_impl(self, ids, mask, past):
        raise RuntimeInputError("ort-genai runs onnxruntime-genai's own loop: it takes no contract call")


def genai_runner(ef, contract, ours: Runner | None, infos: dict | None = None, trust_code: bool = False,
                 threads: int | None = None) -> Runner:
    """The ``ort-genai`` runner of an opened folder; skipped with why where onnxruntime-genai cannot be imported, the
    folder ships no genai_config.json, or (``infos``: the other runtimes as verify met them) ONNX Runtime could not
    load the file — that is one failure, reported by its row, not one more here."""
    from mhaexport.runtime.runner import skipped

    if not ef.has("onnx"):
        return skipped(ORT_GENAI, contract, f"no ONNX export in {ef.path}")
    broken = next((f"{name}: {info.reason}" for name, info in (infos or {}).items()
                   if name.startswith("ort-") and info.status == "error"), None)
    if broken is not None:
        return skipped(ORT_GENAI, contract, f"ONNX Runtime cannot load the file (reported as {broken.split(':')[0]}'s "
                                            "failure)")
    if GENAI_CONFIG not in ef.entry("onnx").files:
        return skipped(ORT_GENAI, contract, f"{ef.path} ships no {GENAI_CONFIG} (a static export, or made without one)")
    why = genai_unavailable()
    if why is not None:
        return skipped(ORT_GENAI, contract, why)
    try:
        config = load_json(ef.file("onnx", GENAI_CONFIG), GENAI_CONFIG)
    except UntrustedInput:
        config = {}
    return GenAIRunner(contract, ef.root, config if isinstance(config, dict) else {},
                       dtype=ef.entry("onnx").dtype, ours=ours, trust_code=trust_code, shown=ef.path, threads=threads)
