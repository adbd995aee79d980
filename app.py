"""qfold dashboard: see the KV copies GQA ``repeat_kv`` puts into a Core ML decode graph, and the Q-fold that
removes them. Run ``streamlit run app.py``; the pages live in ``app_pages/``, the logic in ``analyzer/``."""

from pathlib import Path

import streamlit as st

import analyzer
from analyzer import fmt
from analyzer.errors import QfoldError
from analyzer.report.catalog import builds_root
from app_pages import url_state

SIDEBAR_PX = 200  # Streamlit's narrowest sidebar: at 900 px wide the headline keeps two cards a row
# A local favicon: without one, Streamlit fetches the active page's material icon from fonts.gstatic.com.
st.set_page_config(page_title="qfold", page_icon=str(Path(__file__).parent / "app_pages" / "static" / "favicon.png"),
                   layout="wide", initial_sidebar_state=SIDEBAR_PX)

pages = [
    st.Page("app_pages/ab.py", title="A/B", icon=":material/compare_arrows:", default=True),
    st.Page("app_pages/builds.py", title="Builds", icon=":material/build:", url_path="builds"),
    st.Page("app_pages/device_logs.py", title="Device logs", icon=":material/upload_file:", url_path="device_logs"),
    st.Page("app_pages/bandwidth.py", title="Bandwidth", icon=":material/speed:", url_path="bandwidth"),
    st.Page("app_pages/sweeps.py", title="Sweeps", icon=":material/stacked_line_chart:", url_path="sweeps"),
    st.Page("app_pages/export.py", title="Export", icon=":material/download:", url_path="export"),
    st.Page("app_pages/graph_page.py", title="Graph", icon=":material/account_tree:", url_path="graph_page",
            visibility="hidden"),  # the A/B page's Graph tab, in a new tab
]
page = st.navigation(pages)
try:
    root = builds_root()
except QfoldError as e:  # $QFOLD_BUILDS names a file: say so on every page rather than crash on each
    st.error(f"The builds folder cannot be used: {fmt.md_text(e)}", icon=":material/error:")
    st.stop()
url_state.url_restore()  # a reload or a pasted link reopens the same comparison (A, B, packages, bandwidth)
url_state.url_save()
with st.sidebar:
    st.caption(f"qfold {analyzer.__version__} · builds in {fmt.md(root)}")
page.run()
