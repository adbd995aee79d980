"""Bandwidth model: measured tok/s against graph bytes per token (tok/s ≈ BW ÷ bytes), the bytes each
measurement implies, residuals, fits per device, and the write-up's A/B cross-check (decode runs); prefill runs
against the compute roof."""

from __future__ import annotations

import streamlit as st

from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.measure.logs import summarize
from analyzer.predict.bandwidth_model import DEFAULT_MAX_RESIDUAL_PCT
from analyzer.predict.profiles import load_profiles
from analyzer.predict.roofline import Roof, prefill_runs
from analyzer.report import bandwidth_figures as figures
from analyzer.report import frames
from analyzer.report import roofline_figures as rf
from analyzer.report.assumptions import assumption_notes
from analyzer.report.labels import sized_graph_bytes
from analyzer.report.siblings import nearest_phase_sibling
from analyzer.sweep.timing_report import device_model_report, report_text, table_from_analyses
from app_pages import analyses, bandwidth_control, logs_state, phases, widgets

st.title("Bandwidth model")
st.caption("Decode on a phone is memory-bound, so tok/s ≈ BW ÷ bytes per token. Read backwards, a measured tok/s "
           "and a bandwidth give the effective bytes a token moved, which can be set beside the bytes the graph "
           "counts. This establishes scale and direction; it is not a DRAM measurement. MB = 10^6 bytes.")

imported = logs_state.log_import()
if not imported.measurements:
    st.warning("No accepted device runs: upload logs on the Device logs page.")
    st.page_link("app_pages/device_logs.py", label="Device logs", icon=":material/upload_file:")
    st.stop()
refs = analyses.analysis_refs()
by_id = analyses.refs_by_id(refs)
labels = list(dict.fromkeys(m.build for m in imported.measurements))
mapping = logs_state.log_mapping(labels, refs)
try:
    mapped = logs_state.mapped_analyses(mapping, refs)
except QfoldError as e:
    widgets.error(e, "Cannot load a mapped analysis: ")
    st.stop()
graph, left_out = sized_graph_bytes(mapped)
for line in left_out:  # an analysis that could not be sized gives no bytes per token to fit
    st.warning(fmt.md_text(line), icon=":material/warning:")
mapped_to = sorted({by_id[i].label for i in mapping.values() if i in by_id})
example = "the write-up's published figures (`examples/writeup_device_logs.csv`)"
source = (example if logs_state.using_example_log() else
          f"{example} and this session's logs" if logs_state.example_shown() else "this session's logs")
st.info(f"Using {source}; build labels mapped to: {'; '.join(map(fmt.md, mapped_to)) or 'nothing yet'}. Change the "
        "logs or the mapping on the Device logs page.", icon=":material/science:")

bandwidth_control.bandwidth_control("bw")  # the same setting as the A/B page's and the report's
bw = bandwidth_control.resolved_bandwidth(refs)
overhead = st.toggle("Fit a fixed per-token time too", key="bw_overhead",
                     help="t = bytes / BW + t0; needs ≥ 3 builds with distinct bytes on a device to be testable.")
if bw.fixed_bytes_per_s is None:
    st.caption("Fitted per device: least squares over each device's mapped builds (≥ 2 with distinct bytes); a "
               f"device without a usable fit uses {bw.label} ({fmt.md_text(bw.source)}).")
else:
    st.caption(f"Predictions use **{bw.label}**: {fmt.md_text(bw.source)}.", help=bw.citation or None)
roofs = logs_state.roof_rows(imported, mapped)
keep = st.toggle("Fit rows above their roof too", key="bw_keep_impossible",
                 help="A decode row faster than its device's cited bandwidth ÷ the bytes its build must read per token "
                      "is impossible there (a wrong build label, device or measurement): left out of the fits unless "
                      "this is on.")
result = logs_state.bandwidth_analysis(imported, graph, fixed_bw_bytes_per_s=bw.fixed_bytes_per_s, overhead=overhead,
                                       roofs=roofs, keep_impossible=keep)
fits, assumptions, report = result.fits, result.bandwidth, result.crosscheck
frame = figures.bandwidth_frame(report)
pairs = figures.pairs_frame(report)

# ---------------------------------------------------------------------------------------------- A/B cross-check
def mb_per_token(n_bytes: int | None) -> str:
    return "—" if n_bytes is None else fmt.mb(n_bytes, suffix=False)


for p in report.pairs:
    st.subheader(f"A/B cross-check on {fmt.md(p.device)}")
    st.markdown(f"A = {fmt.md(p.build_a)} ({p.tok_per_s_a:.2f} tok/s), B = {fmt.md(p.build_b)} "
                f"({p.tok_per_s_b:.2f} tok/s); BW {fmt.bandwidth(p.bw_bytes_per_s)}")
    with st.container(horizontal=True, gap="xsmall"):  # cards wrap rather than cut numbers on narrow screens
        values = [mb_per_token(n) for n in (p.inferred_bytes_per_token_a, p.inferred_bytes_per_token_b,
                                            p.inferred_diff_bytes, p.graph_diff_bytes)]
        card = {"border": True, "width": frames.metric_width_px(values, minimum=250)}
        st.metric("A inferred, MB/token", mb_per_token(p.inferred_bytes_per_token_a), **card,
                  help=f"{fmt.bandwidth(p.bw_bytes_per_s)} ÷ {p.tok_per_s_a:.2f} tok/s")
        st.metric("B inferred, MB/token", mb_per_token(p.inferred_bytes_per_token_b), **card,
                  help=f"{fmt.bandwidth(p.bw_bytes_per_s)} ÷ {p.tok_per_s_b:.2f} tok/s")
        st.metric("inferred difference, MB/token", mb_per_token(p.inferred_diff_bytes), **card,
                  help="BW × (1/tok_A − 1/tok_B); a per-token overhead cancels out")
        if p.graph_diff_bytes is not None:
            st.metric("graph difference, MB/token", mb_per_token(p.graph_diff_bytes), **card,
                      delta=None if p.gap_pct is None else f"inferred is {p.gap_pct:+.1f}%", delta_color="off",
                      delta_arrow="off", help=f"= {fmt.size(p.graph_diff_bytes, 'auto', None)}")
    st.markdown(f"Measured speedup {p.tok_per_s_a:.2f} → {p.tok_per_s_b:.2f} tok/s = **{p.speedup:.2f}×**. "
                f"At {fmt.bandwidth(p.bw_bytes_per_s)} the measurements imply the heavier build moves "
                f"**{fmt.mb(p.inferred_diff_bytes, 0)}** more per token; the graphs say "
                f"**{fmt.mb(p.graph_diff_bytes or 0, 0)}** ({abs(p.gap_pct or 0):.0f}% "
                f"{'less' if (p.gap_pct or 0) < 0 else 'more'} inferred than counted).")
    for build in (p.build_a, p.build_b):
        for note in assumption_notes(mapped[build]) if build in mapped else ():
            st.caption(f"Assumed for {fmt.md(build)}'s graph bytes — {note}")

# ---------------------------------------------------------------------------------------------- chart
st.subheader("Measured vs graph")
curves = figures.bandwidth_curves(bw.bytes_per_s, fits) + figures.roof_curves(roofs, list(frame["device"]))
st.plotly_chart(figures.bandwidth_figure(frame, curves), key="bw_chart")
st.markdown("The numbers of the charts on this page (filled markers: graph bytes; open markers: the bytes each "
            "measured tok/s implies at its device's bandwidth):")
widgets.table_with_download(frame, "bw_builds_csv", "bandwidth_crosscheck.csv",
                            display=frames.crosscheck_display(frame))
if report.unmapped_builds:
    st.caption("Not on the chart (no analysis mapped, so no graph bytes): "
               f"{', '.join(map(fmt.md, report.unmapped_builds))}. Map them on the Device logs page.")
roof_table = figures.roof_frame(roofs)
flagged = roof_table[roof_table["flags"] != ""]
above = int(roof_table["flags"].str.contains("above_roof").sum())
(st.warning if above else st.caption)(
    f"Roof check (dotted lines: each device's cited bandwidth ÷ bytes per token): {len(flagged)} of "
    f"{int(roof_table['roof_tok_per_s'].notna().sum())} decode row(s) with a roof are flagged; {above} above their "
    f"roof, {'fitted (the toggle above)' if keep else 'left out of the fits'}.")
with_roof = roof_table[roof_table["roof_tok_per_s"].notna()]
if len(with_roof):
    widgets.table_with_download(with_roof, "bw_roof_csv", "roof_check.csv", max_height=260)
uses: dict[str, list[str]] = {}
for device, a in assumptions.items():
    extra = f" + {a.overhead_s * 1e3:.2f} ms/token" if a.overhead_s else ""
    uses.setdefault(f"{fmt.bandwidth(a.bytes_per_s)}{extra} ({a.source})", []).append(device)
if bw.fixed_bytes_per_s is None:  # fitted: each device says which bandwidth its predictions use
    for what, devices in uses.items():
        # ``what`` of a fit names its device: escaped
        st.caption(f"Predictions for {', '.join(map(fmt.md, devices))} use {fmt.md_text(what)}.")

st.plotly_chart(figures.inferred_vs_graph_figure(frame), key="bw_inferred_chart")
st.plotly_chart(figures.residual_figure(frame), key="bw_residual_chart")

# ---------------------------------------------------------------------------------------------- fits
st.subheader("Fits per device")
st.caption("Each verdict judges its device's own least-squares fit (the bandwidth at the end of its sentence), "
           "which is what tells whether one bandwidth explains the builds; the predictions and residuals above use "
           + ("each device's fit." if bw.fixed_bytes_per_s is None else f"the bandwidth setting, {bw.label}."))
if not fits:
    st.info("No device has a build mapped to an analysis, so nothing can be fitted.")
for f in fits:
    (st.success if f.explains_builds else st.warning)(fmt.md_text(f.verdict))  # it names devices and labels
    if f.unmapped_builds:
        st.caption(f"{fmt.md(f.device)}: left out of the fit (not mapped): {', '.join(map(fmt.md, f.unmapped_builds))}")
if len(pairs):
    with st.expander("A/B pairs as a table"):
        widgets.table_with_download(pairs, "bw_pairs_csv", "bandwidth_pairs.csv")
compressed = {m.quantization for m in imported.measurements if m.build in graph and m.quantization}
fp16_graphs = [label for label, ref_id in mapping.items()
               if ref_id and ref_id in by_id and label in graph
               and not dict(by_id[ref_id].spec).get("compression")]
if compressed and fp16_graphs:
    st.info("The logs' builds were quantized (" + "; ".join(map(fmt.md, sorted(compressed))) + ") but the "
            "analyses mapped to them are fp16: their absolute bytes per token (mostly weights) differ from what the "
            "device read, so a single bandwidth cannot fit both (residuals above "
            f"{DEFAULT_MAX_RESIDUAL_PCT:g}% are expected). The A/B difference is unaffected: quantization and weights "
            "are the same on both sides, and the difference is the KV replication.", icon=":material/info:")

# ---------------------------------------------------------------------------------------------- prefill runs
st.subheader("Prefill runs against the compute roof")
prefill_summaries = summarize(imported.measurements, phase="prefill")
if not prefill_summaries:
    st.caption("No prefill runs in these logs (llama-bench `pp…`, runners' prompt lines, or `phase=prefill` rows). "
               "The fits above use decode runs only; prefill is compute-bound, so it is held against FLOPs instead.")
else:
    profiles = {k: p for k, p in load_profiles().items() if p.has_compute_roof}
    key = widgets.persisted_selectbox("Device roofs for the prefill runs", list(profiles), "bw_roof_profile",
                                     default=phases.DEFAULT_ROOF_PROFILE, format_func=lambda k: profiles[k].label)
    roof = Roof.of(profiles[key])
    prefill_analyses, nearest = {}, []
    for label, ref_id in mapping.items():
        sibling = nearest_phase_sibling(by_id[ref_id], "prefill", refs) if ref_id and ref_id in by_id else None
        prefill_analyses[label] = analyses.load(sibling.ref) if sibling is not None else None
        if sibling is not None and sibling.differences:
            nearest.append(f"{fmt.md(label)} → {fmt.md(sibling.ref.label)} ({'; '.join(sibling.differences)})")
    runs = prefill_runs(prefill_summaries, prefill_analyses, roof)
    prefill_frame = rf.prefill_runs_frame(runs)
    if prefill_frame["implied_flops_per_s"].notna().any():
        st.plotly_chart(rf.prefill_runs_figure(prefill_frame, roof), key="bw_prefill_chart")
    if nearest:
        st.caption("FLOPs per prompt token from the nearest prefill analysis (no prefill analysis of exactly the "
                   "mapped spec): " + "; ".join(nearest) + ".")
    widgets.table_with_download(prefill_frame, "bw_prefill_csv", "prefill_runs.csv",
                               caption="implied FLOP/s = measured prompt tok/s × FLOPs per prompt token of the "
                                       "mapped label's prefill analysis (a prefill build, or the prefill function of a "
                                       "decode+prefill package); predicted = the roofline's bound for that analysis. "
                                       f"Roofs: {roof.source}.")

# ---------------------------------------------------------------------------------------------- device model
with st.expander("Device model: t = Σ bytes_c / BW_c + n_ops·τ + t0 (the same fit as `fit --sweep`)"):
    if not mapped:
        st.info("Map log labels to analyses on the Device logs page to fit the device model.")
    else:
        model_report = device_model_report(imported.measurements, table_from_analyses(mapped))
        st.caption("Fitted per device on the mapped analyses' bytes by category, with only the terms these logs can "
                   "identify; for a model selection between graphs, run a sweep and `qfold fit LOGS "
                   "--sweep TABLE`, or see the Sweeps page.")
        st.code(report_text(model_report) or "no measured row matches a mapped analysis's ctx", language=None)
