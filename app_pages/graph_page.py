"""The Graph tab's frame alone, in a tab of its own (``/graph_page?a=…&b=…&layer=…&side=…&collapse=…``): the A/B page's
"Open in a new tab" links here. Not in the navigation; the URL carries what to draw."""

from __future__ import annotations

import streamlit as st

from app_pages import analyses, graph_view, logs_state

refs = analyses.analysis_refs()
pair = logs_state.ab_pair(refs)
if pair is None:
    st.warning("No analyses to draw: open the A/B page first.")
    st.stop()
ref_a, ref_b = pair
graph_view.standalone(ref_a, ref_b, analyses.short_label(ref_a), analyses.short_label(ref_b))
