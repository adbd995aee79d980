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

The torch report is shared by every build of one source, KV mode, ctx and step count (it does not depend
on the variant, nor on compression, which happens after conversion); the ``torch_variants`` check says so
(``covers_package_weights`` False for a compressed build) instead of lending its bit-identity to a
compressed package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from analyzer.graph.buildinfo import EquivalenceCheck

if TYPE_CHECKING:
    from analyzer.graph.buildinfo import StoredSpec
    from analyzer.model.equivalence import EquivalenceReport
    from analyzer.model.sources import ModelSource

# The interpreter check runs at build time when the fp16 weights plus the KV cache stay under this many bytes
# (2-layer builds: seconds); a full-size decode step takes up to 30 s in the interpreter (issue #9) and a
# 30-layer structure build at ctx 4096 carries 240 MiB of cache, so those record the check as not run and name
# the command that runs it.
INTERPRETER_CHECK_MAX_BYTES = 128 << 20
INTERPRETER_CHECK_STEPS = 4


def _weights_text(source: ModelSource) -> str:
    return "safetensors weights" if source.has_real_weights else f"seeded random weights (seed {source.seed})"


def torch_check(report: EquivalenceReport, spec: StoredSpec) -> EquivalenceCheck:
    """The torch report's repeat_kv vs qfold fp16 pair as a check record (fp32 in the note)."""
    pairs = {p.dtype: p for p in report.pairs if {p.variant_a, p.variant_b} == {"repeat_kv", "qfold"}}
    fp16, fp32 = pairs.get("fp16"), pairs.get("fp32")
    compressed = spec.compression
    note = f"fp32 max |Δ logits| {fp32.max_abs_diff:.3g}" if fp32 else ""
    if compressed:
        note = (f"{note}; " if note else "") + (
            f"the torch models are uncompressed: this says nothing about the {compressed} weights this "
            "package stores (see the interpreter check)")
    return EquivalenceCheck(
        "torch_variants", f"repeat_kv vs qfold, {report.what}, fp16 (and fp32) torch",
        f"uncompressed torch model, {_weights_text(spec.source)}", report.steps, fp16 is not None,
        max_abs_diff=None if fp16 is None else fp16.max_abs_diff,
        max_abs_value=report.reference.max_abs_logit or None,
        bit_identical=None if fp16 is None else fp16.bit_identical,
        greedy_agree_steps=None if fp16 is None else fp16.greedy_agree_steps,
        covers_package_weights=not compressed, note=note,
    )


def folded_check(proof) -> EquivalenceCheck:
    """The fold proof (``analyzer.graph.passes.proof.FoldProof``) as a check record."""
    diffs = proof.max_abs_diff
    return EquivalenceCheck(
        "folded_vs_original", "folded package vs the package it was folded from, every output and final state",
        "the stored weights of both packages (identical, checked per constant)", proof.steps, proof.checked,
        max_abs_diff=max(diffs.values()) if diffs else None,
        max_abs_value=max(proof.max_abs_value.values()) if proof.max_abs_value else None,
        bit_identical=proof.bit_identical if proof.checked else None,
        note=proof.headline(),
    )


def interpreter_reference(model, spec, tokens: list[int]):
    """Torch fp16 logits ``[N, V]`` of the build's own variant for the interpreter check, or None when the
    package will be too large to interpret at build time. Call before the torch model is freed."""
    import copy

    import torch

    from analyzer.model.decode import DecodeStep, run_decode
    from analyzer.model.sources import geometry_of

    g = geometry_of(model.config)
    kv_bytes = 2 * g.num_layers * g.num_kv_heads * spec.ctx * g.head_dim * 2  # K and V, fp16
    if sum(p.numel() for p in model.parameters()) * 2 + kv_bytes > INTERPRETER_CHECK_MAX_BYTES:
        return None
    half = copy.deepcopy(model).to(torch.float16)
    step = DecodeStep(half, spec.ctx, spec.variant, spec.kv_mode).eval()
    return run_decode(step, tokens[:INTERPRETER_CHECK_STEPS], torch.float16).float().numpy()


def interpreter_check(package, spec, tokens: list[int], reference, function: str | None = None) -> EquivalenceCheck:
    """The saved package (its decode ``function``; default: its only one) run in the MIL interpreter on the torch
    check's tokens vs torch fp16 logits."""
    import numpy as np

    from analyzer.errors import QfoldError

    compressed = spec.compression
    weights = (f"this package's {compressed}-compressed weights vs the uncompressed torch model" if compressed
               else "this package's fp16 weights vs the same weights in torch (fp16)")
    steps = min(len(tokens), INTERPRETER_CHECK_STEPS)
    compared = f"{spec.variant} package in the MIL interpreter vs its torch decode step, logits"
    if reference is None:
        return EquivalenceCheck(
            "interpreter_vs_torch", compared, weights, steps, False,
            note=f"not run at build time: over {INTERPRETER_CHECK_MAX_BYTES >> 20} MiB of weights and KV cache; "
                 "`python -m analyzer run` evaluates the package")
    from analyzer.graph.interpret import decode_steps, load_program

    try:
        run = decode_steps(load_program(package, function), steps, tokens=np.asarray(tokens[:steps]).reshape(steps, 1))
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
