"""One side's nodes and edges: op labels, constant badges, what each tensor holds, collapsed chains."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import humanize

from analyzer.analysis.accounting import ATTRIBUTE_PARAMS, ByteAccount, account
from analyzer.compare.structdiff import (
    EN_DASH,
    Status,
    StructuralDiff,
    home_layers,
    is_const_like,
    structural_diff,
)
from analyzer.errors import QfoldError
from analyzer.ir.coreml.mil_reader import VIEW_OPS, InputRef, MilProgram, OpRecord, TensorInfo
from analyzer.report.graphview.layout import (
    LABEL_CHARS,
    EdgeKind,
    GraphEdge,
    GraphNode,
    LayerView,
    SideGraph,
    SideOps,
    chains,
    layer_diff_of,
    layer_title,
    row_depths,
)


# ------------------------------------------------------------------------------------------------- nodes
def size_text(n: int | None) -> str:
    if n is None:
        return "? B"
    return humanize.naturalsize(n, binary=True, format="%.1f").replace("Bytes", "B").replace("Byte", "B")


def cut_label(text: str, limit: int = LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tensor_text(t: TensorInfo) -> str:
    return f"{t.shape_text} {t.dtype}"


def output_text(op: OpRecord) -> str:
    if not op.outputs:
        return "no output"
    extra = f" +{len(op.outputs) - 1}" if len(op.outputs) > 1 else ""
    return _tensor_text(op.outputs[0]) + extra


def _const_data_bytes(program: MilProgram, index: int, seen: frozenset[int] = frozenset()) -> int:
    """Stored bytes of a constant (zero-valued constants move nothing); a constexpr: its stored inputs."""
    op = program.ops[index]
    if op.kind == "const":
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
                data.append((ref.stored_bytes, f"{ref.param} {size_text(ref.stored_bytes)}"))
            elif producer.kind == "const" and producer.const_zero:
                data.append((0, f"{ref.param} zero"))
            else:
                n = _const_data_bytes(program, producer.index)
                data.append((n, f"{ref.param} {size_text(n)}"))
    data.sort(key=lambda x: -x[0])
    parts = [text for _, text in data[:2]]
    if len(data) > 2:
        parts.append(f"+{len(data) - 2} const")
    if attrs:
        parts.append(",".join(dict.fromkeys(attrs)))
    return cut_label(" · ".join(parts), LABEL_CHARS + 6)


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
        elif op.kind == "read_state":
            kinds[op.index] = "kv"
        elif op.kind in VIEW_OPS or op.kind == "slice_update":
            src = next((r for r in op.inputs if r.param in ("x", "input") and r.producer is not None), None)
            kinds[op.index] = kinds.get(src.producer, "act") if src is not None else "act"  # type: ignore[arg-type]
    consumers = program.consumers()

    def reaches_kv_read(index: int, depth: int = 0) -> bool:
        if acct.ops[index].kv_read:
            return True
        return depth < 8 and ops[index].kind in VIEW_OPS and any(reaches_kv_read(c, depth + 1)
                                                                 for c in consumers[index])

    kv_inputs = set(states)
    for op in ops:
        for r in op.inputs:
            if r.producer is None and not r.is_const and r.tensor.name not in kv_inputs and reaches_kv_read(op.index):
                if r.tensor.shape and len(r.tensor.shape) >= 3:
                    kv_inputs.add(r.tensor.name)
    return kinds, kv_inputs


def _side_graph(side: SideOps, layer: int | None, group_depth: dict[int, int]) -> SideGraph:
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
        kv = any(ops[i].kind in ("read_state", "write_state") or acct.ops[i].kv_read or acct.ops[i].kv_write
                 for i in group)
        if len(group) == 1:
            title, kind = first.type, "op"
        else:
            title = (f"{first.type} → {last.type}" if len(group) == 2
                     else f"{first.type} … {last.type} ({len(group)} ops)")
            kind = "chain"
        tooltip = "\n".join(f"{ops[i].type} {ops[i].name} → {output_text(ops[i])} · "
                            f"{size_text(acct.ops[i].total)}/token" for i in group)
        placed = {side.devices[i] for i in group if i in side.devices}
        device = None if not placed else placed.pop() if len(placed) == 1 else "mixed"
        if device is not None:
            tooltip += "\n" + ", ".join(f"{ops[i].name} on {side.devices.get(i, '?')}" for i in group)
        nodes.append(GraphNode(node_id, kind, tuple(group), title, output_text(last), moved, copied,
                               _badge(program, group), side.status[first.index],
                               any(ops[i].tile_kind == "kv_replication" for i in group), kv,
                               group_depth[group[0]], tooltip, device))
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
            extra[node_id] = GraphNode(node_id, "state" if is_state else "input", (), cut_label(t.name),
                                       _tensor_text(t),
                                       t.nbytes or 0, 0, where, None, False, kind == "kv", 0,
                                       f"{where}: {t.name} {_tensor_text(t)} ({size_text(t.nbytes)})")
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
                extra.setdefault(out_id, GraphNode(out_id, "output", (), cut_label(t.name), _tensor_text(t),
                                                   t.nbytes or 0, 0, where, None, False, False,
                                                   depth_of[node_of[i]] + 1, f"{t.name} {_tensor_text(t)} {where}"))
                add_edge(node_of[i], out_id, t, kinds.get(i, "act"))
            if op.kind == "write_state":
                state = next((r.tensor for r in op.inputs if r.producer is None and r.tensor.name in states), None)
                if state is not None:
                    out_id = f"{key}written:{state.name}"
                    extra.setdefault(out_id, GraphNode(out_id, "state", (), cut_label(state.name), _tensor_text(state),
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

def layer_view(program_a: MilProgram, program_b: MilProgram | None = None, layer: int | None = 0, *,
               label_a: str = "A", label_b: str = "B", collapse: bool = True,
               diff: StructuralDiff | None = None, keys: tuple[str, str] = ("A", "B"),
               devices: Sequence[Sequence[tuple[int, str]]] = ()) -> LayerView:
    """The picture of ``layer`` (None: outside the layers) of A, or of A and B aligned. ``keys`` name the
    sides (and prefix their node ids): ("B", "A") draws B alone as "B". ``devices``: per side, (op index,
    device) pairs from a placement plan; each op node is badged with its device, those off the Neural Engine
    outlined."""
    ha = home_layers(program_a)
    if program_b is None:
        drawn = [op.index for op in program_a.ops if ha[op.index] == layer and not is_const_like(op)]
        if not drawn and layer not in ha:
            raise QfoldError(f"{label_a} has no {layer_title(layer)}")
        rows: list[tuple[int | None, int | None, Status | None]] = [(i, None, None) for i in drawn]
        layer_diff = None
    else:
        layer_diff = layer_diff_of(diff or structural_diff(program_a, program_b), layer, label_a, label_b)
        rows = [(r.a, r.b, r.status) for r in layer_diff.rows if not r.const]
    sides = [SideOps(keys[0], label_a, program_a, ha, account(program_a), {a: s for a, _, s in rows if a is not None},
                   {a: k for k, (a, _, _) in enumerate(rows) if a is not None})]
    if program_b is not None:
        sides.append(SideOps(keys[1], label_b, program_b, home_layers(program_b), account(program_b),
                           {b: s for _, b, s in rows if b is not None},
                           {b: k for k, (_, b, _) in enumerate(rows) if b is not None}))
    for side, placed in zip(sides, devices, strict=False):
        side.devices = dict(placed)
    row_depth = row_depths(rows, sides)
    for side in sides:
        side.groups = chains(side, row_depth) if collapse else [[i] for i in sorted(side.row)]
    used = sorted({row_depth[side.row[g[0]]] for side in sides for g in side.groups})
    dense = {d: k + 1 for k, d in enumerate(used)}  # row 0 holds the tensors entering the layer
    graphs = [_side_graph(side, layer, {g[0]: dense[row_depth[side.row[g[0]]]] for g in side.groups}) for side in sides]
    n_rows = max([len(used) + 1] + [n.depth + 1 for g in graphs for n in g.nodes])
    return LayerView(layer, tuple(graphs), n_rows, layer_diff, collapse)
