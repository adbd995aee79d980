"""The A/B headline: tiles, ops, bytes per token, predicted speed, the torch equivalence of the two variants,
and what the byte figures assume. The A/B page leads with it and the HTML report opens with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from analyzer import fmt
from analyzer.analysis.accounting import CATEGORIES, BytesPerToken
from analyzer.analysis.record import Analysis
from analyzer.convert.launch import ASSET_NAME
from analyzer.fold.cache import fold_record_of
from analyzer.fold.proof import RELATIVE_TOLERANCE, FoldProof
from analyzer.predict.bandwidth_model import predicted_tok_per_s
from analyzer.report.assumptions import assumption_notes

NO_RUNTIME_NOTE = (
    "No Core ML runtime on Linux: no predict, no compute plan. The figures are static MIL analysis "
    "(op records and tensor shapes of the saved program) and torch numerics; on a Mac, Core ML's "
    "MLComputePlan would add per-op device placement and estimated cost, and predict would add Core ML outputs."
)
COREAI_RUNTIME_NOTE = (
    "Core AI assets are MLIR (coreai.* ops in main.mlirb): the figures are static analysis of the asset's program "
    "(op records and tensor shapes) and torch numerics. Core AI's runtime runs here on the CPU, single-threaded: the "
    "Builds page's bench times A and B on it and its Profiler splits each step by op; on a Mac, "
    "`xcrun coreai-build inspect ASSET --ops --json` gives the ops per compute unit."
)
UNITS_NOTE = "MiB = 2^20 bytes, MB = 10^6 bytes; bytes are logical bytes per decode token from MIL shapes."
_IR = {"coreml": "MIL", "coreai": "MLIR"}


def runtime_note(backends: Sequence[str]) -> str:
    """What the figures are and which runtime or tools would add to them, for the backends of the analyses shown
    (``MilProgram.backend``): Core ML's words for Core ML, Core AI's for Core AI, both for a mixed pair."""
    kinds = dict.fromkeys(backends)
    notes = [COREAI_RUNTIME_NOTE if b == "coreai" else NO_RUNTIME_NOTE for b in kinds]
    return " ".join(dict.fromkeys(notes)) or NO_RUNTIME_NOTE


def units_note(backends: Sequence[str]) -> str:
    """``UNITS_NOTE`` naming the program's language (MIL, MLIR, or both) the shapes come from."""
    irs = " and ".join(dict.fromkeys(_IR.get(b, b) for b in backends)) or "MIL"
    return UNITS_NOTE.replace("from MIL shapes", f"from {irs} tensor shapes")


@dataclass(frozen=True, slots=True)
class EquivalenceSummary:
    """The torch check of the two variants on one source: fp16 bit-identity, max |Δ logits|, greedy agreement."""

    variant_a: str
    variant_b: str
    steps: int
    fp16_bit_identical: bool | None
    fp16_max_abs_diff: float | None
    fp32_max_abs_diff: float | None
    greedy_agree_steps: int | None  # the fewer of fp16's and fp32's agreeing steps
    checked: str = "torch"  # what ran: "torch", or "MIL interpreter, folded vs original"
    weights: str = ""  # which weights, when they are not the packages' own (compressed builds)
    # a fold whose proof did not show equivalence: why ("UNPROVEN, the proof could not run: …", "FAILED: …");
    # its figures above are then None and it is never shown as proven
    unproven: str = ""


def _comparable_spec(a: Analysis) -> tuple[Any, ...] | None:
    if a.build is None:
        return None
    s = a.build.spec
    return repr(s.source.fingerprint()), s.kv_mode, s.ctx, s.compression


def equivalence_summary(a: Analysis, b: Analysis) -> EquivalenceSummary | None:
    """The equivalence of A's and B's variants, when both are builds of the same source, KV mode, ctx and
    compression (each build records every variant pair), or a build and its fold (the interpreter's proof);
    None otherwise."""
    folded = _fold_summary(a, b)
    if folded is not None:
        return folded
    spec_a, spec_b = _comparable_spec(a), _comparable_spec(b)
    if spec_a is None or spec_a != spec_b or a.build is None or b.build is None:
        return None
    va, vb = a.build.spec.variant, b.build.spec.variant
    report = a.build.equivalence or b.build.equivalence
    if va == vb or report is None:
        return None
    pairs = {p.dtype: p for p in report.pairs if {p.variant_a, p.variant_b} == {va, vb}}
    if not pairs:
        return None
    fp16, fp32 = pairs.get("fp16"), pairs.get("fp32")
    compressed = a.build.spec.compression
    return EquivalenceSummary(
        variant_a=va,
        variant_b=vb,
        steps=report.steps,
        # the torch pair ran on uncompressed weights: its bit-identity is not the compressed packages'
        fp16_bit_identical=None if fp16 is None or compressed else fp16.bit_identical,
        fp16_max_abs_diff=None if fp16 is None else fp16.max_abs_diff,
        fp32_max_abs_diff=None if fp32 is None else fp32.max_abs_diff,
        greedy_agree_steps=min(p.greedy_agree_steps for p in pairs.values()),
        weights=f"uncompressed torch weights, not the packages' {compressed} ones" if compressed else "",
    )


def _fold_summary(a: Analysis, b: Analysis) -> EquivalenceSummary | None:
    """A build and its fold (``repeat_kv+fold``, analyzer.fold.cache): the MIL interpreter's proof."""
    for orig, folded in ((a, b), (b, a)):
        if orig.build is None or folded.build is None or folded.build.extra.get("folded_from") != orig.build.key:
            continue
        check = folded.build.check("folded_vs_original")
        if check is None:
            return None
        if not check.checked or (check.max_abs_diff is not None and check.max_abs_value is not None
                                 and check.max_abs_diff > RELATIVE_TOLERANCE * max(check.max_abs_value, 1e-6)):
            return _unproven(a.build.spec.variant, b.build.spec.variant,  # type: ignore[union-attr]
                             "MIL interpreter, folded vs original", check.steps, check.note)
        return EquivalenceSummary(
            variant_a=a.build.spec.variant, variant_b=b.build.spec.variant, steps=check.steps,  # type: ignore[union-attr]
            fp16_bit_identical=check.bit_identical, fp16_max_abs_diff=check.max_abs_diff,
            fp32_max_abs_diff=None, greedy_agree_steps=None, checked="MIL interpreter, folded vs original")
    return None


def package_fold_summary(package_a, package_b) -> EquivalenceSummary | None:
    """A package or Core AI asset (or the build folder holding one) and its cached fold
    (``analyzer.fold.cache.fold_cached``, e.g. the Builds page's "Fold it"): the proof from the fold's record (the
    MIL interpreter's, or the Core AI runtime's); None for any other pair."""
    for orig, folded, names in ((package_a, package_b, ("original", "folded")),
                                (package_b, package_a, ("folded", "original"))):
        record = fold_record_of(folded)
        if orig is not None and (Path(orig) / ASSET_NAME).is_dir():  # a Core AI build: its asset was folded
            orig = Path(orig) / ASSET_NAME
        if record is None or orig is None or record.get("source_path") != str(Path(orig).resolve()):
            continue
        proof = record["proof"]
        engine = f"{proof.get('engine', 'the MIL interpreter').removeprefix('the ')}, folded vs original"
        if FoldProof.from_json(proof).status != "proven":
            return _unproven(names[0], names[1], engine, int(proof.get("steps", 0)), str(proof.get("headline", "")))
        return EquivalenceSummary(
            variant_a=names[0], variant_b=names[1], steps=int(proof["steps"]),
            fp16_bit_identical=bool(proof["bit_identical"]), fp16_max_abs_diff=max(proof["max_abs_diff"].values()),
            fp32_max_abs_diff=None, greedy_agree_steps=None, checked=engine)
    return None


def _unproven(variant_a: str, variant_b: str, checked: str, steps: int, why: str) -> EquivalenceSummary:
    """A fold whose proof did not show equivalence, as the A/B page and the report must show it: unproven."""
    return EquivalenceSummary(variant_a, variant_b, steps, None, None, None, None, checked=checked,
                              unproven=why or "UNPROVEN: no proof was recorded")


def equivalence_text(eq: EquivalenceSummary | None) -> str:
    """One line for the A/B page and the report: what was checked, on which weights, and the result."""
    if eq is None:
        return "not available for this pair (equivalence is checked between variants of one source)"
    if eq.unproven:
        return f"{eq.variant_a} vs {eq.variant_b}, {eq.checked}: NOT PROVEN — {eq.unproven}"
    fp16 = "bit-identical" if eq.fp16_bit_identical else f"max |Δ| {eq.fp16_max_abs_diff:.3g}"
    parts = [f"fp16 {fp16}"]
    if eq.fp32_max_abs_diff is not None:
        parts.append(f"fp32 max |Δ logits| {eq.fp32_max_abs_diff:.3g}")
    if eq.greedy_agree_steps is not None:
        parts.append(f"greedy agreement {eq.greedy_agree_steps}/{eq.steps}")
    weights = f" ({eq.weights})" if eq.weights else ""
    return f"{eq.variant_a} vs {eq.variant_b}, {eq.checked}{weights}, {eq.steps} decode steps: " + "; ".join(parts)


@dataclass(frozen=True, slots=True)
class ABHeadline:
    """The numbers the A/B page leads with (bytes ints, bandwidth in bytes/s)."""

    label_a: str
    label_b: str
    tiles_a: int
    tiles_b: int
    tile_bytes_a: int
    tile_bytes_b: int
    total_ops_a: int
    total_ops_b: int
    non_const_ops_a: int
    non_const_ops_b: int
    bytes_per_token_a: BytesPerToken
    bytes_per_token_b: BytesPerToken
    bw_bytes_per_s: float
    tok_per_s_a: float
    tok_per_s_b: float
    equivalence: EquivalenceSummary | None = None
    assumptions_a: tuple[str, ...] = field(default=())  # report.assumptions.assumption_notes
    assumptions_b: tuple[str, ...] = field(default=())
    # why A or B could not be sized (analyzer.analysis.sizing): its byte figures leave something out and are shown
    # as "could not be sized", never as a number; None: sized
    unsized_reason_a: str | None = None
    unsized_reason_b: str | None = None
    unsized_copies_a: int = 0  # copies without a size or a verdict, beside the tile count
    unsized_copies_b: int = 0

    @property
    def sized(self) -> bool:
        return self.unsized_reason_a is None and self.unsized_reason_b is None

    @property
    def unsized_notes(self) -> tuple[str, ...]:
        """One line per side that could not be sized, with why."""
        return tuple(f"{side} could not be sized: {why}" for side, why in (("A", self.unsized_reason_a),
                                                                           ("B", self.unsized_reason_b)) if why)

    @property
    def speedup(self) -> float:
        """Predicted B over A; with ``tok/s = BW ÷ bytes`` it is bytes_A ÷ bytes_B, whatever the BW."""
        return self.tok_per_s_b / self.tok_per_s_a

    @property
    def assumptions(self) -> tuple[str, ...]:
        """Every assumption of A and B, once, labelled with the side(s) it applies to."""
        out = []
        for note in dict.fromkeys((*self.assumptions_a, *self.assumptions_b)):
            sides = [s for s, notes in (("A", self.assumptions_a), ("B", self.assumptions_b)) if note in notes]
            out.append(f"{' and '.join(sides)}: {note}")
        return tuple(out)


def ab_headline(a: Analysis, b: Analysis, *, bw_bytes_per_s: float, label_a: str = "A",
                label_b: str = "B") -> ABHeadline:
    sa, sb = a.summary, b.summary
    ta, tb = a.bytes_per_token, b.bytes_per_token
    return ABHeadline(
        label_a=label_a,
        label_b=label_b,
        tiles_a=sa.tile_count,
        tiles_b=sb.tile_count,
        tile_bytes_a=sa.tile_output_bytes,
        tile_bytes_b=sb.tile_output_bytes,
        total_ops_a=sa.total_ops,
        total_ops_b=sb.total_ops,
        non_const_ops_a=sa.non_const_ops,
        non_const_ops_b=sb.non_const_ops,
        bytes_per_token_a=ta,
        bytes_per_token_b=tb,
        bw_bytes_per_s=float(bw_bytes_per_s),
        tok_per_s_a=predicted_tok_per_s(bw_bytes_per_s, ta.total),
        tok_per_s_b=predicted_tok_per_s(bw_bytes_per_s, tb.total),
        equivalence=equivalence_summary(a, b),
        assumptions_a=assumption_notes(a),
        assumptions_b=assumption_notes(b),
        unsized_reason_a=a.sizing.unsized_reason,
        unsized_reason_b=b.sizing.unsized_reason,
        unsized_copies_a=sa.unsized_copies,
        unsized_copies_b=sb.unsized_copies,
    )


def headline_frame(h: ABHeadline) -> pd.DataFrame:
    """The headline as rows (what, A, B): the report's first table and the A/B page's download."""
    def row(what: str, a: Any, b: Any, unit: str) -> dict[str, Any]:
        return {"what": what, "a": a, "b": b, "unit": unit}

    def sized(a: Any, b: Any, ok_a: bool, ok_b: bool) -> tuple[Any, Any]:  # a figure not computed is empty
        return (a if ok_a else None), (b if ok_b else None)

    ok_a, ok_b = h.unsized_reason_a is None, h.unsized_reason_b is None
    rows = [
        row("sized", int(ok_a), int(ok_b), "1: every figure computed, 0: not (analyzer/analysis/sizing.py)"),
        row("tile ops", h.tiles_a, h.tiles_b, "ops"),
        row("unsized copies", h.unsized_copies_a, h.unsized_copies_b, "ops without a size or a verdict"),
        row("tile output", *sized(h.tile_bytes_a, h.tile_bytes_b, not h.unsized_copies_a, not h.unsized_copies_b),
            "bytes"),
        row("ops (with const)", h.total_ops_a, h.total_ops_b, "ops"),
        row("ops (without const)", h.non_const_ops_a, h.non_const_ops_b, "ops"),
        *(row(f"bytes per token: {c}", *sized(h.bytes_per_token_a.get(c), h.bytes_per_token_b.get(c), ok_a, ok_b),
              "bytes") for c in (*CATEGORIES, "total")),
        row("predicted tok/s", *sized(h.tok_per_s_a, h.tok_per_s_b, ok_a, ok_b),
            f"tok/s at {fmt.bandwidth(h.bw_bytes_per_s)}"),
    ]
    return pd.DataFrame(rows, columns=["what", "a", "b", "unit"])


# ------------------------------------------------------------------------------------------------- cards
DeltaColor = Literal["normal", "inverse", "off"]
DeltaArrow = Literal["auto", "up", "down", "off"]
NO_CHANGE = "no change"
NOT_SIZED = "could not be sized"


@dataclass(frozen=True, slots=True)
class HeadlineCard:
    """One headline metric as the A/B page (``st.metric``) and the HTML report show it: already formatted, with
    the colour its change deserves (``inverse``: fewer is better; ``off``: no change, shown without an arrow)."""

    key: str
    label: str
    value: str
    delta: str | None = None
    delta_color: DeltaColor = "off"
    help: str = ""
    delta_arrow: DeltaArrow = "auto"  # "auto": from the delta's sign; a ratio (×0.33) says its direction itself


def _change_card(key: str, label: str, value: str, change: float, delta: str, *, fewer_is_better: bool,
                 help: str = "") -> HeadlineCard:
    """A card whose delta is neutral (no arrow, no colour) when nothing changed."""
    if change == 0:
        return HeadlineCard(key, label, value, NO_CHANGE, "off", help, "off")
    return HeadlineCard(key, label, value, delta, "inverse" if fewer_is_better else "normal", help)


def _ratio_card(key: str, label: str, value: str, ratio: float, what: str, help: str) -> HeadlineCard:
    if round(ratio, 2) == 1.0:
        return HeadlineCard(key, label, value, f"×{ratio:,.2f}, {NO_CHANGE}", "off", help, "off")
    faster = ratio > 1  # the text has no sign: the colour and the arrow say which way it went
    return HeadlineCard(key, label, value, f"×{ratio:,.2f} {what}", "normal" if faster else "inverse", help,
                        "up" if faster else "down")


def _unsized_card(key: str, label: str, a: str | None, b: str | None, why: tuple[str, ...]) -> HeadlineCard:
    """A card one side of which could not be sized: that side reads "could not be sized" (``None``), never a
    number, there is no change to show, and the help says why."""
    return HeadlineCard(key, label, f"{a or NOT_SIZED} → {b or NOT_SIZED}", None, "off", " ".join(why), "off")


def headline_cards(h: ABHeadline, measured: tuple[float, float, str] | None = None,
                   caveat: str | None = None) -> tuple[HeadlineCard, ...]:
    """The headline's metrics, each value in the unit it deserves (``fmt.size(..., "auto")``: 32 KiB of tiles is
    ``32.0 KiB → 0 B``, never ``0 → 0 MiB``). ``measured`` is (tok/s A, tok/s B, where they were measured);
    ``caveat`` is added to the predicted tok/s card's help (e.g. :func:`compare.structure_caveat`). A side that
    could not be sized shows "could not be sized" instead of its byte and speed figures."""
    ta, tb = h.bytes_per_token_a.total, h.bytes_per_token_b.total
    bw = fmt.bandwidth(h.bw_bytes_per_s)
    rate_help = "tok/s = BW ÷ bytes per token; the ratio does not depend on BW" + (f". {caveat}" if caveat else "")
    why = h.unsized_notes
    ok_a, ok_b = h.unsized_reason_a is None, h.unsized_reason_b is None
    copies_a, copies_b = (f" ({n} unsized)" if n else "" for n in (h.unsized_copies_a, h.unsized_copies_b))
    tiles = _change_card("tiles", "tile ops, A → B", fmt.count_change(h.tiles_a, h.tiles_b), h.tiles_b - h.tiles_a,
                         f"{h.tiles_b - h.tiles_a:+,} ops", fewer_is_better=True)
    if copies_a or copies_b:
        tiles = HeadlineCard("tiles", "tile ops, A → B", f"{h.tiles_a:,}{copies_a} → {h.tiles_b:,}{copies_b}",
                             None, "off", "unsized: copies without a size or a verdict. " + " ".join(why), "off")
    ops = _change_card("ops", "ops without const, A → B", fmt.count_change(h.non_const_ops_a, h.non_const_ops_b),
                       h.non_const_ops_b - h.non_const_ops_a, f"{h.non_const_ops_b - h.non_const_ops_a:+,} ops",
                       fewer_is_better=True,
                       help=f"with const: {h.total_ops_a:,} → {h.total_ops_b:,} ({h.total_ops_b - h.total_ops_a:+,})")
    if not h.sized:
        size_a = fmt.size(h.tile_bytes_a, "auto", None) if not h.unsized_copies_a else None
        size_b = fmt.size(h.tile_bytes_b, "auto", None) if not h.unsized_copies_b else None
        return (tiles, _unsized_card("tile_bytes", "tile output per token, A → B", size_a, size_b, why), ops,
                _unsized_card("bytes", "bytes per token, A → B", fmt.size(ta, "auto", None) if ok_a else None,
                              fmt.size(tb, "auto", None) if ok_b else None, why),
                _unsized_card("tok_per_s", f"predicted tok/s at {bw}", fmt.rate(h.tok_per_s_a) if ok_a else None,
                              fmt.rate(h.tok_per_s_b) if ok_b else None, why),
                *_measured_cards(measured))
    cards = [
        tiles,
        _change_card("tile_bytes", "tile output per token, A → B", fmt.change(h.tile_bytes_a, h.tile_bytes_b,
                                                                              "auto", None),
                     h.tile_bytes_b - h.tile_bytes_a, fmt.size(h.tile_bytes_b - h.tile_bytes_a, "auto", None,
                                                               sign=True), fewer_is_better=True,
                     help=f"exact: {h.tile_bytes_a:,} → {h.tile_bytes_b:,} bytes"),
        ops,
        _change_card("bytes", "bytes per token, A → B", fmt.change(ta, tb, "auto", None), tb - ta,
                     fmt.size(tb - ta, "auto", None, sign=True), fewer_is_better=True,
                     help=f"in decimal units: {fmt.change(ta, tb, 'auto-si', None)} "
                          f"({fmt.size(tb - ta, 'auto-si', None, sign=True)}); exact: {ta:,} → {tb:,} bytes. "
                          "KiB/MiB/GiB = 2^10/2^20/2^30 bytes, kB/MB/GB = 10^3/10^6/10^9 bytes."),
        _ratio_card("tok_per_s", f"predicted tok/s at {bw}", f"{fmt.rate(h.tok_per_s_a)} → {fmt.rate(h.tok_per_s_b)}",
                    h.speedup, "(= bytes A ÷ bytes B)", rate_help),
    ]
    return (*cards, *_measured_cards(measured))


def _measured_cards(measured: tuple[float, float, str] | None) -> tuple[HeadlineCard, ...]:
    if measured is None:
        return ()
    a, b, where = measured
    return (_ratio_card("measured", "measured tok/s (device logs)", f"{a:,.2f} → {b:,.2f}", b / a, "measured",
                        where),)  # as logged: the write-up's 20.39 → 54.30
