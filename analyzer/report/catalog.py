"""The analyses the dashboard can open: the shipped default ones, cached builds, and analysed packages.

First open must not wait for a 2.5-minute, 15 GB conversion, so the default preset's full-size analyses ship with
the code as JSON (the same document as a build's ``analysis.json``: op records, counts, tiles, bytes; no weights, no
``.mlpackage``) in ``analyzer/shipped/``, named ``<preset>-<variant>-<kv mode>-ctx<N>[-<compression
preset>].analysis.json``. Everything else a user can pick is a cached build (``analyzer.convert.launch.list_builds``)
or a ``.mlpackage`` or Core AI ``.aimodel`` made by another tool, walked on request.

An :class:`AnalysisRef` names one of them with a stable id (``shipped:<file stem>``, ``build:<key>``,
``package:<path>``, ``package:<path>#<function>`` for one function of a multi-function package) that the UI keeps in
session state and maps device-log labels to.

``make shipped`` (``bench/full_size.py --ship``) regenerates the shipped files under the names
:func:`shipped_name` gives them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from analyzer.analysis.record import Analysis, read_analysis_file
from analyzer.analysis.shapes import package_shapes, shapes_label
from analyzer.convert.compress import PRESETS
from analyzer.convert.launch import PACKAGE_NAME, build_folder, builds_dir, list_builds
from analyzer.errors import QfoldError
from analyzer.ir.coreai.asset import looks_like_asset
from analyzer.measure.logs import BuildDeviceSummary
from analyzer.model.sources import DEFAULT_PRESET, list_presets
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE, MULTIFUNCTION_PHASE, PHASES, BuildSpec, phases_of
from analyzer.model.variants import KV_MODES, VARIANTS
from analyzer.report.compare import compression_name, size_mode

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "shipped"
SHIPPED_SUFFIX = ".analysis.json"
DEFAULT_KV_MODE = "state"
DEFAULT_CTX = 4096
BASELINE_VARIANT = "repeat_kv"
CANDIDATE_VARIANT = "qfold"

AnalysisKind = Literal["shipped", "build", "package"]


@dataclass(frozen=True, slots=True)
class ShippedAnalysis:
    """One shipped analysis file and what its name says it is."""

    preset: str
    variant: str
    kv_mode: str
    ctx: int
    path: Path
    compression: str | None = None  # a compression preset name (analyzer.convert.compress.PRESETS), None = fp16
    phase: str = "decode"  # "prefill": a prefill build of q_len prompt tokens per call
    q_len: int = 1


@dataclass(frozen=True, slots=True)
class RefFacts:
    """What tells two pickable analyses apart, as people name them (pickers and log-label matching use these)."""

    model: str  # the source label: a preset name, a config's or folder's name
    variant: str
    ctx: int
    kv_mode: str
    compression: str  # "fp16", a preset name ("top8") or a canonical spec
    size: str  # "full size", "structure", "2 layers, structure", ...
    model_type: str | None = None
    phase: str = "decode"  # "prefill", "decode+prefill", or one function of it: "decode+prefill: prefill"
    q_len: int = 1  # prompt tokens per prefill call
    build_mode: str = MATERIALISED_MODE  # ANALYSIS_MODE: value-free weights, no package (analyzer.model.spec)
    backend: str = "coreml"  # "coreai": a Core AI build (an .aimodel asset)
    weights: str = "fp16"  # the torch weights' dtype

    def label(self) -> str:
        """``exaone-4.0-1.2b · qfold · ctx 4096 · top8 · full size · KV state``: what distinguishes, first (a
        prefill one says ``prefill 64`` after the ctx; an analysis-mode build ends with ``analysis mode``)."""
        phase = () if self.phase == "decode" else (self.phase.replace(":", f" {self.q_len}:", 1) if ":" in self.phase
                                                   else f"{self.phase} {self.q_len}",)
        mode = ("analysis mode",) if self.build_mode == ANALYSIS_MODE else ()
        backend = ("Core AI",) if self.backend == "coreai" else ()  # a Core ML label is as it always was
        weights = (f"{self.weights} weights",) if self.weights != "fp16" else ()
        return " · ".join((self.model, self.variant, f"ctx {self.ctx}", *phase, self.compression, self.size,
                           f"KV {self.kv_mode}", *mode, *backend, *weights))


@dataclass(frozen=True, slots=True)
class AnalysisRef:
    """Something the dashboard can open as an analysis document.

    ``path`` is the ``analysis.json`` (shipped), the build folder (build) or the ``.mlpackage`` (package);
    ``package_path`` is the build's ``.mlpackage`` when one exists on this server; ``facts`` are None for a
    package made elsewhere (it records no spec).
    """

    id: str
    kind: AnalysisKind
    label: str
    path: Path
    variant: str | None
    package_path: Path | None = None
    created: str = ""
    spec: tuple[tuple[str, Any], ...] = ()  # a few comparable spec fields (source label, kv, ctx, compression, phase)
    function: str | None = None  # one function of a multi-function package; None: the only (or default) one
    facts: RefFacts | None = None
    phase: str = "decode"  # what one call of the function does: "decode" | "prefill"
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a flexible package's given shapes (input name, shape)


def variant_names() -> tuple[str, ...]:
    return tuple(sorted(VARIANTS, key=len, reverse=True))  # longest first: no name is a prefix of another's match


def _name_pattern() -> re.Pattern[str]:
    variants = "|".join(re.escape(v) for v in variant_names())
    kv = "|".join(re.escape(k) for k in KV_MODES)
    return re.compile(rf"^(?P<preset>.+)-(?P<variant>{variants})-(?P<kv>{kv})-ctx(?P<ctx>\d+)"
                      rf"(?:-prefill(?P<q_len>\d+))?(?:-(?P<compression>{_compression_names()}))?$")


def _compression_names() -> str:
    return "|".join(re.escape(n) for n in PRESETS)


def shipped_name(preset: str, variant: str, kv_mode: str, ctx: int, compression: str | None = None,
                 q_len: int | None = None) -> str:
    """``exaone-4.0-1.2b-qfold-state-ctx4096-top8.analysis.json`` (a decode build) or
    ``exaone-4.0-1.2b-qfold-state-ctx4096-prefill64.analysis.json`` (a prefill build of 64 prompt tokens per
    call): what a shipped file is, in its name."""
    return (f"{preset}-{variant}-{kv_mode}-ctx{ctx}" + (f"-prefill{q_len}" if q_len else "")
            + (f"-{compression}" if compression else "") + SHIPPED_SUFFIX)


def shipped_files(folder: Path = SHIPPED_DIR) -> list[ShippedAnalysis]:
    """Every shipped analysis whose file name follows the convention (others are ignored)."""
    pattern = _name_pattern()
    out = []
    for path in sorted(folder.glob(f"*{SHIPPED_SUFFIX}")) if folder.is_dir() else []:
        m = pattern.match(path.name.removesuffix(SHIPPED_SUFFIX))
        if m:
            q_len = int(m["q_len"]) if m["q_len"] else None
            out.append(ShippedAnalysis(m["preset"], m["variant"], m["kv"], int(m["ctx"]), path, m["compression"],
                                       "prefill" if q_len else "decode", q_len or 1))
    return out


def shipped_analyses(folder: Path = SHIPPED_DIR) -> dict[str, Path]:
    """The default preset's shipped analyses (KV as state, ctx 4096), by variant: the A/B page's default."""
    return {
        s.variant: s.path for s in shipped_files(folder)
        if s.preset == DEFAULT_PRESET and s.kv_mode == DEFAULT_KV_MODE and s.ctx == DEFAULT_CTX
        and s.compression is None and s.phase == "decode"
    }


def load_shipped(variant: str, folder: Path = SHIPPED_DIR) -> Analysis:
    """The shipped default analysis of ``variant``."""
    paths = shipped_analyses(folder)
    if variant not in paths:
        have = ", ".join(sorted(paths)) or "none"
        raise QfoldError(f"no shipped analysis for variant {variant!r} in {folder} (shipped: {have})")
    return read_analysis_file(paths[variant])


# ------------------------------------------------------------------------------------------------- catalog
def spec_facts(spec: BuildSpec, function: str | None = None) -> RefFacts:
    """The facts of a build spec; for one ``function`` of a decode+prefill build, the phase that function does."""
    phase = spec.phase_of(function) if function else spec.phase
    return RefFacts(model=spec.source.label, variant=spec.variant, ctx=spec.ctx, kv_mode=spec.kv_mode,
                    compression=compression_name(spec), size=size_mode(spec.source.overrides),
                    model_type=spec.source.config_dict.get("model_type"),
                    phase=phase if phase == spec.phase else f"{spec.phase}: {phase}", q_len=spec.q_len,
                    build_mode=spec.build_mode, backend=spec.backend, weights=spec.weights)


def describe_spec(spec: BuildSpec, function: str | None = None) -> str:
    """``exaone-4.0-1.2b · repeat_kv · ctx 4096 · fp16 · 2 layers, structure · KV state`` from a build spec (with
    ``prefill 64`` or ``decode+prefill 64: decode`` after the ctx when the build is not a decode build)."""
    return spec_facts(spec, function).label()


def _spec_fields(spec: BuildSpec, function: str) -> tuple[tuple[str, Any], ...]:
    """What two analyses must share to be an A/B of one model: everything but the variant (the phase is that of
    the function: a decode+prefill build's decode function pairs with a decode build)."""
    return (
        ("source", spec.source.label),
        ("overrides", tuple(spec.source.overrides)),
        ("config", spec.source.config_json),
        ("kv_mode", spec.kv_mode),
        ("ctx", spec.ctx),
        ("compression", spec.compression),
        ("phase", spec.phase_of(function)),
        ("q_len", spec.q_len_of(function)),
        ("backend", spec.backend),  # a Core ML build's twin is never a Core AI build (apples to apples)
        ("weights", spec.weights),
    )


def _preset_model_type(preset: str) -> str | None:
    return next((p.model_type for p in list_presets() if p.name == preset), None)


def shipped_refs(folder: Path = SHIPPED_DIR) -> list[AnalysisRef]:
    out = []
    for s in shipped_files(folder):
        facts = RefFacts(model=s.preset, variant=s.variant, ctx=s.ctx, kv_mode=s.kv_mode,
                         compression=s.compression or "fp16", size="full size",
                         model_type=_preset_model_type(s.preset), phase=s.phase, q_len=s.q_len)
        out.append(AnalysisRef(
            id=f"shipped:{s.path.name.removesuffix(SHIPPED_SUFFIX)}", kind="shipped", path=s.path, variant=s.variant,
            label=f"{facts.label()} · shipped", facts=facts, phase=s.phase,
            spec=(("source", s.preset), ("overrides", ()), ("kv_mode", s.kv_mode), ("ctx", s.ctx),
                  ("compression", s.compression), ("phase", s.phase), ("q_len", s.q_len))))
    return out


def build_refs(root: str | Path | None = None) -> list[AnalysisRef]:
    """One ref per cached build, or per function of a multi-function (``decode+prefill``) build: a package with
    several functions never shows as one."""
    out = []
    for a in list_builds(root):
        if a.build is None:
            continue
        try:
            out.extend(build_refs_of(a))
        except (ValueError, TypeError, KeyError, AttributeError):  # a spec no release writes: left out, as unreadable
            continue
    return out


def build_refs_of(a: Analysis) -> list[AnalysisRef]:
    """The refs of one build analysis (one per function of a multi-function build)."""
    out = []
    path = build_folder(a)
    package = path / PACKAGE_NAME
    spec = a.build.spec
    functions = phases_of(spec.phase) if spec.phase == MULTIFUNCTION_PHASE else (a.function,)
    for fn in functions:
        several = len(functions) > 1
        facts = spec_facts(spec, fn)
        out.append(AnalysisRef(
            id=f"build:{a.build.key}" + (f"#{fn}" if several else ""),
            kind="build",
            label=f"{facts.label()} · build {a.build.key.rsplit('-', 1)[-1]}",
            path=path,
            variant=spec.variant,
            package_path=package if package.is_dir() else None,
            created=a.build.created,
            spec=_spec_fields(spec, fn),
            facts=facts,
            function=fn if several else None,
            phase=spec.phase_of(fn),
        ))
    return out


def phase_sibling(ref: AnalysisRef, phase: str, refs: Sequence[AnalysisRef]) -> AnalysisRef | None:
    """The analysis of the same model and variant that does ``phase`` instead: the other function of a
    multi-function build, else the newest build of the same spec in that phase (any q_len); ``ref`` itself when
    it is that phase already."""
    if ref.phase == phase:
        return ref
    if ref.function is not None:
        same_build = next((r for r in refs if r.path == ref.path and r.phase == phase), None)
        if same_build is not None:
            return same_build
    want = {k: v for k, v in ref.spec if k not in ("phase", "q_len")}
    for r in refs:  # builds are listed newest first
        if r.kind == ref.kind and r.variant == ref.variant and r.phase == phase and \
                {k: v for k, v in r.spec if k not in ("phase", "q_len")} == want:
            return r
    return None


def package_refs(path: str | Path, shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[AnalysisRef]:
    """A ``.mlpackage`` someone else built, analysed from its protobuf (no spec, no equivalence): one ref, or
    one per function of a multi-function package. A flexible package is analysed at ``shapes`` (input name →
    shape, else the stated defaults: :mod:`analyzer.analysis.shapes`), which its label carries; a shape outside its
    input's range, a name no input has or a flexible dimension with no default is a ShapeError. A Core AI
    ``.aimodel`` is one ref (its ``main``; its shapes are static)."""
    p = Path(path).expanduser().resolve()
    if looks_like_asset(p):
        return [AnalysisRef(id=f"package:{p}", kind="package", label=f"{p.name} · Core AI asset · {p.parent}", path=p,
                            variant=None)]
    assumed, given = package_shapes(p, shapes), tuple(sorted((shapes or {}).items()))
    one = len(assumed) == 1
    return [AnalysisRef(id=f"package:{p}" + ("" if one else f"#{fn}"), kind="package", path=p, variant=None,
                        label=f"{p.name}{'' if one else f' · function {fn}'} · package · {p.parent}{shapes_label(a)}",
                        package_path=p, function=None if one else fn, shapes=given,
                        phase="decode" if one or fn not in PHASES else fn) for fn, a in assumed.items()]


def catalog(root: str | Path | None = None, packages: tuple[str, ...] = (), folder: Path = SHIPPED_DIR,
            shapes: Mapping[str, Mapping[str, tuple[int, ...]]] | None = None) -> list[AnalysisRef]:
    """Shipped analyses first, then cached builds (newest first), then analysed packages (each at its ``shapes``)."""
    return [*shipped_refs(folder), *build_refs(root),
            *(r for p in packages for r in _package_refs_or_none(p, (shapes or {}).get(p)))]


def _package_refs_or_none(path: str, shapes: Mapping[str, tuple[int, ...]] | None) -> list[AnalysisRef]:
    """A session's package that is gone or broken since it was analysed is left out, not fatal to every page."""
    try:
        return package_refs(path, shapes)
    except QfoldError:
        return []


@dataclass(frozen=True, slots=True)
class MeasuredPair:
    """An A/B the device logs measured: two analyses whose log labels were run on one device."""

    a: AnalysisRef
    b: AnalysisRef
    device: str
    build_a: str  # the logs' build labels
    build_b: str
    tok_per_s_a: float  # mean of the runs
    tok_per_s_b: float
    runs_a: int
    runs_b: int

    @property
    def speedup(self) -> float:
        return self.tok_per_s_b / self.tok_per_s_a


def measured_for(a: AnalysisRef, b: AnalysisRef, mapping: dict[str, str | None],
                 summaries: Sequence[BuildDeviceSummary]) -> MeasuredPair | None:
    """The measurements of A and B on the first device (in log order) that ran both, or None."""
    per_device: dict[str, dict[str, BuildDeviceSummary]] = {}
    for s in summaries:
        ref_id = mapping.get(s.build)
        if ref_id in (a.id, b.id):
            per_device.setdefault(s.device, {}).setdefault(ref_id, s)  # type: ignore[arg-type]
    for device, runs in per_device.items():
        if a.id in runs and b.id in runs and a.id != b.id:
            sa, sb = runs[a.id], runs[b.id]
            return MeasuredPair(a, b, device, sa.build, sb.build, sa.mean_tok_per_s, sb.mean_tok_per_s, sa.n, sb.n)
    return None


def measured_pairs(refs: Sequence[AnalysisRef], mapping: dict[str, str | None],
                   summaries: Sequence[BuildDeviceSummary]) -> list[MeasuredPair]:
    """Every baseline/candidate A/B the logs measured: a repeat_kv and a qfold analysis of one spec (source,
    KV mode, ctx, compression) whose labels were run on one device. The write-up's log gives the top8 pair
    (``exaone-repeat_kv-top8`` 20.39 → ``exaone-qfold-top8`` 54.30 tok/s on its A/B iPhone)."""
    by_id = {r.id: r for r in refs}
    mapped = [by_id[i] for i in dict.fromkeys(mapping.values()) if i in by_id]
    out = []
    for a in (r for r in mapped if r.variant == BASELINE_VARIANT):
        for b in (r for r in mapped if r.variant == CANDIDATE_VARIANT and r.spec == a.spec):
            pair = measured_for(a, b, mapping, summaries)
            if pair is not None:
                out.append(pair)
    return out


def matching_pair(ref: AnalysisRef, refs: Sequence[AnalysisRef]) -> tuple[AnalysisRef, AnalysisRef] | None:
    """``ref`` and its counterpart (the other variant of the same spec: source, overrides, KV mode, ctx,
    compression, backend, weights; of the same build mode where one exists) as (baseline, candidate), or None
    when ``ref`` is neither variant or has no counterpart."""
    others = {BASELINE_VARIANT: CANDIDATE_VARIANT, CANDIDATE_VARIANT: BASELINE_VARIANT}
    if ref.variant not in others or not ref.spec:
        return None
    twins = [r for r in refs if r.variant == others[ref.variant] and r.kind == ref.kind and r.spec == ref.spec]
    if not twins:
        return None
    # a decode build and a decode+prefill build's decode function share the A/B's fields, as analysis and
    # materialised builds of one spec do: the first twin of the same kind of build wins, then of the same mode
    f = ref.facts
    twin = max(twins, key=lambda r: (bool(r.facts and f and r.facts.phase == f.phase),
                                     bool(r.facts and f and r.facts.build_mode == f.build_mode)))
    return (ref, twin) if ref.variant == BASELINE_VARIANT else (twin, ref)


def default_pair(refs: list[AnalysisRef],
                 measured: Sequence[MeasuredPair] = ()) -> tuple[AnalysisRef, AnalysisRef] | None:
    """The A/B the dashboard opens on: the first pair the device logs measured, when there is one; else the
    shipped default repeat_kv vs qfold (fp16); else the newest cached repeat_kv build and a qfold build of
    the same source, KV mode, ctx and compression."""
    if measured:
        return measured[0].a, measured[0].b
    default = (("source", DEFAULT_PRESET), ("kv_mode", DEFAULT_KV_MODE), ("ctx", DEFAULT_CTX), ("compression", None),
               ("phase", "decode"))
    shipped = {r.variant: r for r in refs if r.kind == "shipped" and set(default) <= set(r.spec)}
    if BASELINE_VARIANT in shipped and CANDIDATE_VARIANT in shipped:
        return shipped[BASELINE_VARIANT], shipped[CANDIDATE_VARIANT]
    for base in (r for r in refs if r.kind == "build" and r.variant == BASELINE_VARIANT):
        pair = matching_pair(base, refs)
        if pair is not None:
            return pair
    return None


def builds_root() -> Path:
    return builds_dir()  # $QFOLD_BUILDS or builds/
