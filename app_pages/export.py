"""Export: the A/B as a one-file HTML report, one analysis as JSON and CSV tables, and its Core ML package
(zipped when small; a full-size package is served as a server path and a command instead)."""

from __future__ import annotations

import json
import shlex
from functools import partial

import streamlit as st

from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.fmt import MB, to_csv
from analyzer.graph.accounting import OP_COLUMNS
from analyzer.graph.record import Analysis
from analyzer.report import figures
from analyzer.report.assumptions import assumption_notes
from analyzer.report.report import MAX_DOWNLOAD_PACKAGE_BYTES, build_report, package_size_bytes, zip_package
from app_pages import shared

st.title("Export")
refs = shared.analysis_refs()
by_id = shared.refs_by_id(refs)
pair = shared.ab_pair(refs)
if pair is None:
    st.warning("No analyses yet: make a build on the Builds page first.")
    st.stop()
ref_a, ref_b = pair
try:
    analysis_a, analysis_b = shared.load(ref_a), shared.load(ref_b)
except QfoldError as e:
    st.error(f"Cannot load the analysis: {e}")
    st.stop()


def ops_csv(analysis: Analysis) -> str:
    """Every op's bytes per token (run when clicked, in Streamlit's download thread: no st calls here)."""
    return to_csv(analysis.account.op_rows(), OP_COLUMNS)


def download(label: str, data, file_name: str, mime: str, key: str) -> None:
    """Generated when clicked (``data`` is a callable), so a page view never builds files nobody asked for."""
    st.download_button(label, data, file_name=file_name, mime=mime, key=key, icon=":material/download:",
                       on_click="ignore")


# ---------------------------------------------------------------------------------------------- report
with st.container(border=True):
    st.subheader("A/B report")
    bw_mb_s = float(st.session_state.get("ab_bw_mb_s", shared.DEFAULT_BW_MB_S))
    label_a, label_b = shared.short_label(ref_a), shared.short_label(ref_b)
    st.markdown(f"One HTML file, readable offline (plotly.js is embedded): headline, waterfall, op counts, tiles, "
                f"bytes per layer with their tables, and the bandwidth cross-check of this session's device logs.\n\n"
                f"- A: {ref_a.label}\n- B: {ref_b.label}\n- bandwidth for predictions: {bw_mb_s:,.0f} MB/s "
                f"(set on the A/B page)\n- compressed weights charged: {shared.weight_charge()} (set on the A/B page)")
    try:
        section = shared.bandwidth_section(refs, bw_mb_s * MB)
    except (QfoldError, ValueError) as e:
        st.warning(f"The report leaves out the bandwidth section: {e}")
        section = None

    def report_html() -> bytes:
        return build_report(analysis_a, analysis_b, label_a=f"{label_a}: {ref_a.label}",
                            label_b=f"{label_b}: {ref_b.label}", bw_bytes_per_s=bw_mb_s * MB,
                            bandwidth=section).encode("utf-8")

    download("Download the HTML report", report_html, "qfold_ab_report.html", "text/html", "export_report")

# ---------------------------------------------------------------------------------------------- one analysis
with st.container(border=True):
    st.subheader("One analysis")
    ref_id = shared.persisted_selectbox("Analysis", list(by_id), "export_ref", default=ref_a.id,
                                        format_func=lambda i: by_id[i].label)
    ref = by_id[ref_id]
    try:
        analysis = shared.load(ref)
    except QfoldError as e:
        st.error(str(e))
        st.stop()
    stem = (ref.variant or ref.path.stem) + ("" if ref.kind == "shipped" else f"_{ref.kind}")
    total = analysis.bytes_per_token.total
    st.markdown(f"{analysis.summary.total_ops:,} ops · {analysis.summary.tile_count} tile ops · "
                f"{fmt.mib(total)} ({fmt.mb(total)}) per token")
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
        download("Bytes per token (CSV)", shared.frame_csv(figures.bytes_per_token_frame(analysis)),
                 f"{stem}_bytes_per_token.csv", "text/csv", "export_bytes")
        download("Bytes per layer (CSV)", shared.frame_csv(figures.bytes_by_layer_frame(analysis)),
                 f"{stem}_bytes_by_layer.csv", "text/csv", "export_layers")
    with c3:
        download("Tile ops (CSV)", shared.frame_csv(figures.tile_frame(analysis)), f"{stem}_tiles.csv", "text/csv",
                 "export_tiles")
    st.caption("CSV cells that a spreadsheet would run as a formula (starting with = + - @ | %, a tab or NUL) are "
               "escaped with a leading apostrophe.")

# ---------------------------------------------------------------------------------------------- package
with st.container(border=True):
    st.subheader("Core ML package")
    if ref.package_path is None or not ref.package_path.is_dir():
        st.info("This analysis has no .mlpackage on this server (shipped analyses carry none: no weights). "
                "Build it on the Builds page, or with the CLI, e.g. "
                "`python -m analyzer build --variant qfold --ctx 4096`.")
    else:
        size = package_size_bytes(ref.package_path)
        st.markdown(f"`{ref.package_path}` — {fmt.mb(size)} ({fmt.mib(size)})")
        if size <= MAX_DOWNLOAD_PACKAGE_BYTES:
            download("Download the .mlpackage (zip)", partial(zip_package, ref.package_path),
                     f"{stem}.mlpackage.zip", "application/zip", "export_package")
        else:
            st.warning(f"Over {fmt.mb(MAX_DOWNLOAD_PACKAGE_BYTES, 0)}: a browser download would hold it in server "
                       "memory for the session, so copy it from the server instead.", icon=":material/warning:")
            parent, name = shlex.quote(str(ref.package_path.parent)), shlex.quote(ref.package_path.name)
            st.code(f"# on the server\ncd {parent} && zip -qr /tmp/{shlex.quote(stem)}.mlpackage.zip {name}\n"
                    f"# or, from your machine\nscp -r {shlex.quote('SERVER:' + str(ref.package_path))} .",
                    language="bash")
