"""One prefill step (q_len N > 1): N prompt tokens at positions ``current_pos .. current_pos + N - 1`` in one
call, in the form torch.jit.trace and Core ML accept.

It is the decode step's mechanism (:mod:`analyzer.model.decode`: attention registered with transformers'
``AttentionInterface``, a buffer-backed cache, our own 4-D mask, the family's own ``ForCausalLM.forward``)
with N query rows instead of one:
* inputs: ``input_ids`` int32 ``[1, N]``, ``current_pos`` int32 ``[1]`` (the first token's position), and an
  additive ``causal_mask``: ``[1, 1, N, S]`` with the cache as state (row n sees slots ≤ current_pos + n, the
  N new ones included, because the step writes them first), ``[1, 1, N, S + N]`` with the cache as inputs
  (cache slots < current_pos, then the new tokens, causal);
* KV as state: the step writes N slots, ``current_pos .. current_pos + N - 1``, of every layer's K and V;
  as inputs: the cache is read only and the new ``new_k``/``new_v`` ``[L, Hkv, N, D]`` are outputs;
* output: the logits of the last prompt token ``[1, 1, V]`` (what the first decode step needs;
  ``all_logits=True`` keeps every row, for the equivalence check);
* layers with a sliding window get a per-row window mask built in-graph from ``current_pos``;
* the variant lays the masks out once per call (Q-fold merges the group and sequence axes, so its mask rows
  are repeated G times: :meth:`analyzer.model.variants.QFold.prepare_mask`), not once per layer.

A call costs the same whatever ``current_pos`` is: the static cache is read in full, masked or not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analyzer.errors import SourceError
from analyzer.model.decode import (
    ATTN_PREFIX,
    MASK_VALUE,
    DecodeStep,
    DecodeStepContext,
    _cache_classes,
    host_cache,
    zero_pages,
)
from analyzer.model.spec import DEFAULT_Q_LEN
from analyzer.model.variants import get_variant

if TYPE_CHECKING:
    import numpy as np
    import torch

class PrefillStep(DecodeStep):
    """N prompt tokens per call (module docstring). Same buffers (KV as state), window rule and reset as
    :class:`~analyzer.model.decode.DecodeStep`."""

    def __init__(self, model, ctx: int, variant: str, kv_mode: str = "state", q_len: int = DEFAULT_Q_LEN,
                 cache_dtype=None, all_logits: bool = False, lazy_cache: bool = False):
        import torch

        if isinstance(q_len, bool) or not isinstance(q_len, int) or not 2 <= q_len <= ctx:
            raise SourceError(f"prefill q_len {q_len!r}: must be an integer from 2 to ctx={ctx}")
        super().__init__(model, ctx, variant, kv_mode, cache_dtype or torch.float16, lazy_cache=lazy_cache)
        self.q_len, self.all_logits = q_len, all_logits

    def forward(self, input_ids, current_pos, causal_mask, *kv_inputs):
        import torch

        n, s = self.q_len, self.ctx
        g = self.geometry
        self.model.config._attn_implementation = ATTN_PREFIX + self.variant
        step = DecodeStepContext(self.kv_mode, self.variant, q_len=n)
        layer_cls, cache_cls = _cache_classes()
        if self.kv_mode == "state":
            kv = [(getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")) for i in range(g.num_layers)]
        else:
            if len(kv_inputs) != 2 * g.num_layers:
                raise ValueError(f"input KV mode needs {2 * g.num_layers} cache tensors, got {len(kv_inputs)}")
            kv = [(kv_inputs[2 * i], kv_inputs[2 * i + 1]) for i in range(g.num_layers)]
        cache = cache_cls([layer_cls(i, k, v, current_pos, step) for i, (k, v) in enumerate(kv)])
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = causal_mask.to(dtype)  # [1, 1, N, S] (state) or [1, 1, N, S + N] (input)
        rows = current_pos.view(1, 1) + torch.arange(n, dtype=torch.int32).view(1, n)  # positions [1, N]
        variant = get_variant(self.variant)
        extra = {"qfold_step": step, "qfold_mask": variant.prepare_mask(mask, g.group_size)}
        window = self._window()
        if window is not None:
            # transformers' sliding window keeps kv_idx > q_idx - W, per row q_idx = current_pos + n
            cols = torch.arange(s, dtype=torch.int32).view(1, s)  # cache slot = position
            if self.kv_mode == "input":  # the new tokens sit after the cache columns
                cols = torch.cat([cols, rows], dim=1)
            far = cols.view(1, 1, 1, -1) <= (rows.view(1, 1, n, 1) - window)  # [1, 1, N, W]
            window_mask = torch.where(far, torch.full_like(mask, MASK_VALUE), mask)
            extra["qfold_window_mask"] = variant.prepare_mask(window_mask, g.group_size)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=rows, cache=cache,
                         use_cache=True, return_dict=True, logits_to_keep=0 if self.all_logits else 1, **extra)
        if sorted(set(step.calls)) != list(range(g.num_layers)):
            raise SourceError(
                f"model_type={self.model.config.model_type!r}: attention of layers "
                f"{sorted(set(range(g.num_layers)) - set(step.calls))} did not go through transformers' "
                "AttentionInterface; this architecture (hybrid, linear or custom attention) is not supported"
            )
        if self.kv_mode == "state":
            return out.logits
        new_k = torch.cat([step.new_kv[i][0] for i in range(g.num_layers)], 0).to(self.cache_dtype)  # [L,Hkv,N,D]
        new_v = torch.cat([step.new_kv[i][1] for i in range(g.num_layers)], 0).to(self.cache_dtype)
        return out.logits, new_k, new_v


def make_prefill_mask(ctx: int, pos: int, q_len: int, dtype: torch.dtype, kv_mode: str) -> torch.Tensor:
    """The additive mask of a prefill call at ``pos``: 0 where row n may attend, MASK_VALUE elsewhere.

    KV as state ``[1, 1, N, S]``: row n sees slots ``0 .. pos + n`` (its own slot holds its own k/v).
    KV as input ``[1, 1, N, S + N]``: row n sees the cache slots ``0 .. pos - 1`` and new tokens ``0 .. n``."""
    import torch

    rows = torch.arange(q_len).view(q_len, 1)
    if kv_mode == "state":
        visible = torch.arange(ctx).view(1, ctx) <= pos + rows  # [N, S]
    else:
        cache = (torch.arange(ctx) < pos).view(1, ctx).expand(q_len, ctx)
        visible = torch.cat([cache, torch.arange(q_len).view(1, q_len) <= rows], dim=1)  # [N, S + N]
    m = torch.full(visible.shape, MASK_VALUE, dtype=dtype)
    m[visible] = 0
    return m.view(1, 1, *visible.shape)


def example_prefill_inputs(step: PrefillStep, pos: int = 0, token: int = 1) -> tuple[torch.Tensor, ...]:
    import torch

    g = step.geometry
    ins = [torch.full((1, step.q_len), token, dtype=torch.int32), torch.tensor([pos], dtype=torch.int32),
           make_prefill_mask(step.ctx, pos, step.q_len, torch.float16, step.kv_mode)]
    if step.kv_mode == "input":
        shape = (1, g.num_kv_heads, step.ctx, g.head_dim)
        ins += [zero_pages(shape, step.cache_dtype) if step.lazy_cache else torch.zeros(shape, dtype=step.cache_dtype)
                for _ in range(2 * g.num_layers)]
    return tuple(ins)


def run_prefill(step: PrefillStep, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Prefill ``tokens`` from an empty cache in calls of ``step.q_len`` (the count must be a multiple of it);
    returns the logits in ``dtype``: ``[len(tokens), V]`` with ``all_logits``, else one row per call."""
    import torch

    n = step.q_len
    if not tokens or len(tokens) % n or len(tokens) > step.ctx:
        raise ValueError(f"prefill of {len(tokens)} tokens: need a positive multiple of q_len={n} up to "
                         f"ctx={step.ctx}")
    step.reset()
    host_kv = host_cache(step)
    outs = []
    with torch.no_grad():
        for pos in range(0, len(tokens), n):
            ids = torch.tensor([tokens[pos : pos + n]], dtype=torch.int32)
            cp = torch.tensor([pos], dtype=torch.int32)
            mask = make_prefill_mask(step.ctx, pos, n, dtype, step.kv_mode)
            if host_kv is None:
                logits = step(ids, cp, mask)
            else:
                logits, new_k, new_v = step(ids, cp, mask, *host_kv)
                for i in range(step.geometry.num_layers):
                    host_kv[2 * i][:, :, pos : pos + n] = new_k[i : i + 1]
                    host_kv[2 * i + 1][:, :, pos : pos + n] = new_v[i : i + 1]
            outs.append(logits[0].clone())
    return torch.cat(outs)


def call_inputs(step: PrefillStep, tokens: list[int], pos: int) -> dict[str, np.ndarray]:
    """The Core ML inputs of one prefill call, by name, as NumPy arrays (``input_ids``, ``current_pos``,
    ``causal_mask``; the caches as zeros with ``--kv input``): what the converted package's ``prefill`` function
    takes. This is the hook for the MIL interpreter's check (issue #9's ``analyzer.engines.interpret``): run the
    function on these inputs and compare its logits and the N cache slots it writes with :func:`run_prefill`'s."""
    import torch

    if len(tokens) != step.q_len:
        raise ValueError(f"a prefill call takes q_len={step.q_len} tokens, got {len(tokens)}")
    g = step.geometry
    out = {"input_ids": np.asarray([tokens], dtype=np.int32), "current_pos": np.asarray([pos], dtype=np.int32),
           "causal_mask": make_prefill_mask(step.ctx, pos, step.q_len, torch.float16, step.kv_mode).numpy()}
    if step.kv_mode == "input":
        for i in range(g.num_layers):
            for kv in "kv":
                out[f"{kv}_cache_{i}"] = np.zeros((1, g.num_kv_heads, step.ctx, g.head_dim), dtype=np.float16)
    return out
