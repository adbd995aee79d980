"""Which inputs of a decode step are what, and N decode steps driven from them.

An ``InputRoles`` names the token-id input, the position input, the additive causal mask and, for a cache passed
as inputs, where each cache's new entries come from. It is read from a small JSON file (``load_roles``), or
inferred (``infer_roles``) only where the names, dtypes and shapes leave no doubt: qfold's own builds
(``input_ids [1, Q]``, ``current_pos [1]``, ``causal_mask [1, 1, Q, S]``, ``k_cache_i``/``v_cache_i`` inputs with
``new_k``/``new_v [L, Hkv, Q, D]`` outputs, or KV as states). A foreign package without a spec gets no roles,
so no equivalence is claimed for it.

Input spec JSON (every field optional)::

    {"token_ids": "input_ids",            # int input [.., Q]: seeded random ids in [0, vocab_size); none for a
                                          #   function fed hidden states (ANEMLL's FFN and prefill chunks)
     "vocab_size": 102400,                # default: the rows of the embedding table the ids index (else the
                                          #   last axis of the first output)
     "position": "current_pos",           # int input(s), a name or a list: the first position of this step's
                                          #   tokens (or [Q] positions)
     "update_mask": "update_mask",        # float input [.., S, 1]: 1 at the slots this step writes, 0 elsewhere
     "causal_mask": "causal_mask",        # additive float input [.., Q, S]: 0 where visible, masked_value elsewhere
     "masked_value": -30000.0,            # default -30000 (fp16-safe; decode.MASK_VALUE)
     "mask_includes_current": true,       # the slot being written is visible (KV as state: yes; KV as inputs with
                                          #   the new entries appended in-graph: no)
     "kv_inputs": [{"input": "k_cache_0", "output": "new_k", "index": 0, "axis": 2}, ...]}
                                          # after each step, host cache[input][.., pos:pos+Q, ..] (along ``axis``)
                                          #   = output[index] (``index`` selects along the output's axis 0)

Every other input gets a seeded N(0, 1) value (floats) or zeros (integers), the same at every step; the run
returns them in ``DecodeRun.random_inputs`` (name → value).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analyzer.engines.interpret.executor import Interpreter, RunResult
from analyzer.engines.interpret.values import np_dtype
from analyzer.errors import InterpretError
from analyzer.fsio import read_json

DEFAULT_MASKED_VALUE = -30000.0  # analyzer.model.decode.MASK_VALUE: large, negative and fp16-safe


@dataclass(frozen=True, slots=True)
class KvInput:
    """A cache passed as an input, updated by the host from an output after each step."""

    input: str
    output: str
    index: int | None = None  # take output[index] along axis 0 (qfold's new_k [L, Hkv, Q, D]); None: whole output
    axis: int = 2  # the cache's sequence axis ([1, Hkv, S, D])


@dataclass(frozen=True, slots=True)
class InputRoles:
    token_ids: str | None
    position: str | tuple[str, ...] | None = None
    causal_mask: str | None = None
    vocab_size: int | None = None
    masked_value: float = DEFAULT_MASKED_VALUE
    mask_includes_current: bool = True
    kv_inputs: tuple[KvInput, ...] = ()
    update_mask: str | None = None  # 1.0 at the slots a step writes along its axis -2, 0.0 elsewhere

    @property
    def positions(self) -> tuple[str, ...]:
        if self.position is None:
            return ()
        return (self.position,) if isinstance(self.position, str) else tuple(self.position)


@dataclass(frozen=True)
class DecodeRun:
    """Per-step outputs, the final states, the token ids fed (``[steps, Q]``) and the inputs no role names (filled
    at random, the same value at every step)."""

    outputs: list[dict[str, np.ndarray]]
    states: dict[str, np.ndarray]
    tokens: np.ndarray
    roles: InputRoles
    random_inputs: dict[str, np.ndarray] = field(default_factory=dict)


_SPEC_FIELDS = {"token_ids", "position", "causal_mask", "vocab_size", "masked_value", "mask_includes_current",
                "kv_inputs", "update_mask"}


def roles_from_json(doc: dict, source: str = "input spec") -> InputRoles:
    if not isinstance(doc, dict):
        raise InterpretError(f"{source}: expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _SPEC_FIELDS)
    if unknown:
        raise InterpretError(f"{source}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(_SPEC_FIELDS))})")
    for key in ("token_ids", "causal_mask", "update_mask"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise InterpretError(f"{source}: {key!r} must name an input (a string)")
    position = doc.get("position")
    if isinstance(position, list) and all(isinstance(p, str) for p in position):
        position = tuple(position)
    elif position is not None and not isinstance(position, str):
        raise InterpretError(f"{source}: 'position' must name an input or list input names")
    vocab = doc.get("vocab_size")
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        raise InterpretError(f"{source}: 'vocab_size' must be a positive integer, got {vocab!r}")
    kv = []
    for i, entry in enumerate(doc.get("kv_inputs", [])):
        if not isinstance(entry, dict) or not {"input", "output"} <= set(entry) or set(entry) - {
                "input", "output", "index", "axis"}:
            raise InterpretError(f"{source}: kv_inputs[{i}] must be an object with input, output[, index, axis]")
        kv.append(KvInput(str(entry["input"]), str(entry["output"]), entry.get("index"), int(entry.get("axis", 2))))
    return InputRoles(doc.get("token_ids"), position, doc.get("causal_mask"), vocab,
                      float(doc.get("masked_value", DEFAULT_MASKED_VALUE)),
                      bool(doc.get("mask_includes_current", True)), tuple(kv), doc.get("update_mask"))


def load_roles(path: str | Path) -> InputRoles:
    """An input spec file (bounded: a regular file of at most 1 MiB, strict JSON); every failure is one
    ``InterpretError`` naming the file."""
    p = Path(path)
    doc = read_json(p, 1 << 20, InterpretError)
    try:
        return roles_from_json(doc, str(p))
    except (TypeError, ValueError, OverflowError) as e:
        if isinstance(e, InterpretError):
            raise
        raise InterpretError(f"{p}: a field has the wrong type: {e}") from e


_CACHE = re.compile(r"^([kv])_cache_(\d+)$")


def infer_roles(interp: Interpreter) -> InputRoles | None:
    """The roles of a qfold build's decode step, or None when the inputs are not exactly that shape."""
    by_name = {t.name: t for t in interp.inputs}
    ids, pos, mask = by_name.get("input_ids"), by_name.get("current_pos"), by_name.get("causal_mask")
    if ids is None or pos is None or mask is None or not ids.dtype.startswith("int") or not pos.dtype.startswith("int"):
        return None
    if len(ids.shape) != 2 or len(mask.shape) != 4 or not mask.dtype.startswith("fp") or ids.shape[1] != mask.shape[2]:
        return None
    caches = {n: m for n in by_name if (m := _CACHE.match(n))}
    if set(by_name) - {"input_ids", "current_pos", "causal_mask"} - set(caches):
        return None
    kv: list[KvInput] = []
    if caches:
        outputs = set(interp.output_names)
        layers = sorted({int(m.group(2)) for m in caches.values()})
        if layers != list(range(len(layers))) or len(caches) != 2 * len(layers) or not {"new_k", "new_v"} <= outputs:
            return None
        kv = [KvInput(f"{kv_}_cache_{i}", f"new_{kv_}", i, 2) for i in layers for kv_ in "kv"]
    return InputRoles("input_ids", "current_pos", "causal_mask", None, DEFAULT_MASKED_VALUE,
                      mask_includes_current=not caches, kv_inputs=tuple(kv))


def _infer_vocab(interp: Interpreter, token_ids: str) -> int | None:
    """The rows of the constant table a ``gather`` indexes with the token ids (the embedding), else the logits'
    last axis (the first output's declared shape). ``interp`` may be any object with the interpreter's inputs
    and outputs (a device runner drives decode steps too)."""
    rows = interp.table_rows(token_ids) if isinstance(interp, Interpreter) else None
    if rows is not None:
        return rows
    first = interp.outputs[0] if interp.outputs else None
    if first is None or not first.shape or first.shape[-1] is None:
        return None
    return int(first.shape[-1])


def _mask(shape: tuple[int, ...], dtype: np.dtype, pos: int, q: int, value: float, include_current: bool):
    """Additive mask ``[.., Q, S]`` (or ``[.., S]`` for Q = 1): row r sees slots ≤ pos + r (< pos + r without the
    current slot)."""
    s = shape[-1]
    rows = np.arange(q)[:, None] + pos
    visible = np.arange(s)[None, :] <= rows if include_current else np.arange(s)[None, :] < rows
    m = np.where(visible, 0.0, value).astype(dtype)  # [Q, S]
    if len(shape) >= 2 and shape[-2] == q:
        return np.broadcast_to(m, shape).copy()
    if q == 1:
        return np.broadcast_to(m[0], shape).copy()
    raise InterpretError(f"causal mask shape {list(shape)} has no query axis of size {q}")


def tokens_per_step(roles: InputRoles, shapes: Mapping[str, tuple]) -> int:
    """Q, the tokens one step feeds, from the inputs' shapes (name → shape; a None dimension is unknown): the token
    ids' last axis; without token ids (hidden states in) the causal mask's rows, else the longest position
    vector; else 1."""
    def known(name: str | None, axis: int) -> int | None:
        shape = shapes.get(name) if name is not None else None
        return int(shape[axis]) if shape and len(shape) >= -axis and shape[axis] is not None else None

    if roles.token_ids is not None:
        return known(roles.token_ids, -1) or 1
    rows = known(roles.causal_mask, -2)
    if rows is not None:
        return rows
    return max((int(np.prod(shapes[p])) for p in roles.positions if p in shapes and None not in shapes[p]),
               default=1)


def decode_steps(interp: Interpreter, steps: int, roles: InputRoles | None = None, seed: int = 0,
                 tokens: np.ndarray | list | None = None, states: dict[str, np.ndarray] | None = None,
                 on_step: Callable[[int, RunResult], None] | None = None,
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> DecodeRun:
    """Run ``steps`` decode steps from position 0 with seeded random token ids (or the given ``tokens``,
    ``[steps, Q]`` or ``[steps]``), the matching positions and causal masks, states starting at zero (or
    ``states``), and a host cache for KV inputs. ``roles`` default: ``infer_roles``; a package whose roles
    cannot be inferred is an error naming what is missing. ``on_step(i, result)`` is called after each step
    (progress, timing). ``shapes``: the shapes of flexible inputs (``analyzer.analysis.shapes``)."""
    roles = roles or infer_roles(interp)
    if roles is None:
        raise InterpretError(f"{interp.path.name}: cannot tell which inputs are token ids, positions and masks "
                             f"(inputs: {', '.join(t.name for t in interp.inputs)}); give an input spec")
    by_name = {t.name: t for t in interp.inputs}
    for role, name in (("token_ids", roles.token_ids), *(("position", p) for p in roles.positions),
                       ("causal_mask", roles.causal_mask), ("update_mask", roles.update_mask),
                       *(("kv_inputs", k.input) for k in roles.kv_inputs)):
        if name is not None and name not in by_name:
            raise InterpretError(f"input spec: {role} names {name!r}, not an input of {interp.path.name} "
                                 f"(inputs: {', '.join(by_name)})")
    for k in roles.kv_inputs:
        if k.output not in interp.output_names:
            raise InterpretError(f"input spec: kv_inputs output {k.output!r} is not an output of {interp.path.name}")
    given = dict(shapes or {})
    shapes = {t.name: given.get(t.name) or _concrete(t) for t in interp.inputs}
    q = tokens_per_step(roles, shapes)
    rng = np.random.default_rng(seed)
    if roles.token_ids is None:
        tokens = np.zeros((steps, 0), dtype=np.int64)
    elif tokens is None:
        vocab = roles.vocab_size or _infer_vocab(interp, roles.token_ids)
        if vocab is None:
            raise InterpretError("input spec: give 'vocab_size' (no embedding table or output shape to read it off)")
        tokens = rng.integers(0, vocab, size=(steps, q))
    if roles.token_ids is not None:
        tokens = np.asarray(tokens).reshape(steps, q)
    named = {roles.token_ids, *roles.positions, roles.causal_mask, roles.update_mask,
             *(k.input for k in roles.kv_inputs)} - {None}
    fixed: dict[str, np.ndarray] = {}
    for t in interp.inputs:
        if t.name in named:
            continue
        dt = np_dtype(t.dtype)
        fixed[t.name] = (rng.standard_normal(shapes[t.name]).astype(dt) if dt.kind == "f"
                         else np.zeros(shapes[t.name], dtype=dt))
    host = {k.input: np.zeros(shapes[k.input], dtype=np_dtype(by_name[k.input].dtype)) for k in roles.kv_inputs}
    state = dict(states) if states else None
    outputs: list[dict[str, np.ndarray]] = []
    for step in range(steps):
        pos = step * q
        feed = dict(fixed)
        if roles.token_ids is not None:
            feed[roles.token_ids] = tokens[step].reshape(shapes[roles.token_ids]).astype(
                np_dtype(by_name[roles.token_ids].dtype))
        for position in roles.positions:
            p_shape = shapes[position]
            n = int(np.prod(p_shape, dtype=np.int64))
            values = np.arange(pos, pos + n) if n == q and q > 1 else np.full(n, pos)
            feed[position] = values.reshape(p_shape).astype(np_dtype(by_name[position].dtype))
        if roles.update_mask is not None:
            m_shape = shapes[roles.update_mask]
            m = np.zeros(m_shape, dtype=np_dtype(by_name[roles.update_mask].dtype))
            index = [slice(None)] * len(m_shape)
            index[-2 if len(m_shape) >= 2 else -1] = slice(pos, pos + q)
            m[tuple(index)] = 1
            feed[roles.update_mask] = m
        if roles.causal_mask is not None:
            feed[roles.causal_mask] = _mask(shapes[roles.causal_mask], np_dtype(by_name[roles.causal_mask].dtype),
                                            pos, q, roles.masked_value, roles.mask_includes_current)
        feed.update({name: value.copy() for name, value in host.items()})
        result = interp.run(feed, state)
        state = result.states
        outputs.append(result.outputs)
        if on_step is not None:
            on_step(step, result)
        for k in roles.kv_inputs:
            new = result.outputs[k.output]
            new = new[k.index] if k.index is not None else new
            cache = host[k.input]
            index = [slice(None)] * cache.ndim
            index[k.axis] = slice(pos, pos + q)
            target = cache[tuple(index)]
            if new.size != target.size:
                raise InterpretError(f"kv_inputs: output {k.output!r}{'' if k.index is None else f'[{k.index}]'} "
                                     f"of shape {list(new.shape)} does not fit {k.input!r} slots {pos}..{pos + q}")
            cache[tuple(index)] = new.reshape(target.shape)
    return DecodeRun(outputs, state or {}, tokens, roles, fixed)


def _concrete(t) -> tuple[int, ...]:
    if any(d is None for d in t.shape):
        raise InterpretError(f"input {t.name!r} has a flexible shape {t.shape_text}; give a fixed-shape package")
    return tuple(int(d) for d in t.shape)


def max_abs_diff(a: DecodeRun, b: DecodeRun) -> dict[str, float]:
    """max |a − b| per output (over every step) and per final state, in fp32; names must match."""
    if len(a.outputs) != len(b.outputs):
        raise InterpretError(f"runs of {len(a.outputs)} and {len(b.outputs)} steps cannot be compared")
    out: dict[str, float] = {}
    for sa, sb in zip(a.outputs, b.outputs, strict=True):
        if set(sa) != set(sb):
            raise InterpretError(f"outputs differ: {sorted(set(sa) ^ set(sb))}")
        for n in sa:
            d = float(np.max(np.abs(sa[n].astype(np.float32) - sb[n].astype(np.float32)), initial=0.0))
            out[n] = max(out.get(n, 0.0), d)
    if set(a.states) != set(b.states):
        raise InterpretError(f"states differ: {sorted(set(a.states) ^ set(b.states))}")
    for n in a.states:
        out[n] = float(np.max(np.abs(a.states[n].astype(np.float32) - b.states[n].astype(np.float32)), initial=0.0))
    return out


def decode_feeds(interp, steps: int, roles: InputRoles | None = None, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The inputs :func:`decode_steps` would give ``steps`` decode steps from position 0 (seeded token ids,
    positions, causal masks; other inputs seeded as there), without running anything: for timing loops that
    must not pay for building inputs. KV caches passed as inputs are zeros (their values do not change the
    work a step does)."""
    roles = roles or infer_roles(interp)
    if roles is None:
        raise InterpretError(f"{interp.path.name}: cannot tell which inputs are token ids, positions and masks "
                             f"(inputs: {', '.join(t.name for t in interp.inputs)}); give an input spec")
    shapes = {t.name: _concrete(t) for t in interp.inputs}
    by_name = {t.name: t for t in interp.inputs}
    q = shapes[roles.token_ids][-1] if shapes[roles.token_ids] else 1
    rng = np.random.default_rng(seed)
    vocab = roles.vocab_size or _infer_vocab(interp, roles.token_ids)
    if vocab is None:
        raise InterpretError("input spec: give 'vocab_size' (no output shape to infer it from)")
    tokens = rng.integers(0, vocab, size=(steps, q))
    fixed = {t.name: (rng.standard_normal(shapes[t.name]).astype(np_dtype(t.dtype)) if np_dtype(t.dtype).kind == "f"
                      else np.zeros(shapes[t.name], dtype=np_dtype(t.dtype)))
             for t in interp.inputs if t.name not in (roles.token_ids, roles.position, roles.causal_mask)}
    feeds = []
    for step in range(steps):
        pos = step * q
        feed = dict(fixed)
        ids = tokens[step].reshape(shapes[roles.token_ids])
        feed[roles.token_ids] = ids.astype(np_dtype(by_name[roles.token_ids].dtype))
        if roles.position is not None:
            n = int(np.prod(shapes[roles.position], dtype=np.int64))
            values = (np.arange(pos, pos + n) if n == q and q > 1 else np.full(n, pos)).reshape(shapes[roles.position])
            feed[roles.position] = values.astype(np_dtype(by_name[roles.position].dtype))
        if roles.causal_mask is not None:
            feed[roles.causal_mask] = _mask(shapes[roles.causal_mask], np_dtype(by_name[roles.causal_mask].dtype),
                                            pos, q, roles.masked_value, roles.mask_includes_current)
        feeds.append(feed)
    return feeds
