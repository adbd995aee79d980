"""Linear weights stored as their matmul reads them, for Core AI builds.

coreai-torch lowers ``F.linear(x, W)`` (``W`` stored ``[out, in]``, as torch keeps it) to a ``coreai.transpose`` of
the constant feeding ``broadcasting_batch_matmul``, and Apple's Linux runtime runs that transpose on every call:
15 of the 17 transposes of a 2-layer decode step of the default preset's attention geometry, 20-25 ms of a 100 ms
step at ctx 2048 (bench/results/coreai.json; probe/coreai/RESULTS.md, Q4 caveats). Storing ``Wᵀ`` (``[in, out]``)
and computing ``x @ Wᵀ + b`` is the same arithmetic with no transpose: the constant is read once, as stored.

Every variant of a build gets it (so an A/B still compares attention only), and the bytes stored are the same.
A weight shared with another module (a tied ``lm_head``, which is the embedding table) keeps its layout: a
transposed copy would store it twice; its one transpose per call stays.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn


class TransposedLinear(nn.Module):
    """``nn.Linear`` with its weight stored transposed (``weight_t``: ``[in, out]``)."""

    def __init__(self, linear: nn.Linear, materialise: bool) -> None:
        super().__init__()
        w = linear.weight.detach().t()
        # a value-free weight is a zero-stride view: its transposed view stays one (contiguous() would allocate it)
        self.weight_t = nn.Parameter(w.contiguous() if materialise else w, requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, self.weight_t)
        return y if self.bias is None else y + self.bias


def pretranspose_linears_(model: nn.Module, materialise: bool = True) -> int:
    """Replace, in place, every ``nn.Linear`` whose weight no other module shares with a :class:`TransposedLinear`
    (``materialise``: the transposed weight is a contiguous copy and the original is released with its module).
    Returns how many were replaced."""
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and uses[id(child.weight)] == 1:
                setattr(parent, name, TransposedLinear(child, materialise))
                replaced += 1
    return replaced
