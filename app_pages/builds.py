"""Builds: convert a model (preset, uploaded config.json or a local folder) with one or more variants, to Core ML or
Core AI, follow the conversion, see the machine-wide queue and the cached builds; analyse a .mlpackage or .aimodel
made elsewhere, fold one, and time Core AI builds on the Core AI runtime (``builds_tools``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.analysis.record import load_analysis
from analyzer.convert.builds_folder import latest_log, machine_queue, queue
from analyzer.convert.compress import PRESETS, canonical_spec
from analyzer.convert.jobs import BuildJob, JobSnapshot
from analyzer.convert.launch import LOG_FILE, is_complete, unreadable_builds
from analyzer.errors import QfoldError
from analyzer.fsio import path_under_roots
from analyzer.model.backends import (
    BACKENDS,
    COREAI,
    COREML,
    DEFAULT_WEIGHTS,
    WEIGHT_DTYPES,
    refused_variants,
    require_coreai,
)
from analyzer.model.cost import BuildCost, check_request
from analyzer.model.sources import (
    DEFAULT_PRESET,
    STRUCTURE_OVERRIDES,
    AttentionGeometry,
    ModelSource,
    list_presets,
    load_config_dict,
)
from analyzer.model.spec import ANALYSIS_MODE, BUILD_MODES, BUILD_PHASES, DEFAULT_Q_LEN, BuildSpec
from analyzer.model.variants import KV_MODES, VARIANTS
from analyzer.report.catalog import builds_root, describe_spec, matching_pair
from analyzer.report.messages import for_ui
from app_pages import analyses, builds_tools, jobs_state, source_cache, widgets
from app_pages.session_keys import Key

CUSTOM = "custom spec…"
LOG_TAIL_LINES = 80

st.title("Builds")
root = builds_root()
st.caption(f"Each build converts the decode step (or a prefill step of N prompt tokens, or both as one "
           f"package) to Core ML (iOS18, fp16) or Core AI (an .aimodel) in a child process and is cached by a "
           f"content hash in {fmt.md(root)}. Conversions run in the background: this page, and every other session, "
           "keeps working while they run.")


# ---------------------------------------------------------------------------------------------- new build
# The form's values live in session state (not only in the widgets, which Streamlit forgets when another page is
# shown), so leaving the page and coming back keeps them.
FORM_DEFAULTS = {"builds_source_kind": "Preset", "builds_structure": True, "builds_layers": 0, "builds_ctx": 4096,
                 "builds_kv": KV_MODES[0], "builds_variants": ["repeat_kv", "qfold"], "builds_compression": "none",
                 "builds_compression_spec": "", "builds_preset": DEFAULT_PRESET, "builds_folder": "",
                 "builds_mode": ANALYSIS_MODE, "builds_backend": COREML, "builds_weights": DEFAULT_WEIGHTS}
widgets.restore_form(FORM_DEFAULTS)


@st.cache_data(show_spinner=False, max_entries=64)
def preview_cost(config_json: str, ctx: int, mode: str, backend: str, weights: str, builds: int = 1,
                 phase: str = "decode", q_len: int = 1, compressed: bool = False) -> BuildCost:
    """The pre-conversion check (analyzer.model.cost) of a request of ``builds`` builds converted by one child:
    refused here, before anything is queued."""
    return check_request(load_config_dict(json.loads(config_json)), ctx, mode=mode, backend=backend, weights=weights,
                         builds=builds, phase=phase, q_len=q_len, compressed=compressed)


with st.container(border=True):
    st.subheader("New build")
    kind = st.radio("Model source", ["Preset", "Upload config.json", "Local model folder"], horizontal=True,
                    key="builds_source_kind")
    structure = st.toggle("Structure config: same layers, heads, head_dim and ctx; hidden 256, vocab 1000 (same tiles "
                          "and tile bytes, ~20× faster, ~1 GB)", key="builds_structure")
    c1, c2, c3 = st.columns(3)
    layers = c1.number_input("Decoder layers (0 = as in the config)", min_value=0, max_value=256, step=1,
                             key="builds_layers")
    ctx = c2.number_input("Context length (cache slots)", min_value=16, max_value=131_072, step=256, key="builds_ctx")
    kv_mode = c3.radio("KV cache", KV_MODES, horizontal=True, key="builds_kv",
                       format_func=lambda m: {"state": "state (in the model)", "input": "inputs (read-only)"}.get(m, m),
                       help="state: the cache lives in the model (a Core ML state; Core AI state handles); inputs: it "
                            "is passed in on each call and only read.")
    mode = st.radio("Build mode", list(BUILD_MODES), horizontal=True, key="builds_mode",
                    help="Both modes give the same analysis, op for op (tests/test_fast_identity.py).")
    st.caption(f"**{mode}**: {BUILD_MODES[mode]}.")
    c8, c9 = st.columns(2)
    backend = c8.radio("Backend", list(BACKENDS), horizontal=True, key="builds_backend",
                       format_func=lambda b: {COREML: "Core ML (.mlpackage)", COREAI: "Core AI (.aimodel)"}[b])
    weights = c9.radio("Torch weights", WEIGHT_DTYPES, horizontal=True, key="builds_weights",
                       help="fp32 is a Core AI option (a Core ML build computes in fp16); on Linux, time Core AI "
                            "builds with fp32 weights: the runtime's fp16 matmul kernel swamps everything else.")
    st.caption(f"**{backend}**: {BACKENDS[backend]}.")
    c6, c7 = st.columns([3, 1])
    phase = c6.radio("Phase", BUILD_PHASES, horizontal=True, key="builds_phase",
                     format_func=lambda p: {"decode": "decode (one token per call)",
                                            "prefill": "prefill (N prompt tokens per call)",
                                            "decode+prefill": "both, one package with shared weights"}[p])
    q_len = int(c7.number_input("Prompt tokens per prefill call (N)", min_value=2, max_value=8192,
                                value=DEFAULT_Q_LEN, step=16, key="builds_q_len", disabled=phase == "decode"))
    c4, c5 = st.columns(2)
    refused = refused_variants(backend)  # offered only where they can build; a kept choice the backend refuses goes
    dropped = [v for v in st.session_state["builds_variants"] if v in refused]
    st.session_state["builds_variants"] = [v for v in st.session_state["builds_variants"] if v not in refused]
    for v in dropped:
        st.warning(f"{v} is not built with {backend}: {refused[v]}. It was taken off the variants.",
                   icon=":material/block:")
    variants = c4.multiselect("Variants", [v for v in sorted(VARIANTS) if v not in refused], key="builds_variants",
                              help="; ".join(f"{v} is not offered for {backend}: {why}" for v, why in refused.items())
                              or None)
    compression = c5.selectbox("Weight compression", ["none", *PRESETS, CUSTOM], key="builds_compression",
                               format_func=lambda c: f"{c}: {PRESETS[c].description}" if c in PRESETS else c,
                               help="The presets follow the write-up's base/top8/top12 (section 4).")
    if compression in PRESETS:
        st.caption(f"{compression}: {PRESETS[compression].assumption}.")
    if compression == CUSTOM:
        compression = st.text_input("Compression spec", key="builds_compression_spec",
                                    placeholder="ffn=pal4,attn=int8,lm_head=pal6,layers[first:2]=int8",
                                    help="The compression presets and the spec syntax are described in "
                                         "docs/compression.md.").strip() or "none"
    overrides = tuple(list(STRUCTURE_OVERRIDES if structure else ()) +
                      ([f"num_hidden_layers={layers}"] if layers else []))

    resolved: tuple[ModelSource, AttentionGeometry] | None = None
    try:
        if kind == "Preset":
            presets = {p.name: p for p in list_presets()}
            name = st.selectbox("Preset", list(presets), key="builds_preset",
                                format_func=lambda n: f"{n} ({presets[n].model_type})")
            st.caption(f"Config source: {presets[name].source}")
            resolved = source_cache.cached_call(source_cache.resolve_preset, name, overrides)
        elif kind == "Upload config.json":
            upload = st.file_uploader("A Hugging Face config.json (parsed as JSON; no code is run)", type=["json"],
                                      key="builds_upload")
            if upload is not None:  # kept, so the form still has it after a visit to another page
                st.session_state[Key.BUILDS_UPLOAD_KEPT] = (upload.name, upload.getvalue())
            kept = st.session_state.get(Key.BUILDS_UPLOAD_KEPT)
            if kept is not None:
                if upload is None:
                    note, forget = st.columns([4, 1], vertical_alignment="center")
                    note.caption(f"Using {fmt.md(kept[0])}, uploaded earlier in this session.")
                    if forget.button("Forget it", key="builds_upload_forget"):
                        st.session_state.pop(Key.BUILDS_UPLOAD_KEPT, None)
                        st.rerun()
                resolved = source_cache.cached_call(source_cache.resolve_uploaded, kept[1], kept[0], overrides)
        else:
            typed = st.text_input("Folder on this server with config.json and *.safetensors (optional)",
                                  key="builds_folder", placeholder="/models/EXAONE-4.0-1.2B")
            if typed.strip():
                folder = path_under_roots(typed)  # only under $QFOLD_DATA_ROOTS: visitors cannot probe the server
                resolved = source_cache.cached_call(source_cache.resolve_folder, str(folder),
                                                    source_cache.folder_stamp(folder), overrides)
    except QfoldError as e:
        widgets.error(e)
    widgets.keep_form(FORM_DEFAULTS)

    cost: BuildCost | None = None
    if resolved is not None:
        source, g = resolved
        st.markdown(f"{fmt.md(source.label)} ({g.model_type}): {g.num_layers} layers · {g.num_q_heads} query heads / "
                    f"{g.num_kv_heads} KV heads (group {g.group_size}) · head_dim {g.head_dim} · hidden "
                    f"{g.hidden_size:,} · vocab {g.vocab_size:,} · "
                    + ("real weights from safetensors" if source.has_real_weights else "seeded random weights"))
        n = max(1, len(variants))
        q = 1 if phase == "decode" else q_len
        try:
            cost = preview_cost(source.config_json, int(ctx), mode, backend, weights, n, phase, q,
                                compression != "none")
        except QfoldError as e:
            widgets.error(e, "Cannot convert this: ")
        else:
            peak = fmt.size(cost.peak_rss_bytes, "auto-si", None)
            st.caption(f"Estimated **{cost.summary().removeprefix('~')}** (peak {peak} of a limit of "
                       f"{fmt.size(cost.limit_bytes, 'auto-si', None)}; {cost.params:,} parameters, KV state "
                       f"{fmt.size(cost.kv_state_bytes, 'auto-si', None)}; {cost.error_text}). The variants run in "
                       "one child process, which waits its turn: one conversion at a time per builds folder.")
            if cost.may_not_fit:
                st.warning(f"It may not fit: the estimate's high end, {fmt.size(cost.high_bytes, 'auto-si', None)}, "
                           f"is over the limit of {fmt.size(cost.limit_bytes, 'auto-si', None)} (its low end is under "
                           "it, so it is not refused). A conversion out of memory fails with its log.",
                           icon=":material/warning:")
            if mode == ANALYSIS_MODE:
                export = preview_cost(source.config_json, int(ctx), "materialised", backend, weights, 1, phase, q,
                                      compression != "none")
                later = ("Build it materialised for a runnable .aimodel to run, fold or time" if backend == COREAI
                         else "Export a runnable package later from the Export page: that makes a materialised build")
                st.caption(f"{later} ({export.summary().removeprefix('~')}).")
            elif not structure and cost.peak_rss_bytes > 4e9:
                st.warning(f"Full-size materialised conversion: about **{peak} of memory** and minutes per variant. "
                           "Analysis mode gives the same analysis at ~1-2 GB.", icon=":material/warning:")
    specs: tuple[BuildSpec, ...] = ()
    if resolved is not None and cost is not None and variants:
        try:
            spec_text = None
            if compression != "none":
                spec_text = canonical_spec(compression, resolved[1].num_layers)
            if backend == COREAI:
                require_coreai(compression=spec_text is not None)  # not installed here: the install line
            specs = tuple(BuildSpec(resolved[0], v, kv_mode, int(ctx), spec_text, phase=phase,
                                    q_len=1 if phase == "decode" else q_len, build_mode=mode, backend=backend,
                                    weights=weights) for v in variants)
        except QfoldError as e:
            widgets.error(e)
    busy = jobs_state.running_keys()
    clash = [s.key for s in specs if s.key in busy]
    if clash:
        st.info(f"Already converting: {', '.join(clash)}")
    cached = [s.key for s in specs if is_complete(root / s.key)]
    if cached and not clash:
        st.caption(f"Already built (Convert reuses them at once): {', '.join(cached)}")
    if st.button("Convert", type="primary", icon=":material/play_arrow:", key="builds_convert",
                 disabled=not specs or bool(clash)):
        jobs_state.start_job(BuildJob(specs, root, estimate=cost))
        st.toast(f"Started {len(specs)} build(s)")


# ---------------------------------------------------------------------------------------------- progress
def log_tail(key: str) -> str:
    """The last lines of a build's log (its newest request log in ``builds/.logs``, else the finished build's
    ``build.log``; keys are ours, never user text)."""
    for path in (latest_log(root, key), root / key / LOG_FILE):
        if path is not None and path.is_file():
            lines = path.read_text(errors="replace").splitlines()
            return "\n".join(lines[-LOG_TAIL_LINES:])
    return "(no log yet)"


def job_title(s: JobSnapshot) -> str:
    """What a conversion is doing, from its first second: stage and elapsed time; when done, how long it took."""
    names = " + ".join(k.rsplit("-", 1)[0] for k in s.keys)
    if s.state == "done":
        built = [r for r in s.results if not r.reused]
        took = f"built in {s.elapsed_s:,.0f} s" if built else "reused from the cache"
        return f"{names} — {took}"
    if s.state == "failed":
        return f"{names} — failed after {s.elapsed_s:,.0f} s"
    return f"{names} — {s.stage}, {s.elapsed_s:,.0f} s"


active = any(not s.finished for s in jobs_state.job_snapshots())


@st.fragment(run_every=1.0 if active else None)
def conversions() -> None:
    snaps = jobs_state.job_snapshots()
    st.subheader("Conversions")
    if not snaps:
        st.caption("None started in this session.")
    for s in reversed(snaps):
        # Not a `with` block: st.status marks itself complete when its block exits, which would show a finished
        # check on a conversion still running.
        state = "running" if not s.finished else "complete" if s.state == "done" else "error"
        box = st.status(job_title(s), state=state, expanded=not s.finished or s.state == "failed")
        box.progress(s.fraction, text=f"{s.stage}: {s.message}"[:200])
        if s.error:
            box.error(for_ui(s.error))
        for r in s.results:
            box.markdown(f"✓ `{r.key}` {'reused from the cache' if r.reused else f'built in {r.seconds:,.0f} s'}")
        if s.state == "done" and (measured := jobs_state.measured_beside_estimate(s)):
            box.markdown(f"Measured: {measured}.")
        log_key = f"builds_log_{s.id}"
        if s.state == "failed" and not st.session_state.get(f"{log_key}_opened"):
            st.session_state[log_key] = True  # a failed build opens its log once; the user may close it again
            st.session_state[f"{log_key}_opened"] = True
        if box.toggle("Show the log", key=log_key):
            box.code(log_tail(s.current_key or s.keys[-1]), language="text")
    st.subheader("Machine-wide queue")
    q = machine_queue()
    mine = str(root.resolve())
    q += [e for e in queue(root) if (e.key, e.pid) not in {(m.key, m.pid) for m in q}]  # a child of an older qfold
    if q:
        now = time.time()
        widgets.show_table(pd.DataFrame([{"build": e.key, "state": e.state,
                                         "builds folder": "this one" if e.root in ("", mine) else e.root,
                                         "pid": str(e.pid), "waiting or running for (s)": round(now - e.since_s)}
                                        for e in sorted(q, key=lambda e: e.since_s)]))
        st.caption("The queue of the whole machine: every conversion, whichever session, command or builds folder "
                   "started it; one converts at a time per builds folder.")
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
# One small row per build function, kept until its folder's mtime changes (a rewritten analysis is renamed into it):
# through analyses.load (16 analyses kept), a folder of more builds than that parsed every analysis again on each
# rerun (34 builds: ~2 s per click).
@st.cache_data(show_spinner=False, max_entries=1024)
def _build_row(path: str, function: str | None, stamp: float, label: str) -> dict:
    a = load_analysis(path, function)
    return {
        "build": describe_spec(a.build.spec, a.function) if a.build else label,
        "backend": {COREML: "Core ML", COREAI: "Core AI"}.get(a.program.backend, a.program.backend),
        "mode": a.build.build_mode if a.build else "",
        "function": function or "",
        "tile ops": a.summary.tile_count,
        "tile output": fmt.size(a.summary.tile_output_bytes, "auto", None),
        "bytes per call": fmt.size(a.bytes_per_token.total, "auto", None),  # a decode call is one token
        "GFLOP per token": a.flops.per_token().total / 1e9,
        "ops": a.summary.total_ops,
    }


st.subheader("Cached builds")
built = [r for r in analyses.analysis_refs() if r.kind == "build"]  # one per function of a multi-function build
for folder, reason in unreadable_builds(root):  # listed, never fatal: the other builds work as usual
    st.warning(f"Unreadable build folder {fmt.md(folder.name)}: {fmt.md_text(reason)}", icon=":material/warning:")
if not built:
    st.caption(f"No finished builds in {fmt.md(root)} yet.")
else:
    rows = [{**_build_row(str(r.path), r.function, analyses.mtime(r.path), r.label), "created": r.created,
             "key": r.id.removeprefix("build:")} for r in built]
    widgets.show_table(pd.DataFrame(rows))
    refs = analyses.analysis_refs()
    by_id = analyses.refs_by_id(refs)
    ids = [r.id for r in built if r.id in by_id]
    chosen = st.selectbox("Build", ids, key="builds_chosen", format_func=lambda i: by_id[i].label)
    twin = matching_pair(by_id[chosen], refs) if chosen else None
    with st.container(horizontal=True, gap="xsmall"):
        if st.button("Open as A", key="builds_as_a"):
            widgets.set_persisted({Key.AB_A: chosen})
            st.switch_page("app_pages/ab.py")
        if st.button("Open as B", key="builds_as_b"):
            widgets.set_persisted({Key.AB_B: chosen})
            st.switch_page("app_pages/ab.py")
        if st.button("Open the matching pair", key="builds_as_pair", icon=":material/join:", disabled=twin is None,
                     help="This build and the other variant of the same model, size, ctx, KV mode and compression"
                          if twin else "No build of the other variant with the same spec yet: convert it above."):
            widgets.set_persisted({Key.AB_A: twin[0].id, Key.AB_B: twin[1].id})
            st.switch_page("app_pages/ab.py")
    with st.expander("Build log"):
        st.code(log_tail(Path(by_id[chosen].path).name) if chosen else "", language="text")


# ---------------------------------------------------------------------------------------------- existing models
builds_tools.analyse_section()
builds_tools.fold_section(root)
builds_tools.bench_section(root)
