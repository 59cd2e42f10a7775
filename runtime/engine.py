"""Which loop deploys an export folder: mhaexport's decode loop (:class:`~mhaexport.runtime.Generator`, the loop
verify proved and bench timed) or onnxruntime-genai's own C++ loop over the same file
(:class:`~mhaexport.runtime.genai.GenAIGenerator`). ``mhaexport.runtime.load``, ``mhaexport generate`` and
``mhaexport.generate`` choose through :func:`open_generator`::

    engine="auto"               onnxruntime-genai's loop where onnxruntime_genai imports, the folder ships a
                                genai_config.json that passes the genai-config check, and nothing asked is
                                mhaexport's only (a provider other than CPU, session options); else mhaexport's
    engine="mhaexport"          mhaexport's loop, always
    engine="onnxruntime-genai"  onnxruntime-genai's loop, or an error saying why it cannot run here

The choice is visible: the generator's ``engine`` and ``engine_reason`` (why it was chosen), each result's
``engine``. Both run the folder's snapshot (the bytes whose hashes were checked), never the folder the user named.
Torch- and onnx-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mhaexport.artifact import ExportFolder, read_json
from mhaexport.core.errors import ArtifactError, RuntimeFailure, RuntimeOptionError
from mhaexport.runtime.choose import open_folder
from mhaexport.runtime.genai import ENGINE as ONNXRUNTIME_GENAI
from mhaexport.runtime.genai import GENAI_CONFIG, GenAIGenerator, GenAIUnavailable, config_providers, import_og
from mhaexport.runtime.generator import Generator

AUTO, MHAEXPORT = "auto", "mhaexport"
ENGINES = (AUTO, MHAEXPORT, ONNXRUNTIME_GENAI)


def genai_refusal(ef: ExportFolder, providers: Sequence[str], session: dict) -> str | None:
    """Why onnxruntime-genai's loop does not deploy ``ef`` here with these options, or None: ``providers`` other
    than the CPU (the loop runs the providers its config names), ``session`` options (mhaexport's session's),
    onnxruntime_genai not importable, no genai_config.json, or one the genai-config check does not accept."""
    asked = [p for p in providers if p.lower() not in ("cpu", "cpuexecutionprovider")]
    if asked:
        return (f"provider {asked[0]} asked: onnxruntime-genai's loop runs the providers its genai_config.json "
                "names (CPU for mhaexport's exports)")
    if session:
        return f"{', '.join(sorted(session))}: options of mhaexport's ONNX Runtime session"
    try:
        import_og()
    except GenAIUnavailable as e:
        return str(e).split(";")[0]
    if GENAI_CONFIG not in ef.entry("onnx").files:
        return f"{ef.path} ships no {GENAI_CONFIG}"
    from mhaexport.runtime.genai_config import deploy_findings

    errors = [f for f in deploy_findings(ef) or [] if f.severity == "error"]
    if errors:
        return f"its {GENAI_CONFIG} fails the genai-config check: {errors[0].line()}"
    named = config_providers(read_json(ef.file("onnx", GENAI_CONFIG), "onnxruntime-genai config"))
    if named:
        return (f"its {GENAI_CONFIG} runs the decoder on {', '.join(named)}: the providers asked "
                f"({', '.join(providers)}) run on mhaexport's loop")
    return None


def weights_too_large(ef: ExportFolder) -> str | None:
    """One line when the ONNX file's weights, loaded whole beside the process's baseline
    (:data:`mhaexport.core.machine.BASELINE_BYTES`), would not fit the memory this process may use (the cgroup's
    limit or MemAvailable, the smaller) and ONNX Runtime can memory-map them (external data); else None. A generator
    then maps them: the kernel reads the pages a step needs and may drop them again, where a whole load would be
    killed by the kernel's out-of-memory killer midway."""
    from mhaexport.artifact.details import onnx_weights
    from mhaexport.core.machine import BASELINE_BYTES, machine_memory

    weights, mappable = onnx_weights(ef)
    have, where = machine_memory()
    if not mappable or have is None or weights + BASELINE_BYTES <= have:
        return None
    return f"its weights ({weights / 1e9:.1f} GB) do not fit in {have / 1e9:.1f} GB ({where})"


def open_generator(folder: str | Path | ExportFolder, providers: Sequence[str] | str = ("cpu",), *,
                   threads: int | None = None, engine: str = AUTO, trust_code: bool = False,
                   **session: Any) -> Generator | GenAIGenerator:
    """The generator of an export folder on the loop ``engine`` names (see the module's table): a
    :class:`Generator` or a :class:`GenAIGenerator`, each with ``engine``, ``engine_reason`` and ``generate(prompts,
    config, on_token=...)``. With ``engine="auto"`` a call onnxruntime-genai's loop would not generate as
    mhaexport's does (:meth:`GenAIGenerator.why_not`) runs on mhaexport's loop, the result says so.
    RuntimeOptionError for an unknown engine or options onnxruntime-genai cannot take; GenAIUnavailable when it is
    asked for and cannot be imported; ArtifactError when the folder's config cannot be deployed, UntrustedCode when
    onnxruntime-genai would load code or write files as its config asks and ``trust_code`` (``--trust-code``) is
    not given (:func:`mhaexport.runtime.genai.check_options`; ``engine="auto"`` refuses too, never hides it)."""
    if engine not in ENGINES:
        raise RuntimeOptionError(f"engine={engine!r}: one of {', '.join(ENGINES)}")
    providers = (providers,) if isinstance(providers, str) else tuple(providers)
    ef = open_folder(folder)
    too_large = weights_too_large(ef)

    def ours(reason: str) -> Generator:
        gen = Generator(ef, providers, threads=threads, mmap_weights=too_large is not None, **session)
        gen.engine_reason = reason
        if too_large is not None:
            gen.warnings.append(f"{too_large}: memory-mapped, each step reads from disk the pages the page cache "
                                "does not hold (slow where they do not all stay there)")
        return gen

    if engine == MHAEXPORT:
        return ours("asked (engine='mhaexport')")
    if GENAI_CONFIG in ef.entry("onnx").files:  # options that load code or write files: refused, never hidden
        from mhaexport.runtime.genai import check_options

        check_options(ef.root, ef.path, trust_code=trust_code)
    if too_large is not None:  # onnxruntime-genai's loop loads the weights whole: killed midway, not refused
        if engine == ONNXRUNTIME_GENAI:
            raise RuntimeOptionError(f"engine='onnxruntime-genai': {too_large}, and onnxruntime-genai loads them "
                                     "whole; engine='mhaexport' maps them",
                                     cli=f"--engine onnxruntime-genai: {too_large}, and onnxruntime-genai loads "
                                         "them whole; --engine mhaexport maps them")
        return ours(f"auto: {too_large}; onnxruntime-genai's loop loads them whole")
    why = genai_refusal(ef, providers, session)
    if engine == ONNXRUNTIME_GENAI:
        if why is None:
            return GenAIGenerator(ef, threads=threads, reason="asked (engine='onnxruntime-genai')",
                                  trust_code=trust_code)
        import_og()  # not importable: GenAIUnavailable, with its install line
        if GENAI_CONFIG not in ef.entry("onnx").files or "genai-config" in why:
            raise ArtifactError(f"engine='onnxruntime-genai': {why}")
        raise RuntimeOptionError(f"engine='onnxruntime-genai': {why}")
    if why is not None:
        return ours(f"auto: {why}")
    og = import_og()
    try:
        return GenAIGenerator(ef, threads=threads, trust_code=trust_code,
                              fallback=lambda: ours("auto: a call onnxruntime-genai's loop would generate otherwise"),
                              reason=f"auto: onnxruntime-genai {getattr(og, '__version__', '')} is installed and the "
                                     f"folder's {GENAI_CONFIG} passes the genai-config check")
    except RuntimeFailure as e:  # it cannot load the file: ours says why in its own words, or runs it
        return ours(f"auto: {e}")
