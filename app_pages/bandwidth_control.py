"""The one bandwidth setting every page's predictions use, and the control that edits it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import streamlit as st

from analyzer import fmt
from analyzer.predict.fit import BandwidthFit
from analyzer.predict.profiles import DeviceProfile, load_profiles
from analyzer.report.bandwidth_setting import (
    SOURCE_NAMES,
    SOURCES,
    BandwidthSetting,
    ResolvedBandwidth,
    profile_name,
    resolve,
)
from analyzer.report.catalog import (
    AnalysisRef,
)
from app_pages.logs_state import (
    bandwidth_analysis,
    graph_bytes,
    log_import,
    log_mapping,
)
from app_pages.session_keys import Key


@st.cache_resource(show_spinner=False)
def device_profiles() -> Mapping[str, DeviceProfile]:
    """The write-up's constant and the cited profiles of ``analyzer/predict/device_profiles.csv`` (read-only)."""
    return load_profiles()


def bandwidth_setting() -> BandwidthSetting:
    return st.session_state.get(Key.BW_SETTING) or BandwidthSetting()


def bandwidth_control(where: str) -> BandwidthSetting:
    """The one bandwidth setting, drawn where predictions are made (A/B, Bandwidth): every copy edits the same
    ``bw_setting``, so the A/B headline, the Bandwidth page's verdicts and residuals and the report agree."""
    profiles = device_profiles()
    setting = bandwidth_setting()
    keys = {name: f"bwset_{where}_{name}" for name in ("source", "profile", "typed")}
    st.session_state[keys["source"]] = setting.source  # widgets drawn from the shared value every run
    st.session_state[keys["profile"]] = setting.profile_key if setting.profile_key in profiles else \
        BandwidthSetting().profile_key
    st.session_state[keys["typed"]] = float(setting.typed_mb_per_s)

    def sync() -> None:
        st.session_state[Key.BW_SETTING] = BandwidthSetting(st.session_state[keys["source"]],
                                                    st.session_state[keys["profile"]],
                                                    float(st.session_state[keys["typed"]]))

    source = st.radio("Bandwidth for predictions", SOURCES, key=keys["source"], horizontal=True, on_change=sync,
                      format_func=lambda v: SOURCE_NAMES[v],
                      help="One setting for the A/B page, the Bandwidth page and the report. tok/s = BW ÷ bytes "
                           "per token; 1 MB = 10^6 bytes.")
    if source == "profile":
        st.selectbox("Device profile", list(profiles), key=keys["profile"], on_change=sync,
                     format_func=lambda k: f"{fmt.bandwidth(profiles[k].bytes_per_s)} · {profile_name(profiles[k])}",
                     help=profiles[setting.profile_key].source if setting.profile_key in profiles else None)
    elif source == "typed":
        st.number_input("Bandwidth (MB/s, 1 MB = 10^6 bytes)", min_value=0.001, max_value=1e10, step=100.0,
                        format="%.2f", key=keys["typed"], on_change=sync)
    return bandwidth_setting()


def resolved_bandwidth(refs: Sequence[AnalysisRef], prefer_device: str | None = None) -> ResolvedBandwidth:
    """What the bandwidth setting means now (for "fitted": the fits of this session's logs)."""
    setting = bandwidth_setting()
    fits: Sequence[BandwidthFit] = ()
    if setting.source == "fitted":
        imported = log_import()
        if imported.measurements:
            labels = list(dict.fromkeys(m.build for m in imported.measurements))
            mapping = log_mapping(labels, refs)
            fits = bandwidth_analysis(imported, graph_bytes(mapping, refs), fixed_bw_bytes_per_s=None,
                                      overhead=False).fits
    return resolve(setting, device_profiles(), fits, prefer_device)
