"""Decoder layers of a program whose names carry no layer numbers: by the order of its attention blocks.

Converters that keep one unified KV state sliced per layer (ANEMLL, CoreML-LLM: ``kv_cache_0 [2L, Hkv, S, D]``)
and name their ops ``conv_3``, ``matmul_7`` leave nothing for :func:`analyzer.ir.opfacts.layer_from_name` to
read. Attention itself is still there, once per layer, in program order: each attention core (a ``softmax`` whose
scores come from a ``Q·Kᵀ`` matmul of two activations, or a fused ``scaled_dot_product_attention``) is layer k.
Every other op goes to the layer of the last core it depends on, except that the ops of layer k + 1's input — its
query/key/value projections and cache writes, computed after the split point where Q's and K's paths part — go
to layer k + 1. The split point is the latest op both Q's and K's paths into core k + 1 read (the normalised
hidden state). Ops before the first split (the embedding) stay outside the layers (None).
"""

from __future__ import annotations

from dataclasses import replace

from analyzer.ir.mil_records import VIEW_OPS, OpRecord

# Ops a score tensor passes through from its Q·Kᵀ matmul to the softmax (scale, mask, softcap, concat, slices).
_TO_SOFTMAX = VIEW_OPS | {"cast", "mul", "add", "sub", "real_div", "tanh", "concat", "select", "slice_by_index",
                          "slice_by_size", "transpose", "maximum", "minimum", "clip"}
_MAX_HOPS = 8
ATTENTION_ORDER = "attention order"  # OpRecord.layer_from for layers found this way


def attention_cores(ops) -> list[tuple[int, int, int]]:
    """``(core, q, k)`` op indices per attention block in program order: the core op and the producers of its
    query and key operands."""
    out = []
    for op in ops:
        if op.type == "scaled_dot_product_attention":
            q = next((r.producer for r in op.inputs if r.param == "query"), None)
            k = next((r.producer for r in op.inputs if r.param == "key"), None)
            if q is not None and k is not None:
                out.append((op.index, q, k))
        elif op.type == "softmax":
            found = _scores_matmul(ops, op)
            if found is not None:
                out.append((op.index, *found))
    return out


def _scores_matmul(ops, softmax: OpRecord) -> tuple[int, int] | None:
    frontier = [r.producer for r in softmax.inputs if r.param == "x" and r.producer is not None]
    for _ in range(_MAX_HOPS):
        nxt = []
        for i in frontier:
            op = ops[i]
            if op.type == "matmul":
                x = next((r for r in op.inputs if r.param == "x"), None)
                y = next((r for r in op.inputs if r.param == "y"), None)
                if x is not None and y is not None and not x.is_const and not y.is_const and \
                        x.producer is not None and y.producer is not None:
                    return x.producer, y.producer
            elif op.type in _TO_SOFTMAX:
                nxt += [r.producer for r in op.inputs if not r.is_const and r.producer is not None]
        frontier = nxt
    return None


def _ancestors(ops, start: int, floor: int) -> set[int]:
    """``start`` and every op it reads, back to (not below) index ``floor``."""
    seen, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i in seen or i < floor:
            continue
        seen.add(i)
        stack += [r.producer for r in ops[i].inputs if r.producer is not None]
    return seen


def order_layers(ops: list[OpRecord]) -> list[OpRecord]:
    """Layers by attention order (module docstring) when no op's name gave one; otherwise ``ops`` unchanged."""
    if any(op.layer is not None for op in ops):
        return ops
    cores = attention_cores(ops)
    if not cores:
        return ops
    core_of = {c: k for k, (c, _, _) in enumerate(cores)}
    after = [-1] * len(ops)  # the last core each op depends on
    for op in ops:
        a = max((after[r.producer] for r in op.inputs if r.producer is not None), default=-1)
        after[op.index] = core_of.get(op.index, a)
    # the ops of each core's input side: read by both its Q and its K path, at or before the split point
    inputs_of: list[set[int]] = []
    for k, (_, q, key) in enumerate(cores):
        floor = cores[k - 1][0] + 1 if k else 0
        both = _ancestors(ops, q, floor) & _ancestors(ops, key, floor)
        split = max(both) if both else None
        inputs_of.append(_ancestors(ops, split, floor) if split is not None else set())
    out = []
    for op in ops:
        if op.layer_from == "name":  # named as outside the layers (embedding, final norm, lm_head)
            out.append(op)
            continue
        a = after[op.index]
        if a == -1:  # before the first core: the embedding (outside), or layer 0's own input side
            layer = None if op.type == "const" or op.index in inputs_of[0] else 0
        elif a + 1 < len(cores) and op.index not in inputs_of[a + 1] and op.index > max(inputs_of[a + 1], default=-1):
            layer = a + 1  # after the next core's split point: its projections and cache writes
        else:
            layer = a
        out.append(replace(op, layer=layer, layer_from=ATTENTION_ORDER if layer is not None else ""))
    return out


# ------------------------------------------------------------------------------------------------ weight roles
# Ops between a projection and attention (head reshapes, RoPE, casts, cache writes and reads) and between
# attention and the output projection.
_PROJECTION_PATH = VIEW_OPS | {"transpose", "cast", "mul", "add", "sub", "concat", "split", "slice_by_index",
                               "slice_by_size", "slice_update", "tile", "read_state", "coreml_update_state", "neg",
                               "gather", "layer_norm", "rsqrt", "real_div", "reduce_mean", "pow"}
_WEIGHT_OPS = frozenset({"linear", "conv", "matmul", "einsum"})
_PROJECTION_HOPS = 16


def projection_ops(ops) -> set[int]:
    """Indices of the weight ops (``linear``, 1×1 ``conv``, ``matmul`` by a constant) that project into
    attention (q/k/v: found walking back from each core's operands) or out of it (o: the first weight op after
    the values), whatever their weights are named."""
    consumers: dict[int, list[int]] = {op.index: [] for op in ops}
    for op in ops:
        for r in op.inputs:
            if r.producer is not None:
                consumers[r.producer].append(op.index)
    found: set[int] = set()
    for core, q, k in attention_cores(ops):
        starts = [q, k] + [r.producer for r in ops[core].inputs if r.param == "value" and r.producer is not None]
        for c in consumers[core]:  # P·V: the matmul reading the weights
            if ops[c].type == "matmul":
                starts += [r.producer for r in ops[c].inputs if r.param == "y" and r.producer is not None]
        found |= _walk(ops, starts, lambda i: [r.producer for r in ops[i].inputs if r.producer is not None])
        outs = [c for c in consumers[core] if ops[c].type == "matmul"] or [core]
        found |= _walk(ops, [c for o in outs for c in consumers[o]], lambda i: consumers[i])
    return found


def _walk(ops, starts, step) -> set[int]:
    hit: set[int] = set()
    seen: set[int] = set()
    frontier = list(starts)
    for _ in range(_PROJECTION_HOPS):
        nxt = []
        for i in frontier:
            if i in seen:
                continue
            seen.add(i)
            op = ops[i]
            if op.type in _WEIGHT_OPS and any(r.is_const and len(r.tensor.shape) >= 2 for r in op.inputs):
                hit.add(i)
            elif op.type in _PROJECTION_PATH:
                nxt += step(i)
        frontier = nxt
    return hit
