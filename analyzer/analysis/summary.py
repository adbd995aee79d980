"""What a program holds at a glance: op counts (with and without ``const``) and its copies (``tile`` ops, and any
``gather`` or ``concat`` that repeats its input), each with what the replication classifier says of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer.ir.coreai.dialect import kind_of
from analyzer.ir.mil_records import MilProgram, OpRecord
from analyzer.ir.opfacts import UNCLASSIFIED, CopyVerdict, copy_verdicts

Shape = tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class TileRow:
    """One copy (a ``tile``, a repeating ``gather`` or ``concat``): where it is, what it copies into what, how many
    bytes it writes, and whether it is KV replication for attention and why."""

    name: str
    layer: int | None
    input_shape: Shape | None  # its ``x``; None when the op has none
    output_shape: Shape
    dtype: str
    output_bytes: int | None  # None when a dimension is symbolic (the byte account lists it as unsized)
    kind: str | None  # "kv_replication" | "other" | "unclassified" (no verdict: analyzer.ir.opfacts)
    op_type: str = "tile"  # the op that copies: tile, gather, concat; Core AI's coreai.broadcast_in_dims, ...
    # inside a Core AI composite's fallback body (counted once per call): the composite's name; None elsewhere
    composite: str | None = None
    reason: str = ""  # why it is KV replication for attention (what it replicates) or why not: the classifier's
    reps: tuple[int, ...] | None = None  # a tile's repeats; None for a gather or concat copy
    reps_from: str | None = None  # "constant" (its reps input) | "program" (computed at run time) | None

    @classmethod
    def of(cls, op: OpRecord, verdict: CopyVerdict | None = None) -> TileRow:
        x = next((r.tensor for r in op.inputs if r.param in ("x", "values")), None)
        out = op.outputs[0]
        return cls(op.name, op.layer, x.shape if x else None, out.shape, out.dtype, out.nbytes, op.tile_kind,
                   op.type, op.composite, verdict.reason if verdict else "", verdict.reps if verdict else None,
                   verdict.reps_from if verdict else None)

    @property
    def unsized(self) -> bool:
        """Its bytes (a symbolic dimension) or its verdict (no kind) are unknown: an unsized copy
        (``analyzer.analysis.sizing``)."""
        return self.output_bytes is None or self.kind == UNCLASSIFIED

    @property
    def output_text(self) -> str:
        return "[" + ",".join("?" if d is None else str(d) for d in self.output_shape) + "]"

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "layer": self.layer,
               "input_shape": None if self.input_shape is None else list(self.input_shape),
               "output_shape": list(self.output_shape), "dtype": self.dtype, "output_bytes": self.output_bytes,
               "kind": self.kind, "op_type": self.op_type, "reason": self.reason,
               "reps": None if self.reps is None else list(self.reps), "reps_from": self.reps_from}
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
        verdicts = copy_verdicts(program.ops)  # the reasons (the kinds are the records' own)
        return cls(program.total_ops, program.op_counts(),
                   tuple(TileRow.of(op, verdicts.get(op.index)) for op in program.tiles()))

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

    @property
    def unsized_copies(self) -> int:
        """Copy ops whose bytes or verdict are unknown (:attr:`TileRow.unsized`), counted beside the tiles."""
        return sum(1 for t in self.tiles if t.unsized)

    def to_json(self) -> dict[str, Any]:
        return {
            "total_ops": self.total_ops,
            "const_ops": self.const_ops,
            "non_const_ops": self.non_const_ops,
            "op_counts": dict(self.op_counts),
            "tile_count": self.tile_count,
            "unsized_copies": self.unsized_copies,
            "tile_output_bytes": self.tile_output_bytes,
            "kv_replication_tiles": self.kv_replication_tiles,
            "tiles": [t.to_json() for t in self.tiles],
        }
