"""What the torch equivalence check of the attention variants found (:mod:`analyzer.model.equivalence` runs it):
plain records, so that reading a stored analysis needs no torch."""

from __future__ import annotations

from dataclasses import dataclass

# The fp32 reference check fails above this |Δ| relative to the largest |logit|: fp32 reorderings give
# ~1e-6 here, a wrong head pairing gives O(1).
REFERENCE_REL_TOLERANCE = 1e-3


@dataclass(frozen=True, slots=True)
class PairResult:
    variant_a: str
    variant_b: str
    dtype: str  # "fp16" | "fp32"
    steps: int
    max_abs_diff: float
    bit_identical: bool
    greedy_agree_steps: int


@dataclass(frozen=True, slots=True)
class ReferenceCheck:
    variant: str
    max_abs_diff: float
    max_abs_logit: float
    greedy_agree_steps: int
    steps: int


@dataclass(frozen=True, slots=True)
class EquivalenceReport:
    kv_mode: str
    ctx: int
    steps: int  # decode: tokens decoded one by one; prefill: prompt rows compared
    tokens: tuple[int, ...]
    pairs: tuple[PairResult, ...]
    reference: ReferenceCheck
    phase: str = "decode"  # "prefill": the prompt was run in calls of q_len tokens
    q_len: int = 1

    @property
    def what(self) -> str:
        """``8 decode steps`` or ``a 128-token prompt in 2 prefill calls of 64``, for captions."""
        if self.phase == "decode":
            return f"{self.steps} decode steps"
        return f"a {self.steps}-token prompt in {self.steps // self.q_len} prefill call(s) of {self.q_len}"
