"""The records of a byte account: bytes per op, per token, per layer (ints, bytes; one decode token)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

CATEGORIES: tuple[str, ...] = ("weights", "kv_read", "kv_write", "replication", "activations")
# Columns of the per-op byte table (``ByteAccount.op_rows``), as the CLI and the exports write it.
OP_COLUMNS: tuple[str, ...] = ("index", "name", "type", "layer", "rule", *CATEGORIES, "total",
                               "kv_write_value_semantics")

WeightCharge = Literal["compressed", "decompressed"]
"""How a compressed weight (the output of a ``constexpr_*`` op) is charged per token: ``compressed`` (the
default) charges its stored parts (indices + LUT, int8 data + scales), as if the device streamed them each
token; ``decompressed`` charges the dense tensor the ``constexpr_*`` op yields, as if Core ML decompressed it
once at load time and each token read it at full width. Which one a device does is not in the graph."""
WEIGHT_CHARGES: tuple[WeightCharge, ...] = ("compressed", "decompressed")
DEFAULT_WEIGHT_CHARGE: WeightCharge = "compressed"


@dataclass(frozen=True, slots=True)
class OpBytes:
    """The bytes one op moves per decode token, by category (ints, bytes)."""

    index: int
    name: str
    type: str
    layer: int | None
    rule: str
    weights: int = 0
    kv_read: int = 0
    kv_write: int = 0
    replication: int = 0
    activations: int = 0
    kv_write_value_semantics: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_read + self.kv_write + self.replication + self.activations

    def get(self, category: str) -> int:
        return getattr(self, category)


def split_by_bytes(amount: float, ops: Iterable[OpBytes], into: dict[str, float], no_bytes: str) -> None:
    """Add ``amount`` (the profiled time, cost weight or cost-model time of ``ops``: one op, or every op of a type)
    to ``into`` over the byte categories, in proportion to the bytes ``ops`` move in each; ops that move no bytes
    of their own (views, scalars), or none at all (no account), add it to ``into[no_bytes]``. The one attribution
    of measured cost to byte categories: bench's profile (:mod:`analyzer.measure.bench`) and the placement join
    (:mod:`analyzer.measure.placement.placement_join`) both make it here."""
    ops = tuple(ops)
    by = {c: sum(op.get(c) for op in ops) for c in CATEGORIES}
    total = sum(by.values())
    if total <= 0:
        into[no_bytes] = into.get(no_bytes, 0.0) + amount
        return
    for c, n in by.items():
        if n > 0:
            into[c] = into.get(c, 0.0) + amount * n / total


@dataclass(frozen=True, slots=True)
class UnsizedTensor:
    """A tensor an op reads or writes whose size the graph does not fix (a symbolic dimension, or a type with
    no size such as a list): its bytes are not in any total, and the account says so."""

    op_index: int
    op_name: str
    tensor: str
    shape: str  # "[1,?,64]"
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"op_index": self.op_index, "op": self.op_name, "tensor": self.tensor, "shape": self.shape,
                "dtype": self.dtype}


@dataclass(frozen=True, slots=True)
class BytesPerToken:
    """One decode token's bytes by category; ``kv_write_value_semantics`` is beside the total, not in it."""

    weights: int
    kv_read: int
    kv_write: int
    replication: int
    activations: int
    kv_write_value_semantics: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_read + self.kv_write + self.replication + self.activations

    def get(self, key: str) -> int:
        """A category, ``total`` or ``kv_write_value_semantics`` by name."""
        if key not in (*CATEGORIES, "total", "kv_write_value_semantics"):
            raise KeyError(f"no byte figure {key!r}")
        return getattr(self, key)

    def to_json(self) -> dict[str, int]:
        return {k: self.get(k) for k in (*CATEGORIES, "kv_write_value_semantics", "total")}


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """One decoder layer's bytes per token by category (``layer`` None: outside any decoder layer)."""

    layer: int | None
    weights: int
    kv_read: int
    kv_write: int
    replication: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_read + self.kv_write + self.replication + self.activations

    def get(self, key: str) -> int:
        if key not in (*CATEGORIES, "total"):
            raise KeyError(f"no byte figure {key!r}")
        return getattr(self, key)

    def to_json(self) -> dict[str, int | None]:
        return {"layer": self.layer, **{c: self.get(c) for c in CATEGORIES}, "total": self.total}


@dataclass(frozen=True, slots=True)
class ByteAccount:
    ops: tuple[OpBytes, ...]
    unruled_op_types: tuple[str, ...]
    unsized: tuple[UnsizedTensor, ...] = ()
    weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE

    def per_token(self) -> BytesPerToken:
        return BytesPerToken(**{c: sum(o.get(c) for o in self.ops) for c in CATEGORIES},
                             kv_write_value_semantics=sum(o.kv_write_value_semantics for o in self.ops))

    def totals(self) -> dict[str, int]:
        t = self.per_token()
        return {**{c: t.get(c) for c in CATEGORIES}, "total": t.total,
                "kv_write_value_semantics": t.kv_write_value_semantics}

    def layers(self) -> tuple[LayerBytes, ...]:
        """One row per layer, in layer order, ``None`` (outside any decoder layer: embedding, RoPE, lm_head)
        last."""
        rows: dict[int | None, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0))
        for o in self.ops:
            for c in CATEGORIES:
                rows[o.layer][c] += o.get(c)
        order = sorted(rows, key=lambda x: (x is None, x if x is not None else 0))
        return tuple(LayerBytes(layer, **rows[layer]) for layer in order)

    def by_layer(self) -> list[dict[str, int | None]]:
        return [r.to_json() for r in self.layers()]

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes_per_token": self.per_token().to_json(),
            "bytes_by_layer": self.by_layer(),
            "unruled_op_types": list(self.unruled_op_types),
            "unsized_tensors": [u.to_json() for u in self.unsized],
            "weight_charge": self.weight_charge,
        }

    def op_rows(self) -> list[dict]:
        """One dict per op with the ``OP_COLUMNS`` keys."""
        return [
            {"index": o.index, "name": o.name, "type": o.type, "layer": o.layer, "rule": o.rule,
             **{c: o.get(c) for c in CATEGORIES}, "total": o.total,
             "kv_write_value_semantics": o.kv_write_value_semantics}
            for o in self.ops
        ]
