""""Rebuild for real": the full-size build of an analysis someone is looking at.

A structure or few-layer build keeps the attention geometry and shrinks the rest (``STRUCTURE_OVERRIDES``,
``num_hidden_layers=N``); its full-size counterpart is the same source, variant, KV mode, ctx and compression with
those overrides dropped::

    exaone-4.0-1.2b · qfold · ctx 256 · 2 layers, structure   →   exaone-4.0-1.2b · qfold · ctx 256 · full size

The source is resolved again from where it came from (a preset by name, a folder or config.json by path): the
stored config already has the overrides applied, so the original sizes can only come from there.
"""

from __future__ import annotations

from pathlib import Path

from analyzer.convert.compress import canonical_spec
from analyzer.errors import QfoldError
from analyzer.model.compress_spec import preset_of
from analyzer.model.sources import STRUCTURE_OVERRIDES, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec

SHRINKING_KEYS = (*(o.split("=", 1)[0] for o in STRUCTURE_OVERRIDES), "num_hidden_layers")


def full_size_spec(spec: BuildSpec, build_mode: str = ANALYSIS_MODE) -> BuildSpec:
    """The full-size build of ``spec`` (QfoldError naming why not, e.g. an uploaded config that is gone), in
    analysis mode unless asked otherwise: value-free weights, ≈ 1-2 GB whatever the model's size."""
    keep = tuple(o for o in spec.source.overrides if o.split("=", 1)[0] not in SHRINKING_KEYS)
    src = spec.source
    if src.kind != "preset" and not Path(src.ref).exists():
        raise QfoldError(f"{src.label}: its config ({src.ref}) is no longer on this server; upload it again on the "
                         "Builds page to build it at full size")
    source = resolve_source(src.ref, keep, src.seed)
    compression = spec.compression
    if compression:
        layers = src.config_dict.get("num_hidden_layers", 0)
        preset = preset_of(compression, layers if isinstance(layers, int) else 0)
        compression = canonical_spec(preset or compression, source.config_dict["num_hidden_layers"])
    return BuildSpec(source, spec.variant, spec.kv_mode, spec.ctx, compression, build_mode=build_mode)
