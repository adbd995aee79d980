"""Weight compression: a one-line spec → a per-part, per-layer plan → ``coremltools.optimize.coreml``.

The spec (docs/compression.md has the full story)::

    spec    := item ("," item)*                       one line; spaces ignored; case-insensitive
    item    := PRESET                                 base | top8 | top12 (at most one per spec)
             | PART "=" SCHEME                        PART: ffn | attn | embed | lm_head
             | "layers[" SET "]=" SCHEME              ffn AND attn of those layers
             | ("ffn" | "attn") "[" SET "]=" SCHEME   one part of those layers
             | "group=" N                             channels sharing one palette (default 16)
    SET     := sel ("," sel)*      sel := N | N-M | first:N | last:N     (0-based, inclusive)
    SCHEME  := fp16 | int8 | pal{2,3,4,6,8}[":uniform" | ":kmeans"]

    e.g.  top8                                         (a preset)
          'ffn=pal4,attn=int8,embed=pal4,lm_head=pal6,layers[first:2,last:2]=int8'
          'top8,lm_head=int8'                          (a preset with an override)

Resolution is order-independent: every (part, layer) cell takes the scheme of the most specific item that
covers it (``ffn[..]``/``attn[..]`` over ``layers[..]`` over ``ffn=``/``attn=``); at equal specificity an
item you wrote beats the preset's; two items you wrote that cover a cell at equal specificity with
different schemes are an error naming both. Parts nobody names stay fp16. The canonical text
(:func:`canonical_spec`) is computed from the resolved plan, so equal meaning gives equal text.

Which layers to promote: the write-up's top8/top12 promote "the most sensitive layers", ranked on real
weights. qfold builds from random weights, where no sensitivity ranking exists, so the presets use a
first/last rule (top8 = first 4 + last 4) and you name other layers yourself.

Where a weight belongs (:func:`weight_part`), from its const name and the ops that read it:
``…layers_<i>_<module>_…`` with module ``self_attn``/``self_attention``/``attention``/``attn`` → attn of
layer i, ``mlp``/``feed_forward``/``ffn``/``block_sparse_moe``/``moe`` → ffn of layer i (fused
``qkv_proj`` and ``gate_up_proj`` follow their module); outside the layers, a const read by a ``gather``
is the embedding and one read by a ``linear`` and named ``lm_head``/``embed_out`` (or the embedding
itself, when tied) is the lm_head. Only consts read as a ``linear``/``conv`` weight, a ``matmul`` operand
or a ``gather`` table are weights: norm scales and biases are never compressed.

Compressed bytes are never estimated from the spec: the accounting and :func:`compression_report` read
them back from the ``constexpr_lut_to_dense`` / ``constexpr_blockwise_shift_scale`` inputs of the graph.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from analyzer.errors import QfoldError

log = logging.getLogger(__name__)

PARTS: tuple[str, ...] = ("ffn", "attn", "embed", "lm_head")
LAYER_PARTS: tuple[str, ...] = ("ffn", "attn")
# coremltools' OpPalettizerConfig takes nbits in {1, 2, 3, 4, 6, 8} (coremltools 9.0 docs, OpPalettizerConfig);
# 1-bit palettes are left out as useless for LLM weights.
PALETTE_BITS: tuple[int, ...] = (2, 3, 4, 6, 8)
# Output channels sharing one palette (per_grouped_channel), as in probe/q3_compress.py; coremltools'
# own default is 32.
DEFAULT_GROUP_CHANNELS = 16
# coremltools (models/neural_network/quantization_utils.py, _get_kmeans_lookup_table_and_weight) uses its
# bundled kmeans1d only for palettes over >= 10,000 fp16 weights; smaller ones need scikit-learn.
KMEANS1D_MIN_WEIGHTS = 10_000
# coremltools skips consts of <= weight_threshold elements (default 2048); qfold names every weight it
# wants compressed, so it asks for all of them and checks afterwards that none was skipped.
WEIGHT_THRESHOLD_ELEMENTS = 0
# One k-means worker: extra workers are processes that each hold a copy of the weights, and a full-size
# compression already peaks at ~7 GB (design.md).
KMEANS_WORKERS = 1

# Consumers whose const input is a weight matrix (param names from the MIL op definitions).
_WEIGHT_PARAMS: dict[str, frozenset[str]] = {
    "linear": frozenset({"weight"}),
    "conv": frozenset({"weight"}),
    "matmul": frozenset({"x", "y"}),
    "gather": frozenset({"x"}),
}
_LAYER_MODULE = re.compile(r"(?:^|[_.])(?:layers?|h|blocks?)[_.](\d+)[_.](.+)$")
_ATTN_MODULE = re.compile(r"^(?:self_attn|self_attention|attention|attn)(?:[_.]|$)")
_FFN_MODULE = re.compile(r"^(?:mlp|feed_forward|ffn|block_sparse_moe|moe)(?:[_.]|$)")
_LM_HEAD_NAME = re.compile(r"lm_head|embed_out")
_EMBED_NAME = re.compile(r"embed_tokens|tok_embeddings|word_embeddings|embed_in|(?:^|[_.])wte(?:[_.]|$)")


class CompressionError(QfoldError):
    """A compression spec that cannot be parsed, or a plan that cannot be applied to a model."""


# ------------------------------------------------------------------------------------------------- schemes
@dataclass(frozen=True, slots=True)
class Scheme:
    """How one weight is stored: ``fp16`` (as converted), ``palettize`` (``bits``-bit indices into a
    per-group fp16 LUT) or ``linear`` (int8, symmetric, one fp16 scale per output channel)."""

    method: str  # "fp16" | "palettize" | "linear"
    bits: int  # bits per stored element: 16, a palette width, or 8
    kmeans: bool = False  # palettize only: k-means clustered LUT instead of uniform

    @property
    def token(self) -> str:
        if self.method == "fp16":
            return "fp16"
        if self.method == "linear":
            return f"int{self.bits}"
        return f"pal{self.bits}" + (":kmeans" if self.kmeans else "")

    @property
    def compresses(self) -> bool:
        return self.method != "fp16"


FP16 = Scheme("fp16", 16)
INT8 = Scheme("linear", 8)


def parse_scheme(text: str, token: str) -> Scheme:
    """``fp16`` | ``int8`` | ``palN[:uniform|:kmeans]``; ``token`` is the spec item quoted in errors."""
    if text == "fp16":
        return FP16
    if text == "int8":
        return INT8
    m = re.fullmatch(r"pal(\d+)(?::(uniform|kmeans))?", text)
    if m is None:
        raise CompressionError(
            f"compression spec {token!r}: unknown scheme {text!r}; choose fp16, int8, or pal<bits> with "
            f"bits in {', '.join(map(str, PALETTE_BITS))} (optionally :uniform or :kmeans)"
        )
    bits = int(m.group(1))
    if bits not in PALETTE_BITS:
        raise CompressionError(
            f"compression spec {token!r}: {bits}-bit palettization is not supported; choose one of "
            f"{', '.join(map(str, PALETTE_BITS))} bits"
        )
    return Scheme("palettize", bits, m.group(2) == "kmeans")


# ------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True, slots=True)
class CompressionPlan:
    """The resolved spec: one scheme per part and (for ffn/attn) per layer."""

    num_layers: int
    ffn: tuple[Scheme, ...]  # [num_layers]
    attn: tuple[Scheme, ...]  # [num_layers]
    embed: Scheme
    lm_head: Scheme
    group_channels: int = DEFAULT_GROUP_CHANNELS  # output channels sharing one palette

    def scheme(self, part: str, layer: int | None = None) -> Scheme:
        if part in LAYER_PARTS:
            if layer is None or not 0 <= layer < self.num_layers:
                raise CompressionError(f"{part} weight of layer {layer}: the plan has layers 0-{self.num_layers - 1}")
            return getattr(self, part)[layer]
        if part not in PARTS:
            raise CompressionError(f"unknown part {part!r}; parts are {', '.join(PARTS)}")
        return getattr(self, part)

    @property
    def uses_palettization(self) -> bool:
        return any(s.method == "palettize" for s in (*self.ffn, *self.attn, self.embed, self.lm_head))

    @property
    def spec(self) -> str:
        """The canonical text: computed from the plan alone, so equal plans give equal text."""
        items = []
        defaults = {}
        for part in LAYER_PARTS:
            schemes: tuple[Scheme, ...] = getattr(self, part)
            counts = Counter(schemes)
            defaults[part] = max(counts, key=lambda s: (counts[s], s.token))  # ties: a fixed order
            items.append(f"{part}={defaults[part].token}")
        items += [f"embed={self.embed.token}", f"lm_head={self.lm_head.token}"]
        both: dict[Scheme, list[int]] = {}
        single: dict[str, dict[Scheme, list[int]]] = {p: {} for p in LAYER_PARTS}
        for i, (f, a) in enumerate(zip(self.ffn, self.attn, strict=True)):
            if f == a and f != defaults["ffn"] and a != defaults["attn"]:
                both.setdefault(f, []).append(i)
                continue
            for part, s in (("ffn", f), ("attn", a)):
                if s != defaults[part]:
                    single[part].setdefault(s, []).append(i)
        items += [f"layers[{format_layers(v)}]={s.token}" for s, v in sorted(both.items(), key=_by_token)]
        for part in LAYER_PARTS:
            items += [f"{part}[{format_layers(v)}]={s.token}" for s, v in sorted(single[part].items(), key=_by_token)]
        if self.uses_palettization and self.group_channels != DEFAULT_GROUP_CHANNELS:
            items.append(f"group={self.group_channels}")
        return ",".join(items)

    def table(self) -> list[dict[str, Any]]:
        """One row per layer: its ffn and attn schemes (embed and lm_head have no layer)."""
        return [{"layer": i, "ffn": f.token, "attn": a.token}
                for i, (f, a) in enumerate(zip(self.ffn, self.attn, strict=True))]

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "num_layers": self.num_layers, "group_channels": self.group_channels,
                "embed": self.embed.token, "lm_head": self.lm_head.token, "layers": self.table()}


def _by_token(kv: tuple[Scheme, list[int]]) -> str:
    return kv[0].token


def needs_untie(plan: CompressionPlan) -> bool:
    """Whether embedding and lm_head get different schemes: a tied model must then be untied in torch (and
    converted without ``common::const_deduplication``), since a tied pair is ONE const in Core ML."""
    return plan.embed != plan.lm_head


# ------------------------------------------------------------------------------------------------- presets
@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    spec: str  # written with first:/last: rules, so it fits any depth
    description: str


_BASE = "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal6"
PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("base", _BASE, "FFN and attention 4-bit palettized, lm_head 6-bit, embedding 4-bit"),
    Preset("top8", _BASE + ",layers[first:4,last:4]=int8",
           "base, with 8 layers (first 4 + last 4) promoted to int8 (FFN and attention)"),
    Preset("top12", _BASE + ",layers[first:6,last:6]=int8",
           "base, with 12 layers (first 6 + last 6) promoted to int8 (FFN and attention)"),
)}


# ------------------------------------------------------------------------------------------------- parsing
@dataclass(frozen=True, slots=True)
class _Item:
    token: str  # as written (normalised), quoted in errors
    parts: tuple[str, ...]
    layers: frozenset[int] | None  # None: every layer (or a part without layers)
    scheme: Scheme
    specificity: int  # 0 part default, 1 layers[..], 2 ffn[..]/attn[..]
    rank: int  # 0 written by the user, 1 from the named preset


def _split_items(text: str) -> list[str]:
    """Split on commas outside brackets; brackets must balance."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise CompressionError(f"compression spec {text!r}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise CompressionError(f"compression spec {text!r}: ']' without '['")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise CompressionError(f"compression spec {text!r}: '[' without ']'")
    items.append("".join(cur))
    return items


def parse_layers(text: str, num_layers: int, token: str, clamp: bool = False) -> frozenset[int]:
    """``0-3,26,last:2`` → {0, 1, 2, 3, 26, 28, 29} (with 30 layers). Indices are 0-based and inclusive.
    With ``clamp`` (presets, written for any depth) ``first:N``/``last:N`` take at most every layer."""
    out: set[int] = set()
    for sel in text.split(","):
        if not sel:
            raise CompressionError(f"compression spec {token!r}: empty layer selector")
        m = re.fullmatch(r"(first|last):(\d+)", sel)
        if m:
            n = min(int(m.group(2)), num_layers) if clamp else int(m.group(2))
            if not 1 <= n <= num_layers:
                raise CompressionError(
                    f"compression spec {token!r}: {sel!r} needs 1 to {num_layers} layers (the model has {num_layers})"
                )
            out.update(range(n) if m.group(1) == "first" else range(num_layers - n, num_layers))
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", sel)
        if m is None:
            raise CompressionError(
                f"compression spec {token!r}: layer selector {sel!r} is not N, N-M, first:N or last:N"
            )
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if lo > hi:
            raise CompressionError(f"compression spec {token!r}: layer range {sel!r} runs backwards")
        if hi >= num_layers:
            raise CompressionError(
                f"compression spec {token!r}: layer {hi} is out of range; the model has {num_layers} layers "
                f"(0-{num_layers - 1})"
            )
        out.update(range(lo, hi + 1))
    return frozenset(out)


def format_layers(layers: Iterable[int]) -> str:
    """{0, 1, 2, 3, 26, 27} → ``0-3,26-27``."""
    xs = sorted(set(layers))
    runs: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        runs.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(runs)


def _parse_items(text: str, num_layers: int, rank: int) -> tuple[list[_Item], int | None, str | None]:
    """Items, the ``group=`` value (or None) and the preset named (or None)."""
    items: list[_Item] = []
    group: int | None = None
    preset: str | None = None
    for raw in _split_items(text):
        token = raw
        if not token:
            raise CompressionError(f"compression spec {text!r}: empty item (a doubled or trailing comma?)")
        if token in PRESETS:
            if preset is not None:
                raise CompressionError(
                    f"compression spec {text!r}: names two presets ({preset!r} and {token!r}); name one and "
                    "override parts of it"
                )
            if rank > 0:
                raise CompressionError(f"preset {token!r} inside a preset")
            preset = token
            continue
        if "=" not in token:
            raise CompressionError(
                f"compression spec {token!r}: not a preset ({', '.join(PRESETS)}) nor KEY=SCHEME"
            )
        key, value = token.split("=", 1)
        if key == "group":
            if group is not None:
                raise CompressionError(f"compression spec {token!r}: group= given twice")
            if not value.isdigit() or int(value) < 1:
                raise CompressionError(f"compression spec {token!r}: group must be a positive integer")
            group = int(value)
            continue
        scheme = parse_scheme(value, token)
        m = re.fullmatch(r"(\w+)(?:\[(.*)\])?", key)
        if m is None:
            raise CompressionError(f"compression spec {token!r}: cannot read {key!r}; expected PART or PART[LAYERS]")
        name, sel = m.group(1), m.group(2)
        if name == "layers":
            if sel is None:
                raise CompressionError(f"compression spec {token!r}: layers needs a set, e.g. layers[0-3]={value}")
            items.append(_Item(token, LAYER_PARTS, parse_layers(sel, num_layers, token, rank > 0), scheme, 1, rank))
        elif name in LAYER_PARTS:
            layers = None if sel is None else parse_layers(sel, num_layers, token, rank > 0)
            items.append(_Item(token, (name,), layers, scheme, 0 if sel is None else 2, rank))
        elif name in PARTS:
            if sel is not None:
                raise CompressionError(f"compression spec {token!r}: {name} has no layers; write {name}={value}")
            items.append(_Item(token, (name,), None, scheme, 0, rank))
        else:
            raise CompressionError(
                f"compression spec {token!r}: unknown part {name!r}; parts are {', '.join(PARTS)} and layers[...]"
            )
    return items, group, preset


def _normalise(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def parse_spec(text: str, num_layers: int) -> CompressionPlan:
    """Parse a preset name or a spec (module docstring) for a model of ``num_layers`` decoder layers."""
    if not isinstance(num_layers, int) or num_layers < 1:
        raise CompressionError(f"num_layers {num_layers!r}: must be a positive integer")
    norm = _normalise(text or "")
    if not norm:
        raise CompressionError("compression spec is empty; name a preset (base, top8, top12) or write PART=SCHEME")
    items, group, preset = _parse_items(norm, num_layers, rank=0)
    if preset is not None:
        p_items, p_group, _ = _parse_items(PRESETS[preset].spec, num_layers, rank=1)
        items = p_items + items
        group = group if group is not None else p_group
    cells: dict[tuple[str, int | None], Scheme] = {}
    for part in PARTS:
        for layer in range(num_layers) if part in LAYER_PARTS else [None]:
            cells[(part, layer)] = _resolve_cell(items, part, layer)
    plan = CompressionPlan(
        num_layers=num_layers,
        ffn=tuple(cells[("ffn", i)] for i in range(num_layers)),
        attn=tuple(cells[("attn", i)] for i in range(num_layers)),
        embed=cells[("embed", None)],
        lm_head=cells[("lm_head", None)],
    )
    if group is not None and plan.uses_palettization:
        plan = replace(plan, group_channels=group)
    return plan


def _resolve_cell(items: Sequence[_Item], part: str, layer: int | None) -> Scheme:
    covering = [it for it in items if part in it.parts and (it.layers is None or layer in it.layers)]
    if not covering:
        return FP16
    best = max((it.specificity, -it.rank) for it in covering)
    winners = [it for it in covering if (it.specificity, -it.rank) == best]
    for other in winners[1:]:
        if other.scheme != winners[0].scheme:
            where = part if layer is None else f"{part} of layer {layer}"
            raise CompressionError(
                f"compression spec: {winners[0].token!r} and {other.token!r} both set {where} "
                f"({winners[0].scheme.token} vs {other.scheme.token}); keep one"
            )
    return winners[0].scheme


def canonical_spec(text: str, num_layers: int) -> str:
    """The canonical, deterministic text of a spec for a model depth (presets expanded, first/last resolved,
    layers sorted into ranges, spacing and case normalised). Equal meaning ⇒ equal text."""
    return parse_spec(text, num_layers).spec


# ------------------------------------------------------------------------------------------------- weights
def weight_part(name: str, consumer_types: Iterable[str]) -> tuple[tuple[str, ...], int | None] | None:
    """Which part(s) a weight feeds, from its const name and the op types that read it: ``(parts, layer)``,
    or None when the rule (module docstring) cannot tell. A tied embedding read by a ``gather`` and a
    ``linear`` is both ``embed`` and ``lm_head``."""
    consumers = set(consumer_types)
    m = _LAYER_MODULE.search(name)
    if m is not None:
        module = m.group(2)
        if _ATTN_MODULE.match(module):
            return ("attn",), int(m.group(1))
        if _FFN_MODULE.match(module):
            return ("ffn",), int(m.group(1))
        return None
    parts: list[str] = []
    if "gather" in consumers:
        if not _EMBED_NAME.search(name):
            return None  # a gathered table that is not named as an embedding (e.g. a RoPE table)
        parts.append("embed")
    if consumers - {"gather"}:
        if not (_LM_HEAD_NAME.search(name) or _EMBED_NAME.search(name)):
            return None
        parts.append("lm_head")
    return (tuple(parts), None) if parts else None


@dataclass(frozen=True, slots=True)
class WeightAssignment:
    """One weight const of the converted model and the scheme the plan gives it."""

    const_name: str
    parts: tuple[str, ...]
    layer: int | None
    shape: tuple[int, ...]
    consumer_types: tuple[str, ...]
    scheme: Scheme
    group_channels: int  # palettize: output channels per LUT actually used (divides the channel count)

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


def _main_block(spec):
    if spec.WhichOneof("Type") != "mlProgram":
        raise CompressionError(f"a {spec.WhichOneof('Type')} model, not an ML Program; only ML Programs compress")
    funcs = spec.mlProgram.functions
    func = funcs["main"] if "main" in funcs else next(iter(funcs.values()))
    return func.block_specializations[func.opset]


def _ops(block) -> Iterator:
    for op in block.operations:
        yield op
        for b in op.blocks:
            yield from _ops(b)


def _const_weights(spec) -> dict[str, tuple[tuple[int, ...], list[str]]]:
    """Const name → (shape, consumer op types) for every const of rank ≥ 2 read as a weight."""
    shapes: dict[str, tuple[int, ...]] = {}
    readers: dict[str, list[str]] = {}
    ops = list(_ops(_main_block(spec)))
    for op in ops:
        if op.type == "const" and op.outputs:
            tt = op.outputs[0].type.tensorType
            if len(tt.dimensions) >= 2:
                shapes[op.outputs[0].name] = tuple(d.constant.size for d in tt.dimensions)
    for op in ops:
        params = _WEIGHT_PARAMS.get(op.type)
        for param, arg in op.inputs.items():
            for b in arg.arguments:
                if b.WhichOneof("binding") == "name" and b.name in shapes:
                    if params is not None and param in params:
                        readers.setdefault(b.name, []).append(op.type)
    return {n: (shapes[n], sorted(set(r))) for n, r in readers.items()}


def plan_weights(mlmodel, plan: CompressionPlan) -> tuple[WeightAssignment, ...]:
    """The scheme of every weight const of a converted model, found from its spec. Raises
    :class:`CompressionError` for a weight whose part the naming rule cannot tell, a layer the plan does
    not have, and a tied embedding/lm_head const asked to take two schemes."""
    out: list[WeightAssignment] = []
    for name, (shape, consumers) in sorted(_const_weights(mlmodel.get_spec()).items()):
        where = weight_part(name, consumers)
        if where is None:
            raise CompressionError(
                f"cannot tell which part weight {name!r} (read by {', '.join(consumers)}) belongs to: qfold reads "
                "'layers_<i>_self_attn|attention|attn_…' as attn, 'layers_<i>_mlp|feed_forward|ffn_…' as ffn, "
                "a gathered table as embed and 'lm_head' as lm_head"
            )
        parts, layer = where
        if layer is not None and layer >= plan.num_layers:
            raise CompressionError(
                f"weight {name!r} is in layer {layer} but the plan was made for {plan.num_layers} layers"
            )
        schemes = {plan.scheme(p, layer) for p in parts}
        if len(schemes) > 1:
            raise CompressionError(
                f"weight {name!r} is ONE const read by both the embedding gather and the lm_head linear (tied "
                f"embeddings), so it cannot be embed={plan.embed.token} and lm_head={plan.lm_head.token}: untie "
                "the torch model (analyzer.model.decode.untie_embeddings_) and convert with keep_duplicate_consts=True "
                "(no common::const_deduplication), or give embed and lm_head the same scheme"
            )
        scheme = schemes.pop()
        channels = _output_channels(shape, consumers)
        group = math.gcd(channels, plan.group_channels) if scheme.method == "palettize" else plan.group_channels
        if scheme.method == "palettize" and group != plan.group_channels:
            log.warning("%s: %d output channels are not a multiple of group=%d; palettizing with %d channels per LUT",
                        name, channels, plan.group_channels, group)
        out.append(WeightAssignment(name, parts, layer, shape, tuple(consumers), scheme, group))
    return tuple(out)


def _output_channels(shape: tuple[int, ...], consumers: Sequence[str]) -> int:
    """coremltools groups output channels along axis 0 for linear/conv/gather; for a matmul operand it may
    be either of the last two axes, so take a count that both divide."""
    if "matmul" in consumers:
        return math.gcd(shape[-1], shape[-2])
    return shape[0]


def _check_kmeans(assignments: Sequence[WeightAssignment]) -> None:
    """Fail before compressing when k-means would need scikit-learn and it is not installed."""
    if importlib.util.find_spec("sklearn") is not None:
        return
    from coremltools._deps import _HAS_KMEANS1D

    for a in assignments:
        if a.scheme.method != "palettize" or not a.scheme.kmeans:
            continue
        per_lut = a.group_channels * a.elements // a.shape[0]
        if not _HAS_KMEANS1D or per_lut < KMEANS1D_MIN_WEIGHTS:
            raise CompressionError(
                f"{a.scheme.token} on {a.const_name!r}: coremltools clusters palettes of fewer than "
                f"{KMEANS1D_MIN_WEIGHTS:,} weights (here {per_lut:,}) with scikit-learn, which is not installed "
                "(pip install scikit-learn), or use uniform palettization"
            )


def optimization_configs(assignments: Sequence[WeightAssignment]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The coremltools op configs of a plan, keyed by const name: ``(palettize, linear_quantize)``. One config
    object per (scheme, group) so equal schemes share it, as probe/q3_compress.py did."""
    import coremltools.optimize.coreml as cto

    configs: dict[tuple[Scheme, int], object] = {}

    def config(a: WeightAssignment):
        key = (a.scheme, a.group_channels)
        if key not in configs:
            if a.scheme.method == "palettize":
                configs[key] = cto.OpPalettizerConfig(
                    mode="kmeans" if a.scheme.kmeans else "uniform", nbits=a.scheme.bits,
                    granularity="per_grouped_channel", group_size=a.group_channels,
                    num_kmeans_workers=KMEANS_WORKERS, weight_threshold=WEIGHT_THRESHOLD_ELEMENTS)
            else:
                configs[key] = cto.OpLinearQuantizerConfig(
                    mode="linear_symmetric", dtype=f"int{a.scheme.bits}", granularity="per_channel",
                    weight_threshold=WEIGHT_THRESHOLD_ELEMENTS)
        return configs[key]

    pal = {a.const_name: config(a) for a in assignments if a.scheme.method == "palettize"}
    lin = {a.const_name: config(a) for a in assignments if a.scheme.method == "linear"}
    return pal, lin


def check_all_compressed(assignments: Sequence[WeightAssignment], left: Iterable[str]) -> None:
    """Raise :class:`CompressionError` if a weight the plan compresses is still a plain const (``left``: the
    const weight names after compression)."""
    left = set(left)
    skipped = [a for a in assignments if a.scheme.compresses and a.const_name in left]
    if skipped:
        a = skipped[0]
        raise CompressionError(
            f"coremltools left {len(skipped)} weight(s) uncompressed, e.g. {a.const_name!r} "
            f"{list(a.shape)} ({a.scheme.token}); its log says why"
        )


def compress_model(mlmodel, plan: CompressionPlan):
    """Compress the weights of a converted ML Program per the plan: palettization first, then int8 linear
    quantization (as probe/q3_compress.py), each with per-const configs keyed by const name. Returns the new
    MLModel; raises :class:`CompressionError` if coremltools skipped a weight the plan compresses."""
    import coremltools.optimize.coreml as cto

    assignments = plan_weights(mlmodel, plan)
    _check_kmeans(assignments)
    pal, lin = optimization_configs(assignments)
    if pal:
        mlmodel = cto.palettize_weights(mlmodel, cto.OptimizationConfig(op_name_configs=pal))
    if lin:
        mlmodel = cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(op_name_configs=lin))
    if pal or lin:
        check_all_compressed(assignments, _const_weights(mlmodel.get_spec()))
    return mlmodel


# ------------------------------------------------------------------------------------------------- report
def _scheme_of(op) -> str:
    """The scheme a ``constexpr_*`` op stores, read from its inputs' dtypes."""
    inputs = {r.param: r.tensor for r in op.inputs}
    if op.type == "constexpr_lut_to_dense":
        idx = inputs.get("indices")
        bits = re.fullmatch(r"u?int(\d+)", idx.dtype) if idx is not None else None
        return f"pal{bits.group(1)}" if bits else "lut"
    if op.type in ("constexpr_blockwise_shift_scale", "constexpr_affine_dequantize"):
        data = inputs.get("data") or inputs.get("quantized_data")
        name = data.dtype if data is not None else "int"
        return name + ("" if "offset" not in inputs and "zero_point" not in inputs else ":asym")
    return op.type.removeprefix("constexpr_")


def compression_report(program) -> dict[str, Any]:
    """Every weight of a walked program (``analyzer.graph.mil.MilProgram``) as stored: name, part, layer, scheme
    (from the ``constexpr_*`` op type and its inputs' dtypes; ``fp16`` for a plain const), dense fp16 bytes
    vs stored bytes, bits per weight, and LUT groups for palettized weights; plus totals per part. All read
    from the graph; the stored bytes are those the byte accounting charges (``accounting._Context``)."""
    from analyzer.graph.accounting import _Context

    ctx = _Context(program)
    ops = program.ops
    consumers = program.consumers()
    rows = []
    for op in ops:
        if op.type == "const" or op.type.startswith("constexpr_"):
            continue
        for ref in op.inputs:
            if ref.producer is None:
                continue
            producer = ops[ref.producer]
            compressed = producer.type.startswith("constexpr_")
            if not compressed:
                params = _WEIGHT_PARAMS.get(op.type, frozenset())
                if producer.type != "const" or ref.param not in params or len(ref.tensor.shape) < 2:
                    continue
            rows.append((ref, producer, compressed))
    seen: dict[str, dict[str, Any]] = {}
    for ref, producer, compressed in rows:
        name = ref.tensor.name
        if name in seen:
            continue
        reader_types = sorted({ops[c].type for c in consumers[producer.index]})
        where = weight_part(name, reader_types)
        parts, layer = where if where is not None else (("other",), None)
        chain = [producer]
        while chain[-1].type.startswith("constexpr_"):  # nested constexprs (e.g. a quantized LUT)
            inner = [ops[r.producer] for r in chain[-1].inputs
                     if r.producer is not None and ops[r.producer].type.startswith("constexpr_")]
            if not inner:
                break
            chain.append(inner[0])
        scheme = "+".join(_scheme_of(p) for p in chain) if compressed else ref.tensor.dtype
        elements = math.prod(d or 0 for d in ref.tensor.shape)
        stored = ctx.weight_bytes(ref)
        row: dict[str, Any] = {
            "name": name, "parts": list(parts), "layer": layer, "scheme": scheme, "op_type": producer.type,
            "readers": reader_types, "shape": list(ref.tensor.shape),
            "dense_fp16_bytes": elements * 2, "stored_bytes": stored,
            "bits_per_weight": round(8 * stored / elements, 4) if elements else None,
        }
        lut = next((r.tensor for r in producer.inputs if r.param == "lut"), None)
        if producer.type == "constexpr_lut_to_dense" and lut is not None and lut.shape and lut.shape[0]:
            row["lut_groups"] = lut.shape[0]
            row["group_channels"] = (ref.tensor.shape[0] or 0) // lut.shape[0]
        seen[name] = row
    weights = list(seen.values())
    by_part: dict[str, dict[str, int]] = {}
    for w in weights:
        key = "+".join(w["parts"])
        agg = by_part.setdefault(key, {"count": 0, "dense_fp16_bytes": 0, "stored_bytes": 0})
        agg["count"] += 1
        agg["dense_fp16_bytes"] += w["dense_fp16_bytes"]
        agg["stored_bytes"] += w["stored_bytes"]
    total = {"count": len(weights), "dense_fp16_bytes": sum(w["dense_fp16_bytes"] for w in weights),
             "stored_bytes": sum(w["stored_bytes"] for w in weights)}
    return {"weights": weights, "by_part": by_part, "total": total,
            "compressed_count": sum(1 for w in weights if w["op_type"].startswith("constexpr_"))}
