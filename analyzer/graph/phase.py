"""What one call of an analysed function does: decode one token, or prefill N prompt tokens.

Every figure qfold derives from a graph is per call (one run of the function): the bytes it moves, the FLOPs it
does. "Per token" divides by the tokens one call consumes: 1 for a decode step, N for a prefill step (per
*prompt* token). For a qfold build the build spec says it (``phase``, ``q_len``; a ``decode+prefill`` package
names its functions after their phases). For a package another tool made it is read from the token input:
an integer input named like ``input_ids``/``tokens`` of shape ``[1, N]`` (N > 1: a prefill). Without one, one
token per call is assumed, and :attr:`CallShape.how` says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.graph.program import MilProgram

if TYPE_CHECKING:
    from analyzer.graph.buildinfo import StoredSpec

_TOKEN_INPUT = re.compile(r"^(?:input_ids|input|tokens?|token_ids|ids)$", re.IGNORECASE)
_INT_DTYPES = frozenset({"int32", "int64", "int16", "uint16", "uint32", "int8", "uint8"})


@dataclass(frozen=True, slots=True)
class CallShape:
    """The phase of one call and the tokens it consumes (per-token figures divide by ``tokens_per_call``)."""

    phase: str  # "decode" | "prefill"
    tokens_per_call: int
    how: str  # where it was read: "build spec", "input 'input_ids' [1,64]", or why one token is assumed

    @property
    def per_token_label(self) -> str:
        """``per decode token`` / ``per prompt token (per call ÷ 64)``."""
        if self.phase == "decode":
            return "per decode token"
        return f"per prompt token (per call ÷ {self.tokens_per_call})"


def call_shape(program: MilProgram, spec: StoredSpec | None = None) -> CallShape:
    """The call shape of ``program``: from the build spec when qfold built it, else from its token input."""
    if spec is not None:
        phase = spec.phase_of(program.function)
        return CallShape(phase, spec.q_len_of(program.function), "build spec")
    for t in program.inputs:
        if t.dtype in _INT_DTYPES and _TOKEN_INPUT.match(t.name) and len(t.shape) == 2 and t.shape[0] == 1:
            n = t.shape[1]
            if isinstance(n, int) and n >= 1:
                return CallShape("decode" if n == 1 else "prefill", n, f"input {t.name!r} {t.shape_text}")
    return CallShape("decode", 1, "assumed one token per call: no integer token input [1, N] recognised")
