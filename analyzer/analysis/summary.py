"""What a program holds at a glance: op counts (with and without ``const``) and its ``tile`` ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer.ir.coreai.dialect import kind_of
from analyzer.ir.mil_records import MilProgram, OpRecord

Shape = tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class TileRow:
    """One ``tile`` op: where it is, what it copies into what, and how many bytes it writes."""

    name: str
    layer: int | None
    input_shape: Shape | None  # its ``x``; None when the op has none
    output_shape: Shape
    dtype: str
    output_bytes: int | None  # None when a dimension is symbolic (the byte account lists it as unsized)
    kind: str | None  # "kv_replication" | "other"
    op_type: str = "tile"  # a Core AI program's copies are "coreai.broadcast_in_dims" or "coreai.tile"
    # inside a Core AI composite's fallback body (counted once per call): the composite's name; None elsewhere
    composite: str | None = None

    @classmethod
    def of(cls, op: OpRecord) -> TileRow:
        x = next((r.tensor for r in op.inputs if r.param == "x"), None)
        out = op.outputs[0]
        return cls(op.name, op.layer, x.shape if x else None, out.shape, out.dtype, out.nbytes, op.tile_kind,
                   op.type, op.composite)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "layer": self.layer,
               "input_shape": None if self.input_shape is None else list(self.input_shape),
               "output_shape": list(self.output_shape), "dtype": self.dtype, "output_bytes": self.output_bytes,
               "kind": self.kind}
        if self.op_type != "tile":  # a Core ML tile's row is as it always was
            out["op_type"] = self.op_type
        if self.composite is not None:
            out["composite"] = self.composite
        return out


@dataclass(frozen=True, slots=True)
class ProgramSummary:
    total_ops: int
    op_counts: dict[str, int]  # op type → count, most frequent first (never mutated)
    tiles: tuple[TileRow, ...]

    @classmethod
    def of(cls, program: MilProgram) -> ProgramSummary:
        return cls(program.total_ops, program.op_counts(), tuple(TileRow.of(op) for op in program.tiles()))

    @property
    def const_ops(self) -> int:
        return sum(n for t, n in self.op_counts.items() if kind_of(t) == "const")  # MIL const, coreai.constant

    @property
    def non_const_ops(self) -> int:
        return self.total_ops - self.const_ops

    @property
    def tile_count(self) -> int:
        return len(self.tiles)

    @property
    def tile_output_bytes(self) -> int:
        """Bytes written by the tiles whose size is known."""
        return sum(t.output_bytes or 0 for t in self.tiles)

    @property
    def kv_replication_tiles(self) -> int:
        return sum(1 for t in self.tiles if t.kind == "kv_replication")

    def to_json(self) -> dict[str, Any]:
        return {
            "total_ops": self.total_ops,
            "const_ops": self.const_ops,
            "non_const_ops": self.non_const_ops,
            "op_counts": dict(self.op_counts),
            "tile_count": self.tile_count,
            "tile_output_bytes": self.tile_output_bytes,
            "kv_replication_tiles": self.kv_replication_tiles,
            "tiles": [t.to_json() for t in self.tiles],
        }
