"""What a run's inputs may hold, by role: token ids below the vocabulary, positions inside the cache.

An out-of-range token id makes ``gather`` read past the embedding table and a position past the cache makes
``slice_update`` write past it; NumPy would raise deep inside a kernel (or, for negative values, silently wrap
around). These checks refuse them first, naming the input and the bound. Values of the wrong kind (3.7 or NaN
for an int32 input) are refused for every integer input by the interpreter itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from analyzer.engines.interpret.executor import Interpreter
from analyzer.engines.interpret.roles import InputRoles, tokens_per_step
from analyzer.errors import InterpretError


def vocab_size(interp: Interpreter, roles: InputRoles) -> int | None:
    """The spec's ``vocab_size`` if given, else the logits' last axis (the first output's declared shape)."""
    if roles.vocab_size is not None:
        return int(roles.vocab_size)
    first = interp.outputs[0] if interp.outputs else None
    return int(first.shape[-1]) if first is not None and first.shape and first.shape[-1] is not None else None


def cache_slots(interp: Interpreter, roles: InputRoles) -> int | None:
    """How many positions the cache holds: a KV input's sequence axis, else the causal mask's last axis (for KV as
    state the mask spans exactly the cache), else unknown."""
    by_name = {t.name: t for t in interp.inputs}
    for k in roles.kv_inputs:
        shape = by_name[k.input].shape if k.input in by_name else ()
        if len(shape) > k.axis and shape[k.axis] is not None:
            return int(shape[k.axis])
    if roles.causal_mask in by_name and not roles.kv_inputs:
        shape = by_name[roles.causal_mask].shape
        return int(shape[-1]) if shape and shape[-1] is not None else None
    return None


def check_role_values(interp: Interpreter, roles: InputRoles, inputs: dict[str, np.ndarray]) -> None:
    """Refuse token ids outside ``[0, vocab)`` and positions outside ``[0, cache)`` (the last token of the call
    included), naming the input."""
    vocab = vocab_size(interp, roles)
    ids = inputs.get(roles.token_ids)
    q = tokens_per_step(roles, {n: np.shape(v) for n, v in inputs.items()})
    if ids is not None:
        ids = np.asarray(ids)
        if ids.size and vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
            bad = ids[(ids < 0) | (ids >= vocab)].flat[0]
            raise InterpretError(f"input {roles.token_ids!r} (token ids): {bad} is outside the vocabulary "
                                 f"[0, {vocab:,})")
    slots = cache_slots(interp, roles)
    for name in roles.positions:
        pos = inputs.get(name)
        if pos is None or not np.asarray(pos).size or slots is None:
            continue
        pos = np.asarray(pos)
        last = int(pos.max()) + (q - 1 if pos.size == 1 else 0)
        if pos.min() < 0 or last >= slots:
            raise InterpretError(f"input {name!r} (position): {int(pos.min()) if pos.min() < 0 else last} "
                                 f"is outside the cache's {slots:,} slots [0, {slots:,})")


def check_steps(interp: Interpreter, roles: InputRoles, steps: int,
                shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """``--steps N`` decodes positions 0 .. N·Q − 1: refuse a run that would pass the cache's end (``shapes``:
    flexible inputs' shapes, else the declared ones)."""
    q = tokens_per_step(roles, {t.name: t.shape for t in interp.inputs} | dict(shapes or {}))
    slots = cache_slots(interp, roles)
    if slots is not None and steps * q > slots:
        raise InterpretError(f"--steps {steps}: positions 0 to {steps * q - 1:,} do not fit the cache's "
                             f"{slots:,} slots")
