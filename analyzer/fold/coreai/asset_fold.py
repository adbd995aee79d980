"""``fold IN.aimodel OUT.aimodel``: remove KV replication from any Core AI asset, proven on Apple's runtime.

The same report as a package fold (``analyzer.fold.fold_records.FoldReport``): one decision per replication op
(``coreai.broadcast_in_dims`` / ``coreai.tile``, those inside an SDPA composite's fallback body included and
marked with the composite's call count), bytes per decode token by category before and after (the walker's
byte account), a check that every weight constant kept its type and bytes, and the proof: both assets run on
the Core AI runtime for N stateful decode steps on the same seeded inputs, max |Δ| of every output and final
state. The rewrite itself (:mod:`analyzer.fold.coreai.rewrite`) runs in a child process, as the runtime does
(:mod:`analyzer.engines.coreai.runtime`); IN is only read. The result is written beside OUT and renamed into
place; nothing is kept when a check fails.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from analyzer.engines.coreai.runtime import CoreAIRuntime
from analyzer.engines.interpret import InputRoles, decode_steps, infer_roles, load_roles
from analyzer.engines.interpret.draws import draw_steps, plan_draws
from analyzer.errors import FoldError, QfoldError
from analyzer.fold.fold_records import CopyDecision, FoldReport, FunctionBytes, WeightCheck
from analyzer.fold.proof import DEFAULT_STEPS, NOT_REQUESTED, NOTHING_FOLDED, FoldProof, compared, refuse_failed
from analyzer.fsio import replace_dir
from analyzer.ir.coreai.asset import ASSET_SUFFIX, check_asset
from analyzer.ir.coreai.native_child import asset_bytes, child_limit, run_module
from analyzer.ir.coreai.walk import read_asset
from analyzer.ir.mil_records import MilProgram

PASS_NAME = "qfold::fold_coreai_replication"
PASS_VERSION = 2
ENGINE = "the Core AI runtime"
_FLOAT_TYPES = ("xf16>", "xf32>", "xbf16>", "<f16>", "<f32>", "<bf16>")


# ------------------------------------------------------------------------------------------------ checks
def compare_constants(before: dict[str, int], after: dict[str, int]) -> WeightCheck:
    """Weight constants (float-typed ``coreai.constant``, keyed by graph, type and content digest) must all be
    in the folded program; integer shape/permutation constants may go (the copies' shapes) or come (the fold's)."""
    weights = Counter({k: n for k, n in before.items() if any(t in k.split("|")[1] for t in _FLOAT_TYPES)})
    kept = Counter({k: min(n, after.get(k, 0)) for k, n in weights.items()})
    changed = tuple(sorted(f"{k.split('|')[0]}: {k.split('|')[1]}" for k, n in weights.items() if kept[k] < n))
    removed = tuple(sorted(f"{k.split('|')[0]}: {k.split('|')[1]}" for k, n in before.items()
                           if k not in weights and after.get(k, 0) < n))
    return WeightCheck(sum(weights.values()), sum(kept.values()), removed, changed)


def prove_on_runtime(original: Path, folded: Path, steps: int = DEFAULT_STEPS, seed: int = 0,
                     roles: InputRoles | None = None, how: str = "inferred (qfold build)") -> FoldProof:
    """Both assets for ``steps`` stateful decode steps on the Core AI runtime, the same seeded inputs: those the
    input spec (``roles``) or qfold's own input names describe, else inputs drawn within what each can hold
    (``analyzer.engines.interpret.draws``, read off the walked asset; each draw stated), as a package's proof
    draws them: a folded program equals its original for any inputs."""
    t0 = time.monotonic()
    draws: tuple[str, ...] = ()
    try:
        with CoreAIRuntime() as rt:
            a, b = rt.load(original), rt.load(folded)
            roles = roles or infer_roles(a)
            if roles is not None:
                ra, rb = decode_steps(a, steps, roles, seed=seed), decode_steps(b, steps, roles, seed=seed)
            else:
                plan = plan_draws(read_asset(original))
                how, draws = "random draws (no input spec)", tuple(d.text for d in plan)
                ra, rb = draw_steps(a, plan, steps, seed), draw_steps(b, plan, steps, seed)
    except QfoldError as e:
        return FoldProof(False, reason=str(e), engine=ENGINE)
    return compared(ra, rb, steps, seed, how, t0, engine=ENGINE, draws=draws)


def function_bytes(before: Path, after: Path) -> tuple[FunctionBytes, ...]:
    """Bytes per decode token by category of both assets (the walker's byte account), and their KV copies."""
    return (FunctionBytes.of(read_asset(before), read_asset(after)),)


def kv_copies(program: MilProgram) -> int:
    """Replication ops the walker classifies as KV replication (composite bodies: once per call)."""
    return sum(op.tile_kind == "kv_replication" for op in program.ops)


# ------------------------------------------------------------------------------------------------ folding
def _rewrite(src: Path, tmp: Path) -> dict:
    """Run :mod:`analyzer.fold.coreai.rewrite` in a child, within a time limit scaled to the asset (it reads the
    program and copies the weights: :mod:`analyzer.ir.coreai.native_child`); its crash, error or timeout is one
    line."""
    with tempfile.TemporaryDirectory(prefix="qfold-fold-") as d:
        report = Path(d) / "report.json"
        run_module("analyzer.fold.coreai.rewrite", [str(src), str(tmp), str(report)], "the Core AI rewrite",
                   str(src), child_limit(asset_bytes(src)), FoldError)
        if not report.is_file():
            raise FoldError(f"{src}: the Core AI rewrite wrote no report")
        return json.loads(report.read_text())


def fold_asset(src: str | Path, dst: str | Path, steps: int = DEFAULT_STEPS, seed: int = 0,
               roles_path: str | Path | None = None, prove: bool = True, keep_unproven: bool = True) -> FoldReport:
    """Fold every KV-replicating op of ``src`` into ``dst`` (replaced if it exists) and prove it on the runtime.
    When nothing is folded, ``dst`` is a byte copy of ``src``. A fold the proof finds wrong is never written
    (FoldError); one whose proof could not run is written only with ``keep_unproven``."""
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal t0
        timings[name] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()

    src = check_asset(src)
    dst = Path(dst)
    if dst.suffix != ASSET_SUFFIX:
        raise FoldError(f"{dst}: the output must end in {ASSET_SUFFIX}")
    if dst.resolve() == src.resolve():
        raise FoldError(f"{dst}: the output would overwrite the input asset")
    roles = load_roles(roles_path) if roles_path is not None else None
    how = f"input spec {Path(roles_path).name}" if roles_path is not None else "inferred (qfold build)"
    tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        doc = _rewrite(src, tmp)
        lap("rewrite_s")
        decisions = tuple(CopyDecision(**{**d, "input_shape": tuple(d["input_shape"]),
                                          "output_shape": tuple(d["output_shape"])}) for d in doc["decisions"])
        weights = None
        if any(d.folded for d in decisions):
            check_asset(tmp)
            weights = compare_constants(doc["constants_before"], doc["constants_after"])
            if not weights.ok:
                raise FoldError(f"{src}: folding changed weight constant {weights.changed[0]!r}; "
                                "the output was not kept")
            proof = (prove_on_runtime(src, tmp, steps, seed, roles, how) if prove
                     else FoldProof(False, reason=NOT_REQUESTED, engine=ENGINE, skipped=True))
            refuse_failed(proof, src)  # the temporary folder goes with it: nothing is kept
            lap("proof_s")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            proof = FoldProof(False, reason=NOTHING_FOLDED, engine=ENGINE, skipped=True)
        functions = function_bytes(src, tmp)
        lap("walk_s")
        written = keep_unproven or proof.status != "unproven"
        if written:
            replace_dir(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return FoldReport("coreai", str(src), str(dst), PASS_NAME, PASS_VERSION, decisions, functions, weights, timings,
                      doc.get("composite_calls", {}), proof)
