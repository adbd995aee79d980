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

Alignment: matched ops of A and B (see :mod:`analyzer.graph.structdiff`) sit on the same row; a row is the
longest path to the op in the union of the two graphs, so parallel branches share rows and an op only in
A leaves an empty row in B at the same height. Every node has the same height, so the two pictures line
up at the same scale. Colours: only in A orange, only in B blue, same op with other shapes yellow, KV
state reads/writes teal, KV-replication tiles red.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import humanize
import pandas as pd

from analyzer.errors import QfoldError
from analyzer.graph.accounting import ATTRIBUTE_PARAMS, ByteAccount, account
from analyzer.graph.mil import VIEW_OPS, InputRef, MilProgram, OpRecord, TensorInfo
from analyzer.graph.structdiff import (
    EN_DASH,
    LayerDiff,
    Status,
    StructuralDiff,
    home_layers,
    is_const_like,
    layer_order,
    structural_diff,
)
from analyzer.report.figures import OUTSIDE_LAYERS

GRAPHVIZ_TIMEOUT_S = 60
# dot's layout time grows fast with the node count: on the 2-core development machine a 239-node side took
# 2.4 s and a 563-node side more than 60 s. Larger pictures are refused (their DOT can still be written).
MAX_NODES_PER_SIDE = 300
NodeKind = Literal["op", "chain", "input", "state", "output"]
EdgeKind = Literal["act", "kv", "replication"]

# Ops a chain may be made of: elementwise arithmetic, the reductions of a norm, and views. Attention's
# matmul/softmax, KV reads and writes, tiles, slices and concats always keep their own node.
COLLAPSIBLE_OPS = frozenset(VIEW_OPS | {
    "add", "sub", "mul", "real_div", "pow", "maximum", "minimum", "floor_div", "mod",
    "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "inverse", "square", "sign", "floor", "ceil", "round", "clip",
    "sin", "cos", "tanh", "erf", "sigmoid", "silu", "gelu", "relu", "softplus", "cast", "select",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or",
    "logical_not", "reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_sum_square", "l2_norm",
    "layer_norm",
})

# Fill, border and font colours (Tableau 10 hues, as in ``figures``): alarm red is the replication colour.
STYLE = {
    "matched": ("#ffffff", "#7f7f7f", "#222222"),
    "changed": ("#fff2b3", "#b8860b", "#222222"),
    "only_a": ("#ffd9b8", "#d95f02", "#222222"),
    "only_b": ("#cfe3f7", "#1f6fbf", "#222222"),
    None: ("#ffffff", "#7f7f7f", "#222222"),
}
ALARM = ("#e45756", "#8b0000", "#ffffff")
KV_COLOR = "#1b8a8a"
STATE_FILL = "#d5f0ee"
INPUT_FILL = "#eeeeee"
EDGE_COLORS = {"act": "#666666", "kv": KV_COLOR, "replication": "#c0392b"}
LEGEND = (("only in A", STYLE["only_a"][0]), ("only in B", STYLE["only_b"][0]),
          ("same op, other shapes", STYLE["changed"][0]), ("KV-replication tile", ALARM[0]),
          ("KV state / cache", STATE_FILL))
NODE_HEIGHT_IN = 0.8  # every node (and every empty row) is this tall, so two pictures line up row by row
LABEL_CHARS = 34  # longest text line in a node before it is cut with an ellipsis


class GraphvizError(QfoldError):
    """Graphviz is missing or could not lay the graph out."""


# ------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class GraphNode:
    """One box of the picture: an op, a collapsed chain of ops, or a tensor entering/leaving the layer."""

    id: str  # DOT node id, unique in the picture: "A134", "A42+5", "Ain0", "Aout3", "Astate1"
    kind: NodeKind
    ops: tuple[int, ...]  # op indices drawn by this node (one for an op, several for a chain, none otherwise)
    title: str  # op type, chain summary, or tensor name
    output: str  # output shape and dtype ("[1,8,4,4096,64] fp16")
    bytes_per_token: int  # what the node's ops move per token (accounting.account); inputs: the tensor's size
    replication_bytes: int
    badge: str  # constants read by the ops, or where a tensor comes from / goes to
    status: Status | None  # None for a single program, and for inputs/outputs
    alarm: bool  # a KV-replication tile
    kv: bool  # reads or writes the KV cache
    depth: int  # row in the shared spine (ops from 1; a tensor entering the layer: the row above its first reader)
    tooltip: str


@dataclass(frozen=True, slots=True)
class GraphEdge:
    tail: str
    head: str
    tensor: str
    shape: str
    nbytes: int | None
    kind: EdgeKind


@dataclass(frozen=True, slots=True)
class SideGraph:
    key: str  # "A" or "B": the prefix of every node id
    label: str
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]

    def op_nodes(self, op_type: str | None = None) -> list[GraphNode]:
        return [n for n in self.nodes if n.kind == "op" and (op_type is None or n.title == op_type)]


@dataclass(frozen=True, slots=True)
class LayerView:
    layer: int | None
    sides: tuple[SideGraph, ...]  # one (a single analysis) or two (A, B)
    rows: int  # rows of the spine both sides share
    diff: LayerDiff | None = field(default=None)
    collapsed: bool = True

    @property
    def title(self) -> str:
        return layer_title(self.layer)


def layer_title(layer: int | None) -> str:
    return "outside the layers (embedding, RoPE tables, mask, final norm, lm_head)" if layer is None \
        else f"layer {layer}"


def parse_layer(text: str) -> int | None:
    """``"3"`` → 3, ``"outside"`` → None (the ``--layer`` argument and the dashboard's picker)."""
    if text.strip().lower() == OUTSIDE_LAYERS:
        return None
    try:
        value = int(text)
    except ValueError:
        raise QfoldError(f"--layer {text!r}: a layer number or {OUTSIDE_LAYERS!r}") from None
    if value < 0:
        raise QfoldError(f"--layer {value}: layers are numbered from 0")
    return value


def layer_choices(program_a: MilProgram, program_b: MilProgram | None = None) -> list[int | None]:
    """The layers either program has ops in, then outside (None)."""
    homes = list(home_layers(program_a)) + (list(home_layers(program_b)) if program_b is not None else [])
    return layer_order(homes)


# ------------------------------------------------------------------------------------------------- layout
@dataclass
class _Side:
    """What one program contributes to a layer view while it is being built."""

    key: str
    label: str
    program: MilProgram
    homes: tuple[int | None, ...]
    acct: ByteAccount
    status: dict[int, Status | None]  # drawn op → status
    row: dict[int, int]  # drawn op → row of the alignment
    groups: list[list[int]] = field(default_factory=list)  # chains (a single op is a chain of one)


def layer_view(program_a: MilProgram, program_b: MilProgram | None = None, layer: int | None = 0, *,
               label_a: str = "A", label_b: str = "B", collapse: bool = True,
               diff: StructuralDiff | None = None, keys: tuple[str, str] = ("A", "B")) -> LayerView:
    """The picture of ``layer`` (None: outside the layers) of A, or of A and B aligned. ``keys`` name the
    sides (and prefix their node ids): ("B", "A") draws B alone as "B"."""
    ha = home_layers(program_a)
    if program_b is None:
        drawn = [op.index for op in program_a.ops if ha[op.index] == layer and not is_const_like(op)]
        if not drawn and layer not in ha:
            raise QfoldError(f"{label_a} has no {layer_title(layer)}")
        rows: list[tuple[int | None, int | None, Status | None]] = [(i, None, None) for i in drawn]
        layer_diff = None
    else:
        layer_diff = _layer_diff(diff or structural_diff(program_a, program_b), layer, label_a, label_b)
        rows = [(r.a, r.b, r.status) for r in layer_diff.rows if not r.const]
    sides = [_Side(keys[0], label_a, program_a, ha, account(program_a), {a: s for a, _, s in rows if a is not None},
                   {a: k for k, (a, _, _) in enumerate(rows) if a is not None})]
    if program_b is not None:
        sides.append(_Side(keys[1], label_b, program_b, home_layers(program_b), account(program_b),
                           {b: s for _, b, s in rows if b is not None},
                           {b: k for k, (_, b, _) in enumerate(rows) if b is not None}))
    row_depth = _row_depths(rows, sides)
    for side in sides:
        side.groups = _chains(side, row_depth) if collapse else [[i] for i in sorted(side.row)]
    used = sorted({row_depth[side.row[g[0]]] for side in sides for g in side.groups})
    dense = {d: k + 1 for k, d in enumerate(used)}  # row 0 holds the tensors entering the layer
    graphs = [_side_graph(side, layer, {g[0]: dense[row_depth[side.row[g[0]]]] for g in side.groups}) for side in sides]
    n_rows = max([len(used) + 1] + [n.depth + 1 for g in graphs for n in g.nodes])
    return LayerView(layer, tuple(graphs), n_rows, layer_diff, collapse)


def _layer_diff(diff: StructuralDiff, layer: int | None, label_a: str, label_b: str) -> LayerDiff:
    try:
        return diff.layer(layer)
    except KeyError:
        raise QfoldError(f"neither {label_a} nor {label_b} has {layer_title(layer)}") from None


def _row_depths(rows: Sequence[tuple[int | None, int | None, Status | None]], sides: Sequence[_Side]) -> list[int]:
    """Longest path to each alignment row in the union of the sides' dataflow. The rows are in an order both
    programs agree with (the alignment is monotone), so every edge points to a later row."""
    depth = [0] * len(rows)
    for k in range(len(rows)):
        best = 0
        for side, index in zip(sides, rows[k][:2], strict=False):
            if index is None:
                continue
            for ref in side.program.ops[index].inputs:
                p = ref.producer
                if p is not None and p in side.row:
                    best = max(best, depth[side.row[p]] + 1)
        depth[k] = best
    return depth


def _chains(side: _Side, row_depth: Sequence[int]) -> list[list[int]]:
    """Maximal chains u → v of collapsible ops with one status, where u's only reader is v and every other
    input of v comes from before the chain started (so the chain's node can sit at its first op's row)."""
    ops = side.program.ops
    consumers = side.program.consumers()
    outputs = {t.name for t in side.program.outputs}
    head: dict[int, int] = {}
    nxt: dict[int, int] = {}
    for u in sorted(side.row):
        head.setdefault(u, u)
        readers = set(consumers[u])
        if len(readers) != 1 or ops[u].type not in COLLAPSIBLE_OPS or any(t.name in outputs for t in ops[u].outputs):
            continue
        v = readers.pop()
        if v not in side.row or v in head or ops[v].type not in COLLAPSIBLE_OPS or side.status[u] != side.status[v]:
            continue
        start = row_depth[side.row[head[u]]]
        others = [r.producer for r in ops[v].inputs if r.producer is not None and r.producer != u
                  and not is_const_like(ops[r.producer])]
        if all(p not in side.row or row_depth[side.row[p]] < start for p in others):
            nxt[u] = v
            head[v] = head[u]
    groups = []
    for u in sorted(side.row):
        if head[u] == u:
            chain = [u]
            while chain[-1] in nxt:
                chain.append(nxt[chain[-1]])
            groups.append(chain)
    return groups


# ------------------------------------------------------------------------------------------------- nodes
def _size(n: int | None) -> str:
    if n is None:
        return "? B"
    return humanize.naturalsize(n, binary=True, format="%.1f").replace("Bytes", "B").replace("Byte", "B")


def _cut(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tensor_text(t: TensorInfo) -> str:
    return f"{t.shape_text} {t.dtype}"


def _output_text(op: OpRecord) -> str:
    if not op.outputs:
        return "no output"
    extra = f" +{len(op.outputs) - 1}" if len(op.outputs) > 1 else ""
    return _tensor_text(op.outputs[0]) + extra


def _const_data_bytes(program: MilProgram, index: int, seen: frozenset[int] = frozenset()) -> int:
    """Stored bytes of a constant (zero-valued constants move nothing); a constexpr: its stored inputs."""
    op = program.ops[index]
    if op.type == "const":
        return 0 if op.const_zero else op.const_bytes
    total = 0
    for r in op.inputs:
        if r.producer is None:
            total += r.stored_bytes
        elif r.producer not in seen and is_const_like(program.ops[r.producer]):
            total += _const_data_bytes(program, r.producer, seen | {index})
    return total


def _badge(program: MilProgram, indices: Sequence[int]) -> str:
    """``weight 8.0 MiB · bias zero · shape, axes``: the constants the ops read, data first."""
    data: list[tuple[int, str]] = []
    attrs: list[str] = []
    for i in indices:
        for ref in program.ops[i].inputs:
            producer = program.ops[ref.producer] if ref.producer is not None else None
            if not (ref.is_const or (producer is not None and is_const_like(producer))):
                continue
            if ref.param in ATTRIBUTE_PARAMS or not ref.tensor.shape:
                attrs.append(ref.param)
                continue
            if producer is None:
                data.append((ref.stored_bytes, f"{ref.param} {_size(ref.stored_bytes)}"))
            elif producer.type == "const" and producer.const_zero:
                data.append((0, f"{ref.param} zero"))
            else:
                n = _const_data_bytes(program, producer.index)
                data.append((n, f"{ref.param} {_size(n)}"))
    data.sort(key=lambda x: -x[0])
    parts = [text for _, text in data[:2]]
    if len(data) > 2:
        parts.append(f"+{len(data) - 2} const")
    if attrs:
        parts.append(",".join(dict.fromkeys(attrs)))
    return _cut(" · ".join(parts), LABEL_CHARS + 6)


def _tensor_kinds(program: MilProgram, acct: ByteAccount) -> tuple[dict[int, EdgeKind], set[str]]:
    """What each op's output holds for colouring edges (the KV cache, a KV replica, or an activation), looking
    through views; and the names of the program inputs that are a KV cache (``--kv input``): those some op
    reads through views and the byte account charges as ``kv_read``."""
    ops = program.ops
    kinds: dict[int, EdgeKind] = {}
    states = {s.name for s in program.states}
    for op in ops:
        if op.tile_kind == "kv_replication":
            kinds[op.index] = "replication"
        elif op.type == "read_state":
            kinds[op.index] = "kv"
        elif op.type in VIEW_OPS or op.type == "slice_update":
            src = next((r for r in op.inputs if r.param in ("x", "input") and r.producer is not None), None)
            kinds[op.index] = kinds.get(src.producer, "act") if src is not None else "act"  # type: ignore[arg-type]
    consumers = program.consumers()

    def reaches_kv_read(index: int, depth: int = 0) -> bool:
        if acct.ops[index].kv_read:
            return True
        return depth < 8 and ops[index].type in VIEW_OPS and any(reaches_kv_read(c, depth + 1)
                                                                 for c in consumers[index])

    kv_inputs = set(states)
    for op in ops:
        for r in op.inputs:
            if r.producer is None and not r.is_const and r.tensor.name not in kv_inputs and reaches_kv_read(op.index):
                if r.tensor.shape and len(r.tensor.shape) >= 3:
                    kv_inputs.add(r.tensor.name)
    return kinds, kv_inputs


def _side_graph(side: _Side, layer: int | None, group_depth: dict[int, int]) -> SideGraph:
    program, acct, key = side.program, side.acct, side.key
    ops = program.ops
    kinds, kv_inputs = _tensor_kinds(program, acct)
    states = {s.name for s in program.states}
    program_outputs = {t.name for t in program.outputs}
    consumers = program.consumers()
    node_of: dict[int, str] = {}
    nodes: list[GraphNode] = []
    for group in side.groups:
        first, last = ops[group[0]], ops[group[-1]]
        node_id = f"{key}{first.index}" if len(group) == 1 else f"{key}{first.index}+{len(group) - 1}"
        for i in group:
            node_of[i] = node_id
        moved = sum(acct.ops[i].total for i in group)
        copied = sum(acct.ops[i].replication for i in group)
        kv = any(ops[i].type in ("read_state", "write_state") or acct.ops[i].kv_read or acct.ops[i].kv_write
                 for i in group)
        if len(group) == 1:
            title, kind = first.type, "op"
        else:
            title = (f"{first.type} → {last.type}" if len(group) == 2
                     else f"{first.type} … {last.type} ({len(group)} ops)")
            kind = "chain"
        tooltip = "\n".join(f"{ops[i].type} {ops[i].name} → {_output_text(ops[i])} · {_size(acct.ops[i].total)}/token"
                            for i in group)
        nodes.append(GraphNode(node_id, kind, tuple(group), title, _output_text(last), moved, copied,
                               _badge(program, group), side.status[first.index],
                               any(ops[i].tile_kind == "kv_replication" for i in group), kv,
                               group_depth[group[0]], tooltip))
    depth_of = {n.id: n.depth for n in nodes}

    edges: dict[tuple[str, str, str], GraphEdge] = {}
    extra: dict[str, GraphNode] = {}

    def add_edge(tail: str, head: str, tensor: TensorInfo, kind: EdgeKind) -> None:
        if tail != head:
            edges.setdefault((tail, head, tensor.name), GraphEdge(tail, head, tensor.name, tensor.shape_text,
                                                                  tensor.nbytes, kind))

    def entering(ref: InputRef) -> tuple[str, EdgeKind]:
        """The node a tensor entering the layer is drawn as (placed just above its first reader, below)."""
        t = ref.tensor
        if ref.producer is None:
            is_state = t.name in states
            kind: EdgeKind = "kv" if t.name in kv_inputs else "act"
            node_id = f"{key}state:{t.name}" if is_state else f"{key}in:{t.name}"
            where = "KV state" if is_state else "KV cache input" if kind == "kv" else "program input"
        else:
            kind = kinds.get(ref.producer, "act")
            node_id = f"{key}in:{t.name}"
            home = side.homes[ref.producer]
            where = f"from {'outside the layers' if home is None else f'layer {home}'}"
            is_state = False
        if node_id not in extra:
            extra[node_id] = GraphNode(node_id, "state" if is_state else "input", (), _cut(t.name), _tensor_text(t),
                                       t.nbytes or 0, 0, where, None, False, kind == "kv", 0,
                                       f"{where}: {t.name} {_tensor_text(t)} ({_size(t.nbytes)})")
        return node_id, kind

    for group in side.groups:
        for i in group:
            op = ops[i]
            for ref in op.inputs:
                p = ref.producer
                if ref.is_const or (p is not None and is_const_like(ops[p])):
                    continue  # a badge
                if op.type == "write_state" and ref.producer is None and ref.tensor.name in states:
                    continue  # the state it writes, drawn below
                if p is not None and p in node_of:
                    add_edge(node_of[p], node_of[i], ref.tensor, kinds.get(p, "act"))
                else:
                    tail, kind = entering(ref)
                    add_edge(tail, node_of[i], ref.tensor, kind)
            leaving = _leaving(op, side.homes, layer, consumers, program_outputs)
            for t, where in leaving:
                out_id = f"{key}out:{t.name}"
                extra.setdefault(out_id, GraphNode(out_id, "output", (), _cut(t.name), _tensor_text(t), t.nbytes or 0,
                                                   0, where, None, False, False, depth_of[node_of[i]] + 1,
                                                   f"{t.name} {_tensor_text(t)} {where}"))
                add_edge(node_of[i], out_id, t, kinds.get(i, "act"))
            if op.type == "write_state":
                state = next((r.tensor for r in op.inputs if r.producer is None and r.tensor.name in states), None)
                if state is not None:
                    out_id = f"{key}written:{state.name}"
                    extra.setdefault(out_id, GraphNode(out_id, "state", (), _cut(state.name), _tensor_text(state),
                                                       state.nbytes or 0, 0, "KV state, written", None, False, True,
                                                       depth_of[node_of[i]] + 1,
                                                       f"KV state written: {state.name} {_tensor_text(state)}"))
                    add_edge(node_of[i], out_id, state, "kv")
    # a tensor entering the layer sits just above its first reader (the rows exist on both sides, so this
    # keeps the alignment and spreads the inputs instead of lining them all up on the top row)
    all_depths = {**depth_of, **{n.id: n.depth for n in extra.values()}}
    for node_id, node in list(extra.items()):
        if node.kind in ("input", "state") and node.depth == 0:
            readers = [all_depths[e.head] for e in edges.values() if e.tail == node_id]
            extra[node_id] = replace(node, depth=max(0, min(readers, default=1) - 1))
    return SideGraph(key, side.label, tuple(nodes) + tuple(extra.values()), tuple(edges.values()))


def _leaving(op: OpRecord, homes: Sequence[int | None], layer: int | None, consumers: dict[int, list[int]],
             program_outputs: set[str]) -> list[tuple[TensorInfo, str]]:
    """The op's outputs read outside the layer, with where they go."""
    out = []
    readers_elsewhere = sorted({homes[c] for c in consumers[op.index] if homes[c] != layer},
                               key=lambda x: (x is None, x if x is not None else 0))
    for k, t in enumerate(op.outputs):
        where = []
        if t.name in program_outputs:
            where.append("program output")
        if readers_elsewhere and k == 0:  # MIL ops here have one output; readers are per op
            where.append(_layers_text(readers_elsewhere))
        if where:
            out.append((t, "to " + ", ".join(where)))
    return out


def _layers_text(layers: Sequence[int | None]) -> str:
    numbered = [x for x in layers if x is not None]
    parts = []
    if len(numbered) == 1:
        parts.append(f"layer {numbered[0]}")
    elif numbered:
        contiguous = numbered == list(range(numbered[0], numbered[-1] + 1))
        parts.append(f"layers {numbered[0]}{EN_DASH}{numbered[-1]}" if contiguous else f"{len(numbered)} layers")
    if None in layers:
        parts.append("outside the layers")
    return " and ".join(parts)


# ------------------------------------------------------------------------------------------------- DOT
def _dot_str(text: str) -> str:
    """A DOT double-quoted string: backslashes and quotes escaped, newlines as DOT's ``\\n``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "\\n") + '"'


def _html(text: str) -> str:
    return html.escape(text, quote=True)


def _label(node: GraphNode) -> str:
    """Four lines for every node (the same height everywhere): title, output, bytes, badge."""
    if node.kind in ("input", "state", "output"):
        third = f"size {_size(node.bytes_per_token)}"
    else:
        third = f"{_size(node.bytes_per_token)}/token"
        if node.replication_bytes:
            third += f" · {_size(node.replication_bytes)} replication"
    lines = [f'<B>{_html(_cut(node.title))}</B>', _html(_cut(node.output)), _html(third),
             f'<FONT POINT-SIZE="8">{_html(node.badge) or "&#160;"}</FONT>']
    return "<" + "<BR/>".join(lines) + ">"


def _node_attrs(node: GraphNode) -> dict[str, str]:
    classes = [node.kind, *([f"optype-{node.title}"] if node.kind == "op" else []), node.status or "single"]
    if node.alarm:
        classes.append("kv-replication")
    if node.kv:
        classes.append("kv")
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
    return attrs


def _node_stmt(node: GraphNode) -> str:
    attrs = ", ".join(f"{k}={_dot_str(v)}" for k, v in _node_attrs(node).items())
    return f"  {_dot_str(node.id)} [label={_label(node)}, {attrs}];"


def _edge_stmt(edge: GraphEdge) -> str:
    label = f"{edge.shape} {_size(edge.nbytes)}"
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
                "replication_bytes", "consts", "status", "row")


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
                         "row": n.depth})
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
        return op.type, op.name, _output_text(op)

    rows = []
    for r in diff.rows:
        ta, na, oa = cell(program_a, r.a)
        tb, nb, ob = cell(program_b, r.b)
        rows.append({"status": r.status, "const": r.const, "a_type": ta, "a_name": na, "a_output": oa,
                     "b_type": tb, "b_name": nb, "b_output": ob})
    return pd.DataFrame(rows, columns=["status", "const", "a_type", "a_name", "a_output", "b_type", "b_name",
                                       "b_output"])
