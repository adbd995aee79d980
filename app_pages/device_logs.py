"""Device logs: upload measured throughput (qfold CSV or llama-bench), see every rejected row and why, the
accepted runs, per-(build, device) statistics, and map each log build label to an analysis."""

from __future__ import annotations

import hashlib
from dataclasses import asdict

import pandas as pd
import streamlit as st

from analyzer.device.logs import KNOWN_COLUMNS, REQUIRED_COLUMNS, LogLimits, summarize
from app_pages import shared

st.title("Device logs")
limit_mib = LogLimits().max_file_bytes / 2**20
st.caption(f"One row per measured run. Required columns: {', '.join(f'`{c}`' for c in REQUIRED_COLUMNS)}; optional: "
           f"{', '.join(f'`{c}`' for c in KNOWN_COLUMNS if c not in REQUIRED_COLUMNS)}. llama.cpp `llama-bench` "
           f"CSV / JSON / JSONL is read as well. Up to {limit_mib:g} MiB per file; nothing is written to disk.")


def keep_uploads() -> None:
    """Uploads live in session state (the uploader forgets them when another page is shown)."""
    files = st.session_state.get("logs_uploader") or []
    st.session_state["logs_files"] = [(f.name, f.getvalue()) for f in files]


st.file_uploader("Upload device logs", type=["csv", "json", "jsonl"], accept_multiple_files=True,
                 key="logs_uploader", on_change=keep_uploads)
if shared.using_example_log():
    st.info("Showing the write-up's published figures (`examples/writeup_device_logs.csv`): the identical-condition "
            "A/B (20.39 → 54.30 tok/s) and the device table. Upload logs to replace them.",
            icon=":material/science:")
elif st.button("Back to the example log", key="logs_reset"):
    st.session_state["logs_files"] = []
    st.rerun()

imported = shared.log_import()

# ---------------------------------------------------------------------------------------------- validation
st.subheader("Validation")
files = pd.DataFrame([{"file": f.file_name, "format": f.format or "?", "accepted": f.accepted, "records": f.n_records,
                       "accepted rows": f.n_accepted, "rejected rows": f.n_rejected, "skipped rows": f.n_skipped}
                      for f in imported.files])
if len(files):
    st.dataframe(files, hide_index=True, width="stretch")
for name in imported.rejected_files:
    reasons = "; ".join(i.describe() for i in imported.errors if i.file_name == name)
    st.error(f"**{name}** was rejected as a whole: {reasons}", icon=":material/block:")
errors, warnings = len(imported.errors), len(imported.warnings)
if imported.issues:
    (st.warning if errors else st.info)(f"{errors} error(s) and {warnings} warning(s), row by row below. Rows with "
                                        "an error are left out; nothing is silently dropped or shifted.")
    issues = imported.issues_frame().rename(columns={"file_name": "file", "line": "row (line)", "message": "reason"})
    shared.table_with_download(issues, "logs_issues_csv", "log_issues.csv", max_height=400)
else:
    st.success(f"Every row accepted ({len(imported.measurements)} runs), no warnings.")

# ---------------------------------------------------------------------------------------------- accepted runs
st.subheader("Accepted runs")
if not imported.measurements:
    st.warning("No accepted runs: fix the rows listed above, or go back to the example log.")
    st.stop()
shared.table_with_download(imported.measurements_frame(), "logs_accepted_csv", "accepted_runs.csv", max_height=300)

st.subheader("Per build and device")
summary = pd.DataFrame([asdict(s) for s in summarize(imported.measurements)])
shared.table_with_download(summary, "logs_summary_csv", "build_device_summary.csv",
                           caption="std is the sample standard deviation (n − 1); with one run it is reported as 0.")

# ---------------------------------------------------------------------------------------------- mapping
st.subheader("Map log builds to analyses")
st.caption("Each build label in the logs gets its graph bytes per token from the analysis chosen here; the Bandwidth "
           "page uses this mapping. Labels that name a variant (`…-repeat_kv-…`, `…-qfold-…`) start mapped to that "
           "side of the default A/B pair.")
refs = shared.analysis_refs()
by_id = shared.refs_by_id(refs)
labels = list(dict.fromkeys(m.build for m in imported.measurements))
mapping = shared.log_mapping(labels, refs)
options = ["", *by_id]


def remember(label: str, widget: str) -> None:
    st.session_state["logs_mapping"] = {**st.session_state.get("logs_mapping", {}),
                                        label: st.session_state[widget] or None}


for label in labels:
    widget = "logs_map_" + hashlib.sha256(label.encode()).hexdigest()[:12]  # labels are user text: never a key
    current = mapping.get(label) or ""
    st.selectbox(label, options, index=options.index(current) if current in options else 0, key=widget,
                 on_change=remember, args=(label, widget),
                 format_func=lambda i: by_id[i].label if i else shared.UNMAPPED)
