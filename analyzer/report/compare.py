"""Apples to apples: what, besides the variant, differs between the two analyses of an A/B.

An A/B is meant to change one thing, the attention variant. When A and B also differ in model, size, attention
geometry, ctx, KV mode, compression, build mode, backend (Core ML or Core AI) or weight dtype, every byte and op
difference mixes the variant's effect with the others', so the dashboard and the report say so above the headline,
naming each difference::

    compare(a, b).differences
    → (Difference("model", "exaone-4.0-1.2b (exaone4)", "qwen3-0.6b (qwen3)"), Difference("ctx", "4096", "256"))

A ``.mlpackage`` or ``.aimodel`` made by another tool records none of these facts but its backend (read off the
program); :attr:`Comparability.unknown` names the side, so the page can say it cannot check rather than stay silent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analyzer.analysis.buildinfo import BuildInfo
from analyzer.analysis.record import Analysis
from analyzer.model.compress_spec import preset_of
from analyzer.model.sources import STRUCTURE_OVERRIDES
from analyzer.model.spec import MATERIALISED_MODE, BuildSpec

DEFAULT_BUILD_MODE = MATERIALISED_MODE  # builds made before build modes existed converted real weight tensors


def size_mode(overrides: tuple[str, ...] | list[str]) -> str:
    """``full size``, ``structure``, ``2 layers, structure`` or ``overrides (k=v, …)`` from a source's overrides."""
    overrides = list(overrides)
    layers = next((o.split("=", 1)[1] for o in overrides if o.startswith("num_hidden_layers=")), None)
    structure = all(o in overrides for o in STRUCTURE_OVERRIDES)
    rest = [o for o in overrides if not o.startswith("num_hidden_layers=") and
            not (structure and o in STRUCTURE_OVERRIDES)]
    parts = [f"{layers} layer{'' if layers == '1' else 's'}"] if layers is not None else []
    if structure:
        parts.append("structure")
    if rest:
        parts.append(f"overrides ({', '.join(rest)})")
    return ", ".join(parts) if parts else "full size"


def is_structure(overrides: tuple[str, ...] | list[str]) -> bool:
    """A structure-size source: the attention geometry of the model with tiny hidden and vocabulary sizes."""
    return all(o in overrides for o in STRUCTURE_OVERRIDES)


def compression_name(spec: BuildSpec) -> str:
    """``fp16``, the preset a canonical compression spec is (``top8``), or the canonical spec itself."""
    if not spec.compression:
        return "fp16"

    layers = spec.source.config_dict.get("num_hidden_layers", 0)
    return preset_of(spec.compression, layers if isinstance(layers, int) else 0) or spec.compression


def build_mode(spec: BuildSpec) -> str:
    """How the build converted its weights (``BuildSpec.build_mode``; documents older than build modes read as
    materialised)."""
    return spec.build_mode or DEFAULT_BUILD_MODE


@dataclass(frozen=True, slots=True)
class BuildFacts:
    """What tells one build apart from another, besides its variant (texts as people say them)."""

    model: str  # ``exaone-4.0-1.2b (exaone4)``
    size: str  # ``full size``, ``2 layers, structure``
    geometry: str  # ``30 layers, 32/8 heads, head_dim 64``: what decides the tiles
    ctx: str
    kv_mode: str
    compression: str
    build_mode: str
    backend: str = "Core ML"  # "Core ML" | "Core AI"
    weights: str = "fp16"  # the torch weights' dtype


BACKEND_NAMES = {"coreml": "Core ML", "coreai": "Core AI"}


def build_facts(info: BuildInfo) -> BuildFacts:
    spec, g = info.spec, info.geometry
    return BuildFacts(
        model=f"{spec.source.label} ({g.model_type})",
        size=size_mode(spec.source.overrides),
        geometry=f"{g.num_layers} layers, {g.num_q_heads}/{g.num_kv_heads} heads, head_dim {g.head_dim}",
        ctx=str(spec.ctx),
        kv_mode=spec.kv_mode,
        compression=compression_name(spec),
        build_mode=build_mode(spec),
        backend=BACKEND_NAMES.get(spec.backend, spec.backend),
        weights=spec.weights,
    )


# The aspects an A/B must share, in the order they are named (one line each: add an aspect here).
ASPECTS: tuple[tuple[str, Callable[[BuildFacts], str]], ...] = (
    ("model", lambda f: f.model),
    ("size", lambda f: f.size),
    ("geometry", lambda f: f.geometry),
    ("ctx", lambda f: f.ctx),
    ("KV mode", lambda f: f.kv_mode),
    ("compression", lambda f: f.compression),
    ("build mode", lambda f: f.build_mode),
    ("backend", lambda f: f.backend),
    ("weights", lambda f: f.weights),
)


@dataclass(frozen=True, slots=True)
class Difference:
    aspect: str
    a: str
    b: str

    def describe(self) -> str:
        return f"{self.aspect} ({self.a} vs {self.b})"


@dataclass(frozen=True, slots=True)
class Comparability:
    """What differs between A and B besides the variant, and which side records no build facts at all."""

    differences: tuple[Difference, ...]
    unknown: tuple[str, ...]  # "A" and/or "B": a package made elsewhere, analysed from its graph alone

    @property
    def comparable(self) -> bool:
        return not self.differences and not self.unknown

    def sentence(self) -> str:
        """One line for above the headline, or "" when A and B differ only in their variant."""
        parts = []
        if self.differences:
            parts.append("A and B differ in " + ", ".join(d.describe() for d in self.differences) +
                         ", not only in the variant: every difference below mixes the variant's effect with these.")
        if self.unknown:
            who = " and ".join(self.unknown)
            parts.append(f"{who} {'is a package' if len(self.unknown) == 1 else 'are packages'} analysed from "
                         "the graph alone: model, ctx, KV mode and compression are not recorded, so qfold cannot "
                         "check that A and B are comparable.")
        return " ".join(parts)


def compare(a: Analysis, b: Analysis) -> Comparability:
    """The aspects (:data:`ASPECTS`) in which A's and B's builds differ."""
    unknown = tuple(side for side, x in (("A", a), ("B", b)) if x.build is None)
    if a.build is None or b.build is None:  # the backend is known from the program itself
        ba, bb = (BACKEND_NAMES[x.program.backend] for x in (a, b))
        return Comparability((Difference("backend", ba, bb),) if ba != bb else (), unknown)
    fa, fb = build_facts(a.build), build_facts(b.build)
    diffs = tuple(Difference(name, get(fa), get(fb)) for name, get in ASPECTS if get(fa) != get(fb))
    return Comparability(diffs, ())


def structure_caveat(a: Analysis, b: Analysis) -> str | None:
    """The caveat predicted tok/s carry when A or B is a structure build (tiny hidden/vocabulary sizes), else
    None."""
    sides = [side for side, x in (("A", a), ("B", b))
             if x.build is not None and is_structure(x.build.spec.source.overrides)]
    if not sides:
        return None
    who = " and ".join(sides)
    return (f"{who} {'is a structure build' if len(sides) == 1 else 'are structure builds'} (hidden 256, vocab "
            "1000): tile and KV bytes are the model's, weight bytes are not, so predicted tok/s and their ratio "
            "are not the full model's. Build at full size for those.")
