"""Decode and prefill of A and B side by side on a device's two roofs: tiles, bytes, FLOPs, the bound, time per
call, time to first token, and the roofline chart. The A/B page calls :func:`ab_section` from its tab."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.analysis.record import Analysis
from analyzer.errors import QfoldError
from analyzer.fmt import MB, MIB
from analyzer.model.spec import PHASES
from analyzer.predict.profiles import load_profiles
from analyzer.predict.roofline import Roof, time_to_first_token
from analyzer.report import frames
from analyzer.report import roofline_figures as rf
from analyzer.report.bandwidth_setting import ResolvedBandwidth
from analyzer.report.catalog import AnalysisRef
from analyzer.report.siblings import nearest_phase_sibling
from app_pages import analyses, widgets

DEFAULT_ROOF_PROFILE = "m5-ane"  # both roofs measured (ANEMLL): analyzer/predict/device_profiles.csv
DEFAULT_PROMPT_TOKENS = 512


def _side(ref: AnalysisRef, refs: Sequence[AnalysisRef]) -> tuple[list[Analysis], list[str], list[str]]:
    """The decode and prefill analyses of one side (those that exist), the phases it lacks, and what a nearest
    sibling differs in (``analyzer.report.siblings``: the shipped fp16 prefill of a top8 decode)."""
    found, missing, notes = [], [], []
    for phase in PHASES:
        sibling = nearest_phase_sibling(ref, phase, refs)
        if sibling is None:
            missing.append(phase)
            continue
        found.append(analyses.load(sibling.ref))
        if sibling.differences:
            notes.append(f"its {phase} is {fmt.md(sibling.ref.label)} ({'; '.join(sibling.differences)}): there is "
                         f"no {phase} analysis of exactly its spec. Compression changes neither FLOPs nor tiles nor KV "
                         f"bytes; that row's weight bytes are those of the {phase} analysis.")
    return found, missing, notes


def _display(frame: pd.DataFrame) -> pd.DataFrame:
    """The phase table in MiB, GFLOP and ms for the screen (the CSV keeps bytes, FLOPs and seconds)."""
    return pd.DataFrame({
        "side": frame["side"], "phase": frame["phase"], "tokens/call": frame["tokens_per_call"],
        "KV tiles": frame["kv_replication_tiles"], "MiB/call": frame["bytes_per_call"] / MIB,
        "MB/token": frame["bytes_per_token"] / MB, "GFLOP/call": frame["flops_per_call"] / 1e9,
        "GFLOP/token": frame["flops_per_token"] / 1e9, "FLOP/byte": frame["intensity_flops_per_byte"],
        "bound": frame["bound"], "ms/call": frame["time_per_call_s"] * 1e3, "tok/s": frame["tok_per_s"],
    })


def ab_section(ref_a: AnalysisRef, ref_b: AnalysisRef, label_a: str, label_b: str,
               refs: Sequence[AnalysisRef], bw: ResolvedBandwidth) -> None:
    """The tab's content. Its bandwidth starts at the page's one setting (``bw``: the headline's), so the headline
    and the roofline predict from one bandwidth unless it is edited here, and the tab says which it uses."""
    st.markdown("Each function of A and B on a device's two roofs: time per call = max(bytes ÷ BW, FLOPs ÷ peak), "
                "the larger term naming the bound. Decode reads every weight for one token (memory-bound); a prefill "
                "call reads them once for N prompt tokens, so its FLOPs per byte grow with N until compute binds.")
    profiles = {k: p for k, p in load_profiles().items() if p.has_compute_roof}
    c1, c2, c3, c4 = st.columns([4, 2, 2, 2], vertical_alignment="bottom")
    with c1:
        key = widgets.persisted_selectbox("Compute roof (peak FLOP/s of)", list(profiles), "ab_roof_profile",
                                         default=DEFAULT_ROOF_PROFILE, format_func=lambda k: profiles[k].label)
    profile = profiles[key]
    # Keyed by the page's setting: a new setting starts the field again from it.
    bw_gb_s = c2.number_input("Bandwidth (GB/s)", min_value=0.1, max_value=10_000.0, value=bw.bytes_per_s / 1e9,
                              key=f"ab_roof_bw_{round(bw.bytes_per_s)}",
                              help=f"The page's bandwidth setting ({bw.label}: {bw.source}), as the headline uses "
                                   f"it. GB = 10^9 bytes. {profile.device}'s own: {fmt.bandwidth(profile.bytes_per_s)} "
                                   f"({profile.kind}: {profile.source}). Edit to try another.")
    peak_tflops = c3.number_input("Peak (TFLOP/s)", min_value=0.01, max_value=10_000.0,
                                  value=(profile.flops_per_s or 0) / 1e12, key=f"ab_roof_peak_{key}",
                                  help=f"{profile.flops_kind}: {profile.flops_source}")
    prompt = int(c4.number_input("Prompt tokens (TTFT)", min_value=1, max_value=1 << 20,
                                 value=DEFAULT_PROMPT_TOKENS, step=64, key="ab_roof_prompt"))
    bw_edited = bw_gb_s * 1e9 != bw.bytes_per_s
    peak_edited = peak_tflops * 1e12 != profile.flops_per_s
    bw_said = f"{fmt.bandwidth(bw_gb_s * 1e9)} (edited here)" if bw_edited else f"{bw.label} (the page's setting)"
    roof = Roof(f"{bw_said}, {profile.device} {profile.unit} peak" + (" (edited)" if peak_edited else ""),
                bw_gb_s * 1e9, peak_tflops * 1e12)
    edited = bw_edited or peak_edited
    try:
        (found_a, missing_a, notes_a), (found_b, missing_b, notes_b) = _side(ref_a, refs), _side(ref_b, refs)
    except QfoldError as e:
        st.error(fmt.md_text(f"Cannot load a phase of A or B: {e}"))
        return
    points = rf.phase_points("A", label_a, found_a, roof) + rf.phase_points("B", label_b, found_b, roof)
    for side, notes in (("A", notes_a), ("B", notes_b)):
        for note in notes:
            st.caption(f"{side}: {note}")
    for side, missing in (("A", missing_a), ("B", missing_b)):
        if "prefill" in missing:
            st.info(f"{side} has no prefill analysis of the same model and variant: build one on the Builds page "
                    "with Phase set to \"both, one package with shared weights\" (or \"prefill\") and the prompt "
                    "tokens per call.", icon=":material/info:")
        if "decode" in missing:
            st.info(f"{side} has no decode analysis of the same model and variant: build one on the Builds page "
                    "with Phase set to \"decode\".", icon=":material/info:")
    frame = rf.phase_frame(points)
    st.markdown(f"**Decode and prefill side by side** at {fmt.md_text(roof.label)}: "
                f"{fmt.bandwidth(roof.bytes_per_s)}, {roof.flops_per_s / 1e12:,.2f} TFLOP/s, ridge at "
                f"{roof.ridge_flops_per_byte:,.0f} FLOP/byte. "
                "Per token = per call ÷ tokens per call (per prompt token for a prefill).")
    widgets.table_with_download(frame, "ab_phases_csv", "decode_prefill_roofline.csv", display=_display(frame),
                               caption="KV tiles = kv_replication tiles; bytes are logical (the programs' tensor "
                                       "shapes: MIL for Core ML, MLIR for Core AI); FLOPs: a multiply-add = 2 "
                                       "(conventions in analyzer/analysis/flops.py).")
    if len(frame):
        st.plotly_chart(rf.roofline_figure(frame, roof), key="ab_roofline_chart")
    ttft = []
    for side, label in (("A", label_a), ("B", label_b)):
        calls = {p.call.phase: p.call for p in points if p.side == side}
        if calls:
            ttft.append((side, label, time_to_first_token(prompt, calls.get("prefill"), calls.get("decode"))))
    if ttft:
        t = rf.ttft_frame(ttft)
        st.markdown(f"**Predicted time to first token** for a {prompt:,}-token prompt, and decode tok/s")
        for row in t.itertuples():
            decode = next((p.call for p in points if p.side == row.side and p.call.phase == "decode"), None)
            rate = f"; decode {decode.tok_per_s:,.1f} tok/s ({decode.bound}-bound)" if decode else ""
            st.markdown(f"- {row.side} ({fmt.md(row.label)}): **{row.seconds * 1e3:,.1f} ms** = {row.how}{rate}")
        st.download_button("Download CSV", frames.frame_csv(t), "time_to_first_token.csv", "text/csv",
                           key="ab_ttft_csv", icon=":material/download:", on_click="ignore")
    st.caption(f"Bandwidth: {'typed here' if bw_edited else f'the page setting, {bw.label} ({fmt.md_text(bw.source)})'}"
               f"; peak: {fmt.md_text(profile.flops_source)} ({profile.flops_kind})"
               + (" — edited here." if edited else ".")
               + " A roofline is a bound, not a measurement: dispatch overheads and kernels that reach neither roof "
                 "make a device slower.")
