"""Sweeps: define or load a sweep, follow it row by row while Ray builds it, and see predicted tok/s and bytes per
token against context length, one line per variant/compression, with the measured log points overlaid."""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.model.sources import DEFAULT_PRESET, preset_names
from analyzer.predict.profiles import DEFAULT_PROFILE, load_profiles
from analyzer.report import frames
from analyzer.report import sweep_figures as sf
from analyzer.report.catalog import builds_root
from analyzer.sweep.driver import RayOptions, SweepJob
from analyzer.sweep.grid import SweepError, make_spec, read_spec_file
from analyzer.sweep.table import FINISHED, read_table
from app_pages import logs_state, widgets

st.title("Sweeps")
st.caption("A sweep builds every model × compression × variant × context length × phase on Ray (a local cluster, or "
           "`qfold sweep --address …` for a real one) into the same builds/ as single builds. One graph at four or "
           "more context lengths costs three conversions: the other points are derived from them (every tensor size "
           "is affine in ctx; the law is checked op for op on the third) and drawn as open markers. "
           "Predicted tok/s = the device profile's bandwidth ÷ the graph's bytes per token. MB = 10^6 bytes.")

profiles = load_profiles()
source = st.radio("Sweep", ["define", "load a table"], horizontal=True, key="sweeps_source")

table = None
if source == "define":
    with st.form("sweeps_define"):
        c1, c2 = st.columns(2)
        models = c1.multiselect("Models", preset_names(), default=[DEFAULT_PRESET], key="sweeps_models")
        ctx_text = c1.text_input("Context lengths", "512,1024,2048,4096", key="sweeps_ctx")
        variants = c1.multiselect("Variants", ["repeat_kv", "qfold"], default=["repeat_kv", "qfold"],
                                  key="sweeps_variants")
        phases = c1.multiselect("Phases", ["decode", "prefill"], default=["decode"], key="sweeps_phases",
                                help="decode: one token per call; prefill: the prompt tokens per call below "
                                     "(compute-bound, so its tok/s comes from the roofline where the profile "
                                     "has a peak FLOP/s)")
        q_len = c1.number_input("Prompt tokens per prefill call", 1, 4096, 64, key="sweeps_q_len")
        compressions = c2.text_area("Compressions (one spec per line; none = fp16)", "none", key="sweeps_comp")
        structure = c2.toggle("Structure sizes (same tiles, ~20× cheaper)", value=True, key="sweeps_structure")
        device = c2.selectbox("Device profile", list(profiles), index=list(profiles).index(DEFAULT_PROFILE),
                              format_func=lambda k: profiles[k].label, key="sweeps_device")
        spec_file = st.file_uploader("…or a spec file (.toml / .json)", type=["toml", "json"], key="sweeps_spec")
        submitted = st.form_submit_button("Run the sweep", type="primary")
    if submitted:
        try:
            if spec_file is not None:
                with tempfile.TemporaryDirectory() as tmp:  # the upload's name never becomes a path of ours
                    path = Path(tmp) / ("spec.toml" if spec_file.name.endswith(".toml") else "spec.json")
                    path.write_bytes(spec_file.getvalue())
                    spec, _out = read_spec_file(path)
            else:
                spec = make_spec({"model": models, "ctx": [ctx_text], "variant": variants, "phase": phases,
                                  "q_len": int(q_len),
                                  "compression": [c for c in compressions.splitlines() if c.strip()],
                                  "structure": structure, "device": device})
            st.session_state["sweeps_job"] = SweepJob(spec, builds_root(),
                                                      ray_options=RayOptions(num_cpus=None)).start()
        except QfoldError as e:
            widgets.error(e)

    job: SweepJob | None = st.session_state.get("sweeps_job")
    if job is None:
        st.info("Define a sweep and run it, or load a sweep table (`qfold sweep … --out TABLE.csv`).")
        st.stop()

    @st.fragment(run_every="2s")
    def follow() -> None:
        rows, finished, error, messages = job.snapshot()
        done = sum(r.status in (*FINISHED, "failed") for r in rows)
        st.progress(done / max(len(rows), 1), text=f"{done} of {len(rows)} points"
                    + (f" · {fmt.md_text(messages[-1])}" if messages and not finished else ""))
        if error:
            widgets.error(error)
        widgets.show_table(sf.progress_frame(rows), key="sweeps_live")
        if finished and not st.session_state.get(f"sweeps_done_{job.id}"):
            st.session_state[f"sweeps_done_{job.id}"] = True
            st.rerun()

    follow()
    rows, finished, _error, _messages = job.snapshot()
    table = sf.sweep_frame(rows)
else:
    upload = st.file_uploader("A sweep table (.csv, .json, .parquet)", type=["csv", "json", "parquet"],
                              key="sweeps_table")
    if upload is None:
        st.info("Upload the table `qfold sweep … --out TABLE` wrote.")
        st.stop()
    suffix = "." + upload.name.rsplit(".", 1)[-1].lower()
    try:
        table = sf.sweep_frame(read_table(f"table{suffix}", upload.getvalue()))
    except SweepError as e:
        widgets.error(e)
        st.stop()

if table is None or table.empty:
    st.info("No finished point yet.")
    st.stop()

imported = logs_state.log_import()
measured = sf.measured_frame(imported.measurements)
profile_keys = {str(k) for k in table["device_profile"].dropna()}
profile_label = profiles[next(iter(profile_keys))].label if len(profile_keys) == 1 and \
    next(iter(profile_keys)) in profiles else ""
st.subheader("Predicted tok/s vs context length")
st.plotly_chart(sf.tok_per_s_figure(table, measured, profile_label), key="sweeps_tok")
st.subheader("Bytes per token vs context length")
st.plotly_chart(sf.bytes_figure(table), key="sweeps_bytes")
if table["bytes_weights"].notna().any():
    st.caption("Structure-size builds keep the layers and attention geometry but shrink the weights: their KV and "
               "tile bytes are exact, their weight bytes (and so absolute tok/s) are not the full model's.")

st.subheader("The numbers behind the charts")
widgets.show_table(table, key="sweeps_table_view")
st.download_button("Download the sweep points (CSV)", frames.frame_csv(table), "sweep_points.csv", "text/csv",
                   key="sweeps_dl_points")
if len(measured):
    widgets.show_table(measured, key="sweeps_measured_view")
    st.download_button("Download the measured points (CSV)", frames.frame_csv(measured), "sweep_measured.csv",
                       "text/csv", key="sweeps_dl_measured")
