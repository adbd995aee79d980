"""The A/B page's Placement tab: a compute plan or profiler report per side, joined to its analysis; the devices
side by side, a warning for every device off the Neural Engine on which B has more ops or bytes than A, and per side
the ops off it, what did not match and the cost by byte category. The Graph tab badges ops by the same joins.

Plans come from the Device logs page (``Key.LOGS_PLANS``) or are uploaded here (``ab_plans``); each side's pick is
kept outside its widget (``ab_plan_choice_A``/``_B``), so it survives the tab being closed.
"""

from __future__ import annotations

import streamlit as st

from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.measure.placement import PlacementJoin, compare_placement, join_plan, parse_plan
from analyzer.report import placement_figures as pf
from analyzer.report.frames import with_units
from app_pages import widgets
from app_pages.session_keys import Key

PLAN_NONE = "no plan"


def remember_plan(side: str, widget: str) -> None:
    """An uploaded plan (or a pick) is kept outside the widgets, so the Graph tab badges by it too."""
    value = st.session_state.get(widget)
    if widget.startswith("ab_plan_upload"):
        if value is None:
            return
        st.session_state.setdefault("ab_plans", {})[value.name] = value.getvalue()
        value = value.name
    st.session_state[f"ab_plan_choice_{side}"] = value


def session_plans() -> dict[str, bytes]:
    """Plans read on the Device logs page, then those uploaded here (a later upload of a name replaces it)."""
    return {**dict(st.session_state.get(Key.LOGS_PLANS) or []), **st.session_state.get("ab_plans", {})}


def placement_joins(analyses: tuple, plans: dict[str, bytes]) -> tuple[list[PlacementJoin | None], list[str]]:
    """The picked plan of each side joined to its analysis, and what went wrong (user text: shown as text)."""
    joins: list[PlacementJoin | None] = []
    problems = []
    for side, analysis in zip("AB", analyses, strict=True):
        name = st.session_state.get(f"ab_plan_choice_{side}") or PLAN_NONE
        if name == PLAN_NONE or name not in plans:
            joins.append(None)
            continue
        try:
            joins.append(join_plan(parse_plan(plans[name], name), analysis))
        except QfoldError as e:
            joins.append(None)
            problems.append(f"{side}: {e}")
    return joins, problems


def placement_section(analyses: tuple, labels: tuple[str, str]) -> None:
    """Pick or upload a plan per side; the devices side by side, a warning per device off the Neural Engine that
    B loads more than A, and per side the ops off it, what did not match and the cost by byte category."""
    st.markdown("Upload what a device reported for each side (qfold's `scripts/macos/profile_coreml.py` JSON, a "
                "`qfold bench --profile-out` profile of Core AI builds, anemll-profile, CoreMLInspect or "
                "coreml_profiling output), or pick a plan read on the Device logs page. Ops are joined to the "
                "analysis by output name.")
    plans = session_plans()
    for col, side in zip(st.columns(2), "AB", strict=True):
        with col:
            st.file_uploader(f"Compute plan or profiler report for {side}", key=f"ab_plan_upload_{side}",
                             on_change=remember_plan, args=(side, f"ab_plan_upload_{side}"))
            options = [PLAN_NONE, *plans]
            choice = st.session_state.get(f"ab_plan_choice_{side}")
            st.selectbox(f"Plan of {side}", options, index=options.index(choice) if choice in options else 0,
                         key=f"ab_plan_pick_{side}", on_change=remember_plan, args=(side, f"ab_plan_pick_{side}"))
    (ja, jb), problems = placement_joins(analyses, plans)
    for problem in problems:
        st.error("A plan cannot be joined:", icon=":material/error:")
        st.text(problem)
    if ja is None and jb is None:
        st.info("No plan for A or B yet.", icon=":material/memory:")
        return
    if ja is not None and jb is not None:
        ab = compare_placement(ja, jb)
        for w in ab.warnings:
            st.warning(fmt.md_text(w.message), icon=":material/warning:")  # names ops and devices from a plan
        if not ab.warnings:
            st.success("B puts no more ops or bytes than A on the GPU or CPU.", icon=":material/check_circle:")
    frame = pf.device_frame(ja, jb)
    st.plotly_chart(pf.device_figure(frame, *labels), key="ab_place_chart")
    widgets.table_with_download(frame, "ab_place_csv", "placement_by_device.csv",
                               display=with_units(frame, ["a_bytes_per_token", "b_bytes_per_token"]))
    for col, side, j, label in zip(st.columns(2), "AB", (ja, jb), labels, strict=True):
        with col:
            st.markdown(f"**{side}:** {fmt.md(label)}")
            if j is None:
                st.caption("No plan.")
                continue
            st.text(pf.join_caption(j))
            off = pf.off_ane_frame(j)
            st.markdown(f"Off the Neural Engine: **{len(off):,} ops**")
            if len(off):
                widgets.show_table(off, max_height=300)
            shares = pf.share_frame(j)
            if len(shares):
                widgets.show_table(shares[shares["amount"] > 0], max_height=260)
            unmatched = pf.unmatched_frame(j)
            if len(unmatched):
                with st.expander(f"Not matched: {len(unmatched):,}"):
                    widgets.show_table(unmatched, max_height=300)
            for note in j.notes:
                st.caption(fmt.md_text(note))  # a note may name the plan's functions
