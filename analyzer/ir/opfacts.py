"""Facts the walker derives about each op from the graph around it: its decoder layer and, for a ``tile``,
whether it replicates K/V for attention.

The walker (``mil.read_program``) runs :func:`derive_op_facts` on every program it reads; loading an
analysis stored by an older schema runs it again on the stored ops (``record.py``), so the facts always
come from the current rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from itertools import permutations

import numpy as np

from analyzer.ir.layer_order import order_layers
from analyzer.ir.mil_records import VIEW_OPS, InputRef, OpRecord, consumer_map
from analyzer.ir.replication import (
    ATTENTION_WEIGHT_OPS,
    MATMUL_LHS,
    MATMUL_RHS,
    MAX_WEIGHT_PATH,
    OTHER,
    PLACEHOLDER_SIZES,
    SDPA_KV,
    SDPA_OTHER,
    WEIGHT_MUL,
    WEIGHT_PATH_OPS,
    CopyFacts,
    CopyRead,
    IndexCache,
    SourceCandidate,
    ViewStep,
    classify_copy,
)

# Where a name reveals a decoder layer: "model_layers_12_self_attn_...", "layers.3.", "k_cache_7", "h_4_".
_LAYER_PATTERNS = (
    re.compile(r"(?:^|[_.])layers?[_.](\d+)(?:[_.]|$)"),
    re.compile(r"(?:^|[_.])(?:h|blocks?)[_.](\d+)(?:[_.]|$)"),
    re.compile(r"(?:^|_)[kv]_cache_(\d+)$"),
)
# Weights of the parts outside the decoder layers: embedding, final norm, lm_head.
_OUTSIDE_LAYERS = re.compile(r"lm_head|embed_tokens|(?:^|_)wte(?:_|$)|(?:^|_)norm_weight|final_norm|(?:^|_)ln_f(?:_|$)")

# Ops a copy may pass through on its way to attention (each only moves elements: a view, a layout transpose, a
# cast) and the ones a source may lie behind (not a cast: values).
_CHAIN = VIEW_OPS | {"transpose", "cast"}
CORE_AI_GATHERS = ("coreai.gather_along_axis", "coreai.gather_nd")  # gathers whose index the walk profiles
SDPA_COMPOSITE = "scaled_dot_product_attention"  # coreai-torch's SDPA composite (``composite_decl``)
_SOURCE_WALK = VIEW_OPS | {"transpose"}


def layer_from_name(name: str) -> int | None:
    for pat in _LAYER_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def derive_op_facts(ops: list[OpRecord] | tuple[OpRecord, ...]) -> list[OpRecord]:
    """Every op's layer (and how it was found: from names, else by attention order, ``analyzer.ir.layer_order``)
    and every tile's kind, from the ops alone."""
    return _copies_join_their_readers(classify_copies(order_layers(propagate_layers(ops))))


def _copies_join_their_readers(ops: list[OpRecord]) -> list[OpRecord]:
    """A copy with no layer of its own (it reads only a cache state and shape arithmetic of the mask, as in the HF
    export, where the cache slice ends at ``attention_mask.shape[-1]``) is in the layer of the ops that read it,
    when they are all in one; so are the views, transposes and casts between it and them (walked back from the
    readers, last op first)."""
    if not any(op.tile_kind is not None and op.layer is None for op in ops):
        return list(ops)
    consumers = consumer_map(ops)
    out = list(ops)
    for op in reversed(ops):
        if op.layer is not None or op.layer_from == "name" or (op.tile_kind is None and op.kind not in _CHAIN):
            continue
        layers = {out[c].layer for c in consumers[op.index]}
        if len(layers) == 1 and None not in layers:
            out[op.index] = replace(op, layer=layers.pop(), layer_from="dataflow")
    return out


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


# A copy's kind (OpRecord.tile_kind): KV replication for attention, anything else, or no verdict (the classifier
# could not read or evaluate its chain: never called "not replication"; analyzer.analysis.sizing counts it unsized).
KV_REPLICATION, OTHER_COPY, UNCLASSIFIED = "kv_replication", "other", "unclassified"


@dataclass(frozen=True, slots=True)
class CopyVerdict:
    """What one copy is, for the records and ``inspect``: its kind ("kv_replication" | "other" | "unclassified"),
    why (the classifier's reason, or what it replicates), its repeats (a tile's; None for a gather or concat) and
    where they come from ("constant": its ``reps`` input; "program": computed at run time, here sized at the stated
    shapes)."""

    kind: str
    reason: str
    reps: tuple[int, ...] | None
    reps_from: str | None


def classify_copies(ops: list[OpRecord]) -> list[OpRecord]:
    """A copy (:func:`copy_steps`: a tile, a repeating gather, a concat of one tensor) is ``kv_replication`` when
    :func:`analyzer.ir.replication.classify_copy` says it copies whole K/V heads for attention (the facts read off
    the records by :func:`copy_facts`), else ``other`` (a gather or concat that is not KV replication keeps
    ``tile_kind`` None: :func:`listed`); any other op keeps ``tile_kind`` None."""
    verdicts = copy_verdicts(ops)
    return [replace(op, tile_kind=verdicts[op.index].kind)
            if op.index in verdicts and listed(op, verdicts[op.index]) else op for op in ops]


def listed(op: OpRecord, verdict: CopyVerdict) -> bool:
    """Whether a copy is one of the program's copies (``MilProgram.tiles``): every tile or broadcast; a gather or
    concat only when it copies K/V heads (``cat(freqs, freqs)`` of a RoPE table repeats its input too, and is an
    ordinary op, as it always was), or when it may and its index could not be read (:func:`unread_copy`: listed,
    not classified, with why)."""
    return op.kind == "tile" or verdict.kind == "kv_replication" or unread_copy(op) is not None


def copy_verdicts(ops) -> dict[int, CopyVerdict]:
    """Every copy's :class:`CopyVerdict`, by op index."""
    consumers = consumer_map(ops)
    cache = IndexCache()
    out = {}
    for op in ops:
        own = copy_steps(op)
        if own is None and op.kind != "tile" and unread_copy(op) is None:
            continue
        facts = copy_facts(ops, consumers, op)
        if isinstance(facts, str):
            kind, reason = UNCLASSIFIED, facts
        else:
            verdict = classify_copy(facts, cache)
            kind = KV_REPLICATION if verdict.is_kv else OTHER_COPY if verdict.decided else UNCLASSIFIED
            reason = verdict.reason if not verdict.is_kv else (
                f"copies whole K/V heads for attention: {verdict.query_heads} query heads read {verdict.kv_heads} "
                f"KV heads (G = {verdict.group})")
        reps = own[0].reps if own is not None and own[0].kind == "tile" and op.kind == "tile" else None
        ref = _ref(op, "reps")
        reps_from = None if reps is None else "constant" if ref is None or ref.is_const else "program"
        out[op.index] = CopyVerdict(kind, reason, reps, reps_from)
    return out


def copy_steps(op: OpRecord) -> tuple[ViewStep, ...] | None:
    """The op's own steps when it copies elements into a larger tensor, else None: a tile or broadcast (its
    repeats constant, or computed and sized at the stated shapes), a ``gather`` whose constant index repeats an
    element (``index_select``; Core AI's ``gather_along_axis`` whose index profile does, and ``gather_nd``: a
    reshape, a gather of rows, a reshape), a ``concat`` of one tensor n times (interleaved: each element n times in
    a row)."""
    if op.kind == "tile":
        step = _step(op)
        return None if step is None else (step,)
    if op.type in CORE_AI_GATHERS:
        return _core_ai_gather(op)
    if not op.outputs or any(d is None for d in op.outputs[0].shape):
        return None
    out = _dims(op.outputs[0].shape)
    if op.kind == "gather":
        x, idx, axis, batch = (_ref(op, p) for p in ("x", "indices", "axis", "batch_dims"))
        if x is None or x.is_const or idx is None or idx.value is None or len(idx.tensor.shape) != 1 or (
                batch is not None and batch.value not in (None, (0,))):
            return None
        rank = len(x.tensor.shape)
        a = (axis.value[0] if axis is not None and axis.value else 0) % max(rank, 1)
        size = x.tensor.shape[a]
        if size is None or len(set(idx.value)) == len(idx.value):
            return None  # a permutation (or a gather at a computed size) copies nothing twice
        return (ViewStep("gather", out, axis=a, indices=tuple(i % size for i in idx.value)),)
    if op.kind == "concat":
        values = [r for r in op.inputs if r.param.startswith("values")]
        axis, inter = _ref(op, "axis"), _ref(op, "interleave")
        if len(values) < 2 or len({r.tensor.name for r in values}) != 1:
            return None
        rank, n = len(out), len(values)
        grown = [ax for ax, (i, o) in enumerate(zip(_dims(values[0].tensor.shape), out, strict=False)) if i * n == o]
        if axis is not None and axis.value:
            a = axis.value[0] % rank
        elif len(grown) == 1 and len(values[0].tensor.shape) == rank:  # the axis not read (Core AI): the one grown
            a = grown[0]
        else:
            return None
        if inter is not None and inter.value and inter.value[0]:  # element i of the axis n times in a row
            size = out[a] // n
            return (ViewStep("gather", out, axis=a, indices=tuple(j // n for j in range(size * n))),)
        return (ViewStep("tile", out, reps=tuple(n if ax == a else 1 for ax in range(rank))),)
    return None


def _core_ai_gather(op: OpRecord) -> tuple[ViewStep, ...] | None:
    """A Core AI gather's steps, from its index profile (``IndexProfile``, read by the walk), or None."""
    x, idx = _ref(op, "x"), _ref(op, "indices")
    prof = idx.profile if idx is not None else None
    if x is None or x.is_const or prof is None or prof.values is None or not op.outputs:
        return None
    return gather_steps(op.type, x.tensor.shape, idx.tensor.shape, op.outputs[0].shape, prof.axis, prof.values)


def gather_steps(op_type: str, x: tuple[int | None, ...], index: tuple[int | None, ...], out: tuple[int | None, ...],
                 axis: int | None, values: tuple[int, ...]) -> tuple[ViewStep, ...] | None:
    """The steps of a Core AI gather that copies whole slices, from what its index selects (``IndexProfile``), else
    None (it repeats nothing, or selects parts of slices). ``coreai.gather_along_axis`` whose index is one value per
    position of ``axis``, the same along every other axis (``index_select``): a gather along the axis;
    ``coreai.gather_nd`` of whole slices (``k[:, idx]``, ``values`` its index rows flattened): the leading axes it
    indexes merged, a gather of rows, the result's shape. Shared by the walk's records and the Core AI rewrite."""
    if op_type == "coreai.gather_along_axis":
        if axis is None or len(index) != len(x) or x[axis] is None or index[axis] != len(values) or any(
                i != s for d, (i, s) in enumerate(zip(index, x, strict=True)) if d != axis):
            return None  # an index over part of another axis gathers and slices: not a copy of whole slices
        if len(set(values)) == len(values):
            return None  # a permutation copies nothing twice
        return (ViewStep("gather", _dims(out), axis=axis, indices=tuple(v % x[axis] for v in values)),)
    depth = index[-1] if index else None
    if depth is None or not 0 < depth <= len(x) or any(d is None for d in (*x[:depth], *index)) or (
            int(np.prod(index)) != len(values)):
        return None
    lead = tuple(int(d) for d in x[:depth])
    rows = np.asarray(values, dtype=np.int64).reshape(-1, depth) % np.asarray(lead, dtype=np.int64)
    flat = tuple(int(i) for i in np.ravel_multi_index(tuple(rows.T), lead))
    if len(set(flat)) == len(flat):
        return None
    rest = _dims(x[depth:])
    return (ViewStep("reshape", (int(np.prod(lead)), *rest)),
            ViewStep("gather", (len(flat), *rest), axis=0, indices=flat), ViewStep("reshape", _dims(out)))


def unread_copy(op: OpRecord) -> str | None:
    """Why a Core AI gather that may copy K/V heads was not classified, else None: its output holds more elements
    than its input (so it repeats some) and its index could not be read (computed at run time, too large, varying
    along another axis, its blob not found: the walk's ``IndexProfile.why``)."""
    x, idx = _ref(op, "x"), _ref(op, "indices")
    if op.type not in CORE_AI_GATHERS or x is None or x.is_const or idx is None or idx.profile is None or (
            idx.profile.values is not None) or not op.outputs:
        return None
    grows = int(np.prod(_dims(op.outputs[0].shape))) > int(np.prod(_dims(x.tensor.shape)))
    return f"not classified: {idx.profile.why}" if grows else None


# ------------------------------------------------------------------------------------------------ copy facts
def _dims(shape: tuple[int | None, ...]) -> tuple[int, ...]:
    """A shape with symbolic dimensions (None) at a placeholder size (``replication.PLACEHOLDER_SIZES``)."""
    return tuple(PLACEHOLDER_SIZES[0] if d is None else int(d) for d in shape)


def _ref(op: OpRecord, param: str) -> InputRef | None:
    return next((r for r in op.inputs if r.param == param), None)


def _step(op: OpRecord) -> ViewStep | None:
    """The records' op as a backend-neutral step; None when its parameters cannot be read."""
    x, out = _ref(op, "x"), _dims(op.outputs[0].shape)
    if op.kind == "tile":
        reps = _ref(op, "reps")
        if reps is not None and reps.value is not None:
            return ViewStep("tile", out, reps=reps.value)
        if x is None or len(x.tensor.shape) != len(out):
            return None
        return ViewStep("tile", out, reps=tuple(o // i for o, i in zip(out, _dims(x.tensor.shape), strict=True)))
    if op.kind == "transpose":
        perm = _ref(op, "perm")
        rank = len(out)
        if perm is not None and perm.value is not None:
            return ViewStep("transpose", out, perm=tuple(p % rank for p in perm.value))
        if x is None:
            return None
        src = _dims(x.tensor.shape)  # an older analysis without values: the perm when the shapes leave no doubt
        perms = [p for p in permutations(range(rank)) if tuple(src[i] for i in p) == out]
        return ViewStep("transpose", out, perm=perms[0]) if len(perms) == 1 else None
    return ViewStep("identity" if op.kind in ("cast", "identity") else "reshape", out)


def _read_kind(ops, consumer: OpRecord, param: str) -> str:
    if consumer.kind == "matmul":
        return MATMUL_RHS if param == "y" else MATMUL_LHS
    if consumer.type == "coreai.invoke":  # a Core AI composite call: its body follows it in the records (walk.py)
        body = ops[consumer.index + 1] if consumer.index + 1 < len(ops) else None
        if body is not None and body.parent == consumer.index and body.composite == SDPA_COMPOSITE:
            return SDPA_KV if param in ("key", "value") else SDPA_OTHER
    if consumer.kind == "scaled_dot_product_attention":
        return SDPA_KV if param in ("key", "value") else SDPA_OTHER
    if consumer.kind == "mul":
        other = _ref(consumer, "y" if param == "x" else "x")
        for _ in range(MAX_WEIGHT_PATH):
            if other is None or other.producer is None:
                break
            producer = ops[other.producer]
            if producer.kind in ATTENTION_WEIGHT_OPS:
                return WEIGHT_MUL
            if producer.kind not in WEIGHT_PATH_OPS:
                break
            other = _ref(producer, "x")
    return OTHER


def copy_facts(ops, consumers: dict[int, list[int]], tile: OpRecord) -> CopyFacts | str:
    """What :func:`~analyzer.ir.replication.classify_copy` needs about a copy (a tile, a repeating gather, a
    concat of one tensor), read off the op records: its source candidates (back through views and transposes only
    the chain reads) and every operand it reaches through views, transposes and casts; or why the facts cannot
    be read."""
    x = _ref(tile, "x") or next((r for r in tile.inputs if r.param.startswith("values")), None)
    own = copy_steps(tile)
    if x is None or own is None or not tile.outputs:
        return unread_copy(tile) or "its input or repeats cannot be read (computed at run time, and not sized)"
    sources = [SourceCandidate(_dims(x.tensor.shape), own, 0)]
    ref, steps, depth = x, own, 0
    while ref.producer is not None:
        op = ops[ref.producer]
        if op.kind not in _SOURCE_WALK or len(op.outputs) != 1 or len(consumers[op.index]) != 1:
            break
        inner, step = _ref(op, "x"), _step(op)
        if inner is None or step is None:
            break
        ref, steps, depth = inner, (step, *steps), depth + 1
        sources.append(SourceCandidate(_dims(inner.tensor.shape), steps, depth))
    reads: list[CopyRead] = []
    stack: list[tuple[int, tuple[ViewStep, ...]]] = [(tile.index, ())]
    while stack:
        index, path = stack.pop()
        for c in consumers[index]:
            consumer = ops[c]
            step = _step(consumer) if consumer.kind in _CHAIN and consumer.outputs else None
            if step is not None:
                stack.append((c, (*path, step)))
                continue
            for r in consumer.inputs:
                if r.producer == index:
                    reads.append(CopyRead(consumer.type, consumer.name, _read_kind(ops, consumer, r.param), path,
                                          r.param))
    return CopyFacts(tile.name, _dims(x.tensor.shape), _dims(tile.outputs[0].shape), tuple(sources), tuple(reads))
