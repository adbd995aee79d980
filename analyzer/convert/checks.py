"""What a build's equivalence record checked, and with which weights.

A build's ``analysis.json["equivalence"]`` is the torch report (``analyzer.model.equivalence``: every attention
variant decoded in torch, fp32 and fp16, on the same uncompressed weights) plus ``checks``: one
:class:`EquivalenceCheck` per comparison, each naming what it compared and which weights it ran on:

=======================  ==================================================================================
``torch_variants``       torch vs torch: repeat_kv vs qfold decode steps, uncompressed torch weights
``interpreter_vs_torch`` MIL interpreter vs torch: this build's saved package (its own, possibly compressed,
                         weights) vs the torch decode step it was converted from (uncompressed weights)
``folded_vs_original``   folded vs original, both packages in the MIL interpreter, the same stored weights
=======================  ==================================================================================

The torch report is computed on a reduced model of the build's attention geometry (``model.valuefree.reduced_source``:
2 layers, random weights; :class:`ReducedEquivalences`, in a worker process beside the conversion), never on
value-free weights (equal constants make every head alike, so a wrong head mapping would pass). It is shared by
every build of one geometry, KV mode, ctx and phase (not by variant, build mode or compression), and the
``torch_variants`` check says which weights it ran on (``covers_package_weights`` False) instead of lending
its bit-identity to this package. An analysis-mode build has no package: its ``interpreter_vs_torch`` check is
recorded as not run (:func:`interpreter_not_run`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from analyzer import quiet_coremltools
from analyzer.analysis.buildinfo import EquivalenceCheck, equivalence_from_json, equivalence_json
from analyzer.convert.progress import SharedWorkers, emit
from analyzer.engines.interpret import decode_steps, load_interpreter
from analyzer.errors import QfoldError
from analyzer.fsio import read_json, write_json_atomic
from analyzer.jsonfields import Field
from analyzer.model.cost import estimate
from analyzer.model.ctx_thresholds import ctx_regime
from analyzer.model.decode import DecodeStep, build_model, run_decode
from analyzer.model.equivalence import check_equivalence, check_prefill_equivalence
from analyzer.model.sources import geometry_of, load_config
from analyzer.model.spec import BuildSpec, phases_of, tool_versions
from analyzer.model.valuefree import reduced_source

if TYPE_CHECKING:
    from analyzer.model.equivalence_records import EquivalenceReport
    from analyzer.model.sources import ModelSource
    from analyzer.model.spec import BuildSpec

# The interpreter check runs at build time when the fp16 weights plus the KV cache stay under this many bytes
# (2-layer builds: seconds); a full-size decode step takes up to 30 s in the interpreter (issue #9) and a
# 30-layer structure build at ctx 4096 carries 240 MiB of cache, so those record the check as not run and name
# the command that runs it.
INTERPRETER_CHECK_MAX_BYTES = 128 << 20
INTERPRETER_CHECK_STEPS = 4


# A decode step's torch check runs at the build's ctx up to this many cache slots. Its decode writes
# ``equivalence_steps`` (8) slots; every slot past them is masked (MASK_VALUE: weight exactly 0 after the softmax in
# fp16 and fp32), so a longer static cache adds slots that no compared logit can depend on, while its cost grows with
# ctx (the reduced Llama-3.1-8B geometry, CPU seconds on this machine: 2.4 at ctx 512, 6.4 at 4096, 43 at 32768;
# bench/results/profile_build.json, "equivalence"). 4096 is the default build's ctx, so the default A/B is unchanged.
EQUIVALENCE_CTX_CAP = 4096


def equivalence_ctx(spec: BuildSpec) -> int:
    """The ctx a single-phase spec's torch equivalence check runs at: the build's own, or
    :data:`EQUIVALENCE_CTX_CAP` for a decode step above it when the reduced model's config sees both on the same
    side of every ctx threshold (``analyzer.model.ctx_thresholds``: a sliding window shorter than one of them
    changes the step's ops, so the check keeps the build's ctx). A prefill check keeps its ctx (how many calls its
    prompt takes depends on it)."""
    if spec.phase != "decode" or spec.ctx <= EQUIVALENCE_CTX_CAP or spec.equivalence_steps > EQUIVALENCE_CTX_CAP:
        return spec.ctx
    config = load_config(reduced_source(spec.source))
    return EQUIVALENCE_CTX_CAP if ctx_regime(config, EQUIVALENCE_CTX_CAP) == ctx_regime(config, spec.ctx) else spec.ctx


def _weights_text(source: ModelSource) -> str:
    return "safetensors weights" if source.has_real_weights else f"seeded random weights (seed {source.seed})"


def torch_check(report: EquivalenceReport, spec: BuildSpec, weights: str | None = None) -> EquivalenceCheck:
    """The torch report's repeat_kv vs qfold fp16 pair as a check record (fp32 in the note). ``weights``: which
    model the report ran on when it is not the build's own (a reduced model: :func:`reduced_weights_text`)."""
    pairs = {p.dtype: p for p in report.pairs if {p.variant_a, p.variant_b} == {"repeat_kv", "qfold"}}
    fp16, fp32 = pairs.get("fp16"), pairs.get("fp32")
    compressed = spec.compression
    note = f"fp32 max |Δ logits| {fp32.max_abs_diff:.3g}" if fp32 else ""
    if report.ctx != spec.ctx:
        note = (f"{note}; " if note else "") + (
            f"run at ctx {report.ctx}, not the build's {spec.ctx}: the cache slots past the {report.steps} written "
            f"are masked (weight 0), so no compared logit depends on them (checks.EQUIVALENCE_CTX_CAP)")
    if compressed:
        where = ("asset stores (run both variants' assets on the Core AI runtime: qfold run BUILD --steps N)"
                 if spec.backend == "coreai" else "package stores (see the interpreter check)")
        note = (f"{note}; " if note else "") + (
            f"the torch models are uncompressed: this says nothing about the {compressed} weights this {where}")
    return EquivalenceCheck(
        "torch_variants", f"repeat_kv vs qfold, {report.what}, fp16 (and fp32) torch",
        weights or f"uncompressed torch model, {_weights_text(spec.source)}", report.steps, fp16 is not None,
        max_abs_diff=None if fp16 is None else fp16.max_abs_diff,
        max_abs_value=report.reference.max_abs_logit or None,
        bit_identical=None if fp16 is None else fp16.bit_identical,
        greedy_agree_steps=None if fp16 is None else fp16.greedy_agree_steps,
        covers_package_weights=not compressed and weights is None, note=note,
    )


def interpreter_fits(model, ctx: int) -> bool:
    """Whether the model's fp16 weights plus its KV cache at ``ctx`` are small enough to interpret at build time."""

    g = geometry_of(model.config)
    kv_bytes = 2 * g.num_layers * g.num_kv_heads * ctx * g.head_dim * 2  # K and V, fp16
    return sum(p.numel() for p in model.parameters()) * 2 + kv_bytes <= INTERPRETER_CHECK_MAX_BYTES


def _interpreter_compared(spec) -> str:
    return f"{spec.variant} package in the MIL interpreter vs its torch decode step, logits"


def interpreter_not_run(spec, reason: str) -> EquivalenceCheck:
    """The interpreter check of a build that has no package to run (an analysis-mode build): not run, and why."""
    return EquivalenceCheck("interpreter_vs_torch", _interpreter_compared(spec), "none: value-free weights",
                            INTERPRETER_CHECK_STEPS, False, covers_package_weights=False, note=f"not run: {reason}")


def interpreter_reference(model, spec, tokens: list[int]):
    """Torch fp16 logits ``[N, V]`` of the build's own variant for the interpreter check, or None when the
    package will be too large to interpret at build time. Call before the torch model is freed."""

    import torch


    if not interpreter_fits(model, spec.ctx):
        return None
    half = copy.deepcopy(model).to(torch.float16)
    step = DecodeStep(half, spec.ctx, spec.variant, spec.kv_mode).eval()
    return run_decode(step, tokens[:INTERPRETER_CHECK_STEPS], torch.float16).float().numpy()


def interpreter_check(package, spec, tokens: list[int], reference, function: str | None = None) -> EquivalenceCheck:
    """The saved package (its decode ``function``; default: its only one) run in the MIL interpreter on the torch
    check's tokens vs torch fp16 logits."""

    compressed = spec.compression
    weights = (f"this package's {compressed}-compressed weights vs the uncompressed torch model" if compressed
               else "this package's fp16 weights vs the same weights in torch (fp16)")
    steps = min(len(tokens), INTERPRETER_CHECK_STEPS) if tokens else INTERPRETER_CHECK_STEPS
    compared = _interpreter_compared(spec)
    if reference is None:
        return EquivalenceCheck(
            "interpreter_vs_torch", compared, weights, steps, False,
            note=f"not run at build time: over {INTERPRETER_CHECK_MAX_BYTES >> 20} MiB of weights and KV cache; "
                 "`qfold run` evaluates the package")

    try:
        run = decode_steps(load_interpreter(package, function), steps,
                           tokens=np.asarray(tokens[:steps]).reshape(steps, 1))
    except QfoldError as e:
        return EquivalenceCheck("interpreter_vs_torch", compared, weights, steps, False, note=str(e))
    ours = np.stack([o["logits"].reshape(-1).astype(np.float32) for o in run.outputs])
    diff = float(np.abs(ours - reference).max())
    return EquivalenceCheck(
        "interpreter_vs_torch", compared, weights, steps, True, max_abs_diff=diff,
        max_abs_value=float(np.abs(reference).max()), bit_identical=diff == 0.0,
        greedy_agree_steps=int((ours.argmax(-1) == reference.argmax(-1)).sum()),
        note="matmuls accumulate in fp32 in the interpreter and in torch's CPU kernels alike; differences are "
             "rounding order" + (" plus compression error" if compressed else ""),
    )


# ------------------------------------------------------------------------------------------------- reduced model
def _equivalence_key(spec: BuildSpec) -> tuple[str, str]:
    """(digest, description) of what a single-phase spec's equivalence check depends on: the reduced source, KV
    mode, ctx, phase (steps or q_len) and tool versions; not the variant, the build mode nor the compression."""

    reduced = reduced_source(spec.source)
    fingerprint = {"source": reduced.fingerprint(), "kv_mode": spec.kv_mode, "ctx": equivalence_ctx(spec),
                   "steps": spec.equivalence_steps, "versions": tool_versions()}
    if spec.phase != "decode":
        fingerprint.update(phase=spec.phase, q_len=spec.q_len)
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return digest, ", ".join(reduced.overrides)


def is_reduced_size(spec: BuildSpec) -> bool:
    """Whether a build's own model is no larger than the reduced model its equivalence check runs on (a test-size
    config such as the suite's tiny one). Such a build converts in a few seconds, less than a worker process takes
    to start (~7 s of CPU importing torch, transformers and coremltools on this project's 2-core machine: a 2-layer
    build's log showed the child waiting 3-6 s for its worker's check, which takes ~1 s), so its check and its
    A/B's second variant run in the build's own process."""

    own, reduced = load_config(spec.source), load_config(reduced_source(spec.source))
    return estimate(own, spec.ctx).params <= estimate(reduced, spec.ctx).params


def reduced_weights_text(source) -> str:
    """Which weights an equivalence check on ``reduced_source(source)`` ran on (for the check record)."""

    reduced = reduced_source(source)
    return (f"a reduced model of the same attention geometry ({', '.join(reduced.overrides)}; random weights, seed "
            f"{reduced.seed}), not this build's weights")


def _in_this_process(spec_json: dict) -> dict:
    """:func:`check_reduced_equivalence` here, the process's torch thread count kept."""
    import torch

    threads = torch.get_num_threads()
    try:
        return check_reduced_equivalence(spec_json)
    finally:
        torch.set_num_threads(threads)


def check_reduced_equivalence(spec_json: dict) -> dict:
    """The variants' numerical equivalence for a single-phase spec's attention geometry, KV mode and ctx,
    checked on the reduced model (``model.valuefree.reduced_source``), never on value-free weights. Runs in a worker
    process; returns ``equivalence_json`` of the report."""
    import torch


    quiet_coremltools()
    torch.set_num_threads(1)  # the conversion runs beside it
    spec = BuildSpec.from_json(spec_json)
    model = build_model(reduced_source(spec.source))
    if spec.phase == "prefill":
        return equivalence_json(check_prefill_equivalence(model, spec.kv_mode, spec.ctx, spec.q_len))
    return equivalence_json(check_equivalence(model, spec.kv_mode, equivalence_ctx(spec), spec.equivalence_steps))


class ReducedEquivalences:
    """The equivalence checks a set of builds needs (one per phase), read from ``builds/.equivalence/`` or
    computed in ONE worker process beside the conversions (off the critical path: the conversion passes run on
    one core). ``in_process``: why the checks are computed here when first asked for instead (empty: a worker), for
    a child whose other cores already convert (an analysis A/B's second variant in its worker) or builds whose own
    model is the reduced model's size (:func:`is_reduced_size`): one process fewer to start and to share the cores
    with."""

    def __init__(self, specs: list[BuildSpec], cache_dir: Path | None, in_process: str = "",
                 workers: SharedWorkers | None = None):
        self.cache_dir = cache_dir
        self.results: dict[str, Any] = {}
        self.futures: dict[str, Any] = {}
        self.pending: dict[str, dict] = {}  # in_process: digest → spec, computed by result()
        self.workers = workers  # the child's worker processes (one of them for these checks), unless in_process
        for spec in (s.for_phase(p) for s in specs for p in phases_of(s.phase)):
            digest, reduced = _equivalence_key(spec)
            if digest in self.results or digest in self.futures or digest in self.pending:
                continue
            cached = self._cached(digest)
            if cached is not None:
                self.results[digest] = cached
                continue
            what = (f"{spec.equivalence_steps} decode steps" if spec.phase == "decode" else
                    f"prefill calls of {spec.q_len} tokens")
            where = f"in this process {in_process}" if in_process else "in a worker process"
            ctx = equivalence_ctx(spec)
            at = f"ctx {ctx}" + ("" if ctx == spec.ctx else f" (the build's {spec.ctx}: the slots past the "
                                                                f"{spec.equivalence_steps} written are masked)")
            emit(0.01, "equivalence", f"checking the variants' equivalence {where}: {spec.kv_mode} KV, "
                 f"{at}, {what}, fp32 and fp16, on a reduced model ({reduced}, random weights)")
            if in_process or workers is None:
                self.pending[digest] = spec.to_json()
                continue
            from analyzer.convert.checks import check_reduced_equivalence as job  # a module name the worker imports

            if not self.futures:
                workers.plan(1)  # one worker runs these checks, one after the other
            self.futures[digest] = workers.submit(job, spec.to_json())

    def _cached(self, digest: str):
        path = self.cache_dir / f"{digest}.json" if self.cache_dir is not None else None
        if path is None or not path.is_file():
            return None
        try:
            report = equivalence_from_json(Field(read_json(path), str(path)))
        except QfoldError as e:  # a damaged cache entry is computed again, not trusted
            emit(0.01, "equivalence", f"ignoring the cached check: {e}")
            return None
        emit(0.01, "equivalence", f"reusing the equivalence check of this geometry ({path.name})")
        return report

    def result(self, spec: BuildSpec):
        """The report for a single-phase spec (``BuildSpec.for_phase``), waiting for the worker if needed."""

        digest, _ = _equivalence_key(spec)
        if digest not in self.results:
            t = time.monotonic()
            doc = (self.futures.pop(digest).result() if digest in self.futures else
                   _in_this_process(self.pending.pop(digest)))
            if time.monotonic() - t > 1:
                emit(0.9, "equivalence", f"waited {time.monotonic() - t:.0f} s for the equivalence check")
            if self.cache_dir is not None:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                write_json_atomic(self.cache_dir / f"{digest}.json", doc)
            self.results[digest] = equivalence_from_json(Field(doc, "equivalence worker"))
        return self.results[digest]

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()
