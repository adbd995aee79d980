"""What a build will cost, said before it starts: wall time, peak memory and package size per build mode.

A linear model in the model's fp16 weight bytes W (2 bytes per parameter), fitted to what bench/fast.py measured
on the machine qfold is developed on (2 cores, 24 GiB; bench/results/fast.json, ``ratio`` and ``presets``):

* ``analysis``: the A/B's peak RSS barely moves with W (value-free weights); its time is graph work per
  layer plus a trace whose fp16 GEMVs read every weight once (zero pages, no memory);
* ``materialised``: coremltools holds the fp16 weights and copies of them while it converts and saves, so
  peak RSS and time grow with W; the package is W plus a few MB.

These are estimates for a quiet machine; a loaded one is slower (the bench records the load average).
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.build.builds import ANALYSIS_MODE, BUILD_MODES, MATERIALISED_MODE
from analyzer.errors import QfoldError

GB = 10**9


@dataclass(frozen=True, slots=True)
class CostModel:
    """wall = fixed_s + s_per_weight_gb · W/GB per build; peak RSS = base_bytes + rss_per_weight_byte · W."""

    fixed_s: float  # per build: imports, graph passes of a model this deep
    s_per_weight_gb: float  # per build
    base_rss_bytes: int
    rss_per_weight_byte: float
    source: str


# Fitted to bench/results/fast.json (2 cores, 24 GiB, load average 2-6 while measured), ctx 4096:
# analysis A/B (2 builds): exaone-4.0-1.2b W=2.56 GB 184 s / 1.52 GB; mistral-7b-v0.3 W=14.5 GB 191 s / 1.19 GB;
# qwen2.5-7b W=15.2 GB 186 s / 2.33 GB; llama-3.1-8b W=16.1 GB 269 s / 1.77 GB (peak RSS of the process tree).
# materialised (1 build, fp16 torch weights): exaone-4.0-1.2b W=2.56 GB 56 s / 4.61 GB, package 2.56 GB; the
# coremltools conversion holds the weights ~1.6x over. One materialised point: the slope assumes a 0.5 GB base.
COST_MODELS: dict[str, CostModel] = {
    ANALYSIS_MODE: CostModel(fixed_s=85.0, s_per_weight_gb=2.0, base_rss_bytes=int(1.2 * GB),
                             rss_per_weight_byte=0.04, source="bench/results/fast.json (ratio, presets)"),
    MATERIALISED_MODE: CostModel(fixed_s=20.0, s_per_weight_gb=14.0, base_rss_bytes=int(0.5 * GB),
                                 rss_per_weight_byte=1.6, source="bench/results/fast.json (materialised)"),
}


@dataclass(frozen=True, slots=True)
class BuildCost:
    build_mode: str
    builds: int
    weight_bytes: int  # fp16 bytes of the model's parameters
    wall_s: float  # all builds, one after another in one process
    peak_rss_bytes: int
    package_bytes: int | None  # per build; None: analysis mode keeps no package
    source: str

    def summary(self) -> str:
        """``~3.5 min and ~7.2 GB of memory for 2 builds; 2.6 GB package each`` (formatting at the edge)."""
        minutes = self.wall_s / 60
        text = (f"~{minutes:.1f} min and ~{self.peak_rss_bytes / GB:.1f} GB of memory for "
                f"{self.builds} build{'s' if self.builds != 1 else ''}")
        if self.package_bytes is not None:
            text += f"; a {self.package_bytes / GB:.1f} GB package each"
        return text


def estimate_cost(build_mode: str, weight_bytes: int, builds: int = 1) -> BuildCost:
    if build_mode not in BUILD_MODES:
        raise QfoldError(f"build mode {build_mode!r}: choose one of {', '.join(BUILD_MODES)}")
    if weight_bytes < 0 or builds < 1:
        raise QfoldError(f"cost of {builds} build(s) of {weight_bytes} weight bytes: both must be positive")
    m = COST_MODELS[build_mode]
    return BuildCost(
        build_mode=build_mode,
        builds=builds,
        weight_bytes=weight_bytes,
        wall_s=builds * (m.fixed_s + m.s_per_weight_gb * weight_bytes / GB),
        peak_rss_bytes=int(m.base_rss_bytes + m.rss_per_weight_byte * weight_bytes),
        package_bytes=weight_bytes if build_mode == MATERIALISED_MODE else None,
        source=m.source,
    )


def weight_bytes_of(source) -> int:
    """fp16 bytes of a source's parameters (tied tensors once), counted on transformers' own model built on
    the meta device: no memory, a second or two."""
    from analyzer.model.decode import parameter_count

    return 2 * parameter_count(source)


def analysis_weight_bytes(doc: dict) -> int:
    """fp16 bytes of the weight matrices an analysis document lists (its ``compression_report``: every
    matrix a linear, matmul or gather reads, at its dense fp16 size): the figure a materialised rebuild
    holds, within the norms and biases (a few MB). Older documents without the report: the weights a token
    reads (all of them but an untied embedding table)."""
    report = doc.get("compression_report") or {}
    dense = int(report.get("total", {}).get("dense_fp16_bytes", 0))
    return dense or int(doc.get("bytes", {}).get("bytes_per_token", {}).get("weights", 0))
