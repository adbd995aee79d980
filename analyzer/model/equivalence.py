"""Numerical equivalence of the attention variants, in torch (Linux has no Core ML runtime to predict with).

For one source and KV mode, every pair of variants decodes the same seeded token sequence (teacher-forced)
from an empty cache, in fp16 and in fp32; we record max |Δ logits|, bit-identity and how often the greedy
(argmax) token agrees. A reference check compares the ``repeat_kv`` decode step with the family's own
transformers forward (eager attention, fp32, fp32 cache): a large gap means the family does not pair query
head h with KV head h // G (query heads not contiguous per KV group), which Q-fold's reshape relies on.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analyzer.errors import SourceError
from analyzer.model.variants import VARIANTS

if TYPE_CHECKING:  # torch is imported where it runs, so reading a stored report needs no torch
    import torch

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
    steps: int
    tokens: tuple[int, ...]
    pairs: tuple[PairResult, ...]
    reference: ReferenceCheck


def _tokens(vocab: int, steps: int, seed: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (steps,), generator=g).tolist()


def check_equivalence(model: torch.nn.Module, kv_mode: str, ctx: int, steps: int = 8,
                      seed: int = 1234) -> EquivalenceReport:
    """Decode ``steps`` tokens with every variant in fp16 and fp32; ``model`` is fp32 and left unchanged."""
    import torch

    from analyzer.model.decode import DecodeStep, run_decode

    if steps < 1 or steps > ctx:
        raise ValueError(f"equivalence steps={steps}: must be between 1 and ctx={ctx}")
    tokens = _tokens(model.config.vocab_size, steps, seed)
    pairs: list[PairResult] = []
    for dtype_name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        m = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        logits = {v: run_decode(DecodeStep(m, ctx, v, kv_mode), tokens, dtype) for v in VARIANTS}
        for a, b in itertools.combinations(VARIANTS, 2):
            la, lb = logits[a], logits[b]
            pairs.append(PairResult(
                a, b, dtype_name, steps,
                max_abs_diff=float((la.float() - lb.float()).abs().max()),
                bit_identical=bool(torch.equal(la, lb)),
                greedy_agree_steps=int((la.argmax(-1) == lb.argmax(-1)).sum()),
            ))
        del m, logits
    return EquivalenceReport(kv_mode, ctx, steps, tuple(tokens), tuple(pairs), reference_check(model, tokens, ctx))


def reference_check(model: torch.nn.Module, tokens: list[int], ctx: int) -> ReferenceCheck:
    """``repeat_kv`` decode step (fp32 cache) against the family's own full-sequence eager forward."""
    import torch

    from analyzer.model.decode import DecodeStep, run_decode

    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()  # [N, V]
    finally:
        model.config._attn_implementation = impl
    ours = run_decode(DecodeStep(model, ctx, "repeat_kv", "state", cache_dtype=torch.float32), tokens,
                      torch.float32)
    diff = float((ours - ref).abs().max())
    scale = float(ref.abs().max())
    check = ReferenceCheck("repeat_kv", diff, scale, int((ours.argmax(-1) == ref.argmax(-1)).sum()), len(tokens))
    if diff > REFERENCE_REL_TOLERANCE * max(scale, 1e-6):
        raise SourceError(
            f"model_type={model.config.model_type!r}: the decode step differs from the model's own attention "
            f"(max |Δ logits| {diff:.3g} vs max |logit| {scale:.3g}); query heads are probably not contiguous "
            "per KV group (head h must use KV head h // G), so neither variant applies as written"
        )
    return check
