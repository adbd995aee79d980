"""Weight compression: the spec grammar and presets (:mod:`.spec`) and their application with
``coremltools.optimize.coreml`` (:mod:`.apply`). What a saved graph stores is read back by
:mod:`analyzer.analysis.compression`."""

from analyzer.convert.compress.apply import (
    KMEANS1D_MIN_WEIGHTS,
    WeightAssignment,
    check_all_compressed,
    compress_model,
    optimization_configs,
    plan_weights,
)
from analyzer.model.compress_spec import (
    ASSUMED_ATTENTION,
    DEFAULT_GROUP_CHANNELS,
    LAYER_PARTS,
    PALETTE_BITS,
    PARTS,
    PRESETS,
    CompressionError,
    CompressionPlan,
    Preset,
    Scheme,
    canonical_spec,
    format_layers,
    needs_untie,
    parse_layers,
    parse_scheme,
    parse_spec,
    preset_of,
)

__all__ = [
    "ASSUMED_ATTENTION",
    "DEFAULT_GROUP_CHANNELS",
    "KMEANS1D_MIN_WEIGHTS",
    "LAYER_PARTS",
    "PALETTE_BITS",
    "PARTS",
    "PRESETS",
    "CompressionError",
    "CompressionPlan",
    "Preset",
    "Scheme",
    "WeightAssignment",
    "canonical_spec",
    "check_all_compressed",
    "compress_model",
    "format_layers",
    "needs_untie",
    "optimization_configs",
    "parse_layers",
    "parse_scheme",
    "parse_spec",
    "plan_weights",
    "preset_of",
]
