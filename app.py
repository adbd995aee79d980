"""qfold dashboard: see the KV copies GQA ``repeat_kv`` puts into a Core ML decode graph, and the Q-fold that
removes them. Run ``streamlit run app.py``; the pages live in ``app_pages/``, the logic in ``analyzer/``."""

import streamlit as st

import analyzer
from app_pages import shared

st.set_page_config(page_title="qfold", layout="wide")  # no page_icon: a material icon favicon is fetched online

pages = [
    st.Page("app_pages/ab.py", title="A/B", icon=":material/compare_arrows:", default=True),
    st.Page("app_pages/builds.py", title="Builds", icon=":material/build:", url_path="builds"),
    st.Page("app_pages/device_logs.py", title="Device logs", icon=":material/upload_file:", url_path="device_logs"),
    st.Page("app_pages/bandwidth.py", title="Bandwidth model", icon=":material/speed:", url_path="bandwidth"),
    st.Page("app_pages/export.py", title="Export", icon=":material/download:", url_path="export"),
]
page = st.navigation(pages)
with st.sidebar:
    st.caption(f"qfold {analyzer.__version__} · builds in `{shared.builds_root()}`")
page.run()
