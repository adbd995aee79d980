"""Sweeps: define or load a sweep, follow it row by row while Ray builds it, and see predicted tok/s and bytes per
token against context length, one line per variant/compression, with the measured log points overlaid."""

from __future__ import annotations

import streamlit as st

from analyzer.device.profiles import DEFAULT_PROFILE, load_profiles
from analyzer.device.sweep import RayOptions, SweepJob
from analyzer.device.sweep_spec import SweepError, make_spec, read_spec_file
from analyzer.device.sweep_table import read_table
from analyzer.errors import QfoldError
from analyzer.model.sources import DEFAULT_PRESET, preset_names
from analyzer.report import sweep_figures as sf
from app_pages import shared

st.title("Sweeps")
st.caption("A sweep builds every model × compression × variant × context length on Ray (a local cluster, or "
           "`python -m analyzer sweep --address …` for a real one) into the same builds/ as single builds. "
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
        compressions = c2.text_area("Compressions (one spec per line; none = fp16)", "none", key="sweeps_comp")
        structure = c2.toggle("Structure sizes (same tiles, ~20× cheaper)", value=True, key="sweeps_structure")
        device = c2.selectbox("Device profile", list(profiles), index=list(profiles).index(DEFAULT_PROFILE),
                              format_func=lambda k: profiles[k].label, key="sweeps_device")
        spec_file = st.file_uploader("…or a spec file (.toml / .json)", type=["toml", "json"], key="sweeps_spec")
        submitted = st.form_submit_button("Run the sweep", type="primary")
    if submitted:
        try:
            if spec_file is not None:
                import tempfile
                from pathlib import Path

                with tempfile.TemporaryDirectory() as tmp:  # the upload's name never becomes a path of ours
                    path = Path(tmp) / ("spec.toml" if spec_file.name.endswith(".toml") else "spec.json")
                    path.write_bytes(spec_file.getvalue())
                    spec, _out = read_spec_file(path)
            else:
                spec = make_spec({"model": models, "ctx": [ctx_text], "variant": variants,
                                  "compression": [c for c in compressions.splitlines() if c.strip()],
                                  "structure": structure, "device": device})
            st.session_state["sweeps_job"] = SweepJob(spec, shared.builds_root(),
                                                      ray_options=RayOptions(num_cpus=None)).start()
        except QfoldError as e:
            shared.error(e)

    job: SweepJob | None = st.session_state.get("sweeps_job")
    if job is None:
        st.info("Define a sweep and run it, or load a sweep table (`python -m analyzer sweep … --out TABLE.csv`).")
        st.stop()

    @st.fragment(run_every="2s")
    def follow() -> None:
        rows, finished, error, messages = job.snapshot()
        done = sum(r.status in ("built", "reused", "failed") for r in rows)
        st.progress(done / max(len(rows), 1), text=f"{done} of {len(rows)} points"
                    + (f" · {messages[-1]}" if messages and not finished else ""))
        if error:
            shared.error(error)
        shared.show_table(sf.progress_frame(rows), key="sweeps_live")
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
        st.info("Upload the table `python -m analyzer sweep … --out TABLE` wrote.")
        st.stop()
    suffix = "." + upload.name.rsplit(".", 1)[-1].lower()
    try:
        table = sf.sweep_frame(read_table(f"table{suffix}", upload.getvalue()))
    except SweepError as e:
        shared.error(e)
        st.stop()

if table is None or table.empty:
    st.info("No finished point yet.")
    st.stop()

imported = shared.log_import()
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
shared.show_table(table, key="sweeps_table_view")
st.download_button("Download the sweep points (CSV)", shared.frame_csv(table), "sweep_points.csv", "text/csv",
                   key="sweeps_dl_points")
if len(measured):
    shared.show_table(measured, key="sweeps_measured_view")
    st.download_button("Download the measured points (CSV)", shared.frame_csv(measured), "sweep_measured.csv",
                       "text/csv", key="sweeps_dl_measured")
