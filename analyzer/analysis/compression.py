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
from analyzer.analysis.byte_rules import ByteContext, is_decompression
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
    op_type: str  # the op that yields it: "const" / "coreai.constant", a "constexpr_*", a Core AI decompression
    readers: tuple[str, ...]
    shape: tuple[int | None, ...]
    dense_fp16_bytes: int
    stored_bytes: int
    lut_groups: int | None = None  # palettized: LUTs along the output channels
    group_channels: int | None = None  # palettized: output channels per LUT
    granularity: str = ""  # "per-channel", "per-block 1x32", "per-tensor", "per-grouped-channel 16" (compressed)
    stored_dtypes: str = ""  # the stored parts' dtypes, e.g. "indices uint4, lut fp16" or "data int8, scale fp16"

    @property
    def compressed(self) -> bool:
        return self.op_type not in ("const", "coreai.constant")

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
        if self.compressed:
            row["granularity"] = self.granularity
            row["stored_dtypes"] = self.stored_dtypes
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


_LUT_OPS = ("constexpr_lut_to_dense", "coreai.lut_to_dense")
_SHIFT_SCALE_OPS = ("constexpr_blockwise_shift_scale", "constexpr_affine_dequantize", "coreai.blockwise_shift_scale",
                    "coreai.dequantize")
_OFFSETS = ("offset", "zero_point", "offset1", "offset2")
_SKIP_IN_DTYPES = ("axis", "vector_axis")
_ORDER = {"indices": 0, "lut": 1, "data": 2, "quantized_data": 2, "scale": 3}  # one order whatever the backend's


def _scheme_of(op: OpRecord, program: MilProgram) -> str:
    """The scheme a decompression op stores, read from its inputs' dtypes (``pal4``, ``int8``, ``int8:asym``)."""
    inputs = {r.param: r for r in op.inputs}
    if op.type in _LUT_OPS:
        idx = inputs.get("indices")
        bits = re.fullmatch(r"u?int(\d+)", idx.tensor.dtype) if idx is not None else None
        return f"pal{bits.group(1)}" if bits else "lut"
    if op.type in _SHIFT_SCALE_OPS:
        data = inputs.get("data") or inputs.get("quantized_data")
        name = data.tensor.dtype if data is not None else "int"
        # an offset that is a zero constant (Core AI states offset1 and offset2 even when symmetric) is no offset
        offset = [r for p, r in inputs.items() if p in _OFFSETS[:3]
                  and not (r.producer is not None and program.ops[r.producer].const_zero)]
        return name + (":asym" if offset else "")
    return op.type.removeprefix("constexpr_").removeprefix("coreai.")


def _chain(op: OpRecord, program: MilProgram) -> list[OpRecord]:
    """The decompression ops behind a weight, outermost first, casts between them left out (a quantized LUT:
    ``blockwise_shift_scale`` then ``lut_to_dense``)."""
    out, todo = [], [op]
    while todo:
        cur = todo.pop(0)
        if cur.kind != "cast":
            out.append(cur)
        todo += [program.ops[r.producer] for r in cur.inputs
                 if r.producer is not None and is_decompression(program.ops[r.producer], program)]
    return out


def _granularity(chain: list[OpRecord], shape: tuple[int | None, ...]) -> tuple[str, int | None, int | None]:
    """(granularity text, LUT groups, output channels per LUT) of a compressed weight, from its LUT's or scale's
    shape against the weight's: one LUT/scale per block of ``weight dim / table dim`` along each axis."""
    for op in chain:
        table = next((r.tensor for r in op.inputs if r.param in ("lut", "scale")), None)
        if table is None or not table.shape:
            continue
        dims = table.shape[:-2] if op.type in _LUT_OPS else table.shape
        if len(dims) != len(shape) or any(d is None for d in (*dims, *shape)):
            return "", None, None
        per_axis = [(s // d if d else 0) for s, d in zip(shape, dims, strict=True)]
        split = [i for i, d in enumerate(dims) if d and d > 1]
        groups = math.prod(d or 1 for d in dims)
        if op.type in _LUT_OPS:
            if not split:
                return "per-tensor", groups, None
            if len(split) == 1:
                return f"per-grouped-channel {per_axis[split[0]]}", groups, per_axis[split[0]]
            return "per-block " + "x".join(map(str, per_axis)), groups, None
        if not split:
            return "per-tensor", None, None
        if len(split) == 1 and per_axis[split[0]] == 1:
            return "per-channel", None, None
        return "per-block " + "x".join(map(str, per_axis)), None, None
    return "", None, None


def _stored_dtypes(chain: list[OpRecord], program: MilProgram) -> str:
    parts = []
    for op in chain:
        for r in op.inputs:
            inline = r.producer is None and r.is_const  # Core ML's constexpr inputs are inline values
            if r.param in _SKIP_IN_DTYPES or not (inline or (r.producer is not None
                                                              and program.ops[r.producer].kind == "const")):
                continue
            if not inline and program.ops[r.producer].const_zero and r.param in _OFFSETS:
                continue
            parts.append(f"{r.param} {r.tensor.dtype}")
    return ", ".join(sorted(parts, key=lambda p: (_ORDER.get(p.split()[0], 9), p)))


def compression_report(program: MilProgram) -> CompressionReport:
    """Every weight of a walked program as stored: name, part, layer, scheme (from the decompression op —
    Core ML's ``constexpr_*`` or Core AI's ``lut_to_dense`` / ``blockwise_shift_scale`` — and its inputs' dtypes; the
    dtype for a plain const), dense fp16 bytes vs stored bytes, granularity (LUT groups or scale blocks) and stored
    dtypes. The stored bytes are what the program stores, whatever the weight charge (``ByteContext.stored_bytes``)."""
    ctx = ByteContext(program)
    ops = program.ops
    consumers = program.consumers()
    seen: dict[str, StoredWeight] = {}
    for op in ops:
        if op.kind == "const" or is_decompression(op, program):
            continue
        for ref in op.inputs:
            if ref.producer is None or ref.tensor.name in seen:
                continue
            producer = ops[ref.producer]
            compressed = is_decompression(producer, program)
            if not compressed and (producer.kind != "const" or ref.param not in WEIGHT_PARAMS.get(op.kind, ())
                                   or len(ref.tensor.shape) < 2):
                continue
            readers = tuple(sorted({ops[c].kind for c in consumers[producer.index]}))
            chain = _chain(producer, program) if compressed else []
            name = ref.tensor.name
            if chain:  # a Core AI compressed weight is known by its stored constants (the asset names no values)
                stored = next((r for r in chain[-1].inputs if r.param in ("indices", "data") and r.producer is not None
                               and ops[r.producer].kind == "const"), None)
                name = name if producer.type.startswith("constexpr_") or stored is None else stored.tensor.name
            where = weight_part(name, readers)
            parts, layer = where if where is not None else (("other",), None)
            granularity, lut_groups, group_channels = _granularity(chain, ref.tensor.shape)
            seen[ref.tensor.name] = StoredWeight(
                name=name, parts=parts, layer=layer,
                scheme="+".join(_scheme_of(p, program) for p in chain) if compressed else ref.tensor.dtype,
                op_type=chain[0].type if chain else producer.type, readers=readers, shape=ref.tensor.shape,
                dense_fp16_bytes=math.prod(d or 0 for d in ref.tensor.shape) * 2, stored_bytes=ctx.stored_bytes(ref),
                lut_groups=lut_groups or None, group_channels=group_channels if lut_groups else None,
                granularity=granularity, stored_dtypes=_stored_dtypes(chain, program) if chain else "",
            )
    return CompressionReport(tuple(seen.values()))


def weights_by_part(program: MilProgram, acct: Any) -> dict[str, int]:
    """The ``weights`` bytes of a byte account (:class:`~analyzer.analysis.byte_account.ByteAccount` of
    ``program``) by the part of the weight each op reads, as that op reads it (a tied table is ``embed`` where the
    gather reads it and ``lm_head`` where the projection does): ``attn``, ``ffn``, ``embed``, ``lm_head``, and
    ``other`` for weights the naming rule does not place (norm scales, biases, small tables)."""
    out: dict[str, int] = {}
    consumers = program.consumers()
    for row in acct.ops:
        if not row.weights:
            continue
        op = program.ops[row.index]
        readers = [op.kind]
        decompression = is_decompression(op, program)
        if decompression:  # a per-call decompression: its weight is what its readers read
            readers = sorted({program.ops[c].kind for c in consumers[op.index]})
        part = "other"
        for ref in op.inputs:
            if ref.producer is None:
                continue
            producer = program.ops[ref.producer]
            if (producer.kind != "const" and not producer.type.startswith("constexpr_")) or len(ref.tensor.shape) < 2:
                continue  # a weight matrix or table (or its indices); scalars, norm scales and biases stay "other"
            where = weight_part(ref.tensor.name, readers)
            if where is not None:  # a tied table decompressed per call serves both: "embed+lm_head"
                part = "+".join(where[0]) if decompression else where[0][-1]
                break
        out[part] = out.get(part, 0) + row.weights
    return out
