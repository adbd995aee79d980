"""How an analysed program was built, as its ``analysis.json`` stores it: the spec, the model geometry, tool
versions, timings, memory, package size and the torch equivalence check. A ``.mlpackage`` made by another
tool has none of it (``Analysis.build`` is None)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from analyzer.errors import AnalysisFileError
from analyzer.graph.jsonfields import Field
from analyzer.model.equivalence import EquivalenceReport, PairResult, ReferenceCheck
from analyzer.model.prefill import BUILD_PHASES, MULTIFUNCTION_PHASE, PHASES
from analyzer.model.sources import AttentionGeometry, ModelSource, WeightFile

SOURCE_KINDS = ("preset", "config", "folder")
# analyzer.build.builds.BUILD_MODES names and explains them (graph does not import build)
BUILD_MODES = ("analysis", "materialised")


@dataclass(frozen=True, slots=True)
class StoredSpec:
    """What a build was made from (``analyzer.build.builds.BuildSpec`` is the live form that converts)."""

    source: ModelSource
    variant: str
    kv_mode: str
    ctx: int
    compression: str | None  # canonical compression spec; None = fp16
    equivalence_steps: int
    extra: dict[str, Any] = field(default_factory=dict)  # fields a newer qfold wrote, kept as written
    phase: str = "decode"  # "decode" | "prefill" | "decode+prefill" (analyzer.model.prefill.BUILD_PHASES)
    q_len: int = 1  # query rows per prefill call; 1 for a decode build
    # "analysis" (value-free weights, no package) | "materialised" (weights with values, a package); documents
    # written before build modes existed were all materialised (analyzer.build.builds.BUILD_MODES)
    build_mode: str = "materialised"

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
            **self.extra,
        }

    @classmethod
    def from_json(cls, f: Field) -> StoredSpec:
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
        known = ("source", "variant", "kv_mode", "ctx", "compression", "equivalence_steps", "phase", "q_len",
                 "build_mode")
        build_mode = f["build_mode"].str() if f.get("build_mode") is not None else "materialised"  # schema ≤ 2
        if build_mode not in BUILD_MODES:
            f["build_mode"].fail(f"expected one of {', '.join(BUILD_MODES)}, got {build_mode!r}")
        phase = f["phase"].str() if f.get("phase") is not None else "decode"
        if phase not in BUILD_PHASES:
            f["phase"].fail(f"expected one of {', '.join(BUILD_PHASES)}, got {phase!r}")
        q_len = f["q_len"].count() if f.get("q_len") is not None else 1
        return cls(source, f["variant"].str(), f["kv_mode"].str(), f["ctx"].count(), f["compression"].opt_str(),
                   f["equivalence_steps"].count(), {k: v.value for k, v in f.dict().items() if k not in known},
                   phase, q_len, build_mode)

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


def geometry_json(g: AttentionGeometry) -> dict[str, Any]:
    return {"model_type": g.model_type, "num_layers": g.num_layers, "num_q_heads": g.num_q_heads,
            "num_kv_heads": g.num_kv_heads, "head_dim": g.head_dim, "hidden_size": g.hidden_size,
            "vocab_size": g.vocab_size, "group_size": g.group_size}


def geometry_from_json(f: Field) -> AttentionGeometry:
    g = AttentionGeometry(f["model_type"].str(), *(f[k].count() for k in (
        "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "hidden_size", "vocab_size")))
    if g.num_kv_heads == 0 or g.num_q_heads % g.num_kv_heads:
        f["num_kv_heads"].fail(f"{g.num_q_heads} query heads are not a multiple of {g.num_kv_heads} KV heads")
    return g


def equivalence_json(report: EquivalenceReport) -> dict[str, Any]:
    """The report as JSON; a decode check is written without ``phase``/``q_len`` (as before prefill existed)."""
    doc = asdict(report)
    if report.phase == "decode":
        del doc["phase"], doc["q_len"]
    return doc


def equivalence_from_json(f: Field) -> EquivalenceReport:
    pairs = tuple(PairResult(p["variant_a"].str(), p["variant_b"].str(), p["dtype"].str(), p["steps"].count(),
                             p["max_abs_diff"].number(), p["bit_identical"].bool(), p["greedy_agree_steps"].count())
                  for p in f["pairs"].list())
    r = f["reference"]
    reference = ReferenceCheck(r["variant"].str(), r["max_abs_diff"].number(), r["max_abs_logit"].number(),
                               r["greedy_agree_steps"].count(), r["steps"].count())
    phase = f["phase"].str() if f.get("phase") is not None else "decode"
    if phase not in PHASES:
        f["phase"].fail(f"expected one of {', '.join(PHASES)}, got {phase!r}")
    q_len = f["q_len"].count() if f.get("q_len") is not None else 1
    return EquivalenceReport(f["kv_mode"].str(), f["ctx"].count(), f["steps"].count(), f["tokens"].ints(), pairs,
                             reference, phase, q_len)


# What a build's equivalence checks compare (analyzer.build.equivalence makes them).
CHECK_KINDS: dict[str, str] = {
    "torch_variants": "torch vs torch",
    "interpreter_vs_torch": "MIL interpreter vs torch",
    "folded_vs_original": "folded vs original (MIL interpreter)",
}


@dataclass(frozen=True, slots=True)
class EquivalenceCheck:
    """One comparison a build's record makes: what against what, on which weights, and the outcome."""

    kind: str  # a CHECK_KINDS key
    compared: str  # what against what
    weights: str  # which weights the comparison ran on
    steps: int
    checked: bool
    max_abs_diff: float | None = None
    max_abs_value: float | None = None  # the largest |output| of the reference side, to judge max_abs_diff by
    bit_identical: bool | None = None
    greedy_agree_steps: int | None = None
    covers_package_weights: bool = True  # False: the weights compared are not the ones this package stores
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in CHECK_KINDS:
            raise ValueError(f"equivalence check kind {self.kind!r}: one of {', '.join(CHECK_KINDS)}")

    @property
    def label(self) -> str:
        return CHECK_KINDS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "label": self.label}

    @classmethod
    def from_json(cls, f: Field) -> EquivalenceCheck:
        kind = f["kind"].str()
        if kind not in CHECK_KINDS:
            f["kind"].fail(f"one of {', '.join(CHECK_KINDS)}, got {kind!r}")

        def opt_number(name: str) -> float | None:
            v = f.get(name)
            return None if v is None or v.value is None else v.number()

        def opt_bool(name: str) -> bool | None:
            v = f.get(name)
            return None if v is None or v.value is None else v.bool()

        agree = f.get("greedy_agree_steps")
        covers = f.get("covers_package_weights")
        note = f.get("note")
        return cls(kind, f["compared"].str(), f["weights"].str(), f["steps"].count(), f["checked"].bool(),
                   opt_number("max_abs_diff"), opt_number("max_abs_value"), opt_bool("bit_identical"),
                   None if agree is None else agree.opt_int(), True if covers is None else covers.bool(),
                   "" if note is None else note.str())


# The top-level keys of a build's analysis.json that BuildInfo reads, in the order they are written.
BUILD_KEYS = ("key", "created", "spec", "geometry", "versions", "timings", "peak_rss_bytes", "package_bytes",
              "equivalence", "untied_embeddings")


@dataclass(frozen=True, slots=True)
class BuildInfo:
    key: str
    created: str  # ISO 8601, UTC, to the second
    spec: StoredSpec
    geometry: AttentionGeometry
    versions: dict[str, str]  # package → version (qfold, torch, coremltools, transformers, numpy)
    timings_s: dict[str, float]  # stage → seconds (build_model_s, convert_s, ..., total_s)
    peak_rss_bytes: int  # of the conversion child process
    package_bytes: int | None  # every file of the saved .mlpackage; None: an analysis-mode build keeps none
    equivalence: EquivalenceReport | None  # the torch check of the variants; None when a build skipped it
    untied_embeddings: bool  # a tied embedding/lm_head was untied to take two compression schemes
    extra: dict[str, Any] = field(default_factory=dict)  # top-level keys a newer qfold wrote, kept as written
    # what was compared, on which weights (torch variants, this package in the interpreter, folded vs original);
    # stored inside the equivalence object as "checks"
    checks: tuple[EquivalenceCheck, ...] = ()

    @property
    def build_mode(self) -> str:
        """``analysis`` (value-free weights, no package) or ``materialised``: which mode made this build."""
        return self.spec.build_mode

    def check(self, kind: str) -> EquivalenceCheck | None:
        return next((c for c in self.checks if c.kind == kind), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "created": self.created,
            "spec": self.spec.to_json(),
            "geometry": geometry_json(self.geometry),
            "versions": dict(self.versions),
            "timings": dict(self.timings_s),
            "peak_rss_bytes": self.peak_rss_bytes,
            "package_bytes": self.package_bytes,
            "equivalence": None if self.equivalence is None else {
                **equivalence_json(self.equivalence), "checks": [c.to_json() for c in self.checks]},
            "untied_embeddings": self.untied_embeddings,
        }

    @classmethod
    def from_json(cls, f: Field, known: tuple[str, ...]) -> BuildInfo:
        """Read the build keys of a document; ``known`` are the keys the analysis itself owns (not extra)."""
        eq = f["equivalence"].optional()
        return cls(
            key=f["key"].str(),
            created=f["created"].str(),
            spec=StoredSpec.from_json(f["spec"]),
            geometry=geometry_from_json(f["geometry"]),
            versions={k: v.str() for k, v in f["versions"].dict().items()},
            timings_s={k: _seconds(v) for k, v in f["timings"].dict().items()},
            peak_rss_bytes=f["peak_rss_bytes"].count(),
            package_bytes=None if f["package_bytes"].optional() is None else f["package_bytes"].count(),
            equivalence=None if eq is None else equivalence_from_json(eq),
            untied_embeddings=f["untied_embeddings"].bool(),
            extra={k: v.value for k, v in f.dict().items() if k not in (*BUILD_KEYS, *known)},
            checks=() if eq is None or eq.get("checks") is None else
            tuple(EquivalenceCheck.from_json(c) for c in eq["checks"].list()),
        )


def _seconds(f: Field) -> float:
    f.number()  # finite, not a boolean
    return f.value  # as written (an int stays an int)
