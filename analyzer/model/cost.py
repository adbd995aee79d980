"""What a conversion will cost, estimated from the config alone, so absurd requests are refused in the
parent process in well under a second instead of after a child has started allocating.

Parameters are counted from the geometry (embedding, per layer q/k/v/o and a gated MLP, lm_head when
untied; norm scales and biases, < 0.1%, are left out). Memory, from measurements on this project's machine
(docs/measurements.md):

* a process floor: Python + torch + coremltools before any weight; a 2-layer tiny build peaked at 0.51 GB.
* per parameter, by build mode: a materialised build (fp32 torch weights, the traced copy and coremltools' fp16
  consts at once) of the full-size EXAONE 4.0 1.2B (1.28·10^9 parameters) peaked at 14.7 GB:
  (14.7 − 0.6) GB / 1.28·10^9 ≈ 11 bytes per parameter.
* the KV state ``2 × layers × Hkv × ctx × D × 2`` bytes (4 bytes an element for a Core AI build of fp32 weights,
  whose cache is fp32: ``backends.kv_dtype``): the structure build (30 layers, ctx 4096, 251 MB of
  KV, ~52·10^6 parameters) peaked at ≈ 1 GB, so one copy is live at the peak.

* an analysis-mode build (value-free weights: zero pages and zero-stride views, analyzer.convert.header_blobs) holds
  no weight values, so its memory barely moves with the parameter count: bench/results/fast.json measured the
  A/B (both variants, one process) of EXAONE 4.0 1.2B (W = 2.56 GB of fp16 weights) at 1.52 GB, Mistral-7B
  (W = 14.5 GB) 1.19 GB, Qwen2.5-7B (15.2 GB) 2.33 GB and Llama-3.1-8B (16.1 GB) 1.77 GB at ctx 4096: a floor of
  ≈ 1.2 GB (two processes: the build and its reduced-model equivalence worker) and ≈ 0.04 bytes per weight
  byte, 0.08 per parameter.

* a Core AI materialised build (``--backend coreai``; ``analyzer.convert.coreai_build``) holds the torch weights and
  the converted program's own copy at once, then (the torch copy gone) the program and ``save_asset``'s read of the
  saved bytecode: bench/results/coreai.json measured the full-size EXAONE 4.0 1.2B with fp16 weights (W = 2.56 GB)
  at 6.05 GB for the conversion child and 7.13 GB for the process tree (the build command and the reduced-model
  equivalence worker add ≈ 1.05 GB): (6.05 − 0.6) GB / 2.56 GB ≈ 2.1 bytes per weight byte, fp32 weights
  (``--weights fp32``) twice the weight bytes (the probe's fp32 conversion peaked at 10.8 GB, 2.1 per weight byte too).
  Its wall time, 161 s at load average 7-9 on the bench machine, is ≈ 20 s + 55 s per GB of weights.

Wall time per build (``wall_s``), fitted to the same bench (2 cores, load average 2-6 while measured): analysis
≈ 85 s + 2 s per GB of fp16 weights (graph work per layer, a trace whose GEMVs read zero pages); materialised
≈ 20 s + 14 s per GB (coremltools converts, copies and saves the values). A package is kept only by a
materialised build: ≈ the fp16 weight bytes.

The same estimate refuses impossible builds in the parent (``check_request``), tells the dashboard what a build or
an export costs before it starts, and reserves Ray ``memory`` for a sweep's builds, so a 16 GB worker never takes
two full-size materialised builds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from analyzer.errors import SourceError
from analyzer.model.backends import COREAI, COREML, DEFAULT_WEIGHTS, kv_dtype
from analyzer.model.sources import AttentionGeometry, geometry_of
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE

PROCESS_FLOOR_BYTES = 600_000_000  # a 2-layer tiny build peaked at 0.51 GB
MATERIALISED_BYTES_PER_PARAM = 11  # (14.7 − 0.6) GB / 1.28·10^9 parameters, full-size EXAONE 4.0 1.2B
ANALYSIS_BYTES_PER_PARAM = 0.08  # bench/results/fast.json: ≈ 0.04 bytes per fp16 weight byte (module docstring)
ANALYSIS_EXTRA_FLOOR_BYTES = 600_000_000  # the analysis A/B's ≈ 1.2 GB floor: build + reduced-model worker
BYTES_PER_PARAM_BY_MODE: dict[str, float] = {MATERIALISED_MODE: MATERIALISED_BYTES_PER_PARAM,
                                             ANALYSIS_MODE: ANALYSIS_BYTES_PER_PARAM}
EXTRA_FLOOR_BY_MODE: dict[str, int] = {MATERIALISED_MODE: 0, ANALYSIS_MODE: ANALYSIS_EXTRA_FLOOR_BYTES}
# (fixed seconds, seconds per GB of fp16 weights) per build, bench/results/fast.json (module docstring)
SECONDS_BY_MODE: dict[str, tuple[float, float]] = {MATERIALISED_MODE: (20.0, 14.0), ANALYSIS_MODE: (85.0, 2.0)}
KV_STATE_COPIES = 1  # the structure build's ≈ 1 GB peak leaves room for one
COREAI_BYTES_PER_WEIGHT_BYTE = 2.1  # (6.05 − 0.6) GB / 2.56 GB, full-size Core AI fp16 build (module docstring)
COREAI_EXTRA_FLOOR_BYTES = 1_050_000_000  # the build command and the equivalence worker beside the child
COREAI_SECONDS = (20.0, 55.0)  # (fixed, per GB of weights): 161 s for the full-size fp16 build
WEIGHT_BYTES = {"fp16": 2, "fp32": 4}  # the torch weights' dtype (analyzer.model.backends.WEIGHT_DTYPES)
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
    mode: str = MATERIALISED_MODE  # the build mode estimated (analyzer.model.spec.BUILD_MODES)
    wall_s: float = 0.0  # per build, on the bench machine
    package_bytes: int | None = None  # per build; None: an analysis-mode build keeps no package
    layers: int = 0
    builds: int = 1  # the builds of one request (an A/B's variants, converted by one child)
    weight_bytes: int = 0  # the torch weights' bytes (fp16: 2 per parameter, fp32: 4)

    @property
    def fits(self) -> bool:
        return self.peak_rss_bytes <= self.limit_bytes

    def summary(self, builds: int = 1) -> str:
        """``~3.5 min and ~7.2 GB of memory for 2 builds; a 2.6 GB package each`` (formatting at the edge)."""
        text = (f"~{builds * self.wall_s / 60:.1f} min and ~{self.peak_rss_bytes / 1e9:.1f} GB of memory for "
                f"{builds} {self.mode} build{'s' if builds != 1 else ''}")
        if self.package_bytes is not None:
            text += f"; a {self.package_bytes / 1e9:.1f} GB package each"
        return text


def count_params(g: AttentionGeometry, intermediate_size: int, tied_embeddings: bool) -> int:
    """Parameters of a GQA decoder with a gated MLP: embedding (+ untied lm_head), per layer q/k/v/o and
    gate/up/down. Norm scales and biases are < 0.1% and left out."""
    h, d = g.hidden_size, g.head_dim
    attn = h * g.num_q_heads * d * 2 + h * g.num_kv_heads * d * 2  # q and o; k and v
    mlp = 3 * h * intermediate_size
    embed = g.vocab_size * h * (1 if tied_embeddings else 2)
    return embed + g.num_layers * (attn + mlp)


def kv_state_bytes(g: AttentionGeometry, ctx: int, element_bytes: int = 2) -> int:
    return 2 * g.num_layers * g.num_kv_heads * ctx * g.head_dim * element_bytes


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

    return int(psutil.virtual_memory().total)


def estimate(config, ctx: int, mode: str = MATERIALISED_MODE, backend: str = COREML,
             weights: str = DEFAULT_WEIGHTS) -> BuildCost:
    """A conversion's cost for ``config`` (a transformers config) at ``ctx`` cache slots in build ``mode`` on
    ``backend`` with ``weights`` torch weights (a Core AI analysis-mode build costs what a Core ML one does)."""

    g = geometry_of(config)
    intermediate = int(getattr(config, "intermediate_size", 0) or 4 * g.hidden_size)
    params = count_params(g, intermediate, bool(getattr(config, "tie_word_embeddings", False)))
    kv = kv_state_bytes(g, ctx, WEIGHT_BYTES[kv_dtype(backend, weights)])  # kv_dtype is fp16 or fp32, always
    known = mode if mode in BYTES_PER_PARAM_BY_MODE else MATERIALISED_MODE  # unknown: over-reserve
    if backend == COREAI and known == MATERIALISED_MODE:
        w = WEIGHT_BYTES.get(weights, max(WEIGHT_BYTES.values())) * params
        peak = PROCESS_FLOOR_BYTES + COREAI_EXTRA_FLOOR_BYTES + round(w * COREAI_BYTES_PER_WEIGHT_BYTE) + kv
        return BuildCost(params, 2 * params, kv, peak, memory_limit_bytes(), known,
                         COREAI_SECONDS[0] + COREAI_SECONDS[1] * w / 1e9, w)
    peak = (PROCESS_FLOOR_BYTES + EXTRA_FLOOR_BY_MODE[known] + round(params * BYTES_PER_PARAM_BY_MODE[known])
            + KV_STATE_COPIES * kv)
    fixed_s, s_per_gb = SECONDS_BY_MODE[known]
    return BuildCost(params, 2 * params, kv, peak, memory_limit_bytes(), known, fixed_s + s_per_gb * 2 * params / 1e9,
                     2 * params if known == MATERIALISED_MODE else None)


def estimate_builds(specs) -> BuildCost:
    """The cost of one request: ``specs`` (``analyzer.model.spec.BuildSpec``) converted by one child."""
    from dataclasses import replace

    from analyzer.model.sources import load_config

    s = specs[0]
    c = estimate(load_config(s.source), s.ctx, s.build_mode, s.backend, s.weights)
    g = geometry_of(load_config(s.source))
    return replace(c, builds=len(specs), layers=g.num_layers, weight_bytes=WEIGHT_BYTES[s.weights] * c.params)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_request(config, ctx: int, force_ctx: bool = False, mode: str = MATERIALISED_MODE, backend: str = COREML,
                  weights: str = DEFAULT_WEIGHTS) -> BuildCost:
    """Refuse a conversion that cannot work before anything is allocated; return its estimated cost.

    Checks, in order: the hard ceilings (layers, hidden size, vocabulary, ctx), ctx against the model's
    ``max_position_embeddings`` (unless ``force_ctx``: RoPE positions past it are extrapolation), and the
    estimated peak memory against the limit."""

    g = geometry_of(config)
    cost = estimate(config, ctx, mode, backend, weights)
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
