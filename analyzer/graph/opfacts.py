"""Facts the walker derives about each op from the graph around it: its decoder layer and, for a ``tile``,
whether it replicates K/V for attention.

The walker (``mil.read_program``) runs :func:`derive_op_facts` on every program it reads; loading an
analysis stored by an older schema runs it again on the stored ops (``record.py``), so the facts always
come from the current rules.
"""

from __future__ import annotations

import re
from dataclasses import replace

from analyzer.graph.program import VIEW_OPS, OpRecord, consumer_map

# Where a name reveals a decoder layer: "model_layers_12_self_attn_...", "layers.3.", "k_cache_7", "h_4_".
_LAYER_PATTERNS = (
    re.compile(r"(?:^|[_.])layers?[_.](\d+)(?:[_.]|$)"),
    re.compile(r"(?:^|[_.])(?:h|blocks?)[_.](\d+)(?:[_.]|$)"),
    re.compile(r"(?:^|_)[kv]_cache_(\d+)$"),
)
# Weights of the parts outside the decoder layers: embedding, final norm, lm_head.
_OUTSIDE_LAYERS = re.compile(r"lm_head|embed_tokens|(?:^|_)wte(?:_|$)|(?:^|_)norm_weight|final_norm|(?:^|_)ln_f(?:_|$)")

# What reads a replicated K/V: the score and output matmuls, and with a read-only cache the product of the
# current token's weight with its own replicated value (``w[..., S:] * v_new``).
_ATTENTION_CONSUMERS = frozenset({"matmul", "mul", "einsum"})
# Ops a replicated K/V may pass through on its way to the attention matmul without being used.
_PASS_THROUGH = VIEW_OPS | {"transpose", "cast"}
# How many pass-through ops a replica may cross before it counts as not reaching attention.
_MAX_PASS_THROUGH = 8


def layer_from_name(name: str) -> int | None:
    for pat in _LAYER_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def derive_op_facts(ops: list[OpRecord] | tuple[OpRecord, ...]) -> list[OpRecord]:
    """Every op's layer (and how it was found) and every tile's kind, from the ops alone."""
    return classify_tiles(propagate_layers(ops))


def propagate_layers(ops) -> list[OpRecord]:
    """Layer of each op: from its own name, else its constants' names, else the latest layer among the
    ops (or program inputs/states) it reads. Constants named for a part outside the decoder layers
    (embedding, final norm, lm_head) mark an op as outside (``None``). Ops are in topological order,
    so one pass suffices."""
    out: list[OpRecord] = []
    for op in ops:
        layer, how = layer_from_name(op.name), "name"
        if layer is None:
            const_names = [r.tensor.name for r in op.inputs if r.is_const]
            const_layers = [x for x in map(layer_from_name, const_names) if x is not None]
            if const_layers:
                layer = max(const_layers)
            elif any(_OUTSIDE_LAYERS.search(n) for n in const_names):
                out.append(replace(op, layer=None, layer_from="name"))
                continue
        if layer is None:
            how = "dataflow"
            seen = []
            for r in op.inputs:
                if r.is_const:
                    continue
                if r.producer is not None:
                    seen.append(out[r.producer].layer)
                else:
                    seen.append(layer_from_name(r.tensor.name))
            seen = [x for x in seen if x is not None]
            layer = max(seen) if seen else None
        out.append(replace(op, layer=layer, layer_from=how if layer is not None else ""))
    return out


def classify_tiles(ops: list[OpRecord]) -> list[OpRecord]:
    """A tile is ``kv_replication`` when its output reaches attention (a ``matmul``, or the ``mul`` of the
    read-only-cache self term) through views only: the repeat_kv pattern ``expand_dims → tile → reshape →
    matmul``. Any other tile (coremltools' own passes can emit some) is ``other``."""
    consumers = consumer_map(ops)

    def reaches_attention(index: int, depth: int = 0) -> bool:
        if depth > _MAX_PASS_THROUGH:
            return False
        for c in consumers[index]:
            t = ops[c].type
            if t in _ATTENTION_CONSUMERS or (t in _PASS_THROUGH and reaches_attention(c, depth + 1)):
                return True
        return False

    return [
        replace(op, tile_kind="kv_replication" if reaches_attention(op.index) else "other")
        if op.type == "tile" else op
        for op in ops
    ]
