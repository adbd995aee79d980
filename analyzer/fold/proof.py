"""The proof that a fold computes what its original does: a folded package and its original run in the MIL
interpreter (:func:`prove_fold`); an asset's proof runs on the Core AI runtime (``analyzer.fold.coreai.asset_fold``)
and both are judged here, by one record and one scale (:func:`compared`, :attr:`FoldProof.within_tolerance`).

N steps of seeded inputs through the original and the folded package (states carried from step to step, a host
cache for KV inputs); the record keeps max |Δ| of every output over all steps and of every final state, next to
the largest |value| of each, so a reader can judge the tolerance. The inputs follow an input spec (or the roles
``analyzer.engines.interpret.infer_roles`` reads off qfold's own builds: token ids, positions, causal masks); without
either they are drawn at random within what each input can hold (``analyzer.engines.interpret.draws``: token ids
below the embedding table's rows, positions within the tables and the cache, N(0, 1) floats), each draw stated
in :attr:`FoldProof.draws` — equality of a folded program and its original holds for any inputs, so the proof
always runs. A flexible package runs at the shapes ``analyzer.analysis.shapes`` assumes (or ``shapes``), stated in
:attr:`FoldProof.shapes`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.analysis.buildinfo import EquivalenceCheck
from analyzer.analysis.shapes import read_sized
from analyzer.engines.interpret import DecodeRun, decode_steps, infer_roles, load_interpreter, load_roles, max_abs_diff
from analyzer.engines.interpret.draws import draw_steps, plan_draws
from analyzer.errors import FoldError, QfoldError
from analyzer.ir.coreml.mil_reader import load_function

DEFAULT_STEPS = 4
INTERPRETER = "the MIL interpreter"
# The Done-when bound of issue #9: max |Δ| ≤ 1e-2 × max |output| (fp16 graphs round every op to 11 bits).
RELATIVE_TOLERANCE = 1e-2


NOT_REQUESTED = "not requested (--no-proof)"
NOTHING_FOLDED = "nothing was folded: the output is a byte copy of the input"
SKIPPED_REASONS = ("not requested", "nothing was folded")  # how records made before FoldProof.skipped begin


@dataclass(frozen=True, slots=True)
class FoldProof:
    checked: bool
    reason: str = ""  # why not checked
    steps: int = 0
    seed: int = 0
    roles: str = ""  # "inferred (qfold build)", "input spec <file>" or "random draws (no input spec)"
    max_abs_diff: dict[str, float] = field(default_factory=dict)  # per output (all steps) and final state
    max_abs_value: dict[str, float] = field(default_factory=dict)  # max |original| of the same
    random_inputs: tuple[str, ...] = ()
    seconds: float = 0.0
    engine: str = INTERPRETER  # what ran both programs (the Core AI fold: "the Core AI runtime")
    draws: tuple[str, ...] = ()  # how each input was drawn, without an input spec
    shapes: tuple[str, ...] = ()  # the shapes a flexible package ran at
    # not run by choice or need (--no-proof; nothing was folded, the output is a byte copy): not "unproven"
    skipped: bool = False

    @property
    def bit_identical(self) -> bool:
        return self.checked and all(d == 0.0 for d in self.max_abs_diff.values())

    @property
    def within_tolerance(self) -> bool:
        return self.checked and all(d <= self.tolerance(n) for n, d in self.max_abs_diff.items())

    def tolerance(self, name: str) -> float:
        """The largest |Δ| output or state ``name`` may show: :data:`RELATIVE_TOLERANCE` × its max |value|."""
        return RELATIVE_TOLERANCE * max(self.max_abs_value.get(name, 0.0), 1e-6)

    @property
    def status(self) -> str:
        """``proven`` (ran, within tolerance), ``failed`` (ran, outside it), ``unproven`` (could not run:
        :attr:`reason` says why) or ``skipped`` (not asked for, or nothing was folded)."""
        if self.checked:
            return "proven" if self.within_tolerance else "failed"
        return "skipped" if self.skipped else "unproven"

    def failure(self) -> str:
        """A failed proof in one line: the output or state furthest outside the tolerance, by how much."""
        name = max(self.max_abs_diff, key=lambda n: self.max_abs_diff[n] / self.tolerance(n))
        return (f"{name} differs by up to {self.max_abs_diff[name]:.3g} over {self.steps} steps in {self.engine}, "
                f"over the tolerance {self.tolerance(name):.3g} ({RELATIVE_TOLERANCE:g} × its max |value| "
                f"{self.max_abs_value.get(name, 0.0):.3g})")

    def to_json(self) -> dict[str, Any]:
        """The proof's document (the ``fold`` CLI's ``proof``, the fold cache's), both backends'."""
        return {**asdict(self), "bit_identical": self.bit_identical, "within_tolerance": self.within_tolerance,
                "status": self.status, "headline": self.headline()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FoldProof:
        """A stored proof; one stored before ``skipped`` existed is skipped when its reason says so."""
        fields = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        for name in ("random_inputs", "draws", "shapes"):
            fields[name] = tuple(fields.get(name, ()))
        if "skipped" not in fields and not fields.get("checked"):
            fields["skipped"] = str(fields.get("reason", "")).startswith(SKIPPED_REASONS)
        return cls(**fields)

    def headline(self) -> str:
        if not self.checked:
            return f"{'not checked' if self.skipped else 'UNPROVEN, the proof could not run'}: {self.reason}"
        verdict = "bit-identical" if self.bit_identical else (
            f"max |Δ| {max(self.max_abs_diff.values()):.3g}" + ("" if self.within_tolerance else " (over tolerance)"))
        at = f", at {'; '.join(self.shapes)}" if self.shapes else ""
        unit = "steps" if self.draws else "decode steps"  # drawn inputs: any call, a prefill chunk too
        return (f"{verdict} over {self.steps} {unit} in {self.engine} "
                f"({len(self.max_abs_diff)} outputs and states, seed {self.seed}, inputs {self.roles}{at})")



def compared(original: DecodeRun, folded: DecodeRun, steps: int, seed: int, roles: str, t0: float,
             engine: str = INTERPRETER, draws: tuple[str, ...] = (), shapes: tuple[str, ...] = ()) -> FoldProof:
    """The proof of two runs on the same seeded inputs, either engine: max |Δ| of every output (over all steps)
    and final state, beside the largest |value| the original reached in each, the scale
    :attr:`FoldProof.within_tolerance` holds the difference to."""
    scale: dict[str, float] = {}
    for values in (*original.outputs, original.states):
        for name, v in values.items():
            scale[name] = max(scale.get(name, 0.0), float(np.max(np.abs(v.astype(np.float32)), initial=0.0)))
    return FoldProof(True, steps=steps, seed=seed, roles=roles, max_abs_diff=max_abs_diff(original, folded),
                     max_abs_value=scale, random_inputs=tuple(original.random_inputs),
                     seconds=round(time.monotonic() - t0, 3), engine=engine, draws=draws, shapes=shapes)


def prove_fold(original: str | Path, folded: str | Path, steps: int = DEFAULT_STEPS, seed: int = 0,
               roles_path: str | Path | None = None, function: str | None = None,
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> FoldProof:
    """Run both packages for ``steps`` steps on the same seeded inputs and compare: ``function``, or every
    function of a multi-function package (names then read ``function/output``)."""
    t0 = time.monotonic()
    if function is None:
        try:
            functions = tuple(load_function(original).spec.mlProgram.functions)
        except QfoldError as e:
            return FoldProof(False, reason=str(e))
        if len(functions) > 1:
            parts = [prove_fold(original, folded, steps, seed, roles_path, fn, shapes) for fn in functions]
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
                seconds=round(time.monotonic() - t0, 3),
                draws=tuple(f"{fn}/{d}" for fn, p in zip(functions, parts, strict=True) for d in p.draws),
                shapes=tuple(f"{fn}/{x}" for fn, p in zip(functions, parts, strict=True) for x in p.shapes))
    return _prove_function(original, folded, steps, seed, roles_path, function, t0, shapes)


def _prove_function(original, folded, steps, seed, roles_path, function, t0, shapes) -> FoldProof:
    try:
        a = load_interpreter(original, function)
        b = load_interpreter(folded, function)
        program = read_sized(original, function, shapes)
    except QfoldError as e:  # an op the interpreter has no kernel for, a flexible input without a shape
        return FoldProof(False, reason=str(e))
    at = {x.name: x.shape for x in program.assumed_shapes}
    draws: tuple[str, ...] = ()
    if roles_path is not None:
        roles, how = load_roles(roles_path), f"input spec {Path(roles_path).name}"
    else:
        roles, how = infer_roles(a), "inferred (qfold build)"
    try:
        if roles is not None:
            ra = decode_steps(a, steps, roles, seed=seed, shapes=at)
            rb = decode_steps(b, steps, roles, seed=seed, shapes=at)
        else:
            plan = plan_draws(program)
            how, draws = "random draws (no input spec)", tuple(d.text for d in plan)
            ra, rb = draw_steps(a, plan, steps, seed), draw_steps(b, plan, steps, seed)
    except QfoldError as e:
        return FoldProof(False, reason=str(e))
    return compared(ra, rb, steps, seed, how, t0, draws=draws, shapes=tuple(x.text for x in program.assumed_shapes))


def refuse_failed(proof: FoldProof, what: str | Path) -> None:
    """A fold whose proof ran and found the folded model computing something else is never kept or handed out:
    raise, naming the output furthest off."""
    if proof.status == "failed":
        raise FoldError(f"{what}: the folded model does not compute what the original does: {proof.failure()}; "
                        "nothing was kept")


def folded_check(proof: FoldProof) -> EquivalenceCheck:
    """The fold proof as the check record a folded build stores."""
    diffs = proof.max_abs_diff
    return EquivalenceCheck(
        "folded_vs_original", "folded package vs the package it was folded from, every output and final state",
        "the stored weights of both packages (identical, checked per constant)", proof.steps, proof.checked,
        max_abs_diff=max(diffs.values()) if diffs else None,
        max_abs_value=max(proof.max_abs_value.values()) if proof.max_abs_value else None,
        bit_identical=proof.bit_identical if proof.checked else None,
        note=proof.headline(),
    )
