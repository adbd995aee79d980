"""The Graph view: the whole-program structural diff of A and B, and any layer of A and B drawn side by side
(or of one analysis alone). The A/B page calls :func:`ab_section` from its Graph tab.

Renderer: Graphviz ``dot`` on the server, the two SVGs in one frame (``st.iframe``) with CSS-only zoom and a
shared scroll pane. ``st.graphviz_chart`` (checked in Streamlit 1.67: it lays DOT out in the browser with a
bundled WASM Graphviz and fetches nothing from outside) is the fallback when ``dot`` is not installed; it
fits each chart to its own column and turns d3-graphviz's zoom off, so two charts lose their common scale
and their row alignment, which is why it is not the first choice. The CLI and the HTML report draw the same
:class:`~analyzer.report.graphview.LayerView` with the same ``dot``.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import streamlit as st

from analyzer import fmt
from analyzer.analysis.record import Analysis, load_analysis
from analyzer.analysis.shapes import shapes_label
from analyzer.compare.structdiff import StructuralDiff, structural_diff
from analyzer.errors import QfoldError
from analyzer.ir.coreml.mil_reader import MilProgram
from analyzer.report import frames
from analyzer.report import graphview as gv
from analyzer.report.catalog import AnalysisRef
from analyzer.report.messages import for_ui
from app_pages import widgets

FRAME_HEIGHT_PX = 760
FULL_HEIGHT_PX = 1400  # the full-width view and the new tab: taller, every side fitted to the width
MODES = ("A vs B", "A only", "B only")
FRAMES = ("in the page", "full width")  # the frame: zoom 75% in 760 px, or each side fitted to the page's width
GRAPH_PAGE = "graph_page"  # the new-tab view (app_pages/graph_page.py): the same frame alone, from the URL


Key = tuple[str, str | None, float, tuple]  # path, function, mtime, given shapes: what a cached program is keyed by


def _key(ref: AnalysisRef) -> Key:
    path = Path(ref.path)
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = 0.0
    return str(path), ref.function, mtime, ref.shapes


@st.cache_resource(show_spinner="Reading the program…", max_entries=6)
def _program(path: str, function: str | None, mtime: float, shapes: tuple = ()) -> MilProgram:
    # a build, an analysis.json or one function of a package; a flexible package at its shapes
    return load_analysis(path, function, shapes=dict(shapes) or None).program


@st.cache_resource(show_spinner="Aligning the two programs layer by layer…", max_entries=4)
def _diff(a: Key, b: Key) -> StructuralDiff:
    return structural_diff(_program(*a), _program(*b))


@st.cache_resource(show_spinner="Laying the graphs out…", max_entries=16)
def _view(a: Key, b: Key | None, layer: str, collapse: bool, label_a: str,
          label_b: str, key_a: str, devices: tuple = ()) -> tuple[gv.LayerView, tuple[str, ...] | None, str | None]:
    """The layer's picture; its SVGs when Graphviz is installed and can draw it (else None); and why it cannot
    be drawn at all (too large), else None."""
    program_b = _program(*b) if b is not None else None
    view = gv.layer_view(_program(*a), program_b, gv.parse_layer(layer), label_a=label_a, label_b=label_b,
                         collapse=collapse, diff=_diff(a, b) if b is not None else None, keys=(key_a, "B"),
                         devices=devices)
    try:
        gv.check_layout_size(view)
    except gv.GraphvizError as e:
        return view, None, str(e)
    return view, tuple(gv.render_sides(view)) if gv.dot_binary() else None, None


def _not_sized(program: MilProgram) -> str:
    """" (NOT SIZED)" for a side that could not be sized (its missing sizes are not drawn as zero), else ""."""
    return "" if Analysis(program).sizing.sized else " (NOT SIZED)"


def _layer_label(value: str) -> str:
    return "outside the layers (embedding, final norm, lm_head)" if value == gv.OUTSIDE_LAYERS else f"layer {value}"


def _pick_layer_from_table(choices: list[str]) -> None:
    """The structural-diff table's row selection opens that layer in the picker."""
    selection = st.session_state.get("ab_graph_table")
    rows = selection.selection.rows if selection is not None else []
    if rows and rows[0] < len(choices):
        st.session_state["ab_graph_layer"] = choices[rows[0]]


def ab_section(ref_a: AnalysisRef, ref_b: AnalysisRef, label_a: str, label_b: str,
               devices: tuple = ((), ())) -> None:
    """Structural diff (click a layer) and the layer's graphs; "A only" / "B only" show one analysis.
    ``devices``: per side, (op index, device) pairs from the Placement tab's plans: ops badged by device."""
    try:
        key_a, key_b = _key(ref_a), _key(ref_b)
        program_a, program_b = _program(*key_a), _program(*key_b)
    except QfoldError as e:
        widgets.error(e, "Cannot read the program: ")
        return
    for side, program in (("A", program_a), ("B", program_b)):  # flexible packages: the shapes drawn (#20)
        if program.assumed_shapes:
            st.caption(f"{side} is drawn at its flexible inputs' shapes: "
                       + fmt.md_text(for_ui("; ".join(x.text for x in program.assumed_shapes))))
    label_a += shapes_label(program_a.assumed_shapes) + _not_sized(program_a)
    label_b += shapes_label(program_b.assumed_shapes) + _not_sized(program_b)
    mode = st.segmented_control("Show", MODES, default=MODES[0], key="ab_graph_mode") or MODES[0]
    pair = mode == "A vs B"
    if pair:
        diff = _diff(key_a, key_b)
        choices = [gv.OUTSIDE_LAYERS if d.layer is None else str(d.layer) for d in diff.layers]
        st.markdown(f"**Structural diff** ({program_a.total_ops:,} → {program_b.total_ops:,} ops, const included): "
                    f"{diff.verdict}.")
        table = gv.structdiff_frame(diff)
        st.dataframe(table, hide_index=True, width="stretch", height=frames.fit_height(len(table), 280),
                     key="ab_graph_table", on_select=lambda: _pick_layer_from_table(choices),
                     selection_mode="single-row", column_config=widgets.number_config(table))
        st.download_button("Download CSV", frames.frame_csv(table), "structural_diff.csv", "text/csv",
                           key="ab_graph_diff_csv", icon=":material/download:", on_click="ignore")
        st.caption("Select a row to open that layer below. matched: same op type and output shapes; changed: the "
                   "same op at the same place computing other shapes; constants are matched through the op that "
                   "reads them.")
    else:
        one = program_a if mode == "A only" else program_b
        choices = [gv.OUTSIDE_LAYERS if x is None else str(x) for x in gv.layer_choices(one)]
    single_side = None if pair else ("a" if mode == "A only" else "b")
    if any(devices):
        st.caption("Ops are badged with the device the Placement tab's plan put them on (ANE, GPU, CPU); a purple "
                   "border marks an op off the Neural Engine.")
    _layer_graphs(choices, key_a, key_b, label_a, label_b, single_side, devices)


def _layer_graphs(choices: list[str], key_a: Key, key_b: Key, label_a: str, label_b: str,
                  single_side: str | None, devices: tuple = ((), ())) -> None:
    if st.session_state.get("ab_graph_layer") not in choices:
        st.session_state["ab_graph_layer"] = choices[0] if choices else None
    if not choices:
        st.info("This program has no ops to draw.")
        return
    pick, fold = st.columns([3, 2], vertical_alignment="bottom")
    layer = pick.selectbox("Layer to draw", choices, key="ab_graph_layer", format_func=_layer_label)
    collapse = fold.toggle("Collapse chains of elementwise ops", value=True, key="ab_graph_collapse",
                           help="A run of elementwise ops, reductions and views with one status and one reader "
                                "each becomes one dashed node; the tooltip lists its ops.")
    if single_side is None:
        args, placed = (key_a, key_b, label_a, label_b, "A"), tuple(devices)
    elif single_side == "a":
        args, placed = (key_a, None, label_a, "", "A"), tuple(devices[:1])
    else:
        args, placed = (key_b, None, label_b, "", "B"), tuple(devices[1:])
    try:
        view, svgs, too_large = _view(args[0], args[1], layer, collapse, *args[2:], placed)
    except QfoldError as e:
        widgets.error(e)
        return
    if too_large:
        st.warning(fmt.md_text(too_large))
    elif svgs is not None:
        shown, tab = st.columns([3, 1], vertical_alignment="bottom")
        frame = shown.segmented_control("Frame", FRAMES, default=FRAMES[0], key="ab_graph_frame") or FRAMES[0]
        tab.link_button("Open in a new tab", new_tab_url(layer, collapse, single_side), icon=":material/open_in_new:",
                        help="The same frame alone in a browser tab, every side fitted to its width.")
        draw_frame(view, svgs, full=frame == FRAMES[1])
    else:
        st.caption("Graphviz `dot` is not installed on this server: the graphs are laid out in your browser "
                   "(`st.graphviz_chart`), each fitted to its column, so rows may not line up.")
        for col, i in zip(st.columns(len(view.sides)), range(len(view.sides)), strict=True):
            with col:
                st.markdown(f"**{view.sides[i].key}:** {fmt.md(view.sides[i].label)}")
                st.graphviz_chart(gv.side_dot(view, i), width="stretch")
    programs = [_program(*args[0])] + ([_program(*args[1])] if args[1] is not None else [])
    nodes = gv.nodes_frame(view, programs)
    stem = f"graph_{layer}"
    c1, c2, c3, c4 = st.columns(4)
    c1.download_button("Download DOT", gv.view_dot(view), f"{stem}.dot", "text/vnd.graphviz", key="ab_graph_dot",
                       icon=":material/download:", on_click="ignore")
    if svgs is not None:
        c2.download_button("Download SVG", lambda: gv.render_view(view), f"{stem}.svg", "image/svg+xml",
                           key="ab_graph_svg", icon=":material/download:", on_click="ignore")
    c3.download_button("Download nodes CSV", frames.frame_csv(nodes), f"{stem}_nodes.csv", "text/csv",
                       key="ab_graph_nodes_csv", icon=":material/download:", on_click="ignore")
    if view.diff is not None:
        rows = gv.alignment_frame(view.diff, programs[0], programs[1])
        c4.download_button("Download alignment CSV", frames.frame_csv(rows), f"{stem}_alignment.csv", "text/csv",
                           key="ab_graph_align_csv", icon=":material/download:", on_click="ignore")
    with st.expander("The numbers behind the graph: one row per node"):
        st.dataframe(nodes, hide_index=True, width="stretch", height=frames.fit_height(len(nodes), 360),
                     column_config=widgets.number_config(nodes))


def draw_frame(view: gv.LayerView, svgs, full: bool) -> None:
    """The frame of A and B (one scroll pane, CSS zoom): 760 px at 75%, or full width (each side fitted to the
    page's width, 1,400 px tall) so B needs no horizontal scrolling."""
    height = FULL_HEIGHT_PX if full else FRAME_HEIGHT_PX
    st.iframe(gv.pair_html(view, svgs, height_px=height, zoom="fit" if full else "75"), height=height,
              alt=f"Graph of {view.title}")


def new_tab_url(layer: str, collapse: bool, single_side: str | None) -> str:
    """The new-tab view's address: this page's query (the A/B, packages, shapes, bandwidth) with the layer, the
    side(s) and the collapse setting, relative to the app's own path."""
    query = [(k, v) for k in st.query_params for v in st.query_params.get_all(k)
             if k not in ("layer", "side", "collapse")]
    query += [("layer", layer), ("side", single_side or "ab"), ("collapse", "1" if collapse else "0")]
    return f"./{GRAPH_PAGE}?{urlencode(query)}"


def standalone(ref_a: AnalysisRef, ref_b: AnalysisRef, label_a: str, label_b: str) -> None:
    """The new-tab view: the frame of the URL's layer and side(s), full width, nothing else."""
    qp = st.query_params
    side = qp.get("side", "ab")
    single_side = side if side in ("a", "b") else None
    collapse = qp.get("collapse", "1") != "0"
    try:
        key_a, key_b = _key(ref_a), _key(ref_b)
        program = _program(*(key_b if single_side == "b" else key_a))
        choices = [gv.OUTSIDE_LAYERS if x is None else str(x) for x in gv.layer_choices(program)]
        layer = qp.get("layer") if qp.get("layer") in choices else (choices[0] if choices else None)
        if layer is None:
            st.info("This program has no ops to draw.")
            return
        args = {None: (key_a, key_b, label_a, label_b, "A"), "a": (key_a, None, label_a, "", "A"),
                "b": (key_b, None, label_b, "", "B")}[single_side]
        view, svgs, too_large = _view(args[0], args[1], layer, collapse, *args[2:])
    except QfoldError as e:
        widgets.error(e, "Cannot draw the graph: ")
        return
    st.caption(f"{_layer_label(layer)}: " + " vs ".join(f"{g.key} {fmt.md(g.label)}" for g in view.sides))
    if too_large:
        st.warning(fmt.md_text(too_large))
    elif svgs is None:
        st.caption("Graphviz `dot` is not installed on this server: open the Graph tab of the A/B page instead.")
    else:
        draw_frame(view, svgs, full=True)
