"""What the pages share: cached loading of analyses and logs, pickers whose choice survives page changes,
tables with their CSV download, the one bandwidth setting, the comparison kept in the URL, and the conversion
jobs of this session.

Session-state keys are prefixed by the page that owns them (``ab_``, ``builds_``, ``logs_``, ``bw_``,
``export_``); a page may read another page's keys (the Export page reads the A/B pair). Cached functions
raise on failure — Streamlit never caches an exception — and the wrappers clear the entry anyway, so a
failed load is retried next time rather than kept.

The URL carries the comparison (:func:`url_restore` / :func:`url_save`, run by ``app.py`` on every page): ``a`` and
``b`` (analysis ids), ``pkg`` (analysed packages, repeated; only paths under ``$QFOLD_DATA_ROOTS``), ``bw`` (the
bandwidth setting) and ``charge`` (the weight charge), so a reload or a pasted link reopens the same A/B.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.build.builds import queue
from analyzer.build.jobs import BuildJob, JobSnapshot
from analyzer.device.fit import BandwidthFit, BandwidthReport, bandwidth_report
from analyzer.device.logs import BuildDeviceSummary, LogImport, parse_logs, summarize
from analyzer.device.profiles import DeviceProfile, load_profiles
from analyzer.errors import QfoldError
from analyzer.fmt import MB, MIB, to_csv
from analyzer.fsio import path_under_roots
from analyzer.graph.accounting import DEFAULT_WEIGHT_CHARGE, WEIGHT_CHARGES, WeightCharge
from analyzer.graph.record import Analysis, load_analysis
from analyzer.report.assumptions import assumption_notes
from analyzer.report.bandwidth_figures import BandwidthCurve, bandwidth_frame, pairs_frame
from analyzer.report.bandwidth_setting import (
    SOURCE_NAMES,
    SOURCES,
    BandwidthSetting,
    BandwidthSettingError,
    ResolvedBandwidth,
    profile_name,
    resolve,
)
from analyzer.report.catalog import (
    AnalysisRef,
    MeasuredPair,
    builds_root,
    catalog,
    default_pair,
    measured_for,
    measured_pairs,
    phase_sibling,
)
from analyzer.report.figures import op_frame
from analyzer.report.labels import LabelMatch, log_label_matches
from analyzer.report.messages import for_ui
from analyzer.report.report import BandwidthSection

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_LOG = REPO_ROOT / "examples" / "writeup_device_logs.csv"
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


CHARGE_NAMES = {"compressed": "as stored", "decompressed": "decompressed at load"}


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


# st.metric's value font (2.25rem = 36 px, Source Sans): widths of its glyphs, measured in chromium at 1400 px
# ("2,521 → 2,401" is 197 px wide); unknown glyphs count as a lowercase letter.
_GLYPH_PX = {**dict.fromkeys("0123456789", 17), **dict.fromkeys(".,: ", 8), "→": 32, "×": 18,
             **dict.fromkeys("ilj|", 8), **dict.fromkeys("ABCDEFGHJKLNOPQRSTUVXYZ", 22), "M": 26, "W": 30}
METRIC_PADDING_PX = 40  # the bordered card's padding on both sides, plus slack


def metric_width_px(values: Sequence[str], minimum: int = 220) -> int:
    """One width for a row of metric cards that shows the longest value whole (cards wrap instead of cutting)."""
    widest = max((sum(_GLYPH_PX.get(c, 16) for c in v) for v in values), default=0)
    return max(minimum, widest + METRIC_PADDING_PX)


def restore_form(defaults: dict[str, Any]) -> None:
    """Give a page's widgets their values back after a visit to another page: Streamlit forgets the state of
    widgets that are not drawn, so :func:`keep_form` copies it under ``<key>__kept`` (plain state, kept) and
    this puts it back (or the default) before the widgets are drawn. Draw the widgets without a default
    (``value``/``index``), so the state is their one source."""
    for key, default in defaults.items():
        if key not in st.session_state:
            st.session_state[key] = st.session_state.get(f"{key}__kept", default)


def keep_form(defaults: dict[str, Any]) -> None:
    """Copy the widgets' current values where :func:`restore_form` finds them."""
    for key in defaults:
        if key in st.session_state:
            st.session_state[f"{key}__kept"] = st.session_state[key]


def set_persisted(values: dict[str, Any]) -> None:
    """Set persisted widgets' values (as a button callback: before the widgets are drawn again)."""
    for key, value in values.items():
        st.session_state[key] = value
        st.session_state.pop(f"{key}__widget", None)  # the widget is drawn afresh from ``key``


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
    """``figures.category_frame`` in the binary and the decimal unit its largest value reads best in (≥ 100 of
    it: MiB for a full-size model, KiB for a tiny one), for the headline (the CSV keeps the exact bytes)."""
    out = pd.DataFrame({"category": frame["category"]})
    largest = max(frame[["a_bytes", "b_bytes", "delta_bytes"]].abs().max().max(), 1)
    for ladder in ("auto", "auto-si"):
        unit = fmt.pick_unit(largest, ladder, at_least=100)
        for side, col in (("A", "a_bytes"), ("B", "b_bytes"), ("Δ", "delta_bytes")):
            out[f"{side} {unit}"] = frame[col].astype("float64") / fmt.UNITS[unit]
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


MAX_STYLED_CELLS = 200_000  # under pandas' styler.render.max_elements (262,144), which Streamlit enforces
ONE_DECIMAL_SUFFIXES = (" KiB", " MiB", " GiB", " MB", " GB", " kB", " %", "MB/s")


def _blank(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _number_text(value: Any, digits: int) -> str:
    """``1,234``, ``12.5``, never ``-0.0``; missing → blank."""
    if _blank(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if digits == 0 or isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    return f"{round(float(value), digits) + 0.0:,.{digits}f}"


def _cell_text(value: Any) -> str:
    if _blank(value):
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return _number_text(value, 0 if isinstance(value, numbers.Integral) else 2)
    return str(value)


def styled(frame: pd.DataFrame) -> Any:
    """``frame`` as the pages show it: thousands separators, one decimal for MiB/MB/% columns and two otherwise,
    no ``-0.0``, and empty optional cells blank rather than "None" (a pandas Styler: Streamlit shows its display
    values and sorts by the numbers). Frames too large to style are returned as they are."""
    if frame.size > MAX_STYLED_CELLS or frame.empty:
        return frame
    formats: dict[Any, Callable[[Any], str]] = {}
    for col in frame.columns:
        dtype = frame[col].dtype
        if pd.api.types.is_bool_dtype(dtype):
            continue
        if pd.api.types.is_integer_dtype(dtype):
            formats[col] = partial(_number_text, digits=0)
        elif pd.api.types.is_float_dtype(dtype):
            formats[col] = partial(_number_text, digits=1 if str(col).endswith(ONE_DECIMAL_SUFFIXES) else 2)
        else:
            formats[col] = _cell_text
    return frame.style.format(formats)


def show_table(frame: pd.DataFrame, *, max_height: int = 420, **kwargs: Any) -> Any:
    """``st.dataframe`` of :func:`styled` ``frame``, as tall as its rows (up to ``max_height``), missing values
    blank (``placeholder=""``; Streamlit's default shows "None")."""
    return st.dataframe(styled(frame), hide_index=True, width="stretch", height=fit_height(len(frame), max_height),
                        placeholder="", **kwargs)


def table_with_download(frame: pd.DataFrame, key: str, file_name: str, *, display: pd.DataFrame | None = None,
                        max_height: int = 420, caption: str | None = None) -> None:
    """The numbers of a chart: the table (``display`` if given) and its CSV (always the raw ``frame``)."""
    shown = frame if display is None else display
    show_table(shown, max_height=max_height)
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


def label_contexts() -> dict[str, frozenset[int]]:
    """The context lengths each build label's runs were measured at (they steer its auto-mapping)."""
    out: dict[str, set[int]] = {}
    for m in log_import().measurements:
        if m.context_length is not None:
            out.setdefault(m.build, set()).add(int(m.context_length))
    return {label: frozenset(c) for label, c in out.items()}


def log_label_auto(labels: Sequence[str], refs: Sequence[AnalysisRef]) -> dict[str, LabelMatch]:
    """Where each label maps by itself (model, variant, compression and ctx it names) and why."""
    return log_label_matches(list(labels), list(refs), label_contexts())


def log_mapping(labels: Sequence[str], refs: Sequence[AnalysisRef]) -> dict[str, str | None]:
    """Build label → analysis id, kept in ``logs_mapping``; labels seen for the first time are auto-mapped
    (:func:`log_label_auto`); a label the user mapped keeps the user's choice."""
    mapping: dict[str, str | None] = dict(st.session_state.get("logs_mapping", {}))
    ids = {r.id for r in refs}
    new = [label for label in labels if label not in mapping or (mapping[label] and mapping[label] not in ids)]
    if new:
        mapping.update({label: m.ref_id for label, m in log_label_auto(new, refs).items()})
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
    curves = [BandwidthCurve(f"BW {fmt.bandwidth(bw_bytes_per_s)} (the bandwidth setting)", bw_bytes_per_s)]
    for f in fits:
        if f.usable:
            extra = f" + {f.overhead_s * 1e3:.2f} ms" if f.model == "bandwidth+overhead" else ""
            curves.append(BandwidthCurve(f"fit {f.device}: {fmt.bandwidth(f.bw_bytes_per_s)}{extra}",
                                         f.bw_bytes_per_s, max(f.overhead_s, 0.0), dash="dash", color="#888"))
    return tuple(curves)


def bandwidth_section(refs: Sequence[AnalysisRef], bw: ResolvedBandwidth) -> BandwidthSection | None:
    """The Bandwidth page's content for the report, from this session's logs and mapping, with the one
    bandwidth setting (a fixed value, or each device's fit)."""
    imported = log_import()
    if not imported.measurements:
        return None
    labels = list(dict.fromkeys(m.build for m in imported.measurements))
    mapping = log_mapping(labels, refs)
    result = bandwidth_analysis(imported, graph_bytes(mapping, refs), fixed_bw_bytes_per_s=bw.fixed_bytes_per_s,
                                overhead=False)
    return BandwidthSection(bandwidth_frame(result.crosscheck), pairs_frame(result.crosscheck),
                            bandwidth_curves(bw.bytes_per_s, result.fits), tuple(f.verdict for f in result.fits),
                            graph_assumptions(mapping, refs))


# ------------------------------------------------------------------------------------------------- bandwidth
BW_KEY = "bw_setting"  # the one BandwidthSetting every page's predictions use


@st.cache_resource(show_spinner=False)
def device_profiles() -> Mapping[str, DeviceProfile]:
    """The write-up's constant and the cited profiles of ``examples/device_profiles.csv`` (read-only)."""
    return load_profiles()


def bandwidth_setting() -> BandwidthSetting:
    return st.session_state.get(BW_KEY) or BandwidthSetting()


def bandwidth_control(where: str) -> BandwidthSetting:
    """The one bandwidth setting, drawn where predictions are made (A/B, Bandwidth): every copy edits the same
    ``bw_setting``, so the A/B headline, the Bandwidth page's verdicts and residuals and the report agree."""
    profiles = device_profiles()
    setting = bandwidth_setting()
    keys = {name: f"bwset_{where}_{name}" for name in ("source", "profile", "typed")}
    st.session_state[keys["source"]] = setting.source  # widgets drawn from the shared value every run
    st.session_state[keys["profile"]] = setting.profile_key if setting.profile_key in profiles else \
        BandwidthSetting().profile_key
    st.session_state[keys["typed"]] = float(setting.typed_mb_per_s)

    def sync() -> None:
        st.session_state[BW_KEY] = BandwidthSetting(st.session_state[keys["source"]],
                                                    st.session_state[keys["profile"]],
                                                    float(st.session_state[keys["typed"]]))

    source = st.radio("Bandwidth for predictions", SOURCES, key=keys["source"], horizontal=True, on_change=sync,
                      format_func=lambda v: SOURCE_NAMES[v],
                      help="One setting for the A/B page, the Bandwidth page and the report. tok/s = BW ÷ bytes "
                           "per token; 1 MB = 10^6 bytes.")
    if source == "profile":
        st.selectbox("Device profile", list(profiles), key=keys["profile"], on_change=sync,
                     format_func=lambda k: f"{fmt.bandwidth(profiles[k].bytes_per_s)} · {profile_name(profiles[k])}",
                     help=profiles[setting.profile_key].source if setting.profile_key in profiles else None)
    elif source == "typed":
        st.number_input("Bandwidth (MB/s, 1 MB = 10^6 bytes)", min_value=0.001, max_value=1e10, step=100.0,
                        format="%.2f", key=keys["typed"], on_change=sync)
    return bandwidth_setting()


def resolved_bandwidth(refs: Sequence[AnalysisRef], prefer_device: str | None = None) -> ResolvedBandwidth:
    """What the bandwidth setting means now (for "fitted": the fits of this session's logs)."""
    setting = bandwidth_setting()
    fits: Sequence[BandwidthFit] = ()
    if setting.source == "fitted":
        imported = log_import()
        if imported.measurements:
            labels = list(dict.fromkeys(m.build for m in imported.measurements))
            mapping = log_mapping(labels, refs)
            fits = bandwidth_analysis(imported, graph_bytes(mapping, refs), fixed_bw_bytes_per_s=None,
                                      overhead=False).fits
    return resolve(setting, device_profiles(), fits, prefer_device)


# ------------------------------------------------------------------------------------------------- URL
URL_ERRORS_KEY = "url_errors"


def url_restore() -> None:
    """Once per browser session (a first load, a reload, a pasted link): take the comparison from the URL."""
    if st.session_state.get("url_restored"):
        return
    st.session_state["url_restored"] = True
    qp = st.query_params
    errors: list[str] = []
    packages = list(st.session_state.get("builds_packages", []))
    for text in qp.get_all("pkg"):
        try:
            path = path_under_roots(text)
        except QfoldError as e:
            errors.append(f"analysed package in the link: {for_ui(str(e))}")
            continue
        if path.suffix != ".mlpackage" or not path.is_dir():
            errors.append(f"analysed package in the link: {text}: not a .mlpackage folder on this server")
        elif str(path) not in packages:
            packages.append(str(path))
    st.session_state["builds_packages"] = packages
    known = {r.id for r in analysis_refs()}
    for param, key in (("a", "ab_a"), ("b", "ab_b")):
        if not qp.get(param):
            continue
        if qp[param] in known:
            st.session_state[key] = qp[param]
        else:
            errors.append(f"its {param.upper()} ({qp[param]}) is not among the analyses on this server (a build made "
                          "elsewhere, or removed); the default is shown instead")
    if qp.get("bw"):
        try:
            st.session_state[BW_KEY] = BandwidthSetting.from_text(qp["bw"], device_profiles())
        except BandwidthSettingError as e:
            errors.append(f"the link's {e}")
    if qp.get("charge") in WEIGHT_CHARGES:
        st.session_state[WEIGHT_CHARGE_KEY] = qp["charge"]
    st.session_state[URL_ERRORS_KEY] = errors


def url_save() -> None:
    """Keep the comparison in the URL (only what changed is written)."""
    wanted: dict[str, list[str]] = {
        "a": [st.session_state["ab_a"]] if st.session_state.get("ab_a") else [],
        "b": [st.session_state["ab_b"]] if st.session_state.get("ab_b") else [],
        "pkg": list(st.session_state.get("builds_packages", [])),
        "bw": [bandwidth_setting().to_text()] if BW_KEY in st.session_state else [],
        "charge": [weight_charge()] if WEIGHT_CHARGE_KEY in st.session_state else [],
    }
    qp = st.query_params
    for param, values in wanted.items():
        if qp.get_all(param) != values:
            if values:
                qp[param] = values if len(values) > 1 else values[0]
            elif param in qp:
                del qp[param]


def url_errors() -> list[str]:
    """What a link asked for that this server cannot show (shown once, on the A/B page)."""
    return st.session_state.pop(URL_ERRORS_KEY, [])


def error(e: Exception | str, prefix: str = "") -> None:
    """An expected failure, in words a page uses (no command-line flags)."""
    st.error(prefix + for_ui(str(e)), icon=":material/error:")


# ------------------------------------------------------------------------------------------------- jobs
def start_job(job: BuildJob) -> None:
    st.session_state.setdefault("builds_jobs", []).append(job.start())


def job_snapshots() -> list[JobSnapshot]:
    return [j.snapshot() for j in st.session_state.get("builds_jobs", [])]


def running_keys() -> set[str]:
    """Build keys converting now: this session's jobs and the machine-wide queue."""
    keys = {k for s in job_snapshots() if not s.finished for k in s.keys}
    return keys | {e.key for e in queue(builds_root())}
