"""Attention variants for a single-token decode step, one class per variant, kept in a registry.

Every variant computes the same function: softmax(q·Kᵀ·scale + mask)·V with query head ``h`` attending
to KV head ``h // G`` (G = Hq / Hkv, "contiguous grouping", the mapping of transformers' ``repeat_kv``).
They differ only in how the head sharing is written down, which is what decides whether Core ML's MIL
graph copies the KV cache (``tile``) or not.

Shapes in comments: B batch (1), Hq query heads, Hkv KV heads, G = Hq / Hkv, S cache slots (ctx), D head dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # torch is imported where it is used, so listing the variants (CLI --help) stays light
    import torch

VARIANTS: dict[str, type[AttentionVariant]] = {}
# Where the KV cache lives in the converted step: a Core ML state, or read-only model inputs.
KV_MODES: tuple[str, ...] = ("state", "input")


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


class AttentionVariant:
    """Decode-step attention core. Subclasses implement :meth:`attend`.

    ``attend`` gets the query ``[B, Hq, 1, D]``, the un-repeated cache ``[B, Hkv, S, D]`` and an additive
    mask ``[1, 1, 1, S]`` (or None), and returns ``[B, Hq, 1, D]``. When the cache is a read-only input
    (``--kv input``) the current token's own key/value ``[B, Hkv, 1, D]`` arrive separately as ``new_kv``
    and take part in the same softmax.
    """

    name: ClassVar[str]

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
        scores = _softcap(torch.matmul(query, k.transpose(2, 3)) * scaling, softcap)  # [B, Hq, 1, S]
        if mask is not None:
            scores = scores + mask
        if new_kv is None:
            return torch.matmul(_softmax_like_hf(scores, query), v)  # [B, Hq, 1, D]
        k_new = repeat_kv(new_kv[0], g)  # [B, Hq, 1, D]
        v_new = repeat_kv(new_kv[1], g)
        self_score = _softcap(torch.matmul(query, k_new.transpose(2, 3)) * scaling, softcap)  # [B, Hq, 1, 1]
        w = _softmax_like_hf(torch.cat([scores, self_score], dim=-1), query)  # [B, Hq, 1, S+1]
        s = key.shape[2]
        return torch.matmul(w[..., :s], v) + w[..., s:] * v_new  # [B, Hq, 1, D]


@register_variant
class QFold(AttentionVariant):
    """Fold the query heads into ``[Hkv, G]`` and keep K/V at their stored width: no replication.

    Equivalent to :class:`RepeatKV` (and so to transformers' eager attention) because a row-major
    reshape of Hq into ``[Hkv, G]`` maps query head ``h`` to ``(h // G, h % G)``, exactly the KV head
    ``repeat_kv`` pairs it with; the matmul, the scale, the mask add and the softmax over S are all
    independent per query row, so regrouping rows changes no row's arithmetic. Decode only (q_len 1):
    the G axis takes the place of the query-length axis.
    """

    name = "qfold"

    @classmethod
    def attend(cls, query, key, value, mask, scaling, softcap=None, new_kv=None):
        import torch

        b, hq, _, d = query.shape
        hkv = key.shape[1]
        q = query.reshape(b, hkv, hq // hkv, d)  # [B, Hkv, G, D]: free, no element moves
        scores = _softcap(torch.matmul(q, key.transpose(2, 3)) * scaling, softcap)  # [B, Hkv, G, S]
        if mask is not None:
            scores = scores + mask  # [1, 1, 1, S] broadcasts over (Hkv, G)
        if new_kv is None:
            out = torch.matmul(_softmax_like_hf(scores, query), value)  # [B, Hkv, G, D]
        else:
            self_score = _softcap(torch.matmul(q, new_kv[0].transpose(2, 3)) * scaling, softcap)  # [B,Hkv,G,1]
            w = _softmax_like_hf(torch.cat([scores, self_score], dim=-1), query)  # [B, Hkv, G, S+1]
            s = key.shape[2]
            out = torch.matmul(w[..., :s], value) + w[..., s:] * new_kv[1]  # [B, Hkv, G, D]
        return out.reshape(b, hq, 1, d)  # [B, Hq, 1, D]
