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

from analyzer.ir.mil_records import MilProgram

if TYPE_CHECKING:
    from analyzer.model.spec import BuildSpec

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


def call_shape(program: MilProgram, spec: BuildSpec | None = None) -> CallShape:
    """The call shape of ``program``: from the build spec when qfold built it, else from the program itself —
    its token-id input ``[1, N]`` (an integer input an embedding ``gather`` reads, or one named like
    ``input_ids``), else a hidden-state input ``[1, N, H]`` (a prefill chunk fed no token ids, as ANEMLL's), else
    a mask's rows ``[.., N, S]``; N > 1 is a prefill of N tokens per call."""
    if spec is not None:
        phase = spec.phase_of(program.function)
        return CallShape(phase, spec.q_len_of(program.function), "build spec")
    gathered = _gathered_inputs(program)
    for t in program.inputs:
        if t.dtype in _INT_DTYPES and len(t.shape) == 2 and t.shape[0] == 1 and (
                t.name in gathered or _TOKEN_INPUT.match(t.name)):
            found = _rows(t, 1, "token ids")
            if found is not None:
                return found
    floats = [t for t in program.inputs if t.dtype.startswith(("fp", "bf"))]
    for t in floats:
        if len(t.shape) == 3 and t.shape[0] == 1 and not _MASK.search(t.name) and not _CACHE.search(t.name):
            found = _rows(t, 1, "hidden states, no token ids")
            if found is not None:
                return found
    for t in floats + [t for t in program.inputs if t.dtype == "bool"]:
        if len(t.shape) >= 2 and _MASK.search(t.name) and not _UPDATE.search(t.name):
            found = _rows(t, len(t.shape) - 2, "the mask's rows")
            if found is not None:
                return found
    return CallShape("decode", 1, "assumed one token per call: no token-id, hidden-state or mask input recognised")


_MASK = re.compile(r"mask", re.IGNORECASE)
_UPDATE = re.compile(r"update|write", re.IGNORECASE)
_CACHE = re.compile(r"cache|past_key|past_value", re.IGNORECASE)
_PASS = frozenset({"cast", "reshape", "squeeze", "expand_dims", "identity"})


def _rows(t, axis: int, what: str) -> CallShape | None:
    n = t.shape[axis]
    if not isinstance(n, int) or n < 1:
        return None
    return CallShape("decode" if n == 1 else "prefill", n, f"input {t.name!r} {t.shape_text} ({what})")


def _gathered_inputs(program: MilProgram) -> set[str]:
    """Program inputs an embedding ``gather`` reads as its indices (directly or through casts and views)."""
    names: dict[int, str] = {}  # op index → the program input it carries
    found = set()
    for op in program.ops:
        for r in op.inputs:
            src = r.tensor.name if r.producer is None else names.get(r.producer)
            if src is None or r.is_const:
                continue
            if op.type in _PASS and r.param == "x":
                names[op.index] = src
            elif op.type == "gather" and r.param == "indices":
                table = next((x for x in op.inputs if x.param == "x"), None)
                if table is not None and (table.is_const or (table.producer is not None and
                                          program.ops[table.producer].type.startswith("constexpr_"))):
                    found.add(src)
    return found
