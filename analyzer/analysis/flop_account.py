"""The records of a FLOP count: FLOPs per op, by category, per layer, per call and per token (ints; the conventions
are in :mod:`analyzer.analysis.flops`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

FLOP_CATEGORIES: tuple[str, ...] = ("projections", "attention_scores", "attention_values", "ffn", "lm_head",
                                    "other")


@dataclass(frozen=True, slots=True)
class OpFlops:
    """One op's FLOPs per call, by category (ints)."""

    index: int
    name: str
    type: str
    layer: int | None
    rule: str
    projections: int = 0
    attention_scores: int = 0
    attention_values: int = 0
    ffn: int = 0
    lm_head: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return sum(self.get(c) for c in FLOP_CATEGORIES)

    def get(self, category: str) -> int:
        return getattr(self, category)


@dataclass(frozen=True, slots=True)
class Flops:
    """FLOPs by category (per call or per token, as the account that made it says)."""

    projections: int
    attention_scores: int
    attention_values: int
    ffn: int
    lm_head: int
    other: int

    @property
    def total(self) -> int:
        return sum(self.get(c) for c in FLOP_CATEGORIES)

    @property
    def attention(self) -> int:
        return self.attention_scores + self.attention_values

    def get(self, key: str) -> int:
        if key == "total":
            return self.total
        if key not in FLOP_CATEGORIES:
            raise KeyError(f"no FLOP figure {key!r}")
        return getattr(self, key)

    def to_json(self) -> dict[str, int]:
        return {**{c: self.get(c) for c in FLOP_CATEGORIES}, "total": self.total}


@dataclass(frozen=True, slots=True)
class LayerFlops:
    """One decoder layer's FLOPs by category (``layer`` None: outside any decoder layer)."""

    layer: int | None
    flops: Flops

    def to_json(self) -> dict[str, int | None]:
        return {"layer": self.layer, **self.flops.to_json()}


@dataclass(frozen=True, slots=True)
class FlopAccount:
    ops: tuple[OpFlops, ...]
    tokens_per_call: int
    unruled_op_types: tuple[str, ...] = ()
    unsized: tuple[str, ...] = ()  # names of ops whose output shape is symbolic (counted 0)
    estimated: tuple[str, ...] = ()  # names of ops whose K was estimated from shapes (einsum)

    def per_call(self) -> Flops:
        return _sum(self.ops)

    def per_token(self) -> Flops:
        """Per call ÷ tokens per call (per prompt token for a prefill), rounded to the nearest FLOP."""
        return _divide(self.per_call(), self.tokens_per_call)

    def layers(self, per_token: bool = True) -> tuple[LayerFlops, ...]:
        """One row per layer, in layer order, ``None`` (outside the decoder layers) last."""
        rows: dict[int | None, list[OpFlops]] = defaultdict(list)
        for o in self.ops:
            rows[o.layer].append(o)
        order = sorted(rows, key=lambda x: (x is None, x if x is not None else 0))
        n = self.tokens_per_call if per_token else 1
        return tuple(LayerFlops(layer, _divide(_sum(rows[layer]), n)) for layer in order)

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_call": self.tokens_per_call,
            "flops_per_call": self.per_call().to_json(),
            "flops_per_token": self.per_token().to_json(),
            "flops_by_layer": [r.to_json() for r in self.layers()],
            "flop_unruled_op_types": list(self.unruled_op_types),
            "flop_unsized_ops": list(self.unsized),
            "flop_estimated_ops": list(self.estimated),
        }

    def op_rows(self) -> list[dict[str, Any]]:
        return [{"index": o.index, "name": o.name, "type": o.type, "layer": o.layer, "rule": o.rule,
                 **{c: o.get(c) for c in FLOP_CATEGORIES}, "total": o.total} for o in self.ops]


def _sum(ops) -> Flops:
    return Flops(**{c: sum(o.get(c) for o in ops) for c in FLOP_CATEGORIES})


def _divide(f: Flops, n: int) -> Flops:
    return f if n == 1 else Flops(**{c: round(f.get(c) / n) for c in FLOP_CATEGORIES})
