"""DOT, SVG (Graphviz's ``dot`` when installed) and the side-by-side HTML of a layer view."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Sequence

import pandas as pd

from analyzer.compare.structdiff import (
    LayerDiff,
    StructuralDiff,
)
from analyzer.ir.coreml.mil_reader import MilProgram
from analyzer.report.figures import OUTSIDE_LAYERS
from analyzer.report.graphview.layout import (
    ALARM,
    EDGE_COLORS,
    GRAPHVIZ_TIMEOUT_S,
    INPUT_FILL,
    KV_COLOR,
    LEGEND,
    MAX_NODES_PER_SIDE,
    NODE_HEIGHT_IN,
    OFF_ANE_BORDER,
    STATE_FILL,
    STYLE,
    GraphEdge,
    GraphNode,
    GraphvizError,
    LayerView,
    SideGraph,
    layer_choices,
)
from analyzer.report.graphview.nodes import cut_label, layer_view, output_text, size_text


# ------------------------------------------------------------------------------------------------- DOT
def _dot_str(text: str) -> str:
    """A DOT double-quoted string: backslashes and quotes escaped, newlines as DOT's ``\\n``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "\\n") + '"'


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _label(node: GraphNode) -> str:
    """Four lines for every node (the same height everywhere): title, output, bytes, badge."""
    if node.kind in ("input", "state", "output"):
        third = f"size {size_text(node.bytes_per_token)}"
    else:
        third = f"{size_text(node.bytes_per_token)}/token"
        if node.replication_bytes:
            third += f" · {size_text(node.replication_bytes)} replication"
        if node.device is not None:
            third += f" · {node.device}"
    lines = [f'<B>{_html(cut_label(node.title))}</B>', _html(cut_label(node.output)), _html(third),
             f'<FONT POINT-SIZE="8">{_html(node.badge) or "&#160;"}</FONT>']
    return "<" + "<BR/>".join(lines) + ">"


def _node_attrs(node: GraphNode) -> dict[str, str]:
    classes = [node.kind, *([f"optype-{node.title}"] if node.kind == "op" else []), node.status or "single"]
    if node.alarm:
        classes.append("kv-replication")
    if node.kv:
        classes.append("kv")
    if node.device is not None:
        classes.append(f"device-{node.device}")
    fill, border, font = ALARM if node.alarm else STYLE[node.status]
    attrs = {"id": node.id, "class": " ".join(classes), "tooltip": node.tooltip, "fillcolor": fill,
             "color": border, "fontcolor": font}
    if node.kind == "state":
        attrs.update(shape="cylinder", fillcolor=STATE_FILL, color=KV_COLOR, penwidth="1.5")
    elif node.kind == "input":
        attrs.update(shape="box", style="filled,dashed", fillcolor=STATE_FILL if node.kv else INPUT_FILL,
                     color=KV_COLOR if node.kv else "#999999")
    elif node.kind == "output":
        attrs.update(shape="box", style="dashed", color="#999999")
    else:
        if node.status in ("only_a", "only_b") or node.alarm:
            attrs["penwidth"] = "2.5"
        if node.kv and not node.alarm:
            attrs.update(color=KV_COLOR, penwidth="2.5")
        if node.kind == "chain":
            attrs["style"] = "rounded,filled,dashed"
        if node.device not in (None, "ANE"):
            attrs.update(color=OFF_ANE_BORDER, penwidth="3.5")
    return attrs


def _node_stmt(node: GraphNode) -> str:
    attrs = ", ".join(f"{k}={_dot_str(v)}" for k, v in _node_attrs(node).items())
    return f"  {_dot_str(node.id)} [label={_label(node)}, {attrs}];"


def _edge_stmt(edge: GraphEdge) -> str:
    label = f"{edge.shape} {size_text(edge.nbytes)}"
    color = EDGE_COLORS[edge.kind]
    width = "2.2" if edge.kind != "act" else "1"
    return (f"  {_dot_str(edge.tail)} -> {_dot_str(edge.head)} [xlabel={_dot_str(label)}, color={_dot_str(color)}, "
            f"fontcolor={_dot_str(color)}, penwidth={width}, tooltip={_dot_str(edge.tensor + ' ' + label)}];")


_GRAPH_ATTRS = ('  graph [rankdir=TB, newrank=true, nodesep=0.22, ranksep=0.32, fontname="Helvetica", fontsize=11, '
                'forcelabels=true, outputorder=edgesfirst];\n'
                '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9, '
                f'height={NODE_HEIGHT_IN}, margin="0.08,0.03"];\n'
                '  edge [fontname="Helvetica", fontsize=7, arrowsize=0.6];')


def _spine(prefix: str, rows: int, members: dict[int, list[str]]) -> list[str]:
    """Invisible row markers, one per row, chained top to bottom; each row's nodes share its rank."""
    out = [f'  {_dot_str(f"{prefix}row{r}")} [style=invis, label="", width=0.01, height={NODE_HEIGHT_IN}];'
           for r in range(rows)]
    out += [f'  {_dot_str(f"{prefix}row{r}")} -> {_dot_str(f"{prefix}row{r + 1}")} [style=invis];'
            for r in range(rows - 1)]
    for r in range(rows):
        same = " ".join(f"{_dot_str(n)};" for n in [f"{prefix}row{r}", *members.get(r, [])])
        out.append(f"  {{ rank=same; {same} }}")
    return out


def _members(graphs: Sequence[SideGraph]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for g in graphs:
        for n in g.nodes:
            out.setdefault(n.depth, []).append(n.id)
    return out


def legend_text(view: LayerView) -> str:
    parts = [f"{view.title}"]
    if len(view.sides) == 2:
        parts.append("orange: only in A · blue: only in B · yellow: same op, other shapes")
    parts.append("red: KV-replication tile · teal: KV state/cache · dashed box: collapsed chain or a tensor "
                 "entering/leaving the layer · edges: tensor shape and size · bytes: logical bytes per decode token")
    if any(n.device is not None for g in view.sides for n in g.nodes):
        parts.append("ANE/GPU/CPU after the bytes: where the placement plan put the op; purple border: off the "
                     "Neural Engine")
    return "\n".join(parts)


def side_dot(view: LayerView, index: int = 0) -> str:
    """One side as its own digraph (the dashboard draws A and B as two pictures on one row grid)."""
    g = view.sides[index]
    lines = [f"digraph {_dot_str(g.key)} {{", _GRAPH_ATTRS, *_spine(g.key, view.rows, _members([g]))]
    lines += [_node_stmt(n) for n in g.nodes] + [_edge_stmt(e) for e in g.edges] + ["}"]
    return "\n".join(lines) + "\n"


def view_dot(view: LayerView) -> str:
    """The whole picture as one digraph: one side, or A and B as two clusters on one row grid, with a legend."""
    lines = ["digraph qfold {", _GRAPH_ATTRS,
             f"  graph [label={_dot_str(legend_text(view))}, labelloc=b, labeljust=l];",
             *_spine("", view.rows, _members(view.sides))]
    for g in view.sides:
        lines.append(f"  subgraph {_dot_str('cluster_' + g.key)} {{")
        lines.append(f"    graph [label={_dot_str(f'{g.key}: {g.label}')}, labelloc=t, style=rounded, "
                     'color="#bbbbbb"];')
        lines += ["  " + _node_stmt(n) for n in g.nodes]
        lines.append("  }")
    lines += [_edge_stmt(e) for g in view.sides for e in g.edges] + ["}"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- SVG
def dot_binary() -> str | None:
    """Graphviz's ``dot`` on PATH, or None."""
    return shutil.which("dot")


def render_svg(dot_text: str) -> str:
    """DOT → SVG through Graphviz ``dot`` (the ``<svg>`` element only: no XML prolog or doctype)."""
    binary = dot_binary()
    if binary is None:
        raise GraphvizError("Graphviz 'dot' is not installed (apt-get install graphviz); write a .dot file instead")
    try:
        done = subprocess.run([binary, "-Tsvg"], input=dot_text, capture_output=True, text=True,
                              timeout=GRAPHVIZ_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise GraphvizError(f"Graphviz 'dot' took more than {GRAPHVIZ_TIMEOUT_S} s to lay the graph out") from None
    if done.returncode != 0 or "<svg" not in done.stdout:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise GraphvizError(f"Graphviz 'dot' failed (exit {done.returncode}): {last}")
    return done.stdout[done.stdout.index("<svg"):]


_SVG_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"\s+viewBox="([\d.\s-]+)"')


def svg_size_pt(svg: str) -> tuple[float, float]:
    m = _SVG_SIZE.search(svg)
    if not m:
        raise GraphvizError("unexpected SVG from Graphviz: no width/height/viewBox on <svg>")
    return float(m[1]), float(m[2])


def _pad_svg(svg: str, width_pt: float, height_pt: float) -> str:
    """Grow the canvas (not the drawing) to ``width × height`` pt, so two pictures share one scale: Graphviz
    draws from the top-left, so the extra room goes right and below."""
    m = _SVG_SIZE.search(svg)
    if not m:
        return svg
    x0, y0, w, h = (float(v) for v in m[3].split())
    sx, sy = width_pt / float(m[1]), height_pt / float(m[2])
    head = (f'<svg width="{width_pt:.0f}pt" height="{height_pt:.0f}pt"\n'
            f' viewBox="{x0:.2f} {y0:.2f} {w * sx:.2f} {h * sy:.2f}"')
    return svg[:m.start()] + head + svg[m.end():]


def check_layout_size(view: LayerView) -> None:
    """Refuse to lay out a picture too large for ``dot`` to finish in reasonable time."""
    biggest = max((len(g.nodes) for g in view.sides), default=0)
    if biggest > MAX_NODES_PER_SIDE:
        raise GraphvizError(f"{view.title} has {biggest:,} nodes on one side, more than the {MAX_NODES_PER_SIDE} "
                            "Graphviz lays out in reasonable time; download the DOT instead (or pick a layer: a "
                            "program whose op names give no layer numbers has everything outside the layers)")


def render_view(view: LayerView) -> str:
    """The whole picture (:func:`view_dot`) as one SVG."""
    check_layout_size(view)
    return render_svg(view_dot(view))


def render_sides(view: LayerView) -> list[str]:
    """One SVG per side, padded to a common canvas so the rows line up at one scale."""
    check_layout_size(view)
    svgs = [render_svg(side_dot(view, i)) for i in range(len(view.sides))]
    sizes = [svg_size_pt(s) for s in svgs]
    width, height = max(w for w, _ in sizes), max(h for _, h in sizes)
    return [_pad_svg(s, width, height) for s in svgs]


_PAIR_CSS = """
.qg-legend{font:12px Helvetica,Arial,sans-serif;margin:4px 0 6px;display:flex;flex-wrap:wrap;gap:10px}
.qg-legend span{display:inline-flex;align-items:center;gap:4px}
.qg-legend i{display:inline-block;width:14px;height:10px;border:1px solid #888}
.qg-pane{overflow:auto;border:1px solid #ddd}
.qg-graphs{display:flex;gap:18px;align-items:flex-start;padding:6px;width:max-content}
.qg-side h4{font:600 13px Helvetica,Arial,sans-serif;margin:0 0 4px;white-space:nowrap}
"""
ZOOM_LEVELS: tuple[str, ...] = ("fit", "50", "75", "100", "150")  # percent of Graphviz's natural size, or fit


def _legend_html(view: LayerView) -> str:
    items = LEGEND if len(view.sides) == 2 else LEGEND[3:]
    chips = "".join(f'<span><i style="background:{c}"></i>{_html(t)}</span>' for t, c in items)
    return f'<div class="qg-legend">{chips}<span>dashed: collapsed chain / tensor entering or leaving</span></div>'


def _sides_html(view: LayerView, svgs: Sequence[str]) -> str:
    cols = "".join(f'<div class="qg-side" id="side-{g.key}"><h4>{_html(g.key)}: {_html(g.label)}</h4>{svg}</div>'
                   for g, svg in zip(view.sides, svgs, strict=True))
    return f'<div class="qg-graphs">{cols}</div>'


def pair_html(view: LayerView, svgs: Sequence[str], *, height_px: int = 720, zoom: str = "75") -> str:
    """A page for the dashboard's frame: legend, zoom and the sides in one scrolling pane, so A and B pan
    together. Zoom is CSS only (radio buttons and ``zoom``; "fit" sizes every side to a share of the width):
    the page runs no script. The SVGs share one canvas size (:func:`render_sides`), so rows stay aligned."""
    n = max(len(svgs), 1)
    radios = "".join(f'<input type="radio" name="qg-z" id="qg-z{z}"{" checked" if z == zoom else ""} hidden>'
                     for z in ZOOM_LEVELS)
    labels = " ".join(f'<label for="qg-z{z}">{z if z == "fit" else z + "%"}</label>' for z in ZOOM_LEVELS)
    css = [f"#qg-z{z}:checked ~ .qg-bar label[for=qg-z{z}]{{font-weight:700;text-decoration:underline}}"
           for z in ZOOM_LEVELS]
    css += [f"#qg-z{z}:checked ~ .qg-pane .qg-graphs{{zoom:{int(z) / 100}}}" for z in ZOOM_LEVELS if z != "fit"]
    css.append(f"#qg-zfit:checked ~ .qg-pane svg{{width:calc((100vw - {30 + 18 * (n - 1)}px) / {n});height:auto}}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><style>"
            f"body{{margin:0;font:12px Helvetica,Arial,sans-serif}}{_PAIR_CSS}"
            f".qg-pane{{height:{height_px - 64}px}}"
            f".qg-bar label{{cursor:pointer;padding:0 4px;color:#1f6fbf}}{''.join(css)}"
            "</style></head><body>"
            f"{radios}<div class='qg-bar'>zoom: {labels}</div>{_legend_html(view)}"
            f"<div class='qg-pane'>{_sides_html(view, svgs)}</div></body></html>")


def report_html(program_a: MilProgram, program_b: MilProgram | None, label_a: str, label_b: str,
                layer: int | None = 0) -> str:
    """The report's section: the layer's graphs of A and B side by side (inline SVG), or the DOT text with a
    note when Graphviz is not installed."""
    choices = layer_choices(program_a, program_b)
    view = layer_view(program_a, program_b, layer if layer in choices else choices[0], label_a=label_a,
                      label_b=label_b)
    head = f"<h2>Graph of {_html(view.title)}</h2>"
    note = ""
    if view.diff is not None:
        note = f"<p>{_html(view.diff.verdict)} ({view.diff.matched} matched, {view.diff.changed} changed, " \
               f"{view.diff.only_a} only in A, {view.diff.only_b} only in B, constants included).</p>"
    try:
        svgs = render_sides(view)
    except GraphvizError as e:
        return (f"{head}{note}<p class='note'>{_html(str(e))}: the picture is given as DOT "
                f"(render it with <code>dot -Tsvg</code>).</p><pre>{_html(view_dot(view))}</pre>")
    return (f"{head}{note}<style>{_PAIR_CSS}.qg-pane{{max-height:900px}}</style>{_legend_html(view)}"
            f"<div class='qg-pane'>{_sides_html(view, svgs)}</div>")


# ------------------------------------------------------------------------------------------------- frames
NODE_COLUMNS = ("side", "node", "kind", "title", "ops", "op_types", "op_names", "output", "bytes_per_token",
                "replication_bytes", "consts", "status", "row", "device")


def nodes_frame(view: LayerView, programs: Sequence[MilProgram]) -> pd.DataFrame:
    """The numbers behind the picture: one row per node (ops with their bytes per token)."""
    rows = []
    for g, program in zip(view.sides, programs, strict=True):
        for n in g.nodes:
            rows.append({"side": g.key, "node": n.id, "kind": n.kind, "title": n.title, "ops": len(n.ops),
                         "op_types": " ".join(program.ops[i].type for i in n.ops),
                         "op_names": " ".join(program.ops[i].name for i in n.ops), "output": n.output,
                         "bytes_per_token": n.bytes_per_token if n.kind in ("op", "chain") else 0,
                         "replication_bytes": n.replication_bytes, "consts": n.badge, "status": n.status or "",
                         "row": n.depth, "device": n.device or ""})
    return pd.DataFrame(rows, columns=list(NODE_COLUMNS))


STRUCTDIFF_COLUMNS = ("layer", "ops_a", "ops_b", "delta_ops", "matched", "changed", "only_a", "only_b",
                      "type_deltas", "verdict")


def structdiff_frame(diff: StructuralDiff) -> pd.DataFrame:
    """Per layer: op counts (constants included), matched / changed / only-A / only-B, the type deltas and
    the verdict; ``layer`` is the layer number or ``outside``."""
    rows = [{**r, "layer": OUTSIDE_LAYERS if r["layer"] is None else str(r["layer"])} for r in diff.rows()]
    return pd.DataFrame(rows, columns=list(STRUCTDIFF_COLUMNS))


def alignment_frame(diff: LayerDiff, program_a: MilProgram, program_b: MilProgram) -> pd.DataFrame:
    """Every row of one layer's alignment: A's op and B's op (type, name, output) and the status."""
    def cell(program: MilProgram, index: int | None) -> tuple[str, str, str]:
        if index is None:
            return "", "", ""
        op = program.ops[index]
        return op.type, op.name, output_text(op)

    rows = []
    for r in diff.rows:
        ta, na, oa = cell(program_a, r.a)
        tb, nb, ob = cell(program_b, r.b)
        rows.append({"status": r.status, "const": r.const, "a_type": ta, "a_name": na, "a_output": oa,
                     "b_type": tb, "b_name": nb, "b_output": ob})
    return pd.DataFrame(rows, columns=["status", "const", "a_type", "a_name", "a_output", "b_type", "b_name",
                                       "b_output"])
