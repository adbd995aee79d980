"""Export: the A/B as a one-file HTML report, one analysis as JSON and CSV tables, and its Core ML package
(zipped when clicked if it is small; a full-size package is given as its server path and the command that zips
it there, never pushed through the browser: Streamlit keeps a download's bytes in server memory)."""

from __future__ import annotations

import json
import re
import shlex
from functools import partial

import streamlit as st

from analyzer import fmt
from analyzer.analysis.accounting import OP_COLUMNS
from analyzer.analysis.record import Analysis
from analyzer.convert.jobs import BuildJob
from analyzer.errors import QfoldError
from analyzer.fmt import to_csv
from analyzer.model.backends import COREAI
from analyzer.model.cost import estimate_builds
from analyzer.model.spec import ANALYSIS_MODE
from analyzer.report import figures, frames
from analyzer.report.assumptions import assumption_notes
from analyzer.report.catalog import AnalysisRef, builds_root
from analyzer.report.messages import for_ui
from analyzer.report.report import (
    MAX_DOWNLOAD_PACKAGE_BYTES,
    build_report,
    package_size_bytes,
    zip_command,
    zip_package,
)
from app_pages import analyses, bandwidth_control, jobs_state, logs_state, widgets

st.title("Export")
refs = analyses.analysis_refs()
by_id = analyses.refs_by_id(refs)
pair = logs_state.ab_pair(refs)
if pair is None:
    st.warning("No analyses yet: make a build on the Builds page first.")
    st.stop()
ref_a, ref_b = pair
try:
    analysis_a, analysis_b = analyses.load(ref_a), analyses.load(ref_b)
except QfoldError as e:
    widgets.error(e, "Cannot load the analysis: ")
    st.stop()


def ops_csv(analysis: Analysis) -> str:
    """Every op's bytes per token (run when clicked, in Streamlit's download thread: no st calls here)."""
    return to_csv(analysis.account.op_rows(), OP_COLUMNS)


def file_stem(ref: AnalysisRef) -> str:
    """``exaone-4.0-1.2b_qfold_ctx4096_fp16_full-size_shipped``: what the analysis is, as a file name (letters,
    digits and ``._-`` only; a package's own name when qfold did not build it)."""
    if ref.facts is None:
        parts = [ref.path.stem, *([ref.function] if ref.function else [])]
    else:
        f = ref.facts
        parts = [f.model, f.variant, f"ctx{f.ctx}", f.compression, f.size, ref.kind]
    return re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join(parts)).strip(".-")[:100] or "analysis"


def download(label: str, data, file_name: str, mime: str, key: str) -> None:
    """Generated when clicked (``data`` is a callable), so a page view never builds files nobody asked for."""
    st.download_button(label, data, file_name=file_name, mime=mime, key=key, icon=":material/download:",
                       on_click="ignore")


# ---------------------------------------------------------------------------------------------- report
with st.container(border=True):
    st.subheader("A/B report")
    measured = logs_state.measured(ref_a, ref_b, refs)
    bw = bandwidth_control.resolved_bandwidth(refs, prefer_device=measured.device if measured else None)
    label_a, label_b = analyses.short_label(ref_a), analyses.short_label(ref_b)
    st.markdown(f"One HTML file, readable offline (plotly.js is embedded): headline, waterfall, op counts, tiles, "
                f"bytes per layer with their tables, and the bandwidth cross-check of this session's device logs.\n\n"
                f"- A: {fmt.md(ref_a.label)}\n- B: {fmt.md(ref_b.label)}\n- bandwidth for predictions: **{bw.label}** "
                f"({fmt.md_text(bw.source)}; "
                f"the A/B and Bandwidth pages set it)\n- compressed weights charged: "
                f"{frames.CHARGE_NAMES[analyses.weight_charge()]} (set on "
                "the A/B page)")
    try:
        section = logs_state.bandwidth_section(refs, bw)
    except (QfoldError, ValueError) as e:
        st.warning(fmt.md_text(f"The report leaves out the bandwidth section: {for_ui(str(e))}"))
        section = None

    def report_html() -> bytes:
        return build_report(analysis_a, analysis_b, label_a=f"{label_a}: {ref_a.label}",
                            label_b=f"{label_b}: {ref_b.label}", bw_bytes_per_s=bw.bytes_per_s,
                            bandwidth=section, bandwidth_source=f"{bw.label}, {bw.source}").encode("utf-8")

    download("Download the HTML report", report_html, "qfold_ab_report.html", "text/html", "export_report")

# ---------------------------------------------------------------------------------------------- one analysis
with st.container(border=True):
    st.subheader("One analysis")
    ref_id = widgets.persisted_selectbox("Analysis", list(by_id), "export_ref", default=ref_a.id,
                                        format_func=lambda i: by_id[i].label)
    ref = by_id[ref_id]
    try:
        analysis = analyses.load(ref)
    except QfoldError as e:
        widgets.error(e)
        st.stop()
    stem = file_stem(ref)
    total = analysis.bytes_per_token.total
    per_token = (f"{fmt.size(total, 'auto', None)} ({fmt.size(total, 'auto-si', None)}) per token"
                 if analysis.sizing.sized else "bytes per token could not be sized")
    st.markdown(f"{analysis.summary.total_ops:,} ops · {analysis.summary.tile_count} tile ops · {per_token}")
    for reason in analysis.sizing.reasons:  # names come from the package: escaped
        st.warning(fmt.md_text(for_ui(reason)), icon=":material/warning:")
    for note in assumption_notes(analysis):
        st.caption(f"Assumed — {note}")

    def analysis_json(a: Analysis) -> bytes:
        return json.dumps(a.to_json(), separators=(",", ":"), allow_nan=False).encode()

    c1, c2, c3 = st.columns(3)
    with c1:
        download("analysis.json", partial(analysis_json, analysis), f"{stem}.analysis.json", "application/json",
                 "export_json")
        download("Op table (CSV)", partial(ops_csv, analysis), f"{stem}_ops.csv", "text/csv", "export_ops")
    with c2:
        download("Bytes per token (CSV)", frames.frame_csv(figures.bytes_per_token_frame(analysis)),
                 f"{stem}_bytes_per_token.csv", "text/csv", "export_bytes")
        download("Bytes per layer (CSV)", frames.frame_csv(figures.bytes_by_layer_frame(analysis)),
                 f"{stem}_bytes_by_layer.csv", "text/csv", "export_layers")
    with c3:
        download("Tile ops (CSV)", frames.frame_csv(figures.tile_frame(analysis)), f"{stem}_tiles.csv", "text/csv",
                 "export_tiles")
    st.caption("CSV cells that a spreadsheet would run as a formula (starting with = + - @ | %, a tab or NUL) are "
               "escaped with a leading apostrophe.")

_running = any(not j.finished for j in jobs_state.job_snapshots())


@st.fragment(run_every=2.0 if _running else None)
def export_job_status(key: str) -> None:
    """This session's materialised build of ``key``: its stage while it runs; once done, what it measured beside
    the estimate above (the Builds page shows the same)."""
    snap = next((s for s in reversed(jobs_state.job_snapshots()) if key in s.keys), None)
    if snap is None:
        return
    if not snap.finished:
        st.progress(snap.fraction, text=f"{snap.stage}: {snap.message}"[:200] + f" ({snap.elapsed_s:,.0f} s)")
    elif snap.state == "failed":
        st.error(f"The materialised build failed: {fmt.md_text(snap.error or '')}", icon=":material/error:")
    else:
        measured = jobs_state.measured_beside_estimate(snap)
        st.success(f"Built {fmt.md(key)}" + (f" — {measured}." if measured else ".") + " Pick it as the analysis "
                   "above to download its package.", icon=":material/check_circle:")


# ---------------------------------------------------------------------------------------------- package
with st.container(border=True):
    st.subheader("Core AI asset" if analysis.program.backend == COREAI else "Core ML package")
    if ref.package_path is None or not ref.package_path.is_dir():
        build = analysis.build
        made = ("was made in analysis mode (value-free weights: shapes and dtypes, no values)"
                if build is not None and build.build_mode == ANALYSIS_MODE
                else "carries no weights (shipped analyses and sweep points never do)")
        kind = ".aimodel" if analysis.program.backend == COREAI else ".mlpackage"
        st.info(f"This analysis has no {kind} on this server: it {made}.", icon=":material/info:")
        if build is not None and build.spec.variant != "repeat_kv+fold":
            try:
                spec = build.spec.materialised()
                cost = estimate_builds([spec])
            except QfoldError as e:
                widgets.error(e, "Cannot rebuild it: ")
            else:
                st.markdown(f"A runnable package needs a **materialised build** of the same spec (the same analysis, "
                            f"with weight values): {cost.summary().removeprefix('~')} (estimated by "
                            f"analyzer/model/cost.py, {cost.error_text}). It runs in the background and waits its "
                            "turn; what it measured is shown here once it is done.")
                if st.button("Make a runnable package", key="export_materialise", icon=":material/build:",
                             disabled=spec.key in jobs_state.running_keys()):
                    jobs_state.start_job(BuildJob((spec,), builds_root(), estimate=cost))
                    st.toast(f"Queued the materialised build {spec.key}")
                export_job_status(spec.key)
                command = (f"qfold build --mode materialised --model {shlex.quote(spec.source.ref)} "
                           f"--variant {spec.variant} --ctx {spec.ctx}")  # a typed folder path: a code span
                st.caption(f"Or on the command line: {fmt.md(command)} (plus its `--set` overrides, phase and "
                           "compression).")
        else:
            st.caption("Build it on the Builds page (or rebuild the A/B pair at full size from the A/B page).")
    else:
        size = package_size_bytes(ref.package_path)
        zip_name = f"{stem}.mlpackage.zip"
        st.markdown(f"{fmt.md(ref.package_path)} — {fmt.size(size, 'auto-si', None)} ({fmt.size(size, 'auto', None)})")
        if size <= MAX_DOWNLOAD_PACKAGE_BYTES:
            download("Download the .mlpackage (zip)", partial(zip_package, ref.package_path, f"{stem}.mlpackage"),
                     zip_name, "application/zip", "export_package")
            st.caption(f"Zipped when you click (it unzips to `{stem}.mlpackage`); the zip is held in server memory "
                       "only while it downloads.")
        else:
            st.warning(f"Over {fmt.size(MAX_DOWNLOAD_PACKAGE_BYTES, 'auto-si', None)}: a browser download would hold "
                       "the whole zip in server memory, so zip it on the server and copy it from there:",
                       icon=":material/warning:")
            st.code(f"# on the server\n{zip_command(ref.package_path, zip_name)}\n"
                    f"# or copy the package folder from your machine\n"
                    f"scp -r {shlex.quote('SERVER:' + str(ref.package_path))} .", language="bash")
