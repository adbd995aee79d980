"""The one bandwidth every prediction uses: the A/B headline, the Bandwidth page's verdicts and residuals, and the
HTML report all read the same :class:`BandwidthSetting`, so no two of them can disagree.

Three sources, each saying what it is:

``profile``  a cited device profile (``analyzer.predict.profiles``: the write-up's assumed constant, published
             Neural Engine measurements, datasheet figures), the default being the write-up's 55,900 MB/s
``typed``    a value typed exactly, in MB/s (1 MB = 10^6 bytes)
``fitted``   fitted on the loaded device logs (``analyzer.predict.fit``): per device on the Bandwidth page; for a
             single A/B prediction, the fit of the device that measured the pair, else the first usable fit

A setting round-trips through one short text (``profile:m1-ane``, ``typed:55900``, ``fitted``) so a link can
carry it (the dashboard keeps it in the URL's ``bw`` parameter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from analyzer import fmt
from analyzer.fmt import MB
from analyzer.predict.bandwidth_model import check_bw
from analyzer.predict.fit import BandwidthFit
from analyzer.predict.profiles import DEFAULT_PROFILE, DeviceProfile

BandwidthSource = Literal["profile", "typed", "fitted"]
SOURCES: tuple[BandwidthSource, ...] = ("profile", "typed", "fitted")
SOURCE_NAMES: dict[str, str] = {"profile": "a device profile", "typed": "a value I type",
                                "fitted": "fitted on the loaded logs"}


class BandwidthSettingError(ValueError):
    """A bandwidth setting text that names no source, profile or valid value."""

@dataclass(frozen=True, slots=True)
class BandwidthSetting:
    source: BandwidthSource = "profile"
    profile_key: str = DEFAULT_PROFILE
    typed_mb_per_s: float = 55_900.0  # MB/s as typed; 1 MB = 10^6 bytes

    def to_text(self) -> str:
        if self.source == "profile":
            return f"profile:{self.profile_key}"
        if self.source == "typed":
            value = self.typed_mb_per_s
            return f"typed:{int(value) if float(value).is_integer() else value}"
        return "fitted"

    @classmethod
    def from_text(cls, text: str, profiles: Mapping[str, DeviceProfile]) -> BandwidthSetting:
        """Parse :meth:`to_text`'s form; an unknown profile, a bad number or an out-of-range bandwidth raises
        :class:`BandwidthSettingError` naming the value."""
        source, _, value = text.strip().partition(":")
        if source == "fitted" and not value:
            return cls(source="fitted")
        if source == "profile":
            if value not in profiles:
                raise BandwidthSettingError(f"bandwidth profile {value!r}: no such device profile")
            return cls(source="profile", profile_key=value)
        if source == "typed":
            try:
                mb_per_s = float(value)
                check_bw(mb_per_s * MB)
            except ValueError as e:
                raise BandwidthSettingError(f"bandwidth {value!r} MB/s: {e}") from None
            return cls(source="typed", typed_mb_per_s=mb_per_s)
        raise BandwidthSettingError(f"bandwidth setting {text!r}: expected profile:KEY, typed:MB_PER_S or fitted")


def profile_name(profile: DeviceProfile) -> str:
    """``Apple M1, Neural Engine (measured)``: what a profile is, without its number."""
    return f"{profile.device}, {profile.unit} ({profile.kind})"


@dataclass(frozen=True, slots=True)
class ResolvedBandwidth:
    """What a setting means for the loaded logs: the one value the A/B prediction and the report use, what the
    per-device cross-check uses (``fixed_bytes_per_s``; None: each device's own fit, else the default profile),
    and a sentence saying where it came from."""

    bytes_per_s: float
    fixed_bytes_per_s: float | None
    label: str  # "55,900 MB/s"
    source: str  # "Apple M1, Neural Engine (measured)"
    citation: str = ""  # where a profile's figure was published


def resolve(setting: BandwidthSetting, profiles: Mapping[str, DeviceProfile], fits: Sequence[BandwidthFit] = (),
            prefer_device: str | None = None) -> ResolvedBandwidth:
    """The bandwidth ``setting`` stands for. ``fits`` are the per-device fits of the loaded logs (used by
    ``fitted``); ``prefer_device`` is the device whose fit an A/B prediction uses when it has one."""
    if setting.source == "typed":
        bw = setting.typed_mb_per_s * MB
        return ResolvedBandwidth(bw, bw, fmt.bandwidth(bw, 1 if bw % MB else 0), "typed by the user")
    if setting.source == "profile":
        profile = profiles.get(setting.profile_key) or profiles[DEFAULT_PROFILE]
        bw = float(profile.bytes_per_s)
        return ResolvedBandwidth(bw, bw, fmt.bandwidth(bw), profile_name(profile),
                                 profile.source + (f" ({profile.url})" if profile.url else ""))
    usable = [f for f in fits if f.usable]
    chosen = next((f for f in usable if f.device == prefer_device), usable[0] if usable else None)
    default = profiles[DEFAULT_PROFILE]
    if chosen is None:
        return ResolvedBandwidth(float(default.bytes_per_s), None, fmt.bandwidth(default.bytes_per_s),
                                 "no usable fit on the loaded logs (a fit needs two builds with different bytes on "
                                 f"one device), so the default profile: {profile_name(default)}", default.source)
    others = [f.device for f in usable if f is not chosen]
    return ResolvedBandwidth(chosen.bw_bytes_per_s, None, fmt.bandwidth(chosen.bw_bytes_per_s),
                             f"fitted on {chosen.device} ({chosen.n_points} builds)"
                             + (f"; other devices use their own fits ({', '.join(others)})" if others else ""))
