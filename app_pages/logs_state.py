"""This session's device logs (uploads, pastes and bench logs, else the write-up's example), their build labels
mapped to analyses, the A/B pair the pages show, and the Bandwidth page's content for the report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import streamlit as st

from analyzer.analysis.record import Analysis
from analyzer.measure.logs import BuildDeviceSummary, LogImport, parse_logs, summarize
from analyzer.measure.placement import is_plan
from analyzer.predict.fit import BandwidthReport, bandwidth_report
from analyzer.predict.profiles import load_profiles
from analyzer.predict.roof_check import BuildBytes, RoofRow, check_rows, without_impossible
from analyzer.report.assumptions import assumption_notes
from analyzer.report.bandwidth_figures import bandwidth_curves, bandwidth_frame, pairs_frame
from analyzer.report.bandwidth_setting import (
    ResolvedBandwidth,
)
from analyzer.report.catalog import (
    AnalysisRef,
    MeasuredPair,
    builds_root,
    default_pair,
    measured_for,
    measured_pairs,
    phase_sibling,
)
from analyzer.report.labels import LabelMatch, log_label_matches, sized_graph_bytes
from analyzer.report.report import BandwidthSection
from app_pages import logs_store
from app_pages.analyses import load, refs_by_id
from app_pages.session_keys import Key

REPO_ROOT = Path(__file__).resolve().parent.parent


EXAMPLE_LOG = REPO_ROOT / "examples" / "writeup_device_logs.csv"


UNMAPPED = "(not mapped)"


@st.cache_data(show_spinner="Validating the logs…", max_entries=16)
def _parse_logs(files: tuple[tuple[str, bytes], ...], device: str | None, build: str | None) -> LogImport:
    return parse_logs(list(files), device=device, build=build)


def example_log_files() -> tuple[tuple[str, bytes], ...]:
    return ((EXAMPLE_LOG.name, EXAMPLE_LOG.read_bytes()),) if EXAMPLE_LOG.is_file() else ()


def compose_logs() -> None:
    """The session's logs: uploads, then pasted texts, then the Builds page's bench logs (the uploader forgets its
    files when another page is shown, so all live in session state); placement plans go to the A/B page. Kept on
    the server too (:func:`persist`), so a reload keeps them."""
    files = [*st.session_state.get(Key.LOGS_UPLOADS, []), *st.session_state.get(Key.LOGS_PASTED, []),
             *st.session_state.get(Key.LOGS_BENCH, [])]
    st.session_state[Key.LOGS_FILES] = [f for f in files if not is_plan(f[1])]
    st.session_state[Key.LOGS_PLANS] = [f for f in files if is_plan(f[1])]  # the A/B page's Placement tab
    persist()


def add_bench_log(name: str, data: bytes) -> None:
    """One more log beside the uploads: a bench run's qfold-schema rows (``analyzer.measure.bench.log_csv``)."""
    st.session_state.setdefault(Key.LOGS_BENCH, []).append((name, data))
    compose_logs()


def example_shown() -> bool:
    """Whether the write-up's example log is among the logs (it is until removed: a paste or an upload adds to it)."""
    return st.session_state.get(Key.LOGS_EXAMPLE, True) is not False


def set_example(shown: bool) -> None:
    st.session_state[Key.LOGS_EXAMPLE] = shown
    persist()


def log_files() -> tuple[tuple[str, bytes], ...]:
    """The logs this session works on: the write-up's example (unless removed), then its uploads, pastes and bench
    logs."""
    own = tuple(st.session_state.get(Key.LOGS_FILES) or ())
    return (example_log_files() if example_shown() else ()) + own


def using_example_log() -> bool:
    """Only the example log is shown (nothing of the session's own)."""
    return example_shown() and not st.session_state.get(Key.LOGS_FILES)


def _session() -> logs_store.LogSession:
    return logs_store.LogSession(tuple(st.session_state.get(Key.LOGS_UPLOADS) or ()),
                                 tuple(st.session_state.get(Key.LOGS_PASTED) or ()),
                                 tuple(st.session_state.get(Key.LOGS_BENCH) or ()), example_shown(),
                                 dict(st.session_state.get(Key.LOGS_MAPPING) or {}))


def persist() -> None:
    """Keep the session's logs on the server under its token (made on the first change; the URL carries it)."""
    session = _session()
    token = st.session_state.get(Key.LOGS_TOKEN)
    if session.empty and not token:
        return
    if not logs_store.is_token(token):
        token = st.session_state[Key.LOGS_TOKEN] = logs_store.new_token()
    if not logs_store.save(logs_store.store_root(builds_root()), token, session):
        st.session_state[Key.LOGS_TOKEN] = None  # too large to keep: a reload starts from the example again


def restore(token: str) -> bool:
    """This session's logs from the server store (a reload, or a link carrying ``logs=TOKEN``)."""
    session = logs_store.load(logs_store.store_root(builds_root()), token)
    if session is None:
        return False
    st.session_state[Key.LOGS_TOKEN] = token
    st.session_state[Key.LOGS_UPLOADS] = list(session.uploads)
    st.session_state[Key.LOGS_PASTED] = list(session.pasted)
    st.session_state[Key.LOGS_BENCH] = list(session.bench)
    st.session_state[Key.LOGS_EXAMPLE] = session.example
    st.session_state[Key.LOGS_MAPPING] = dict(session.mapping)
    files = [*session.uploads, *session.pasted, *session.bench]
    st.session_state[Key.LOGS_FILES] = [f for f in files if not is_plan(f[1])]
    st.session_state[Key.LOGS_PLANS] = [f for f in files if is_plan(f[1])]
    return True


def log_import() -> LogImport:
    """This session's logs, with the Device logs page's labels (``logs_device``, ``logs_label``: already
    validated there) filling the device/build of rows whose format names none."""
    return _parse_logs(log_files(), st.session_state.get(Key.LOGS_DEVICE), st.session_state.get(Key.LOGS_LABEL))


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
    mapping: dict[str, str | None] = dict(st.session_state.get(Key.LOGS_MAPPING, {}))
    ids = {r.id for r in refs}
    new = [label for label in labels if label not in mapping or (mapping[label] and mapping[label] not in ids)]
    if new:
        mapping.update({label: m.ref_id for label, m in log_label_auto(new, refs).items()})
        st.session_state[Key.LOGS_MAPPING] = mapping
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


def ab_pair(refs: Sequence[AnalysisRef]) -> tuple[AnalysisRef, AnalysisRef] | None:
    """The A/B page's current pair (when the user has not chosen: the pair the device logs measured, else the
    shipped default)."""
    by_id = refs_by_id(refs)
    default = default_pair(list(refs), measured_ab_pairs(refs))
    a = by_id.get(st.session_state.get(Key.AB_A, "")) or (default[0] if default else None)
    b = by_id.get(st.session_state.get(Key.AB_B, "")) or (default[1] if default else None)
    return (a, b) if a is not None and b is not None else None


def graph_bytes(mapping: dict[str, str | None], refs: Sequence[AnalysisRef]) -> dict[str, int]:
    """Build label → total graph bytes per token of the analysis it is mapped to (those that could be sized:
    :func:`analyzer.report.labels.sized_graph_bytes`)."""
    return sized_graph_bytes(mapped_analyses(mapping, refs))[0]


def graph_assumptions(mapping: dict[str, str | None], refs: Sequence[AnalysisRef]) -> tuple[str, ...]:
    """What the mapped analyses' graph bytes assume, one line per (label, assumption)."""
    return tuple(f"{label}: {note}" for label, a in mapped_analyses(mapping, refs).items()
                 for note in assumption_notes(a))


def roof_rows(imported: LogImport, mapped: dict[str, Analysis]) -> tuple[RoofRow, ...]:
    """Every accepted row against its roof: the cited bandwidth of its device over the bytes the analysis its build
    label is mapped to must read per token (the ``fit`` command's roof check)."""
    builds = {label: BuildBytes.of_analysis(label, a) for label, a in mapped.items()}
    return check_rows(imported.measurements, builds, load_profiles())


def bandwidth_analysis(imported: LogImport, graph: dict[str, int], *, fixed_bw_bytes_per_s: float | None,
                       overhead: bool, roofs: Sequence[RoofRow] = (), keep_impossible: bool = False) -> BandwidthReport:
    """Fits per device, the bandwidth each device's predictions use, and the cross-check (the ``fit``
    command's pipeline); rows above their roof (``roofs``) are left out unless ``keep_impossible``."""
    measurements = imported.measurements
    if roofs and not keep_impossible:
        measurements, _ = without_impossible(measurements, roofs)
    return bandwidth_report(measurements, graph, fixed_bw_bytes_per_s=fixed_bw_bytes_per_s, overhead=overhead)


def bandwidth_section(refs: Sequence[AnalysisRef], bw: ResolvedBandwidth) -> BandwidthSection | None:
    """The Bandwidth page's content for the report, from this session's logs and mapping, with the one
    bandwidth setting (a fixed value, or each device's fit)."""
    imported = log_import()
    if not imported.measurements:
        return None
    labels = list(dict.fromkeys(m.build for m in imported.measurements))
    mapping = log_mapping(labels, refs)
    result = bandwidth_analysis(imported, graph_bytes(mapping, refs), fixed_bw_bytes_per_s=bw.fixed_bytes_per_s,
                                overhead=False, roofs=roof_rows(imported, mapped_analyses(mapping, refs)))
    return BandwidthSection(bandwidth_frame(result.crosscheck), pairs_frame(result.crosscheck),
                            bandwidth_curves(bw.bytes_per_s, result.fits), tuple(f.verdict for f in result.fits),
                            graph_assumptions(mapping, refs))
