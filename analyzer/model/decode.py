"""One decode step (q_len 1) of any transformers GQA decoder, in a form torch.jit.trace and Core ML accept.

The mechanism needs no per-family code (docs/measurements.md, "One decode step for every family"):

* attention: one function per variant is registered with ``transformers.AttentionInterface`` and named in
  ``config._attn_implementation``; every family then hands it the query ``[B, Hq, 1, D]`` and the
  un-repeated cache ``[B, Hkv, S, D]``.
* KV cache: a ``transformers.cache_utils.Cache`` whose layers hold this module's registered fp16 buffers and
  write the new token by slice assignment at ``current_pos``; traced, that is an in-place buffer write, which
  coremltools turns into a Core ML state (``--kv state``). With ``--kv input`` the cache is a read-only model
  input and the token's own key/value are returned as outputs (the write-up's "read-only KV" prototype).
* mask: our own additive ``[1, 1, 1, S]`` mask; transformers returns any 4-D mask untouched, so none of its
  mask-building code is traced. Layers with a sliding window get a window mask built in-graph.
* the family's own ``ForCausalLM.forward`` runs unchanged, so q/k norms, fused qkv, embedding scales,
  post-norms and per-layer RoPE come for free.

Not covered: multi-head latent attention caches, attention sinks (``s_aux``), hybrid linear/Mamba layers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from analyzer.errors import SourceError
from analyzer.model.ctx_thresholds import sliding_window
from analyzer.model.sources import AttentionGeometry, ModelSource, geometry_of
from analyzer.model.valuefree import check_weight_shapes, empty_model, zero_pages
from analyzer.model.variants import KV_MODES, VARIANTS, get_variant

# Masked slots get a large negative fp16-safe value (fp16 max is 65504; -inf would turn 0·inf into NaN).
MASK_VALUE = -30000.0
ATTN_PREFIX = "qfold_"


# ------------------------------------------------------------------------------------------------- model
def _fill_random_(model: nn.Module, seed: int) -> None:
    """Seeded, varied random weights, written in the parameters' own dtype (no fp32 copy for an fp16 model):
    norm scales near 1 (so no two norm consts are equal and Core ML's const deduplication does not merge
    them), everything else N(0, 0.02)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied parameter is yielded once
            if p.dim() == 1 and "norm" in name:
                p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=gen))
            else:
                p.normal_(0.0, 0.02, generator=gen)


def _load_safetensors_(model: nn.Module, source: ModelSource) -> None:
    state: dict[str, torch.Tensor] = {}
    for w in source.weights:
        state.update(load_file(str(Path(source.ref) / w.name)))  # names come from a glob of that folder
    check_weight_shapes(model, source, {name: tuple(t.shape) for name, t in state.items()})
    model.load_state_dict(state, strict=False)


def build_model(source: ModelSource, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The ``*ForCausalLM`` for a source: real weights when the source has safetensors, else seeded random,
    built directly in ``dtype`` (an fp16 build never holds an fp32 copy). Buffers are cast to ``dtype`` too,
    as ``Module.to`` would."""
    model = empty_model(source, dtype)
    if source.has_real_weights:
        _load_safetensors_(model, source)
    else:
        _fill_random_(model, source.seed)
    return model.to(dtype).eval()


def untie_embeddings_(model: nn.Module, copy_values: bool = True) -> bool:
    """Give lm_head its own copy of a tied embedding, so the two can be compressed differently.
    ``copy_values=False`` gives it a zero placeholder instead (value-free builds). Returns whether they were tied."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not emb.weight:
        return False
    w = emb.weight.detach().clone() if copy_values else zero_pages(emb.weight.shape)
    head.weight = nn.Parameter(w, requires_grad=False)
    model.config.tie_word_embeddings = False
    return True


# ------------------------------------------------------------------------------------------------- attention
@dataclass
class DecodeStepContext:
    """Per-forward plumbing between the cache layers and the attention function (python side only)."""

    kv_mode: str
    variant: str
    new_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)
    q_len: int = 1  # query rows per call: 1 for a decode step, N for a prefill step (analyzer.model.prefill)


def _attention_fn(variant_name: str) -> Callable:
    variant = get_variant(variant_name)

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                  sliding_window=None, qfold_step: DecodeStepContext | None = None,
                  qfold_window_mask=None, qfold_mask=None, s_aux=None, **_):
        if s_aux is not None:
            raise SourceError("this model uses attention sinks (s_aux); qfold's variants do not model them")
        q_len = qfold_step.q_len if qfold_step is not None else 1
        if query.shape[2] != q_len:
            raise SourceError(f"{'decode' if q_len == 1 else 'prefill'} step expects q_len {q_len}, "
                              f"got {query.shape[2]}")
        if qfold_mask is not None:  # a prefill step's masks, laid out once per call for this variant
            mask = qfold_window_mask if sliding_window is not None and qfold_window_mask is not None else qfold_mask
        else:
            mask = attention_mask
            if sliding_window is not None and qfold_window_mask is not None:
                mask = qfold_window_mask
            if mask is not None:
                mask = mask[:, :, :, : key.shape[-2]].to(query.dtype)  # [1, 1, 1, S]
        new_kv = None
        if qfold_step is not None:
            qfold_step.calls.append(module.layer_idx)
            if qfold_step.kv_mode == "input":
                new_kv = qfold_step.new_kv[module.layer_idx]
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = variant.attend(query, key, value, mask, scale, softcap, new_kv)  # [B, Hq, 1, D]
        return out.transpose(1, 2).contiguous(), None  # [B, 1, Hq, D], like eager_attention_forward

    return attention


def _register_attention() -> None:
    from transformers import AttentionInterface

    for name in VARIANTS:
        AttentionInterface.register(ATTN_PREFIX + name, _attention_fn(name))


_register_attention()


# ------------------------------------------------------------------------------------------------- cache
@functools.cache  # built once: forward() runs once per decoded token
def _cache_classes():
    from transformers.cache_utils import Cache, CacheLayerMixin

    class BufferLayer(CacheLayerMixin):
        """One layer's KV cache whose storage IS the wrapper's registered buffer (state) or input."""

        is_compileable = True
        is_sliding = False

        def __init__(self, index, keys, values, pos, step):
            super().__init__()
            self.index, self.keys, self.values, self.pos, self.step = index, keys, values, pos, step
            self.max_cache_len = keys.shape[2]
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states):
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            if self.step.kv_mode == "input":  # read-only cache: hand the new k/v to the attention function
                self.step.new_kv[self.index] = (key_states, value_states)
                return self.keys.to(key_states.dtype), self.values.to(value_states.dtype)
            p, n = self.pos, self.step.q_len  # int32 [1]; slots p .. p + n - 1
            if torch.compiler.is_exporting():
                # torch.export (the Core AI route) cannot slice at a tensor position (GuardOnDataDependentSymNode):
                # an unbacked int proven in range lowers to aten.slice_scatter → coreai.slice_update. Taken only
                # while exporting: torch.jit.trace (Core ML) would bake .item()'s value into the trace.
                p = self.pos.item()
                torch._check(p >= 0)
                torch._check(p + n <= self.max_cache_len)
            self.keys[:, :, p : p + n, :] = key_states.to(self.keys.dtype)  # in place → Core ML state write
            self.values[:, :, p : p + n, :] = value_states.to(self.values.dtype)
            return self.keys.to(key_states.dtype), self.values.to(value_states.dtype)

        def get_mask_sizes(self, *args, **kwargs):
            return self.max_cache_len, 0

        def get_seq_length(self, *args, **kwargs):
            return self.pos

        def get_max_length(self):
            return self.max_cache_len

    class BufferCache(Cache):
        def __init__(self, layers):
            super().__init__(layers=layers)

    return BufferLayer, BufferCache


class DecodeStep(nn.Module):
    """Single-token decode step. Inputs: ``input_ids`` int32 ``[1, 1]``, ``current_pos`` int32 ``[1]``,
    ``causal_mask`` additive ``[1, 1, 1, S]``; with ``kv_mode="input"`` also ``k_cache_i``/``v_cache_i``
    ``[1, Hkv, S, D]`` per layer. Output: logits ``[1, 1, V]`` (plus ``new_k``/``new_v`` ``[L, Hkv, 1, D]``
    in input mode, for the host to write into its cache)."""

    def __init__(self, model: nn.Module, ctx: int, variant: str, kv_mode: str = "state",
                 cache_dtype: torch.dtype = torch.float16, lazy_cache: bool = False):
        """``lazy_cache``: the KV buffers are :func:`zero_pages`, resident only where written (a trace writes
        one slot), so a value-free build's memory does not grow with ctx."""
        super().__init__()
        get_variant(variant)
        if kv_mode not in KV_MODES:
            raise ValueError(f"kv mode {kv_mode!r}: choose one of {KV_MODES}")
        self.model = model
        self.geometry: AttentionGeometry = geometry_of(model.config)
        self.ctx, self.variant, self.kv_mode, self.cache_dtype = ctx, variant, kv_mode, cache_dtype
        g = self.geometry
        self.lazy_cache = lazy_cache
        if kv_mode == "state":
            shape = (1, g.num_kv_heads, ctx, g.head_dim)
            for i in range(g.num_layers):
                for kv in "kv":
                    buf = zero_pages(shape, cache_dtype) if lazy_cache else torch.zeros(shape, dtype=cache_dtype)
                    self.register_buffer(f"{kv}_cache_{i}", buf)

    def reset(self) -> None:
        for name, buf in self.named_buffers():
            if "_cache_" in name:
                buf.zero_()

    def _window(self) -> int | None:
        """The sliding window W if some layer slides in transformers' sense and W < ctx."""
        return sliding_window(self.model.config, self.ctx)

    def forward(self, input_ids, current_pos, causal_mask, *kv_inputs):
        self.model.config._attn_implementation = ATTN_PREFIX + self.variant
        step = DecodeStepContext(self.kv_mode, self.variant)
        layer_cls, cache_cls = _cache_classes()
        n = self.geometry.num_layers
        if self.kv_mode == "state":
            kv = [(getattr(self, f"k_cache_{i}"), getattr(self, f"v_cache_{i}")) for i in range(n)]
        else:
            if len(kv_inputs) != 2 * n:
                raise ValueError(f"input KV mode needs {2 * n} cache tensors, got {len(kv_inputs)}")
            kv = [(kv_inputs[2 * i], kv_inputs[2 * i + 1]) for i in range(n)]
        cache = cache_cls([layer_cls(i, k, v, current_pos, step) for i, (k, v) in enumerate(kv)])
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = causal_mask.to(dtype)
        extra = {"qfold_step": step}
        window = self._window()
        if window is not None:
            # transformers' sliding window keeps kv_idx > q_idx - W: mask out slots at or before pos - W
            idx = torch.arange(self.ctx, dtype=torch.int32).view(1, 1, 1, self.ctx)
            far = idx <= (current_pos.view(1, 1, 1, 1) - window)
            extra["qfold_window_mask"] = torch.where(far, torch.full_like(mask, MASK_VALUE), mask)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=current_pos.view(1, 1),
                         cache=cache, use_cache=True, return_dict=True, **extra)
        if sorted(set(step.calls)) != list(range(n)):
            raise SourceError(
                f"model_type={self.model.config.model_type!r}: attention of layers "
                f"{sorted(set(range(n)) - set(step.calls))} did not go through transformers' AttentionInterface; "
                "this architecture (hybrid, linear or custom attention) is not supported"
            )
        if self.kv_mode == "state":
            return out.logits
        new_k = torch.cat([step.new_kv[i][0] for i in range(n)], 0).to(self.cache_dtype)  # [L, Hkv, 1, D]
        new_v = torch.cat([step.new_kv[i][1] for i in range(n)], 0).to(self.cache_dtype)
        return out.logits, new_k, new_v


def make_mask(ctx: int, pos: int, dtype: torch.dtype, include_current: bool) -> torch.Tensor:
    """Additive mask ``[1, 1, 1, S]``: 0 for slots the token may attend to, MASK_VALUE elsewhere.
    In state mode the current slot holds the token's own k/v (include_current); in input mode it does not."""
    m = torch.full((1, 1, 1, ctx), MASK_VALUE, dtype=dtype)
    m[..., : pos + 1 if include_current else pos] = 0
    return m


def example_inputs(step: DecodeStep, pos: int = 0, token: int = 1) -> tuple[torch.Tensor, ...]:
    g = step.geometry
    ins = [torch.tensor([[token]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32),
           make_mask(step.ctx, pos, torch.float16, include_current=step.kv_mode == "state")]
    if step.kv_mode == "input":
        shape = (1, g.num_kv_heads, step.ctx, g.head_dim)
        ins += [zero_pages(shape, step.cache_dtype) if step.lazy_cache else torch.zeros(shape, dtype=step.cache_dtype)
                for _ in range(2 * g.num_layers)]
    return tuple(ins)


def host_cache(step) -> list[torch.Tensor] | None:
    """An empty host-side K/V cache (``[1, Hkv, ctx, D]`` per layer, K then V) for a step whose cache is passed as
    inputs; None when the step keeps its cache as state."""
    if step.kv_mode != "input":
        return None
    g = step.geometry
    return [torch.zeros(1, g.num_kv_heads, step.ctx, g.head_dim, dtype=step.cache_dtype)
            for _ in range(2 * g.num_layers)]


def run_decode(step: DecodeStep, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Teacher-forced decode of ``tokens`` from an empty cache; returns logits ``[N, V]`` in ``dtype``."""
    step.reset()
    host_kv = host_cache(step)
    outs = []
    with torch.no_grad():
        for pos, tok in enumerate(tokens):
            ids = torch.tensor([[tok]], dtype=torch.int32)
            cp = torch.tensor([pos], dtype=torch.int32)
            mask = make_mask(step.ctx, pos, dtype, include_current=step.kv_mode == "state")
            if host_kv is None:
                logits = step(ids, cp, mask)
            else:
                logits, new_k, new_v = step(ids, cp, mask, *host_kv)
                for i in range(step.geometry.num_layers):
                    host_kv[2 * i][:, :, pos : pos + 1] = new_k[i : i + 1]
                    host_kv[2 * i + 1][:, :, pos : pos + 1] = new_v[i : i + 1]
            outs.append(logits[0, -1].clone())
    return torch.stack(outs)

