"""How an analysed program was built, as its ``analysis.json`` stores it: the spec, the model geometry, tool
versions, timings, memory, package size and the torch equivalence check. A ``.mlpackage`` made by another
tool has none of it (``Analysis.build`` is None)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from analyzer.jsonfields import Field
from analyzer.model.equivalence_records import EquivalenceReport, PairResult, ReferenceCheck
from analyzer.model.sources import AttentionGeometry
from analyzer.model.spec import PHASES, BuildSpec


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


# What a build's equivalence checks compare (analyzer.convert.checks makes them).
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
    spec: BuildSpec
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
            spec=BuildSpec.from_json(f["spec"]),
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
