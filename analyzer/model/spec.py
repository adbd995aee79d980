"""What a build is made from: one record, ``BuildSpec``, that the converter runs and ``analysis.json`` stores.

It lives in the model layer so that the graph layer (which reads stored analyses) and the convert layer (which
converts) share it: values are validated once, here, whether they come from the CLI, the dashboard, a sweep or a
stored document. A build's key (its folder name in ``builds/``) is a content hash of :meth:`BuildSpec.fingerprint`.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from typing import Any

import analyzer
from analyzer.errors import AnalysisFileError, FoldError, QfoldError, SourceError
from analyzer.jsonfields import Field
from analyzer.model.backends import (
    BACKENDS,
    COREML,
    DEFAULT_WEIGHTS,
    WEIGHT_DTYPES,
    check_backend,
    coreai_versions,
    kv_dtype,
)
from analyzer.model.compress_spec import preset_of
from analyzer.model.sources import ModelSource, WeightFile
from analyzer.model.variants import KV_MODES, VARIANTS

# What one call of a converted step does. A build converts one of them, or both into one package
# (``decode+prefill``: two functions sharing their weights, named after their phases).
PHASES: tuple[str, ...] = ("decode", "prefill")
MULTIFUNCTION_PHASE = "decode+prefill"
BUILD_PHASES: tuple[str, ...] = (*PHASES, MULTIFUNCTION_PHASE)
DEFAULT_Q_LEN = 64  # prompt tokens per prefill call when none is given (the first example)


def phases_of(build_phase: str) -> tuple[str, ...]:
    """The phases (= function names) a build of ``build_phase`` converts: ``decode+prefill`` → both."""
    if build_phase not in BUILD_PHASES:
        raise SourceError(f"--phase {build_phase!r}: choose one of {', '.join(BUILD_PHASES)}")
    return PHASES if build_phase == MULTIFUNCTION_PHASE else (build_phase,)


ANALYSIS_MODE, MATERIALISED_MODE = "analysis", "materialised"
BUILD_MODES: dict[str, str] = {
    ANALYSIS_MODE: "value-free weights (shapes and dtypes, no values): op counts, tiles and bytes per token, "
                   "identical to a materialised build's, at a memory that does not grow with the parameter "
                   "count; no .mlpackage is kept",
    MATERIALISED_MODE: "weights with values (seeded random, or a folder's safetensors): a runnable .mlpackage "
                       "to export, at the cost of a full conversion",
}
# A build route, not an attention variant: repeat_kv converted, then folded by qfold's pass (analyzer.fold.cache).
FOLD_VARIANT = "repeat_kv+fold"
FOLD_BASE_VARIANT = "repeat_kv"  # the variant that route converts and folds
SOURCE_KINDS = ("preset", "config", "folder")
# How the numerical check is made (part of the key: changing it changes every analysis document).
EQUIVALENCE_MODEL = "reduced-2-layers-random"
DEFAULT_EQUIVALENCE_STEPS = 8
_KNOWN_FIELDS = ("source", "variant", "kv_mode", "ctx", "compression", "equivalence_steps", "phase", "q_len",
                 "build_mode", "backend", "weights")


def tool_versions() -> dict[str, str]:
    """The versions that make a conversion what it is (part of the key)."""
    return dict(_tool_versions())


@functools.cache
def _tool_versions() -> tuple[tuple[str, str], ...]:
    # read once per process: each importlib.metadata.version parses a METADATA file (~10 ms on a busy machine),
    # and a sweep keys every point (16,000 points took minutes)
    return (("qfold", analyzer.__version__),
            *((pkg, version(pkg)) for pkg in ("torch", "coremltools", "transformers", "numpy")))


def phase_label(phase: str, q_len: int) -> str:
    """``prefill64`` / ``decode+prefill64``: a build key's phase part (decode builds have none)."""
    return f"{phase}{q_len}"


class SpecValueError(QfoldError):
    """A value a build spec cannot take, with the field it came from (a stored document names the field; the CLI
    and the dashboard show ``str(e)``, which names the option)."""

    def __init__(self, field_name: str, value: Any, allowed: Any, message: str):
        super().__init__(message)
        self.field_name, self.value, self.allowed = field_name, value, allowed


def _choice(field_name: str, value: Any, allowed, option: str) -> None:
    if value not in allowed:
        allowed = tuple(allowed)
        raise SpecValueError(field_name, value, allowed, f"{option} {value!r}: choose one of {', '.join(allowed)}")


@dataclass(frozen=True, slots=True)
class BuildSpec:
    source: ModelSource
    variant: str  # an attention variant (analyzer.model.variants.VARIANTS) or the FOLD_VARIANT route
    kv_mode: str = "state"
    ctx: int = 4096
    compression: str | None = None  # canonical compression spec text (analyzer.model.compress_spec), None = fp16
    equivalence_steps: int = DEFAULT_EQUIVALENCE_STEPS
    phase: str = "decode"  # what a call does: decode | prefill | decode+prefill (one package, two functions)
    q_len: int = 1  # prompt tokens per prefill call; 1 for decode
    build_mode: str = MATERIALISED_MODE  # the API default keeps a package; CLI, dashboard and sweep default to analysis
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # fields a newer qfold wrote, kept as written
    backend: str = COREML  # "coreml" | "coreai" (analyzer.model.backends); documents before backends: Core ML
    weights: str = DEFAULT_WEIGHTS  # the torch weights' dtype, "fp16" | "fp32" (fp32: Core AI only)

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS and self.variant != FOLD_VARIANT:
            raise SpecValueError("variant", self.variant, (*VARIANTS, FOLD_VARIANT),
                                 f"unknown variant {self.variant!r}; choose one of {sorted(VARIANTS)}")
        _choice("build_mode", self.build_mode, BUILD_MODES, "build mode")
        _choice("kv_mode", self.kv_mode, KV_MODES, "--kv")
        if isinstance(self.ctx, bool) or not isinstance(self.ctx, int) or self.ctx < 1:
            raise QfoldError(f"--ctx {self.ctx!r}: must be a positive integer")
        if not 1 <= self.equivalence_steps <= self.ctx:
            raise QfoldError(f"equivalence steps {self.equivalence_steps}: must be between 1 and ctx={self.ctx}")
        _choice("phase", self.phase, BUILD_PHASES, "--phase")
        if isinstance(self.q_len, bool) or not isinstance(self.q_len, int):
            raise QfoldError(f"--q-len {self.q_len!r}: must be an integer")
        if self.phase == "decode" and self.q_len != 1:
            raise QfoldError(f"--q-len {self.q_len}: a decode build runs one token per call; "
                             "use --phase prefill or decode+prefill for q_len > 1")
        if self.phase != "decode" and not 2 <= self.q_len <= self.ctx:
            raise QfoldError(f"--q-len {self.q_len}: a prefill call takes 2 to ctx={self.ctx} prompt tokens")
        _choice("backend", self.backend, BACKENDS, "--backend")
        _choice("weights", self.weights, WEIGHT_DTYPES, "--weights")
        check_backend(self, analysis=self.build_mode == ANALYSIS_MODE)

    @property
    def kv_dtype(self) -> str:
        """The KV cache's dtype (``analyzer.model.backends.kv_dtype``: fp32 for a Core AI build of fp32 weights)."""
        return kv_dtype(self.backend, self.weights)

    # -------------------------------------------------------------------------------------------- the key
    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the converted model or its analysis (a decode build's is what it was before
        prefill existed, so its key is unchanged)."""
        out = {
            "source": self.source.fingerprint(),
            "variant": self.variant,
            "kv_mode": self.kv_mode,
            "ctx": self.ctx,
            "compression": self.compression,
            "equivalence_steps": self.equivalence_steps,
            "equivalence_model": EQUIVALENCE_MODEL,
            "build_mode": self.build_mode,
            "torch_dtype": "fp16",
            "target": "iOS18",
            "compute_precision": "fp16",
            "versions": tool_versions(),
        }
        if self.phase != "decode":
            out.update(phase=self.phase, q_len=self.q_len)
        if self.backend != COREML:  # a Core ML build's fingerprint (and key) is what it was before backends existed
            out.update(backend=self.backend, torch_dtype=self.weights, target="coreai-OS27",
                       compute_precision=self.weights,
                       versions={**out["versions"], **coreai_versions(bool(self.compression))})
            # linear weights stored [in, out] (analyzer.model.linear_layout); fp32 builds keep an fp32 cache
            out.update(linear_weights="transposed", kv_dtype=self.kv_dtype)
        elif self.weights != DEFAULT_WEIGHTS:
            out.update(torch_dtype=self.weights)
        return out

    @property
    def key(self) -> str:
        digest = hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:10]
        parts = [self.source.label, self.variant, self.kv_mode, f"ctx{self.ctx}"]
        if self.phase != "decode":
            parts.append(phase_label(self.phase, self.q_len))
        if self.compression:
            layers = self.source.config_dict.get("num_hidden_layers", 0)
            parts.append(preset_of(self.compression, layers) or "custom")  # the hash tells customs apart
        if self.build_mode == ANALYSIS_MODE:
            parts.append(ANALYSIS_MODE)
        parts += [p for p, default in ((self.backend, COREML), (self.weights, DEFAULT_WEIGHTS)) if p != default]
        return "-".join([*parts, digest])

    # -------------------------------------------------------------------------------------------- phases
    def for_phase(self, phase: str) -> BuildSpec:
        """The single-phase spec of one function of this build (``decode`` or ``prefill``)."""
        return replace(self, phase=phase, q_len=1 if phase == "decode" else self.q_len)

    def phase_of(self, function: str) -> str:
        """What one function of the build does per call: a ``decode+prefill`` package names its functions after
        their phases; a single-phase build's one function does the build's phase."""
        if self.phase != MULTIFUNCTION_PHASE:
            return self.phase
        if function not in PHASES:
            raise AnalysisFileError(f"a {MULTIFUNCTION_PHASE} build has functions {', '.join(PHASES)}, "
                                    f"not {function!r}")
        return function

    def q_len_of(self, function: str) -> int:
        """Query rows (tokens) per call of one function: ``q_len`` for the prefill function, 1 for decode."""
        return self.q_len if self.phase_of(function) == "prefill" else 1

    def materialised(self) -> BuildSpec:
        """What exporting a runnable ``.mlpackage`` from an analysis builds: the same spec with weight values (its
        cost: ``analyzer.model.cost.estimate(..., "materialised")``)."""
        return replace(self, build_mode=MATERIALISED_MODE)

    # -------------------------------------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        s = self.source
        return {
            "source": {"kind": s.kind, "ref": s.ref, "label": s.label, "overrides": list(s.overrides),
                       "fingerprint": s.fingerprint()},
            "variant": self.variant,
            "kv_mode": self.kv_mode,
            "ctx": self.ctx,
            "compression": self.compression,
            "equivalence_steps": self.equivalence_steps,
            **({} if self.phase == "decode" else {"phase": self.phase, "q_len": self.q_len}),
            "build_mode": self.build_mode,
            "backend": self.backend,
            "weights": self.weights,
            **self.extra,
        }

    @classmethod
    def from_json(cls, f: Field | Any, where: str = "build request") -> BuildSpec:
        """A stored spec (an analysis document's ``build.spec``, a build request): a bad value is an error naming
        its field. Documents written before build modes existed were all materialised."""
        f = f if isinstance(f, Field) else Field(f, where)
        src = f["source"]
        kind = src["kind"].str()
        if kind not in SOURCE_KINDS:
            src["kind"].fail(f"expected one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
        fp = src["fingerprint"]
        config = fp["config"]
        config.dict()
        weights = tuple(WeightFile(w[0].str(), w[1].count(), w[2].str())
                        for w in (x.list(3) for x in fp["weights"].list()))
        seed = fp["seed"].opt_int()
        source = ModelSource(kind=kind, ref=src["ref"].str(), label=src["label"].str(),  # type: ignore[arg-type]
                             config_json=json.dumps(config.value, sort_keys=True), overrides=src["overrides"].strs(),
                             weights=weights, seed=seed if seed is not None else 0)
        build_mode = f["build_mode"].str() if f.get("build_mode") is not None else MATERIALISED_MODE  # schema ≤ 2
        phase = f["phase"].str() if f.get("phase") is not None else "decode"
        q_len = f["q_len"].count() if f.get("q_len") is not None else 1
        backend = f["backend"].str() if f.get("backend") is not None else COREML  # before backends existed
        weights = f["weights"].str() if f.get("weights") is not None else DEFAULT_WEIGHTS
        extra = {k: v.value for k, v in f.dict().items() if k not in _KNOWN_FIELDS}
        try:  # validated by the record itself, once; a bad value is reported at its field
            return cls(source, f["variant"].str(), f["kv_mode"].str(), f["ctx"].count(), f["compression"].opt_str(),
                       f["equivalence_steps"].count(), phase, q_len, build_mode, extra, backend, weights)
        except SpecValueError as e:
            if f.get(e.field_name) is None:
                f.fail(str(e))
            f[e.field_name].fail(f"expected one of {', '.join(e.allowed)}, got {e.value!r}")
        except QfoldError as e:
            f.fail(str(e))


def check_fold_route(spec: BuildSpec) -> None:
    """Refuse a ``repeat_kv+fold`` build (``spec``: its repeat_kv spec) that the route cannot make, before anything
    is converted: the fold is proven in the MIL interpreter on weight values, and on the decode step."""
    if spec.build_mode != MATERIALISED_MODE:
        raise FoldError(f"a {FOLD_VARIANT} build folds a saved package and proves it in the MIL interpreter, which "
                        f"needs weight values: its {FOLD_BASE_VARIANT} build must be materialised, not "
                        f"{spec.build_mode}")
    if spec.phase != "decode":
        raise FoldError(f"--phase {spec.phase}: a {FOLD_VARIANT} build folds the decode step only; build the "
                        f"prefill package with --variant {FOLD_BASE_VARIANT} and fold it with "
                        "`qfold fold` (the pass handles q_len > 1; the interpreter's proof runs decode)")
