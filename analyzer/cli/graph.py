"""``graph``: one layer of a program (or of A and B, aligned) as a picture for reports and code review.

    qfold graph A [B] --layer 0 --out layer0.svg     # SVG through Graphviz's dot
    qfold graph A [B] --layer outside --out rest.dot # DOT: always, no Graphviz needed

The picture is the dashboard's Graph view (``analyzer.report.graphview``): A and B as two clusters on one row
grid, with a legend. stdout: the layer's structural verdict, then the written file as the last line.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.analysis.record import Analysis, load_analyses, load_analysis
from analyzer.analysis.shapes import shapes_label
from analyzer.cli.common import (
    add_shape_option,
    add_strict_option,
    check_shape_names,
    check_strict,
    shapes_of,
    warn_unsized,
)
from analyzer.errors import QfoldError
from analyzer.report import graphview as gv

SUFFIXES = (".svg", ".dot")


def add_parser(sub) -> None:
    p = sub.add_parser("graph", help="draw one layer of A (and B, aligned) as SVG or DOT",
                       description="Draw the ops of one layer of a program, or of two programs aligned side by "
                                   "side (KV-replication tiles in red, ops only in A or only in B highlighted).")
    p.add_argument("a", help="build folder, analysis.json, .mlpackage or .aimodel")
    p.add_argument("b", nargs="?", help="a second one to align against A (e.g. qfold against repeat_kv)")
    p.add_argument("--layer", default="0",
                   help="a decoder layer number, or 'outside' (embedding, RoPE tables, final norm, lm_head); "
                        "default 0")
    p.add_argument("--out", required=True, help="FILE.svg (needs Graphviz's dot) or FILE.dot")
    p.add_argument("--no-collapse", action="store_true", help="one node per op (no collapsed elementwise chains)")
    p.add_argument("--function", metavar="NAME",
                   help="the function to draw of a multi-function package or build (e.g. decode, prefill); required "
                        "when A or B has several")
    add_shape_option(p)
    add_strict_option(p)
    p.set_defaults(func=cmd_graph)


def one_analysis(path: str, function: str | None, shapes=None) -> Analysis:
    """The analysis to draw: ``function`` of ``path``, or its only function; several without ``--function`` is an
    error naming them (a multi-function package never silently shows only one). ``shapes``: flexible inputs."""

    if function is not None:
        return load_analysis(path, function, shapes=shapes)
    analyses = load_analyses(path, shapes=shapes)
    if len(analyses) > 1:
        names = ", ".join(a.function for a in analyses)
        raise QfoldError(f"{path}: {len(analyses)} functions ({names}); pick one with --function")
    return analyses[0]


def _label(path: str, analysis: Analysis) -> str:
    """The side's label in the picture: its name, the shapes it was analysed at, and "not sized" when it was not
    (its sizes are then missing, never drawn as zero)."""
    return (label_of(path) + shapes_label(analysis.program.assumed_shapes)
            + ("" if analysis.sizing.sized else " (NOT SIZED)"))


def label_of(path: str) -> str:
    """``exaone-…-repeat_kv-…`` from ``…/exaone-…-repeat_kv-….analysis.json``, a build folder or a package."""
    name = Path(path).resolve().name
    for suffix in (".analysis.json", ".json", ".mlpackage"):
        name = name.removesuffix(suffix)
    return name


def cmd_graph(args) -> int:
    out = Path(args.out)
    if out.suffix.lower() not in SUFFIXES:
        raise QfoldError(f"--out {args.out}: name a .svg or a .dot file")
    if not out.parent.is_dir():
        raise QfoldError(f"--out {args.out}: folder {out.parent} does not exist")
    if out.suffix.lower() == ".svg" and gv.dot_binary() is None:
        raise QfoldError(f"--out {args.out}: Graphviz 'dot' is not installed (apt-get install graphviz); "
                         f"write {out.with_suffix('.dot')} instead")
    layer = gv.parse_layer(args.layer)
    shapes = shapes_of(args)
    a = one_analysis(args.a, args.function, shapes)
    b = one_analysis(args.b, args.function, shapes) if args.b else None
    program_a, program_b = a.program, (b.program if b is not None else None)
    check_shape_names(args, *(p for p in (program_a, program_b) if p is not None))
    unsized = warn_unsized((f"{label} {path}", x.sizing) for label, path, x in (("A", args.a, a), ("B", args.b, b))
                           if x is not None)
    check_strict(args, unsized)
    view = gv.layer_view(program_a, program_b, layer, label_a=_label(args.a, a),
                         label_b=_label(args.b, b) if b is not None else "B", collapse=not args.no_collapse)
    text = gv.render_view(view) if out.suffix.lower() == ".svg" else gv.view_dot(view)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise QfoldError(f"--out {args.out}: cannot write ({e.strerror})") from e
    ops = sum(len(n.ops) for side in view.sides for n in side.nodes)
    print(f"{view.title}: {ops:,} ops drawn" + (f"; {view.diff.verdict}" if view.diff is not None else ""))
    for label, program in (("A", program_a), ("B", program_b)):
        for assumed in (program.assumed_shapes if program is not None else ()):
            print(f"{label}: flexible input analysed at {assumed.text}")
    print(out)
    return 0
