"""The graph view's records, styles and row layout (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from analyzer.analysis.accounting import ByteAccount
from analyzer.compare.structdiff import (
    LayerDiff,
    Status,
    StructuralDiff,
    home_layers,
    is_const_like,
    layer_order,
)
from analyzer.errors import QfoldError
from analyzer.ir.coreml.mil_reader import VIEW_OPS, MilProgram
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
OFF_ANE_BORDER = "#7b3294"  # an op a placement plan put on the GPU or CPU: a thick purple border and a device badge
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
    device: str | None = None  # where a placement plan put the node's ops: ANE, GPU, CPU, "mixed"; None: no plan


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
class SideOps:
    """What one program contributes to a layer view while it is being built."""

    key: str
    label: str
    program: MilProgram
    homes: tuple[int | None, ...]
    acct: ByteAccount
    status: dict[int, Status | None]  # drawn op → status
    row: dict[int, int]  # drawn op → row of the alignment
    groups: list[list[int]] = field(default_factory=list)  # chains (a single op is a chain of one)
    devices: dict[int, str] = field(default_factory=dict)  # op → device, from a placement plan (may be empty)



def layer_diff_of(diff: StructuralDiff, layer: int | None, label_a: str, label_b: str) -> LayerDiff:
    try:
        return diff.layer(layer)
    except KeyError:
        raise QfoldError(f"neither {label_a} nor {label_b} has {layer_title(layer)}") from None


def row_depths(rows: Sequence[tuple[int | None, int | None, Status | None]], sides: Sequence[SideOps]) -> list[int]:
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


def chains(side: SideOps, row_depth: Sequence[int]) -> list[list[int]]:
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
        if len(readers) != 1 or ops[u].kind not in COLLAPSIBLE_OPS or any(t.name in outputs for t in ops[u].outputs):
            continue
        v = readers.pop()
        if v not in side.row or v in head or ops[v].kind not in COLLAPSIBLE_OPS or side.status[u] != side.status[v]:
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


