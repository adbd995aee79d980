"""``explore``: the whole program (or A and B side by side) in Google's Model Explorer, qfold's figures as node
attributes and overlays.

    qfold explore A [B] [--function F] [--shape N=D,…] [--plan A=PLAN] [--plan B=PLAN] [--out DIR] [--port P]
                  [--no-browser]

``--out DIR`` writes the files (``a.graph.json``, ``a.<overlay>.json``, ``b.…``, ``mapping.json``) and prints the
command and URL that open them. Otherwise the files go to a temporary folder removed at exit, Model Explorer serves
them on 127.0.0.1 (port 8080 unless ``--port``; a busy port is an error) and the URL is printed; it serves until
Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import webbrowser
from pathlib import Path

from analyzer.analysis.record import Analysis
from analyzer.analysis.shapes import shapes_label
from analyzer.cli.common import add_shape_option, check_shape_names, load_for_cli, positive_int, warn_unsized, where_of
from analyzer.cli.diff import side_values
from analyzer.cli.graph import label_of
from analyzer.cli.placement import join_for_cli
from analyzer.errors import QfoldError
from analyzer.report import explorer as mx


def add_parser(sub) -> None:
    p = sub.add_parser("explore", help="the whole program in Google's Model Explorer (A and B side by side)",
                       description="Export a program (or A and B) as Model Explorer graphs with qfold's figures as "
                                   "node attributes and overlays, and serve it on 127.0.0.1.")
    p.add_argument("a", metavar="TARGET", help="build folder, analysis.json, .mlpackage or .aimodel")
    p.add_argument("b", metavar="TARGET_B", nargs="?", help="a second one, side by side with A (synced by qfold's "
                                                            "structural diff)")
    p.add_argument("--function", metavar="F", help="one function of a multi-function package or build (default: "
                                                   "every function, one graph each)")
    add_shape_option(p)
    p.add_argument("--plan", action="append", default=[], metavar="A=PLAN|B=PLAN",
                   help="a compute plan or profiler report of side A or B (as for diff): device, cost and profiled "
                        "time on each op, and the device and time overlays")
    p.add_argument("--out", metavar="DIR", help="write the files here and print the command that opens them "
                                                "(no server)")
    p.add_argument("--port", type=positive_int, default=mx.DEFAULT_PORT,
                   help=f"the port Model Explorer serves on (127.0.0.1; default {mx.DEFAULT_PORT})")
    p.add_argument("--no-browser", action="store_true", help="print the URL only; open no browser")
    p.set_defaults(func=cmd_explore)


def _say(msg: str) -> None:
    print(f"qfold explore: {msg}", file=sys.stderr, flush=True)


def _side(path: str, analyses: tuple[Analysis, ...], plan: str | None) -> mx.ExploreSide:
    join = join_for_cli(plan, analyses[0]) if plan else None
    unsized = "" if analyses[0].sizing.sized else " (NOT SIZED)"
    return mx.ExploreSide(label_of(path) + shapes_label(analyses[0].program.assumed_shapes) + unsized, analyses, join,
                          path)


def _summary(bundle: mx.Bundle, sides: list[mx.ExploreSide]) -> None:
    for key, side in zip("AB", sides, strict=False):
        fns = ", ".join(f"{a.function} ({a.program.total_ops:,} ops)" for a in side.analyses)
        print(f"{key}: {side.label}: {fns}")
        for assumed in side.analyses[0].program.assumed_shapes:
            print(f"{key}: flexible input analysed at {assumed.text}")
        if side.join is not None:
            print(f"{key}: plan {side.join.plan_file}: {side.join.n_matched:,} ops placed")
    for fn, verdict in bundle.verdicts:
        print(f"structural diff ({fn}): {verdict}")
    for note in bundle.notes:
        print(note)


def _mapping_hint(bundle: mx.Bundle, folder: Path) -> None:
    if bundle.pair:
        print(f"A and B are synced by node id (aligned ops share one); the same mapping is in "
              f"{folder / mx.MAPPING_FILE}: in Model Explorer's split view, sync navigation → "
              "\"Upload mapping from computer\" loads it")


def _graphical() -> bool:
    """A desktop to open a browser on (without one, Python's webbrowser would start a text browser in this
    terminal)."""
    return sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def cmd_explore(args) -> int:
    plans = side_values(args.plan, "--plan", "PLAN")
    if "B" in plans and not args.b:
        raise QfoldError("--plan B=…: give TARGET_B too")
    serve = args.out is None and mx.explorer_installed()
    if serve:
        mx.check_port(args.port)  # before the work: a busy port is an error at once
    side_a = load_for_cli(args.a, args)
    side_b = load_for_cli(args.b, args) if args.b else None
    check_shape_names(args, *(x.program for x in (*side_a, *(side_b or ()))))
    warn_unsized((f"{key} {where_of(path, x.function, len(side) > 1)}", x.sizing)  # its overlays leave it out
                 for key, path, side in (("A", args.a, side_a), ("B", args.b, side_b or ())) for x in side)
    sides = [_side(args.a, side_a, plans.get("A"))] + ([_side(args.b, side_b, plans.get("B"))] if side_b else [])
    bundle = mx.build_bundle(*sides, progress=_say)
    if not serve:
        return _write_only(bundle, sides, args)
    _say(f"starting Model Explorer on 127.0.0.1:{args.port}")
    # Ctrl-C, and a plain kill, stop the server and remove its folder (a shell that starts this in the background
    # would otherwise leave SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    instance = mx.start_explorer(bundle, port=args.port)
    try:
        _summary(bundle, sides)
        _mapping_hint(bundle, instance.folder)
        print(f"Model Explorer serves {len(bundle.files)} files from a temporary folder (removed at exit); "
              "Ctrl-C stops it")
        print(instance.url, flush=True)
        if not args.no_browser and _graphical():
            webbrowser.open_new_tab(instance.url)
        code = instance.wait()
        raise QfoldError(f"Model Explorer exited with {code}")
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 0
    finally:
        instance.stop()


def _write_only(bundle: mx.Bundle, sides: list[mx.ExploreSide], args) -> int:
    """``--out DIR``, or Model Explorer missing: write the files, print what opens them (and how to install it)."""
    installed = mx.explorer_installed()
    if args.out is not None:
        folder = Path(args.out)
    else:
        folder = Path(tempfile.mkdtemp(prefix="qfold-explore-"))
    bundle.write(folder)
    _summary(bundle, sides)
    print(f"wrote {len(bundle.files)} files to {folder}")
    _mapping_hint(bundle, folder)
    if not installed:
        print(f"Model Explorer is not installed: {mx.INSTALL_LINE}")
    print(f"open them: {bundle.command_text(folder, args.port)}")
    if bundle.pair:
        print(f"then, for A and B side by side: {bundle.url(folder, args.port)}")
    if args.out is None:
        print(f"error: Model Explorer is not installed ({mx.INSTALL_LINE}); the files are in {folder}",
              file=sys.stderr)
        return 1
    return 0
