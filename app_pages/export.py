"""Export: the A/B as a one-file HTML report, one analysis as JSON and CSV tables, and its Core ML package
(zipped when small; a full-size package is served as a server path and a command instead)."""

from __future__ import annotations

import json
import shlex
from functools import partial

import streamlit as st

from analyzer.build.builds import ANALYSIS_MODE, MATERIALISED_MODE, materialised_spec
from analyzer.build.costs import analysis_weight_bytes, estimate_cost
from analyzer.build.jobs import BuildJob
from analyzer.errors import QfoldError
from analyzer.fmt import MB, MIB, to_csv
from analyzer.graph.accounting import OP_COLUMNS, account
from analyzer.graph.record import program_from_json
from analyzer.report import figures
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
    doc_a, doc_b = shared.load_doc(ref_a), shared.load_doc(ref_b)
except QfoldError as e:
    st.error(f"Cannot load the analysis: {e}")
    st.stop()


def ops_csv(doc: dict) -> str:
    """Every op's bytes per token (run when clicked, in Streamlit's download thread: no st calls here)."""
    return to_csv(account(program_from_json(doc["program"])).op_rows(), OP_COLUMNS)


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
                "(set on the A/B page)")
    try:
        section = shared.bandwidth_section(refs, bw_mb_s * MB)
    except (QfoldError, ValueError) as e:
        st.warning(f"The report leaves out the bandwidth section: {e}")
        section = None

    def report_html() -> bytes:
        return build_report(doc_a, doc_b, label_a=f"{label_a}: {ref_a.label}", label_b=f"{label_b}: {ref_b.label}",
                            bw_bytes_per_s=bw_mb_s * MB, bandwidth=section).encode("utf-8")

    download("Download the HTML report", report_html, "qfold_ab_report.html", "text/html", "export_report")

# ---------------------------------------------------------------------------------------------- one analysis
with st.container(border=True):
    st.subheader("One analysis")
    ref_id = shared.persisted_selectbox("Analysis", list(by_id), "export_ref", default=ref_a.id,
                                        format_func=lambda i: by_id[i].label)
    ref = by_id[ref_id]
    try:
        doc = shared.load_doc(ref)
    except QfoldError as e:
        st.error(str(e))
        st.stop()
    stem = (ref.variant or ref.path.stem) + ("" if ref.kind == "shipped" else f"_{ref.kind}")
    b = doc["bytes"]["bytes_per_token"]
    st.markdown(f"{doc['summary']['total_ops']:,} ops · {doc['summary']['tile_count']} tile ops · "
                f"{b['total'] / MIB:,.1f} MiB ({b['total'] / MB:,.1f} MB) per token")
    c1, c2, c3 = st.columns(3)
    with c1:
        download("analysis.json", partial(lambda d: json.dumps(d, separators=(",", ":")).encode(), doc),
                 f"{stem}.analysis.json", "application/json", "export_json")
        download("Op table (CSV)", partial(ops_csv, doc), f"{stem}_ops.csv", "text/csv", "export_ops")
    with c2:
        download("Bytes per token (CSV)", shared.frame_csv(figures.bytes_per_token_frame(doc)),
                 f"{stem}_bytes_per_token.csv", "text/csv", "export_bytes")
        download("Bytes per layer (CSV)", shared.frame_csv(figures.bytes_by_layer_frame(doc)),
                 f"{stem}_bytes_by_layer.csv", "text/csv", "export_layers")
    with c3:
        download("Tile ops (CSV)", shared.frame_csv(figures.tile_frame(doc)), f"{stem}_tiles.csv", "text/csv",
                 "export_tiles")
    st.caption("CSV cells that a spreadsheet would run as a formula (starting with = + - @ | %, a tab or NUL) are "
               "escaped with a leading apostrophe.")

# ---------------------------------------------------------------------------------------------- package
with st.container(border=True):
    st.subheader("Core ML package")
    if ref.package_path is None or not ref.package_path.is_dir():
        made = ("was made in analysis mode (value-free weights: shapes and dtypes, no values)"
                if doc.get("build_mode") == ANALYSIS_MODE else "carries no weights (shipped analyses never do)")
        st.info(f"This analysis has no .mlpackage on this server: it {made}.", icon=":material/info:")
        if doc.get("spec"):
            try:
                spec = materialised_spec(doc["spec"])
            except QfoldError as e:
                st.error(f"Cannot rebuild it: {e}")
            else:
                cost = estimate_cost(MATERIALISED_MODE, analysis_weight_bytes(doc))
                st.markdown(f"A runnable package needs a **materialised build** of the same spec (same analysis, "
                            f"with weight values): {cost.summary()}, estimated from {cost.source}. It runs in "
                            "the background and waits its turn; the package then appears here.")
                if st.button("Make a runnable package", key="export_materialise", icon=":material/build:",
                             disabled=spec.key in shared.running_keys()):
                    shared.start_job(BuildJob((spec,), shared.builds_root()))
                    st.toast(f"Queued the materialised build {spec.key}")
                st.caption(f"Or on the command line: `python -m analyzer build --mode materialised --model "
                           f"{spec.source.ref} --variant {spec.variant} --ctx {spec.ctx}` (plus its `--set` "
                           "overrides and compression).")
    else:
        size = package_size_bytes(ref.package_path)
        st.markdown(f"`{ref.package_path}` — {size / MB:,.1f} MB ({size / MIB:,.1f} MiB)")
        if size <= MAX_DOWNLOAD_PACKAGE_BYTES:
            download("Download the .mlpackage (zip)", partial(zip_package, ref.package_path),
                     f"{stem}.mlpackage.zip", "application/zip", "export_package")
        else:
            st.warning(f"Over {MAX_DOWNLOAD_PACKAGE_BYTES / MB:,.0f} MB: a browser download would hold it in server "
                       "memory for the session, so copy it from the server instead.", icon=":material/warning:")
            parent, name = shlex.quote(str(ref.package_path.parent)), shlex.quote(ref.package_path.name)
            st.code(f"# on the server\ncd {parent} && zip -qr /tmp/{shlex.quote(stem)}.mlpackage.zip {name}\n"
                    f"# or, from your machine\nscp -r {shlex.quote('SERVER:' + str(ref.package_path))} .",
                    language="bash")
