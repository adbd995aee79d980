"""Device profiles: a named bandwidth (and, where a figure is published, a peak FLOP/s) for predictions, each
with its source and what kind of figure it is.

A profile is what a sweep's ``predicted_tok_per_s`` column divides by (tok/s ≈ BW ÷ bytes/token), and the two
roofs of the roofline (:mod:`analyzer.predict.roofline`: time per call = max(bytes ÷ BW, FLOPs ÷ peak)). Three
kinds, never mixed up in a label, for each of the two figures:

``measured``   an engine's achieved bandwidth in a published benchmark (e.g. ANEMLL-Bench's Neural Engine runs)
``datasheet``  the SoC's peak DRAM bandwidth as the vendor announced it ("up to"); no engine reaches it alone
``assumed``    a model constant somebody chose (the write-up's 55,900 MB/s)

The published figures live in ``analyzer/predict/device_profiles.csv`` (one row per device and engine, each figure with
its source, URL and the date it was read; see ``examples/README.md``); the write-up's constant comes from
``analyzer.predict.bandwidth_model.BANDWIDTH_PRESETS``. ``--profiles FILE`` reads another file of the same columns. The
peak FLOP/s columns (``flops_per_s, flops_kind, flops_source, flops_url``) are optional: a file without them, or a
row with ``flops_per_s`` empty, gives a profile with a bandwidth only (no compute roof).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from analyzer.errors import QfoldError
from analyzer.predict.bandwidth_model import BANDWIDTH_PRESETS, DEFAULT_BANDWIDTH_PRESET

ProfileKind = Literal["measured", "datasheet", "assumed"]
PROFILE_KINDS: tuple[str, ...] = ("measured", "datasheet", "assumed")
PROFILE_COLUMNS: tuple[str, ...] = ("key", "device", "unit", "kind", "bytes_per_s", "source", "url", "read_on", "note")
# Optional: the engine's peak FLOP/s, with its own kind and source (a figure from another publication than the
# bandwidth's).
FLOPS_COLUMNS: tuple[str, ...] = ("flops_per_s", "flops_kind", "flops_source", "flops_url")
EXAMPLE_PROFILES = Path(__file__).resolve().parent / "device_profiles.csv"  # package data: installed with qfold
DEFAULT_PROFILE = DEFAULT_BANDWIDTH_PRESET.key


class ProfileError(QfoldError):
    """A device-profile file or key cannot be used."""

@dataclass(frozen=True, slots=True)
class DeviceProfile:
    key: str
    device: str
    unit: str  # "Neural Engine", "SoC unified memory", ...
    kind: ProfileKind
    bytes_per_s: int
    source: str
    url: str = ""
    read_on: str = ""
    note: str = ""
    flops_per_s: int | None = None  # peak FLOP/s of the engine; None: no published figure (no compute roof)
    flops_kind: ProfileKind | None = None
    flops_source: str = ""
    flops_url: str = ""

    @property
    def label(self) -> str:
        text = f"{self.device}, {self.unit}: {self.bytes_per_s / 1e9:,.2f} GB/s ({self.kind})"
        if self.flops_per_s is not None:
            text += f", {self.flops_per_s / 1e12:,.2f} TFLOP/s ({self.flops_kind})"
        return text

    @property
    def has_compute_roof(self) -> bool:
        return self.flops_per_s is not None


def _writeup_profiles() -> dict[str, DeviceProfile]:
    return {p.key: DeviceProfile(p.key, p.label.split(",")[0], "assumed model constant", "assumed", p.bytes_per_s,
                                 p.source, note=p.caveat)
            for p in BANDWIDTH_PRESETS.values()}


def parse_profiles(text: str, name: str) -> dict[str, DeviceProfile]:
    """Profiles from CSV text with ``PROFILE_COLUMNS``; every error names the file, line and column."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    missing = [c for c in PROFILE_COLUMNS if c not in header]
    if missing:
        raise ProfileError(f"{name}: missing column(s) {', '.join(missing)} (expected {', '.join(PROFILE_COLUMNS)})")
    out: dict[str, DeviceProfile] = {}
    for row in reader:
        line = reader.line_num
        if None in row or any(v is None for v in row.values()):
            raise ProfileError(f"{name}:{line}: expected {len(header)} fields")
        key = row["key"].strip()
        if not key or key in out:
            raise ProfileError(f"{name}:{line}, column 'key', value {key!r}: empty or given twice")
        if row["kind"] not in PROFILE_KINDS:
            raise ProfileError(f"{name}:{line}, column 'kind', value {row['kind']!r}: "
                               f"choose {', '.join(PROFILE_KINDS)}")
        text_bw = row["bytes_per_s"].strip()
        if not text_bw.isdigit() or int(text_bw) <= 0:
            raise ProfileError(f"{name}:{line}, column 'bytes_per_s', value {text_bw!r}: "
                               "a whole number of bytes per second > 0 (no units, no separators)")
        if not row["source"].strip():
            raise ProfileError(f"{name}:{line}, column 'source': every figure needs its source")
        out[key] = DeviceProfile(key, row["device"], row["unit"], row["kind"], int(text_bw),  # type: ignore[arg-type]
                                 row["source"], row["url"], row["read_on"], row["note"],
                                 *_flops_fields(row, f"{name}:{line}"))
    return out


def _flops_fields(row: dict[str, str], where: str) -> tuple[int | None, str | None, str, str]:
    """The optional peak-FLOP/s columns of a row: all empty (or absent), or a figure with its kind and source."""
    text = (row.get("flops_per_s") or "").strip()
    if not text:
        return None, None, "", ""
    if not text.isdigit() or int(text) <= 0:
        raise ProfileError(f"{where}, column 'flops_per_s', value {text!r}: a whole number of FLOP per second > 0 "
                           "(no units, no separators), or empty for no compute roof")
    kind = (row.get("flops_kind") or "").strip()
    if kind not in PROFILE_KINDS:
        raise ProfileError(f"{where}, column 'flops_kind', value {kind!r}: choose {', '.join(PROFILE_KINDS)}")
    source = (row.get("flops_source") or "").strip()
    if not source:
        raise ProfileError(f"{where}, column 'flops_source': a peak FLOP/s figure needs its source")
    return int(text), kind, source, (row.get("flops_url") or "").strip()


def load_profiles(path: str | Path | None = None) -> Mapping[str, DeviceProfile]:
    """The write-up's assumed constant plus every profile in ``path`` (default: the cited examples file)."""
    file = Path(path) if path is not None else EXAMPLE_PROFILES
    profiles = _writeup_profiles()
    if path is not None or file.is_file():
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as e:
            raise ProfileError(f"{file}: cannot read device profiles ({e.strerror or e})") from e
        for key, profile in parse_profiles(text, str(file)).items():
            if key in profiles:
                raise ProfileError(f"{file}: profile key {key!r} is already a built-in preset")
            profiles[key] = profile
    return MappingProxyType(profiles)


def get_profile(key: str, profiles: Mapping[str, DeviceProfile] | None = None) -> DeviceProfile:
    profiles = load_profiles() if profiles is None else profiles
    try:
        return profiles[key]
    except KeyError:
        raise ProfileError(f"--device {key!r}: no such device profile; choose one of {', '.join(profiles)}") from None
