"""A one-file HTML report of an A/B: the headline, every chart followed by its numbers, the tiles, and the
bandwidth cross-check; and the zipping of small packages for download.

The report is one HTML file a reviewer can open offline: plotly.js is embedded inline once (no CDN),
every chart is followed by its numbers, and all text from analyses or logs is HTML-escaped. Pure: no
streamlit; the dashboard's Export page and tests call :func:`build_report` directly.
"""

from __future__ import annotations

import html
import math
import os
import shlex
import stat
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from analyzer.analysis.record import Analysis
from analyzer.compare.diff import diff_analyses
from analyzer.predict.bandwidth_model import WRITEUP_AB_IPHONE
from analyzer.report import figures, graphview
from analyzer.report.bandwidth_figures import (
    BandwidthCurve,
    bandwidth_figure,
    inferred_vs_graph_figure,
    residual_figure,
)
from analyzer.report.compare import compare, structure_caveat
from analyzer.report.headline import (
    UNITS_NOTE,
    HeadlineCard,
    ab_headline,
    equivalence_text,
    headline_cards,
    headline_frame,
    runtime_note,
    units_note,
)


# ------------------------------------------------------------------------------------------------- HTML
@dataclass(frozen=True, slots=True)
class BandwidthSection:
    """What the Bandwidth page shows, for the report: per-build rows, A/B pairs, curves and fit verdicts."""

    builds: pd.DataFrame  # bandwidth_figures.bandwidth_frame
    pairs: pd.DataFrame  # bandwidth_figures.pairs_frame
    curves: tuple[BandwidthCurve, ...]
    verdicts: tuple[str, ...] = ()
    assumptions: tuple[str, ...] = ()  # what the mapped analyses' graph bytes assume, one line each


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
.kpi .d{font-size:.85rem}.kpi .d.good{color:#09873a}.kpi .d.bad{color:#d03030}.kpi .d.off{color:#666}
.warn{background:#fdecea;border-left:4px solid #d03030;padding:.6rem .9rem;font-size:.95rem}
"""


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        value += 0.0  # -0.0 → 0.0: a table never shows "-0"
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


def _kpi(card: HeadlineCard) -> str:
    """A headline card as the page shows it: value, label, and the change coloured as ``st.metric`` colours it."""
    e = html.escape
    delta = ""
    if card.delta is not None:
        positive = not card.delta.startswith("-")  # st.metric colours by the text's sign
        good = positive == (card.delta_color == "normal")
        tone = "off" if card.delta_color == "off" else "good" if good else "bad"
        delta = f'<div class="d {tone}">{e(card.delta)}</div>'
    title = f' title="{e(card.help)}"' if card.help else ""
    return (f'<div class="kpi"{title}><div class="v">{e(card.value)}</div>{delta}'
            f'<div class="l">{e(card.label)}</div></div>')


def build_report(a: Analysis, b: Analysis, *, label_a: str = "A", label_b: str = "B",
                 bw_bytes_per_s: float = WRITEUP_AB_IPHONE.bytes_per_s, bandwidth: BandwidthSection | None = None,
                 generated_at: datetime | None = None, bandwidth_source: str = "") -> str:
    """One self-contained HTML page: headline, charts with their tables, tiles, layer 0's graphs of A and B,
    and the bandwidth check. ``bandwidth_source`` says where ``bw_bytes_per_s`` came from (the dashboard's one
    bandwidth setting)."""
    h = ab_headline(a, b, bw_bytes_per_s=bw_bytes_per_s, label_a=label_a, label_b=label_b)
    diff = diff_analyses(a, b)
    fig = _Figures()
    when = (generated_at or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    versions = a.build.versions if a.build else {}
    e = html.escape
    differences = compare(a, b).sentence()
    caveat = structure_caveat(a, b)
    backends = (a.program.backend, b.program.backend)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>qfold A/B report: {e(label_a)} vs {e(label_b)}</title><style>{_CSS}</style></head><body>",
        "<h1>qfold A/B report</h1>",
        f"<p class='meta'>A: {e(label_a)}<br>B: {e(label_b)}<br>generated {e(when)}"
        + (f" · {e(', '.join(f'{k} {v}' for k, v in versions.items()))}" if versions else "") + "</p>",
        f"<p class='note'>{e(runtime_note(backends))}</p>",
        *([f"<p class='warn'><b>Not apples to apples:</b> {e(differences)}</p>"] if differences else []),
        "<div class='kpis'>",
        *(_kpi(card) for card in headline_cards(h, caveat=caveat)),
        "</div>",
        *([f"<p class='note'><b>Predicted tok/s:</b> {e(caveat)}</p>"] if caveat else []),
        f"<p class='meta'>Bandwidth for predictions: {e(bandwidth_source)}</p>" if bandwidth_source else "",
        *(f"<p class='note'><b>Assumed:</b> {e(note)}</p>" for note in h.assumptions),
        f"<p><b>Equivalence:</b> {e(equivalence_text(h.equivalence))}</p>",
        f"<p class='meta'>{e(units_note(backends))} Predicted tok/s = BW ÷ bytes per token.</p>",
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
    for label, analysis in ((label_a, a), (label_b, b)):
        tiles = figures.tile_frame(analysis)
        parts.append(f"<p><b>{e(label)}</b>: {len(tiles)} tile ops, "
                     f"{int(tiles['output_bytes'].sum()):,} bytes of output</p>")
        if len(tiles):
            parts.append(_table(tiles))
    if a.program.ops and b.program.ops:  # summaries made by hand have no op records to draw
        parts.append(graphview.report_html(a.program, b.program, label_a, label_b, layer=0))
    layers = figures.layer_frame(a, b, "A", "B")
    parts += ["<h2>Bytes per token by layer</h2>", fig(figures.layer_figure(layers)), _table(layers)]
    if bandwidth is not None:
        parts += ["<h2>Bandwidth model: measured vs graph</h2>",
                  f"<p class='meta'>tok/s ≈ BW ÷ bytes per token. {e(UNITS_NOTE)}</p>",
                  fig(bandwidth_figure(bandwidth.builds, bandwidth.curves)),
                  _table(bandwidth.builds),
                  fig(inferred_vs_graph_figure(bandwidth.builds)),
                  fig(residual_figure(bandwidth.builds))]
        parts += [f"<p class='note'><b>Assumed:</b> {e(note)}</p>" for note in bandwidth.assumptions]
        if len(bandwidth.pairs):
            parts += ["<p>A/B pairs (a = the build with more graph bytes):</p>", _table(bandwidth.pairs)]
        if bandwidth.verdicts:
            parts.append("<p class='meta'>Each verdict judges its device's own least-squares fit (the bandwidth at the "
                         "end of its sentence); the predictions and residuals above use the bandwidth the table's "
                         "bw_source names.</p>")
        parts += [f"<p class='note'>{e(v)}</p>" for v in bandwidth.verdicts]
    parts.append("</body></html>")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------- packages
MAX_DOWNLOAD_PACKAGE_BYTES = 200 * 1_000_000
"""Packages up to this size are zipped for a browser download. Streamlit 1.67's ``st.download_button`` keeps what
it serves in server memory (its media storage holds the bytes until no session refers to them), so a full-size
package (~2.5 GB: bench/results/full_size.json) is never pushed that way: the page gives its path and the command
that zips it on the server instead (:func:`zip_command`)."""


def package_files(path: Path) -> list[Path]:
    """The regular files of a ``.mlpackage`` folder, sorted; symlinks are neither followed nor included (a link in
    a package made elsewhere could point anywhere on the server), nor FIFOs, sockets or devices (reading one
    would hang or stream forever)."""
    out = []
    for folder, dirs, files in os.walk(path, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not (Path(folder) / d).is_symlink())
        out += [Path(folder) / f for f in sorted(files) if stat.S_ISREG((Path(folder) / f).lstat().st_mode)]
    return out


def package_size_bytes(path: Path) -> int:
    """Bytes of every regular file under a ``.mlpackage`` folder."""
    return sum(f.stat().st_size for f in package_files(path))


def zip_package_to(path: Path, out: BinaryIO, root_name: str | None = None) -> None:
    """Write the package as a zip into ``out``, read file by file from disk, under one top folder ``root_name``
    (default: the package's own name), so it unzips to a ``.mlpackage`` any Core ML tool opens::

        model.mlpackage/Manifest.json, model.mlpackage/Data/com.apple.CoreML/model.mlmodel, …
    """
    root = root_name or path.name
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for f in package_files(path):
            zf.write(f, arcname=str(Path(root) / f.relative_to(path)))


def zip_package(path: Path, root_name: str | None = None) -> bytes:
    """The package zipped, as bytes for ``st.download_button``'s deferred callable (run when clicked). The zip is
    built in an anonymous temporary file and read back once, so the peak is one copy of the zip; the callable
    must return bytes (Streamlit 1.67 refuses the file object ``tempfile.TemporaryFile`` gives:
    "Callable returned unsupported type: BufferedRandom")."""
    with tempfile.TemporaryFile() as tmp:
        zip_package_to(path, tmp, root_name)
        tmp.seek(0)
        return tmp.read()


ZIP_SCRIPT = ("import sys; from pathlib import Path; from analyzer.report.report import zip_package_to; "
              'zip_package_to(Path(sys.argv[1]), open(sys.argv[2], "xb"), sys.argv[3])')


def zip_command(path: Path, out_name: str) -> str:
    """The shell command that zips ``path`` on the server exactly as the download does: qfold's own
    :func:`zip_package_to` (regular files only; a link out of the package is never followed, a FIFO never read),
    run by this server's Python from the folder its ``analyzer`` package is imported from. (``python -m zipfile
    -c`` would follow a link and copy what it points at into the zip.) The zip is created, never overwritten
    (``/tmp`` is shared: a file or link already there is refused)."""
    q = shlex.quote
    home = Path(__file__).resolve().parents[2]  # holds analyzer/: a checkout or site-packages
    return (f"cd {q(str(home))} && {q(sys.executable)} -c {q(ZIP_SCRIPT)} {q(str(path))} {q('/tmp/' + out_name)} "
            f"{q(out_name.removesuffix('.zip'))}")
