"""Which backend converts a build, and what each backend can build: refusals with the reason, before anything
converts (``BuildSpec.__post_init__`` calls :func:`check_backend`), and Core AI's availability.

Core AI builds (``--backend coreai``) take the same model sources, variants, KV modes and phases' decode or prefill
step as Core ML builds; they do not take:

* ``--compression`` in analysis mode: Core AI builds compress with coreai-opt (``analyzer.convert.compress.
  coreai_apply``), which computes LUTs and scales from the weights' values; value-free weights hold one value per
  tensor, so the asset would not be the one a materialised build stores, op for op (a uniform LUT over one value
  divides by max − min = 0), and the build is refused with that reason (Core AI builds are materialised by default);
* a compression scheme coreai-opt cannot express (:func:`coreai_opt_refusal`: a palette width outside its
  ``n_bits``, a quantization it has no pass for), named with the part and layers it covers;
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
from analyzer.model.compress_spec import LAYER_PARTS, format_layers, parse_spec

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
COREAI_PACKAGES = ("coreai-core", "coreai-torch", "coreai-opt")
COREAI_OPT_INSTALL = ("pip install -r requirements.txt (coreai-opt==0.4.0, which pins coreai-core==1.0.0b3 and "
                      "coreai-torch==0.4.3; install it in the same pip run as torch==2.13.0 and numpy==2.3.5)")
# What coreai-opt 0.4.0 can store (coreai_opt/coreai_utils/passes/): palettize_weights takes n_bits in
# {1, 2, 3, 4, 6, 8} (weight_palettization._VALID_N_BITS) with PER_GROUPED_CHANNEL LUTs of any group size;
# quantize_weights stores int8 (and int2/int4/uint*/fp8/fp4, weight_quantization._VALID_WEIGHT_DTYPES) per channel or
# per block. qfold's schemes map to: palettize → palettize_weights, linear int8 → quantize_weights(INT8, SYMMETRIC,
# PER_CHANNEL).
COREAI_OPT_PALETTE_BITS = (1, 2, 3, 4, 6, 8)
COREAI_OPT_LINEAR_BITS = (8,)


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
    if spec.compression and analysis:
        raise QfoldError(f"--backend {COREAI} --mode analysis --compression: coreai-opt computes each LUT and scale "
                         "from the weights' values, and value-free weights hold one value per tensor, so the asset "
                         "would not be the materialised one op for op (a uniform LUT over one value divides by "
                         f"max - min = 0); build it materialised (the default for --backend {COREAI})")
    if spec.compression:
        why = coreai_opt_refusal(spec.compression, spec.source.config_dict.get("num_hidden_layers", 0))
        if why:
            raise QfoldError(f"--backend {COREAI} --compression {spec.compression}: {why}")
    if spec.phase == "decode+prefill":
        raise QfoldError(f"--backend {COREAI} --phase decode+prefill: a Core AI build holds one function; build "
                         "--phase decode and --phase prefill separately")


def coreai_opt_refusal(compression: str, num_layers: int) -> str:
    """Why coreai-opt cannot store a compression spec on a model of ``num_layers`` layers (the first scheme it
    cannot express, with the part and layers the spec gives it), or ``""``."""
    plan = parse_spec(compression, num_layers)
    cells = [(part, layer, scheme) for part in LAYER_PARTS for layer, scheme in enumerate(getattr(plan, part))]
    cells += [(part, None, plan.scheme(part)) for part in ("embed", "lm_head")]
    for part, _, scheme in cells:
        if scheme.method == "palettize" and scheme.bits not in COREAI_OPT_PALETTE_BITS:
            why = f"coreai-opt palettizes with n_bits in {', '.join(map(str, COREAI_OPT_PALETTE_BITS))} only"
        elif scheme.method == "linear" and scheme.bits not in COREAI_OPT_LINEAR_BITS:
            why = "qfold maps only int8 to coreai-opt's quantize_weights"
        else:
            continue
        layers = [layer for p, layer, s in cells if p == part and s == scheme and layer is not None]
        return f"{part}{f' of layers {format_layers(layers)}' if layers else ''} = {scheme.token}: {why}"
    return ""


def refused_variants(backend: str) -> dict[str, str]:
    """The attention variants ``backend`` cannot build, each with the reason (a form offers only the others)."""
    return dict(COREAI_ONLY_VARIANTS) if backend == COREML else {}


def coreai_available() -> bool:
    """Whether coreai-core and coreai-torch are importable here (found, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in ("coreai", "coreai_torch"))


def coreai_opt_available() -> bool:
    """Whether coreai-opt (Core AI's compression) is importable here (found, not imported)."""
    return importlib.util.find_spec("coreai_opt") is not None


def require_coreai(compression: bool = False) -> None:
    """Refuse a Core AI build or walk where Core AI is not installed, with the line that installs it; with
    ``compression``, also where coreai-opt is not (its wheel is pure Python, but it needs coreai-core and
    coreai-torch, whose wheels exist for Linux x86_64 and macOS arm64 only)."""
    if not coreai_available():
        raise QfoldError(f"--backend coreai: coreai-core / coreai-torch are not installed here; {COREAI_INSTALL}")
    if compression and not coreai_opt_available():
        raise QfoldError(f"--backend coreai --compression: coreai-opt (Core AI's compression) is not installed "
                         f"here; {COREAI_OPT_INSTALL}")


def coreai_versions(compression: bool = False) -> dict[str, str]:
    """The Core AI packages' versions (part of a Core AI build's key): coreai-core and coreai-torch, and with
    ``compression`` coreai-opt (an uncompressed build's key does not depend on it)."""
    out = {}
    for pkg in COREAI_PACKAGES if compression else COREAI_PACKAGES[:2]:
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "absent"
    return out
