"""Flexible inputs (``ct.RangeDim``, enumerated shapes): the shape an analysis assumes for each, and the program
sized at those shapes.

Byte, FLOP and replication figures need every tensor's size, so a flexible program is analysed at one shape per
flexible input: the one given (``--shape NAME=D0,D1,…``, each within the input's range or enumerated set), else a
stated default —

- query-length dimensions (a token-id input ``[1, Q]``, a hidden-state input ``[1, N, H]``, a mask's rows) at
  their lower bound: the smallest call, a decode step;
- context dimensions (a mask's last axis, a KV-cache input's sequence axis) at their upper bound: the whole
  visible cache;
- an enumerated input at its default shape;

and any other flexible dimension must be given (refused, naming the input). The program is then sized by one
run of the MIL interpreter on zero inputs of those shapes: every symbolic dimension becomes the size that run
computed, and the op facts (layers, tile kinds) are derived again on the sized records. Every analysis carries
the shapes it assumed (:attr:`MilProgram.assumed_shapes`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from analyzer.engines.interpret import load_interpreter
from analyzer.engines.interpret.values import MAX_ARRAY_BYTES_ENV, NP_DTYPES, max_array_bytes, np_dtype
from analyzer.errors import QfoldError, ShapeError
from analyzer.ir.coreml.mil_reader import list_functions, load_function, read_program
from analyzer.ir.coreml.milproto import feature_info
from analyzer.ir.mil_records import AssumedShape, MilProgram, TensorInfo, tensor_nbytes
from analyzer.ir.opfacts import derive_op_facts

_SHAPE_ARG = re.compile(r"^([^=\s]+)=(\d+(?:,\d+)*)$")
_MASK = re.compile(r"mask", re.IGNORECASE)
_CACHE = re.compile(r"cache|past_key|past_value", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class InputRange:
    """What shapes one input accepts, from the package's description."""

    name: str
    dtype: str
    default: tuple[int, ...]
    lower: tuple[int, ...]
    upper: tuple[int | None, ...]  # None: unbounded
    enumerated: tuple[tuple[int, ...], ...] = ()

    @property
    def flexible(self) -> bool:
        return bool(self.enumerated) or self.lower != tuple(self.upper)

    def admits(self, shape: tuple[int, ...]) -> bool:
        if self.enumerated:
            return shape in self.enumerated
        return len(shape) == len(self.lower) and all(
            lo <= d and (hi is None or d <= hi) for d, lo, hi in zip(shape, self.lower, self.upper, strict=True))

    @property
    def text(self) -> str:
        if self.enumerated:
            return "one of " + ", ".join("[" + ",".join(map(str, s)) + "]" for s in self.enumerated)
        return "[" + ",".join(str(lo) if lo == hi else f"{lo}…{'∞' if hi is None else hi}"
                              for lo, hi in zip(self.lower, self.upper, strict=True)) + "]"


def parse_shape_args(values: list[str] | tuple[str, ...] | None) -> dict[str, tuple[int, ...]]:
    """``["inputIds=1,8", ...]`` → ``{"inputIds": (1, 8)}``; a malformed or repeated one is a ShapeError."""
    out: dict[str, tuple[int, ...]] = {}
    for text in values or ():
        m = _SHAPE_ARG.match(text.strip())
        if m is None:
            raise ShapeError(f"--shape {text!r}: expected NAME=D0,D1,… (positive integers), e.g. inputIds=1,8")
        name, dims = m.group(1), tuple(int(d) for d in m.group(2).split(","))
        if any(d < 1 for d in dims):
            raise ShapeError(f"--shape {text!r}: every dimension must be at least 1")
        if name in out:
            raise ShapeError(f"--shape {name}: given twice")
        out[name] = dims
    return out


def parse_shape_text(text: str) -> dict[str, tuple[int, ...]]:
    """The dashboard's shape field: ``--shape`` values separated by spaces or semicolons
    (``"inputIds=1,8; causalMask=1,1,8,2048"``), parsed as :func:`parse_shape_args` parses the flags."""
    return parse_shape_args([t for t in re.split(r"[\s;]+", text.strip()) if t])


def _dims(shape: tuple[int, ...]) -> str:
    return ",".join(map(str, shape))


def shapes_label(assumed: tuple[AssumedShape, ...]) -> str:
    """`` @ inputIds[1,1] causalMask[1,1,1,2048]``: the shapes a flexible program is analysed at, for a label
    (labels carry them); "" for a program of static shapes."""
    return (" @ " + " ".join(f"{a.name}[{_dims(a.shape)}]" for a in assumed)) if assumed else ""


def input_ranges(path: str | Path, function: str | None = None) -> tuple[InputRange, ...]:
    """Every input of a function with the shapes its description accepts."""
    loaded = load_function(path, function)
    desc = loaded.spec.description
    described = next((f for f in desc.functions if f.name == loaded.name), desc)
    out = []
    for feature in described.input:
        if feature.type.WhichOneof("Type") != "multiArrayType":
            continue
        arr = feature.type.multiArrayType
        default = tuple(int(d) for d in arr.shape)
        dtype = feature_info(feature).dtype
        enumerated = tuple(tuple(int(d) for d in s.shape) for s in arr.enumeratedShapes.shapes)
        if arr.shapeRange.sizeRanges:
            lower = tuple(int(r.lowerBound) for r in arr.shapeRange.sizeRanges)
            upper = tuple(None if r.upperBound < 0 else int(r.upperBound) for r in arr.shapeRange.sizeRanges)
        else:
            lower, upper = default, default
        out.append(InputRange(feature.name, dtype, default, lower, upper, enumerated))
    return tuple(out)


def assume_shapes(ranges: tuple[InputRange, ...], given: Mapping[str, tuple[int, ...]] | None = None
                  ) -> tuple[AssumedShape, ...]:
    """The shape to analyse for every flexible input (the module docstring's rules); a given shape must be
    within its input's range. Names given for inputs this program lacks are ignored here (a command checks that
    each names an input of at least one of its packages: :func:`check_names`)."""
    given = dict(given or {})
    out = []
    for r in ranges:
        if r.name in given:
            shape = given[r.name]
            if not r.admits(shape):
                raise ShapeError(f"--shape {r.name}={','.join(map(str, shape))}: outside what input {r.name!r} "
                                 f"accepts ({r.text})")
            cap = max_array_bytes()
            nbytes = math.prod(shape) * (NP_DTYPES[r.dtype].itemsize if r.dtype in NP_DTYPES else 1)
            if nbytes > cap:  # an unbounded range admits any size: the arrays made at it are held to the ceiling
                raise ShapeError(f"--shape {r.name}={','.join(map(str, shape))}: {nbytes:,} bytes, more than the "
                                 f"{cap:,} an interpreter array may take (${MAX_ARRAY_BYTES_ENV})")
            out.append(AssumedShape(r.name, shape, "given (--shape)"))
        elif r.flexible:
            out.append(_default(r))
    return tuple(out)


def _default(r: InputRange) -> AssumedShape:
    if r.enumerated:
        return AssumedShape(r.name, r.default, "the enumerated default")
    flexible = [ax for ax, (lo, hi) in enumerate(zip(r.lower, r.upper, strict=True)) if lo != hi]
    rank, is_int = len(r.lower), r.dtype.startswith("int")
    rows, context = set(), set()
    if is_int and rank == 2:  # token ids [1, Q]
        rows = {1}
    elif not is_int and rank == 3 and not _MASK.search(r.name):  # hidden states [1, N, H]
        rows = {1}
    elif _MASK.search(r.name) and rank >= 2:  # [.., q, end]
        rows, context = {rank - 2}, {rank - 1}
    elif _CACHE.search(r.name) and rank >= 3:  # a KV-cache input [.., S, D]
        context = {rank - 2}
    unknown = [ax for ax in flexible if ax not in rows | context]
    unbounded = [ax for ax in flexible if ax in context and r.upper[ax] is None]
    if unknown or unbounded:
        why = "has no upper bound" if unbounded and not unknown else "is not a query length or a context"
        raise ShapeError(f"input {r.name!r} accepts {r.text}: its flexible dimension {(unknown or unbounded)[0]} "
                         f"{why}; give --shape {r.name}=" + ",".join(map(str, r.default)))
    shape = tuple(r.lower[ax] if ax in rows else r.upper[ax] if ax in context else r.lower[ax]  # type: ignore[misc]
                  for ax in range(rank))
    parts = (["query length at its lower bound"] if rows & set(flexible) else []) + (
        ["context at its upper bound"] if context & set(flexible) else [])
    return AssumedShape(r.name, shape, ", ".join(parts) or "its only shape")


def check_names(given: Mapping[str, tuple[int, ...]], inputs_per_package: list[set[str]]) -> None:
    """Every ``--shape`` name must be an input of at least one package of the command."""
    known = set().union(*inputs_per_package) if inputs_per_package else set()
    for name in given:
        if name not in known:
            raise ShapeError(f"--shape {name}: no package given has an input {name!r} "
                             f"(inputs: {', '.join(sorted(known)) or 'none'})")


def package_shapes(path: str | Path, given: Mapping[str, tuple[int, ...]] | None = None
                   ) -> dict[str, tuple[AssumedShape, ...]]:
    """Per function of a package, the shapes its analysis assumes (``given``, else the defaults), read off the
    description alone (nothing is sized): what a label states before the analysis runs. Each given name must be
    an input of some function."""
    ranges = {fn: input_ranges(path, fn) for fn in list_functions(path)}
    check_names(given or {}, [{r.name for r in rs} for rs in ranges.values()])
    return {fn: assume_shapes(rs, given) for fn, rs in ranges.items()}


def check_static_shapes(given: Mapping[str, tuple[int, ...]], inputs: tuple[TensorInfo, ...], where: str | Path
                        ) -> None:
    """A program whose inputs all have static shapes (a Core AI asset, ``where``) cannot be sized: a ``--shape``
    naming one of its inputs must be that input's own shape, else it is refused rather than silently ignored."""
    for t in inputs:
        if t.name in given and tuple(given[t.name]) != tuple(t.shape):
            raise ShapeError(f"--shape {t.name}={','.join(map(str, given[t.name]))}: outside what input {t.name!r} "
                             f"accepts ({list(t.shape)}: {where} has static input shapes; --shape sizes "
                             "flexible Core ML inputs)")


def probe_shapes(ranges: tuple[InputRange, ...], assumed: tuple[AssumedShape, ...]
                 ) -> list[tuple[str, dict[str, tuple[int, ...]]]]:
    """Shapes at which a fact found at the stated shapes is checked over the flexible range: (label, input →
    shape) for the stated shapes, every flexible input at its lower bound, at its default, at its upper bound
    (an unbounded one stays at its lower bound) and, for enumerated inputs, at each enumerated shape."""
    flexible = [r for r in ranges if r.flexible]
    stated = {a.name: a.shape for a in assumed}
    out = [("the stated shapes", {r.name: stated.get(r.name, r.default) for r in flexible})]
    lower = {r.name: r.enumerated[0] if r.enumerated else r.lower for r in flexible}
    upper = {r.name: r.enumerated[-1] if r.enumerated else tuple(lo if hi is None else hi for lo, hi in
                                                                   zip(r.lower, r.upper, strict=True))
             for r in flexible}
    out += [("the lower bounds", lower), ("the defaults", {r.name: r.default for r in flexible}),
            ("the upper bounds", upper)]
    counts = {len(r.enumerated) for r in flexible if r.enumerated}
    if len(counts) == 1:  # enumerated inputs listed in step: their i-th shapes go together
        for i in range(counts.pop()):
            shapes = {r.name: r.enumerated[i] if r.enumerated else stated.get(r.name, r.default) for r in flexible}
            out.append(("enumerated " + " ".join(f"{n}[{','.join(map(str, s))}]" for n, s in shapes.items()), shapes))
    return out


def range_bounds(ranges: tuple[InputRange, ...]) -> dict[str, tuple[tuple[int, ...], tuple[int | None, ...]]]:
    """Each flexible input's (lower, upper) per axis; an enumerated input's smallest and largest size per axis."""
    out = {}
    for r in ranges:
        if r.enumerated:
            out[r.name] = (tuple(map(min, zip(*r.enumerated, strict=True))),
                           tuple(map(max, zip(*r.enumerated, strict=True))))
        elif r.flexible:
            out[r.name] = (r.lower, r.upper)
    return out


# ------------------------------------------------------------------------------------------------ sizing
def read_sized(path: str | Path, function: str | None = None,
               given: Mapping[str, tuple[int, ...]] | None = None) -> MilProgram:
    """``read_program``, and for a flexible program the same records sized at the assumed shapes."""
    program = read_program(path, function)
    if not any(t.symbolic for t in program.inputs) and not set(given or {}) & {t.name for t in program.inputs}:
        return program
    assumed = assume_shapes(input_ranges(path, program.function), given)
    return size_program(program, path, assumed) if assumed else program


def sizing_error_text(assumed: tuple[AssumedShape, ...], why: str) -> str:
    """Why a program could not be sized, as :attr:`MilProgram.sizing_error` words it: the shapes and the
    interpreter's failure (which names the op and the cause)."""
    return f"the MIL interpreter cannot run it at {' '.join(f'{a.name}[{_dims(a.shape)}]' for a in assumed)}: {why}"


def size_program(program: MilProgram, path: str | Path, assumed: tuple[AssumedShape, ...]) -> MilProgram:
    """The records with every symbolic dimension at the size one interpreter run computes at ``assumed``; if the
    program cannot be run, it stays unsized and :attr:`MilProgram.sizing_error` says why (the op and the cause)."""
    shapes = {a.name: a.shape for a in assumed}
    try:
        interp = load_interpreter(path, program.function)
        feed = {t.name: np.zeros(shapes.get(t.name) or tuple(d or 1 for d in t.shape), dtype=np_dtype(t.dtype))
                for t in interp.inputs}
        values = interp.value_shapes(feed)
    except QfoldError as e:
        return replace(program, assumed_shapes=assumed, sizing_error=sizing_error_text(assumed, str(e)))
    values.update(shapes)

    def sized(t: TensorInfo) -> TensorInfo:
        s = values.get(t.name)
        if not t.symbolic or s is None or len(s) != len(t.shape):
            return t
        return TensorInfo(t.name, s, t.dtype, tensor_nbytes(s, t.dtype))

    ops = [replace(op, inputs=tuple(replace(r, tensor=sized(r.tensor)) for r in op.inputs),
                   outputs=tuple(sized(o) for o in op.outputs)) for op in program.ops]
    return replace(program, inputs=tuple(sized(t) for t in program.inputs), ops=tuple(derive_op_facts(ops)),
                   assumed_shapes=assumed)
