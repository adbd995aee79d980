"""What a figure assumes, said where it is shown: how compressed weights are charged, and for a compressed
build, its attention precision (read back from the graph) and whether that precision is the presets' assumption
rather than something the write-up states."""

from __future__ import annotations

from analyzer.analysis.record import Analysis
from analyzer.convert.compress import PRESETS, preset_of

WEIGHT_CHARGE_TEXT = {
    "compressed": "compressed weights charged as stored (indices + LUT + scales) every token",
    "decompressed": "compressed weights charged dense (decompressed at load time) every token",
}


def compression_name(analysis: Analysis) -> str | None:
    """The build's compression preset (``top8``), its spec when it is not a preset, None for fp16."""

    if analysis.build is None or not analysis.build.spec.compression:
        return None
    spec = analysis.build.spec.compression
    return preset_of(spec, analysis.build.geometry.num_layers) or spec


def attention_text(analysis: Analysis) -> str:
    """``attention pal4 in layers 4-25; int8 in layers 0-3,26-29 (pal4 outside the promoted layers is assumed:
    the write-up does not state it)`` for a compressed build; ``""`` otherwise."""

    if not analysis.compression.compressed_count:
        return ""
    text = f"attention {analysis.compression.precision_text('attn') or 'not compressed'}"
    preset = PRESETS.get(compression_name(analysis) or "")
    if preset is not None:
        text += (f" ({preset.attention} outside the promoted layers is the preset's assumption: the write-up does "
                 f"not state it; '{preset.name},attn=SCHEME' changes it)")
    return text


def assumption_notes(analysis: Analysis) -> tuple[str, ...]:
    """One line per assumption behind the analysis's bytes per token."""
    notes = []
    name = compression_name(analysis)
    if name is not None or analysis.compression.compressed_count:
        notes.append(f"weights compressed{f' ({name})' if name else ''}: {attention_text(analysis)}")
        notes.append(WEIGHT_CHARGE_TEXT[analysis.account.weight_charge])
    return tuple(notes)
