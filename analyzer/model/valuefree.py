"""Torch models before (or without) the source's weight values.

* :func:`empty_model`: the family's ``*ForCausalLM`` with parameters allocated but never written, which
  ``decode.build_model`` then fills (safetensors or seeded random).
* Value-free models (the ``analysis`` build mode, ``analyzer.convert.header_blobs``): every parameter a zero-page
  placeholder while traced (:func:`build_value_free_model`; products with it skipped: :class:`ZeroPageProducts`),
  then a zero-stride fp16 view of one constant per tensor while converted (:func:`assign_value_free_weights_`):
  shapes and dtypes, no values, no memory.
* The reduced model (:func:`reduced_source`): the same attention geometry at a size whose fp32 model costs
  seconds, on which the variants' numerical equivalence is checked (never on value-free weights).
"""

from __future__ import annotations

import math
import mmap

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from analyzer.errors import SourceError
from analyzer.model.sources import ModelSource, geometry_of, load_config, safetensors_shapes, source_from_fingerprint


def empty_model(source: ModelSource, dtype: torch.dtype) -> nn.Module:
    """The ``*ForCausalLM`` of a source with its parameters allocated in ``dtype`` but never written
    (``no_init_weights``), its buffers (RoPE tables, embedding scales) computed as usual, weights tied."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = load_config(source)
    config._attn_implementation = "eager"
    try:
        with no_init_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except ValueError as e:
        raise SourceError(f"model_type={config.model_type!r} has no causal-LM class in transformers: {e}") from e
    model.tie_weights()  # no_init_weights skips the init that would tie them
    return model


def check_weight_shapes(model: nn.Module, source: ModelSource, found: dict[str, tuple[int, ...]]) -> None:
    """Refuse safetensors whose tensor names or shapes do not fit the model the config implies: none of the
    names match, a shape differs, or a tensor is missing (a tied lm_head and RoPE's inv_freq may be)."""
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    unexpected = sorted(set(found) - set(expected))
    if unexpected and not (set(found) & set(expected)):
        raise SourceError(
            f"{source.ref}: no tensor name in the safetensors files matches the model "
            f"(first found: {unexpected[0]!r}, first expected: {next(iter(expected))!r})"
        )
    for name, shape in found.items():
        if name in expected and shape != expected[name]:
            raise SourceError(f"{source.ref}: tensor {name!r} has shape {list(shape)}, "
                              f"the config implies {list(expected[name])}")
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = [m for m in expected if m not in found and m not in tied and not m.endswith("inv_freq")]
    if missing:
        raise SourceError(f"{source.ref}: safetensors files lack {len(missing)} tensors, e.g. {missing[:3]}")


def zero_pages(shape, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """A tensor backed by a private anonymous memory map that nothing has written: it reads as zeros and the
    kernel maps its shared zero page until a page is written, so reading it adds nothing to the resident set
    however large it is (measured: a 1 GiB read, +0 GB RSS). Private, not ``mmap``'s default shared mapping:
    a shared anonymous map is shmem, whose read faults allocate real pages."""

    n = max(1, math.prod(shape))
    size = n * torch.empty((), dtype=dtype).element_size()
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buf, dtype=dtype, count=n).view(tuple(shape))


def build_value_free_model(source: ModelSource) -> nn.Module:
    """The fp16 ``*ForCausalLM`` of a source with every parameter a zero placeholder (:func:`zero_pages`) and
    its buffers real. Trace it as is (a forward over zeros costs no memory), then call
    :func:`assign_value_free_weights_` before converting. Real safetensors weights are not read: only their
    headers, checked against the model (:func:`check_weight_shapes`)."""
    model = empty_model(source, torch.float16)
    if source.has_real_weights:  # the values are not needed, but the files must fit the config
        check_weight_shapes(model, source, safetensors_shapes(source))
    for p in model.parameters():  # tied parameters are yielded once
        p.requires_grad_(False)
        p.data = zero_pages(p.shape)
    return model.to(torch.float16).eval()  # buffers (e.g. RoPE inv_freq) to fp16, as build_model does


class ZeroPageProducts(TorchDispatchMode):
    """The fp16 matrix products (``mm``, ``addmm``, ``bmm``) of a value-free model's trace (every parameter
    :func:`zero_pages`) return zeros of their shape (``addmm``: its bias term) without multiplying, because they
    are zero: a projection's weight is all zeros (``weight_hits``: a 70B decode forward is 7·10^10 fp16
    multiply-adds on the CPU), and so is every activation computed from the weights, so the attention products
    over the KV cache are zero too (``activation_hits``: this machine's fp16 ``bmm`` over a ctx-4096 cache made
    two thirds of a 1.2B model's trace). Products of other dtypes (RoPE's fp32 frequencies) are computed.
    A contiguous copy of a broadcast view whose values are all zero is lazy zeros too (:meth:`_copy`).
    ``torch.jit.trace`` records each op above this mode and the values never reach the graph (tests compare the
    traced graphs, tensor types and strides included, with and without it)."""

    PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default)
    COPY_MIN_ELEMENTS = 1 << 20  # smaller copies cost less than the check

    def __init__(self, model: nn.Module):
        super().__init__()
        self.storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.weight_hits = self.activation_hits = self.copy_hits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.clone.default:
            return self._copy(args[0], kwargs) if kwargs.get("memory_format") is torch.contiguous_format \
                else func(*args, **kwargs)
        if func not in self.PRODUCTS or args[-1].dtype != torch.float16:
            return func(*args, **kwargs)
        a, b = args[-2:]
        if any(m.untyped_storage().data_ptr() in self.storages for m in (a, b)):
            self.weight_hits += 1
        else:
            self.activation_hits += 1
        out = torch.zeros((*a.shape[:-1], b.shape[-1]), dtype=a.dtype)
        return out + args[0] * kwargs.get("beta", 1) if func is torch.ops.aten.addmm.default else out

    def _copy(self, x: torch.Tensor, kwargs) -> torch.Tensor:
        """A contiguous copy of a broadcast view (``repeat_kv``'s ``expand`` → ``reshape`` of the KV cache: G × the
        cache written per layer, 16 GB for Llama-3.1-8B at ctx 32768) whose distinct elements are all zero bits (an
        empty lazy cache; a slot the trace wrote holds the key of zero weights, zero unless a bias made it
        otherwise) is :func:`zero_pages` of its shape: the same values and layout, nothing written. Any other copy
        is made."""
        zero_strided = 0 in x.stride()
        if x.dtype == torch.float16 and x.numel() >= self.COPY_MIN_ELEMENTS and zero_strided and x.is_cpu:
            distinct = x.as_strided([n if st else 1 for n, st in zip(x.shape, x.stride(), strict=True)], x.stride())
            if not torch.count_nonzero(distinct.view(torch.int16)):  # bit patterns: -0.0 is not 0
                self.copy_hits += 1
                return zero_pages(x.shape, x.dtype)
        return torch.ops.aten.clone.default(x, **kwargs)


def value_free_constant(index: int) -> float:
    """The value every element of the ``index``-th parameter takes in a value-free build: 2^-7·(1 + j/1024)
    for j = index mod 1024 (exact in fp16, whose spacing in [2^-7, 2^-6) is 2^-17), one binade up per 1024
    tensors. Distinct per tensor, so ``common::const_deduplication`` merges nothing it would not merge in a
    random-weight build; never 0 or 1, so ``common::noop_elimination`` cannot drop a real multiply or add;
    small, so a traced forward stays finite."""
    return 2.0 ** (-7 + index // 1024) * (1 + (index % 1024) / 1024)


def assign_value_free_weights_(model: nn.Module) -> int:
    """Make every parameter a zero-stride fp16 view of one constant (:func:`value_free_constant`), in place, so
    a trace that shares these parameters converts with shape-and-dtype-only weights: 2 bytes per tensor
    instead of 2 per element. Tied parameters stay one tensor. Returns the number of parameters."""
    params = list(model.parameters())
    for i, p in enumerate(params):
        p.data = torch.full((), value_free_constant(i), dtype=torch.float16).expand(p.shape)
    return len(params)


def assign_value_free_caches_(step: nn.Module) -> int:
    """Make a traced step's lazy KV cache (``lazy_cache``: zero pages, the slots its trace wrote emptied again, so
    every element is 0) zero-stride views of one 0, in place: the same values, so the same program. coremltools'
    TorchScript lowering compares every buffer with itself (``torch.equal``, which reads every element, 2·L·Hkv·ctx·D·2
    bytes: what made a value-free conversion's CPU grow with ctx, bench/results/ctx_cost.json); a one-value view is
    answered from one element (``analyzer.convert.step.one_value_equal``). Returns the number of buffers."""
    caches = [b for name, b in step.named_buffers() if "_cache_" in name]
    for buf in caches:
        buf.data = torch.zeros((), dtype=buf.dtype).expand(buf.shape)
    return len(caches)


def reduced_source(source: ModelSource, layers: int = 2, vocab_size: int = 1000, intermediate_size: int = 512,
                   hidden_size: int = 256) -> ModelSource:
    """The same attention geometry (query heads, KV heads, head_dim, the family's code) at a size whose
    materialised fp32 model costs seconds: ``layers`` decoder layers (more when the config's ``layer_types``
    pattern needs them for every attention kind to occur), a smaller vocabulary and MLP, random weights, and
    a smaller hidden size when the config states ``head_dim`` (otherwise head_dim = hidden / heads, so the
    hidden size stays). The numerical equivalence of the variants is checked on this model, never on
    value-free weights (equal constants make every head alike, so a wrong head mapping would pass)."""

    raw = source.config_dict
    g = geometry_of(load_config(source))
    types_ = raw.get("layer_types")
    if isinstance(types_, list) and types_:
        layers = max(layers, 1 + max(types_.index(t) for t in set(types_)))
    changes: dict[str, int] = {"num_hidden_layers": min(layers, g.num_layers),
                               "vocab_size": min(vocab_size, g.vocab_size)}
    if isinstance(raw.get("intermediate_size"), int):
        changes["intermediate_size"] = min(intermediate_size, raw["intermediate_size"])
    if isinstance(raw.get("head_dim"), int):
        changes["hidden_size"] = min(hidden_size, g.hidden_size)
    cfg = dict(raw, **changes)
    if isinstance(types_, list) and types_:
        cfg["layer_types"] = types_[: changes["num_hidden_layers"]]
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = cfg.get(key)
        if any(isinstance(i, int) and i >= cfg["vocab_size"] for i in (ids if isinstance(ids, list) else [ids])):
            cfg[key] = None
    overrides = tuple(f"{k}={v}" for k, v in changes.items())
    return source_from_fingerprint("config", f"{source.ref} (reduced)", f"{source.label}-reduced",
                                   {"config": cfg, "weights": [], "seed": source.seed}, overrides)
