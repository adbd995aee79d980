"""A/B: two analyses side by side — tiles, bytes per token, predicted speed, equivalence, and every op."""

from __future__ import annotations

import streamlit as st

from analyzer import fmt
from analyzer.analysis.accounting import CATEGORIES, DEFAULT_WEIGHT_CHARGE, WEIGHT_CHARGES
from analyzer.compare.diff import diff_analyses
from analyzer.convert.jobs import BuildJob
from analyzer.convert.rebuild import full_size_spec
from analyzer.errors import QfoldError
from analyzer.model.cost import estimate_builds
from analyzer.report import figures, frames, twins
from analyzer.report import placement_figures as pf
from analyzer.report.assumptions import WEIGHT_CHARGE_TEXT
from analyzer.report.catalog import AnalysisRef, builds_root, default_pair, matching_pair, shipped_analyses
from analyzer.report.compare import compare, structure_caveat
from analyzer.report.headline import (
    ab_headline,
    equivalence_text,
    headline_cards,
    headline_frame,
    package_fold_summary,
    runtime_note,
    units_note,
)
from analyzer.report.messages import for_ui
from analyzer.report.twins import backend_twin
from app_pages import (
    analyses,
    bandwidth_control,
    explorer_tab,
    graph_view,
    jobs_state,
    logs_state,
    phases,
    placement_tab,
    url_state,
    widgets,
)
from app_pages.session_keys import Key

# The tabs below are stateful and only the open one runs: a view of the page draws one tab's charts and tables, not
# eight (about half the page's CPU, on the server and in the browser). Streamlit forgets the widgets it does not
# draw, so the op-count and drill-down filters are kept aside and given back when their tab opens again.
OPS_FORM = {"ab_ops_changed": False}
DRILL_FORM = {"ab_drill_side": "A", "ab_drill_category": "total", "ab_drill_layer": "all", "ab_drill_type": "all"}

st.title("A/B: where the KV copies go")
st.caption("Two decode graphs of one model (Core ML or Core AI), compared op by op: the copies `repeat_kv` leaves "
           "in the program (MIL `tile`, Core AI `broadcast_in_dims`), the bytes each decode token moves, and what "
           "that predicts for throughput.")

refs = analyses.analysis_refs()
by_id = analyses.refs_by_id(refs)
pair = logs_state.ab_pair(refs)
for problem in url_state.url_errors():
    st.warning(f"This link asked for something this server cannot show: {problem}",  # user parts already md()
               icon=":material/link_off:")


def rebuild_for_real(selected: tuple[AnalysisRef, AnalysisRef] | None) -> None:
    """Queue the full-size builds of the A and B on screen (structure or few-layer builds grown to the model's
    real size; a shipped analysis rebuilt as it was made)."""
    popover = st.popover("Rebuild for real", icon=":material/construction:", key="ab_rebuild_popover",
                         on_change="rerun")
    with popover:
        if not popover.open:  # resolving sources (a folder's safetensors are hashed) only when asked
            return
        specs, problems = [], []
        for side, ref in zip("AB", selected or (), strict=False):
            analysis = analyses.load(ref) if ref.kind != "package" else None
            if analysis is None or analysis.build is None:
                problems.append(f"{side} is a package made elsewhere: qfold has no spec to build it from.")
                continue
            try:
                specs.append(full_size_spec(analysis.build.spec))
            except QfoldError as e:
                problems.append(f"{side}: {for_ui(str(e))}")
        specs = list({s.key: s for s in specs}.values())  # A and B may be the same build
        for problem in problems:
            st.caption(fmt.md_text(problem))
        if not specs:
            st.info("Nothing to rebuild for this pair.")
            return
        try:  # one request: the variants of one source share a child (analyzer.model.cost.estimate_builds)
            cost = estimate_builds(specs) if len({s.source for s in specs}) == 1 else None
            costs = [] if cost is not None else [estimate_builds([s]) for s in specs]
        except QfoldError as e:
            widgets.error(e)
            return
        what = "; ".join(f"{fmt.md(s.source.label)} **· {s.variant} · ctx {s.ctx}**"
                         + (f" (estimated {c.summary().removeprefix('~')})" if c else "")
                         for s, c in zip(specs, costs or [None] * len(specs), strict=True))
        st.warning("Converts at full size in **analysis mode** (value-free weights: the same analysis as a "
                   f"materialised build, no package), in one child process: {what}"
                   + (f" (estimated together {cost.summary().removeprefix('~')}; {cost.error_text})" if cost else "")
                   + ". Other sessions keep working; conversions queue machine-wide. A runnable package: the "
                   "Export page.")
        busy = any(not s.finished for s in jobs_state.job_snapshots())
        if busy:
            st.caption("A conversion started from this session is still running (see the Builds page).")
        if st.button(f"Queue {len(specs)} full-size build(s)", key="ab_rebuild", type="primary", disabled=busy):
            jobs_state.start_job(BuildJob(tuple(specs), builds_root(), estimate=cost))
            st.success("Queued. Follow the progress on the Builds page.")
        st.page_link("app_pages/builds.py", label="Builds page", icon=":material/build:")


if pair is None:
    st.warning("No analyses to compare yet: the shipped default analyses are not installed "
               "(`analyzer/shipped/` is empty) and there is no repeat_kv / qfold pair among the cached builds.")
    st.markdown("Make a small pair on the **Builds** page (a 2-layer structure build takes ~20 s per variant).")
    st.page_link("app_pages/builds.py", label="Go to Builds", icon=":material/build:")
    st.stop()

shipped = shipped_analyses()
if not {"repeat_kv", "qfold"} <= set(shipped):
    st.info(f"The shipped full-size analyses are incomplete (`analyzer/shipped/` has: {', '.join(shipped) or 'none'}), "
            "so the default pair is the newest matching cached builds.")

# ---------------------------------------------------------------------------------------------- the two analyses
ids = [r.id for r in refs]
# One picker a row: the labels lead with what tells analyses apart (model · variant · ctx · compression · size)
# and stay readable at 900 px.
a_id = widgets.persisted_selectbox("A (baseline)", ids, Key.AB_A, default=pair[0].id,
                                  format_func=lambda i: by_id[i].label)
b_id = widgets.persisted_selectbox("B (candidate)", ids, Key.AB_B, default=pair[1].id,
                                  format_func=lambda i: by_id[i].label)
url_state.url_save()  # the pair is in the URL from the first view: reload or share it
ref_a, ref_b = by_id[a_id], by_id[b_id]
actions = st.container(horizontal=True, gap="xsmall", key="ab_actions")
try:
    analysis_a, analysis_b = analyses.load(ref_a), analyses.load(ref_b)
except QfoldError as e:
    widgets.error(e, "Cannot load the analysis: ")
    st.stop()
label_a, label_b = analyses.short_label(ref_a), analyses.short_label(ref_b)
if a_id == b_id:
    st.warning("A and B are the same analysis: every difference below is zero.")

# Apples to apples: anything but the variant that differs is said above the headline, with the way back.
comparability = compare(analysis_a, analysis_b)
if comparability.sentence() and a_id != b_id:
    st.warning(comparability.sentence(), icon=":material/difference:")
    twins = [(side, matching_pair(ref, refs)) for side, ref in (("A", ref_a), ("B", ref_b))]
    twins = [(side, p) for side, p in twins if p is not None and (p[0].id, p[1].id) != (a_id, b_id)]
    for side, (base, cand) in twins:
        actions.button(f"Open the matching pair of {side}", key=f"ab_match_{side}", icon=":material/join:",
                       on_click=widgets.set_persisted, kwargs={"values": {Key.AB_A: base.id, Key.AB_B: cand.id}},
                       help=f"{fmt.md(base.label)} vs {fmt.md(cand.label)}")

# The page opens on the A/B the device logs measured; the shipped fp16 pair (predicted only) is one click away.
logged, fp16 = logs_state.measured_ab_pairs(refs), default_pair(refs)
measured = logs_state.measured(ref_a, ref_b, refs)
if logged and fp16 is not None and (fp16[0].id, fp16[1].id) != (logged[0].a.id, logged[0].b.id):
    on_logged = (a_id, b_id) == (logged[0].a.id, logged[0].b.id)
    target = fp16 if on_logged else (logged[0].a, logged[0].b)
    st.caption(f"Opened on the A/B the device logs measured ({fmt.md(logged[0].build_a)} → "
               f"{fmt.md(logged[0].build_b)} on {fmt.md(logged[0].device)})." if on_logged else
               "The device logs measured another pair; this one is predicted only." if measured is None else "")
    actions.button("Open the fp16 pair (predicted only)" if on_logged else "Back to the measured pair",
                   key="ab_switch", icon=":material/swap_horiz:", on_click=widgets.set_persisted,
                   kwargs={"values": {Key.AB_A: target[0].id, Key.AB_B: target[1].id}})
with actions:
    rebuild_for_real((ref_a, ref_b))

bw = bandwidth_control.resolved_bandwidth(refs, prefer_device=measured.device if measured else None)
h = ab_headline(analysis_a, analysis_b, bw_bytes_per_s=bw.bytes_per_s, label_a=label_a, label_b=label_b)
diff = diff_analyses(analysis_a, analysis_b)
caveat = structure_caveat(analysis_a, analysis_b)

# ---------------------------------------------------------------------------------------------- headline
# One wrapping row of fixed-width cards: at ≤ 900 px they flow onto more rows instead of cutting numbers off.
where = None if measured is None else (  # a tooltip is markdown: the logs' device and build names as text
    f"{fmt.md(measured.device)}: {fmt.md(measured.build_a)} ({measured.runs_a} run(s)) and {fmt.md(measured.build_b)} "
    f"({measured.runs_b} run(s)), means; see the Bandwidth model page for the cross-check.")
cards = headline_cards(h, None if measured is None else (measured.tok_per_s_a, measured.tok_per_s_b, where), caveat)
card_px = frames.metric_width_px([c.value for c in cards])
with st.container(horizontal=True, gap="xsmall", key="ab_headline"):
    for card in cards:
        st.metric(card.label, card.value, delta=card.delta, delta_color=card.delta_color, help=card.help or None,
                  border=True, width=card_px, delta_arrow=card.delta_arrow)
for note in h.unsized_notes:  # its byte figures leave something out: the cards say "could not be sized", this why
    st.warning(fmt.md_text(for_ui(note)), icon=":material/warning:")
st.caption(f"Predicted tok/s use **{bw.label}**: {fmt.md_text(bw.source)}." + (f" **{caveat}**" if caveat else ""),
           help=bw.citation or None)
for note in h.assumptions:
    st.caption(f"Assumed — {note}")
for side, a in (("A", analysis_a), ("B", analysis_b)):  # a flexible package is analysed at stated shapes (#20)
    if a.program.assumed_shapes:
        shapes = "; ".join(x.text for x in a.program.assumed_shapes)  # input names come from the package: escaped
        st.caption(f"Assumed — {side}'s flexible inputs analysed at {fmt.md_text(for_ui(shapes))} (set them where the "
                   "package is analysed, on the Builds page)")
prefill_sides = [f"{side} ({a.call.tokens_per_call} prompt tokens per call)"
                 for side, a in (("A", analysis_a), ("B", analysis_b)) if a.call.phase == "prefill"]
if prefill_sides:
    what = "is a prefill function" if len(prefill_sides) == 1 else "are prefill functions"
    st.info(f"{' and '.join(prefill_sides)} {what}: the bytes and the tok/s above are per call, not per decode token "
            "(per prompt token: ÷ tokens per call). The Decode · prefill · roofline tab sets both phases side by side.",
            icon=":material/info:")

# Full-width blocks (the table, then the two settings and the equivalence side by side): nothing is squeezed at 900 px.
cats = figures.category_frame(diff)
st.markdown("**Bytes per decode token by category**")
widgets.show_table(frames.category_display(cats))
flops = figures.flops_frame(diff)
per = "per token" if analysis_a.call.phase == analysis_b.call.phase == "decode" else \
    "per token (per prompt token for a prefill)"
with st.expander(f"FLOPs {per} by category: {fmt.gflop(int(flops['a_flops'].iloc[-1]))} → "
                 f"{fmt.gflop(int(flops['b_flops'].iloc[-1]))}"):
    widgets.table_with_download(flops, "ab_flops_csv", "flops_per_token.csv",
                               display=frames.flops_display(flops),
                               caption="A multiply-add = 2 FLOPs; softmax 5 per element; elementwise and "
                                       "transcendental 1 per element (analyzer/analysis/flops.py). Per call beside.")
settings, about = st.columns(2)
with settings:
    bandwidth_control.bandwidth_control("ab")
    widgets.persisted_radio(
        "Compressed weights per token", WEIGHT_CHARGES, Key.WEIGHT_CHARGE, DEFAULT_WEIGHT_CHARGE,
        horizontal=True, format_func=frames.CHARGE_NAMES.get,
        help=f"compressed: {WEIGHT_CHARGE_TEXT['compressed']}; decompressed: {WEIGHT_CHARGE_TEXT['decompressed']}. "
             "Which one a device does is not in the graph; fp16 analyses are the same either way.")
with about:
    eq = h.equivalence or package_fold_summary(ref_a.package_path or ref_a.path,  # a package or asset and its fold
                                               ref_b.package_path or ref_b.path)
    if eq is None:
        st.info("Equivalence: not available for this pair (it is checked in torch between the variants of one "
                "source, KV mode, ctx and compression).", icon=":material/rule:")
    elif eq.unproven:  # a fold that is not proven is never shown as proven
        st.warning(f"**Equivalence**: {fmt.md_text(for_ui(equivalence_text(eq)))}.", icon=":material/gpp_maybe:")
    else:
        st.success(f"**Equivalence**: {equivalence_text(eq)}.", icon=":material/check_circle:")
backends = (analysis_a.program.backend, analysis_b.program.backend)
st.caption(f"{runtime_note(backends)} {units_note(backends)}")

# ---------------------------------------------------------------------------------------------- both backends
twin = backend_twin((ref_a, ref_b), refs)
if twin is not None:
    here = twins.BACKEND_NAMES.get(ref_a.facts.backend if ref_a.facts else "coreml", "Core ML")
    there = twins.BACKEND_NAMES.get(twin[0].facts.backend if twin[0].facts else "coreai", "Core AI")
    compression = ref_a.facts.compression if ref_a.facts else "fp16"
    with st.expander(f"The same A/B on {there}: {here} and {there} side by side ({fmt.md(compression)})",
                     expanded=compression != "fp16"):
        try:
            four = {(r.facts.backend, r.variant): analyses.load(r) for r in (ref_a, ref_b, *twin) if r.facts}
        except QfoldError as e:
            widgets.error(e, "Cannot load the other backend's pair: ")
        else:
            both = twins.twin_frame(four)
            st.plotly_chart(twins.twin_figure(both, compression), key="ab_twin_chart")
            widgets.table_with_download(both, "ab_twin_csv", "both_backends.csv")
            st.caption("Where the two backends' bytes differ, and why (per-call decompression, LUT and scale "
                       "layouts): `qfold diff` of the Core ML and the Core AI build.")
            st.button(f"Open the {there} pair", key="ab_twin_open", icon=":material/swap_horiz:",
                      on_click=widgets.set_persisted, kwargs={"values": {Key.AB_A: twin[0].id, Key.AB_B: twin[1].id}})

# ---------------------------------------------------------------------------------------------- side by side
t_bytes, t_ops, t_tiles, t_layers, t_drill, t_phases, t_place, t_graph = st.tabs(
    ["Bytes by category", "Op counts", "Tiles", "Bytes per layer", "Ops behind a total",
     "Decode · prefill · roofline", "Placement", "Graph"],
    key="ab_tab", on_change="rerun")  # stateful: only the open tab runs (OPS_FORM above)

with t_bytes:
    st.plotly_chart(figures.waterfall_figure(cats, label_a, label_b), key="ab_waterfall")
    with st.container():
        st.markdown("**Bytes per decode token** — select a row to see the ops behind it")
        shown = cats.drop(columns=["in_total"])
        picked = widgets.show_table(shown, key="ab_cat_table", on_select="rerun", selection_mode="single-row",
                                   column_config={"category": st.column_config.TextColumn(width="small")})
        st.download_button("Download CSV", frames.frame_csv(cats), "bytes_per_token.csv", "text/csv",
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
                d = figures.drilldown(analyses.op_table(ref), category)
                with col:
                    st.markdown(f"{fmt.md(label)}: **{len(d.rows):,} ops, {d.sum_bytes:,} bytes** "
                                f"({fmt.size(d.sum_bytes, 'auto', None)})")
                    if d.rows.empty:
                        st.caption(f"No op moves {category} bytes.")
                        continue
                    widgets.show_table(d.rows[["bytes", "name", "type", "layer", "rule"]], max_height=300)

with t_ops:
    if t_ops.open:
        widgets.restore_form(OPS_FORM)
        changed_only = st.toggle("Only op types whose count changed", key="ab_ops_changed")
        widgets.keep_form(OPS_FORM)
        ops = figures.op_count_frame(diff, changed_only=changed_only)
        st.plotly_chart(figures.op_count_figure(ops, label_a, label_b), key="ab_ops_chart")
        with st.container():
            st.markdown(f"**Ops: {h.total_ops_a:,} → {h.total_ops_b:,} with const, "
                        f"{h.non_const_ops_a:,} → {h.non_const_ops_b:,} without**")
            widgets.table_with_download(ops, "ab_ops_csv", "op_counts.csv", max_height=380)

with t_tiles:
    if t_tiles.open:
        for col, analysis, label in zip(st.columns(2), (analysis_a, analysis_b), (label_a, label_b), strict=True):
            tiles = figures.tile_frame(analysis)
            with col:
                unsized = analysis.summary.unsized_copies
                output = (f"{fmt.size(analysis.summary.tile_output_bytes, 'auto', None)} of output" if not unsized
                          else f"{unsized} unsized, output could not be sized")
                st.markdown(f"{fmt.md(label)}: **{len(tiles)} tile ops, {output}**")
                if len(tiles):
                    widgets.table_with_download(tiles, f"ab_tiles_csv_{label}", "tiles.csv", max_height=380,
                                               display=frames.with_units(tiles, ["output_bytes"]))
                else:
                    st.caption("No tile ops: K and V are read at their stored width.")

with t_layers:
    if t_layers.open:
        layers = figures.layer_frame(analysis_a, analysis_b, label_a, label_b)
        st.plotly_chart(figures.layer_figure(layers), key="ab_layers_chart")
        widgets.table_with_download(layers, "ab_layers_csv", "bytes_by_layer.csv", max_height=300,
                                   display=frames.with_units(layers, ["total"]))

with t_drill:
    if t_drill.open:
        st.markdown("Filter the op table down to any total: every op's bytes per token, by category, largest first.")
        widgets.restore_form({k: DRILL_FORM[k] for k in ("ab_drill_side", "ab_drill_category")})
        side = st.radio("Analysis", ["A", "B"], horizontal=True, key="ab_drill_side",
                        format_func=lambda s: f"{s}: {fmt.md(label_a if s == 'A' else label_b)}")
        ref, analysis = (ref_a, analysis_a) if side == "A" else (ref_b, analysis_b)
        ops_table = analyses.op_table(ref)
        f1, f2, f3 = st.columns(3)
        category = f1.selectbox("Category", ["total", *CATEGORIES], key="ab_drill_category")
        layer_options = ["all", *sorted(int(v) for v in ops_table["layer"].dropna().unique()), figures.OUTSIDE_LAYERS]
        type_options = ["all", *sorted(ops_table["type"].unique())]
        widgets.restore_form({k: DRILL_FORM[k] for k in ("ab_drill_layer", "ab_drill_type")},
                             {"ab_drill_layer": layer_options, "ab_drill_type": type_options})
        layer = f2.selectbox("Layer", layer_options, key="ab_drill_layer",
                             format_func=lambda v: "all layers" if v == "all" else
                             "outside the decoder layers" if v == figures.OUTSIDE_LAYERS else f"layer {v}")
        op_type = f3.selectbox("Op type", type_options, key="ab_drill_type")
        widgets.keep_form(DRILL_FORM)
        d = figures.drilldown(ops_table, category, layer, None if op_type == "all" else op_type)
        total = analysis.bytes_per_token.get(category)
        share = f", {100 * d.sum_bytes / total:.1f}% of the analysis's {category} per token" if total else ""
        st.markdown(f"**{len(d.rows):,} ops, sum {d.sum_bytes:,} bytes ({fmt.size(d.sum_bytes, 'auto', None)}, "
                    f"{fmt.size(d.sum_bytes, 'auto-si', None)})** per token{share}")
        widgets.table_with_download(d.rows, "ab_drill_csv", f"ops_{side}_{category}.csv", max_height=420)

with t_phases:
    if t_phases.open:
        phases.ab_section(ref_a, ref_b, label_a, label_b, refs, bw)

with t_place:
    if t_place.open:
        placement_tab.placement_section((analysis_a, analysis_b), (label_a, label_b))

with t_graph:
    if t_graph.open:
        joins, _ = placement_tab.placement_joins((analysis_a, analysis_b), placement_tab.session_plans())
        explorer_tab.section(ref_a, ref_b, label_a, label_b, tuple(joins))
        st.divider()
        graph_view.ab_section(ref_a, ref_b, label_a, label_b, devices=tuple(pf.op_devices(j) for j in joins))

with st.expander("Headline numbers as a table"):
    widgets.table_with_download(headline_frame(h), "ab_headline_csv", "ab_headline.csv")
