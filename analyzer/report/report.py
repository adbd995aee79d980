"""The A/B headline (tiles, bytes, predicted speed, equivalence) and a one-file HTML report of it.

The report is one HTML file a reviewer can open offline: plotly.js is embedded inline once (no CDN),
every chart is followed by its numbers, and all text from analyses or logs is HTML-escaped. Pure: no
streamlit; the dashboard's Export page and tests call :func:`build_report` directly.
"""

from __future__ import annotations

import html
import math
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from analyzer.device.bandwidth import WRITEUP_AB_IPHONE, predicted_tok_per_s
from analyzer.fmt import MB, MIB
from analyzer.graph.accounting import CATEGORIES
from analyzer.graph.diff import diff_documents
from analyzer.report import figures

NO_RUNTIME_NOTE = (
    "No Core ML runtime on Linux: no predict, no compute plan. The figures are static MIL analysis "
    "(op records and tensor shapes of the saved program) and torch numerics; on a Mac, Core ML's "
    "MLComputePlan would add per-op device placement and estimated cost, and predict would add Core ML outputs."
)
UNITS_NOTE = "MiB = 2^20 bytes, MB = 10^6 bytes; bytes are logical bytes per decode token from MIL shapes."


# ------------------------------------------------------------------------------------------------- headline
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


def _comparable_spec(doc: dict[str, Any]) -> tuple[Any, ...] | None:
    spec = doc.get("spec")
    if not spec:
        return None
    source = spec.get("source", {})
    return (repr(source.get("fingerprint")), spec.get("kv_mode"), spec.get("ctx"), spec.get("compression"))


def equivalence_summary(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> EquivalenceSummary | None:
    """The equivalence of A's and B's variants, when both are builds of the same source, KV mode, ctx and
    compression (each build records every variant pair); None otherwise."""
    folded = _fold_summary(doc_a, doc_b)
    if folded is not None:
        return folded
    spec_a, spec_b = _comparable_spec(doc_a), _comparable_spec(doc_b)
    if spec_a is None or spec_a != spec_b:
        return None
    va, vb = doc_a["spec"]["variant"], doc_b["spec"]["variant"]
    if va == vb:
        return None
    report = doc_a.get("equivalence") or doc_b.get("equivalence")
    if not report:
        return None
    pairs = {p["dtype"]: p for p in report.get("pairs", []) if {p["variant_a"], p["variant_b"]} == {va, vb}}
    if not pairs:
        return None
    fp16, fp32 = pairs.get("fp16"), pairs.get("fp32")
    agree = [p["greedy_agree_steps"] for p in pairs.values()]
    compressed = doc_a["spec"].get("compression")
    return EquivalenceSummary(
        variant_a=va,
        variant_b=vb,
        steps=int(report.get("steps", max(p["steps"] for p in pairs.values()))),
        # the torch pair ran on uncompressed weights: its bit-identity is not the compressed packages'
        fp16_bit_identical=None if fp16 is None or compressed else bool(fp16["bit_identical"]),
        fp16_max_abs_diff=None if fp16 is None else float(fp16["max_abs_diff"]),
        fp32_max_abs_diff=None if fp32 is None else float(fp32["max_abs_diff"]),
        greedy_agree_steps=min(agree) if agree else None,
        weights=f"uncompressed torch weights, not the packages' {compressed} ones" if compressed else "",
    )


def package_fold_summary(package_a, package_b) -> EquivalenceSummary | None:
    """A package and its cached fold (``analyzer.build.fold.fold_cached``, e.g. the Builds page's "Fold it"):
    the MIL interpreter's proof from the fold's record; None for any other pair of packages."""
    from pathlib import Path

    from analyzer.build.fold import fold_record_of

    for orig, folded in ((package_a, package_b), (package_b, package_a)):
        record = fold_record_of(folded)
        if record is None or orig is None or record.get("source_path") != str(Path(orig).resolve()):
            continue
        proof = record["proof"]
        if not proof.get("checked"):
            return None
        names = ("original", "folded") if orig == package_a else ("folded", "original")
        return EquivalenceSummary(
            variant_a=names[0], variant_b=names[1], steps=int(proof["steps"]),
            fp16_bit_identical=bool(proof["bit_identical"]), fp16_max_abs_diff=max(proof["max_abs_diff"].values()),
            fp32_max_abs_diff=None, greedy_agree_steps=None, checked="MIL interpreter, folded vs original")
    return None


def _fold_summary(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> EquivalenceSummary | None:
    """A build and its fold (``repeat_kv+fold``, analyzer.build.fold): the MIL interpreter's proof."""
    for orig, folded in ((doc_a, doc_b), (doc_b, doc_a)):
        if not folded.get("folded_from") or folded["folded_from"] != orig.get("key"):
            continue
        check = next((c for c in (folded.get("equivalence") or {}).get("checks", [])
                      if c.get("kind") == "folded_vs_original" and c.get("checked")), None)
        if check is None:
            return None
        return EquivalenceSummary(
            variant_a=doc_a["spec"]["variant"], variant_b=doc_b["spec"]["variant"], steps=int(check["steps"]),
            fp16_bit_identical=bool(check["bit_identical"]), fp16_max_abs_diff=float(check["max_abs_diff"]),
            fp32_max_abs_diff=None, greedy_agree_steps=None, checked="MIL interpreter, folded vs original")
    return None


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
    bytes_per_token_a: dict[str, int]
    bytes_per_token_b: dict[str, int]
    bw_bytes_per_s: float
    tok_per_s_a: float
    tok_per_s_b: float
    equivalence: EquivalenceSummary | None = field(default=None)

    @property
    def speedup(self) -> float:
        """Predicted B over A; with ``tok/s = BW ÷ bytes`` it is bytes_A ÷ bytes_B, whatever the BW."""
        return self.tok_per_s_b / self.tok_per_s_a


def ab_headline(doc_a: dict[str, Any], doc_b: dict[str, Any], *, bw_bytes_per_s: float,
                label_a: str = "A", label_b: str = "B") -> ABHeadline:
    sa, sb = doc_a["summary"], doc_b["summary"]
    ba, bb = doc_a["bytes"]["bytes_per_token"], doc_b["bytes"]["bytes_per_token"]
    return ABHeadline(
        label_a=label_a,
        label_b=label_b,
        tiles_a=int(sa["tile_count"]),
        tiles_b=int(sb["tile_count"]),
        tile_bytes_a=int(sa["tile_output_bytes"]),
        tile_bytes_b=int(sb["tile_output_bytes"]),
        total_ops_a=int(sa["total_ops"]),
        total_ops_b=int(sb["total_ops"]),
        non_const_ops_a=int(sa["non_const_ops"]),
        non_const_ops_b=int(sb["non_const_ops"]),
        bytes_per_token_a={k: int(v) for k, v in ba.items()},
        bytes_per_token_b={k: int(v) for k, v in bb.items()},
        bw_bytes_per_s=float(bw_bytes_per_s),
        tok_per_s_a=predicted_tok_per_s(bw_bytes_per_s, int(ba["total"])),
        tok_per_s_b=predicted_tok_per_s(bw_bytes_per_s, int(bb["total"])),
        equivalence=equivalence_summary(doc_a, doc_b),
    )


def headline_frame(h: ABHeadline) -> pd.DataFrame:
    """The headline as rows (what, A, B): the report's first table and the A/B page's download."""
    def row(what: str, a: Any, b: Any, unit: str) -> dict[str, Any]:
        return {"what": what, "a": a, "b": b, "unit": unit}

    rows = [
        row("tile ops", h.tiles_a, h.tiles_b, "ops"),
        row("tile output", h.tile_bytes_a, h.tile_bytes_b, "bytes"),
        row("ops (with const)", h.total_ops_a, h.total_ops_b, "ops"),
        row("ops (without const)", h.non_const_ops_a, h.non_const_ops_b, "ops"),
        *(row(f"bytes per token: {c}", h.bytes_per_token_a[c], h.bytes_per_token_b[c], "bytes")
          for c in (*CATEGORIES, "total")),
        row("predicted tok/s", h.tok_per_s_a, h.tok_per_s_b, f"tok/s at {h.bw_bytes_per_s / MB:,.0f} MB/s"),
    ]
    return pd.DataFrame(rows, columns=["what", "a", "b", "unit"])


# ------------------------------------------------------------------------------------------------- HTML
@dataclass(frozen=True, slots=True)
class BandwidthSection:
    """What the Bandwidth page shows, for the report: per-build rows, A/B pairs, curves and fit verdicts."""

    builds: pd.DataFrame  # figures.bandwidth_frame
    pairs: pd.DataFrame  # figures.pairs_frame
    curves: tuple[figures.BandwidthCurve, ...]
    verdicts: tuple[str, ...] = ()


_CSS = """
body{font-family:-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif;margin:2rem auto;max-width:1200px;
color:#222;padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}
table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0}
th,td{border:1px solid #ddd;padding:.25rem .55rem;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.note{background:#fff7e6;border-left:4px solid #f0a020;padding:.6rem .9rem;font-size:.9rem}
.meta{color:#666;font-size:.85rem}
.kpis{display:flex;flex-wrap:wrap;gap:1rem;margin:1rem 0}
.kpi{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem;min-width:10rem}
.kpi .v{font-size:1.4rem;font-weight:600}.kpi .l{color:#666;font-size:.8rem}
"""


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _table(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    cols = list(columns or frame.columns)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = []
    for rec in frame[cols].itertuples(index=False):
        cells = []
        for v in rec:
            v = v.item() if hasattr(v, "item") else v
            cells.append(f"<td>{html.escape(_cell(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Figures:
    """Renders figures into the page, embedding plotly.js inline with the first one only."""

    def __init__(self) -> None:
        self.first = True

    def __call__(self, fig: go.Figure) -> str:
        out = pio.to_html(fig, full_html=False, include_plotlyjs=self.first, config={"displaylogo": False},
                          default_height="460px")
        self.first = False
        return out


def _kpi(label: str, value: str) -> str:
    return f'<div class="kpi"><div class="v">{html.escape(value)}</div><div class="l">{html.escape(label)}</div></div>'


def equivalence_text(eq: EquivalenceSummary | None) -> str:
    """One line for the A/B page and the report: what was checked, on which weights, and the result."""
    if eq is None:
        return "not available for this pair (equivalence is checked between variants of one source)"
    fp16 = "bit-identical" if eq.fp16_bit_identical else f"max |Δ| {eq.fp16_max_abs_diff:.3g}"
    parts = [f"fp16 {fp16}"]
    if eq.fp32_max_abs_diff is not None:
        parts.append(f"fp32 max |Δ logits| {eq.fp32_max_abs_diff:.3g}")
    if eq.greedy_agree_steps is not None:
        parts.append(f"greedy agreement {eq.greedy_agree_steps}/{eq.steps}")
    weights = f" ({eq.weights})" if eq.weights else ""
    return f"{eq.variant_a} vs {eq.variant_b}, {eq.checked}{weights}, {eq.steps} decode steps: " + "; ".join(parts)


def build_report(doc_a: dict[str, Any], doc_b: dict[str, Any], *, label_a: str = "A", label_b: str = "B",
                 bw_bytes_per_s: float = WRITEUP_AB_IPHONE.bytes_per_s, bandwidth: BandwidthSection | None = None,
                 generated_at: datetime | None = None) -> str:
    """One self-contained HTML page: headline, charts with their tables, tiles, and the bandwidth check."""
    h = ab_headline(doc_a, doc_b, bw_bytes_per_s=bw_bytes_per_s, label_a=label_a, label_b=label_b)
    diff = diff_documents(doc_a, doc_b)
    fig = _Figures()
    when = (generated_at or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    versions = doc_a.get("versions") or {}
    e = html.escape
    ta, tb = h.bytes_per_token_a["total"], h.bytes_per_token_b["total"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>qfold A/B report: {e(label_a)} vs {e(label_b)}</title><style>{_CSS}</style></head><body>",
        "<h1>qfold A/B report</h1>",
        f"<p class='meta'>A: {e(label_a)}<br>B: {e(label_b)}<br>generated {e(when)}"
        + (f" · {e(', '.join(f'{k} {v}' for k, v in versions.items()))}" if versions else "") + "</p>",
        f"<p class='note'>{e(NO_RUNTIME_NOTE)}</p>",
        "<div class='kpis'>",
        _kpi("tile ops A → B", f"{h.tiles_a} → {h.tiles_b}"),
        _kpi("tile output A → B", f"{h.tile_bytes_a / MIB:,.0f} → {h.tile_bytes_b / MIB:,.0f} MiB"),
        _kpi("bytes per token A → B", f"{ta / MIB:,.0f} → {tb / MIB:,.0f} MiB"),
        _kpi("bytes per token A → B (MB)", f"{ta / MB:,.0f} → {tb / MB:,.0f} MB"),
        _kpi(f"predicted tok/s at {bw_bytes_per_s / MB:,.0f} MB/s", f"{h.tok_per_s_a:.2f} → {h.tok_per_s_b:.2f}"),
        _kpi("predicted speedup B/A", f"{h.speedup:.2f}×"),
        "</div>",
        f"<p><b>Equivalence:</b> {e(equivalence_text(h.equivalence))}</p>",
        f"<p class='meta'>{e(UNITS_NOTE)} Predicted tok/s = BW ÷ bytes per token.</p>",
        "<h2>Headline</h2>",
        _table(headline_frame(h)),
    ]
    cats = figures.category_frame(diff)
    parts += ["<h2>Bytes per token by category</h2>", fig(figures.waterfall_figure(cats, label_a, label_b)),
              _table(cats)]
    ops = figures.op_count_frame(diff)
    changed = figures.op_count_frame(diff, changed_only=True)
    parts += ["<h2>Op counts</h2>", fig(figures.op_count_figure(ops, label_a, label_b)),
              "<p>Op types whose count changed:</p>", _table(changed), "<p>All op types:</p>", _table(ops)]
    parts.append("<h2>Tile ops</h2>")
    for label, doc in ((label_a, doc_a), (label_b, doc_b)):
        tiles = figures.tile_frame(doc)
        parts.append(f"<p><b>{e(label)}</b>: {len(tiles)} tile ops, "
                     f"{int(tiles['output_bytes'].sum()):,} bytes of output</p>")
        if len(tiles):
            parts.append(_table(tiles))
    layers = figures.layer_frame(doc_a, doc_b, "A", "B")
    parts += ["<h2>Bytes per token by layer</h2>", fig(figures.layer_figure(layers)), _table(layers)]
    if bandwidth is not None:
        parts += ["<h2>Bandwidth model: measured vs graph</h2>",
                  f"<p class='meta'>tok/s ≈ BW ÷ bytes per token. {e(UNITS_NOTE)}</p>",
                  fig(figures.bandwidth_figure(bandwidth.builds, bandwidth.curves)),
                  _table(bandwidth.builds),
                  fig(figures.inferred_vs_graph_figure(bandwidth.builds)),
                  fig(figures.residual_figure(bandwidth.builds))]
        if len(bandwidth.pairs):
            parts += ["<p>A/B pairs (a = the build with more graph bytes):</p>", _table(bandwidth.pairs)]
        parts += [f"<p class='note'>{e(v)}</p>" for v in bandwidth.verdicts]
    parts.append("</body></html>")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------- packages
MAX_DOWNLOAD_PACKAGE_BYTES = 200 * 1_000_000
"""Packages up to this size may be zipped and served through the browser; a download is held in server memory
per session (design.md: a full-size package is ~2.5 GB, never push it that way)."""


def package_size_bytes(path: Path) -> int:
    """Bytes of every file under a ``.mlpackage`` folder."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def zip_package(path: Path) -> BinaryIO:
    """The package zipped into an anonymous temporary file (gone when closed), positioned at its start."""
    out = tempfile.TemporaryFile()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in sorted(path.rglob("*")):
            if f.is_file():
                zf.write(f, arcname=str(Path(path.name) / f.relative_to(path)))
    out.seek(0)
    return out
