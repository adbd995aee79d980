"""The graph view: the ops of one layer of one or two MIL programs as directed graphs, aligned row by row.

Pure functions, no streamlit: :func:`layer_view` builds the picture as records (nodes, edges, rows),
:func:`side_dot` / :func:`view_dot` write it as Graphviz DOT, :func:`render_svg` runs Graphviz's ``dot``
when it is installed, and :func:`pair_html` lays two SVGs side by side for the dashboard and the report.
The dashboard, the ``graph`` CLI command and the HTML report all draw from the same :class:`LayerView`.

What is drawn, per side::

    (in) hidden [1,1,2048]      ◄ tensors from another layer / program inputs: top row
    [state] k_cache_0           ◄ KV state read (teal cylinder)
       │
    linear  [1,1,512] fp16      ◄ one node per op: type, output shape and dtype, bytes it moves per token,
    2.0 MiB/token               ◄   and a badge for the constants it reads (weights with their stored bytes;
    weight 2.0 MiB · bias zero  ◄   attributes such as shape, axes, reps by name)
       │ [1,1,512] 1.0 KiB      ◄ an edge is a tensor: shape and size
    tile [1,8,4,4096,64]        ◄ a KV-replication tile: alarm red
    pow … mul (6 ops)           ◄ a chain of elementwise ops of one status, collapsed into one node

Alignment: matched ops of A and B (see :mod:`analyzer.compare.structdiff`) sit on the same row; a row is the
longest path to the op in the union of the two graphs, so parallel branches share rows and an op only in
A leaves an empty row in B at the same height. Every node has the same height, so the two pictures line
up at the same scale. Colours: only in A orange, only in B blue, same op with other shapes yellow, KV
state reads/writes teal, KV-replication tiles red.
"""

from __future__ import annotations

from analyzer.report.figures import OUTSIDE_LAYERS
from analyzer.report.graphview.layout import (
    MAX_NODES_PER_SIDE,
    GraphEdge,
    GraphNode,
    GraphvizError,
    LayerView,
    SideGraph,
    layer_choices,
    layer_title,
    parse_layer,
)
from analyzer.report.graphview.nodes import (
    layer_view,
)
from analyzer.report.graphview.render import (
    alignment_frame,
    check_layout_size,
    dot_binary,
    legend_text,
    nodes_frame,
    pair_html,
    render_sides,
    render_svg,
    render_view,
    report_html,
    side_dot,
    structdiff_frame,
    svg_size_pt,
    view_dot,
)

__all__ = [
    "MAX_NODES_PER_SIDE",
    "OUTSIDE_LAYERS",
    "GraphEdge",
    "GraphNode",
    "GraphvizError",
    "LayerView",
    "SideGraph",
    "alignment_frame",
    "check_layout_size",
    "dot_binary",
    "layer_choices",
    "layer_title",
    "layer_view",
    "legend_text",
    "nodes_frame",
    "pair_html",
    "parse_layer",
    "render_sides",
    "render_svg",
    "render_view",
    "report_html",
    "side_dot",
    "structdiff_frame",
    "svg_size_pt",
    "view_dot",
]
