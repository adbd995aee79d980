"""The Builds page's tools for models that exist: analyse a .mlpackage or .aimodel made elsewhere, fold one (or a
Core AI build), and time Core AI builds on the Core AI runtime, whose log rows join the Device logs and Bandwidth
pages. Folds and benches run as ``qfold fold`` / ``qfold bench`` child processes (``analyzer.cli.delegate``), never
in the dashboard's own process; the rest of the logic is in ``analyzer`` (``report.coreai_view``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import streamlit as st

from analyzer import fmt
from analyzer.analysis.shapes import parse_shape_text
from analyzer.cli.delegate import PROGRESS, WAITING, bench_in_child, fold_in_child
from analyzer.errors import QfoldError
from analyzer.fold.cache import fold_record_of
from analyzer.fsio import path_under_roots
from analyzer.measure.bench import DEFAULT_ROUNDS, DEFAULT_STEPS, DEFAULT_WARMUP
from analyzer.report.catalog import package_refs
from analyzer.report.coreai_view import asset_of, bench_frame, bench_targets, fold_targets
from analyzer.report.messages import for_ui
from app_pages import analyses, logs_state, url_state, widgets
from app_pages.session_keys import Key


def _keep_package(path: str | Path) -> None:
    """In this session's analysed packages, and in the URL at once (a reload or a shared link keeps it)."""
    packages = st.session_state.setdefault(Key.BUILDS_PACKAGES, [])
    if str(path) not in packages:
        packages.append(str(path))
        url_state.url_save()


def analyse_section() -> None:
    st.subheader("Analyse an existing .mlpackage or .aimodel")
    st.caption("Any ML Program package or Core AI asset on this server, e.g. one another tool built: a package's MIL "
               "program is read from the protobuf (~0.2 s, no Core ML runtime), an asset's MLIR in a child process "
               "(checked first: the Core AI runtime crashes on what is no asset); then it can be picked on the A/B "
               "and Export pages, folded, and (an asset) timed below.")
    with st.form("builds_package_form", border=False):
        typed = st.text_input("Path of the .mlpackage or .aimodel on this server", key="builds_package_path")
        typed_shapes = st.text_input(
            "Shapes of its flexible inputs (optional): NAME=D0,D1,… separated by spaces",
            key="builds_package_shape_text", placeholder="inputIds=1,8 causalMask=1,1,8,2048",
            help="A package with flexible inputs (ct.RangeDim, enumerated shapes) is analysed, folded and drawn at "
                 "one shape per input, within its range. Not given: query lengths (token ids, hidden states, a "
                 "mask's rows) at their lower bound, context lengths (a mask's last axis, a KV-cache input) at "
                 "their upper bound, an enumerated input at its default; any other flexible dimension must be "
                 "given. A Core AI asset's shapes are static.")
        submitted = st.form_submit_button("Analyse", icon=":material/search:")
    if not (submitted and typed.strip()):
        return
    try:
        path = analyses.model_folder(typed)
        given = parse_shape_text(typed_shapes)  # malformed, unknown or out of range: one message here
        if given and path.suffix == ".aimodel":
            raise QfoldError(f"{path.name}: a Core AI asset's inputs have static shapes; leave the shapes empty")
        package_list = package_refs(path, given)
        loaded = [(ref, analyses.load(ref)) for ref in package_list]
    except QfoldError as e:
        widgets.error(e)
        return
    analyses.set_package_shapes(str(package_list[0].path), given)
    _keep_package(package_list[0].path)
    for ref, a in loaded:
        s = a.summary
        what = f"{ref.path.name}" + (f", function {ref.function}" if ref.function else "")
        copies = "replication ops" if a.program.backend == "coreai" else "tile ops"
        at = "; ".join(x.text for x in a.program.assumed_shapes)
        shown = st.success if a.sizing.sized else st.warning
        per_call = (f"{fmt.size(a.bytes_per_token.total, 'auto', None)} per call" if a.sizing.sized
                    else "bytes per call could not be sized")
        unsized = f" ({s.unsized_copies} unsized)" if s.unsized_copies else ""
        shown(f"{fmt.md(what)}: {s.total_ops:,} ops ({s.non_const_ops:,} without const), {s.tile_count} "
              f"{copies}{unsized}, {per_call}" + (f" at {fmt.md_text(for_ui(at))}" if at else "")
              + ". It is now in the A/B pickers.")
        for reason in a.sizing.reasons:  # names come from the package: escaped
            st.warning(fmt.md_text(for_ui(reason)), icon=":material/warning:")
        if a.account.unsized and a.sizing.sized:
            # tensor names come from the package: code spans
            examples = ", ".join(f"{fmt.md(u.tensor)} {u.shape}" for u in a.account.unsized[:3])
            st.warning(f"{len(a.account.unsized)} tensors have a symbolic (flexible) dimension and are in no "
                       f"byte total, e.g. {examples}")


def fold_section(root: Path) -> None:
    """A package analysed here, an asset, or a Core AI build: the pass (or the MLIR rewrite) and its proof."""
    refs = analyses.analysis_refs()
    candidates: dict[str, tuple[str, str | None]] = {}  # path → (label, the original's analysis id)
    for p in st.session_state.get(Key.BUILDS_PACKAGES, []):
        if not p.endswith(".aimodel") and fold_record_of(p) is None:
            candidates[p] = (f"{Path(p).name} · {Path(p).parent}", None)
    for r in fold_targets(refs):
        candidates[str(asset_of(r))] = (r.label, r.id)
    if not candidates:
        return
    with st.form("builds_fold_form", border=False):
        st.markdown("**Fold it**: remove the K/V copies (a package: `qfold::fold_gqa_replication`, proven in the MIL "
                    "interpreter; a Core AI asset or build: `qfold::fold_coreai_replication`, proven on the Core AI "
                    "runtime), save the folded model and prove it against the original.")
        to_fold = st.selectbox("Model", list(candidates), key="builds_fold_pick",
                               format_func=lambda p: candidates[p][0])
        spec_path = st.text_input("Input spec (optional): path of a JSON file on this server naming the token-id, "
                                  "position, mask and KV inputs; qfold's own builds need none",
                                  key="builds_fold_spec")
        clicked = st.form_submit_button("Fold it", icon=":material/compress:")
    fold_shapes = dict(analyses.package_shapes(to_fold))  # a flexible package is folded and proved at its shapes
    if fold_shapes:
        st.caption("Folded and proved at the shapes it is analysed at: "
                   + fmt.md_text(", ".join(f"{n}=" + ",".join(map(str, d)) for n, d in fold_shapes.items()))
                   + " (analyse it again above with other shapes to change them).")
    if not clicked or to_fold not in candidates:
        return
    with st.status("Folding (rewrite, save) and running both models on the proof's engine, in a `qfold fold` "
                   "child process…", expanded=False) as status:
        try:
            roles = str(path_under_roots(spec_path)) if spec_path.strip() else None
            folded = fold_in_child(to_fold, root, roles, fold_shapes or None)
        except QfoldError as e:
            status.update(label="The fold failed", state="error")
            failed = e
        else:
            status.update(label="Folded", state="complete")
            failed = None
    if failed is not None:  # said outside the collapsed status, where it is seen
        widgets.error(failed)
        return
    if folded.exit_code != 0:
        st.warning(fmt.md_text(for_ui(f"qfold fold exited with status {folded.exit_code}: {folded.error}")))
    analyses.set_package_shapes(str(folded.artifact), fold_shapes)  # the fold keeps the original's inputs
    _keep_package(folded.artifact)
    st.session_state[Key.AB_A] = candidates[to_fold][1] or package_refs(to_fold, fold_shapes)[0].id  # original
    st.session_state[Key.AB_B] = package_refs(folded.artifact, fold_shapes)[0].id  # vs its fold, on the A/B page
    export = "" if folded.artifact.suffix == ".aimodel" else ", and downloadable from Export"
    shown = st.success if folded.proof.status in ("proven", "skipped") else st.warning  # unproven: said, not hidden
    shown(f"{fmt.md(candidates[to_fold][0])}: {fmt.md_text(for_ui(folded.summary()))}. The folded model is on "
          f"the A/B page beside the original{export} ({fmt.md(folded.artifact)}).")
    st.page_link("app_pages/ab.py", label="Open the A/B", icon=":material/compare:")


def bench_section(root: Path) -> None:
    """Core AI builds timed in one runtime child (interleaved rounds), with progress; the log joins the session's."""
    st.subheader("Time Core AI builds on the Core AI runtime")
    st.caption("Every build chosen is loaded into one Core AI runtime process; after the warmup, each round runs every "
               "build's decode steps in turn, so a busy machine slows all alike and their ratio is measured in one "
               "run. Then one profiled pass joins each op's time to the analysis's op records. On Linux the runtime "
               "is this machine's CPU, single-threaded. Each build gives one log row, under its own label, on the "
               "Device logs and Bandwidth pages.")
    refs = analyses.analysis_refs()
    by_id = analyses.refs_by_id(refs)
    targets = [r.id for r in bench_targets(refs)]
    if not targets:
        st.caption("No Core AI build with an asset yet: convert one above (backend Core AI, materialised), or "
                   "analyse an .aimodel.")
        return
    with st.form("builds_bench_form", border=False):
        chosen = st.multiselect("Builds to time", targets, key="builds_bench_pick",
                                format_func=lambda i: by_id[i].label)
        c1, c2, c3 = st.columns(3)
        steps = c1.number_input("Decode steps per round", 1, 512, DEFAULT_STEPS, key="builds_bench_steps")
        rounds = c2.number_input("Rounds", 1, 100, DEFAULT_ROUNDS, key="builds_bench_rounds")
        warmup = c3.number_input("Warmup rounds", 0, 20, DEFAULT_WARMUP, key="builds_bench_warmup")
        go = st.form_submit_button("Bench", icon=":material/timer:")
    chosen = [i for i in chosen if i in by_id]
    if go and chosen:
        title = f"Timing {len(chosen)} build(s) on the Core AI runtime (a `qfold bench` child process)…"
        with st.status(title, expanded=True) as status:
            bar = st.progress(0.0, text="starting the runtime")

            def show(line: str) -> None:
                if line.startswith(WAITING):  # another session's (or a CLI's) bench holds this folder's lock
                    text = fmt.md_text(line.removeprefix(WAITING))
                    status.update(label=text[:1].upper() + text[1:], state="running")
                elif line.startswith(PROGRESS):
                    pct, _, what = line.removeprefix(PROGRESS).partition("% ")
                    status.update(label=title)
                    bar.progress(min(1.0, float(pct) / 100) if pct.isdigit() else 0.0, text=fmt.md_text(what))

            try:
                result, log = bench_in_child([asset_of(by_id[i]) for i in chosen], [by_id[i].label for i in chosen],
                                             int(steps), int(rounds), int(warmup), root, on_line=show)
            except QfoldError as e:
                status.update(label="The bench failed", state="error")
                widgets.error(e)
                return
            status.update(label=f"Timed {len(chosen)} build(s): {rounds} rounds of {steps} decode steps",
                          state="complete", expanded=False)
        st.session_state[Key.BUILDS_BENCH] = result
        logs_state.add_bench_log(f"qfold bench {datetime.now():%Y-%m-%d %H-%M-%S}.csv", log.encode())
    result = st.session_state.get(Key.BUILDS_BENCH)
    if result is None:
        return
    st.markdown(f"Last bench on {fmt.md(result.machine.device)}; {fmt.md_text(result.machine.compute_units)}:")
    widgets.show_table(bench_frame(result))
    for note in result.notes:
        st.info(fmt.md_text(note), icon=":material/info:")
    with st.container(horizontal=True, gap="xsmall"):
        st.page_link("app_pages/device_logs.py", label="Its log on Device logs", icon=":material/upload_file:")
        st.page_link("app_pages/bandwidth.py", label="The bandwidth fit", icon=":material/speed:")
