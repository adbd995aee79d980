"""What a conversion will cost, estimated from the config alone, so absurd requests are refused in the
parent process in well under a second instead of after a child has started allocating.

Parameters are counted from the geometry (embedding, per layer q/k/v/o and a gated MLP, lm_head when
untied); the estimate is deliberately simple and errs high. Memory per mode, from measurements on this
project's machine (design.md, "Facts measured" and "Second stage"):

* materialised build (real fp32 torch weights, traced, converted to fp16, saved): the full-size
  EXAONE 4.0 1.2B (1.28 B parameters) peaked at 14.7 GB, ≈ 11.5 bytes per parameter, on top of a
  ≈ 1 GB floor (the structure config, same graph with tiny weights, peaks at ≈ 1 GB).
* KV state: ``2 × layers × Hkv × ctx × D × 2`` bytes (fp16 K and V), held by the torch module, the
  traced graph and the converter: counted three times.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from analyzer.errors import SourceError
from analyzer.model.sources import AttentionGeometry

# Bytes of peak RSS per parameter of a materialised conversion: 14.7 GB / 1.28 B parameters (design.md).
MATERIALISED_BYTES_PER_PARAM = 11.5
# The peak of a conversion whose weights are negligible (structure config, ctx 4096: ≈ 1 GB, design.md).
CONVERSION_FLOOR_BYTES = 1_000_000_000
# Copies of the KV state alive at the peak: the torch buffers, the traced graph's, the converter's.
KV_STATE_COPIES = 3
# Hard ceilings, independent of memory. The largest published decoders have ~126 layers (Llama 3.1 405B),
# hidden 16,384, vocabularies up to 262,144 (Gemma 3) and contexts up to 131,072 positions among qfold's
# presets; the ceilings leave 4-8x headroom and keep the MIL program (≈ 150 ops per layer) and the static
# cache convertible.
MAX_LAYERS = 1024
MAX_HIDDEN = 131_072
MAX_VOCAB = 4_194_304
MAX_CTX = 262_144
# Environment override of the memory limit (bytes); default: this machine's physical memory.
MEMORY_LIMIT_ENV = "QFOLD_MAX_BUILD_BYTES"


@dataclass(frozen=True, slots=True)
class BuildCost:
    """A conversion's size, estimated from the config: parameters, fp16 weight and KV-state bytes, and the
    peak resident memory the conversion is expected to reach."""

    params: int
    weight_bytes_fp16: int
    kv_state_bytes: int
    peak_rss_bytes: int
    limit_bytes: int

    @property
    def fits(self) -> bool:
        return self.peak_rss_bytes <= self.limit_bytes


def count_params(g: AttentionGeometry, intermediate_size: int, tied_embeddings: bool) -> int:
    """Parameters of a GQA decoder with a gated MLP: embedding (+ untied lm_head), per layer q/k/v/o and
    gate/up/down. Norm scales and biases are < 0.1% and left out."""
    h, d = g.hidden_size, g.head_dim
    attn = h * g.num_q_heads * d * 2 + h * g.num_kv_heads * d * 2  # q and o; k and v
    mlp = 3 * h * intermediate_size
    embed = g.vocab_size * h * (1 if tied_embeddings else 2)
    return embed + g.num_layers * (attn + mlp)


def kv_state_bytes(g: AttentionGeometry, ctx: int) -> int:
    return 2 * g.num_layers * g.num_kv_heads * ctx * g.head_dim * 2


def memory_limit_bytes() -> int:
    """``$QFOLD_MAX_BUILD_BYTES`` if set, else the machine's physical memory."""
    text = os.environ.get(MEMORY_LIMIT_ENV)
    if text:
        try:
            value = int(float(text))
        except ValueError:
            raise SourceError(f"${MEMORY_LIMIT_ENV}={text!r}: expected a number of bytes") from None
        if value <= 0:
            raise SourceError(f"${MEMORY_LIMIT_ENV}={text!r}: must be positive")
        return value
    import psutil

    return int(psutil.virtual_memory().total)


def estimate(config, ctx: int) -> BuildCost:
    """The materialised conversion's cost for ``config`` (a transformers config) at ``ctx`` cache slots."""
    from analyzer.model.sources import geometry_of

    g = geometry_of(config)
    intermediate = int(getattr(config, "intermediate_size", 0) or 4 * g.hidden_size)
    params = count_params(g, intermediate, bool(getattr(config, "tie_word_embeddings", False)))
    kv = kv_state_bytes(g, ctx)
    peak = CONVERSION_FLOOR_BYTES + round(params * MATERIALISED_BYTES_PER_PARAM) + KV_STATE_COPIES * kv
    return BuildCost(params, 2 * params, kv, peak, memory_limit_bytes())


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_request(config, ctx: int, force_ctx: bool = False) -> BuildCost:
    """Refuse a conversion that cannot work before anything is allocated; return its estimated cost.

    Checks, in order: the hard ceilings (layers, hidden size, vocabulary, ctx), ctx against the model's
    ``max_position_embeddings`` (unless ``force_ctx``: RoPE positions past it are extrapolation), and the
    estimated peak memory against the limit."""
    from analyzer.model.sources import geometry_of

    g = geometry_of(config)
    cost = estimate(config, ctx)
    size = (f"estimated peak memory {_gb(cost.peak_rss_bytes)} for {cost.params:,} parameters and a KV state "
            f"of {_gb(cost.kv_state_bytes)}; the limit is {_gb(cost.limit_bytes)}, ${MEMORY_LIMIT_ENV} or this "
            "machine's memory")
    for name, value, ceiling in (("num_hidden_layers", g.num_layers, MAX_LAYERS),
                                 ("hidden_size", g.hidden_size, MAX_HIDDEN),
                                 ("vocab_size", g.vocab_size, MAX_VOCAB),
                                 ("ctx", ctx, MAX_CTX)):
        if value > ceiling:
            raise SourceError(f"{name}={value:,} is beyond qfold's ceiling of {ceiling:,} ({size})")
    max_pos = getattr(config, "max_position_embeddings", None)
    if isinstance(max_pos, int) and ctx > max_pos and not force_ctx:
        raise SourceError(
            f"ctx={ctx:,} is beyond the model's max_position_embeddings={max_pos:,}; positions past it are "
            "not what the model was trained for (--force-ctx if you mean it)"
        )
    if not cost.fits:
        raise SourceError(f"this conversion does not fit: {size}")
    return cost
