"""The Graph tab's "Open the whole program in Model Explorer": for A, B or the pair, a download of the bundle (graphs
and overlays, one zip; the Placement tab's plans joined in: device and cost on each op, the device overlay) and,
only when this app is served on localhost and Model Explorer is installed, a link to an instance qfold started for
it (at most two per session; stopped with the session, or here).
"""

from __future__ import annotations

import streamlit as st

from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.measure.placement import PlacementJoin
from analyzer.report import explorer as mx
from analyzer.report.catalog import AnalysisRef
from app_pages import analyses, widgets

PROGRAMS = ("A and B", "A", "B")
MAX_INSTANCES = 2
INSTANCES = "ab_mx_instances"  # this session's running Model Explorers: [(what, ExplorerInstance)]


@st.cache_resource(show_spinner="Exporting the whole program for Model Explorer…", max_entries=2)
def _bundle(keys: tuple, labels: tuple[str, ...], _refs: tuple[AnalysisRef, ...],
            _joins: tuple[PlacementJoin | None, ...]) -> mx.Bundle:
    """The bundle of one or two analyses (``keys``: what the cached bundle depends on: the analyses, their labels
    and the plans joined to them)."""
    sides = [mx.ExploreSide(label, (analyses.load(ref),), join, str(ref.path))
             for label, ref, join in zip(labels, _refs, _joins, strict=True)]
    return mx.build_bundle(*sides)


def serving_locally() -> bool:
    """This app listens on localhost only and the browser reached it there: a link to 127.0.0.1 reaches the same
    machine."""
    return mx.is_local(st.get_option("server.address")) and mx.is_local(st.context.headers.get("Host"))


def _instances() -> list[tuple[str, mx.ExplorerInstance]]:
    running = [(what, inst) for what, inst in st.session_state.get(INSTANCES, []) if inst.alive]
    st.session_state[INSTANCES] = running
    return running


def section(ref_a: AnalysisRef, ref_b: AnalysisRef, label_a: str, label_b: str,
            joins: tuple[PlacementJoin | None, PlacementJoin | None] = (None, None)) -> None:
    st.markdown("**Open the whole program in Model Explorer** (Google AI Edge): every op of every layer, layers as "
                "collapsible groups, qfold's bytes, FLOPs, copies and devices as overlays; A and B side by side, "
                "navigation synced by the structural diff.")
    which = st.segmented_control("Program", PROGRAMS, default=PROGRAMS[0], key="ab_mx_which") or PROGRAMS[0]
    picked = {"A and B": (0, 1), "A": (0,), "B": (1,)}[which]
    refs, labels = (ref_a, ref_b), (label_a, label_b)
    key = tuple((analyses.mtime(refs[k].path), str(refs[k].path), refs[k].function, refs[k].shapes, labels[k],
                 None if joins[k] is None else (joins[k].plan_file, joins[k].n_matched)) for k in picked)
    try:
        bundle = _bundle(key, tuple(labels[k] for k in picked), tuple(refs[k] for k in picked),
                         tuple(joins[k] for k in picked))
    except QfoldError as e:
        widgets.error(e, "Cannot export the program: ")
        return
    stem = "model_explorer_" + "_".join("ab"[k] for k in picked)
    placed = [f"{'AB'[k]}: {joins[k].plan_file}" for k in picked if joins[k] is not None]
    c1, c2 = st.columns(2)
    c1.download_button("Download the bundle (zip)", bundle.zip_bytes, f"{stem}.zip", "application/zip",
                       key="ab_mx_zip", icon=":material/download:", on_click="ignore")
    c1.caption(f"{len(bundle.files)} files: " + ", ".join(f"`{n}`" for n in list(bundle.files)[:3]) + ", …"
               + (" With the Placement tab's plans joined (" + fmt.md_text("; ".join(placed)) + ")." if placed
                  else " No placement plan picked on the Placement tab."))
    c1.caption("Open it with `python -m model_explorer a.graph.json[,b.graph.json] --node_data_paths=…` "
               "(the README's `qfold explore` section).")
    with c2:
        _local_link(bundle, which)


def _local_link(bundle: mx.Bundle, which: str) -> None:
    if not serving_locally():
        st.caption("A link to a running Model Explorer is offered only when this app is served on localhost.")
        return
    if not mx.explorer_installed():
        st.caption("Model Explorer is not installed on this server: " + fmt.md_text(mx.INSTALL_LINE))
        return
    running = _instances()
    if len(running) < MAX_INSTANCES and st.button(f"Start Model Explorer for {which}", key="ab_mx_start",
                                                  icon=":material/rocket_launch:"):
        try:
            with st.spinner("Starting Model Explorer…"):
                running.append((which, mx.start_explorer(bundle)))
        except QfoldError as e:
            widgets.error(e, "Model Explorer did not start: ")
        else:
            st.session_state[INSTANCES] = running
            st.rerun()  # draw the link, and no start button past the limit
    if len(running) >= MAX_INSTANCES:
        st.caption(f"{MAX_INSTANCES} instances run for this session (the most it starts): stop one to start another.")
    for k, (what, inst) in enumerate(running):
        st.link_button(f"Open {what} in Model Explorer (127.0.0.1:{inst.port})", inst.url,
                       icon=":material/open_in_new:")
        if st.button(f"Stop it ({what}, port {inst.port})", key=f"ab_mx_stop_{k}_{inst.port}"):
            inst.stop()
            st.session_state[INSTANCES] = [x for x in running if x[1] is not inst]
            st.rerun()
