"""The proof that a folded package computes what its original does: both run in the MIL interpreter.

N decode steps of seeded random inputs (token ids, positions and causal masks as the input roles say;
states carried from step to step, a host cache for KV inputs) through the original and the folded package;
the record keeps max |Δ| of every output over all steps and of every final state, next to the largest
|value| of each, so a reader can judge the tolerance. Inputs are identified by
``analyzer.graph.interpret.infer_roles`` (qfold's own builds) or an input spec; without either, nothing is
claimed (``checked`` is False with the reason).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analyzer.errors import QfoldError

DEFAULT_STEPS = 4
# The Done-when bound of issue #9: max |Δ| ≤ 1e-2 × max |output| (fp16 graphs round every op to 11 bits).
RELATIVE_TOLERANCE = 1e-2


@dataclass(frozen=True, slots=True)
class FoldProof:
    checked: bool
    reason: str = ""  # why not checked
    steps: int = 0
    seed: int = 0
    roles: str = ""  # "inferred (qfold build)" or "input spec <file>"
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output (all steps) and final state
    max_abs_value: dict[str, float] = field(default_factory=dict)  # max |original| of the same
    random_inputs: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def bit_identical(self) -> bool:
        return self.checked and all(d == 0.0 for d in self.max_abs_diff.values())

    @property
    def within_tolerance(self) -> bool:
        return self.checked and all(d <= RELATIVE_TOLERANCE * max(self.max_abs_value.get(n, 0.0), 1e-6)
                                    for n, d in self.max_abs_diff.items())

    def headline(self) -> str:
        if not self.checked:
            return f"not checked: {self.reason}"
        verdict = "bit-identical" if self.bit_identical else (
            f"max |Δ| {max(self.max_abs_diff.values()):.3g}" + ("" if self.within_tolerance else " (over tolerance)"))
        return (f"{verdict} over {self.steps} decode steps in the MIL interpreter "
                f"({len(self.max_abs_diff)} outputs and states, seed {self.seed}, inputs {self.roles})")


def prove_fold(original: str | Path, folded: str | Path, steps: int = DEFAULT_STEPS, seed: int = 0,
               roles_path: str | Path | None = None, function: str | None = None) -> FoldProof:
    """Run both packages for ``steps`` decode steps on the same seeded inputs and compare: ``function``, or
    every function of a multi-function package (names then read ``function/output``)."""
    from analyzer.graph.mil import load_function

    t0 = time.monotonic()
    if function is None:
        try:
            functions = tuple(load_function(original).spec.mlProgram.functions)
        except QfoldError as e:
            return FoldProof(False, reason=str(e))
        if len(functions) > 1:
            parts = [prove_fold(original, folded, steps, seed, roles_path, fn) for fn in functions]
            bad = next((p for fn, p in zip(functions, parts, strict=True) if not p.checked), None)
            if bad is not None:
                return bad
            return FoldProof(
                True, steps=steps, seed=seed, roles=parts[0].roles,
                max_abs_diff={f"{fn}/{n}": d for fn, p in zip(functions, parts, strict=True)
                              for n, d in p.max_abs_diff.items()},
                max_abs_value={f"{fn}/{n}": v for fn, p in zip(functions, parts, strict=True)
                               for n, v in p.max_abs_value.items()},
                random_inputs=tuple(sorted({i for p in parts for i in p.random_inputs})),
                seconds=round(time.monotonic() - t0, 3))
    return _prove_function(original, folded, steps, seed, roles_path, function, t0)


def _prove_function(original, folded, steps, seed, roles_path, function, t0) -> FoldProof:
    from analyzer.graph.interpret import decode_steps, infer_roles, load_program, load_roles, max_abs_diff

    try:
        a = load_program(original, function)
        b = load_program(folded, function)
    except QfoldError as e:  # an op the interpreter has no kernel for: say so, claim nothing
        return FoldProof(False, reason=str(e))
    if roles_path is not None:
        roles, how = load_roles(roles_path), f"input spec {Path(roles_path).name}"
    else:
        roles, how = infer_roles(a), "inferred (qfold build)"
        if roles is None:
            names = ", ".join(t.name for t in a.inputs)
            return FoldProof(False, reason=f"cannot tell which inputs are token ids, positions and masks "
                                           f"({names}); give an input spec")
    try:
        ra = decode_steps(a, steps, roles, seed=seed)
        rb = decode_steps(b, steps, roles, seed=seed)
    except QfoldError as e:
        return FoldProof(False, reason=str(e))
    scale: dict[str, float] = {}
    for values in (*ra.outputs, ra.states):
        for name, v in values.items():
            scale[name] = max(scale.get(name, 0.0), float(np.max(np.abs(v.astype(np.float32)), initial=0.0)))
    diffs = max_abs_diff(ra, rb)
    return FoldProof(True, steps=steps, seed=seed, roles=how, max_abs_diff=diffs, max_abs_value=scale,
                     random_inputs=tuple(ra.random_inputs), seconds=round(time.monotonic() - t0, 3))
