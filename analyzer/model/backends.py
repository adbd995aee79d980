"""Which backend converts a build, and what each backend can build: refusals with the reason, before anything
converts (``BuildSpec.__post_init__`` calls :func:`check_backend`), and Core AI's availability.

Core AI builds (``--backend coreai``) take the same model sources, variants, KV modes and phases' decode or prefill
step as Core ML builds; they do not take:

* ``--compression``: coremltools.optimize compresses Core ML programs only; Core AI's own compression is the
  coreai-opt package, which qfold does not pin;
* ``--phase decode+prefill``: one asset per phase (build decode and prefill separately);
* ``--weights fp32`` is Core AI only: a Core ML build always computes in fp16 (``compute_precision`` FLOAT16).

Both build modes work (``analyzer.convert.coreai_build``); a Core AI build defaults to ``materialised`` (the CLI),
since Core AI's runtime runs here and its asset is made to be run and timed.

The ``sdpa_gqa`` variant is Core AI only: coremltools 9.0 ignores ``enable_gqa``, so a Core ML conversion would fail
inside the converter (or attend with the wrong heads).
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from analyzer.errors import QfoldError

# Where a build's program runs (part of the key when not the default): Core ML (coremltools, an .mlpackage) or
# Core AI (coreai-torch from torch.export, an .aimodel asset). Analyses written before backends existed are Core ML.
COREML, COREAI = "coreml", "coreai"
BACKENDS: dict[str, str] = {
    COREML: "Core ML: torch.jit.trace → coremltools 9.0 → an iOS18 ML Program (.mlpackage), fp16 compute",
    COREAI: "Core AI: torch.export → coreai-torch 0.4.3 → an .aimodel asset (MLIR, coreai dialect), run by "
            "coreai-core's runtime (CPU on Linux)",
}
# The torch weights' dtype (part of the key when not the default). Core ML always computes in fp16.
WEIGHT_DTYPES = ("fp16", "fp32")
TORCH_DTYPES = {"fp16": "float16", "fp32": "float32"}  # torch's name of each (weights and KV cache)
DEFAULT_WEIGHTS = "fp16"
COREAI_INSTALL = ("pip install -r requirements.txt (coreai-core==1.0.0b3 and coreai-torch==0.4.3; wheels exist for "
                  "Linux x86_64 with CPython 3.11/3.12 and macOS arm64 only)")

COREAI_ONLY_VARIANTS = {"sdpa_gqa": "coremltools 9.0 ignores scaled_dot_product_attention's enable_gqa (its "
                                    "translation needs as many KV heads as query heads)"}
COREAI_PACKAGES = ("coreai-core", "coreai-torch")


def kv_dtype(backend: str, weights: str) -> str:
    """The KV cache's dtype: fp16, except a Core AI build with fp32 weights, whose cache is fp32 like the rest of
    its model. A Core ML state must be fp16 (coremltools' ``StateType``), so a Core ML build keeps an fp16 cache and
    its fp32 steps cast it on every read; Core AI states take fp32, and an fp16 cache there only adds two casts of
    the whole cache per layer and step (measured: ~15 ms of a 100 ms step at ctx 2048, bench/coreai.py)."""
    return "fp32" if backend != COREML and weights == "fp32" else "fp16"


def check_backend(spec: Any, analysis: bool) -> None:
    """Refuse what ``spec``'s backend cannot build, naming the options and the reason (``spec``: a BuildSpec whose
    backend and weights are known values; ``analysis``: it is an analysis-mode build)."""
    if spec.backend == COREML:
        if spec.variant in COREAI_ONLY_VARIANTS:
            raise QfoldError(f"--variant {spec.variant} --backend {COREML}: {COREAI_ONLY_VARIANTS[spec.variant]}; "
                             f"build it with --backend {COREAI}")
        if spec.weights != DEFAULT_WEIGHTS:
            raise QfoldError(f"--weights {spec.weights} --backend {COREML}: a Core ML build computes in fp16 "
                             f"(compute_precision FLOAT16) whatever the torch weights; --weights is a {COREAI} option")
        return
    if analysis and spec.weights != DEFAULT_WEIGHTS:
        raise QfoldError(f"--mode analysis --weights {spec.weights}: value-free weights are fp16 views "
                         "(analyzer.model.valuefree); build fp32 weights materialised (the default for "
                         f"--backend {COREAI})")
    if spec.compression:
        raise QfoldError(f"--backend {COREAI} --compression: coremltools.optimize compresses Core ML programs only "
                         "(Core AI's compression is coreai-opt, which qfold does not pin); build without compression")
    if spec.phase == "decode+prefill":
        raise QfoldError(f"--backend {COREAI} --phase decode+prefill: a Core AI build holds one function; build "
                         "--phase decode and --phase prefill separately")


def refused_variants(backend: str) -> dict[str, str]:
    """The attention variants ``backend`` cannot build, each with the reason (a form offers only the others)."""
    return dict(COREAI_ONLY_VARIANTS) if backend == COREML else {}


def coreai_available() -> bool:
    """Whether coreai-core and coreai-torch are importable here (found, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in ("coreai", "coreai_torch"))


def require_coreai() -> None:
    """Refuse a Core AI build or walk where Core AI is not installed, with the line that installs it."""
    if not coreai_available():
        raise QfoldError(f"--backend coreai: coreai-core / coreai-torch are not installed here; {COREAI_INSTALL}")


def coreai_versions() -> dict[str, str]:
    """The Core AI packages' versions (part of a Core AI build's key)."""
    out = {}
    for pkg in COREAI_PACKAGES:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out
