"""Where qfold's converted step changes with the context length: the config thresholds a ctx sweep never derives
across (``analyzer.sweep.derive``).

For one graph (source, variant, KV mode, compression, phase, build mode) qfold's decode and prefill steps see ctx
only as tensor sizes: the KV buffers ``[1, Hkv, S, D]``, the mask ``[1, 1, N, S]``, the window mask's
``arange(S)``. A config value compared with ctx is where the structure itself changes:

* ``sliding_window`` W: a layer slides only when W < ctx (:func:`sliding_window`, the one test the decode and the
  prefill step make), so the window-mask ops exist above W and not at or below it.
* ``max_position_embeddings``: a build past it is refused (``analyzer.model.cost.check_request``) unless forced.

Not thresholds, though their names suggest it (transformers 5.24, ``modeling_rope_utils``): RoPE scaling of types
``llama3``, ``linear`` and ``yarn`` computes its frequencies from config values once, at init; ``dynamic`` and
``longrope`` choose theirs from the traced positions (``torch.max(position_ids) + 1`` against
``original_max_position_embeddings``), never from the cache length. So Llama 3.1's
``original_max_position_embeddings`` of 8,192 does not split a sweep.
"""

from __future__ import annotations

from typing import Any


def sliding_window(config: Any, ctx: int) -> int | None:
    """The sliding window W if some layer slides in transformers' sense and W < ctx, else None."""
    w = getattr(config, "sliding_window", None)
    if not w or w >= ctx:
        return None
    types_ = getattr(config, "layer_types", None)
    if types_ is not None and "sliding_attention" not in types_ and config.model_type not in ("mistral", "phi3"):
        return None
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return w


def past_max_positions(config: Any, ctx: int) -> bool:
    """Whether ``ctx`` is past the model's ``max_position_embeddings``: a build there is refused unless forced, so
    nothing is ever derived there."""
    max_pos = getattr(config, "max_position_embeddings", None)
    return isinstance(max_pos, int) and not isinstance(max_pos, bool) and ctx > max_pos


def ctx_regime(config: Any, ctx: int) -> tuple[str, ...]:
    """The thresholds ``ctx`` lies past, in words: two context lengths with equal regimes convert to the same
    structure (as far as the config says; a sweep still proves it op for op)."""
    out = []
    window = sliding_window(config, ctx)
    if window is not None:
        out.append(f"sliding_window={window} < ctx")
    if past_max_positions(config, ctx):
        out.append(f"ctx > max_position_embeddings={config.max_position_embeddings}")
    return tuple(out)
