"""Repeats computed at run time (issue #37): what a ``tile``'s ``reps`` are over a flexible program's whole range.

Under flexible shapes ``ct.convert`` writes torch's ``expand`` as a tile whose repeats are computed per call::

    %s  = shape(x=%x)                                   # [1, Hkv, 1, E, D], E symbolic
    %c  = concat(values=(gather(cast(shape(..))), .., G, ..))   # the expand's sizes, rank-0 values
    %r  = real_div(x=select(cond=equal(x=%c, y=-1), a=%s, b=%c), y=%s)
    %t  = tile(x=%x, reps=%r)

:func:`symbolic_value` runs that arithmetic on the program's own symbolic shapes (pymil's type inference: ``E`` is
one symbol wherever it is the same size), every dimension a positive sympy value. Here it gives ``[1, 1, G, E/E,
1] = [1, 1, G, 1, 1]``: constant over every shape the inputs can take, shown without running anything.
:func:`prove_reps` says whether the repeats hold over the whole range: constant (proved on the symbols), else
each flexible input dimension they depend on, named with its range; or, where the arithmetic leaves symbols no
input names (an op the evaluation does not follow), the values one interpreter run computes at each of the range's
bounds and default (``ProbeReps``, given by the caller).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import sympy as sm
from coremltools.converters.mil.mil import Function, Operation, Var
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

# The largest vector followed: shape arithmetic works on a tensor's rank (≤ 6 for converters) of values.
MAX_ELEMENTS = 64
# The op types whose arithmetic is followed on symbols (each on small integer vectors).
FOLLOWED = frozenset({"shape", "cast", "identity", "gather", "concat", "stack", "add", "sub", "mul", "real_div",
                      "floor_div", "maximum", "minimum", "equal", "not_equal", "select", "expand_dims", "squeeze",
                      "reshape", "slice_by_index"})

# A tile's reps at each probe: (the input shapes of the probe, its label, the reps there or why a probe could not run)
Probe = tuple[Mapping[str, tuple[int, ...]], str, "tuple[int, ...] | str"]
ProbeReps = Callable[[str, str], list[Probe]]  # (the tile's input name, its output name) → probes


class Unknown(ValueError):
    """The arithmetic cannot be followed on symbols (an op not in FOLLOWED, a comparison symbols leave open)."""


@dataclass(frozen=True, slots=True)
class RepsProof:
    """A tile's repeats over the whole flexible range. ``reps``: their value where they are constant (proved);
    ``reason``: why the decision may not hold over the range (empty when proved); ``how``: "symbolic" or "probes"."""

    reps: tuple[int, ...] | None
    reason: str = ""
    how: str = ""

    @property
    def proved(self) -> bool:
        return self.reps is not None and not self.reason


def _const(var: Var) -> np.ndarray | None:
    val = var.val
    if val is None:
        return None
    arr = np.asarray(val)
    if arr.size > MAX_ELEMENTS or arr.dtype.kind not in "iub":
        return None
    return np.vectorize(lambda x: sm.Integer(int(x)), otypes=[object])(arr) if arr.size else arr.astype(object)


def _sym(x) -> sm.Expr:
    return x if isinstance(x, sm.Basic) else sm.Integer(int(x))


def _equal(a, b) -> bool:
    a, b = _sym(a), _sym(b)
    if sm.simplify(a - b) == 0:
        return True
    if a.is_Integer and b.is_Integer:
        return False
    if (a.is_Integer and a < 1) or (b.is_Integer and b < 1):  # a dimension is at least 1
        return False
    raise Unknown(f"whether {a} equals {b}")


def _div(a, b) -> sm.Expr:
    a, b = _sym(a), _sym(b)
    if a.is_Integer and b.is_Integer:
        return sm.Integer(int(a) // int(b)) if b else sm.zoo  # sizes are positive: truncation is floor
    q = sm.simplify(a / b)
    if q.is_Rational and not q.is_Integer:
        raise Unknown(f"{a} / {b} is not whole")
    return q


_BINARY = {"add": lambda a, b: _sym(a) + _sym(b), "sub": lambda a, b: _sym(a) - _sym(b),
           "mul": lambda a, b: _sym(a) * _sym(b), "real_div": _div, "floor_div": _div,
           "maximum": lambda a, b: sm.Max(_sym(a), _sym(b)), "minimum": lambda a, b: sm.Min(_sym(a), _sym(b)),
           "equal": _equal, "not_equal": lambda a, b: not _equal(a, b)}


class SymbolicValues:
    """Small integer values of one function as object arrays of sympy expressions of its symbolic dimensions."""

    def __init__(self) -> None:
        self._memo: dict[int, np.ndarray] = {}

    def value(self, var: Var) -> np.ndarray:
        """The var's value on symbols; raises :class:`Unknown` where the arithmetic cannot be followed."""
        key = id(var)
        if key not in self._memo:
            value = self._compute(var)
            if not isinstance(value, np.ndarray):  # one element taken out of a vector (gather at a scalar)
                value = np.empty((), dtype=object)
                value[()] = self._compute(var)
            self._memo[key] = value
        return self._memo[key]

    def _compute(self, var: Var) -> np.ndarray:
        const = _const(var)
        if const is not None:
            return const
        op: Operation | None = var.op
        if op is None or op.op_type not in FOLLOWED:
            raise Unknown(f"{var.name!r} is computed by {op.op_type if op else 'an input'}")
        if var.shape is not None and not is_symbolic(np.prod(var.shape)) and int(np.prod(var.shape)) > MAX_ELEMENTS:
            raise Unknown(f"{var.name!r} is not small")
        t = op.op_type
        if t == "shape":
            return np.array([_sym(d) for d in op.x.shape], dtype=object)
        if t in ("cast", "identity"):  # a shape through uint16/int16 and back: sizes fit, values unchanged
            return self.value(op.x)
        if t == "gather":
            idx = op.indices.val
            if idx is None:
                raise Unknown(f"{var.name!r} gathers at a computed index")
            return np.take(self.value(op.x), np.asarray(idx).astype(np.int64), axis=int(op.axis.val))
        if t in ("concat", "stack"):
            parts = [self.value(v) for v in op.values]
            if t == "stack":
                return np.stack(parts, axis=int(op.axis.val))
            if all(p.ndim == 0 for p in parts):
                parts = [p.reshape(1) for p in parts]
            return np.concatenate(parts, axis=int(op.axis.val))
        if t in _BINARY:
            x, y = np.broadcast_arrays(self.value(op.x), self.value(op.y))
            return np.vectorize(_BINARY[t], otypes=[object])(x, y) if x.size else x
        if t == "select":
            cond, a, b = np.broadcast_arrays(self.value(op.cond), self.value(op.a), self.value(op.b))
            return np.where(cond.astype(bool), a, b)
        if var.shape is None or any(is_symbolic(d) for d in var.shape):
            raise Unknown(f"{var.name!r} has a symbolic shape")
        x = self.value(op.x)
        if t == "slice_by_index":  # a vector's slice: the declared shape says which elements (begin..end, stride 1)
            begin = op.begin.val
            if begin is None or x.ndim != 1:
                raise Unknown(f"{var.name!r} slices at a computed position")
            start = 0 if op.begin_mask is not None and op.begin_mask.val[0] else int(begin[0])
            out = x[start:start + int(np.prod(var.shape))]
            return out.reshape(var.shape)
        return x.reshape(tuple(int(d) for d in var.shape))  # expand_dims, squeeze, reshape


def input_symbols(function: Function) -> dict[sm.Symbol, tuple[str, int]]:
    """Each symbolic dimension of the function's inputs: (input name, axis)."""
    out: dict[sm.Symbol, tuple[str, int]] = {}
    for name, var in function.inputs.items():
        for axis, d in enumerate(var.shape or ()):
            if is_symbolic(d) and isinstance(d, sm.Symbol):
                out.setdefault(d, (name, axis))
    return out


def prove_reps(tile: Operation, symbols: Mapping[sm.Symbol, tuple[str, int]],
               ranges: Mapping[str, tuple[tuple[int, ...], tuple[int | None, ...]]],
               values: SymbolicValues, probe: ProbeReps | None = None) -> RepsProof:
    """Whether ``tile``'s repeats are one value over the whole flexible range (``ranges``: input name → (lower,
    upper) bounds). Proved on symbols where the arithmetic can be followed; a dependence on a flexible input is
    the reason ``repeats depend on NAME[axis] over LO..HI``; where symbols no input names are left, the caller's
    ``probe`` values at the range's bounds and default decide."""
    if tile.reps.val is not None:
        return RepsProof(tuple(int(r) for r in tile.reps.val), "", "constant")
    why = ""
    try:
        reps = values.value(tile.reps)
        exprs = [sm.simplify(_sym(r)) for r in reps.reshape(-1)]
        if all(e.is_Integer for e in exprs):
            return RepsProof(tuple(int(e) for e in exprs), "", "symbolic")
        free = set().union(*(e.free_symbols for e in exprs))
        named = sorted((symbols[s] for s in free if s in symbols), key=lambda na: (na[0], na[1]))
        if named and len(named) == len(free):
            name, axis = named[0]
            lo, hi = ranges.get(name, ((), ()))
            span = f"{lo[axis]}..{'∞' if hi[axis] is None else hi[axis]}" if axis < len(lo) else "its range"
            return RepsProof(None, f"repeats depend on {name}[{axis}] over {span}", "symbolic")
        why = "they depend on sizes no input names"
    except Unknown as e:
        why = f"their arithmetic cannot be followed on symbols ({e})"
    except (ValueError, TypeError, IndexError, ZeroDivisionError) as e:  # shapes that do not line up on symbols
        why = f"their arithmetic cannot be followed on symbols ({tile.reps.name!r}: {e})"
    if probe is None:
        return RepsProof(None, f"repeats not shown constant over the flexible range: {why}", "")
    return _from_probes(probe(tile.x.name, tile.outputs[0].name), ranges, why)


def _from_probes(found: list[Probe], ranges: Mapping[str, tuple[tuple[int, ...], tuple[int | None, ...]]],
                 why: str) -> RepsProof:
    """The repeats at each probe (the range's bounds, default and the stated shapes): one value at all of them;
    else the first input dimension two probes of different repeats differ in, named with its range."""
    for _, label, reps in found:
        if isinstance(reps, str):
            return RepsProof(None, f"repeats could not be evaluated at {label} ({reps}); {why}", "probes")
    if not found:
        return RepsProof(None, f"repeats not shown constant over the flexible range: {why}", "probes")
    first_shapes, _, first = found[0]
    for shapes, label, reps in found[1:]:
        if reps == first:
            continue
        for name, shape in shapes.items():
            for axis, (a, b) in enumerate(zip(shape, first_shapes.get(name, shape), strict=False)):
                if a != b:
                    lo, hi = ranges.get(name, (shape, shape))
                    return RepsProof(None, f"repeats depend on {name}[{axis}] over {lo[axis]}.."
                                           f"{'∞' if hi[axis] is None else hi[axis]} ({list(first)} at "
                                           f"{found[0][1]}, {list(reps)} at {label})", "probes")
        return RepsProof(None, f"repeats differ between {found[0][1]} and {label}", "probes")
    return RepsProof(first, "", "probes")
