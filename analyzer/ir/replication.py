"""What is KV replication for attention: the one classifier every reader of a graph asks.

A *copy* is an op that makes a tensor larger by repeating its elements: MIL ``tile`` (constant or computed
repeats), a ``gather`` whose constant index repeats an element (``index_select``), a ``concat`` of one tensor n
times (``torch.cat([k] * G)``), Core AI ``tile`` / ``broadcast_in_dims`` / ``gather``. It is **KV replication**
when it copies whole heads of K or V so that each query head has its own, and what it makes is read by attention.
:func:`classify_copy` decides that from backend-neutral facts (:class:`CopyFacts`), which each backend's reader
extracts from its own graph (``analyzer.ir.opfacts`` from the walked op records, ``analyzer.fold.coreml.gqa_pattern``
from a pymil Program, ``analyzer.fold.coreai.rewrite`` from a Core AI module):

- the **source**: the un-copied tensor, tried from the copy's own input back through the views and layout
  transposes only the chain reads (:class:`SourceCandidate`, shallowest first);
- for every **read** of the copy (:class:`CopyRead`): the steps from the copy to the operand (views, transposes,
  casts; :class:`ViewStep`) and the **consumer kind** (an attention matmul's right or left operand, the key or
  value of a fused ``scaled_dot_product_attention``, an attention weight times a replicated row, or anything else).

The head mapping is derived on an index tensor, never from names: the chain runs on ``arange(numel)`` in the
source's shape (:func:`evaluate_steps`), and :func:`head_mapping` checks that every head slice of what attention
reads is one whole head of the source, its two trailing axes in place or swapped (K read as Kᵀ). A tile along the
sequence axis (a masked cache write's ``k.expand_as(K_cache)``), over a mask or a RoPE table, or feeding anything
but attention, is not replication, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# ------------------------------------------------------------------------------------------------ consumer kinds
MATMUL_RHS = "matmul_rhs"  # a matmul's right operand: K in Q·Kᵀ (or read as Kᵀ), V in P·V
MATMUL_LHS = "matmul_lhs"  # a matmul's left operand (K·Qᵀ): replication, but the fold does not rewrite it
SDPA_KV = "sdpa_kv"  # the key or value of a fused scaled_dot_product_attention
SDPA_OTHER = "sdpa_other"  # its query or mask: a copy there is no KV replication
WEIGHT_MUL = "weight_mul"  # an attention weight column times a replicated row (the read-only cache's self term)
OTHER = "other"
ATTENTION_READS = frozenset({MATMUL_RHS, MATMUL_LHS, SDPA_KV, WEIGHT_MUL})

# Ops whose output is an attention weight, and the ops a weight may pass through to the self term's ``mul``
# (``w[..., S:]``): used by the readers to tell WEIGHT_MUL from OTHER.
ATTENTION_WEIGHT_OPS = frozenset({"softmax"})
WEIGHT_PATH_OPS = frozenset({"slice_by_index", "slice_by_size", "split", "cast", "identity", "reshape", "squeeze",
                             "expand_dims"})
# How many steps back from a ``mul`` operand an attention weight may lie.
MAX_WEIGHT_PATH = 4

# Step kinds a reader maps its ops to (all move elements only; a cast is an "identity" here).
STEP_KINDS = frozenset({"reshape", "transpose", "tile", "broadcast", "gather", "identity"})
# Placeholder sizes for symbolic dimensions, when a reader evaluates a chain whose shapes are flexible: the
# mapping of a tile with constant reps does not depend on the sequence or query length. Tried in order: 7 and 13
# are unlike any head count or head dim (an axis mix-up cannot pass by coincidence); 48 divides what
# coremltools' ``reshape(-1)`` divides by (``is0*is1/16``).
PLACEHOLDER_SIZES = (7, 13, 48)
# Index tensors above this many elements are not evaluated: 2^26 int32 = 256 MiB, above an 8B model's
# [1, 8, 4, 8192, 128] copy at ctx 8192 (2^25). A larger chain is evaluated with its largest source axis at
# SHRUNK_SIZE (:func:`shrunk_chain`), so a verdict never depends on the context length (an 8B copy at ctx 32768 is
# 2^27 elements); a chain still too large then is not called replication, with the reason.
MAX_INDEX_ELEMENTS = 1 << 26
SHRUNK_SIZE = PLACEHOLDER_SIZES[1]  # 13: unlike any head count or head dim, and not the symbolic placeholder


# ------------------------------------------------------------------------------------------------ facts
@dataclass(frozen=True, slots=True)
class ViewStep:
    """One element-moving step, backend-neutral: ``reshape`` (any view, incl. expand_dims/squeeze) to
    ``out_shape``, ``transpose`` by ``perm``, ``tile`` by ``reps`` (also a ``concat`` of one tensor n times),
    ``broadcast`` to ``out_shape``, ``gather`` of ``indices`` along ``axis`` (``index_select``; a ``concat`` of
    one tensor interleaved), ``identity`` (a cast: values change, positions do not)."""

    kind: str
    out_shape: tuple[int, ...]
    perm: tuple[int, ...] = ()
    reps: tuple[int, ...] = ()
    axis: int = 0
    indices: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceCandidate:
    """A tensor the copy's data comes from unchanged: its shape and the steps from it up to (and including) the
    copy. ``depth`` 0 is the copy's own input."""

    shape: tuple[int, ...]
    steps: tuple[ViewStep, ...]
    depth: int = 0


@dataclass(frozen=True, slots=True)
class CopyRead:
    """One operand the copy reaches: the consumer op (type and name, for reasons), which operand kind it is,
    and the steps from the copy's output to that operand."""

    consumer_type: str
    consumer_name: str
    kind: str  # one of the consumer kinds above
    steps: tuple[ViewStep, ...] = ()
    operand: str = ""  # the consumer's parameter ("y", "key", ...)


@dataclass(frozen=True, slots=True)
class CopyFacts:
    """Everything :func:`classify_copy` reads about one copy op."""

    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    sources: tuple[SourceCandidate, ...]  # shallowest first; sources[0] is the copy's own input
    reads: tuple[CopyRead, ...]


# ------------------------------------------------------------------------------------------------ verdicts
@dataclass(frozen=True, slots=True)
class HeadMap:
    """How one operand's heads come from the source: query head h reads KV head ``kv_map[h]``; ``swapped``:
    each head is read with its two trailing axes swapped (``[D, S]`` of an ``[S, D]`` cache: Kᵀ)."""

    kv_heads: int
    kv_map: tuple[int, ...]
    swapped: bool = False


@dataclass(frozen=True, slots=True)
class Replication:
    """The verdict on one copy. ``is_kv``: it copies whole K/V heads for attention; else ``reason`` says why not.
    For a replication: the source candidate it resolves to (``source_depth``), the source seen as
    ``[*prefix, Hkv, A, B]`` (``source_view``, the trailing axes as the source holds them) and one
    :class:`HeadMap` per read, in the order of :attr:`CopyFacts.reads`."""

    is_kv: bool
    reason: str = ""
    copied_axes: tuple[int, ...] = ()  # axes of the copy's output that are repeated
    source_depth: int = 0
    source_view: tuple[int, ...] = ()
    reads: tuple[HeadMap, ...] = ()
    # False: no verdict could be made (the chain could not be evaluated); ``reason`` says why, and the copy is
    # counted as unclassified, never as "not replication"
    decided: bool = True

    @property
    def kv_heads(self) -> int:
        return self.reads[0].kv_heads if self.reads else 0

    @property
    def query_heads(self) -> int:
        return len(self.reads[0].kv_map) if self.reads else 0

    @property
    def group(self) -> int:
        return self.query_heads // self.kv_heads if self.kv_heads else 0


# ------------------------------------------------------------------------------------------------ evaluation
def evaluate_steps(shape: tuple[int, ...], steps: tuple[ViewStep, ...]) -> np.ndarray:
    """``arange(numel)`` in ``shape``, moved by ``steps``: element i of the result holds the index of the source
    element it is a copy of."""
    n = int(np.prod(shape, dtype=np.int64))
    if n > MAX_INDEX_ELEMENTS or any(int(np.prod(st.out_shape, dtype=np.int64)) > MAX_INDEX_ELEMENTS for st in steps):
        raise ValueError(f"an index tensor of more than {MAX_INDEX_ELEMENTS:,} elements")
    a = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64).reshape(shape)
    for step in steps:
        if step.kind == "reshape":
            a = a.reshape(step.out_shape)
        elif step.kind == "transpose":
            a = a.transpose(step.perm)
        elif step.kind == "tile":
            a = np.tile(a, step.reps)
        elif step.kind == "broadcast":
            a = np.broadcast_to(a, step.out_shape)
        elif step.kind == "gather":
            a = np.take(a, np.asarray(step.indices, dtype=np.int64), axis=step.axis)
        elif step.kind != "identity":
            raise ValueError(f"unknown step kind {step.kind!r}")
    return a


def shrunk_chain(shape: tuple[int, ...], steps: tuple[ViewStep, ...], size: int = SHRUNK_SIZE
                 ) -> tuple[tuple[int, ...], tuple[ViewStep, ...]]:
    """The chain with its largest source axis at ``size``: every dimension equal to that axis's length, in the
    source and in every step's output, becomes ``size``. Which head an element comes from does not depend on the
    length of an axis the chain carries through (a KV cache's slots); an axis the chain merges or splits makes
    the shrunk chain inconsistent, and evaluating it fails (ValueError), as it should."""
    big = max(shape, default=0)

    def sub(dims: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(size if d == big else d for d in dims)

    return sub(shape), tuple(ViewStep(st.kind, sub(st.out_shape), st.perm, st.reps, st.axis, st.indices)
                             for st in steps)


def _evaluate(cache: IndexCache, shape: tuple[int, ...], steps: tuple[ViewStep, ...]
              ) -> tuple[np.ndarray, int]:
    """The operand on source indices and the source's element count: at full size when that fits
    :data:`MAX_INDEX_ELEMENTS`, else on the :func:`shrunk_chain`."""
    sizes = [int(np.prod(shape, dtype=np.int64)), *(int(np.prod(st.out_shape, dtype=np.int64)) for st in steps)]
    if max(sizes) > MAX_INDEX_ELEMENTS:
        shape, steps = shrunk_chain(shape, steps)
    try:
        r_idx = cache.evaluate(shape, steps)
    except ValueError as e:  # a shrunk chain whose reshapes no longer fit: the full-size one is too large
        if "more than" in str(e) or max(sizes) <= MAX_INDEX_ELEMENTS:
            raise
        raise ValueError(f"an index tensor of more than {MAX_INDEX_ELEMENTS:,} elements") from e
    return r_idx, int(np.prod(shape, dtype=np.int64))


class IndexCache:
    """Index evaluations and their head maps keyed by (shape, steps): every layer of a model has the same chain,
    so a model's tiles are evaluated and compared once, not once per layer (a 70B repeat_kv step has 160)."""

    def __init__(self) -> None:
        self._cache: dict[tuple, np.ndarray] = {}
        self._heads: dict[tuple, tuple[tuple[int, ...], HeadMap | str]] = {}

    def head_map(self, shape: tuple[int, ...], steps: tuple[ViewStep, ...]
                 ) -> tuple[tuple[int, ...], HeadMap | str]:
        """(the operand's shape at full size, :func:`head_mapping` of it), computed once per chain (on the
        :func:`shrunk_chain` when the full-size one is too large)."""
        key = (shape, steps)
        if key not in self._heads:
            r_idx, numel = _evaluate(self, shape, steps)
            shrunk = numel != int(np.prod(shape, dtype=np.int64))
            r_shape = steps[-1].out_shape if shrunk else r_idx.shape  # the view at full size
            self._heads[key] = (r_shape, head_mapping(r_idx, numel))
        return self._heads[key]

    def evaluate(self, shape: tuple[int, ...], steps: tuple[ViewStep, ...]) -> np.ndarray:
        key = (shape, steps)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = evaluate_steps(shape, steps)
        return hit


def head_mapping(r_idx: np.ndarray, source_numel: int) -> HeadMap | str:
    """Which KV head each query head of an operand reads, from the operand evaluated on source indices.

    ``r_idx`` is the operand ``[*prefix, Hq, A, B]`` computed on ``arange(source_numel)``. It is a head
    replication iff, seeing the source as ``[*prefix, Hkv, A, B]`` (or ``[*prefix, Hkv, B, A]``: the head read
    transposed), every slice ``r[..., h, :, :]`` is exactly one source head with the other axes in place.
    Returns the :class:`HeadMap` or the reason it is not one."""
    if r_idx.ndim < 3:
        return f"rank-{r_idx.ndim} operand has no head axis"
    *prefix, hq, a, b = r_idx.shape
    if r_idx.size % source_numel or source_numel * hq % r_idx.size:
        return f"copies {r_idx.size / source_numel:g}× its source, not a whole number of heads"
    hkv = source_numel * hq // r_idx.size
    if hkv == hq:
        return "copies nothing along the head axis"
    if hq % hkv:
        return f"{hq} heads are not a multiple of {hkv} source heads"
    p, e = int(np.prod(prefix, dtype=np.int64)), a * b
    r = r_idx.reshape(p, hq, e)
    kv = r[0, :, 0] // e
    if kv.min() < 0 or kv.max() >= hkv:
        return "does not copy whole heads of its source"
    # head by head (a full-size copy is ~10^7 indices: one head's worth of expected values at a time)
    within = {False: np.arange(e), True: np.arange(e).reshape(b, a).T.reshape(-1)}  # True: the head is [B, A]
    starts = np.arange(p, dtype=np.int64)[:, None] * hkv
    transposed = None
    for swapped in (False, True):
        if all(np.array_equal(r[:, h], (starts + kv[h]) * e + within[swapped]) for h in range(hq)):
            transposed = swapped
            break
    if transposed is None:
        return "does not copy along the head axis (heads, slots or head dim are mixed)"
    if not np.all(np.bincount(kv, minlength=hkv) == hq // hkv):
        return "KV heads are not shared by equal groups of query heads"
    return HeadMap(hkv, tuple(int(x) for x in kv), transposed)


def _copied_axes(facts: CopyFacts) -> tuple[int, ...]:
    i, o = facts.input_shape, facts.output_shape
    if len(i) != len(o):
        return ()
    return tuple(ax for ax, (x, y) in enumerate(zip(i, o, strict=True)) if y != x)


# ------------------------------------------------------------------------------------------------ the classifier
def classify_copy(facts: CopyFacts, cache: IndexCache | None = None) -> Replication:
    """Whether a copy is KV replication for attention, and if so how its heads map (see the module docstring).

    Every read must be an attention operand (:data:`ATTENTION_READS`); then each source candidate is tried,
    deepest first (it removes the most copies), until one reads as a head gather on every read with one
    source layout. Otherwise the reason is the shallowest candidate's (the copy's own input: the most direct
    account)."""
    cache = cache or IndexCache()
    axes = _copied_axes(facts)
    if not facts.reads:
        return Replication(False, "nothing reads its output", axes)
    for read in facts.reads:
        if read.kind == SDPA_OTHER:
            return Replication(False, f"feeds the {read.operand or 'query or mask'} of {read.consumer_type} "
                                      f"{read.consumer_name!r}, not its key or value", axes)
        if read.kind not in ATTENTION_READS:
            extra = " (its other operand is no attention weight)" if read.consumer_type == "mul" else ""
            return Replication(False, f"feeds {read.consumer_type} {read.consumer_name!r}, not an attention "
                                      f"matmul{extra}", axes)
    reason, decided = "no source", True
    for source in facts.sources[::-1]:
        maps: list[HeadMap] = []
        views: set[tuple[int, ...]] = set()
        why, evaluated = "", True
        for read in facts.reads:
            steps = source.steps + read.steps
            try:
                r_shape, found = cache.head_map(source.shape, steps)
            except ValueError as e:  # placeholder sizes of symbolic dimensions that do not fit, or too large
                why = (f"its chain is too large to evaluate ({e})" if "more than" in str(e) else
                       "its chain cannot be evaluated at any one size of its symbolic dimensions")
                evaluated = False
                break
            if isinstance(found, str):
                why = found
                break
            a, b = (r_shape[-1], r_shape[-2]) if found.swapped else (r_shape[-2], r_shape[-1])
            views.add((*r_shape[:-3], found.kv_heads, a, b))
            maps.append(found)
        if not why and len(views) > 1:
            why = f"its copies are read in different layouts {sorted(views)}"
        if not why:
            return Replication(True, "", axes, source.depth, views.pop(), tuple(maps))
        if source.depth == 0:
            reason, decided = why, evaluated
    return Replication(False, reason, axes, decided=decided)

