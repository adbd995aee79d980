"""The comparison kept in the URL: ``a`` and ``b`` (analysis ids), ``pkg`` (analysed packages, repeated; only
paths under ``$QFOLD_DATA_ROOTS``), ``shapes`` (JSON: each flexible package's given input shapes), ``bw`` (the
bandwidth setting), ``charge`` (the weight charge) and ``logs`` (the token of this session's device logs kept on
the server: ``app_pages.logs_store``), so a reload or a pasted link reopens the same A/B with the same logs.
``app.py`` runs both on every page."""

from __future__ import annotations

import json

import streamlit as st

from analyzer import fmt
from analyzer.analysis.accounting import WEIGHT_CHARGES
from analyzer.analysis.shapes import parse_shape_args
from analyzer.errors import QfoldError
from analyzer.report.bandwidth_setting import (
    BandwidthSetting,
    BandwidthSettingError,
)
from analyzer.report.catalog import package_refs
from analyzer.report.messages import for_ui
from app_pages import logs_state, logs_store
from app_pages.analyses import analysis_refs, model_folder, set_package_shapes, weight_charge
from app_pages.bandwidth_control import bandwidth_setting, device_profiles
from app_pages.session_keys import Key


def url_restore() -> None:
    """Once per browser session (a first load, a reload, a pasted link): take the comparison from the URL."""
    if st.session_state.get(Key.URL_RESTORED):
        return
    st.session_state[Key.URL_RESTORED] = True
    qp = st.query_params
    errors: list[str] = []
    packages = list(st.session_state.get(Key.BUILDS_PACKAGES, []))
    for text in qp.get_all("pkg"):
        try:
            path = model_folder(text)
        except QfoldError as e:
            errors.append(f"analysed package in the link: {fmt.md_text(for_ui(str(e)))}")
            continue
        if str(path) not in packages:
            packages.append(str(path))
    st.session_state[Key.BUILDS_PACKAGES] = packages
    errors += _restore_shapes(qp.get("shapes"), packages)
    known = {r.id for r in analysis_refs()}
    for param, key in (("a", Key.AB_A), ("b", Key.AB_B)):
        if not qp.get(param):
            continue
        if qp[param] in known:
            st.session_state[key] = qp[param]
        else:
            errors.append(f"its {param.upper()} ({fmt.md(qp[param])}) is not among the analyses on this server (a "
                          "build made elsewhere, or removed); the default is shown instead")
    if qp.get("bw"):
        try:
            st.session_state[Key.BW_SETTING] = BandwidthSetting.from_text(qp["bw"], device_profiles())
        except BandwidthSettingError as e:
            errors.append(f"the link's {fmt.md_text(e)}")
    if qp.get("charge") in WEIGHT_CHARGES:
        st.session_state[Key.WEIGHT_CHARGE] = qp["charge"]
    if qp.get("logs") and not logs_state.restore(qp["logs"]):
        errors.append("its device logs are no longer kept on this server (kept for "
                      f"{logs_store.KEEP_DAYS} days after their last use); the example log is shown instead")
    st.session_state[Key.URL_ERRORS] = errors


def _restore_shapes(text: str | None, packages: list[str]) -> list[str]:
    """The link's ``shapes`` (JSON: package path → {input name: shape}) for its packages, each checked as the
    Builds page checks a typed one; what is refused is reported and that package analysed at its defaults."""
    if not text:
        return []
    try:
        given = json.loads(text)
        if not isinstance(given, dict):
            raise ValueError("not an object")
    except ValueError as e:
        return [f"the link's shapes are not JSON of package path → shapes ({fmt.md_text(e)}); defaults used"]
    errors = []
    for path, shapes in given.items():
        if path not in packages:
            continue
        try:
            parsed = parse_shape_args([f"{n}=" + ",".join(map(str, d)) for n, d in dict(shapes).items()])
            package_refs(path, parsed)
        except (QfoldError, TypeError, ValueError) as e:
            errors.append(f"shapes of {fmt.md(path)} in the link: {fmt.md_text(for_ui(str(e)))}; defaults used")
            continue
        set_package_shapes(path, parsed)
    return errors


def url_save() -> None:
    """Keep the comparison in the URL (only what changed is written)."""
    wanted: dict[str, list[str]] = {
        "a": [st.session_state[Key.AB_A]] if st.session_state.get(Key.AB_A) else [],
        "b": [st.session_state[Key.AB_B]] if st.session_state.get(Key.AB_B) else [],
        "pkg": list(st.session_state.get(Key.BUILDS_PACKAGES, [])),
        "shapes": [json.dumps(given)] if (given := st.session_state.get(Key.BUILDS_PACKAGE_SHAPES)) else [],
        "bw": [bandwidth_setting().to_text()] if Key.BW_SETTING in st.session_state else [],
        "charge": [weight_charge()] if Key.WEIGHT_CHARGE in st.session_state else [],
        "logs": [token] if logs_store.is_token(token := st.session_state.get(Key.LOGS_TOKEN)) else [],
    }
    qp = st.query_params
    for param, values in wanted.items():
        if qp.get_all(param) != values:
            if values:
                qp[param] = values if len(values) > 1 else values[0]
            elif param in qp:
                del qp[param]


def url_errors() -> list[str]:
    """What a link asked for that this server cannot show (shown once, on the A/B page), as markdown whose
    link-given parts are already :func:`fmt.md` / :func:`fmt.md_text`."""
    return st.session_state.pop(Key.URL_ERRORS, [])
