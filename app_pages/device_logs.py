"""Device logs: upload or paste measured throughput (any format the importer reads, recognised by content), see
every rejected row and why, the accepted runs by phase, per-condition statistics, and map each log build label to
an analysis."""

from __future__ import annotations

import hashlib

import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.measure.logs import FORMATS, LogLimits, normalize_label, summarize
from analyzer.measure.placement import FORMATS as PLAN_FORMATS
from analyzer.measure.placement import parse_plan
from analyzer.report import bandwidth_figures as figures
from analyzer.report import frames
from analyzer.report.labels import same_model_analyses
from app_pages import analyses, logs_state, widgets
from app_pages.session_keys import Key

st.title("Device logs")
limit_mib = LogLimits().max_file_bytes / 2**20
st.caption("Upload or paste what a device measured: one row per run, in any format below (read by content, whatever "
           "the file is called). Each log adds to the ones shown; nothing is written to disk but this session's copy, "
           "which a reload keeps.")
with st.expander("Formats read, limits, placement plans"):
    st.markdown("\n".join(f"- {spec.description}" for spec in FORMATS.values()))
    st.caption(f"Up to {limit_mib:g} MiB per file. Placement plans (where a device ran each op) are read here too and "
               "offered on the A/B page's Placement tab:")
    st.markdown("\n".join(f"- {spec.description}" for spec in PLAN_FORMATS.values()))


def keep_uploads() -> None:
    """The uploader's files join the session's uploads (restored after a reload, they are no longer in the
    uploader); a file taken out of the uploader leaves them."""
    now = [(f.name, f.getvalue()) for f in st.session_state.get("logs_uploader") or []]
    before = st.session_state.get("logs_uploader_seen", [])
    kept = [f for f in st.session_state.get(Key.LOGS_UPLOADS, []) if f not in before or f in now]
    st.session_state[Key.LOGS_UPLOADS] = kept + [f for f in now if f not in kept]
    st.session_state["logs_uploader_seen"] = now
    logs_state.compose_logs()


def add_paste() -> None:
    """A paste is one more file, named ``pasted text N``, read exactly as an upload (kept in this session's store
    under that name, never as a path)."""
    text = st.session_state.get("logs_paste_text") or ""
    if not text.strip():
        return
    pasted = st.session_state.setdefault(Key.LOGS_PASTED, [])
    pasted.append((f"pasted text {len(pasted) + 1}", text.encode("utf-8")))
    st.session_state["logs_paste_text"] = ""
    logs_state.compose_logs()


def forget_own_logs() -> None:
    for key in (Key.LOGS_FILES, Key.LOGS_UPLOADS, Key.LOGS_PASTED, Key.LOGS_BENCH, Key.LOGS_PLANS):
        st.session_state[key] = []
    logs_state.compose_logs()


def keep_label(widget: str, key: str) -> None:
    """A device/build label for rows that name none, normalised as the importer normalises labels."""
    raw = st.session_state.get(widget) or ""
    label = normalize_label(raw)
    if label and any(ord(c) < 32 or c == "\x7f" for c in label):
        st.session_state[f"{key}_error"] = f"{raw!r} holds a control character; the label is not used"
        label = ""
    else:
        st.session_state.pop(f"{key}_error", None)
    st.session_state[key] = label or None


st.file_uploader("Upload device logs", accept_multiple_files=True, key="logs_uploader", on_change=keep_uploads)
with st.expander("Paste a table or runner output", expanded=bool(st.session_state.get(Key.LOGS_PASTED))):
    st.text_area("Pasted text", key="logs_paste_text", height=180,
                 placeholder="| model | size | params | backend | ngl | test | t/s |\n…\n\n"
                             "or the last lines a runner printed: llama_perf_context_print: eval time = …")
    st.button("Read the pasted text", key="logs_paste_add", on_click=add_paste, icon=":material/content_paste:")
left, right = st.columns(2)
left.text_input("Device, for rows that name none", key="logs_device_input", on_change=keep_label,
                args=("logs_device_input", Key.LOGS_DEVICE),
                help="llama-bench markdown and runner logs name no device; without a name the file name stands in.")
right.text_input("Build label, for rows that name none", key="logs_label_input", on_change=keep_label,
                 args=("logs_label_input", Key.LOGS_LABEL),
                 help="Runner logs name no build; the label can be mapped to an analysis below.")
for key in (Key.LOGS_DEVICE, Key.LOGS_LABEL):
    if st.session_state.get(f"{key}_error"):
        st.error(fmt.md_text(st.session_state[f"{key}_error"]), icon=":material/block:")

benched = st.session_state.get(Key.LOGS_BENCH) or []
if benched:
    st.info(f"{len(benched)} log(s) from bench runs on the Builds page ({', '.join(fmt.md(n) for n, _ in benched)}): "
            "Core AI builds timed on this machine's Core AI runtime, one row per build, under the build's own "
            "label, beside the uploaded logs.", icon=":material/timer:")
own = st.session_state.get(Key.LOGS_FILES) or []
with st.container(horizontal=True, gap="small", vertical_alignment="center"):
    if logs_state.example_shown():
        st.info("The write-up's published figures (`examples/writeup_device_logs.csv`: the identical-condition A/B, "
                "20.39 → 54.30 tok/s, and the device table) are shown" + (f" beside your {len(own)} log(s)." if own
                                                                          else ". Uploads and pastes add to them."),
                icon=":material/science:")
        st.button("Remove the example", key="logs_example_remove", icon=":material/delete:",
                  on_click=logs_state.set_example, args=(False,))
    else:
        st.caption("The write-up's example log is removed.")
        st.button("Show the example again", key="logs_example_add", icon=":material/science:",
                  on_click=logs_state.set_example, args=(True,))
    if own or st.session_state.get(Key.LOGS_PLANS):
        st.button("Remove my logs", key="logs_reset", icon=":material/clear_all:", on_click=forget_own_logs)

imported = logs_state.log_import()

plans = st.session_state.get(Key.LOGS_PLANS) or []
if plans:
    st.subheader("Placement plans")
    parsed = [parse_plan(data, name) for name, data in plans]
    widgets.show_table(pd.DataFrame([{"file": p.file_name, "format": p.format or "?", "accepted": p.accepted,
                                     "ops": len(p.ops), "functions": ", ".join(p.functions),
                                     "errors": len(p.errors), "warnings": len(p.issues) - len(p.errors)}
                                    for p in parsed]))
    issues = [i.describe() for p in parsed for i in p.issues]
    for line in issues[:20]:
        st.text(line)  # file names and values are user text: never markdown
    st.caption("Each plan is joined to an analysis on the **A/B** page's Placement tab (and in `qfold placement PLAN "
               "ANALYSIS`).")

# ---------------------------------------------------------------------------------------------- validation
st.subheader("Validation")
files = pd.DataFrame([{"file": f.file_name, "format": f.format or "?", "accepted": f.accepted, "records": f.n_records,
                       "accepted rows": f.n_accepted, "rejected rows": f.n_rejected, "skipped rows": f.n_skipped,
                       "derived fields": "; ".join(f.derived), "duplicate of": f.duplicate_of or ""}
                      for f in imported.files])
if len(files):
    widgets.show_table(files)
    st.caption("Derived fields are computed, not read: how each one was computed is listed here and per row below.")
for f in imported.files:
    if f.duplicate_of:
        st.info(f"{fmt.md(f.file_name)} is the same file as {fmt.md(f.duplicate_of)} (identical content): its runs "
                "are counted once.", icon=":material/content_copy:")
for name in imported.rejected_files:
    reasons = "; ".join(i.describe() for i in imported.errors if i.file_name == name)
    st.error(f"{fmt.md(name)} was rejected as a whole: {fmt.md_text(reasons)}", icon=":material/block:")
errors, warnings = len(imported.errors), len(imported.warnings)
if imported.issues:
    (st.warning if errors else st.info)(f"{errors} error(s) and {warnings} warning(s), row by row below. Rows with "
                                        "an error are left out; nothing is silently dropped or shifted.")
    issues = imported.issues_frame().rename(columns={"file_name": "file", "line": "row (line)", "message": "reason"})
    widgets.table_with_download(issues, "logs_issues_csv", "log_issues.csv", max_height=400)
else:
    st.success(f"Every row accepted ({len(imported.measurements)} runs), no warnings.")

# ---------------------------------------------------------------------------------------------- accepted runs
st.subheader("Accepted runs")
if not imported.measurements:
    st.warning("No accepted runs: fix the rows listed above, or go back to the example log.")
    st.stop()
by_phase = {phase: len(imported.by_phase(phase)) for phase in ("decode", "prefill", "mixed")}
st.caption(f"{by_phase['decode']} decode, {by_phase['prefill']} prefill and {by_phase['mixed']} mixed run(s). Only "
           "decode runs are fitted by the bandwidth model; mixed runs (a prompt and generation timed together) are "
           "fitted with neither.")
widgets.table_with_download(imported.measurements_frame(), "logs_accepted_csv", "accepted_runs.csv", max_height=300)

st.subheader("Per build, device and condition")
summary = frames.records_frame(summarize(imported.measurements, phase=None),
                               mean_s_per_token=lambda s: s.mean_s_per_token)
widgets.table_with_download(summary, "logs_summary_csv", "build_device_summary.csv",
                           caption="mean_tok_per_s is the harmonic mean of the runs (1 / mean seconds per token): the "
                                   "model is linear in time per token. Runs of different phase, context length, "
                                   "compute units, quantization or OS are never averaged together. std is the sample "
                                   "standard deviation of tok/s (n − 1); with one run it is reported as 0.")

# ---------------------------------------------------------------------------------------------- mapping
st.subheader("Map log builds to analyses")
st.caption("Each build label in the logs gets its graph bytes per token from the analysis chosen here; the Bandwidth "
           "page and the A/B page's measured tok/s use this mapping. A label maps by itself when it names a model, "
           "one variant (`repeat_kv`, `qfold`) and optionally a compression (`top8`) and ctx (`ctx4096`) that one "
           "analysis has (a build key maps to its build); otherwise it stays unmapped and says why.")
refs = analyses.analysis_refs()
by_id = analyses.refs_by_id(refs)
labels = list(dict.fromkeys(m.build for m in imported.measurements))
mapping = logs_state.log_mapping(labels, refs)
auto = logs_state.log_label_auto(labels, refs)
options = ["", *by_id]


def remember(label: str, widget: str) -> None:
    map_label(label, st.session_state[widget] or None)


def map_label(label: str, ref_id: str | None) -> None:
    st.session_state[Key.LOGS_MAPPING] = {**st.session_state.get(Key.LOGS_MAPPING, {}), label: ref_id}
    logs_state.persist()


for label in labels:
    widget = "logs_map_" + hashlib.sha256(label.encode()).hexdigest()[:12]  # labels are user text: never a key
    current = mapping.get(label) or ""
    if st.session_state.get(widget) != current:  # the mapping (restored, or mapped by a button) leads the picker
        st.session_state[widget] = current if current in options else ""
    st.selectbox(fmt.md(label), options, key=widget,
                 on_change=remember, args=(label, widget),
                 format_func=lambda i: by_id[i].label if i else logs_state.UNMAPPED)
    match = auto[label]
    if not current:
        st.caption(f"Not mapped: {fmt.md_text(match.reason)}. Pick an analysis to use its bytes.")
        contexts = logs_state.label_contexts().get(label, frozenset())
        offers = same_model_analyses(label, refs, contexts)
        if offers:
            with st.container(horizontal=True, gap="xsmall"):
                for ref in offers:
                    digest = hashlib.sha256(ref.id.encode()).hexdigest()[:8]
                    st.button(f"Map to {fmt.md_text(ref.label)}", key=f"{widget}_to_{digest}",
                              icon=":material/link:", on_click=map_label, args=(label, ref.id),
                              help="An analysis of the model this label names (the label names no single one).")
    elif current == match.ref_id:
        st.caption(f"Mapped by its label: {fmt.md_text(match.reason)}.")
    else:
        st.caption("Mapped by you" + (f" (by its label it would be: {fmt.md(by_id[match.ref_id].label)})"
                                      if match.ref_id in by_id else f" (by its label: {fmt.md_text(match.reason)})")
                   + ".")

# ---------------------------------------------------------------------------------------------- roof check
st.subheader("Held against the roof")
try:
    roofs = figures.roof_frame(logs_state.roof_rows(imported, logs_state.mapped_analyses(mapping, refs)))
except QfoldError as e:
    widgets.error(e, "Cannot load a mapped analysis: ")
    st.stop()
with_roof = roofs[roofs["roof_tok_per_s"].notna()]
st.caption("A decode row of a mapped build on a device with a cited bandwidth (analyzer/predict/device_profiles.csv) "
           "cannot beat that bandwidth ÷ the bytes its build must read per token (weights + the KV read at the row's "
           "context): `above_roof` rows are impossible there and left out of the fits; `far_below_roof` rows are "
           f"under a tenth of it. {len(with_roof)} of {len(roofs)} row(s) have a roof; the others say why not below.")
if len(with_roof):
    widgets.table_with_download(with_roof, "logs_roof_csv", "roof_check.csv", max_height=300)
for flag, shown in (("above_roof", st.error), ("far_below_roof", st.warning)):
    n = int(roofs["flags"].str.contains(flag).sum())
    if n:
        shown(f"{n} row(s) `{flag}`: see their roof, bytes and bandwidth in the table.", icon=":material/speed:")
with st.expander("Rows without a roof, and why"):
    widgets.show_table(roofs[roofs["roof_tok_per_s"].isna()][["file", "line", "device", "build", "phase", "why"]],
                       max_height=260)
