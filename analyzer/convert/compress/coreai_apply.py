"""Apply a compression plan to a converted Core AI program with coreai-opt (Apple's apple/coreai-optimization,
pinned 0.4.0), the Core AI counterpart of :mod:`.apply` (coremltools.optimize on a converted Core ML program).

coreai-opt compresses a Core AI program after conversion, as coremltools does a Core ML one (coreai-opt 0.4.0,
``coreai_opt/coreai_utils/passes/``, documented in its ``docs/src/utils/coreai_compression.md``):

* ``palettize_weights(program, lut_dtype=None, n_bits, granularity=PER_GROUPED_CHANNEL, group_size, ...)``
  (``weight_palettization.py``) replaces each eligible ``coreai.constant`` by ``coreai.lut_to_dense(indices, lut,
  axis)``: ``n_bits``-bit indices (``ui<n>``, packed) and an fp16 LUT of ``2^n`` entries per group of output
  channels (its ``lut`` is ``[.., groups, .., 2^n, 1]``); the output axis comes from the readers
  (``graph_utils._select_input_output_channel_axis``: axis -1 of a matmul's ``y``, 0 of a ``gather_nd`` table);
* ``quantize_weights(program, DType.INT8, QScheme.SYMMETRIC, CompressionGranularity.PER_CHANNEL)``
  (``weight_quantization.py``) replaces it by ``coreai.blockwise_shift_scale(data si8, scale, offset1, offset2)``
  with one fp16 scale per output channel and zero offsets; ``PER_BLOCK`` with ``block_size`` is the per-block
  granularity (one scale per ``block_size`` input channels), which qfold's spec grammar does not ask for;
* both keep the compressed constants in the program, so ``save_asset`` writes them into the ``.aimodel`` (indices,
  LUTs, int8 data and scales as stored: read back by :func:`analyzer.analysis.compression.compression_report`).

What qfold adds: which weight gets which scheme, by the same naming rule as Core ML (``assign_weight``; a weight's
name is the module that reads it, :func:`analyzer.ir.coreai.walk.constant_labels`). coreai-opt's passes compress
every eligible constant alike, so each (scheme, group) runs once on the constants the plan gives it: qfold marks
them and narrows the pass's own eligibility test (``_should_compress_op``) to the marked ones, for that call.
Uniform palettization (``pal4``, the default mode) is coreai-opt's ``UNIFORM`` LUT (``palettize_utils.
_get_lut_and_indices``: ``2^n`` evenly spaced values from the group's min to max), which ``palettize_weights``
does not expose (it passes ``mode="KMEANS"`` to ``_blockwise_compress``): qfold passes ``UNIFORM`` instead, for
that call; ``:kmeans`` keeps coreai-opt's own k-means. Every weight the plan compresses is checked afterwards; one
coreai-opt skipped (it logs why) is an error, and the dense constants it replaced are erased.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.convert.compress.apply import WeightAssignment, assign_weight
from analyzer.ir.coreai.dialect import kind_of
from analyzer.ir.coreai.mlir_dump import dump_module
from analyzer.ir.coreai.walk import ENTRY, constant_labels
from analyzer.model.compress_spec import CompressionError, CompressionPlan, Scheme

log = logging.getLogger(__name__)

# coreai-opt 0.4.0 (palettize_utils._get_kmeans_lookup_table_and_weight) clusters with its bundled kmeans1d, built
# on first use by torch.utils.cpp_extension (a C++ compiler), only palettes of >= 10,000 fp16 weights; smaller ones
# need scikit-learn.
KMEANS1D_MIN_WEIGHTS = 10_000
# One k-means worker: coreai-opt's pool forks processes that each hold the weights.
KMEANS_WORKERS = 1
_MARK = "qfold.compress"  # a discardable attribute naming the (scheme, group) a constant is given, for one call


@dataclass(frozen=True, slots=True)
class CoreAIWeight:
    """A weight constant of a converted Core AI program and the scheme the plan gives it."""

    op: Any  # the ``coreai.constant`` (MLIR operation) in the program's main graph
    assignment: WeightAssignment
    channels: int  # output channels, along the axis coreai-opt groups them on (its readers say which)


def _ops_coreai_opt_compresses() -> frozenset[str]:
    from coreai_opt.coreai_utils.passes import _OPS_WEIGHT_NEED_COMPRESSION

    return _OPS_WEIGHT_NEED_COMPRESSION


def plan_coreai_weights(program, plan: CompressionPlan) -> tuple[CoreAIWeight, ...]:
    """Every weight constant of a converted program (rank ≥ 2, read only by ops coreai-opt compresses:
    matmuls, ``gather_nd``, ``transpose``, ``conv2d``) with its scheme. Raises :class:`CompressionError` as
    :func:`~analyzer.convert.compress.apply.plan_weights` does (an unplaceable weight, a tied table given two
    schemes)."""
    from coreai_opt.coreai_utils._utils.graph_utils import _select_input_output_channel_axis

    handles: dict[tuple[str, int], Any] = {}
    doc = dump_module(program._module._mlir_module, handles)
    labels = constant_labels(doc)
    main = next((g for g in doc["graphs"] if g["name"] == ENTRY), None)
    if main is None:
        raise CompressionError(f"the converted program has no graph {ENTRY!r}")
    readers: dict[int, list[str]] = {}
    for row in main["ops"]:
        for v in row["operands"]:
            readers.setdefault(v, []).append(row["op"])
    eligible = _ops_coreai_opt_compresses()
    out = []
    for i, row in enumerate(main["ops"]):
        if row["op"] != "coreai.constant" or not row["results"]:
            continue
        vid, (shape, dtype, _) = row["results"][0]
        users = readers.get(vid, [])
        if len(shape) < 2 or not users or any(u not in eligible for u in users) or not dtype.startswith(("fp", "bf")):
            continue
        op = handles[(ENTRY, i)]
        _, out_axis = _select_input_output_channel_axis(op)
        channels = shape[out_axis if out_axis is not None else 0]
        consumers = sorted({kind_of(u) for u in users})
        out.append(CoreAIWeight(op, assign_weight(labels[(ENTRY, i)], tuple(shape), consumers, plan, channels),
                                channels))
    return tuple(out)


def check_kmeans(weights: Sequence[CoreAIWeight]) -> None:
    """Fail before compressing where coreai-opt's k-means cannot run here: palettes under 10,000 weights need
    scikit-learn, larger ones its bundled kmeans1d, compiled on first use (a C++ compiler)."""
    for w in weights:
        a = w.assignment
        if a.scheme.method != "palettize" or not a.scheme.kmeans:
            continue
        per_lut = a.elements // w.channels * a.group_channels  # weights one LUT clusters
        if per_lut < KMEANS1D_MIN_WEIGHTS and importlib.util.find_spec("sklearn") is None:
            raise CompressionError(
                f"{a.scheme.token} on {a.const_name!r}: coreai-opt clusters palettes of fewer than "
                f"{KMEANS1D_MIN_WEIGHTS:,} weights (here {per_lut:,}) with scikit-learn, which is not installed "
                "(pip install scikit-learn), or use uniform palettization")
        compiler = os.environ.get("CXX", "c++")
        if per_lut >= KMEANS1D_MIN_WEIGHTS and shutil.which(compiler) is None:
            raise CompressionError(
                f"{a.scheme.token} on {a.const_name!r}: coreai-opt clusters it with its bundled kmeans1d, which it "
                f"compiles on first use, and there is no C++ compiler ({compiler!r}) here; install one (apt-get "
                "install g++) or use uniform palettization")


class _Skipped(logging.Handler):
    """coreai-opt's own warnings during a pass (why it skipped a weight)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().strip().splitlines()[0])


@contextlib.contextmanager
def _only_marked(key: str, *, lut_mode: str | None = None) -> Iterator[_Skipped]:
    """Narrow coreai-opt's passes to the constants marked ``key`` (their own eligibility test still applies), and
    for palettization pick the LUT mode (module docstring), for the duration of one call."""
    from coreai._compiler.ir import StringAttr
    from coreai_opt.coreai_utils.passes import weight_palettization as wp
    from coreai_opt.coreai_utils.passes import weight_quantization as wq

    saved = {(m, n): getattr(m, n) for m in (wp, wq) for n in ("_should_compress_op",)}
    saved[(wp, "_blockwise_compress")] = wp._blockwise_compress

    def narrowed(original):
        def should(op, threshold, ops):
            return (_MARK in op.attributes and StringAttr(op.attributes[_MARK]).value == key
                    and original(op, threshold, ops))
        return should

    for m in (wp, wq):
        m._should_compress_op = narrowed(saved[(m, "_should_compress_op")])
    if lut_mode is not None:
        blockwise = saved[(wp, "_blockwise_compress")]
        wp._blockwise_compress = lambda *a, **k: blockwise(*a, **{**k, "mode": lut_mode})
    skipped = _Skipped()
    logger = logging.getLogger("coreai_opt")
    logger.addHandler(skipped)
    try:
        yield skipped
    finally:
        logger.removeHandler(skipped)
        for (m, n), f in saved.items():
            setattr(m, n, f)


def _key(scheme: Scheme, group: int) -> str:
    return f"{scheme.token}/g{group}"


def _compress_group(program, scheme: Scheme, group: int) -> list[str]:
    """One coreai-opt pass over the constants marked for (scheme, group); returns coreai-opt's warnings."""
    from coreai_opt.coreai_utils import CompressionGranularity, DType, palettize_weights, quantize_weights
    from coreai_opt.coreai_utils.common import QScheme

    key = _key(scheme, group)
    if scheme.method == "palettize":
        with _only_marked(key, lut_mode="KMEANS" if scheme.kmeans else "UNIFORM") as skipped:
            palettize_weights(program, None, n_bits=scheme.bits,
                              granularity=CompressionGranularity.PER_GROUPED_CHANNEL, group_size=group,
                              weight_num_threshold=0, num_kmeans_workers=KMEANS_WORKERS,
                              enable_fast_kmeans_mode=False, in_place=True)
    elif scheme.method == "linear" and scheme.bits == 8:
        with _only_marked(key) as skipped:
            quantize_weights(program, DType.INT8, qscheme=QScheme.SYMMETRIC,
                             granularity=CompressionGranularity.PER_CHANNEL, weight_num_threshold=0, in_place=True)
    else:
        raise CompressionError(f"{scheme.token}: coreai-opt has no pass qfold maps it to")
    return skipped.messages


def compress_coreai_program(program, plan: CompressionPlan) -> tuple[WeightAssignment, ...]:
    """Compress, in place, the weights of a converted Core AI program (``AIProgram``) per the plan: one
    coreai-opt pass per (scheme, output channels per LUT), palettization first. Returns every weight's
    assignment; raises :class:`CompressionError` if coreai-opt skipped a weight the plan compresses."""
    from coreai._compiler.ir import StringAttr

    weights = plan_coreai_weights(program, plan)
    check_kmeans(weights)
    todo = [w for w in weights if w.assignment.scheme.compresses]
    for w in todo:
        with w.op.context:
            w.op.attributes[_MARK] = StringAttr.get(_key(w.assignment.scheme, w.assignment.group_channels))
    groups = sorted({(w.assignment.scheme, w.assignment.group_channels) for w in todo},
                    key=lambda g: (g[0].method != "palettize", g[0].token, g[1]))
    warnings: list[str] = []
    for scheme, group in groups:
        warnings += _compress_group(program, scheme, group)
    left = [w for w in todo if len(list(w.op.result.uses))]
    if left:
        a = left[0].assignment
        why = f" (coreai-opt: {warnings[-1]})" if warnings else ""
        raise CompressionError(f"coreai-opt left {len(left)} weight(s) uncompressed, e.g. {a.const_name!r} "
                               f"{list(a.shape)} ({a.scheme.token}){why}")
    for w in todo:  # the dense constants no op reads any more
        w.op.erase()
    return tuple(w.assignment for w in weights)
