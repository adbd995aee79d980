"""A/B: two analyses side by side — tiles, bytes per token, predicted speed, equivalence, and every op."""

from __future__ import annotations

import streamlit as st

from analyzer.build.builds import ANALYSIS_MODE, BuildSpec
from analyzer.build.costs import analysis_weight_bytes, estimate_cost
from analyzer.build.jobs import BuildJob
from analyzer.errors import QfoldError
from analyzer.fmt import MB, MIB
from analyzer.graph.accounting import CATEGORIES
from analyzer.graph.diff import diff_documents
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.report import figures
from analyzer.report.catalog import (
    BASELINE_VARIANT,
    CANDIDATE_VARIANT,
    DEFAULT_CTX,
    DEFAULT_KV_MODE,
    load_shipped,
    shipped_analyses,
)
from analyzer.report.report import NO_RUNTIME_NOTE, UNITS_NOTE, ab_headline, headline_frame
from app_pages import shared

st.title("A/B: where the KV copies go")
st.caption("Two Core ML decode graphs of one model, compared op by op: the `tile` ops `repeat_kv` leaves in the "
           "MIL program, the bytes each decode token moves, and what that predicts for throughput.")

refs = shared.analysis_refs()
by_id = shared.refs_by_id(refs)
pair = shared.ab_pair(refs)


def shipped_doc() -> dict | None:
    """The shipped analysis of the default candidate (its weight bytes size the rebuild), if present."""
    try:
        return load_shipped(CANDIDATE_VARIANT)
    except QfoldError:
        return None


def rebuild_for_real() -> None:
    """Queue the two full-size default builds the shipped analyses were made from."""
    with st.popover("Rebuild for real", icon=":material/construction:", width="stretch"):
        doc = shipped_doc()
        cost = estimate_cost(ANALYSIS_MODE, analysis_weight_bytes(doc), 2) if doc else None
        st.warning(f"Converts the full-size **{DEFAULT_PRESET}** twice ({BASELINE_VARIANT} and {CANDIDATE_VARIANT}, "
                   f"KV as state, ctx {DEFAULT_CTX:,}) in analysis mode (value-free weights, no package)"
                   + (f": {cost.summary()}" if cost else "") + ", in one child process. Other sessions keep "
                   "working; conversions queue machine-wide.")
        busy = any(not s.finished for s in shared.job_snapshots())
        if busy:
            st.caption("A conversion started from this session is still running (see the Builds page).")
        if st.button("Queue the two full-size builds", key="ab_rebuild", type="primary", disabled=busy):
            try:
                source = resolve_source(DEFAULT_PRESET)
                specs = tuple(BuildSpec(source, v, DEFAULT_KV_MODE, DEFAULT_CTX, build_mode=ANALYSIS_MODE)
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
    doc_a, doc_b = shared.load_doc(ref_a), shared.load_doc(ref_b)
except QfoldError as e:
    st.error(f"Cannot load the analysis: {e}")
    st.stop()
label_a, label_b = shared.short_label(ref_a), shared.short_label(ref_b)
if a_id == b_id:
    st.warning("A and B are the same analysis: every difference below is zero.")

bw_mb_s = float(st.session_state.get("ab_bw_mb_s", shared.DEFAULT_BW_MB_S))
h = ab_headline(doc_a, doc_b, bw_bytes_per_s=bw_mb_s * MB, label_a=label_a, label_b=label_b)
diff = diff_documents(doc_a, doc_b)
ta, tb = h.bytes_per_token_a["total"], h.bytes_per_token_b["total"]


def rate(tok_per_s: float) -> str:
    return f"{tok_per_s:,.0f}" if tok_per_s >= 100 else f"{tok_per_s:.1f}"


# ---------------------------------------------------------------------------------------------- headline
r1, r2 = st.columns(3, border=True), st.columns(3, border=True)
r1[0].metric("tile ops, A → B", f"{h.tiles_a:,} → {h.tiles_b:,}", delta=f"{h.tiles_b - h.tiles_a:+,} ops",
             delta_color="inverse")
r1[1].metric("tile output per token, A → B", f"{h.tile_bytes_a / MIB:,.0f} → {h.tile_bytes_b / MIB:,.0f} MiB",
             delta=f"{(h.tile_bytes_b - h.tile_bytes_a) / MIB:+,.0f} MiB", delta_color="inverse",
             help=shared.tile_sizes_text(doc_a))
r1[2].metric("ops without const, A → B", f"{h.non_const_ops_a:,} → {h.non_const_ops_b:,}",
             delta=f"{h.non_const_ops_b - h.non_const_ops_a:+,} ops", delta_color="inverse",
             help=f"with const: {h.total_ops_a:,} → {h.total_ops_b:,} ({h.total_ops_b - h.total_ops_a:+,})")
r2[0].metric("bytes per token, A → B (MiB)", f"{ta / MIB:,.0f} → {tb / MIB:,.0f}",
             delta=f"{(tb - ta) / MIB:+,.0f} MiB", delta_color="inverse", help="MiB = 2^20 bytes")
r2[1].metric("bytes per token, A → B (MB)", f"{ta / MB:,.0f} → {tb / MB:,.0f}",
             delta=f"{(tb - ta) / MB:+,.0f} MB", delta_color="inverse", help="MB = 10^6 bytes")
r2[2].metric(f"predicted tok/s at {bw_mb_s:,.0f} MB/s", f"{rate(h.tok_per_s_a)} → {rate(h.tok_per_s_b)}",
             delta=f"×{h.speedup:.2f} (= bytes A ÷ bytes B)", delta_color="normal" if h.speedup >= 1 else "inverse",
             help="tok/s = BW ÷ bytes per token; the ratio does not depend on BW")

by_cat, about = st.columns([3, 2])
with by_cat:
    cats = figures.category_frame(diff)
    st.markdown("**Bytes per decode token by category**")
    st.dataframe(shared.category_display(cats), hide_index=True, width="stretch",
                 column_config=shared.number_config(shared.category_display(cats)))
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
t_bytes, t_ops, t_tiles, t_layers, t_drill = st.tabs(
    ["Bytes by category", "Op counts", "Tiles", "Bytes per layer", "Ops behind a total"])

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
            for col, ref, doc, label in zip(st.columns(2), (ref_a, ref_b), (doc_a, doc_b), (label_a, label_b),
                                            strict=True):
                d = figures.drilldown(shared.op_table(ref), doc, category)
                with col:
                    ok = "= the total above ✓" if d.matches else f"≠ {d.reference_bytes:,} ✗"
                    st.markdown(f"{label}: **{len(d.rows):,} ops, {d.sum_bytes:,} bytes** "
                                f"({d.sum_bytes / MIB:,.1f} MiB) {ok}")
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
    for col, doc, label in zip(st.columns(2), (doc_a, doc_b), (label_a, label_b), strict=True):
        tiles = figures.tile_frame(doc)
        with col:
            st.markdown(f"**{label}: {len(tiles)} tile ops, {int(tiles['output_bytes'].sum()) / MIB:,.0f} MiB "
                        "of output**")
            if len(tiles):
                shared.table_with_download(tiles, f"ab_tiles_csv_{label}", "tiles.csv", max_height=380,
                                           display=shared.with_units(tiles, ["output_bytes"]))
            else:
                st.caption("No tile ops: K and V are read at their stored width.")

with t_layers:
    layers = figures.layer_frame(doc_a, doc_b, label_a, label_b)
    st.plotly_chart(figures.layer_figure(layers), key="ab_layers_chart")
    shared.table_with_download(layers, "ab_layers_csv", "bytes_by_layer.csv", max_height=300,
                               display=shared.with_units(layers, ["total"]))

with t_drill:
    st.markdown("Filter the op table down to any total: every op's bytes per token, by category. The sum of the "
                "rows shown is checked against the total shown elsewhere.")
    side = st.radio("Analysis", ["A", "B"], horizontal=True, key="ab_drill_side",
                    format_func=lambda s: f"{s}: {label_a if s == 'A' else label_b}")
    ref, doc = (ref_a, doc_a) if side == "A" else (ref_b, doc_b)
    ops_table = shared.op_table(ref)
    f1, f2, f3 = st.columns(3)
    category = f1.selectbox("Category", ["total", *CATEGORIES], key="ab_drill_category")
    layer_options = ["all", *sorted(int(v) for v in ops_table["layer"].dropna().unique()), figures.OUTSIDE_LAYERS]
    layer = f2.selectbox("Layer", layer_options, key="ab_drill_layer",
                         format_func=lambda v: "all layers" if v == "all" else
                         "outside the decoder layers" if v == figures.OUTSIDE_LAYERS else f"layer {v}")
    op_type = f3.selectbox("Op type", ["all", *sorted(ops_table["type"].unique())], key="ab_drill_type")
    d = figures.drilldown(ops_table, doc, category, layer, None if op_type == "all" else op_type)
    if d.matches is None:
        st.markdown(f"**{len(d.rows):,} ops, sum {d.sum_bytes:,} bytes ({d.sum_bytes / MIB:,.2f} MiB, "
                    f"{d.sum_bytes / MB:,.2f} MB)** per token")
    elif d.matches:
        st.success(f"{len(d.rows):,} ops, sum **{d.sum_bytes:,} bytes** ({d.sum_bytes / MIB:,.2f} MiB) = "
                   f"{d.reference_label}: **{d.reference_bytes:,} bytes** ✓")
    else:
        st.error(f"{len(d.rows):,} ops sum to {d.sum_bytes:,} bytes but {d.reference_label} is "
                 f"{d.reference_bytes:,} bytes: the accounting does not add up (please report this).")
    shared.table_with_download(d.rows, "ab_drill_csv", f"ops_{side}_{category}.csv", max_height=420)

with st.expander("Headline numbers as a table"):
    shared.table_with_download(headline_frame(h), "ab_headline_csv", "ab_headline.csv")
