"""A walked program as compact JSON and back, checking every field on the way in.

Compact because a full-size program has ~4,600 ops: a tensor is ``[name, shape, dtype, nbytes]``, an input
``[param, tensor, producer, is_const, stored_bytes]``, an op ``[type, name, layer, layer_from, inputs, outputs,
const_bytes, tile_kind, const_zero, parent]`` (schema 2; schema 1 had no ``parent``), plus ``composite`` as an 11th
field on the ops of a Core AI composite's inlined fallback body (rows without one are exactly as before).

A flexible program that could not be sized stores why as ``sizing_error`` (schema 3). Schemas 1 and 2 wrote it
inside each assumed shape's ``how`` (``"…; not sized: the interpreter cannot run it (REASON)"``): it is read back
from there into ``sizing_error`` and the ``how`` is left as the shape rule alone.
"""

from __future__ import annotations

import re
from typing import Any

from analyzer.analysis.shapes import sizing_error_text
from analyzer.ir.coreai.dialect import kind_of
from analyzer.ir.mil_records import AssumedShape, InputRef, MilProgram, OpRecord, TensorInfo, tensor_nbytes
from analyzer.jsonfields import Field

OP_FIELDS_V1 = 9
OP_FIELDS = 10
# How schemas 1 and 2 appended a sizing failure to an assumed shape's ``how``.
_OLD_SIZING_NOTE = re.compile(r"^(?P<how>.*?); not sized: the interpreter cannot run it \((?P<why>.*)\)$", re.DOTALL)


def _tensor_json(t: TensorInfo) -> list[Any]:
    return [t.name, list(t.shape), t.dtype, t.nbytes]


def _tensor_fast(v: Any) -> TensorInfo | None:
    """The common, well-formed tensor without a Field per element (a full-size program has ~10^4); None sends it
    to the checked path, which names what is wrong."""
    if (type(v) is list and len(v) == 4 and type(v[0]) is str and type(v[1]) is list and type(v[2]) is str
            and all(d is None or (type(d) is int and d >= 0) for d in v[1])
            and (v[3] is None or (type(v[3]) is int and v[3] >= 0))):
        t = TensorInfo(v[0], tuple(v[1]), v[2], v[3])
        if t.nbytes == tensor_nbytes(t.shape, t.dtype) or tensor_nbytes(t.shape, t.dtype) is None:
            return t
    return None


def _tensor(f: Field) -> TensorInfo:
    t = _tensor_fast(f.value)
    if t is not None:
        return t
    name, shape, dtype, nbytes = f.list(4)
    dims = tuple(None if d.value is None else d.count() for d in shape.list())
    t = TensorInfo(name.str(), dims, dtype.str(), None if nbytes.value is None else nbytes.count())
    expected = tensor_nbytes(t.shape, t.dtype)
    if expected is not None and t.nbytes != expected:
        nbytes.fail(f"{t.nbytes} bytes, but {t.shape_text} {t.dtype} is {expected} bytes")
    return t


def program_to_json(program: MilProgram) -> dict[str, Any]:
    extra = {"assumed_shapes": [a.to_json() for a in program.assumed_shapes]} if program.assumed_shapes else {}
    if program.sizing_error is not None:
        extra["sizing_error"] = program.sizing_error
    return {**extra,
        "path": program.path,
        "function": program.function,
        "opset": program.opset,
        "spec_version": program.spec_version,
        "inputs": [_tensor_json(t) for t in program.inputs],
        "states": [_tensor_json(t) for t in program.states],
        "outputs": [_tensor_json(t) for t in program.outputs],
        "ops": [
            [op.type, op.name, op.layer, op.layer_from,
             [[r.param, _tensor_json(r.tensor), r.producer, r.is_const, r.stored_bytes] for r in op.inputs],
             [_tensor_json(t) for t in op.outputs], op.const_bytes, op.tile_kind, op.const_zero, op.parent,
             *(() if op.composite is None else (op.composite,))]
            for op in program.ops
        ],
    }


def _op_fast(i: int, v: Any, n_fields: int) -> OpRecord | None:
    """Op ``i``'s row when every value is as :func:`_op` requires, read without a Field per value (~5 per op
    input); None sends the row to :func:`_op`'s checked path, which names the first wrong value."""
    n = len(v) if type(v) is list else 0
    if not (n == n_fields or (n_fields == OP_FIELDS and n == OP_FIELDS + 1)):
        return None
    op_type, name, layer, layer_from, inputs, outputs, const_bytes, tile_kind, const_zero = v[:9]
    parent = v[9] if n_fields > 9 else None
    composite = v[10] if n > OP_FIELDS else None
    if not (type(op_type) is str and type(name) is str and (layer is None or type(layer) is int)
            and type(layer_from) is str and type(inputs) is list and type(outputs) is list
            and type(const_bytes) is int and const_bytes >= 0 and (tile_kind is None or type(tile_kind) is str)
            and type(const_zero) is bool and (parent is None or (type(parent) is int and 0 <= parent < i))
            and (n <= OP_FIELDS or type(composite) is str)):
        return None
    refs = []
    for r in inputs:
        if type(r) is not list or len(r) != 5:
            return None
        param, tensor, producer, is_const, stored = r
        t = _tensor_fast(tensor)
        if (t is None or type(param) is not str or type(is_const) is not bool or type(stored) is not int or stored < 0
                or not (producer is None or (type(producer) is int and 0 <= producer < i))):
            return None
        refs.append(InputRef(param, t, producer, is_const, stored))
    outs = tuple(_tensor_fast(t) for t in outputs)
    if None in outs or (not outs and kind_of(op_type) in ("const", "tile")):
        return None
    return OpRecord(i, op_type, name, layer, layer_from, tuple(refs), outs, const_bytes, tile_kind, const_zero,
                    parent, composite)


def _op(i: int, f: Field, n_fields: int) -> OpRecord:
    fast = _op_fast(i, f.value, n_fields)
    if fast is not None:
        return fast
    n = len(f.value) if isinstance(f.value, list) else 0
    row = f.list(OP_FIELDS + 1 if n_fields == OP_FIELDS and n == OP_FIELDS + 1 else n_fields)
    refs = []
    for r in row[4].list():
        param, tensor, producer, is_const, stored = r.list(5)
        p = producer.opt_int()
        if p is not None and not 0 <= p < i:
            producer.fail(f"op {i} reads op {p}, which does not come before it")
        refs.append(InputRef(param.str(), _tensor(tensor), p, is_const.bool(), stored.count()))
    outputs = tuple(_tensor(t) for t in row[5].list())
    if not outputs and kind_of(row[0].str()) in ("const", "tile"):
        row[5].fail(f"a {row[0].value} op without an output")
    parent = row[9].opt_int() if n_fields > 9 else None
    if parent is not None and not 0 <= parent < i:
        row[9].fail(f"op {i} is nested in op {parent}, which does not come before it")
    composite = row[10].str() if len(row) > OP_FIELDS else None
    return OpRecord(i, row[0].str(), row[1].str(), row[2].opt_int(), row[3].str(), tuple(refs), outputs,
                    row[6].count(), row[7].opt_str(), row[8].bool(), parent, composite)


def program_from_json(f: Field, schema_version: int) -> MilProgram:
    """The program of a stored analysis; ``schema_version`` 1 rows have no ``parent``, and schemas 1 and 2 keep
    a sizing failure in the assumed shapes' ``how`` (see the module docstring)."""
    n_fields = OP_FIELDS_V1 if schema_version == 1 else OP_FIELDS
    ops = tuple(_op(i, op, n_fields) for i, op in enumerate(f["ops"].list()))
    assumed = f.get("assumed_shapes")
    shapes = tuple(AssumedShape(a["name"].str(), tuple(d.count() for d in a["shape"].list()), a["how"].str())
                   for a in (assumed.list() if assumed is not None else ()))
    error_field = f.get("sizing_error")
    sizing_error = None if error_field is None else error_field.opt_str()
    if schema_version < 3:
        shapes, sizing_error = _old_sizing_note(shapes)
    return MilProgram(f["path"].str(), f["function"].str(), f["opset"].str(), f["spec_version"].count(),
                      *(tuple(_tensor(t) for t in f[k].list()) for k in ("inputs", "states", "outputs")), ops,
                      shapes, sizing_error)


def _old_sizing_note(shapes: tuple[AssumedShape, ...]) -> tuple[tuple[AssumedShape, ...], str | None]:
    """Schemas 1 and 2: the assumed shapes with their ``how`` as the shape rule alone, and the sizing failure
    their notes carried (the same on every shape), as :func:`analyzer.analysis.shapes.size_program` words it now."""
    matches = [_OLD_SIZING_NOTE.match(a.how) for a in shapes]
    if not shapes or not all(matches):
        return shapes, None
    kept = tuple(AssumedShape(a.name, a.shape, m["how"]) for a, m in zip(shapes, matches, strict=True))  # type: ignore[index]
    return kept, sizing_error_text(kept, matches[0]["why"])  # type: ignore[index]
