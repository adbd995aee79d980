"""The roofline: what one call of a function costs on a device with a bandwidth roof and a compute roof.

A call moves ``bytes`` (the byte account, per call) and does ``FLOPs`` (the FLOP count, per call). With the
device's bandwidth BW and peak FLOP/s P (a :class:`~analyzer.predict.profiles.DeviceProfile`, or numbers the user
types), the roofline model (Williams, Waterman and Patterson, "Roofline: An Insightful Visual Performance Model
for Multicore Architectures", CACM 52(4), 2009) bounds the time from below::
    time per call = max(bytes / BW, FLOPs / P)          bound = whichever term is larger
    operational intensity I = FLOPs / bytes              attainable FLOP/s = min(P, BW · I)

A decode call (one token) reads every weight for a few FLOPs per byte: it sits left of the ridge (I < P / BW) and
is memory-bound, so tok/s ≈ BW ÷ bytes per token, the bandwidth model. A prefill call of N prompt tokens reads
the weights once for N tokens' FLOPs: its intensity grows with N until the compute roof binds. Time to first
token for a prompt of T tokens = ⌈T / N⌉ prefill calls (a static-shape call costs the same however many of its
rows are padding), or T decode calls when there is no prefill function.

It is a bound, not a measurement: dispatch overheads, caches and kernels that reach neither roof all make the
device slower (the Bandwidth page fits the decode side on measured logs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from analyzer.predict.profiles import DeviceProfile, ProfileError

if TYPE_CHECKING:
    from analyzer.analysis.record import Analysis

Bound = Literal["memory", "compute"]


@dataclass(frozen=True, slots=True)
class Roof:
    """A device's two roofs, with where each figure comes from."""

    label: str
    bytes_per_s: float
    flops_per_s: float
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("bytes_per_s", "flops_per_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"roof {self.label!r}: {name} must be a finite number > 0, got {value!r}")

    @property
    def ridge_flops_per_byte(self) -> float:
        """The intensity where the two roofs meet: below it a call is memory-bound."""
        return self.flops_per_s / self.bytes_per_s

    def attainable_flops_per_s(self, intensity_flops_per_byte: float) -> float:
        return min(self.flops_per_s, self.bytes_per_s * intensity_flops_per_byte)

    @classmethod
    def of(cls, profile: DeviceProfile) -> Roof:
        """The roofs of a device profile; a profile without a peak FLOP/s has no compute roof."""
        if profile.flops_per_s is None:
            raise ProfileError(f"device profile {profile.key!r} has no peak FLOP/s (no compute roof); pick one that "
                               "has, or give the peak yourself")
        source = (f"bandwidth: {profile.source} ({profile.kind}); peak FLOP/s: {profile.flops_source} "
                  f"({profile.flops_kind})")
        return cls(f"{profile.device}, {profile.unit}", float(profile.bytes_per_s), float(profile.flops_per_s), source)


@dataclass(frozen=True, slots=True)
class CallPrediction:
    """One call of one function on one roof."""

    label: str  # what was predicted ("A · decode")
    phase: str  # "decode" | "prefill"
    tokens_per_call: int
    bytes_per_call: int
    flops_per_call: int
    memory_s: float  # bytes / BW
    compute_s: float  # FLOPs / peak

    @property
    def time_per_call_s(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound(self) -> Bound:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def intensity_flops_per_byte(self) -> float:
        return self.flops_per_call / self.bytes_per_call if self.bytes_per_call else math.inf

    @property
    def attainable_flops_per_s(self) -> float:
        """The FLOP/s this call reaches at the roof (its FLOPs over its bound time)."""
        return self.flops_per_call / self.time_per_call_s if self.time_per_call_s else 0.0

    @property
    def tok_per_s(self) -> float:
        """Tokens per second: decode tokens, or prompt tokens for a prefill call."""
        return self.tokens_per_call / self.time_per_call_s if self.time_per_call_s else math.inf


def predict_call(label: str, phase: str, tokens_per_call: int, bytes_per_call: int, flops_per_call: int,
                 roof: Roof) -> CallPrediction:
    """``max(bytes / BW, FLOPs / peak)`` for one call."""
    if bytes_per_call < 0 or flops_per_call < 0 or tokens_per_call < 1:
        raise ValueError(f"{label}: bytes {bytes_per_call}, FLOPs {flops_per_call} and tokens {tokens_per_call} "
                         "per call must be ≥ 0, ≥ 0 and ≥ 1")
    return CallPrediction(label, phase, tokens_per_call, bytes_per_call, flops_per_call,
                          bytes_per_call / roof.bytes_per_s, flops_per_call / roof.flops_per_s)


def predict(analysis: Analysis, roof: Roof, label: str = "") -> CallPrediction:
    """One call of an analysed function: its bytes per call (the byte account's total) and FLOPs per call."""
    call = analysis.call
    return predict_call(label or call.phase, call.phase, call.tokens_per_call, analysis.bytes_per_token.total,
                        analysis.flops.per_call().total, roof)


@dataclass(frozen=True, slots=True)
class TimeToFirstToken:
    """The prompt of ``prompt_tokens`` processed in ``calls`` calls of ``via`` (its last call yields the first
    token's logits)."""

    prompt_tokens: int
    calls: int
    seconds: float
    via: CallPrediction

    @property
    def how(self) -> str:
        if self.via.phase == "prefill":
            return (f"{self.calls} prefill call(s) of {self.via.tokens_per_call} tokens × "
                    f"{self.via.time_per_call_s * 1e3:,.2f} ms ({self.via.bound}-bound)")
        return (f"{self.calls} decode calls, one per prompt token, × {self.via.time_per_call_s * 1e3:,.2f} ms "
                f"({self.via.bound}-bound): no prefill function")


def time_to_first_token(prompt_tokens: int, prefill: CallPrediction | None = None,
                        decode: CallPrediction | None = None) -> TimeToFirstToken:
    """Time to first token for a prompt: ⌈T / N⌉ prefill calls, else T decode calls (one token each)."""

    via = prefill or decode
    if via is None:
        raise ValueError("time to first token needs a prefill or a decode call")
    calls = prompt_calls(prompt_tokens, via.tokens_per_call)
    return TimeToFirstToken(prompt_tokens, calls, calls * via.time_per_call_s, via)


@dataclass(frozen=True, slots=True)
class PrefillRun:
    """A measured prefill run (a log row of phase ``prefill``, averaged per condition) against the compute roof:
    the FLOP/s its prompt tok/s implies with the FLOPs of its build's prefill analysis, and the roofline's
    prediction. Without a prefill analysis the figures are None and ``note`` says why."""

    build: str
    device: str
    n: int
    measured_tok_per_s: float  # prompt tokens per second
    tokens_per_call: int | None  # of the analysis (q_len)
    flops_per_token: int | None  # per prompt token
    bytes_per_token: int | None  # per prompt token
    implied_flops_per_s: float | None  # measured tok/s × FLOPs per prompt token
    predicted_tok_per_s: float | None  # the roofline's bound for the analysis
    bound: Bound | None
    peak_flops_per_s: float  # the compute roof it is held against
    note: str = ""

    @property
    def share_of_peak(self) -> float | None:
        """The implied FLOP/s as a share of the peak (above 1: the FLOP count or the peak is wrong)."""
        return None if self.implied_flops_per_s is None else self.implied_flops_per_s / self.peak_flops_per_s


def prefill_runs(summaries, prefill_analyses: dict[str, Analysis | None], roof: Roof) -> tuple[PrefillRun, ...]:
    """Every prefill summary (``analyzer.measure.logs.summarize(..., phase="prefill")``) held against ``roof`` with
    the prefill analysis its build label maps to (None: mapped to nothing with a prefill function)."""
    out = []
    for s in summaries:
        if s.phase != "prefill":
            continue
        a = prefill_analyses.get(s.build)
        if a is None or a.call.phase != "prefill":
            out.append(PrefillRun(s.build, s.device, s.n, s.mean_tok_per_s, None, None, None, None, None, None,
                                  roof.flops_per_s, "no prefill analysis mapped: map the label to a prefill build "
                                  "(or a decode+prefill package) on the Device logs page"))
            continue
        call = predict(a, roof, s.build)
        per_token_flops = a.flops.per_token().total
        out.append(PrefillRun(
            s.build, s.device, s.n, s.mean_tok_per_s, call.tokens_per_call, per_token_flops,
            round(call.bytes_per_call / call.tokens_per_call), s.mean_tok_per_s * per_token_flops, call.tok_per_s,
            call.bound, roof.flops_per_s))
    return tuple(out)


def prompt_calls(prompt_tokens: int, q_len: int) -> int:
    """Prefill calls a prompt of ``prompt_tokens`` needs at ``q_len`` tokens per call (the last one padded)."""
    if prompt_tokens < 1 or q_len < 1:
        raise ValueError(f"prompt of {prompt_tokens} tokens at q_len {q_len}: both must be at least 1")
    return math.ceil(prompt_tokens / q_len)
