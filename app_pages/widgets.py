"""Pickers whose choice survives page changes, forms that keep their values, tables with their CSV
download, and errors worded for a page."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.report.frames import (
    ONE_DECIMAL_SUFFIXES,
    fit_height,
    frame_csv,
    styled,
)
from analyzer.report.messages import for_ui


def persisted_selectbox(label: str, options: Sequence[Any], key: str, default: Any = None,
                        format_func: Callable[[Any], str] = str, **kwargs: Any) -> Any:
    """A selectbox whose value lives in ``st.session_state[key]`` and so survives page changes
    (Streamlit drops the state of widgets that are not drawn)."""
    options = list(options)
    if st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else (options[0] if options else None)
    widget = f"{key}__widget"

    def sync() -> None:
        st.session_state[key] = st.session_state[widget]

    # the widget is drawn from its state, set from ``key`` each run: a value set elsewhere (set_persisted, a
    # button's "Open the matching pair") shows at once; an index would not move a picker the browser already has
    st.session_state[widget] = st.session_state[key]
    st.selectbox(label, options, key=widget, on_change=sync, format_func=format_func, **kwargs)
    return st.session_state[key]


def persisted_radio(label: str, options: Sequence[Any], key: str, default: Any, **kwargs: Any) -> Any:
    """A radio whose value lives in ``st.session_state[key]`` (other pages read it)."""
    options = list(options)
    if st.session_state.get(key) not in options:
        st.session_state[key] = default
    widget = f"{key}__widget"

    def sync() -> None:
        st.session_state[key] = st.session_state[widget]

    st.session_state[widget] = st.session_state[key]  # as persisted_selectbox: the state is the one source
    st.radio(label, options, key=widget, on_change=sync, **kwargs)
    return st.session_state[key]


def restore_form(defaults: dict[str, Any], options: dict[str, Sequence[Any]] | None = None) -> None:
    """Give a page's widgets their values back after a visit to another page (or tab): Streamlit forgets the
    state of widgets that are not drawn, so :func:`keep_form` copies it under ``<key>__kept`` (plain state, kept)
    and this puts it back (or the default) before the widgets are drawn; a value no longer among the widget's
    ``options`` (another pair's layers) becomes the default. Draw the widgets without a default
    (``value``/``index``), so the state is their one source."""
    for key, default in defaults.items():
        if key not in st.session_state:
            st.session_state[key] = st.session_state.get(f"{key}__kept", default)
        if options and key in options and st.session_state[key] not in options[key]:
            st.session_state[key] = default


def keep_form(defaults: dict[str, Any]) -> None:
    """Copy the widgets' current values where :func:`restore_form` finds them."""
    for key in defaults:
        if key in st.session_state:
            st.session_state[f"{key}__kept"] = st.session_state[key]


def set_persisted(values: dict[str, Any]) -> None:
    """Set persisted widgets' values (as a button callback: before the widgets are drawn again)."""
    for key, value in values.items():
        st.session_state[key] = value  # the widget takes it when drawn (persisted_selectbox)


def number_config(frame: pd.DataFrame) -> dict[str, Any]:
    """Thousands separators for ints, one decimal for MiB/MB, two for the rest."""
    config: dict[str, Any] = {}
    for col in frame.columns:
        name = str(col)
        if pd.api.types.is_integer_dtype(frame[col]):
            config[name] = st.column_config.NumberColumn(format="localized")
        elif pd.api.types.is_float_dtype(frame[col]):
            fmt = "%,.1f" if name.endswith(ONE_DECIMAL_SUFFIXES) else "%,.2f"  # the same rule as frames.styled
            config[name] = st.column_config.NumberColumn(format=fmt)
    return config


def show_table(frame: pd.DataFrame, *, max_height: int = 420, **kwargs: Any) -> Any:
    """``st.dataframe`` of :func:`styled` ``frame``, as tall as its rows (up to ``max_height``), missing values
    blank (``placeholder=""``; Streamlit's default shows "None")."""
    return st.dataframe(styled(frame), hide_index=True, width="stretch", height=fit_height(len(frame), max_height),
                        placeholder="", **kwargs)


def table_with_download(frame: pd.DataFrame, key: str, file_name: str, *, display: pd.DataFrame | None = None,
                        max_height: int = 420, caption: str | None = None) -> None:
    """The numbers of a chart: the table (``display`` if given) and its CSV (always the raw ``frame``)."""
    shown = frame if display is None else display
    show_table(shown, max_height=max_height)
    if caption:
        st.caption(caption)
    st.download_button("Download CSV", frame_csv(frame), file_name=file_name, mime="text/csv", key=key,
                       icon=":material/download:", on_click="ignore")


def error(e: Exception | str, prefix: str = "") -> None:
    """An expected failure, in words a page uses (no command-line flags)."""
    st.error(fmt.md_text(prefix + for_ui(str(e))), icon=":material/error:")  # messages name typed paths
