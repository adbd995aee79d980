"""Apply a compression plan to a converted model with ``coremltools.optimize.coreml``.

Which weight is which part is the naming rule of :func:`analyzer.analysis.compression.weight_part`, the same rule
that reads compressed weights back from the saved graph; compressed bytes are never estimated from the plan.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.analysis.compression import WEIGHT_PARAMS, weight_part
from analyzer.convert.quick_passes import quick_passes
from analyzer.model.compress_spec import CompressionError, CompressionPlan, Scheme

log = logging.getLogger(__name__)

# coremltools (models/neural_network/quantization_utils.py, _get_kmeans_lookup_table_and_weight) uses its
# bundled kmeans1d only for palettes over >= 10,000 fp16 weights; smaller ones need scikit-learn.
KMEANS1D_MIN_WEIGHTS = 10_000
# coremltools skips consts of <= weight_threshold elements (default 2048); qfold names every weight it
# wants compressed, so it asks for all of them and checks afterwards that none was skipped.
WEIGHT_THRESHOLD_ELEMENTS = 0
# One k-means worker: extra workers are processes that each hold a copy of the weights, and a full-size
# compression already peaks at ~7 GB (docs/measurements.md).
KMEANS_WORKERS = 1


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
        params = WEIGHT_PARAMS.get(op.type)
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
    return tuple(assign_weight(name, shape, consumers, plan, _output_channels(shape, consumers))
                 for name, (shape, consumers) in sorted(_const_weights(mlmodel.get_spec()).items()))


def assign_weight(name: str, shape: tuple[int, ...], consumers: Sequence[str], plan: CompressionPlan,
                  channels: int) -> WeightAssignment:
    """One weight's scheme under ``plan`` (both backends): its part from the naming rule, and for palettization
    the output channels per LUT: ``gcd(channels, group)`` when ``channels`` (the output channels the LUTs split)
    is not a multiple of the plan's group, logged."""
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
            f"weight {name!r} is ONE const read by both the embedding gather and the lm_head (tied "
            f"embeddings), so it cannot be embed={plan.embed.token} and lm_head={plan.lm_head.token}: untie "
            "the torch model (analyzer.model.decode.untie_embeddings_) and convert with keep_duplicate_consts=True "
            "(no common::const_deduplication), or give embed and lm_head the same scheme"
        )
    scheme = schemes.pop()
    group = math.gcd(channels, plan.group_channels) if scheme.method == "palettize" else plan.group_channels
    if scheme.method == "palettize" and group != plan.group_channels:
        log.warning("%s: %d output channels are not a multiple of group=%d; palettizing with %d channels per LUT",
                    name, channels, plan.group_channels, group)
    return WeightAssignment(name, parts, layer, tuple(shape), tuple(consumers), scheme, group)


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
    object per (scheme, group) so equal schemes share it. Used by :func:`compress_model` and by the value-free
    compression of an analysis-mode build (``analyzer.convert.header_blobs.compress_program``)."""
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
    quantization, each with per-const configs keyed by const name (``OptimizationConfig(op_name_configs=…)``).
    Returns the new MLModel; raises :class:`CompressionError` if coremltools skipped a weight the plan
    compresses."""
    import coremltools.optimize.coreml as cto

    assignments = plan_weights(mlmodel, plan)
    _check_kmeans(assignments)
    pal, lin = optimization_configs(assignments)
    with quick_passes():  # the same programs (analyzer.convert.quick_passes)
        if pal:
            mlmodel = cto.palettize_weights(mlmodel, cto.OptimizationConfig(op_name_configs=pal))
        if lin:
            mlmodel = cto.linear_quantize_weights(mlmodel, cto.OptimizationConfig(op_name_configs=lin))
    if pal or lin:
        check_all_compressed(assignments, _const_weights(mlmodel.get_spec()))
    return mlmodel
