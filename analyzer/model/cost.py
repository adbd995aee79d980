"""What a conversion request will cost (peak memory, wall time, the package it keeps), estimated from the config
alone, so a request that would not fit is refused in the parent in well under a second, and the pages can say
what a build or an export costs before it starts.

A request is what one conversion child converts: an A/B's variants share its process (``run_builds``). Its peak is
the summed resident memory of that child and the workers it starts (``analyzer.convert.jobs.TreeWatch``, which the
Builds page shows beside this estimate once the build is done), fitted per backend and build mode to the rows of
``bench/results/cost_model.json`` (``bench/cost_model.py run``: 2 layers to 70B, both backends and modes, decode,
prefill, decode+prefill and compressed, each in a fresh builds folder)::

    peak = floor + copies · (per_process + per_layer · layers + per_kv · KV state bytes) + per_weight · weight bytes

* ``copies``: how many variants convert at once. Core ML's analysis mode converts an A/B's second variant in a worker
  process beside the child (``analyzer.convert.modes._Workers``), except for a model no larger than the reduced model
  the equivalence check runs on, converted in turn in the child; a materialised build, and any Core AI build
  (``analyzer.convert.coreai_build.coreai_group``), converts its variants in turn.
* ``per_layer``: the traced graph and the MIL/MLIR program per decoder layer (it dominates at small widths: a
  2-layer and a 30-layer structure A/B differ by ~30 MB a layer while their weights are a few MB).
* ``per_kv``: the KV state the trace allocates (a fraction of it is touched: zero pages cost nothing).
* ``per_weight``: weight values held at once. Analysis mode holds none (value-free weights,
  ``analyzer.convert.header_blobs``); a materialised Core ML build holds the fp16 torch weights, the converted
  program's consts and, for its interpreter check, the saved package's; Core AI holds the exported program's copy.
  Compression (coremltools.optimize) and a prefill function add their own terms.

Each coefficient set states its error: the largest relative error over the rows it was fitted to
(:data:`FIT_ERROR`). A request is refused only when even the low end of its estimate (``peak · (1 − error)``) is
over the limit; between the two ends the pages say it may not fit. Wall time (``wall_s``) is fitted the same way
(``fixed + per_layer · layers · builds + per_weight_gb · GB``) and depends on the machine's load, which the rows
record: it is an order of magnitude for planning, not a promise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from analyzer.errors import SourceError
from analyzer.model.backends import COREAI, COREML, DEFAULT_WEIGHTS, kv_dtype
from analyzer.model.sources import AttentionGeometry, geometry_of, load_config
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE

WEIGHT_BYTES = {"fp16": 2, "fp32": 4}  # the torch weights' dtype (analyzer.model.backends.WEIGHT_DTYPES)
REDUCED = {"num_layers": 2, "hidden_size": 256, "vocab_size": 1000, "intermediate_size": 512}  # the equivalence
# check's reduced model (analyzer.convert.checks.reduced_source); a model no larger converts its variants in turn


FEATURES = ("floor", "copies", "layers", "kv", "scores", "weights", "compressed", "merged")
TIME_FEATURES = ("floor", "layers", "kv", "scores", "weights", "compressed", "merged")  # per build, in GB


@dataclass(frozen=True, slots=True)
class Coefficients:
    """One backend and build mode's fit: bytes of peak RSS per unit of each of :data:`FEATURES`, CPU seconds per
    unit of each of :data:`TIME_FEATURES`, and ``error``: the largest relative error of the peak on the bench rows
    it was fitted to (their earlier runs included)."""

    peak: dict[str, float]
    cpu: dict[str, float]
    error: float
    rows: int  # how many bench rows (with their earlier runs) it was fitted to


# <!-- bench/cost_model.py fit --write: generated from bench/results/cost_model.json -->
FIT: dict[tuple[str, str], Coefficients] = {
    (COREAI, ANALYSIS_MODE): Coefficients(
        peak={"floor": 8.544e+08, "copies": 0, "layers": 2.19e+07, "kv": 0, "scores": 0, "weights": 0.07749,
              "compressed": 0, "merged": 0},
        cpu={"floor": 6.201, "layers": 0.1127, "kv": 64.3, "scores": 0, "weights": 0, "compressed": 0, "merged":
             0},
        error=0.400, rows=8),
    (COREAI, MATERIALISED_MODE): Coefficients(
        peak={"floor": 5.716e+08, "copies": 0, "layers": 2.19e+07, "kv": 0, "scores": 0, "weights": 1.961,
              "compressed": 0, "merged": 0},
        cpu={"floor": 7.89, "layers": 0, "kv": 0, "scores": 0, "weights": 14.35, "compressed": 0, "merged": 0},
        error=0.130, rows=3),
    (COREML, ANALYSIS_MODE): Coefficients(
        peak={"floor": 0, "copies": 5.992e+08, "layers": 4.072e+06, "kv": 0.1274, "scores": 0.5551, "weights": 0,
              "compressed": 0, "merged": 0},
        cpu={"floor": 3.391, "layers": 0.338, "kv": 6.862, "scores": 0, "weights": 0, "compressed": 0, "merged":
             0},
        error=0.186, rows=8),
    (COREML, MATERIALISED_MODE): Coefficients(
        peak={"floor": 4.347e+08, "copies": 0, "layers": 2.939e+07, "kv": 0, "scores": 1.06, "weights": 1.287,
              "compressed": 2.592, "merged": 2.195},
        cpu={"floor": 0.8, "layers": 1.473, "kv": 0, "scores": 26.62, "weights": 0, "compressed": 68.71,
             "merged": 77.7},
        error=0.130, rows=7),
}
# <!-- end of bench/cost_model.py fit -->
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
    """One request's size, estimated from the config: parameters, fp16 weight and KV-state bytes, and the peak
    resident memory and wall time of the conversion (all its builds together)."""

    params: int
    weight_bytes_fp16: int
    kv_state_bytes: int
    peak_rss_bytes: int
    limit_bytes: int
    mode: str = MATERIALISED_MODE  # the build mode estimated (analyzer.model.spec.BUILD_MODES)
    wall_s: float = 0.0  # the request's wall time on an idle machine like the bench's (its CPU time ÷ processes)
    package_bytes: int | None = None  # per build; None: an analysis-mode build keeps no package
    layers: int = 0
    builds: int = 1  # the builds of the request (an A/B's variants, converted by one child)
    weight_bytes: int = 0  # the torch weights' bytes (fp16: 2 per parameter, fp32: 4)
    error: float = 0.0  # the fit's largest relative error on the bench rows
    backend: str = COREML
    cpu_s: float = 0.0  # CPU seconds of the conversion's processes (``wall_s``: on an idle machine, at once)

    @property
    def low_bytes(self) -> int:
        return round(self.peak_rss_bytes * (1 - self.error))

    @property
    def high_bytes(self) -> int:
        return round(self.peak_rss_bytes * (1 + self.error))

    @property
    def fits(self) -> bool:
        """Refused only when even the low end of the estimate is over the limit."""
        return self.low_bytes <= self.limit_bytes

    @property
    def may_not_fit(self) -> bool:
        return self.fits and self.high_bytes > self.limit_bytes

    @property
    def error_text(self) -> str:
        """``within ±25% of the measured peaks it was fitted to (bench/results/cost_model.json)``."""
        return f"within ±{self.error:.0%} of the measured peaks it was fitted to (bench/results/cost_model.json)"

    def summary(self) -> str:
        """``~3.5 min on an idle machine and ~7.2 GB of memory for 2 materialised builds; a 2.6 GB package each``
        (formatting at the edge)."""
        minutes = self.wall_s / 60
        took = (f"~{minutes:.1f} min" if minutes >= 1 else f"~{self.wall_s:.0f} s") + " on an idle machine"
        text = (f"{took} and ~{self.peak_rss_bytes / 1e9:.1f} GB of memory for {self.builds} {self.mode} "
                f"build{'s' if self.builds != 1 else ''}")
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


def _params(config, g: AttentionGeometry) -> int:
    intermediate = int(getattr(config, "intermediate_size", 0) or 4 * g.hidden_size)
    return count_params(g, intermediate, bool(getattr(config, "tie_word_embeddings", False)))


def _reduced_size(config, g: AttentionGeometry) -> bool:
    """Whether the model is no larger than the equivalence check's reduced model (its variants convert in turn)."""
    reduced = AttentionGeometry(g.model_type, REDUCED["num_layers"], g.num_q_heads, g.num_kv_heads, g.head_dim,
                                REDUCED["hidden_size"], REDUCED["vocab_size"])
    return _params(config, g) <= count_params(reduced, REDUCED["intermediate_size"], False)


def request_features(config, ctx: int, mode: str = MATERIALISED_MODE, backend: str = COREML,
                     weights: str = DEFAULT_WEIGHTS, *, builds: int = 1, phase: str = "decode", q_len: int = 1,
                     compressed: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """What the peak and the CPU time of a request are linear in (the module docstring): ``floor`` 1; ``copies``, the
    processes converting variants at once (each holds the imported libraries' working set); ``layers`` and ``kv``
    (its KV state bytes) times those processes; ``scores``, a prefill call's attention scores
    (prompt tokens × ctx × query heads × layers × 4 bytes) at once; ``weights``, the torch weights' bytes (held as
    values by a materialised build; in analysis mode coreai-torch makes each value-free view contiguous as it
    converts, Core ML holds none: the fit says which); ``compressed``, the fp16 weight bytes coremltools.optimize
    compresses; ``merged``, the weight bytes of a decode+prefill package whose two functions' programs are merged into
    one (both held while the shared weights are stored once)."""
    g = geometry_of(config)
    params = _params(config, g)
    kv = kv_state_bytes(g, ctx, WEIGHT_BYTES[kv_dtype(backend, weights)])
    w = WEIGHT_BYTES.get(weights, max(WEIGHT_BYTES.values())) * params
    # Core ML analysis mode: the child and a worker per spare core (analyzer.convert.modes._Workers), min(builds,
    # cores) at once; Core AI converts an A/B's variants in turn (analyzer.convert.coreai_build.coreai_group)
    parallel = mode == ANALYSIS_MODE and backend == COREML and not _reduced_size(config, g)
    copies = min(builds, os.cpu_count() or 1) if parallel else 1
    scores = (q_len if phase != "decode" else 0) * ctx * g.num_q_heads * g.num_layers * 4
    peak = {"floor": 1.0, "copies": copies, "layers": copies * g.num_layers, "kv": copies * kv,
            "scores": copies * scores, "weights": w,
            "compressed": 2 * params if compressed else 0.0, "merged": w if phase == "decode+prefill" else 0.0}
    cpu = {"floor": 1.0, "layers": builds * g.num_layers, "kv": builds * kv / 1e9, "scores": builds * scores / 1e9,
           "weights": builds * w / 1e9 if mode == MATERIALISED_MODE else 0.0, "compressed": peak["compressed"] / 1e9,
           "merged": peak["merged"] / 1e9}
    return peak, cpu


def estimate(config, ctx: int, mode: str = MATERIALISED_MODE, backend: str = COREML, weights: str = DEFAULT_WEIGHTS,
             *, builds: int = 1, phase: str = "decode", q_len: int = 1, compressed: bool = False) -> BuildCost:
    """The cost of converting ``builds`` variants of ``config`` (a transformers config) at ``ctx`` cache slots in
    build ``mode`` on ``backend`` with ``weights`` torch weights, in one child; a prefill (or decode+prefill) build of
    ``q_len`` prompt tokens per call; ``compressed`` with coremltools.optimize."""
    g = geometry_of(config)
    params = _params(config, g)
    known = mode if mode in (ANALYSIS_MODE, MATERIALISED_MODE) else MATERIALISED_MODE  # unknown: over-reserve
    c = FIT[(backend if backend in (COREML, COREAI) else COREML, known)]
    peak_f, cpu_f = request_features(config, ctx, known, backend, weights, builds=builds, phase=phase, q_len=q_len,
                                     compressed=compressed)
    peak = sum(c.peak.get(k, 0.0) * v for k, v in peak_f.items())
    cpu = sum(c.cpu.get(k, 0.0) * v for k, v in cpu_f.items())
    w = WEIGHT_BYTES.get(weights, max(WEIGHT_BYTES.values())) * params
    kv = kv_state_bytes(g, ctx, WEIGHT_BYTES[kv_dtype(backend, weights)])
    parallel = peak_f["layers"] / max(g.num_layers, 1)  # the processes converting at once
    return BuildCost(params, 2 * params, kv, round(peak), memory_limit_bytes(), known, cpu / parallel,
                     w if known == MATERIALISED_MODE else None, g.num_layers, builds, w, c.error, backend, cpu)


def estimate_builds(specs) -> BuildCost:
    """The cost of one request: ``specs`` (``analyzer.model.spec.BuildSpec`` of one source, as an A/B is) converted
    by one child."""
    s = specs[0]
    return estimate(load_config(s.source), s.ctx, s.build_mode, s.backend, s.weights, builds=len(specs),
                    phase=s.phase, q_len=s.q_len, compressed=s.compression is not None)


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB"


def check_request(config, ctx: int, force_ctx: bool = False, mode: str = MATERIALISED_MODE, backend: str = COREML,
                  weights: str = DEFAULT_WEIGHTS, *, builds: int = 1, phase: str = "decode", q_len: int = 1,
                  compressed: bool = False) -> BuildCost:
    """Refuse a conversion that cannot work before anything is allocated; return its estimated cost.

    Checks, in order: the hard ceilings (layers, hidden size, vocabulary, ctx), ctx against the model's
    ``max_position_embeddings`` (unless ``force_ctx``: RoPE positions past it are extrapolation), and the
    estimated peak memory against the limit: refused only when even the estimate's low end is over it."""

    g = geometry_of(config)
    cost = estimate(config, ctx, mode, backend, weights, builds=builds, phase=phase, q_len=q_len,
                    compressed=compressed)
    size = (f"estimated peak memory {_gb(cost.peak_rss_bytes)} (at least {_gb(cost.low_bytes)}, the fit being "
            f"within ±{cost.error:.0%}) for {cost.builds} {cost.mode} build(s) of {cost.params:,} parameters and a "
            f"KV state of {_gb(cost.kv_state_bytes)}; the limit is {_gb(cost.limit_bytes)}, ${MEMORY_LIMIT_ENV} or "
            "this machine's memory")
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
