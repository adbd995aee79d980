"""Attention variants for a decode step (q_len 1) and a prefill step (q_len N > 1), one class per variant,
kept in a registry.

Every variant computes the same function: softmax(q·Kᵀ·scale + mask)·V with query head ``h`` attending
to KV head ``h // G`` (G = Hq / Hkv, "contiguous grouping", the mapping of transformers' ``repeat_kv``).
They differ only in how the head sharing is written down, which is what decides whether Core ML's MIL
graph copies the KV cache (``tile``) or not.

Shapes in comments: B batch (1), Hq query heads, Hkv KV heads, G = Hq / Hkv, N query rows (q_len: 1 in a
decode step), S cache slots (ctx), D head dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from analyzer.errors import SourceError

if TYPE_CHECKING:  # torch is imported where it is used, so listing the variants (CLI --help) stays light
    import torch

VARIANTS: dict[str, type[AttentionVariant]] = {}
# Where the KV cache lives in the converted step: a Core ML state, or read-only model inputs.
KV_MODES: tuple[str, ...] = ("state", "input")
# The variants every build's torch equivalence check decodes and compares (analyzer.model.equivalence): the pair
# whose fp16 logits are bit-identical. sdpa_gqa rounds differently (its softmax runs in fp16) and is compared with
# repeat_kv by its own tests.
CHECKED_VARIANTS: tuple[str, ...] = ("repeat_kv", "qfold")


def register_variant(cls: type[AttentionVariant]) -> type[AttentionVariant]:
    """Class decorator: add a variant to ``VARIANTS`` under ``cls.name`` (names are unique)."""
    if cls.name in VARIANTS:
        raise ValueError(f"attention variant {cls.name!r} is registered twice")
    VARIANTS[cls.name] = cls
    return cls


def get_variant(name: str) -> type[AttentionVariant]:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; choose one of {sorted(VARIANTS)}") from None


def _softcap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    import torch

    return scores if softcap is None else torch.tanh(scores / softcap) * softcap


def _softmax_like_hf(scores: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    # transformers' eager attention takes the softmax in fp32 and casts back; keep that so the
    # variants agree with the family's own forward bit for bit in fp16.
    import torch

    return torch.softmax(scores.float(), dim=-1).to(like.dtype)


def _weights_with_new(scores: torch.Tensor, self_score: torch.Tensor, mask: torch.Tensor | None,
                      like: torch.Tensor) -> torch.Tensor:
    """Softmax over the cache slots and the new tokens together (read-only cache): ``[.., R, S] ++ [.., R, N]``.
    A mask as wide as the cache (a decode step) masks the cache only, the token always seeing itself; a mask
    ``S + N`` wide (a prefill step) covers both, causal over the new tokens."""
    import torch

    if mask is not None and mask.shape[-1] == scores.shape[-1]:
        return _softmax_like_hf(torch.cat([scores + mask, self_score], dim=-1), like)
    joined = torch.cat([scores, self_score], dim=-1)
    return _softmax_like_hf(joined if mask is None else joined + mask, like)


def _times_new(w_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
    """The new tokens' share of the output: ``[.., R, N] · [.., N, D]``; one new token (decode) is an
    elementwise product, as the decode graphs have always written it."""
    import torch

    return w_new * v_new if w_new.shape[-1] == 1 else torch.matmul(w_new, v_new)


class AttentionVariant:
    """Attention core of a decode or prefill step. Subclasses implement :meth:`attend`.

    ``attend`` gets the query ``[B, Hq, N, D]``, the un-repeated cache ``[B, Hkv, S, D]`` and an additive
    mask ``[1, 1, N, S]`` (or None), and returns ``[B, Hq, N, D]``. When the cache is a read-only input
    (``--kv input``) the current tokens' own keys/values ``[B, Hkv, N, D]`` arrive separately as ``new_kv``
    and take part in the same softmax: a decode step's token always sees itself (mask ``[1, 1, 1, S]``
    covers the cache only); a prefill step's mask is ``[1, 1, N, S + N]``, causal over the new tokens.
    :meth:`prepare_mask` gives the mask in the row layout ``attend`` uses, so a step can lay it out once
    per call instead of once per layer.
    """

    name: ClassVar[str]

    @classmethod
    def prepare_mask(cls, mask: torch.Tensor, group: int) -> torch.Tensor:
        """The host mask ``[1, 1, N, W]`` in this variant's row layout; most variants use it as it is."""
        return mask

    @classmethod
    def attend(
        cls,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None,
        scaling: float,
        softcap: float | None = None,
        new_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, Hkv, S, D] → [B, Hkv·n_rep, S, D]``; the same as ``torch.repeat_interleave(x, n_rep, dim=1)``.

    Identical to ``transformers.models.llama.modeling_llama.repeat_kv``: ``expand`` is a stride-0 view
    in torch, but the ``reshape`` that merges the repeat axis into the head axis must materialise the
    copy, and MIL, which has no strided views, writes it as ``tile``.
    """
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    x = x[:, :, None, :, :].expand(b, h, n_rep, s, d)  # [B, Hkv, n_rep, S, D] view
    return x.reshape(b, h * n_rep, s, d)  # [B, Hq, S, D] copy


@register_variant
class RepeatKV(AttentionVariant):
    """The reference: replicate each KV head G times (``repeat_kv``), then ordinary batched matmuls.

    Equivalent to transformers' ``eager_attention_forward``. In MIL each replication becomes
    ``expand_dims → tile(reps=[1,1,G,1,1]) → reshape``: per layer, K and V are each copied to
    ``[B, Hq, S, D]`` (G × the cache) before the matmul reads them again.
    """

    name = "repeat_kv"

    @classmethod
    def attend(cls, query, key, value, mask, scaling, softcap=None, new_kv=None):
        import torch

        g = query.shape[1] // key.shape[1]
        k = repeat_kv(key, g)  # [B, Hq, S, D]
        v = repeat_kv(value, g)  # [B, Hq, S, D]
        scores = _softcap(torch.matmul(query, k.transpose(2, 3)) * scaling, softcap)  # [B, Hq, N, S]
        if new_kv is None:
            if mask is not None:
                scores = scores + mask
            return torch.matmul(_softmax_like_hf(scores, query), v)  # [B, Hq, N, D]
        k_new = repeat_kv(new_kv[0], g)  # [B, Hq, N, D]
        v_new = repeat_kv(new_kv[1], g)
        self_score = _softcap(torch.matmul(query, k_new.transpose(2, 3)) * scaling, softcap)  # [B, Hq, N, N]
        w = _weights_with_new(scores, self_score, mask, query)  # [B, Hq, N, S+N]
        s = key.shape[2]
        return torch.matmul(w[..., :s], v) + _times_new(w[..., s:], v_new)  # [B, Hq, N, D]


@register_variant
class QFold(AttentionVariant):
    """Fold the query heads into ``[Hkv, G]`` and keep K/V at their stored width: no replication.

    Equivalent to :class:`RepeatKV` (and so to transformers' eager attention) because a row-major
    reshape of Hq into ``[Hkv, G]`` maps query head ``h`` to ``(h // G, h % G)``, exactly the KV head
    ``repeat_kv`` pairs it with; the matmul, the scale, the mask add and the softmax over S are all
    independent per query row, so regrouping rows changes no row's arithmetic.

    Decode (q_len 1): the G axis takes the place of the query-length axis::

        q [B, Hq, 1, D] → [B, Hkv, G, D];  mask [1, 1, 1, S] broadcasts over (Hkv, G)

    Prefill (q_len N > 1): the group and sequence axes merge into one row axis, so every tensor stays at
    rank 4 (rank-5 broadcasting is what Core ML backends handle badly). Head ``h = kv·G + g`` at position
    ``n`` becomes row ``g·N + n`` of KV head ``kv`` — a plain reshape, since ``[Hq, N]`` is already laid out
    as ``[Hkv, G, N]``::

        q      [B, Hq, N, D] → [B, Hkv, G·N, D]            (reshape: no element moves)
        scores [B, Hkv, G·N, S] = q · Kᵀ                    (K read at its stored width Hkv)
        mask   [1, 1, N, S]   → [1, 1, G·N, S]              (row g·N + n takes mask row n: the mask is
                                                             repeated G times, once per call; K/V never are)
        out    [B, Hkv, G·N, D] → [B, Hq, N, D]             (reshape back)

    With a read-only cache the new tokens' keys/values ``[B, Hkv, N, D]`` are read the same way, and the
    mask ``[1, 1, N, S + N]`` (cache slots, then the new tokens, causal) is aligned to the rows alike.
    """

    name = "qfold"

    @classmethod
    def prepare_mask(cls, mask, group):
        """``[1, 1, N, W] → [1, 1, G·N, W]`` (mask row ``n`` for merged row ``g·N + n``); a one-row mask (decode)
        broadcasts over the G rows and is returned as it is."""
        if mask.shape[2] == 1 or group == 1:
            return mask
        return mask.repeat(1, 1, group, 1)  # [1, 1, G·N, W]

    @classmethod
    def attend(cls, query, key, value, mask, scaling, softcap=None, new_kv=None):
        import torch

        b, hq, n, d = query.shape
        hkv = key.shape[1]
        g = hq // hkv
        q = query.reshape(b, hkv, g * n, d)  # [B, Hkv, G·N, D]: free, no element moves
        scores = _softcap(torch.matmul(q, key.transpose(2, 3)) * scaling, softcap)  # [B, Hkv, G·N, S]
        if mask is not None and n > 1 and mask.shape[2] == n:
            mask = cls.prepare_mask(mask, g)  # a step that did not lay the mask out itself
        if new_kv is None:
            if mask is not None:
                scores = scores + mask  # [1, 1, G·N or 1, S] broadcasts over Hkv
            out = torch.matmul(_softmax_like_hf(scores, query), value)  # [B, Hkv, G·N, D]
        else:
            self_score = _softcap(torch.matmul(q, new_kv[0].transpose(2, 3)) * scaling, softcap)  # [B,Hkv,G·N,N]
            w = _weights_with_new(scores, self_score, mask, query)  # [B, Hkv, G·N, S+N]
            s = key.shape[2]
            out = torch.matmul(w[..., :s], value) + _times_new(w[..., s:], new_kv[1])  # [B, Hkv, G·N, D]
        return out.reshape(b, hq, n, d)  # [B, Hq, N, D]


@register_variant
class SdpaGqa(AttentionVariant):
    """``F.scaled_dot_product_attention(q, K, V, attn_mask, scale, enable_gqa=True)`` on the un-repeated cache.

    Equivalent to :class:`RepeatKV`: with ``enable_gqa=True`` torch's SDPA pairs query head ``h`` with KV head
    ``h // G`` (it repeats K and V with ``repeat_interleave(G, dim=-3)`` where the kernel cannot share them), the
    scale and the additive mask are applied to the scores before one softmax over S, exactly as the eager
    attention does. It differs in rounding only: the softmax runs in the query's dtype, not in fp32.

    How the head sharing is written is left to the backend: coreai-torch lowers it to an SDPA composite that keeps
    ``[B, Hkv, S, D]`` K/V at its interface and tiles them in its fallback body; coremltools 9.0 ignores
    ``enable_gqa`` (its ``scaled_dot_product_attention`` translation needs equal head counts), so Core ML builds
    refuse this variant before converting (``analyzer.model.backends``). With a read-only cache the new tokens'
    K/V are appended to the cache's (``[B, Hkv, S + N, D]``) and a decode step's ``[1, 1, 1, S]`` mask is widened
    with a 0 for the token itself.
    """

    name = "sdpa_gqa"

    @classmethod
    def attend(cls, query, key, value, mask, scaling, softcap=None, new_kv=None):
        import torch
        import torch.nn.functional as F

        if softcap is not None:
            raise SourceError("variant sdpa_gqa: this model soft-caps its attention logits, which "
                              "scaled_dot_product_attention cannot express; use repeat_kv or qfold")
        if new_kv is not None:
            s, n = key.shape[2], new_kv[0].shape[2]
            key = torch.cat([key, new_kv[0]], dim=2)  # [B, Hkv, S + N, D]
            value = torch.cat([value, new_kv[1]], dim=2)
            if mask is not None and mask.shape[-1] == s:  # a decode mask covers the cache: the token sees itself
                mask = torch.cat([mask, mask.new_zeros((*mask.shape[:-1], n))], dim=-1)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                              enable_gqa=True)  # [B, Hq, N, D]
