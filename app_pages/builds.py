"""Builds: convert a model (preset, uploaded config.json or a local folder) with one or more variants, follow
the conversion, see the machine-wide queue and the cached builds, or analyse a .mlpackage made elsewhere."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from analyzer.build.builds import ANALYSIS_MODE, BUILD_MODES, LOG_FILE, BuildSpec, is_complete, list_builds, queue
from analyzer.build.costs import estimate_cost, weight_bytes_of
from analyzer.build.jobs import BuildJob
from analyzer.errors import QfoldError, SourceError
from analyzer.fmt import MIB
from analyzer.model.sources import (
    DEFAULT_PRESET,
    STRUCTURE_OVERRIDES,
    AttentionGeometry,
    ModelSource,
    geometry_of,
    list_presets,
    load_config,
    resolve_source,
)
from analyzer.model.variants import KV_MODES, VARIANTS
from analyzer.report.catalog import describe_spec, package_ref
from app_pages import shared

CUSTOM = "custom spec…"
LOG_TAIL_LINES = 80

st.title("Builds")
root = shared.builds_root()
st.caption(f"Each build converts the decode step to Core ML (iOS18, fp16) in a child process and is cached by a "
           f"content hash in `{root}`. Conversions run in the background: this page, and every other session, "
           "keeps working while they run.")


# ---------------------------------------------------------------------------------------------- sources
@st.cache_data(show_spinner="Reading the model config…", max_entries=32)
def resolve_preset(name: str, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    source = resolve_source(name, overrides)
    return source, geometry_of(load_config(source))


@st.cache_data(show_spinner="Reading the uploaded config…", max_entries=32)
def resolve_uploaded(data: bytes, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    """Parse the upload in memory; only a server-chosen name (a hash of the content) ever touches disk."""
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise SourceError(f"the uploaded config is not UTF-8 text (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise SourceError(f"the uploaded config is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
    if not isinstance(raw, dict):
        raise SourceError(f"a config.json holds a JSON object, not a {type(raw).__name__}")
    with tempfile.TemporaryDirectory(prefix="qfold-upload-") as tmp:
        folder = Path(tmp) / f"upload-{hashlib.sha256(data).hexdigest()[:10]}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(raw), encoding="utf-8")
        source = resolve_source(str(folder / "config.json"), overrides)
    return source, geometry_of(load_config(source))


@st.cache_data(show_spinner="Reading the model folder (hashing its safetensors)…", max_entries=16)
def resolve_folder(path: str, stamp: tuple, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    source = resolve_source(path, overrides)
    return source, geometry_of(load_config(source))


@st.cache_data(show_spinner="Counting the model's parameters…", max_entries=32)
def model_weight_bytes(source: ModelSource) -> int:
    return weight_bytes_of(source)


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


# ---------------------------------------------------------------------------------------------- new build
with st.container(border=True):
    st.subheader("New build")
    kind = st.radio("Model source", ["Preset", "Upload config.json", "Local model folder"], horizontal=True,
                    key="builds_source_kind")
    structure = st.toggle("Structure config: same layers, heads, head_dim and ctx; hidden 256, vocab 1000 (same tiles "
                          "and tile bytes, ~20× faster, ~1 GB)", value=True, key="builds_structure")
    c1, c2, c3 = st.columns(3)
    layers = c1.number_input("Decoder layers (0 = as in the config)", min_value=0, max_value=256, value=0, step=1,
                             key="builds_layers")
    ctx = c2.number_input("Context length (cache slots)", min_value=16, max_value=131_072, value=4096, step=256,
                          key="builds_ctx")
    kv_mode = c3.radio("KV cache", KV_MODES, horizontal=True, key="builds_kv",
                       format_func=lambda m: {"state": "Core ML state", "input": "inputs (read-only)"}.get(m, m))
    mode = st.radio("Build mode", list(BUILD_MODES), index=list(BUILD_MODES).index(ANALYSIS_MODE), horizontal=True,
                    key="builds_mode", help="Both modes give the same analysis, op for op.")
    st.caption(f"**{mode}**: {BUILD_MODES[mode]}.")
    c4, c5 = st.columns(2)
    variants = c4.multiselect("Variants", sorted(VARIANTS), default=["repeat_kv", "qfold"], key="builds_variants")
    has_compress = importlib.util.find_spec("analyzer.build.compress") is not None
    presets_c = {}
    if has_compress:
        from analyzer.build.compress import PRESETS as presets_c  # base, top8, top12 (write-up section 4)
    compression = c5.selectbox("Weight compression", ["none", *presets_c, *([CUSTOM] if has_compress else [])],
                               key="builds_compression", disabled=not has_compress,
                               format_func=lambda c: f"{c}: {presets_c[c].description}" if c in presets_c else c,
                               help=None if has_compress else "analyzer.build.compress is not in this version")
    if compression == CUSTOM:
        compression = st.text_input("Compression spec", key="builds_compression_spec",
                                    placeholder="ffn=pal4,attn=int8,lm_head=pal6,layers[first:2]=int8",
                                    help="See `python -m analyzer compression --help`.").strip() or "none"
    overrides = tuple(list(STRUCTURE_OVERRIDES if structure else ()) +
                      ([f"num_hidden_layers={layers}"] if layers else []))

    resolved: tuple[ModelSource, AttentionGeometry] | None = None
    try:
        if kind == "Preset":
            presets = {p.name: p for p in list_presets()}
            name = st.selectbox("Preset", list(presets), index=list(presets).index(DEFAULT_PRESET),
                                key="builds_preset", format_func=lambda n: f"{n} ({presets[n].model_type})")
            st.caption(f"Config source: {presets[name].source}")
            resolved = cached_call(resolve_preset, name, overrides)
        elif kind == "Upload config.json":
            upload = st.file_uploader("A Hugging Face config.json (parsed as JSON; no code is run)", type=["json"],
                                      key="builds_upload")
            if upload is not None:
                resolved = cached_call(resolve_uploaded, upload.getvalue(), overrides)
        else:
            typed = st.text_input("Folder on this server with config.json and *.safetensors (optional)",
                                  key="builds_folder", placeholder="/models/EXAONE-4.0-1.2B")
            if typed.strip():
                folder = Path(typed.strip()).expanduser()
                resolved = cached_call(resolve_folder, str(folder), folder_stamp(folder), overrides)
    except QfoldError as e:
        st.error(str(e))

    if resolved is not None:
        source, g = resolved
        st.markdown(f"**{source.label}** ({g.model_type}): {g.num_layers} layers · {g.num_q_heads} query heads / "
                    f"{g.num_kv_heads} KV heads (group {g.group_size}) · head_dim {g.head_dim} · hidden "
                    f"{g.hidden_size:,} · vocab {g.vocab_size:,} · "
                    + ("real weights from safetensors" if source.has_real_weights else "seeded random weights"))
        try:
            cost = estimate_cost(mode, cached_call(model_weight_bytes, source), max(1, len(variants)))
        except QfoldError:
            cost = None
        if cost is not None:
            note = (f"Estimated: **{cost.summary()}** (fitted to {cost.source}). The variants run in one child "
                    "process, which waits its turn: one conversion at a time on this machine.")
            if mode == ANALYSIS_MODE:
                st.info(note + " Export a runnable package later: that makes a materialised build "
                        f"({estimate_cost('materialised', cost.weight_bytes).summary()}).", icon=":material/info:")
            else:
                st.warning(note, icon=":material/warning:")
    specs: tuple[BuildSpec, ...] = ()
    if resolved is not None and variants:
        try:
            spec_text = None
            if compression != "none":
                from analyzer.build.compress import canonical_spec

                spec_text = canonical_spec(compression, resolved[1].num_layers)
            specs = tuple(BuildSpec(resolved[0], v, kv_mode, int(ctx), spec_text, build_mode=mode) for v in variants)
        except QfoldError as e:
            st.error(str(e))
    busy = shared.running_keys()
    clash = [s.key for s in specs if s.key in busy]
    if clash:
        st.info(f"Already converting: {', '.join(clash)}")
    cached = [s.key for s in specs if is_complete(root / s.key)]
    if cached and not clash:
        st.caption(f"Already built (Convert reuses them at once): {', '.join(cached)}")
    if st.button("Convert", type="primary", icon=":material/play_arrow:", key="builds_convert",
                 disabled=not specs or bool(clash)):
        shared.start_job(BuildJob(specs, root))
        st.toast(f"Started {len(specs)} build(s)")


# ---------------------------------------------------------------------------------------------- progress
def log_tail(key: str) -> str:
    """The last lines of a build's log (``builds/.logs/<key>.log``; keys are ours, never user text)."""
    for path in (root / ".logs" / f"{key}.log", root / key / LOG_FILE):
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()
            return "\n".join(lines[-LOG_TAIL_LINES:])
    return "(no log yet)"


active = any(not s.finished for s in shared.job_snapshots())


@st.fragment(run_every=1.0 if active else None)
def conversions() -> None:
    snaps = shared.job_snapshots()
    st.subheader("Conversions")
    if not snaps:
        st.caption("None started in this session.")
    for s in reversed(snaps):
        state = "running" if not s.finished else "complete" if s.state == "done" else "error"
        title = f"{' + '.join(k.rsplit('-', 1)[0] for k in s.keys)} — {s.state}, {s.elapsed_s:,.0f} s"
        with st.status(title, state=state, expanded=not s.finished or s.state == "failed"):
            st.progress(s.fraction, text=f"{s.stage}: {s.message}"[:200])
            if s.error:
                st.error(s.error)
            for r in s.results:
                st.markdown(f"✓ `{r.key}` {'reused from the cache' if r.reused else f'built in {r.seconds:,.0f} s'}")
            key = s.current_key or s.keys[-1]
            if st.toggle("Show the log", key=f"builds_log_{s.id}", value=s.state == "failed"):
                st.code(log_tail(key), language="text")
    st.subheader("Machine-wide queue")
    q = queue(root)
    if q:
        now = time.time()
        st.dataframe(pd.DataFrame([{"build": e["key"], "state": e["state"], "pid": e["pid"],
                                    "waiting or running for (s)": round(now - e.get("since", now))} for e in q]),
                     hide_index=True, width="stretch")
    else:
        st.caption("Nothing queued or converting on this machine.")
    seen = st.session_state.setdefault("builds_jobs_seen", set())
    newly_finished = {s.id for s in snaps if s.finished} - seen
    if newly_finished:
        seen |= newly_finished
        st.rerun(scope="app")  # refresh the cached builds below (and stop polling)


conversions()
if not active:
    st.button("Refresh", key="builds_refresh", icon=":material/refresh:")


# ---------------------------------------------------------------------------------------------- cached builds
st.subheader("Cached builds")
builds = list_builds(root)
if not builds:
    st.caption(f"No finished builds in `{root}` yet.")
else:
    table = pd.DataFrame([{
        "build": describe_spec(b["spec"]),
        "key": b["key"],
        "created": b["created"],
        "mode": b.get("build_mode"),
        "tile ops": b["summary"].get("tile_count"),
        "tile output MiB": (b["summary"].get("tile_output_bytes") or 0) / MIB,
        "ops": b["summary"].get("total_ops"),
    } for b in builds])
    st.dataframe(table, hide_index=True, width="stretch", column_config=shared.number_config(table))
    keys = [b["key"] for b in builds]
    chosen = st.selectbox("Build", keys, key="builds_chosen")
    b1, b2, b3 = st.columns([1, 1, 4])
    if b1.button("Open as A", key="builds_as_a"):
        st.session_state["ab_a"] = f"build:{chosen}"
        st.switch_page("app_pages/ab.py")
    if b2.button("Open as B", key="builds_as_b"):
        st.session_state["ab_b"] = f"build:{chosen}"
        st.switch_page("app_pages/ab.py")
    with st.expander("Build log"):
        st.code(log_tail(chosen), language="text")


# ---------------------------------------------------------------------------------------------- other packages
st.subheader("Analyse an existing .mlpackage")
st.caption("Any ML Program package on this server, e.g. one another tool built: its MIL program is read from the "
           "protobuf (~0.2 s, no Core ML runtime), then it can be picked on the A/B and Export pages.")
with st.form("builds_package_form", border=False):
    typed_package = st.text_input("Path of the .mlpackage on this server", key="builds_package_path")
    submitted = st.form_submit_button("Analyse", icon=":material/search:")
if submitted and typed_package.strip():
    path = Path(typed_package.strip()).expanduser()
    if path.suffix != ".mlpackage" or not path.is_dir():
        st.error(f"{path}: not a .mlpackage folder on this server")
    else:
        ref = package_ref(path)
        try:
            doc = shared.load_doc(ref)
        except QfoldError as e:
            st.error(str(e))
        else:
            packages = st.session_state.setdefault("builds_packages", [])
            if str(ref.path) not in packages:
                packages.append(str(ref.path))
            s = doc["summary"]
            st.success(f"{ref.path.name}: {s['total_ops']:,} ops ({s['non_const_ops']:,} without const), "
                       f"{s['tile_count']} tile ops, {doc['bytes']['bytes_per_token']['total'] / MIB:,.1f} MiB per "
                       "token. It is now in the A/B pickers.")
