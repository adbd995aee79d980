"""Builds: convert a model (preset, uploaded config.json or a local folder) with one or more variants, follow
the conversion, see the machine-wide queue and the cached builds, or analyse a .mlpackage made elsewhere."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import streamlit as st

from analyzer import fmt
from analyzer.build.builds import ANALYSIS_MODE, BUILD_MODES, LOG_FILE, BuildSpec, is_complete
from analyzer.build.compress import PRESETS, canonical_spec
from analyzer.build.fold import fold_cached, fold_record_of
from analyzer.build.jobs import BuildJob, JobSnapshot
from analyzer.build.state import latest_log, queue
from analyzer.errors import QfoldError, SourceError
from analyzer.fsio import path_under_roots
from analyzer.model.cost import BuildCost, check_request
from analyzer.model.prefill import BUILD_PHASES, DEFAULT_Q_LEN
from analyzer.model.sources import (
    DEFAULT_PRESET,
    STRUCTURE_OVERRIDES,
    AttentionGeometry,
    ModelSource,
    geometry_of,
    list_presets,
    load_config,
    load_config_dict,
    resolve_source,
    safe_label,
)
from analyzer.model.variants import KV_MODES, VARIANTS
from analyzer.report.catalog import describe_spec, matching_pair, package_refs
from app_pages import shared

CUSTOM = "custom spec…"
LOG_TAIL_LINES = 80

st.title("Builds")
root = shared.builds_root()
st.caption(f"Each build converts the decode step (or a prefill step of N prompt tokens, or both as one "
           f"package) to Core ML (iOS18, fp16) in a child process and is cached by a "
           f"content hash in `{root}`. Conversions run in the background: this page, and every other session, "
           "keeps working while they run.")


# ---------------------------------------------------------------------------------------------- sources
@st.cache_data(show_spinner="Reading the model config…", max_entries=32)
def resolve_preset(name: str, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    source = resolve_source(name, overrides)
    return source, geometry_of(load_config(source))


@st.cache_data(show_spinner="Reading the uploaded config…", max_entries=32)
def resolve_uploaded(data: bytes, file_name: str, overrides: tuple[str, ...]) -> tuple[ModelSource, AttentionGeometry]:
    """Parse the upload in memory; only a server-chosen name (a hash of the content) ever touches disk. The
    source is labelled by the file's name and model type (``my-llama-llama``; ``config.json`` → ``llama``), made
    filesystem-safe: the name is a label, never a path."""
    try:
        raw = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise SourceError(f"{file_name}: not UTF-8 text (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise SourceError(f"{file_name}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from e
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


# ---------------------------------------------------------------------------------------------- new build
# The form's values live in session state (not only in the widgets, which Streamlit forgets when another page is
# shown), so leaving the page and coming back keeps them.
FORM_DEFAULTS = {"builds_source_kind": "Preset", "builds_structure": True, "builds_layers": 0, "builds_ctx": 4096,
                 "builds_kv": KV_MODES[0], "builds_variants": ["repeat_kv", "qfold"], "builds_compression": "none",
                 "builds_compression_spec": "", "builds_preset": DEFAULT_PRESET, "builds_folder": "",
                 "builds_mode": ANALYSIS_MODE}
shared.restore_form(FORM_DEFAULTS)


@st.cache_data(show_spinner=False, max_entries=64)
def preview_cost(config_json: str, ctx: int, mode: str) -> BuildCost:
    """The pre-conversion check (analyzer.model.cost): refused here, before anything is queued."""
    return check_request(load_config_dict(json.loads(config_json)), ctx, mode=mode)


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
                       format_func=lambda m: {"state": "Core ML state", "input": "inputs (read-only)"}.get(m, m))
    mode = st.radio("Build mode", list(BUILD_MODES), horizontal=True, key="builds_mode",
                    help="Both modes give the same analysis, op for op (tests/test_fast_identity.py).")
    st.caption(f"**{mode}**: {BUILD_MODES[mode]}.")
    c6, c7 = st.columns([3, 1])
    phase = c6.radio("Phase", BUILD_PHASES, horizontal=True, key="builds_phase",
                     format_func=lambda p: {"decode": "decode (one token per call)",
                                            "prefill": "prefill (N prompt tokens per call)",
                                            "decode+prefill": "both, one package with shared weights"}[p])
    q_len = int(c7.number_input("Prompt tokens per prefill call (N)", min_value=2, max_value=8192,
                                value=DEFAULT_Q_LEN, step=16, key="builds_q_len", disabled=phase == "decode"))
    c4, c5 = st.columns(2)
    variants = c4.multiselect("Variants", sorted(VARIANTS), key="builds_variants")
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
            resolved = cached_call(resolve_preset, name, overrides)
        elif kind == "Upload config.json":
            upload = st.file_uploader("A Hugging Face config.json (parsed as JSON; no code is run)", type=["json"],
                                      key="builds_upload")
            if upload is not None:  # kept, so the form still has it after a visit to another page
                st.session_state["builds_upload_kept"] = (upload.name, upload.getvalue())
            kept = st.session_state.get("builds_upload_kept")
            if kept is not None:
                if upload is None:
                    note, forget = st.columns([4, 1], vertical_alignment="center")
                    note.caption(f"Using `{kept[0]}`, uploaded earlier in this session.")
                    if forget.button("Forget it", key="builds_upload_forget"):
                        st.session_state.pop("builds_upload_kept", None)
                        st.rerun()
                resolved = cached_call(resolve_uploaded, kept[1], kept[0], overrides)
        else:
            typed = st.text_input("Folder on this server with config.json and *.safetensors (optional)",
                                  key="builds_folder", placeholder="/models/EXAONE-4.0-1.2B")
            if typed.strip():
                folder = path_under_roots(typed)  # only under $QFOLD_DATA_ROOTS: visitors cannot probe the server
                resolved = cached_call(resolve_folder, str(folder), folder_stamp(folder), overrides)
    except QfoldError as e:
        shared.error(e)
    shared.keep_form(FORM_DEFAULTS)

    cost: BuildCost | None = None
    if resolved is not None:
        source, g = resolved
        st.markdown(f"**{source.label}** ({g.model_type}): {g.num_layers} layers · {g.num_q_heads} query heads / "
                    f"{g.num_kv_heads} KV heads (group {g.group_size}) · head_dim {g.head_dim} · hidden "
                    f"{g.hidden_size:,} · vocab {g.vocab_size:,} · "
                    + ("real weights from safetensors" if source.has_real_weights else "seeded random weights"))
        try:
            cost = preview_cost(source.config_json, int(ctx), mode)
        except QfoldError as e:
            shared.error(e, "Cannot convert this: ")
        else:
            n = max(1, len(variants))
            peak = fmt.size(cost.peak_rss_bytes, "auto-si", None)
            st.caption(f"Estimated **{cost.summary(n).removeprefix('~')}** (peak {peak} of a limit of "
                       f"{fmt.size(cost.limit_bytes, 'auto-si', None)}; {cost.params:,} parameters, KV state "
                       f"{fmt.size(cost.kv_state_bytes, 'auto-si', None)}). The variants run in one child process, "
                       "which waits its turn: one conversion at a time on this machine.")
            if mode == ANALYSIS_MODE:
                export = preview_cost(source.config_json, int(ctx), "materialised")
                st.caption("Export a runnable package later from the Export page: that makes a materialised build "
                           f"({export.summary().removeprefix('~')}).")
            elif not structure and cost.peak_rss_bytes > 4e9:
                st.warning(f"Full-size materialised conversion: about **{peak} of memory** and minutes per variant. "
                           "Analysis mode gives the same analysis at ~1-2 GB.", icon=":material/warning:")
    specs: tuple[BuildSpec, ...] = ()
    if resolved is not None and cost is not None and variants:
        try:
            spec_text = None
            if compression != "none":
                spec_text = canonical_spec(compression, resolved[1].num_layers)
            specs = tuple(BuildSpec(resolved[0], v, kv_mode, int(ctx), spec_text, phase=phase,
                                    q_len=1 if phase == "decode" else q_len, build_mode=mode) for v in variants)
        except QfoldError as e:
            shared.error(e)
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


active = any(not s.finished for s in shared.job_snapshots())


@st.fragment(run_every=1.0 if active else None)
def conversions() -> None:
    snaps = shared.job_snapshots()
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
            box.error(shared.for_ui(s.error))
        for r in s.results:
            box.markdown(f"✓ `{r.key}` {'reused from the cache' if r.reused else f'built in {r.seconds:,.0f} s'}")
        log_key = f"builds_log_{s.id}"
        if s.state == "failed" and not st.session_state.get(f"{log_key}_opened"):
            st.session_state[log_key] = True  # a failed build opens its log once; the user may close it again
            st.session_state[f"{log_key}_opened"] = True
        if box.toggle("Show the log", key=log_key):
            box.code(log_tail(s.current_key or s.keys[-1]), language="text")
    st.subheader("Machine-wide queue")
    q = queue(root)
    if q:
        now = time.time()
        shared.show_table(pd.DataFrame([{"build": e.key, "state": e.state, "pid": str(e.pid),
                                         "waiting or running for (s)": round(now - e.since_s)} for e in q]))
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
built = [r for r in shared.analysis_refs() if r.kind == "build"]  # one per function of a multi-function build
if not built:
    st.caption(f"No finished builds in `{root}` yet.")
else:
    rows = []
    for r in built:
        a = shared.load(r)
        rows.append({
            "build": describe_spec(a.build.spec, a.function) if a.build else r.label,
            "function": r.function or "",
            "tile ops": a.summary.tile_count,
            "tile output": fmt.size(a.summary.tile_output_bytes, "auto", None),
            "bytes per call": fmt.size(a.bytes_per_token.total, "auto", None),  # a decode call is one token
            "GFLOP per token": a.flops.per_token().total / 1e9,
            "ops": a.summary.total_ops,
            "created": r.created,
            "key": r.id.removeprefix("build:"),
        })
    shared.show_table(pd.DataFrame(rows))
    refs = shared.analysis_refs()
    by_id = shared.refs_by_id(refs)
    ids = [r.id for r in built if r.id in by_id]
    chosen = st.selectbox("Build", ids, key="builds_chosen", format_func=lambda i: by_id[i].label)
    twin = matching_pair(by_id[chosen], refs) if chosen else None
    with st.container(horizontal=True, gap="xsmall"):
        if st.button("Open as A", key="builds_as_a"):
            shared.set_persisted({"ab_a": chosen})
            st.switch_page("app_pages/ab.py")
        if st.button("Open as B", key="builds_as_b"):
            shared.set_persisted({"ab_b": chosen})
            st.switch_page("app_pages/ab.py")
        if st.button("Open the matching pair", key="builds_as_pair", icon=":material/join:", disabled=twin is None,
                     help="This build and the other variant of the same model, size, ctx, KV mode and compression"
                          if twin else "No build of the other variant with the same spec yet: convert it above."):
            shared.set_persisted({"ab_a": twin[0].id, "ab_b": twin[1].id})
            st.switch_page("app_pages/ab.py")
    with st.expander("Build log"):
        st.code(log_tail(Path(by_id[chosen].path).name) if chosen else "", language="text")


# ---------------------------------------------------------------------------------------------- other packages
st.subheader("Analyse an existing .mlpackage")
st.caption("Any ML Program package on this server, e.g. one another tool built: its MIL program is read from the "
           "protobuf (~0.2 s, no Core ML runtime), then it can be picked on the A/B and Export pages.")
with st.form("builds_package_form", border=False):
    typed_package = st.text_input("Path of the .mlpackage on this server", key="builds_package_path")
    submitted = st.form_submit_button("Analyse", icon=":material/search:")
if submitted and typed_package.strip():
    try:
        path = path_under_roots(typed_package)  # only under $QFOLD_DATA_ROOTS: visitors cannot probe the server
        if path.suffix != ".mlpackage" or not path.is_dir():
            raise QfoldError(f"{typed_package.strip()}: not a .mlpackage folder on this server")
        package_list = package_refs(path)
        analyses = [(ref, shared.load(ref)) for ref in package_list]
    except QfoldError as e:
        shared.error(e)
    else:
        packages = st.session_state.setdefault("builds_packages", [])
        if str(package_list[0].path) not in packages:
            packages.append(str(package_list[0].path))
            shared.url_save()  # in the URL at once: a reload or a shared link keeps it
        for ref, a in analyses:
            s = a.summary
            what = f"{ref.path.name}" + (f", function {ref.function}" if ref.function else "")
            st.success(f"{what}: {s.total_ops:,} ops ({s.non_const_ops:,} without const), {s.tile_count} tile "
                       f"ops, {fmt.size(a.bytes_per_token.total, 'auto', None)} per token. It is now in the A/B "
                       "pickers.")
            if a.account.unsized:
                examples = ", ".join(f"`{u.tensor}` {u.shape}" for u in a.account.unsized[:3])
                st.warning(f"{len(a.account.unsized)} tensors have a symbolic (flexible) dimension and are in no "
                           f"byte total, e.g. {examples}")

# a package analysed here (or any of this session's packages) can be folded: the pass + the interpreter's proof
fold_candidates = [p for p in st.session_state.get("builds_packages", []) if fold_record_of(p) is None]
if fold_candidates:
    with st.form("builds_fold_form", border=False):
        st.markdown("**Fold it**: remove the K/V copies (`qfold::fold_gqa_replication`), save the folded package "
                    "and prove it against the original in the MIL interpreter.")
        to_fold = st.selectbox("Package", fold_candidates, key="builds_fold_pick")
        spec_path = st.text_input("Input spec (optional): path of a JSON file on this server naming the token-id, "
                                  "position, mask and KV inputs; qfold's own builds need none",
                                  key="builds_fold_spec")
        fold_clicked = st.form_submit_button("Fold it", icon=":material/compress:")
    if fold_clicked:
        with st.spinner("Folding (read back, pass, save) and running both packages in the MIL interpreter…"):
            try:
                roles = str(path_under_roots(spec_path)) if spec_path.strip() else None
                folded = fold_cached(to_fold, root, roles_path=roles)
            except QfoldError as e:
                shared.error(e)
            else:
                packages = st.session_state.setdefault("builds_packages", [])
                if str(folded.package) not in packages:
                    packages.append(str(folded.package))
                    shared.url_save()
                st.session_state["ab_a"] = package_refs(to_fold)[0].id  # the A/B page opens on original vs fold
                st.session_state["ab_b"] = package_refs(folded.package)[0].id
                st.success(f"{Path(to_fold).name}: {folded.summary()}. The folded package is on the A/B page "
                           f"beside the original, and downloadable from Export (`{folded.package}`).")
                st.page_link("app_pages/ab.py", label="Open the A/B", icon=":material/compare:")

