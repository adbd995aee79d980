"""Packages made as other tools make them: a torch decoder step with transformers' ``repeat_kv`` attention,
traced (``torch.jit.trace``) and converted with plain ``ct.convert`` (iOS 18, fp16), at a fixed sequence length or
a ``ct.RangeDim`` one. ``pool``: the attention output is smoothed by ``F.avg_pool1d``, which coremltools lowers to
MIL ``avg_pool``, an op no LLM decode step needs and qfold's MIL interpreter has no kernel for: such a package
cannot be run by the interpreter (so a flexible one cannot be sized, and a fold of it cannot be proven) whatever
the interpreter learns about the shape arithmetic converters emit.

Shapes: H hidden, Hq query heads, Hkv KV heads (G = Hq / Hkv), D head dim, S the sequence length (1…SMAX when
flexible, 4 when fixed).
"""

from __future__ import annotations

from pathlib import Path

H, HQ, HKV, D = 32, 4, 2, 8
SMAX = 16
FIXED_S = 4


def convert_gqa_step(path: Path, *, flexible: bool, pool: bool) -> str:
    import coremltools as ct
    import numpy as np
    import torch
    import torch.nn.functional as F

    def repeat_kv(x, n_rep):  # transformers' repeat_kv: expand + reshape (head h reads KV head h // G)
        b, h, s, d = x.shape
        return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.q, self.k, self.v = (torch.nn.Linear(H, n * D, bias=False) for n in (HQ, HKV, HKV))
            self.o = torch.nn.Linear(HQ * D, H, bias=False)
            for m in (self.q, self.k, self.v, self.o):
                m.weight.data = torch.randn(m.weight.shape, generator=g) * 0.3

        def forward(self, hidden_states):
            b, s, _ = hidden_states.shape
            q = self.q(hidden_states).view(b, s, HQ, D).transpose(1, 2)  # (B, Hq, S, D)
            k = self.k(hidden_states).view(b, s, HKV, D).transpose(1, 2)  # (B, Hkv, S, D)
            v = self.v(hidden_states).view(b, s, HKV, D).transpose(1, 2)
            k, v = repeat_kv(k, HQ // HKV), repeat_kv(v, HQ // HKV)  # (B, Hq, S, D): MIL tiles
            w = torch.softmax(q @ k.transpose(2, 3) * D ** -0.5, dim=-1)
            out = (w @ v).transpose(1, 2).reshape(b, s, HQ * D)  # (B, S, Hq·D)
            if pool:
                out = F.avg_pool1d(out.transpose(1, 2), 3, stride=1, padding=1,
                                   count_include_pad=False).transpose(1, 2)  # MIL avg_pool
            return self.o(out)

    traced = torch.jit.trace(Step().eval(), torch.randn(1, FIXED_S, H))
    shape = (1, ct.RangeDim(1, SMAX, default=1), H) if flexible else (1, FIXED_S, H)
    model = ct.convert(traced, inputs=[ct.TensorType(name="hidden_states", shape=shape, dtype=np.float16)],
                       outputs=[ct.TensorType(name="out")], minimum_deployment_target=ct.target.iOS18,
                       convert_to="mlprogram")
    model.save(str(path))
    return str(path)
