"""Inputs drawn at random within what each input can hold: the fold proof of a package no input spec describes.

A folded program must equal its original for *any* inputs, so the proof needs no roles: it needs inputs the
program can take. :func:`plan_draws` reads what each input can hold off the walked (and sized) program:

- an integer input an embedding ``gather`` reads as its indices: **token ids**, uniform below the table's rows
  (the vocabulary read off the embedding table, never off an output's shape);
- any other integer input: **positions**, uniform so that every index it feeds stays in range: below the rows of
  the tables it indexes (RoPE) and, for a scalar, at most ``cache length − tokens per call`` (a cache write at
  ``pos … pos + Q`` must fit); a vector of n positions is ``p, p+1, … p+n−1``;
- a float input: N(0, 1) in its dtype (masks and update masks included: equality holds for any values);
- a bool input: fair coin flips.

Every draw is stated (:attr:`InputDraw.text`) and a fresh one is made at every step from one seeded generator, so
the original and the folded program see the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.engines.interpret.executor import Interpreter
from analyzer.engines.interpret.roles import DecodeRun
from analyzer.engines.interpret.values import np_dtype
from analyzer.errors import InterpretError
from analyzer.ir.mil_records import MilProgram
from analyzer.ir.phase import call_shape

_PASS = frozenset({"cast", "reshape", "squeeze", "expand_dims", "identity"})


@dataclass(frozen=True, slots=True)
class InputDraw:
    """How one input is drawn at every step."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # "token ids" | "positions" | "normal" | "bool"
    high: int = 0  # integers: values (or a vector's first value) in [0, high)
    how: str = ""  # where the bound was read

    @property
    def text(self) -> str:
        shape = "[" + ",".join(map(str, self.shape)) + "]"
        if self.kind == "token ids":
            return f"{self.name} {self.dtype}{shape}: token ids uniform in [0, {self.high}) ({self.how})"
        if self.kind == "positions":
            run = " as consecutive positions from" if int(np.prod(self.shape)) > 1 else ""
            return f"{self.name} {self.dtype}{shape}: positions{run} uniform in [0, {self.high}) ({self.how})"
        if self.kind == "bool":
            return f"{self.name} bool{shape}: fair coin flips"
        return f"{self.name} {self.dtype}{shape}: N(0, 1)"


def _indexed_tables(program: MilProgram) -> dict[str, list[tuple[int, str]]]:
    """Program input → (rows, table name) of every constant table a ``gather`` indexes with it (through casts and
    views)."""
    carried: dict[int, str] = {}
    out: dict[str, list[tuple[int, str]]] = {}
    for op in program.ops:
        for r in op.inputs:
            if r.producer is None:
                src = None if r.is_const else r.tensor.name
            else:
                src = carried.get(r.producer)
            if src is None:
                continue
            if op.kind in _PASS and r.param == "x":  # kind: a Core AI asset's ops too (coreai.gather_nd, …)
                carried[op.index] = src
            elif op.kind in ("gather", "gather_along_axis") and r.param == "indices":
                table = next((x for x in op.inputs if x.param == "x"), None)
                axis = next((x for x in op.inputs if x.param == "axis"), None)
                is_table = table is not None and (table.is_const or (table.producer is not None and (
                    program.ops[table.producer].kind == "const"
                    or program.ops[table.producer].type.startswith("constexpr_"))))
                if is_table and table.tensor.shape:
                    ax = axis.value[0] if axis is not None and axis.value else 0
                    rows = table.tensor.shape[ax]
                    if isinstance(rows, int):
                        out.setdefault(src, []).append((rows, table.tensor.name))
    return out


def plan_draws(program: MilProgram) -> tuple[InputDraw, ...]:
    """One :class:`InputDraw` per input of a sized program (module docstring)."""
    tables = _indexed_tables(program)
    q = call_shape(program).tokens_per_call
    caches = [s.shape[-2] for s in program.states if len(s.shape) >= 3 and isinstance(s.shape[-2], int)]
    cache = min(caches) if caches else None
    draws = []
    for t in program.inputs:
        if t.symbolic:
            raise InterpretError(f"input {t.name!r} has a flexible shape {t.shape_text}; give its shape")
        shape = tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
        n = int(np.prod(shape, dtype=np.int64))
        if t.dtype == "bool":
            draws.append(InputDraw(t.name, shape, t.dtype, "bool"))
        elif t.dtype.startswith(("fp", "bf")):
            draws.append(InputDraw(t.name, shape, t.dtype, "normal"))
        elif t.name in tables and len(shape) == 2 and shape[0] == 1:  # [1, Q] read by a table: token ids
            rows, table = min(tables[t.name])
            draws.append(InputDraw(t.name, shape, t.dtype, "token ids", rows,
                                   f"the rows of embedding {table!r}"))
        else:
            bounds, hows = [], []
            for rows, table in tables.get(t.name, ()):
                bounds.append(rows - n + 1 if n > 1 else rows)
                hows.append(f"table {table!r} has {rows} rows")
            if cache is not None:
                bounds.append(cache - (n if n > 1 else q) + 1)
                hows.append(f"the cache holds {cache} slots, {n if n > 1 else q} written per call")
            high = max(1, min(bounds)) if bounds else 1
            draws.append(InputDraw(t.name, shape, t.dtype, "positions", high,
                                   "; ".join(hows) or "no table or cache bounds it: 0"))
    return tuple(draws)


def draw_steps(interp: Interpreter, draws: tuple[InputDraw, ...], steps: int, seed: int = 0,
               states: dict[str, np.ndarray] | None = None) -> DecodeRun:
    """``steps`` runs of ``interp`` on fresh draws from one seeded generator, states carried from run to run
    (from ``states``, else zeros)."""
    rng = np.random.default_rng(seed)
    state = dict(states) if states else None
    outputs = []
    last: dict[str, np.ndarray] = {}
    for _ in range(steps):
        feed = {}
        for d in draws:
            dt = np_dtype(d.dtype)
            if d.kind == "normal":
                value = rng.standard_normal(d.shape).astype(dt)
            elif d.kind == "bool":
                value = rng.integers(0, 2, d.shape).astype(bool)
            elif d.kind == "token ids":
                value = rng.integers(0, d.high, d.shape).astype(dt)
            else:
                start = int(rng.integers(0, d.high))
                n = int(np.prod(d.shape, dtype=np.int64))
                value = (np.arange(start, start + n) if n > 1 else np.full(1, start)).reshape(d.shape).astype(dt)
            feed[d.name] = value
        result = interp.run(feed, state)
        state = result.states
        outputs.append(result.outputs)
        last = feed
    return DecodeRun(outputs, state or {}, np.zeros((steps, 0), dtype=np.int64), None, last)  # type: ignore[arg-type]
