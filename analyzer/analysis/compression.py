"""Compressed weights read back from a walked program: which part each weight belongs to, its scheme as
stored, and its dense vs stored bytes. Nothing is estimated from a compression spec.

Where a weight belongs (:func:`weight_part`), from its const name and the ops that read it:
``…layers_<i>_<module>_…`` with module ``self_attn``/``self_attention``/``attention``/``attn`` → attn of
layer i, ``mlp``/``feed_forward``/``ffn``/``block_sparse_moe``/``moe`` → ffn of layer i (fused
``qkv_proj`` and ``gate_up_proj`` follow their module); outside the layers, a const read by a ``gather``
is the embedding and one read by a ``linear`` and named ``lm_head``/``embed_out`` (or the embedding
itself, when tied) is the lm_head. Only consts read as a ``linear``/``conv`` weight, a ``matmul`` operand
or a ``gather`` table are weights: norm scales and biases are never compressed. The same rule decides
which weights a compression plan compresses (``analyzer.convert.compress.apply``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from analyzer import fmt
from analyzer.analysis.byte_rules import ByteContext
from analyzer.ir.mil_records import MilProgram, OpRecord

# Consumers whose const input is a weight matrix (param names from the MIL op definitions).
WEIGHT_PARAMS: dict[str, frozenset[str]] = {
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
class StoredWeight:
    """One weight as the graph stores it (bytes are ints)."""

    name: str
    parts: tuple[str, ...]  # ("attn",), ("embed", "lm_head") for a tied table, ("other",) when unplaced
    layer: int | None
    scheme: str  # "fp16", "pal4", "int8", "pal4+int8" (a quantized LUT), ...
    op_type: str  # the op that yields it: "const" or a "constexpr_*"
    readers: tuple[str, ...]
    shape: tuple[int | None, ...]
    dense_fp16_bytes: int
    stored_bytes: int
    lut_groups: int | None = None  # palettized: LUTs along the output channels
    group_channels: int | None = None  # palettized: output channels per LUT

    @property
    def compressed(self) -> bool:
        return self.op_type.startswith("constexpr_")

    @property
    def bits_per_weight(self) -> float | None:
        elements = math.prod(d or 0 for d in self.shape)
        return round(8 * self.stored_bytes / elements, 4) if elements else None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "name": self.name, "parts": list(self.parts), "layer": self.layer, "scheme": self.scheme,
            "op_type": self.op_type, "readers": list(self.readers), "shape": list(self.shape),
            "dense_fp16_bytes": self.dense_fp16_bytes, "stored_bytes": self.stored_bytes,
            "bits_per_weight": self.bits_per_weight,
        }
        if self.lut_groups is not None:
            row["lut_groups"] = self.lut_groups
            row["group_channels"] = self.group_channels
        return row


@dataclass(frozen=True, slots=True)
class PartTotals:
    count: int
    dense_fp16_bytes: int
    stored_bytes: int

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "dense_fp16_bytes": self.dense_fp16_bytes, "stored_bytes": self.stored_bytes}


def _totals(weights: Iterable[StoredWeight]) -> PartTotals:
    ws = list(weights)
    return PartTotals(len(ws), sum(w.dense_fp16_bytes for w in ws), sum(w.stored_bytes for w in ws))


@dataclass(frozen=True, slots=True)
class CompressionReport:
    """Every weight of a program as stored, with totals per part (``attn``, ``ffn``, ``embed``, ``lm_head``,
    ``embed+lm_head`` for a tied table, ``other``)."""

    weights: tuple[StoredWeight, ...]

    @property
    def by_part(self) -> dict[str, PartTotals]:
        keys = dict.fromkeys("+".join(w.parts) for w in self.weights)
        return {k: _totals(w for w in self.weights if "+".join(w.parts) == k) for k in keys}

    @property
    def total(self) -> PartTotals:
        return _totals(self.weights)

    @property
    def compressed_count(self) -> int:
        return sum(1 for w in self.weights if w.compressed)

    def layers_by_scheme(self, part: str) -> dict[str, tuple[int, ...]]:
        """For a layer part (``attn``, ``ffn``): scheme → the layers whose weights of that part use it."""
        out: dict[str, set[int]] = {}
        for w in self.weights:
            if part in w.parts and w.layer is not None:
                out.setdefault(w.scheme, set()).add(w.layer)
        return {s: tuple(sorted(v)) for s, v in sorted(out.items(), key=lambda kv: (min(kv[1]), kv[0]))}

    def precision_text(self, part: str) -> str:
        """``pal4 in layers 4-25; int8 in layers 0-3,26-29`` (read back from the graph), or ``""``."""
        return "; ".join(f"{s} in layers {fmt.layer_ranges(ls)}" for s, ls in self.layers_by_scheme(part).items())

    def to_json(self) -> dict[str, Any]:
        return {"weights": [w.to_json() for w in self.weights],
                "by_part": {k: v.to_json() for k, v in self.by_part.items()},
                "total": self.total.to_json(), "compressed_count": self.compressed_count}


def _scheme_of(op: OpRecord) -> str:
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


def compression_report(program: MilProgram) -> CompressionReport:
    """Every weight of a walked program as stored: name, part, layer, scheme (from the ``constexpr_*`` op
    type and its inputs' dtypes; the dtype for a plain const), dense fp16 bytes vs stored bytes, and LUT groups
    for palettized weights. The stored bytes are those the byte account charges with the ``compressed``
    weight charge."""
    ctx = ByteContext(program)
    ops = program.ops
    consumers = program.consumers()
    seen: dict[str, StoredWeight] = {}
    for op in ops:
        if op.kind == "const" or op.type.startswith("constexpr_"):
            continue
        for ref in op.inputs:
            if ref.producer is None or ref.tensor.name in seen:
                continue
            producer = ops[ref.producer]
            compressed = producer.type.startswith("constexpr_")
            if not compressed and (producer.kind != "const" or ref.param not in WEIGHT_PARAMS.get(op.kind, ())
                                   or len(ref.tensor.shape) < 2):
                continue
            readers = tuple(sorted({ops[c].kind for c in consumers[producer.index]}))
            where = weight_part(ref.tensor.name, readers)
            parts, layer = where if where is not None else (("other",), None)
            chain = [producer]
            while chain[-1].type.startswith("constexpr_"):  # nested constexprs (e.g. a quantized LUT)
                inner = [ops[r.producer] for r in chain[-1].inputs
                         if r.producer is not None and ops[r.producer].type.startswith("constexpr_")]
                if not inner:
                    break
                chain.append(inner[0])
            lut = next((r.tensor for r in producer.inputs if r.param == "lut"), None)
            lut_groups = lut.shape[0] if producer.type == "constexpr_lut_to_dense" and lut and lut.shape else None
            seen[ref.tensor.name] = StoredWeight(
                name=ref.tensor.name, parts=parts, layer=layer,
                scheme="+".join(_scheme_of(p) for p in chain) if compressed else ref.tensor.dtype,
                op_type=producer.type, readers=readers, shape=ref.tensor.shape,
                dense_fp16_bytes=math.prod(d or 0 for d in ref.tensor.shape) * 2, stored_bytes=ctx.weight_bytes(ref),
                lut_groups=lut_groups or None,
                group_channels=(ref.tensor.shape[0] or 0) // lut_groups if lut_groups else None,
            )
    return CompressionReport(tuple(seen.values()))
