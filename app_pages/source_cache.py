"""The Builds page's model sources, resolved once per input and cached: a preset, an uploaded config.json (parsed in
memory; only a server-chosen name touches disk) or a local folder (re-read when its files change)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import streamlit as st

from analyzer.errors import QfoldError, SourceError
from analyzer.fsio import loads_strict
from analyzer.model.sources import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    AttentionGeometry,
    ModelSource,
    geometry_of,
    load_config,
    resolve_source,
    safe_label,
)


@st.cache_data(show_spinner="Reading the model config…", max_entries=32)
def resolve_preset(name: str, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    source = resolve_source(name, overrides)
    return source, geometry_of(load_config(source))


@st.cache_data(show_spinner="Reading the uploaded config…", max_entries=32)
def resolve_uploaded(data: bytes, file_name: str, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    """Parse the upload in memory; only a server-chosen name (a hash of the content) ever touches disk. The
    source is labelled by the file's name and model type (``my-llama-llama``; ``config.json`` → ``llama``), made
    filesystem-safe: the name is a label, never a path. Parsed as strictly as the CLI reads a config.json
    (``loads_strict``: no integer of more than 32 digits, no NaN or infinity), with the CLI's messages."""
    try:
        if len(data) > MAX_CONFIG_BYTES:
            raise SourceError(f"{file_name}: {len(data):,} bytes, more than the {MAX_CONFIG_BYTES:,} this file may "
                              "have")  # the CLI's words (fsio.read_bytes_bounded)
        raw = loads_strict(data.decode("utf-8-sig"), file_name, MAX_CONFIG_DEPTH, SourceError)
    except UnicodeDecodeError as e:
        raise SourceError(f"{file_name}: not UTF-8 text (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise SourceError(f"{file_name}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e
    if not isinstance(raw, dict):
        raise SourceError(f"{file_name}: a config.json holds a JSON object, not a {type(raw).__name__}")
    with tempfile.TemporaryDirectory(prefix="qfold-upload-") as tmp:
        folder = Path(tmp) / f"upload-{hashlib.sha256(data).hexdigest()[:10]}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(raw), encoding="utf-8")
        source = resolve_source(str(folder / "config.json"), overrides)
    source = replace(source, label=upload_label(file_name, str(raw.get("model_type", ""))))
    return source, geometry_of(load_config(source))


def upload_label(file_name: str, model_type: str) -> str:
    """``my-llama.json`` + ``llama`` → ``my-llama-llama``; ``config.json`` → ``llama``; filesystem-safe."""
    stem = Path(file_name).name.rsplit(".", 1)[0]
    words = [w for w in (stem if stem.lower() != "config" else "", model_type) if w]
    if len(words) == 2 and model_type.lower() in stem.lower():
        words = [stem]
    return safe_label("-".join(words) or "upload")


@st.cache_data(show_spinner="Reading the model folder (hashing its safetensors)…", max_entries=16)
def resolve_folder(path: str, stamp: tuple, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    source = resolve_source(path, overrides)
    return source, geometry_of(load_config(source))


def folder_stamp(path: Path) -> tuple:
    """What decides whether a folder's resolution is still valid: its files' names, sizes and times."""
    try:
        return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime) for p in path.iterdir() if p.is_file()))
    except OSError:
        return ()


def cached_call(fn, *args):
    try:
        return fn(*args)
    except QfoldError:
        fn.clear(*args)
        raise
