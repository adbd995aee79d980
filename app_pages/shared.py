"""What the pages share: cached loading of analyses and logs, pickers whose choice survives page changes,
tables with their CSV download, and the conversion jobs of this session.

Session-state keys are prefixed by the page that owns them (``ab_``, ``builds_``, ``logs_``, ``bw_``,
``export_``); a page may read another page's keys (the Export page reads the A/B pair). Cached functions
raise on failure — Streamlit never caches an exception — and the wrappers clear the entry anyway, so a
failed load is retried next time rather than kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.build.builds import queue
from analyzer.build.jobs import BuildJob, JobSnapshot
from analyzer.device.bandwidth import WRITEUP_AB_IPHONE
from analyzer.device.fit import BandwidthFit, BandwidthReport, bandwidth_report
from analyzer.device.logs import BuildDeviceSummary, LogImport, parse_logs, summarize
from analyzer.errors import QfoldError
from analyzer.fmt import MB, MIB, to_csv
from analyzer.graph.accounting import DEFAULT_WEIGHT_CHARGE, WeightCharge
from analyzer.graph.record import Analysis, load_analysis
from analyzer.report.assumptions import assumption_notes
from analyzer.report.bandwidth_figures import BandwidthCurve, bandwidth_frame, pairs_frame
from analyzer.report.catalog import (
    AnalysisRef,
    MeasuredPair,
    builds_root,
    catalog,
    default_log_mapping,
    default_pair,
    measured_for,
    measured_pairs,
    phase_sibling,
)
from analyzer.report.figures import op_frame
from analyzer.report.report import BandwidthSection

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_LOG = REPO_ROOT / "examples" / "writeup_device_logs.csv"
DEFAULT_BW_MB_S = WRITEUP_AB_IPHONE.bytes_per_s / MB  # 55,900 MB/s, the write-up's constant
WEIGHT_CHARGE_KEY = "ab_weight_charge"  # the A/B page's choice; every page's bytes use it
UNMAPPED = "(not mapped)"


# ------------------------------------------------------------------------------------------------- analyses
def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


@st.cache_data(show_spinner=False, max_entries=32, ttl=600)
def _catalog(root: str, root_mtime: float, packages: tuple[str, ...]) -> list[AnalysisRef]:
    return catalog(root, packages)


def analysis_refs() -> list[AnalysisRef]:
    """Shipped analyses, cached builds (re-read when the builds folder changes) and this session's packages."""
    root = builds_root()
    packages = tuple(st.session_state.get("builds_packages", ()))
    return _catalog(str(root), _mtime(root), packages)


def refs_by_id(refs: Sequence[AnalysisRef]) -> dict[str, AnalysisRef]:
    return {r.id: r for r in refs}


def weight_charge() -> WeightCharge:
    """How compressed weights count per token, as chosen on the A/B page (default: as stored)."""
    return st.session_state.get(WEIGHT_CHARGE_KEY, DEFAULT_WEIGHT_CHARGE)


# Frozen records, never mutated: shared across sessions as resources, not copied per call.
@st.cache_resource(show_spinner="Loading the analysis…", max_entries=16)
def _load(path: str, function: str | None, mtime: float, charge: str) -> Analysis:
    # derived figures (summary, bytes) are computed with the current rules, for stored analyses too
    return load_analysis(path, function, charge)  # type: ignore[arg-type]


def load(ref: AnalysisRef) -> Analysis:
    """The analysis ``ref`` names (raises QfoldError with a message fit for st.error)."""
    args = (str(ref.path), ref.function, _mtime(ref.path), weight_charge())
    try:
        return _load(*args)
    except QfoldError:
        _load.clear(*args)
        raise


@st.cache_data(show_spinner="Accounting bytes per op…", max_entries=16)
def _op_table(path: str, function: str | None, mtime: float, charge: str) -> pd.DataFrame:
    return op_frame(_load(path, function, mtime, charge).account.op_rows())


def op_table(ref: AnalysisRef) -> pd.DataFrame:
    """Every op of ``ref`` with the bytes it moves per token, by category."""
    args = (str(ref.path), ref.function, _mtime(ref.path), weight_charge())
    try:
        return _op_table(*args)
    except QfoldError:
        _op_table.clear(*args)
        raise


def ab_pair(refs: Sequence[AnalysisRef]) -> tuple[AnalysisRef, AnalysisRef] | None:
    """The A/B page's current pair (when the user has not chosen: the pair the device logs measured, else the
    shipped default)."""
    by_id = refs_by_id(refs)
    default = default_pair(list(refs), measured_ab_pairs(refs))
    a = by_id.get(st.session_state.get("ab_a", "")) or (default[0] if default else None)
    b = by_id.get(st.session_state.get("ab_b", "")) or (default[1] if default else None)
    return (a, b) if a is not None and b is not None else None


def short_label(ref: AnalysisRef) -> str:
    """The variant and kind, for chart legends (the full label is in the picker)."""
    return f"{ref.variant or Path(ref.path).stem} ({ref.kind})"


# ------------------------------------------------------------------------------------------------- widgets
def persisted_selectbox(label: str, options: Sequence[Any], key: str, default: Any = None,
                        format_func: Callable[[Any], str] = str, **kwargs: Any) -> Any:
    """A selectbox whose value lives in ``st.session_state[key]`` and so survives page changes
    (Streamlit drops the state of widgets that are not drawn)."""
    options = list(options)
    if st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else (options[0] if options else None)
    widget = f"{key}__widget"

    def sync() -> None:
        st.session_state[key] = st.session_state[widget]

    index = options.index(st.session_state[key]) if options else None
    st.selectbox(label, options, index=index, key=widget, on_change=sync, format_func=format_func, **kwargs)
    return st.session_state[key]


def persisted_radio(label: str, options: Sequence[Any], key: str, default: Any, **kwargs: Any) -> Any:
    """A radio whose value lives in ``st.session_state[key]`` (other pages read it)."""
    options = list(options)
    if st.session_state.get(key) not in options:
        st.session_state[key] = default
    widget = f"{key}__widget"

    def sync() -> None:
        st.session_state[key] = st.session_state[widget]

    st.radio(label, options, index=options.index(st.session_state[key]), key=widget, on_change=sync, **kwargs)
    return st.session_state[key]


def set_persisted(values: dict[str, Any]) -> None:
    """Set persisted widgets' values (as a button callback: before the widgets are drawn again)."""
    for key, value in values.items():
        st.session_state[key] = value
        st.session_state.pop(f"{key}__widget", None)  # the widget is drawn afresh from ``key``


def persisted_slider(label: str, key: str, default: float, **kwargs: Any) -> Any:
    """A slider whose value lives in ``st.session_state[key]``."""
    st.session_state.setdefault(key, default)
    widget = f"{key}__widget"

    def sync() -> None:
        st.session_state[key] = st.session_state[widget]

    st.slider(label, value=st.session_state[key], key=widget, on_change=sync, **kwargs)
    return st.session_state[key]


# ------------------------------------------------------------------------------------------------- tables
def frame_csv(frame: pd.DataFrame) -> str:
    """A frame as CSV through ``fmt.to_csv`` (formula-like cells escaped; missing values empty)."""
    clean = frame.astype(object).where(frame.notna(), None)
    return to_csv(clean.to_dict("records"), [str(c) for c in frame.columns])


def with_units(frame: pd.DataFrame, byte_columns: Sequence[str], mb: bool = False) -> pd.DataFrame:
    """Add ``<col> MiB`` (and ``<col> MB``) beside byte columns, for display only."""
    out = frame.copy()
    for col in byte_columns:
        pos = out.columns.get_loc(col) + 1
        values = pd.to_numeric(out[col], errors="coerce").astype("float64")
        if mb:
            out.insert(pos, f"{col} MB", values / MB)
        out.insert(pos, f"{col} MiB", values / MIB)
    return out


def category_display(frame: pd.DataFrame) -> pd.DataFrame:
    """``figures.category_frame`` in MiB and MB, for the headline (the CSV keeps the exact bytes)."""
    out = pd.DataFrame({"category": frame["category"]})
    for unit, scale in (("MiB", MIB), ("MB", MB)):
        for side, col in (("A", "a_bytes"), ("B", "b_bytes"), ("Δ", "delta_bytes")):
            out[f"{side} {unit}"] = frame[col].astype("float64") / scale
    return out


def flops_display(frame: pd.DataFrame) -> pd.DataFrame:
    """``figures.flops_frame`` in GFLOP (10^9 FLOPs), for the screen (the CSV keeps the exact counts)."""
    out = pd.DataFrame({"category": frame["category"]})
    for side, col in (("A", "a_flops"), ("B", "b_flops"), ("Δ", "delta_flops"), ("A per call", "a_flops_per_call"),
                      ("B per call", "b_flops_per_call")):
        out[f"{side} GFLOP"] = frame[col].astype("float64") / 1e9
    return out


def crosscheck_display(frame: pd.DataFrame) -> pd.DataFrame:
    """``figures.bandwidth_frame`` with bytes in MB, for the page (the CSV keeps the exact bytes)."""
    def num(col: str, scale: float = 1.0) -> pd.Series:
        return pd.to_numeric(frame[col], errors="coerce").astype("float64") / scale

    return pd.DataFrame({
        "build": frame["build"], "device": frame["device"], "n": frame["n"],
        "measured tok/s": num("measured_tok_per_s"), "predicted tok/s": num("predicted_tok_per_s"),
        "residual %": num("residual_pct"), "graph MB": num("graph_bytes_per_token", MB),
        "inferred MB": num("inferred_bytes_per_token", MB), "gap MB": num("gap_bytes", MB), "gap %": num("gap_pct"),
        "BW MB/s": num("bw_bytes_per_s", MB),
    })


def tile_sizes_text(analysis: Analysis) -> str:
    """``60 tiles × 16 MiB = 960 MiB`` when the tiles are all one size."""
    tiles = analysis.summary.tiles
    sizes = {t.output_bytes or 0 for t in tiles}
    total = analysis.summary.tile_output_bytes
    if len(sizes) == 1:
        return f"A: {len(tiles)} tiles × {fmt.mib(sizes.pop(), 2)} = {fmt.mib(total, 0)} of tile output"
    return f"A: {len(tiles)} tiles, {fmt.mib(total, 0)} of tile output"


def number_config(frame: pd.DataFrame) -> dict[str, Any]:
    """Thousands separators for ints, one decimal for MiB/MB, two for the rest."""
    config: dict[str, Any] = {}
    for col in frame.columns:
        name = str(col)
        if pd.api.types.is_integer_dtype(frame[col]):
            config[name] = st.column_config.NumberColumn(format="localized")
        elif pd.api.types.is_float_dtype(frame[col]):
            fmt = "%,.1f" if name.endswith((" MiB", " MB", " %", "MB/s")) else "%,.2f"
            config[name] = st.column_config.NumberColumn(format=fmt)
    return config


def fit_height(n_rows: int, max_px: int = 420) -> int:
    """A table height that shows every row up to ``max_px`` (no empty rows under a short table)."""
    return min(max_px, 38 + 35 * max(n_rows, 1))


def table_with_download(frame: pd.DataFrame, key: str, file_name: str, *, display: pd.DataFrame | None = None,
                        max_height: int = 420, caption: str | None = None) -> None:
    """The numbers of a chart: the table (``display`` if given) and its CSV (always the raw ``frame``)."""
    shown = frame if display is None else display
    st.dataframe(shown, hide_index=True, width="stretch", height=fit_height(len(shown), max_height),
                 column_config=number_config(shown))
    if caption:
        st.caption(caption)
    st.download_button("Download CSV", frame_csv(frame), file_name=file_name, mime="text/csv", key=key,
                       icon=":material/download:", on_click="ignore")


# ------------------------------------------------------------------------------------------------- logs
@st.cache_data(show_spinner="Validating the logs…", max_entries=16)
def _parse_logs(files: tuple[tuple[str, bytes], ...], device: str | None, build: str | None) -> LogImport:
    return parse_logs(list(files), device=device, build=build)


def example_log_files() -> tuple[tuple[str, bytes], ...]:
    return ((EXAMPLE_LOG.name, EXAMPLE_LOG.read_bytes()),) if EXAMPLE_LOG.is_file() else ()


def log_files() -> tuple[tuple[str, bytes], ...]:
    """The logs this session works on: its uploads, else the write-up's example log."""
    files = st.session_state.get("logs_files")
    return tuple(files) if files else example_log_files()


def using_example_log() -> bool:
    return not st.session_state.get("logs_files")


def log_import() -> LogImport:
    """This session's logs, with the Device logs page's labels (``logs_device``, ``logs_label``: already
    validated there) filling the device/build of rows whose format names none."""
    return _parse_logs(log_files(), st.session_state.get("logs_device"), st.session_state.get("logs_label"))


def log_mapping(labels: Sequence[str], refs: Sequence[AnalysisRef]) -> dict[str, str | None]:
    """Build label → analysis id, kept in ``logs_mapping``; labels seen for the first time get defaults."""
    mapping: dict[str, str | None] = dict(st.session_state.get("logs_mapping", {}))
    ids = {r.id for r in refs}
    new = [label for label in labels if label not in mapping or (mapping[label] and mapping[label] not in ids)]
    if new:
        mapping.update(default_log_mapping(new, list(refs), default_pair(list(refs))))
        st.session_state["logs_mapping"] = mapping
    return {label: mapping.get(label) for label in labels}


def mapped_analyses(mapping: dict[str, str | None], refs: Sequence[AnalysisRef]) -> dict[str, Analysis]:
    """Build label → the decode analysis it is mapped to (the decode function of a decode+prefill build, or the
    decode build of a prefill one's spec: the bandwidth model and the A/B headline are models of decode steps)."""
    by_id = refs_by_id(refs)
    out = {}
    for label, ref_id in mapping.items():
        decode = phase_sibling(by_id[ref_id], "decode", refs) if ref_id and ref_id in by_id else None
        if decode is not None:
            out[label] = load(decode)
    return out


def log_summaries_and_mapping(refs: Sequence[AnalysisRef]) -> tuple[list[BuildDeviceSummary], dict[str, str | None]]:
    """This session's logs summarised per (build, device), and their build labels mapped to analyses."""
    imported = log_import()
    labels = list(dict.fromkeys(m.build for m in imported.measurements))
    return summarize(imported.measurements), log_mapping(labels, refs)


def measured_ab_pairs(refs: Sequence[AnalysisRef]) -> list[MeasuredPair]:
    """The baseline/candidate A/Bs this session's logs measured (the write-up's log: the top8 pair)."""
    summaries, mapping = log_summaries_and_mapping(refs)
    return measured_pairs(list(refs), mapping, summaries)


def measured(ref_a: AnalysisRef, ref_b: AnalysisRef, refs: Sequence[AnalysisRef]) -> MeasuredPair | None:
    """What the logs measured for this A and B on one device, if they did."""
    summaries, mapping = log_summaries_and_mapping(refs)
    return measured_for(ref_a, ref_b, mapping, summaries)


def graph_bytes(mapping: dict[str, str | None], refs: Sequence[AnalysisRef]) -> dict[str, int]:
    """Build label → total graph bytes per token of the analysis it is mapped to."""
    return {label: a.bytes_per_token.total for label, a in mapped_analyses(mapping, refs).items()}


def graph_assumptions(mapping: dict[str, str | None], refs: Sequence[AnalysisRef]) -> tuple[str, ...]:
    """What the mapped analyses' graph bytes assume, one line per (label, assumption)."""
    return tuple(f"{label}: {note}" for label, a in mapped_analyses(mapping, refs).items()
                 for note in assumption_notes(a))


def bandwidth_analysis(imported: LogImport, graph: dict[str, int], *, fixed_bw_bytes_per_s: float | None,
                       overhead: bool) -> BandwidthReport:
    """Fits per device, the bandwidth each device's predictions use, and the cross-check (the ``fit``
    command's pipeline)."""
    return bandwidth_report(imported.measurements, graph, fixed_bw_bytes_per_s=fixed_bw_bytes_per_s,
                            overhead=overhead)


def bandwidth_curves(bw_bytes_per_s: float, fits: Sequence[BandwidthFit]) -> tuple[BandwidthCurve, ...]:
    curves = [BandwidthCurve(f"BW {fmt.bandwidth(bw_bytes_per_s)} (slider)", bw_bytes_per_s)]
    for f in fits:
        if f.usable:
            extra = f" + {f.overhead_s * 1e3:.2f} ms" if f.model == "bandwidth+overhead" else ""
            curves.append(BandwidthCurve(f"fit {f.device}: {fmt.bandwidth(f.bw_bytes_per_s)}{extra}",
                                         f.bw_bytes_per_s, max(f.overhead_s, 0.0), dash="dash", color="#888"))
    return tuple(curves)


def bandwidth_section(refs: Sequence[AnalysisRef], bw_bytes_per_s: float) -> BandwidthSection | None:
    """The Bandwidth page's content for the report, from this session's logs and mapping (fixed BW)."""
    imported = log_import()
    if not imported.measurements:
        return None
    labels = list(dict.fromkeys(m.build for m in imported.measurements))
    mapping = log_mapping(labels, refs)
    result = bandwidth_analysis(imported, graph_bytes(mapping, refs), fixed_bw_bytes_per_s=bw_bytes_per_s,
                                overhead=False)
    return BandwidthSection(bandwidth_frame(result.crosscheck), pairs_frame(result.crosscheck),
                            bandwidth_curves(bw_bytes_per_s, result.fits), tuple(f.verdict for f in result.fits),
                            graph_assumptions(mapping, refs))


# ------------------------------------------------------------------------------------------------- jobs
def start_job(job: BuildJob) -> None:
    st.session_state.setdefault("builds_jobs", []).append(job.start())


def job_snapshots() -> list[JobSnapshot]:
    return [j.snapshot() for j in st.session_state.get("builds_jobs", [])]


def running_keys() -> set[str]:
    """Build keys converting now: this session's jobs and the machine-wide queue."""
    keys = {k for s in job_snapshots() if not s.finished for k in s.keys}
    return keys | {e.key for e in queue(builds_root())}
