"""Device-log build labels mapped to the analyses they name (``exaone-qfold-top8`` → the shipped top8 Q-fold).

A label that is an analysis's own label (as the pickers show it; ``bench`` logs its builds under theirs:
:func:`bench_label`) or a build key maps to that analysis. Otherwise a label maps only when it names, as whole
words, one variant, a model the catalog has and optionally a compression preset and a ctx; anything ambiguous or
unknown stays unmapped with the reason, never a silent fallback::

    match_log_label("exaone-qfold-top8", refs).ref_id   → "shipped:exaone-4.0-1.2b-qfold-state-ctx4096-top8"
    match_log_label("qwen-qfold", refs).reason           → "names no model qfold has an analysis of (exaone-4.0-1.2b)"
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from analyzer.analysis.record import ANALYSIS_FILE, Analysis, read_analysis_file
from analyzer.convert.compress import PRESETS
from analyzer.errors import QfoldError
from analyzer.report.catalog import DEFAULT_KV_MODE, AnalysisRef, RefFacts, build_refs_of, variant_names

_DELIMITED = r"(?:^|(?<=[-_.\s/:,;()\[\]]))({names})(?=$|[-_.\s/:,;()\[\]])"


def _delimited(names: Sequence[str]) -> re.Pattern[str]:
    """Any of ``names`` as a whole word of a label: bounded by the label's ends or by - _ . space / : , ; ( ) [ ]."""
    alternatives = "|".join(re.escape(n) for n in sorted(set(names), key=len, reverse=True))
    return re.compile(_DELIMITED.format(names=alternatives), re.IGNORECASE)


def model_names(facts: RefFacts) -> tuple[str, ...]:
    """The names a log label may call a model by: ``exaone-4.0-1.2b``, its first word ``exaone``, that word without
    its version (``qwen2.5`` → ``qwen``) and the transformers model_type (``exaone4``)."""
    first = re.split(r"[-_\s]", facts.model, maxsplit=1)[0]
    bare = re.sub(r"[\d.]+$", "", first)
    names = [facts.model, first, bare, facts.model_type or ""]
    return tuple(dict.fromkeys(n.lower() for n in names if len(n) >= 3))


@dataclass(frozen=True, slots=True)
class LabelMatch:
    """Where a device-log build label maps, and why; ``ref_id`` None means unmapped, ``reason`` says why."""

    label: str
    ref_id: str | None
    reason: str


def _preference(ref: AnalysisRef, contexts: frozenset[int]) -> tuple[int, ...]:
    """Lower is preferred among analyses a label fits equally: a decode analysis (device logs' decode runs are
    what the bandwidth fit uses), the ctx the runs were measured at, full size (a device ran the real model, not
    a structure build), shipped over built, KV as state."""
    facts = ref.facts
    assert facts is not None
    return (0 if ref.phase == "decode" else 1, 0 if not contexts or facts.ctx in contexts else 1,
            0 if facts.size == "full size" else 1,
            0 if ref.kind == "shipped" else 1, 0 if facts.kv_mode == DEFAULT_KV_MODE else 1)


def match_log_label(label: str, refs: Sequence[AnalysisRef], contexts: frozenset[int] = frozenset()) -> LabelMatch:
    """Map one device-log build label to the analysis it names.

    A label that is a build key maps to that build. Otherwise the label must name, as whole words, one variant
    (``repeat_kv``/``qfold``), a model the catalog has (:func:`model_names`: ``exaone``, ``qwen3-0.6b``), and
    optionally a compression preset (``top8``; none named = fp16) and a ctx (``ctx4096``). Among the analyses that
    fit, the runs' own context lengths (``contexts``), full size, shipped and KV-as-state are preferred; a label
    that fits several analyses equally, or none, stays unmapped and the reason says which. There is no fallback
    to "the default pair": ``qwen-qfold`` never maps to an EXAONE analysis.
    """
    by_key = {r.id.removeprefix("build:"): r for r in refs if r.kind == "build"}
    if label in by_key:
        return LabelMatch(label, by_key[label].id, "the label is this build's key")
    own = next((r for r in refs if r.label == label), None)
    if own is not None:
        return LabelMatch(label, own.id, "the label is this analysis's own")
    candidates = [r for r in refs if r.facts is not None]
    variants = {m.group(1).lower() for m in _delimited(variant_names()).finditer(label)}
    if len(variants) != 1:
        what = "no variant" if not variants else f"{len(variants)} variants ({', '.join(sorted(variants))})"
        return LabelMatch(label, None, f"names {what}; a label maps when it names one of "
                                       f"{', '.join(sorted(variant_names()))}")
    variant = variants.pop()

    levels = {m.group(1).lower() for m in _delimited(list(PRESETS)).finditer(label)}
    if len(levels) > 1:
        return LabelMatch(label, None, f"names {len(levels)} compressions ({', '.join(sorted(levels))})")
    compression = levels.pop() if levels else "fp16"
    named = {}
    for r in candidates:
        hits = [m.group(1) for m in _delimited(model_names(r.facts)).finditer(label)]  # type: ignore[arg-type]
        if hits:
            named[r.id] = max(len(h) for h in hits)
    if not named:
        models = sorted({r.facts.model for r in candidates})  # type: ignore[union-attr]
        return LabelMatch(label, None, "names no model qfold has an analysis of"
                                       + (f" ({', '.join(models)})" if models else ""))
    best = max(named.values())
    ctx = {int(m.group(1)) for m in re.finditer(r"ctx[-_ ]?(\d+)", label, re.IGNORECASE)}
    fits = [r for r in candidates if named.get(r.id) == best and r.facts.variant == variant  # type: ignore[union-attr]
            and r.facts.compression.lower() == compression  # type: ignore[union-attr]
            and (not ctx or r.facts.ctx in ctx)]  # type: ignore[union-attr]
    models = sorted({r.facts.model for r in candidates if named.get(r.id) == best})  # type: ignore[union-attr]
    what = f"{'/'.join(models)} · {variant} · {compression}" + (f" · ctx {'/'.join(map(str, sorted(ctx)))}"
                                                                if ctx else "")
    if not fits:
        return LabelMatch(label, None, f"no analysis of {what}")
    if len({r.facts.model for r in fits}) > 1:  # type: ignore[union-attr]
        return LabelMatch(label, None, f"the label fits {len(models)} models ({', '.join(models)}): name one")
    ranked = sorted(fits, key=lambda r: _preference(r, contexts))
    top = [r for r in ranked if _preference(r, contexts) == _preference(ranked[0], contexts)]
    if len({(r.facts.model, r.facts.ctx, r.facts.kv_mode, r.facts.size) for r in top}) > 1:  # type: ignore[union-attr]
        return LabelMatch(label, None, f"{len(top)} analyses fit {what} equally: pick one")
    return LabelMatch(label, top[0].id, f"names {what}")


def same_model_analyses(label: str, refs: Sequence[AnalysisRef], contexts: frozenset[int] = frozenset()
                        ) -> list[AnalysisRef]:
    """For a label that names a model (:func:`model_names`, as whole words: ``exaone4 1.2B Q4_K - Medium``) but no
    one analysis of it: that model's decode analyses, the preferred one per variant (the runs' ctx, full size,
    shipped, KV state: as :func:`match_log_label` ranks), so the page offers each as a one-click mapping."""
    named: dict[str, int] = {}
    candidates = [r for r in refs if r.facts is not None and r.phase == "decode"]
    for r in candidates:
        hits = [m.group(1) for m in _delimited(model_names(r.facts)).finditer(label)]  # type: ignore[arg-type]
        if hits:
            named[r.id] = max(len(h) for h in hits)
    if not named:
        return []
    best = max(named.values())
    ranked = sorted((r for r in candidates if named.get(r.id) == best), key=lambda r: _preference(r, contexts))
    out: dict[str, AnalysisRef] = {}
    for r in ranked:
        out.setdefault(r.facts.variant, r)  # type: ignore[union-attr]
    return list(out.values())


def log_label_matches(labels: Sequence[str], refs: Sequence[AnalysisRef],
                      contexts: dict[str, frozenset[int]] | None = None) -> dict[str, LabelMatch]:
    """:func:`match_log_label` for every label (``contexts``: the context lengths each label's runs report)."""
    contexts = contexts or {}
    return {label: match_log_label(label, refs, contexts.get(label, frozenset())) for label in labels}


def default_log_mapping(labels: Sequence[str], refs: Sequence[AnalysisRef],
                        contexts: dict[str, frozenset[int]] | None = None) -> dict[str, str | None]:
    """Device-log build label → analysis id (None: unmapped), by :func:`match_log_label`."""
    return {label: m.ref_id for label, m in log_label_matches(labels, refs, contexts).items()}


def bench_label(target: str | Path) -> str | None:
    """The label a ``bench`` target is logged under by default: the label the pickers show for the build it is (a
    build folder, or the ``.aimodel`` inside one), so its log rows map back to that build by themselves; None for an
    asset outside a build (or a build folder that cannot be read: bench names it by its key, as before)."""
    p = Path(target)
    folder = p if p.is_dir() and (p / ANALYSIS_FILE).is_file() else p.parent
    if not (folder / ANALYSIS_FILE).is_file():
        return None
    try:
        refs = build_refs_of(read_analysis_file(folder))
    except (QfoldError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return refs[0].label if len(refs) == 1 else None


def sized_graph_bytes(mapped: Mapping[str, Analysis]) -> tuple[dict[str, int], tuple[str, ...]]:
    """Log label → total bytes per token of the analysis it is mapped to, for the bandwidth fit, and one line per
    label left out because its analysis could not be sized (its bytes per token leave something out: a fit on them
    would be wrong, never a figure to show; ``analyzer.analysis.sizing``)."""
    graph, left_out = {}, []
    for label, a in mapped.items():
        if a.sizing.sized:
            graph[label] = a.bytes_per_token.total
        else:
            left_out.append(f"{label}: left out of the fit, its analysis could not be sized "
                            f"({a.sizing.unsized_reason})")
    return graph, tuple(left_out)
