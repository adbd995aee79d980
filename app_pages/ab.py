"""A/B: two analyses side by side — tiles, bytes per token, predicted speed, equivalence, and every op."""

from __future__ import annotations

import streamlit as st

from analyzer import fmt
from analyzer.build.builds import BuildSpec
from analyzer.build.jobs import BuildJob
from analyzer.errors import QfoldError
from analyzer.fmt import MB
from analyzer.graph.accounting import CATEGORIES, DEFAULT_WEIGHT_CHARGE, WEIGHT_CHARGES
from analyzer.graph.diff import diff_analyses
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.report import figures
from analyzer.report.assumptions import WEIGHT_CHARGE_TEXT
from analyzer.report.catalog import (
    BASELINE_VARIANT,
    CANDIDATE_VARIANT,
    DEFAULT_CTX,
    DEFAULT_KV_MODE,
    default_pair,
    shipped_analyses,
)
from analyzer.report.headline import NO_RUNTIME_NOTE, UNITS_NOTE, ab_headline, headline_frame
from app_pages import graph_view, phases, shared

st.title("A/B: where the KV copies go")
st.caption("Two Core ML decode graphs of one model, compared op by op: the `tile` ops `repeat_kv` leaves in the "
           "MIL program, the bytes each decode token moves, and what that predicts for throughput.")

refs = shared.analysis_refs()
by_id = shared.refs_by_id(refs)
pair = shared.ab_pair(refs)


def rebuild_for_real() -> None:
    """Queue the two full-size default builds the shipped analyses were made from."""
    with st.popover("Rebuild for real", icon=":material/construction:", width="stretch"):
        st.warning(f"Converts the full-size **{DEFAULT_PRESET}** twice ({BASELINE_VARIANT} and {CANDIDATE_VARIANT}, "
                   f"KV as state, ctx {DEFAULT_CTX:,}): about **2.5 minutes and 15 GB of memory each**, one after "
                   "the other, in a child process. Other sessions keep working; conversions queue machine-wide.")
        busy = any(not s.finished for s in shared.job_snapshots())
        if busy:
            st.caption("A conversion started from this session is still running (see the Builds page).")
        if st.button("Queue the two full-size builds", key="ab_rebuild", type="primary", disabled=busy):
            try:
                source = resolve_source(DEFAULT_PRESET)
                specs = tuple(BuildSpec(source, v, DEFAULT_KV_MODE, DEFAULT_CTX)
                              for v in (BASELINE_VARIANT, CANDIDATE_VARIANT))
            except QfoldError as e:
                st.error(str(e))
            else:
                shared.start_job(BuildJob(specs, shared.builds_root()))
                st.success("Queued. Follow the progress on the Builds page.")
        st.page_link("app_pages/builds.py", label="Builds page", icon=":material/build:")


if pair is None:
    st.warning("No analyses to compare yet: the shipped default analyses are not installed "
               "(`analyzer/shipped/` is empty) and there is no repeat_kv / qfold pair among the cached builds.")
    st.markdown("Make a small pair on the **Builds** page (a 2-layer structure build takes ~20 s per variant), or "
                "with the CLI: `python -m analyzer build --variant repeat_kv --structure` and the same with "
                "`--variant qfold`.")
    st.page_link("app_pages/builds.py", label="Go to Builds", icon=":material/build:")
    rebuild_for_real()
    st.stop()

shipped = shipped_analyses()
if not {BASELINE_VARIANT, CANDIDATE_VARIANT} <= set(shipped):
    st.info(f"The shipped full-size analyses are incomplete (`analyzer/shipped/` has: {', '.join(shipped) or 'none'}), "
            "so the default pair is the newest matching cached builds.")

# ---------------------------------------------------------------------------------------------- the two analyses
ids = [r.id for r in refs]
pick_a, pick_b, pick_more = st.columns([4, 4, 2], vertical_alignment="bottom")
with pick_a:
    a_id = shared.persisted_selectbox("A (baseline)", ids, "ab_a", default=pair[0].id,
                                      format_func=lambda i: by_id[i].label)
with pick_b:
    b_id = shared.persisted_selectbox("B (candidate)", ids, "ab_b", default=pair[1].id,
                                      format_func=lambda i: by_id[i].label)
with pick_more:
    rebuild_for_real()
ref_a, ref_b = by_id[a_id], by_id[b_id]
try:
    analysis_a, analysis_b = shared.load(ref_a), shared.load(ref_b)
except QfoldError as e:
    st.error(f"Cannot load the analysis: {e}")
    st.stop()
label_a, label_b = shared.short_label(ref_a), shared.short_label(ref_b)
if a_id == b_id:
    st.warning("A and B are the same analysis: every difference below is zero.")

# The page opens on the A/B the device logs measured; the shipped fp16 pair (predicted only) is one click away.
logged, fp16 = shared.measured_ab_pairs(refs), default_pair(refs)
measured = shared.measured(ref_a, ref_b, refs)
if logged and fp16 is not None and (fp16[0].id, fp16[1].id) != (logged[0].a.id, logged[0].b.id):
    on_logged = (a_id, b_id) == (logged[0].a.id, logged[0].b.id)
    target = fp16 if on_logged else (logged[0].a, logged[0].b)
    note, button = st.columns([5, 2], vertical_alignment="center")
    note.caption(f"Opened on the A/B the device logs measured ({logged[0].build_a} → {logged[0].build_b} on "
                 f"{logged[0].device})." if on_logged else
                 "The device logs measured another pair; this one is predicted only." if measured is None else "")
    button.button("Open the fp16 pair (predicted only)" if on_logged else "Back to the measured pair", key="ab_switch",
                  icon=":material/swap_horiz:", on_click=shared.set_persisted,
                  kwargs={"values": {"ab_a": target[0].id, "ab_b": target[1].id}})

bw_mb_s = float(st.session_state.get("ab_bw_mb_s", shared.DEFAULT_BW_MB_S))
h = ab_headline(analysis_a, analysis_b, bw_bytes_per_s=bw_mb_s * MB, label_a=label_a, label_b=label_b)
diff = diff_analyses(analysis_a, analysis_b)
ta, tb = h.bytes_per_token_a.total, h.bytes_per_token_b.total


def rate(tok_per_s: float) -> str:
    return f"{tok_per_s:,.0f}" if tok_per_s >= 100 else f"{tok_per_s:.1f}"


# ---------------------------------------------------------------------------------------------- headline
r1, r2 = st.columns(3, border=True), st.columns(4 if measured else 3, border=True)
r1[0].metric("tile ops, A → B", f"{h.tiles_a:,} → {h.tiles_b:,}", delta=f"{h.tiles_b - h.tiles_a:+,} ops",
             delta_color="inverse")
r1[1].metric("tile output per token, A → B", fmt.change(h.tile_bytes_a, h.tile_bytes_b, "MiB"),
             delta=fmt.mib(h.tile_bytes_b - h.tile_bytes_a, 0, sign=True), delta_color="inverse",
             help=shared.tile_sizes_text(analysis_a))
r1[2].metric("ops without const, A → B", f"{h.non_const_ops_a:,} → {h.non_const_ops_b:,}",
             delta=f"{h.non_const_ops_b - h.non_const_ops_a:+,} ops", delta_color="inverse",
             help=f"with const: {h.total_ops_a:,} → {h.total_ops_b:,} ({h.total_ops_b - h.total_ops_a:+,})")
r2[0].metric("bytes per token, A → B (MiB)", fmt.change(ta, tb, "MiB").removesuffix(" MiB"),
             delta=fmt.mib(tb - ta, 0, sign=True), delta_color="inverse", help="MiB = 2^20 bytes")
r2[1].metric("bytes per token, A → B (MB)", fmt.change(ta, tb, "MB").removesuffix(" MB"),
             delta=fmt.mb(tb - ta, 0, sign=True), delta_color="inverse", help="MB = 10^6 bytes")
r2[2].metric(f"predicted tok/s at {bw_mb_s:,.0f} MB/s", f"{rate(h.tok_per_s_a)} → {rate(h.tok_per_s_b)}",
             delta=f"×{h.speedup:.2f} (= bytes A ÷ bytes B)", delta_color="normal" if h.speedup >= 1 else "inverse",
             help="tok/s = BW ÷ bytes per token; the ratio does not depend on BW")
if measured:
    r2[3].metric("measured tok/s (device logs)", f"{measured.tok_per_s_a:.2f} → {measured.tok_per_s_b:.2f}",
                 delta=f"×{measured.speedup:.2f} measured",
                 delta_color="normal" if measured.speedup >= 1 else "inverse",
                 help=f"{measured.device}: {measured.build_a} ({measured.runs_a} run(s)) and {measured.build_b} "
                      f"({measured.runs_b} run(s)), means; see the Bandwidth model page for the cross-check.")

for note in h.assumptions:
    st.caption(f"Assumed — {note}")
prefill_sides = [f"{side} ({a.call.tokens_per_call} prompt tokens per call)"
                 for side, a in (("A", analysis_a), ("B", analysis_b)) if a.call.phase == "prefill"]
if prefill_sides:
    what = "is a prefill function" if len(prefill_sides) == 1 else "are prefill functions"
    st.info(f"{' and '.join(prefill_sides)} {what}: the bytes and the tok/s above are per call, not per decode token "
            "(per prompt token: ÷ tokens per call). The Decode · prefill · roofline tab sets both phases side by side.",
            icon=":material/info:")

by_cat, about = st.columns([3, 2])
with by_cat:
    cats = figures.category_frame(diff)
    st.markdown("**Bytes per decode token by category**")
    st.dataframe(shared.category_display(cats), hide_index=True, width="stretch",
                 column_config=shared.number_config(shared.category_display(cats)))
    flops = figures.flops_frame(diff)
    per = "per token" if analysis_a.call.phase == analysis_b.call.phase == "decode" else \
        "per token (per prompt token for a prefill)"
    with st.expander(f"FLOPs {per} by category: {fmt.gflop(int(flops['a_flops'].iloc[-1]))} → "
                     f"{fmt.gflop(int(flops['b_flops'].iloc[-1]))}"):
        shared.table_with_download(flops, "ab_flops_csv", "flops_per_token.csv",
                                   display=shared.flops_display(flops),
                                   caption="A multiply-add = 2 FLOPs; softmax 5 per element; elementwise and "
                                           "transcendental 1 per element (analyzer/graph/flops.py). Per call beside.")
    shared.persisted_radio(
        "Compressed weights per token", WEIGHT_CHARGES, shared.WEIGHT_CHARGE_KEY, DEFAULT_WEIGHT_CHARGE,
        horizontal=True, format_func=lambda c: {"compressed": "as stored", "decompressed": "decompressed at load"}[c],
        help=f"compressed: {WEIGHT_CHARGE_TEXT['compressed']}; decompressed: {WEIGHT_CHARGE_TEXT['decompressed']}. "
             "Which one a device does is not in the graph; fp16 analyses are the same either way.")
with about:
    shared.persisted_slider("Bandwidth for the prediction (MB/s)", "ab_bw_mb_s", shared.DEFAULT_BW_MB_S,
                            min_value=5_000.0, max_value=200_000.0, step=100.0, format="%.0f",
                            help="tok/s = BW ÷ bytes per token; 1 MB = 10^6 B. Default: the write-up's 55,900 "
                                 "MB/s, an assumed model constant for its A/B iPhone, not a measured DRAM figure.")
    eq = h.equivalence
    if eq is None:
        st.info("Equivalence: not available for this pair (it is checked in torch between the variants of one "
                "source, KV mode, ctx and compression).", icon=":material/rule:")
    else:
        fp16 = ("fp16 **bit-identical**" if eq.fp16_bit_identical
                else f"fp16 max |Δ logits| {eq.fp16_max_abs_diff:.3g}")
        st.success(f"**Equivalence** ({eq.variant_a} vs {eq.variant_b}, torch, {eq.steps} decode steps): {fp16}; "
                   f"fp32 max |Δ logits| {eq.fp32_max_abs_diff:.2g}; greedy tokens agree "
                   f"{eq.greedy_agree_steps}/{eq.steps}.", icon=":material/check_circle:")
    st.caption(f"{NO_RUNTIME_NOTE} {UNITS_NOTE}")

# ---------------------------------------------------------------------------------------------- side by side
t_bytes, t_ops, t_tiles, t_layers, t_drill, t_phases, t_graph = st.tabs(
    ["Bytes by category", "Op counts", "Tiles", "Bytes per layer", "Ops behind a total",
     "Decode · prefill · roofline", "Graph"],
    key="ab_tab", on_change="rerun")  # stateful, so the Graph tab runs only when it is open

with t_bytes:
    chart, numbers = st.columns([5, 4])
    chart.plotly_chart(figures.waterfall_figure(cats, label_a, label_b), key="ab_waterfall")
    with numbers:
        st.markdown("**Bytes per decode token** — select a row to see the ops behind it")
        shown = cats.drop(columns=["in_total"])
        picked = st.dataframe(shown, hide_index=True, width="stretch", key="ab_cat_table", on_select="rerun",
                              selection_mode="single-row",
                              column_config={**shared.number_config(shown),
                                             "category": st.column_config.TextColumn(width="small")})
        st.download_button("Download CSV", shared.frame_csv(cats), "bytes_per_token.csv", "text/csv",
                           key="ab_cat_csv", icon=":material/download:", on_click="ignore")
        st.caption("`kv_write_value_semantics` (a whole tensor per `slice_update`) is shown beside the totals, "
                   "not in them.")
    rows = picked.selection.rows if picked is not None else []
    if rows:
        category = str(cats.iloc[rows[0]]["category"])
        if category == "kv_write_value_semantics":
            st.info("kv_write_value_semantics is a what-if beside the totals; its ops are the `slice_update`s.")
        else:
            st.markdown(f"**Ops behind `{category}`**")
            for col, ref, label in zip(st.columns(2), (ref_a, ref_b), (label_a, label_b), strict=True):
                d = figures.drilldown(shared.op_table(ref), category)
                with col:
                    st.markdown(f"{label}: **{len(d.rows):,} ops, {d.sum_bytes:,} bytes** ({fmt.mib(d.sum_bytes)})")
                    if d.rows.empty:
                        st.caption(f"No op moves {category} bytes.")
                        continue
                    st.dataframe(d.rows[["bytes", "name", "type", "layer", "rule"]], hide_index=True,
                                 width="stretch", height=shared.fit_height(len(d.rows), 300),
                                 column_config=shared.number_config(d.rows))

with t_ops:
    changed_only = st.toggle("Only op types whose count changed", value=False, key="ab_ops_changed")
    ops = figures.op_count_frame(diff, changed_only=changed_only)
    chart, numbers = st.columns([3, 2])
    chart.plotly_chart(figures.op_count_figure(ops, label_a, label_b), key="ab_ops_chart")
    with numbers:
        st.markdown(f"**Ops: {h.total_ops_a:,} → {h.total_ops_b:,} with const, "
                    f"{h.non_const_ops_a:,} → {h.non_const_ops_b:,} without**")
        shared.table_with_download(ops, "ab_ops_csv", "op_counts.csv", max_height=380)

with t_tiles:
    for col, analysis, label in zip(st.columns(2), (analysis_a, analysis_b), (label_a, label_b), strict=True):
        tiles = figures.tile_frame(analysis)
        with col:
            st.markdown(f"**{label}: {len(tiles)} tile ops, {fmt.mib(analysis.summary.tile_output_bytes, 0)} "
                        "of output**")
            if len(tiles):
                shared.table_with_download(tiles, f"ab_tiles_csv_{label}", "tiles.csv", max_height=380,
                                           display=shared.with_units(tiles, ["output_bytes"]))
            else:
                st.caption("No tile ops: K and V are read at their stored width.")

with t_layers:
    layers = figures.layer_frame(analysis_a, analysis_b, label_a, label_b)
    st.plotly_chart(figures.layer_figure(layers), key="ab_layers_chart")
    shared.table_with_download(layers, "ab_layers_csv", "bytes_by_layer.csv", max_height=300,
                               display=shared.with_units(layers, ["total"]))

with t_drill:
    st.markdown("Filter the op table down to any total: every op's bytes per token, by category, largest first.")
    side = st.radio("Analysis", ["A", "B"], horizontal=True, key="ab_drill_side",
                    format_func=lambda s: f"{s}: {label_a if s == 'A' else label_b}")
    ref, analysis = (ref_a, analysis_a) if side == "A" else (ref_b, analysis_b)
    ops_table = shared.op_table(ref)
    f1, f2, f3 = st.columns(3)
    category = f1.selectbox("Category", ["total", *CATEGORIES], key="ab_drill_category")
    layer_options = ["all", *sorted(int(v) for v in ops_table["layer"].dropna().unique()), figures.OUTSIDE_LAYERS]
    layer = f2.selectbox("Layer", layer_options, key="ab_drill_layer",
                         format_func=lambda v: "all layers" if v == "all" else
                         "outside the decoder layers" if v == figures.OUTSIDE_LAYERS else f"layer {v}")
    op_type = f3.selectbox("Op type", ["all", *sorted(ops_table["type"].unique())], key="ab_drill_type")
    d = figures.drilldown(ops_table, category, layer, None if op_type == "all" else op_type)
    total = analysis.bytes_per_token.get(category)
    share = f", {100 * d.sum_bytes / total:.1f}% of the analysis's {category} per token" if total else ""
    st.markdown(f"**{len(d.rows):,} ops, sum {d.sum_bytes:,} bytes ({fmt.mib(d.sum_bytes, 2)}, "
                f"{fmt.mb(d.sum_bytes, 2)})** per token{share}")
    shared.table_with_download(d.rows, "ab_drill_csv", f"ops_{side}_{category}.csv", max_height=420)

with t_phases:
    if t_phases.open:
        phases.ab_section(ref_a, ref_b, label_a, label_b, refs)

with t_graph:
    if t_graph.open:
        graph_view.ab_section(ref_a, ref_b, label_a, label_b)

with st.expander("Headline numbers as a table"):
    shared.table_with_download(headline_frame(h), "ab_headline_csv", "ab_headline.csv")
