"""The compression spec: a one-line grammar → a per-part, per-layer plan, and the presets.

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
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from analyzer import fmt
from analyzer.errors import QfoldError

PARTS: tuple[str, ...] = ("ffn", "attn", "embed", "lm_head")
LAYER_PARTS: tuple[str, ...] = ("ffn", "attn")
# coremltools' OpPalettizerConfig takes nbits in {1, 2, 3, 4, 6, 8} (coremltools 9.0 docs, OpPalettizerConfig);
# 1-bit palettes are left out as useless for LLM weights.
PALETTE_BITS: tuple[int, ...] = (2, 3, 4, 6, 8)
# Output channels sharing one palette (per_grouped_channel): qfold's choice (coremltools' own default is 32). A LUT
# of 2^bits fp16 values per 16 output channels costs < 0.01 bit per weight at 2,048 input features.
DEFAULT_GROUP_CHANNELS = 16


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


_q = fmt.quoted  # a spec's item in an error: enough to find it, never its 5,000 digits


def parse_scheme(text: str, token: str) -> Scheme:
    """``fp16`` | ``int8`` | ``palN[:uniform|:kmeans]``; ``token`` is the spec item quoted in errors."""
    if text == "fp16":
        return FP16
    if text == "int8":
        return INT8
    m = re.fullmatch(r"pal([0-9]{1,3})(?::(uniform|kmeans))?", text)
    if m is None:
        raise CompressionError(
            f"compression spec {_q(token)}: unknown scheme {_q(text)}; choose fp16, int8, or pal<bits> with "
            f"bits in {', '.join(map(str, PALETTE_BITS))} (optionally :uniform or :kmeans)"
        )
    bits = int(m.group(1))
    if bits not in PALETTE_BITS:
        raise CompressionError(
            f"compression spec {_q(token)}: {bits}-bit palettization is not supported; choose one of "
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
# The write-up's builds: "FFN 4-bit, 8 layers promoted to 8-bit, lm_head 6-bit, embedding 4-bit" (top8), and
# top12 "promotes 12 layers by the same criterion". It does not state the attention precision of the layers
# not promoted: that is qfold's assumption, a knob of every preset (ASSUMED_ATTENTION), shown wherever a
# compressed analysis's bytes are shown, and overridable in a spec: ``top8,attn=int8``.
ASSUMED_ATTENTION = "pal4"


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    promoted_layers: int  # first N/2 + last N/2 layers promoted to int8 (FFN and attention); 0: none
    description: str
    attention: str = ASSUMED_ATTENTION  # attention of the other layers: NOT stated by the write-up (assumed)

    @property
    def spec(self) -> str:
        """The preset as a spec, written with first:/last: rules so it fits any depth."""
        text = f"ffn=pal4,attn={self.attention},embed=pal4,lm_head=pal6"
        if self.promoted_layers:
            half = self.promoted_layers // 2
            text += f",layers[first:{half},last:{half}]=int8"
        return text

    @property
    def assumption(self) -> str:
        return (f"attention {self.attention} in the layers not promoted: assumed, the write-up does not state it "
                f"(change it with '{self.name},attn=SCHEME')")


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("base", 0, "FFN and attention 4-bit palettized, lm_head 6-bit, embedding 4-bit"),
    Preset("top8", 8, "base, with 8 layers (first 4 + last 4) promoted to int8 (FFN and attention)"),
    Preset("top12", 12, "base, with 12 layers (first 6 + last 6) promoted to int8 (FFN and attention)"),
)}


def preset_of(canonical: str, num_layers: int) -> str | None:
    """The preset a canonical spec is, for a model of ``num_layers`` layers, or None."""
    return next((name for name in PRESETS if canonical_spec(name, num_layers) == canonical), None)


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
                raise CompressionError(f"compression spec {_q(text)}: nested '['")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise CompressionError(f"compression spec {_q(text)}: ']' without '['")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise CompressionError(f"compression spec {_q(text)}: '[' without ']'")
    items.append("".join(cur))
    return items


def parse_layers(text: str, num_layers: int, token: str, clamp: bool = False) -> frozenset[int]:
    """``0-3,26,last:2`` → {0, 1, 2, 3, 26, 28, 29} (with 30 layers). Indices are 0-based and inclusive.
    With ``clamp`` (presets, written for any depth) ``first:N``/``last:N`` take at most every layer."""
    out: set[int] = set()
    for sel in text.split(","):
        if not sel:
            raise CompressionError(f"compression spec {_q(token)}: empty layer selector")
        m = re.fullmatch(r"(first|last):([0-9]{1,9})", sel)
        if m:
            n = min(int(m.group(2)), num_layers) if clamp else int(m.group(2))
            if not 1 <= n <= num_layers:
                raise CompressionError(
                    f"compression spec {_q(token)}: {_q(sel)} needs 1 to {num_layers} layers (the model has "
                    f"{num_layers})"
                )
            out.update(range(n) if m.group(1) == "first" else range(num_layers - n, num_layers))
            continue
        m = re.fullmatch(r"([0-9]{1,9})(?:-([0-9]{1,9}))?", sel)  # a bounded digit count: no 4,300-digit int()
        if m is None:
            raise CompressionError(
                f"compression spec {_q(token)}: layer selector {_q(sel)} is not N, N-M, first:N or last:N"
            )
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if lo > hi:
            raise CompressionError(f"compression spec {_q(token)}: layer range {_q(sel)} runs backwards")
        if hi >= num_layers:
            raise CompressionError(
                f"compression spec {_q(token)}: layer {hi} is out of range; the model has {num_layers} layers "
                f"(0-{num_layers - 1})"
            )
        out.update(range(lo, hi + 1))
    return frozenset(out)


format_layers = fmt.layer_ranges  # {0, 1, 2, 3, 26, 27} → "0-3,26-27"


def _parse_items(text: str, num_layers: int, rank: int) -> tuple[list[_Item], int | None, str | None]:
    """Items, the ``group=`` value (or None) and the preset named (or None)."""
    items: list[_Item] = []
    group: int | None = None
    preset: str | None = None
    for raw in _split_items(text):
        token = raw
        if not token:
            raise CompressionError(f"compression spec {_q(text)}: empty item (a doubled or trailing comma?)")
        if token in PRESETS:
            if preset is not None:
                raise CompressionError(
                    f"compression spec {_q(text)}: names two presets ({preset!r} and {_q(token)}); name one and "
                    "override parts of it"
                )
            if rank > 0:
                raise CompressionError(f"preset {_q(token)} inside a preset")
            preset = token
            continue
        if "=" not in token:
            raise CompressionError(
                f"compression spec {_q(token)}: not a preset ({', '.join(PRESETS)}) nor KEY=SCHEME"
            )
        key, value = token.split("=", 1)
        if key == "group":
            if group is not None:
                raise CompressionError(f"compression spec {_q(token)}: group= given twice")
            if not re.fullmatch(r"[0-9]{1,9}", value) or int(value) < 1:
                raise CompressionError(f"compression spec {_q(token)}: group must be a positive integer")
            group = int(value)
            continue
        scheme = parse_scheme(value, token)
        m = re.fullmatch(r"(\w+)(?:\[(.*)\])?", key)
        if m is None:
            raise CompressionError(f"compression spec {_q(token)}: cannot read {_q(key)}; expected PART or "
                                   "PART[LAYERS]")
        name, sel = m.group(1), m.group(2)
        if name == "layers":
            if sel is None:
                raise CompressionError(f"compression spec {_q(token)}: layers needs a set, e.g. layers[0-3]={value}")
            items.append(_Item(token, LAYER_PARTS, parse_layers(sel, num_layers, token, rank > 0), scheme, 1, rank))
        elif name in LAYER_PARTS:
            layers = None if sel is None else parse_layers(sel, num_layers, token, rank > 0)
            items.append(_Item(token, (name,), layers, scheme, 0 if sel is None else 2, rank))
        elif name in PARTS:
            if sel is not None:
                raise CompressionError(f"compression spec {_q(token)}: {name} has no layers; write {name}={value}")
            items.append(_Item(token, (name,), None, scheme, 0, rank))
        else:
            raise CompressionError(
                f"compression spec {_q(token)}: unknown part {_q(name)}; parts are {', '.join(PARTS)} and layers[...]"
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


@functools.lru_cache(maxsize=256)  # a sweep asks for each point's spec (and its preset) thousands of times
def canonical_spec(text: str, num_layers: int) -> str:
    """The canonical, deterministic text of a spec for a model depth (presets expanded, first/last resolved,
    layers sorted into ranges, spacing and case normalised). Equal meaning ⇒ equal text."""
    return parse_spec(text, num_layers).spec
