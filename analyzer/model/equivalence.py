"""Numerical equivalence of the attention variants, in torch (Linux has no Core ML runtime to predict with).

For one source and KV mode, every pair of variants decodes the same seeded token sequence (teacher-forced)
from an empty cache, in fp16 and in fp32; we record max |Δ logits|, bit-identity and how often the greedy
(argmax) token agrees. A reference check compares the ``repeat_kv`` decode step with the family's own
transformers forward (eager attention, fp32, fp32 cache): a large gap means the family does not pair query
head h with KV head h // G (query heads not contiguous per KV group), which Q-fold's reshape relies on.

A prefill step (:func:`check_prefill_equivalence`) is checked the same way over a whole prompt: every variant
prefills the same seeded prompt (two calls of q_len tokens when the cache holds them, so the second call reads
what the first wrote) and the logits of every prompt row are compared; the reference is the family's own
forward over the same prompt.
"""

from __future__ import annotations

import copy
import itertools
from typing import TYPE_CHECKING

from analyzer.errors import SourceError
from analyzer.model.decode import DecodeStep, run_decode
from analyzer.model.equivalence_records import (
    REFERENCE_REL_TOLERANCE,
    EquivalenceReport,
    PairResult,
    ReferenceCheck,
)
from analyzer.model.prefill import PrefillStep, run_prefill
from analyzer.model.variants import CHECKED_VARIANTS

if TYPE_CHECKING:  # torch is imported where it runs, so reading a stored report needs no torch
    import torch

def _tokens(vocab: int, steps: int, seed: int) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (steps,), generator=g).tolist()


def check_equivalence(model: torch.nn.Module, kv_mode: str, ctx: int, steps: int = 8,
                      seed: int = 1234) -> EquivalenceReport:
    """Decode ``steps`` tokens with every variant in fp16 and fp32; ``model`` is fp32 and left unchanged."""
    import torch


    if steps < 1 or steps > ctx:
        raise ValueError(f"equivalence steps={steps}: must be between 1 and ctx={ctx}")
    tokens = _tokens(model.config.vocab_size, steps, seed)
    pairs: list[PairResult] = []
    for dtype_name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        m = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        logits = {v: run_decode(DecodeStep(m, ctx, v, kv_mode), tokens, dtype) for v in CHECKED_VARIANTS}
        pairs += _pairs(logits, dtype_name, steps)
        del m, logits
    return EquivalenceReport(kv_mode, ctx, steps, tuple(tokens), tuple(pairs), reference_check(model, tokens, ctx))


def reference_check(model: torch.nn.Module, tokens: list[int], ctx: int) -> ReferenceCheck:
    """``repeat_kv`` decode step (fp32 cache) against the family's own full-sequence eager forward."""
    import torch


    ours = run_decode(DecodeStep(model, ctx, "repeat_kv", "state", cache_dtype=torch.float32), tokens,
                      torch.float32)
    return _against_family(model, tokens, ours, "decode step")


def _against_family(model: torch.nn.Module, tokens: list[int], ours: torch.Tensor, what: str) -> ReferenceCheck:
    """Logits ``ours`` ``[N, V]`` (a ``repeat_kv`` step run over ``tokens``) against the family's own
    full-sequence eager forward; refuses a family whose query heads are not contiguous per KV group."""
    import torch

    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()  # [N, V]
    finally:
        model.config._attn_implementation = impl
    diff = float((ours - ref).abs().max())
    scale = float(ref.abs().max())
    check = ReferenceCheck("repeat_kv", diff, scale, int((ours.argmax(-1) == ref.argmax(-1)).sum()), len(tokens))
    if diff > REFERENCE_REL_TOLERANCE * max(scale, 1e-6):
        raise SourceError(
            f"model_type={model.config.model_type!r}: the {what} differs from the model's own attention "
            f"(max |Δ logits| {diff:.3g} vs max |logit| {scale:.3g}); query heads are probably not contiguous "
            "per KV group (head h must use KV head h // G), so neither variant applies as written"
        )
    return check


def prefill_tokens(ctx: int, q_len: int) -> int:
    """Prompt tokens the prefill check runs: two calls when the cache holds them (the second reads the cache
    the first wrote), else one."""
    return q_len * max(1, min(2, ctx // q_len))


def check_prefill_equivalence(model: torch.nn.Module, kv_mode: str, ctx: int, q_len: int,
                              seed: int = 1234) -> EquivalenceReport:
    """Prefill the same seeded prompt with every variant in fp16 and fp32 and compare the logits of every prompt
    row; ``model`` is fp32 and left unchanged. The reference is the family's own forward over the prompt."""
    import torch


    n_tokens = prefill_tokens(ctx, q_len)
    tokens = _tokens(model.config.vocab_size, n_tokens, seed)
    pairs: list[PairResult] = []
    for dtype_name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        m = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
        logits = {v: run_prefill(PrefillStep(m, ctx, v, kv_mode, q_len, all_logits=True), tokens, dtype)
                  for v in CHECKED_VARIANTS}
        pairs += _pairs(logits, dtype_name, n_tokens)
        del m, logits
    ours = run_prefill(PrefillStep(model, ctx, "repeat_kv", "state", q_len, cache_dtype=torch.float32,
                                   all_logits=True), tokens, torch.float32)
    reference = _against_family(model, tokens, ours, "prefill step")
    return EquivalenceReport(kv_mode, ctx, n_tokens, tuple(tokens), tuple(pairs), reference, "prefill", q_len)


def _pairs(logits: dict[str, torch.Tensor], dtype_name: str, rows: int) -> list[PairResult]:
    """Every pair of variants' logits ``[rows, V]`` compared: max |Δ|, bit-identity, greedy agreement."""
    import torch

    out = []
    for a, b in itertools.combinations(CHECKED_VARIANTS, 2):
        la, lb = logits[a], logits[b]
        out.append(PairResult(
            a, b, dtype_name, rows,
            max_abs_diff=float((la.float() - lb.float()).abs().max()),
            bit_identical=bool(torch.equal(la, lb)),
            greedy_agree_steps=int((la.argmax(-1) == lb.argmax(-1)).sum()),
        ))
    return out
