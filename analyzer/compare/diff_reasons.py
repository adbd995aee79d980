"""Why two analyses differ: every byte-category and op-count difference split by op kind, each part with a reason.

Every byte is charged to exactly one op (``accounting``), so a category's difference is exactly the sum of its
per-kind differences (an op's kind is its MIL op, or what a Core AI op moves data like: ``OpRecord.kind``); each
part names the ops behind it and, where the cause is known, says it. Across backends (a Core ML build against a
Core AI build of the same model, ``diff A B``) the known causes are those measured on qfold's own builds
(tests/test_coreai.py): coreai-torch transposes a linear weight stored ``[out, in]`` at run time (a foreign
asset's every linear; in qfold's builds, which store untied weights ``[in, out]`` (``analyzer.model.linear_layout``),
only a tied lm_head) and keeps the torch model's fp32 steps, while coremltools folds the transposes into the
constants and computes in fp16. Between compressed builds of one spec, the compressed constants add theirs: Core AI
decompresses on every call (``lut_to_dense``, ``blockwise_shift_scale``: the stored parts are read, and the dense
weight written and read, per call) where Core ML's ``constexpr_*`` ops decompress once at load; and what each stores
per part (LUT groups and their axis, block size, scale and LUT dtypes: ``compression_report``) is compared and
named wherever a compressed weight's bytes differ.

    explain(a, b) → (Reason("activations", "transpose", 0, 5_013_504, "Core AI transposes ..."), ...)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from analyzer.analysis.accounting import CATEGORIES
from analyzer.analysis.compression import compression_report
from analyzer.analysis.record import Analysis
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION

_FP32_STEPS = ("Core AI keeps the torch model's fp32 steps (RMSNorm's variance, the softmax, RoPE's cos/sin) at 4 "
               "bytes per element; a Core ML build computes in fp16 (compute_precision FLOAT16)")
_NEGATIVE_IDS = ("coremltools' guard_negative_gather_indices pass (iOS17+) wraps a negative token id into the "
                 "vocabulary before the embedding gather (greater_equal, add, select); Core AI gathers the id as given")
MQA_V_COPY = ("with one KV head (MQA) coreai-torch drops V's copy: its reshape → broadcast_in_dims → reshape then only "
              "repeats V along the P·V matmul's batch axis, which broadcasting_batch_matmul broadcasts by itself; K's "
              "copy stays (a transpose sits between it and the QKᵀ matmul); Core ML tiles both")
# (category, kind) → the cause, when A and B come from different backends.
CROSS_BACKEND_CAUSES: dict[tuple[str, str], str] = {
    ("activations", "transpose"): "Core AI transposes a linear weight stored [out, in] at run time (torch's linear "
                                  "is x·Wᵀ; coremltools folds the transpose into the constant): each copy is "
                                  "written here, then read by a matmul (qfold's own builds store untied weights "
                                  "[in, out]: only a tied lm_head's), and K is transposed for QKᵀ",
    ("activations", "matmul"): "Core AI's matmuls read the run-time transposed weights (activations) where Core "
                               "ML's linear reads its constant (weights); and its K matmul reads an explicit "
                               "transpose of K",
    ("activations", "linear"): "Core ML's linear reads its weight as a constant; Core AI writes the same product as "
                               "a matmul (over the weight as stored, or a run-time transposed copy)",
    ("activations", "cast"): "Core AI casts into and out of the torch model's fp32 steps; " + _FP32_STEPS,
    ("weights", "mul"): "constants at another precision: coremltools stores fp32 constants (RoPE's inverse "
                        "frequencies) in fp16, Core AI keeps their torch dtype",
    ("weights", "concat"): "Core AI builds a slice's end indices from constant markers (INT32_MAX) where Core ML "
                           "uses an end mask over zero constants (free)",
    ("weights", "linear"): "the same weights: Core ML's linear reads them, Core AI's matmuls (a weight stored "
                           "[in, out]) or run-time transposes (stored [out, in]) do",
    ("weights", "matmul"): "the same weights: Core AI's matmuls read them as stored [in, out] (qfold's Core AI "
                           "builds, analyzer.model.linear_layout), Core ML's linear reads them",
    ("weights", "transpose"): "the same weights: Core AI's run-time transposes read those stored [out, in] (in "
                              "qfold's builds, a tied lm_head: the embedding table), Core ML's linear does",
    ("replication", "transpose"): "the K copy: Core AI reads it through an explicit transpose (then the matmul reads "
                                  "the transposed copy), Core ML's matmul reads it directly (transpose_y)",
    ("replication", "matmul"): "the K copy: Core ML's matmul reads it directly (transpose_y), Core AI's through an "
                               "explicit transpose; " + MQA_V_COPY,
    ("replication", "tile"): MQA_V_COPY,
    ("kv_read", "matmul"): "the same cache bytes, read by another op: Core ML's attention matmuls read K "
                           "(transpose_y) and V; Core AI reads K through an explicit transpose, and V by its P·V "
                           "matmul (with one KV head also in repeat_kv, where Core ML's V tile reads it)",
    ("kv_read", "transpose"): "Core AI reads the K cache through an explicit transpose before the QKᵀ matmul; Core "
                              "ML's matmul reads it as stored (transpose_y)",
    ("kv_read", "tile"): "the same cache bytes, read by another op: " + MQA_V_COPY,
    ("weights", "add"): "the same biases (q/k/v projections): Core AI adds them with a separate add, Core ML's "
                        "linear reads them with its weight",
    ("activations", "gather"): "the embedding gather's index: Core ML's gather reads it as int16 (coremltools casts "
                               "it), Core AI's gather_nd as the int32 token id",
    ("activations", "greater_equal"): _NEGATIVE_IDS,
    ("activations", "select"): _NEGATIVE_IDS,
    ("activations", "concat"): "slice bounds and rotate_half are concatenated differently by the two converters",
    ("activations", "slice_by_index"): "RoPE's rotate_half slices are written differently by the two converters",
}
for _kind in ("mul", "add", "sub", "pow", "rsqrt", "reduce_mean", "softmax", "real_div", "sin", "cos"):
    CROSS_BACKEND_CAUSES.setdefault(("activations", _kind), _FP32_STEPS)
_PER_CALL = ("Core AI decompresses weights on every call (Apple's runtime runs lut_to_dense / blockwise_shift_scale "
             "per call, analyzer.ir.coreai.dialect) where Core ML's constexpr_* ops decompress once at load")
# Causes that only compressed builds have (a per-call decompression op in either program).
COMPRESSED_CAUSES: dict[tuple[str, str], str] = {
    ("weights", "coreai.lut_to_dense"): "palettized weights as stored (indices + LUT), read by Core AI's "
                                        "lut_to_dense on every call, a whole table even where only a gather reads it "
                                        "(an embedding); Core ML charges its stored bytes to the op reading the "
                                        "constexpr_lut_to_dense output (a linear; a gather: one row's share)",
    ("weights", "coreai.blockwise_shift_scale"): "linearly quantized weights as stored (data + scales; a zero offset "
                                                 "is free), read by Core AI's blockwise_shift_scale on every call; "
                                                 "Core ML charges them to the op reading its "
                                                 "constexpr_blockwise_shift_scale output",
    ("activations", "coreai.lut_to_dense"): _PER_CALL + ": the dense weight it writes",
    ("activations", "coreai.blockwise_shift_scale"): _PER_CALL + ": the dense weight it writes",
    ("activations", "coreai.dequantize"): _PER_CALL + ": the dense weight it writes",
    ("activations", "matmul"): CROSS_BACKEND_CAUSES[("activations", "matmul")] + "; and Core AI's matmuls read the "
                               "dense weights its per-call decompression wrote",
    ("activations", "gather"): CROSS_BACKEND_CAUSES[("activations", "gather")] + "; and a table Core AI decompresses "
                               "per call is read as the dense table's rows (activations)",
    ("weights", "gather"): "the embedding: Core ML's gather reads one row's share of the stored table (indices + "
                           "LUT); Core AI's reads a dense table its lut_to_dense decompressed per call (activations), "
                           "or, uncompressed, one fp16 row",
    ("weights", "linear"): "Core ML's linear reads its weights as stored (compressed: through a constexpr at load); "
                           "Core AI charges compressed weights to its decompression ops, fp16 ones to its matmuls",
}


@dataclass(frozen=True, slots=True)
class Reason:
    """One part of a difference: ``aspect`` a byte category (or ``ops``), the op ``kind``, A's and B's figure
    (bytes, or op count for ``ops``), and why."""

    aspect: str
    kind: str
    a: int
    b: int
    why: str

    @property
    def delta(self) -> int:
        return self.b - self.a

    def to_json(self) -> dict[str, Any]:
        return {"aspect": self.aspect, "kind": self.kind, "a": self.a, "b": self.b, "delta": self.delta,
                "why": self.why}


def _by_kind(x: Analysis) -> tuple[dict[str, Counter], Counter, dict[str, set[str]]]:
    """Bytes per category per op kind, op count per kind, and the op types behind each kind."""
    kinds = {op.index: op.kind for op in x.program.ops}
    per: dict[str, Counter] = {c: Counter() for c in CATEGORIES}
    for row in x.account.ops:
        for c in CATEGORIES:
            if row.get(c):
                per[c][kinds[row.index]] += row.get(c)
    types: dict[str, set[str]] = defaultdict(set)
    for op in x.program.ops:
        types[op.kind].add(op.type)
    return per, Counter(kinds.values()), types


def stored_differences(a: Analysis, b: Analysis) -> str:
    """How A and B store each compressed part where they differ: scheme, granularity (LUT groups and the axis they
    split, block size), stored dtypes (LUT, scale), from each program's ``compression_report``; ``""`` when neither
    is compressed or they store every part alike."""
    def ways(x: Analysis) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for w in compression_report(x.program).weights:
            if w.compressed:
                out["+".join(w.parts)].add(" ".join(v for v in (w.scheme, w.granularity, f"({w.stored_dtypes})"
                                                                  if w.stored_dtypes else "") if v))
        return out

    wa, wb = ways(a), ways(b)
    texts = []
    for part in sorted(set(wa) | set(wb)):
        if wa.get(part) != wb.get(part):
            texts.append(f"{part}: A {'; '.join(sorted(wa.get(part, ()))) or 'uncompressed'}, "
                         f"B {'; '.join(sorted(wb.get(part, ()))) or 'uncompressed'}")
    return "stored differently: " + " | ".join(texts) if texts else ""


def explain(a: Analysis, b: Analysis) -> tuple[Reason, ...]:
    """A reason for each per-kind part of every byte-category difference and every op-count (by kind) difference
    between ``a`` and ``b``; the parts of a category add up to its difference exactly."""
    cross = a.program.backend != b.program.backend
    per_call = any(op.type in PER_CALL_DECOMPRESSION for x in (a, b) for op in x.program.ops)
    compressed = per_call or any(op.type.startswith("constexpr_") for x in (a, b) for op in x.program.ops)
    causes = {**CROSS_BACKEND_CAUSES, **(COMPRESSED_CAUSES if per_call else {})}
    stored = stored_differences(a, b) if compressed else ""
    (bytes_a, count_a, types_a), (bytes_b, count_b, types_b) = _by_kind(a), _by_kind(b)
    out: list[Reason] = []
    for c in CATEGORIES:
        for kind in sorted(set(bytes_a[c]) | set(bytes_b[c])):
            xa, xb = bytes_a[c][kind], bytes_b[c][kind]
            if xa == xb:
                continue
            ops = (f"{kind} ops: {count_a[kind]} in A ({', '.join(sorted(types_a[kind])) or 'none'}), "
                   f"{count_b[kind]} in B ({', '.join(sorted(types_b[kind])) or 'none'})")
            cause = causes.get((c, kind)) if cross else None
            if c == "replication":
                cause = cause or "KV replication copies (the variant's difference)"
            if stored and c == "weights" and (kind in PER_CALL_DECOMPRESSION or kind in ("linear", "gather", "matmul")):
                cause = f"{cause}; {stored}" if cause else stored
            out.append(Reason(c, kind, xa, xb, f"{cause}; {ops}" if cause else ops))
    for kind in sorted(set(count_a) | set(count_b)):
        if count_a[kind] != count_b[kind]:
            what = (f"as {', '.join(sorted(types_a[kind] | types_b[kind]))}" if cross else "")
            out.append(Reason("ops", kind, count_a[kind], count_b[kind],
                              f"{count_a[kind]} vs {count_b[kind]} {kind} ops {what}".strip()))
    return tuple(out)
