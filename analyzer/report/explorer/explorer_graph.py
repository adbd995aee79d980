"""One analysed function as a Model Explorer graph (``model_explorer.graph_builder.Graph``, as JSON-ready dicts).

Nodes are ops (constants included: Model Explorer hides nodes labelled ``const`` by default, its own setting),
plus one ``GraphInputs`` node holding the program's inputs and states and one ``GraphOutputs`` node; edges are
tensors (``incomingEdges``: the producer's output index → the reader's input position). Each node carries its
op's type (label), output names, shapes and dtypes (``outputsMetadata``: ``tensor_name``, ``shape``, ``dtype``,
``bytes``) and qfold's figures as attributes (strings; bytes and FLOPs as exact integers)::

    tile  layers.0/self_attn          ◄ namespace: decoder layer, then the block its names say
      index 118 · name k_rep_1 · layer 0
      bytes_per_token 33554432 · replication_bytes 33554432 · flops_per_call 0
      replication: KV replication: 8 KV heads → 32 query heads (group 4)
      device GPU · cost 0.021           ◄ with a placement plan (``--plan``)

A figure qfold could not compute (a symbolic dimension, an op type with no FLOP rule) is never a zero: its
attribute says ``not computed: …`` and the overlays leave the node out. Namespaces: ``layers.N`` then the block
(``self_attn``, ``mlp``, ``input_layernorm``, …) when the op's own name or its constants' names say it, else the
block of the first op downstream in the same layer that has one (a norm's ``pow`` … ``rsqrt`` belong to the norm
whose weight they feed), else the layer itself; ops outside the decoder layers are under ``outside``. Names are
never parsed into the namespace beyond those fixed block names, so a package's op names stay data.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.analysis.accounting import ATTRIBUTE_PARAMS, CATEGORIES
from analyzer.analysis.record import Analysis
from analyzer.compare.structdiff import Status, home_layers, is_const_like
from analyzer.ir.mil_records import MilProgram, OpRecord
from analyzer.ir.opfacts import copy_facts
from analyzer.ir.replication import IndexCache, classify_copy
from analyzer.measure.placement import JoinedOp, PlacementJoin
from analyzer.report.figures import OUTSIDE_LAYERS as OUTSIDE
from analyzer.report.graphview.layout import ALARM, STYLE

INPUTS_NODE = "GraphInputs"  # Model Explorer's own name for the node holding a graph's inputs
OUTPUTS_NODE = "GraphOutputs"
STATUS_TEXT: dict[Status, str] = {"matched": "matched", "changed": "same op, other shapes", "only_a": "only in A",
                                  "only_b": "only in B"}

# Submodule names of decoder layers (transformers' attribute names, as converters keep them in op and weight
# names: ``model_layers_3_self_attn_o_proj_weight``), longest first so ``post_attention_layernorm`` is not read
# as ``attention``. An op whose names hold none of them stays in its layer's namespace.
LAYER_BLOCKS = tuple(sorted((
    "self_attn", "attention", "attn", "cross_attn", "mlp", "feed_forward", "block_sparse_moe", "ffn", "moe",
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm",
    "ln_1", "ln_2", "norm1", "norm2"), key=len, reverse=True))
OUTSIDE_BLOCKS = ("embed_tokens", "lm_head", "rotary_emb", "wte", "wpe", "ln_f", "final_norm")
_LAYER_PREFIX = re.compile(r"(?:^|[_.])(?:layers?|h|blocks?)[_.]\d+[_.]")
_BLOCK_AFTER = {b: re.compile(rf"{re.escape(b)}(?:[_.]|$)") for b in LAYER_BLOCKS}
_OUTSIDE_TOKEN = {b: re.compile(rf"(?:^|[_.]){re.escape(b)}(?:[_.]|$)") for b in OUTSIDE_BLOCKS}


# ------------------------------------------------------------------------------------------------ namespaces
def block_of_name(name: str, outside: bool) -> str | None:
    """The block a name places an op in: the submodule right after ``layers.N`` (``self_attn``), or for an op
    outside the layers the part it belongs to (``lm_head``); None when the name says neither."""
    if outside:
        return next((b for b, pat in _OUTSIDE_TOKEN.items() if pat.search(name)), None)
    for m in _LAYER_PREFIX.finditer(name):
        rest = name[m.end():]
        found = next((b for b, pat in _BLOCK_AFTER.items() if pat.match(rest)), None)
        if found:
            return found
    return None


def namespaces(program: MilProgram, homes: Sequence[int | None]) -> list[str]:
    """Op index → its namespace (see the module docstring)."""
    ops = program.ops
    own: list[str | None] = []
    for op in ops:
        outside = homes[op.index] is None
        names = [op.name, *(r.tensor.name for r in op.inputs if r.is_const)]
        own.append(next((b for b in (block_of_name(n, outside) for n in names) if b), None))
    consumers = program.consumers()
    block = list(own)
    for op in reversed(ops):  # a block flows up to the unnamed ops that feed it, within one layer
        i = op.index
        if block[i] is None:
            block[i] = next((block[c] for c in consumers[i] if homes[c] == homes[i] and block[c] is not None), None)
    out = []
    for op in ops:
        layer = homes[op.index]
        parts = [OUTSIDE if layer is None else f"layers.{layer}"]
        if block[op.index]:
            parts.append(block[op.index])  # type: ignore[arg-type]
        if op.parent is not None:  # a nested block: under the op that holds it
            parts.append(f"{ops[op.parent].type.rpartition('.')[2]}_{op.parent}")
        if op.composite:  # a Core AI composite's fallback body, inlined per call
            parts.append(op.composite)
        out.append("/".join(parts))
    return out


def graph_problem(program: MilProgram) -> str | None:
    """Why the op records cannot make a graph (no ops; an op reading a tensor its producer does not make), or None."""
    if not program.ops:
        return f"function {program.function!r} has no ops"
    for op in program.ops:
        for r in op.inputs:
            if r.producer is not None and all(t.name != r.tensor.name for t in program.ops[r.producer].outputs):
                return (f"op {op.index} ({op.type}) reads {r.tensor.name!r} from op {r.producer}, which makes no "
                        "tensor of that name")
    return None


# ------------------------------------------------------------------------------------------------ node figures
@dataclass(frozen=True, slots=True)
class NodeFigures:
    """What one op contributes to the overlays: None where qfold could not compute the figure (``why_not``)."""

    bytes_by_category: dict[str, int] | None
    flops: int | None
    replication_kv: bool
    device: str | None
    time_ms: float | None
    why_not: tuple[str, ...]


def _kv(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": str(value)}


def _shape(t) -> str:
    return t.shape_text


def copy_verdict(program: MilProgram, op: OpRecord, consumers, cache: IndexCache) -> str:
    """The replication classifier's decision on a copy, with its reason (``analyzer.ir.replication``)."""
    facts = copy_facts(program.ops, consumers, op)
    if isinstance(facts, str):
        return f"not KV replication: {facts}"
    verdict = classify_copy(facts, cache)
    if verdict.is_kv:
        return (f"KV replication: {verdict.kv_heads} KV heads → {verdict.query_heads} query heads "
                f"(group {verdict.group})")
    return f"not KV replication: {verdict.reason}"


def _placement_attrs(j: JoinedOp) -> list[dict[str, Any]]:
    out = [_kv("device", j.device if j.device is not None else "none (the plan gives no device)")]
    if j.supported:
        out.append(_kv("devices_supported", ", ".join(j.supported)))
    if j.cost_weight is not None:
        out.append(_kv("cost_weight", f"{j.cost_weight:.6g}"))
    if j.time_ms is not None:
        out.append(_kv("profiled_ms_per_token", f"{j.time_ms:.6g}"))
    if j.reason:
        out.append(_kv("placement_reason", j.reason))
    if j.inferred:
        out.append(_kv("placement", "inferred on the Neural Engine (the plan lists only the ops off it)"))
    return out


@dataclass(frozen=True, slots=True)
class SideGraph:
    """One function of one side as a Model Explorer graph, and the figures its overlays draw."""

    graph: dict[str, Any]
    figures: dict[str, NodeFigures]  # node id → figures (op nodes only)
    per: str  # what the byte figures are per: "decode token" or "call (64 prompt tokens)"


def side_graph(analysis: Analysis, graph_id: str, ids: Mapping[int, str], status: Mapping[int, Status] | None = None,
               join: PlacementJoin | None = None, source: str = "") -> SideGraph:
    """``analysis`` as a graph named ``graph_id`` whose op ``i`` is node ``ids[i]``; ``status``: each op's
    structural-diff status in a pair; ``join``: a placement plan joined to this analysis."""
    program, acct, flops = analysis.program, analysis.account, analysis.flops
    ops = program.ops
    homes = home_layers(program)
    spaces = namespaces(program, homes)
    consumers = program.consumers()
    cache = IndexCache()
    placed = {j.index: j for j in join.matched} if join is not None else {}
    unsized: dict[int, list[str]] = {}
    for u in acct.unsized:
        unsized.setdefault(u.op_index, []).append(f"{u.tensor} {u.shape} {u.dtype}")
    flops_of = {o.index: o for o in flops.ops}
    unruled_flops = set(flops.unruled_op_types)
    unsized_flops = set(flops.unsized)
    assumed = "; ".join(a.text for a in program.assumed_shapes)
    sources = [*((t.name, "input") for t in program.inputs), *((t.name, "state") for t in program.states)]
    source_index = {name: k for k, (name, _) in enumerate(sources)}
    nodes: list[dict[str, Any]] = [{
        "id": INPUTS_NODE, "label": INPUTS_NODE, "namespace": "",
        "attrs": [_kv("assumed_shapes", assumed)] if assumed else [],
        "outputsMetadata": [{"id": str(k), "attrs": [_kv("tensor_name", name), _kv("kind", kind),
                                                    *_tensor_attrs(_tensor(program, name))]}
                            for k, (name, kind) in enumerate(sources)]}]
    figures: dict[str, NodeFigures] = {}
    producer_out = {(op.index, t.name): k for op in ops for k, t in enumerate(op.outputs)}
    for op in ops:
        nid = ids[op.index]
        o = acct.ops[op.index]
        why: list[str] = []
        attrs = [_kv("name", op.name), _kv("index", op.index),
                 _kv("layer", OUTSIDE if op.layer is None else op.layer)]
        if op.layer_from:
            attrs.append(_kv("layer_from", op.layer_from))
        if op.index in unsized:
            why.append(f"bytes: symbolic or unsized tensor(s) {', '.join(unsized[op.index])}")
            attrs.append(_kv("bytes_per_token", f"not computed: {why[-1]}"))
        else:
            attrs.append(_kv("bytes_per_token", o.total))
            attrs += [_kv(f"{c}_bytes", o.get(c)) for c in CATEGORIES if o.get(c)]
            if o.kv_write_value_semantics:
                attrs.append(_kv("kv_write_value_semantics_bytes", o.kv_write_value_semantics))
        attrs.append(_kv("byte_rule", o.rule))
        f = flops_of.get(op.index)
        op_flops: int | None = f.total if f is not None else None
        if op.type in unruled_flops or op.name in unsized_flops or f is None:
            op_flops = None
            reason = "no FLOP rule for this op type" if op.type in unruled_flops else "symbolic output shape"
            why.append(f"FLOPs: {reason}")
            attrs.append(_kv("flops_per_call", f"not computed: {reason}"))
        else:
            attrs += [_kv("flops_per_call", op_flops), _kv("flop_rule", f.rule)]
        if op.kind == "tile":
            attrs.append(_kv("replication", copy_verdict(program, op, consumers, cache)))
        if op.kind == "const" or op.type.startswith("constexpr_"):
            attrs.append(_kv("stored_bytes", op.const_bytes))
        inline = [(r.param, r.value) for r in op.inputs if r.is_const and r.value is not None]
        attrs += [_kv(f"{p} (const)", list(v)) for p, v in inline if p in ATTRIBUTE_PARAMS or len(v) <= 8]
        if status is not None and op.index in status:
            attrs.append(_kv("diff", STATUS_TEXT[status[op.index]]))
        j = placed.get(op.index)
        if j is not None:
            attrs += _placement_attrs(j)
        if assumed:
            attrs.append(_kv("assumed_shapes", assumed))
        if op.composite:
            attrs.append(_kv("composite", f"{op.composite} (fallback body, counted once per call)"))
        edges = []
        inputs_meta = []
        for pos, r in enumerate(op.inputs):
            inputs_meta.append({"id": str(pos), "attrs": [
                _kv("__tensor_tag", r.param), _kv("tensor_name", r.tensor.name), _kv("shape", _shape(r.tensor)),
                _kv("dtype", r.tensor.dtype)]})
            if r.producer is not None:
                k = producer_out[(r.producer, r.tensor.name)]
                edges.append({"sourceNodeId": ids[r.producer], "sourceNodeOutputId": str(k),
                              "targetNodeInputId": str(pos)})
            elif r.tensor.name in source_index:
                edges.append({"sourceNodeId": INPUTS_NODE, "sourceNodeOutputId": str(source_index[r.tensor.name]),
                              "targetNodeInputId": str(pos)})
        node: dict[str, Any] = {
            "id": nid, "label": op.type, "namespace": spaces[op.index], "attrs": attrs, "incomingEdges": edges,
            "outputsMetadata": [{"id": str(k), "attrs": [_kv("tensor_name", t.name), *_tensor_attrs(t)]}
                                for k, t in enumerate(op.outputs)],
            "inputsMetadata": inputs_meta}
        style = _style(op, status.get(op.index) if status is not None else None)
        if style:
            node["style"] = style
        nodes.append(node)
        if not is_const_like(op) or op.index in placed:
            figures[nid] = NodeFigures(
                None if op.index in unsized else {**{c: o.get(c) for c in CATEGORIES}, "total": o.total},
                op_flops, op.tile_kind == "kv_replication", j.device if j is not None else None,
                j.time_ms if j is not None else None, tuple(why))
    producers = {t.name: (op.index, k) for op in ops for k, t in enumerate(op.outputs)}
    out_edges = []
    for pos, t in enumerate(program.outputs):
        if t.name in producers:
            i, k = producers[t.name]
            out_edges.append({"sourceNodeId": ids[i], "sourceNodeOutputId": str(k), "targetNodeInputId": str(pos)})
    nodes.append({"id": OUTPUTS_NODE, "label": OUTPUTS_NODE, "namespace": "", "attrs": [], "incomingEdges": out_edges,
                  "inputsMetadata": [{"id": str(pos), "attrs": [_kv("tensor_name", t.name), *_tensor_attrs(t)]}
                                     for pos, t in enumerate(program.outputs)]})
    call = analysis.call
    per = "decode token" if call.phase == "decode" else f"call ({call.tokens_per_call} prompt tokens)"
    graph = {"id": graph_id, "nodes": nodes,
             "groupNodeAttributes": _group_attributes(analysis, spaces, homes, source, per)}
    return SideGraph(graph, figures, per)


def _tensor(program: MilProgram, name: str):
    return next(t for t in (*program.inputs, *program.states) if t.name == name)


def _tensor_attrs(t) -> list[dict[str, Any]]:
    size = t.nbytes if t.nbytes is not None else "not computed: symbolic dimension or no size"
    return [_kv("shape", _shape(t)), _kv("dtype", t.dtype), _kv("bytes", size)]


def _style(op: OpRecord, status: Status | None) -> dict[str, str] | None:
    """KV-replication copies in the Graph tab's alarm red; ops only in A or only in B outlined in its colours."""
    if op.tile_kind == "kv_replication":
        return {"backgroundColor": ALARM[0], "borderColor": ALARM[1], "hoveredBorderColor": ALARM[1]}
    if status in ("only_a", "only_b", "changed"):
        fill, border, _ = STYLE[status]
        return {"backgroundColor": fill, "borderColor": border, "hoveredBorderColor": border}
    return None


def _group_attributes(analysis: Analysis, spaces: Sequence[str], homes: Sequence[int | None], source: str,
                      per: str) -> dict[str, dict[str, str]]:
    """The side panel's figures: for the graph (key ``""``) and for each layer's namespace."""
    program, acct = analysis.program, analysis.account
    totals = acct.per_token()
    graph = {"source": source or analysis.file or program.path, "function": program.function,
             "backend": program.backend, "ops": str(program.total_ops),
             "call": f"{analysis.call.phase}, {analysis.call.tokens_per_call} token(s) per call ({analysis.call.how})",
             "bytes_are_per": per, "weight_charge": acct.weight_charge,
             **{f"{c}_bytes": str(totals.get(c)) for c in CATEGORIES}, "bytes_per_token": str(totals.total),
             "flops_per_call": str(analysis.flops.per_call().total),
             "kv_replication_copies": str(sum(1 for op in program.ops if op.tile_kind == "kv_replication"))}
    if program.assumed_shapes:
        graph["assumed_shapes"] = "; ".join(a.text for a in program.assumed_shapes)
    if acct.unsized:
        graph["bytes_not_computed"] = (f"{len(acct.unsized)} tensor(s) with a symbolic dimension are in no total "
                                       "(their ops say which)")
    if analysis.flops.unruled_op_types:
        graph["flops_not_computed"] = "no FLOP rule: " + ", ".join(analysis.flops.unruled_op_types)
    out: dict[str, dict[str, str]] = {"": graph}
    for layer in acct.layers():
        key = OUTSIDE if layer.layer is None else f"layers.{layer.layer}"
        members = [i for i, h in enumerate(homes) if h == layer.layer]
        out[key] = {"ops": str(len(members)), "bytes_per_token": str(layer.total),
                    **{f"{c}_bytes": str(layer.get(c)) for c in CATEGORIES}}
    return out
