"""Every decode log row held against physics: the fastest a token can come is the bandwidth over the bytes every
token must read.

A decode step reads its weights and the KV positions it attends over, whatever else it does, so for a row whose
build and device are known::

    roof_bytes_per_token = weights + kv_read × row context ÷ build ctx
    roof_tok_per_s       = BW ÷ roof_bytes_per_token

``weights`` and ``kv_read`` are the build's byte account (:mod:`analyzer.analysis.accounting`), ``kv_read`` at the
build's own ctx (the static cache of a qfold build: ``spec.ctx``), scaled to the row's context (a runtime with a
growing cache reads only what is filled). Without a row context or a build ctx the KV read is taken as the graph
counts it; a build given as a bare number of bytes per token is its own roof bytes. ``BW`` is the cited profile
(:mod:`analyzer.predict.profiles`, measured or datasheet, never the write-up's assumed constant) of the row's
device whose unit matches the row's compute units (the Neural Engine's for ``cpuAndNeuralEngine``, the SoC's
memory for the GPU or CPU), else that device's highest; a device with no cited profile has no roof (None, and
the row says why).

Flags: ``above_roof`` when tok/s > roof: impossible on that memory system, so a wrong build label, a wrong device
or a broken measurement (the fit leaves such rows out unless told to keep them); ``far_below_roof`` when tok/s <
roof ÷ 10: an order of magnitude under the bytes' bound, the signature Core AI users reported of a miscompile
("~10× the weight-bandwidth floor" with corrupt output for large dynamic KV states).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from analyzer.measure.logs import Measurement
from analyzer.predict.profiles import DeviceProfile

if TYPE_CHECKING:
    from analyzer.analysis.record import Analysis

Flag = Literal["above_roof", "far_below_roof"]
FLAGS: tuple[Flag, ...] = ("above_roof", "far_below_roof")
FAR_BELOW_FACTOR = 10.0
"""``far_below_roof`` below roof ÷ this. Judgement from the report it answers: a row an order of magnitude under
the bandwidth bound is no longer "a slow kernel" but a graph doing ~10× the work it should."""

NEURAL_ENGINE_UNIT = "Neural Engine"
SOC_UNIT = "SoC unified memory"

MODEL_IDENTIFIERS: Mapping[str, str] = {
    # utsname.machine / hw.model → chip: john-rocky/coreai-model-zoo scripts/aggregate_bench.py, DEVICE_NAMES (read
    # 2026-12-05 in its fork MaTriXy/coreai-model-zoo), the device identifiers community Core AI benchmarks post.
    "iPhone13,1": "A14", "iPhone13,2": "A14", "iPhone13,3": "A14", "iPhone13,4": "A14", "iPhone14,4": "A15",
    "iPhone14,5": "A15", "iPhone14,2": "A15", "iPhone14,3": "A15", "iPhone14,6": "A15", "iPhone14,7": "A15",
    "iPhone14,8": "A15", "iPhone15,2": "A16", "iPhone15,3": "A16", "iPhone15,4": "A16", "iPhone15,5": "A16",
    "iPhone16,1": "A17 Pro", "iPhone16,2": "A17 Pro", "iPhone17,1": "A18 Pro", "iPhone17,2": "A18 Pro",
    "iPhone17,3": "A18", "iPhone17,4": "A18", "iPhone17,5": "A18", "iPhone18,1": "A19 Pro", "iPhone18,2": "A19 Pro",
    "iPhone18,3": "A19", "iPhone18,4": "A19 Pro", "iPhone19,7": "A20 Pro", "Mac16,7": "M4 Pro",
}
_CHIP = re.compile(r"(?<![A-Za-z0-9])([MA])([1-9][0-9]?)(?:\s*(Pro|Max|Ultra))?(?![A-Za-z0-9])", re.IGNORECASE)


def chip_of(label: str) -> str | None:
    """The Apple chip a device label names (``Apple M4 Pro (Mac mini 24 GB)`` → ``M4 Pro``, ``Mac16,7`` →
    ``M4 Pro`` by its model identifier), or None."""
    text = label.strip()
    if text in MODEL_IDENTIFIERS:
        return MODEL_IDENTIFIERS[text]
    m = _CHIP.search(text)
    if m is None:
        return None
    return f"{m[1].upper()}{m[2]}" + (f" {m[3].capitalize()}" if m[3] else "")


def unit_of(compute_units: str | None) -> str | None:
    """The profile unit a row's compute units read from: the Neural Engine's, the SoC memory's (GPU, CPU), or None
    when the row does not say or allows several (``ALL``: the device's highest is used)."""
    text = (compute_units or "").casefold()
    words = set(re.split(r"[^a-z0-9]+", text.replace("and", " ")))
    if not text.strip() or words & {"all", "auto", "default"}:
        return None
    if "neural" in text or words & {"ane", "ne"}:
        return NEURAL_ENGINE_UNIT
    if any(k in text for k in ("gpu", "metal", "mps", "cpu", "blas")):
        return SOC_UNIT
    return None


@dataclass(frozen=True, slots=True)
class BuildBytes:
    """What one token of a build must read: its weights and its KV read at its own ctx, or a given total."""

    label: str
    weights_bytes: int | None
    kv_read_bytes: int | None
    ctx: int | None
    given_bytes: int | None = None  # a build given as a number of bytes per token (no split)
    source: str = ""

    @classmethod
    def of_analysis(cls, label: str, analysis: Analysis) -> BuildBytes:
        b = analysis.bytes_per_token
        ctx = analysis.build.spec.ctx if analysis.build is not None else None
        return cls(label, b.weights, b.kv_read, ctx, None, analysis.file or "an analysis")

    def roof_bytes(self, context_length: int | None) -> tuple[int, str]:
        """(bytes, how) for a row at ``context_length``."""
        if self.given_bytes is not None:
            return self.given_bytes, "the build's bytes/token as given (no weights/KV split: not scaled by context)"
        assert self.weights_bytes is not None and self.kv_read_bytes is not None
        if context_length is None or self.ctx is None:
            why = "the row names no context" if context_length is None else "the build's ctx is unknown"
            return (self.weights_bytes + self.kv_read_bytes,
                    f"weights {self.weights_bytes:,} + kv_read {self.kv_read_bytes:,} as the graph counts it ({why})")
        kv = self.kv_read_bytes * context_length // self.ctx
        return (self.weights_bytes + kv, f"weights {self.weights_bytes:,} + kv_read {self.kv_read_bytes:,} × "
                f"{context_length:,} ÷ {self.ctx:,} = {kv:,}")


@dataclass(frozen=True, slots=True)
class RoofRow:
    """One log row against its roof. The roof fields are None when there is none, and ``why`` says why."""

    file: str
    line: int
    device: str
    build: str
    phase: str
    context_length: int | None
    tok_per_s: float
    roof_tok_per_s: float | None
    roof_bytes_per_token: int | None
    roof_bw_bytes_per_s: int | None
    roof_profile: str | None
    flags: tuple[Flag, ...]
    why: str

    @property
    def above_roof(self) -> bool:
        return "above_roof" in self.flags

    def describe_flags(self) -> str:
        """``above_roof: 197.71 tok/s > roof 163.2 tok/s = 400.00 GB/s (m1-max-soc) ÷ 2,450,000,000 bytes``."""
        if not self.flags or self.roof_tok_per_s is None:
            return ""
        sign = {"above_roof": ">", "far_below_roof": "<"}
        return "; ".join(
            f"{f}: {self.tok_per_s:,.2f} tok/s {sign[f]} "
            f"{'roof' if f == 'above_roof' else 'roof ÷ 10'} "
            f"{self.roof_tok_per_s / (1 if f == 'above_roof' else FAR_BELOW_FACTOR):,.2f} tok/s; roof = "
            f"{(self.roof_bw_bytes_per_s or 0) / 1e9:,.2f} GB/s ({self.roof_profile}) ÷ "
            f"{self.roof_bytes_per_token:,} bytes/token" for f in self.flags)


def device_profiles(device: str, profiles: Mapping[str, DeviceProfile]) -> list[DeviceProfile]:
    """The cited (measured or datasheet) profiles of the chip ``device`` names."""
    chip = chip_of(device)
    if chip is None:
        return []
    return [p for p in profiles.values() if p.kind != "assumed" and chip_of(p.device) == chip]


def pick_profile(device: str, compute_units: str | None,
                 profiles: Mapping[str, DeviceProfile]) -> tuple[DeviceProfile | None, str]:
    """The profile a row's roof uses, and how it was chosen (or why there is none)."""
    mine = device_profiles(device, profiles)
    chip = chip_of(device)
    if not mine:
        return None, (f"no cited bandwidth for {chip}" if chip else f"device {device!r} names no Apple chip qfold "
                      "has a cited bandwidth for")
    unit = unit_of(compute_units)
    matching = [p for p in mine if p.unit == unit]
    if matching:
        best = max(matching, key=lambda p: p.bytes_per_s)
        return best, f"{best.key}: {chip}'s {unit} profile for compute units {compute_units!r}"
    best = max(mine, key=lambda p: p.bytes_per_s)
    said = f"compute units {compute_units!r}" if compute_units else "no compute units"
    return best, f"{best.key}: {chip}'s highest cited bandwidth ({said})"


def check_row(m: Measurement, build: BuildBytes | None, profiles: Mapping[str, DeviceProfile]) -> RoofRow:
    def row(roof: float | None = None, n_bytes: int | None = None, profile: DeviceProfile | None = None,
            flags: tuple[Flag, ...] = (), why: str = "") -> RoofRow:
        return RoofRow(m.file_name, m.line, m.device, m.build, m.phase, m.context_length, m.tok_per_s, roof,
                       n_bytes, None if profile is None else profile.bytes_per_s,
                       None if profile is None else profile.key, flags, why)

    if m.phase != "decode":
        return row(why=f"a {m.phase} run: only decode runs are held against the bandwidth roof")
    if build is None:
        return row(why=f"build {m.build!r} is not known (map it to an analysis, or --build LABEL=PATH)")
    profile, how = pick_profile(m.device, m.compute_units, profiles)
    if profile is None:
        return row(why=how)
    n_bytes, bytes_how = build.roof_bytes(m.context_length)
    if n_bytes <= 0:
        return row(why=f"the build reads {n_bytes} bytes per token: no roof")
    roof = profile.bytes_per_s / n_bytes
    flags: tuple[Flag, ...] = ()
    if m.tok_per_s > roof:
        flags = ("above_roof",)
    elif m.tok_per_s < roof / FAR_BELOW_FACTOR:
        flags = ("far_below_roof",)
    return row(roof, n_bytes, profile, flags, f"{how}; bytes: {bytes_how}")


def check_rows(measurements: Sequence[Measurement], builds: Mapping[str, BuildBytes],
               profiles: Mapping[str, DeviceProfile]) -> tuple[RoofRow, ...]:
    """Every row against its roof, in the rows' order."""
    return tuple(check_row(m, builds.get(m.build), profiles) for m in measurements)


def without_impossible(measurements: Sequence[Measurement],
                       rows: Sequence[RoofRow]) -> tuple[tuple[Measurement, ...], int]:
    """The measurements whose row is not above its roof, and how many were left out."""
    kept = tuple(m for m, r in zip(measurements, rows, strict=True) if not r.above_roof)
    return kept, len(measurements) - len(kept)
