"""A program at any context length from the same program converted at two: the affine law of a ctx sweep.

For one graph (same source, variant, KV mode, compression, phase, build mode) and ctx values on the same side of
every config threshold (``analyzer.model.ctx_thresholds``), the converted step differs between context lengths
only in numbers: tensor dimensions (the KV state ``[1, Hkv, S, D]``, the mask ``[1, 1, 1, S]``, the scores
``[1, Hq, 1, S]``, ...) and stored constant sizes. Each is affine in S, so two programs at ``a < b`` give it at any
``n`` exactly::

    d(n) = d(a) + (d(b) - d(a)) · (n - a) / (b - a)        # must be a whole number >= 0, else refused

Everything else — op types and names, layers, producers (the graph's edges), parameters, dtypes, tile kinds —
must be equal op for op, and is copied. An op's inputs are a map in the MIL protobuf, so their order in a record is
the serialisation's and differs between two conversions of one graph (measured: ``greater_equal(y, x)`` in one
build, ``(x, y)`` in the next); they are matched by parameter name (:func:`by_param`), a list argument keeping its
order. Byte sizes of tensors follow from the derived shapes (``tensor_nbytes``),
so bytes, FLOPs and op counts of the derived program are what the usual rules make of it. :func:`prove_affine`
checks the law on a third conversion: the program derived at ``c`` from ``a`` and ``b`` must equal the one converted
at ``c``, op for op, number for number; otherwise :class:`CtxLawError` names the first difference.
"""

from __future__ import annotations

from dataclasses import replace

from analyzer.errors import QfoldError
from analyzer.ir.mil_records import AssumedShape, InputRef, MilProgram, OpRecord, TensorInfo, tensor_nbytes


class CtxLawError(QfoldError):
    """Two or three programs are not one graph at different context lengths, or a number is not affine in ctx."""


def by_param(refs: tuple[InputRef, ...]) -> tuple[InputRef, ...]:
    """An op's inputs in parameter-name order (stable: the arguments of one list parameter keep theirs)."""
    return tuple(sorted(refs, key=lambda r: r.param))


def canonical(program: MilProgram) -> MilProgram:
    """``program`` with every op's inputs in :func:`by_param` order, and no package path: what two conversions of
    one graph at one ctx agree on."""
    return replace(program, path="", ops=tuple(replace(op, inputs=by_param(op.inputs)) for op in program.ops))


class _Law:
    """Interpolation (or extrapolation) from ctx ``a`` to ``n`` along ``b``, one number at a time."""

    def __init__(self, a: int, b: int, n: int) -> None:
        if not 0 < a < b:
            raise CtxLawError(f"a ctx law needs two context lengths 0 < a < b, got {a} and {b}")
        self.a, self.b, self.n = a, b, n

    def number(self, va: int, vb: int, where: str) -> int:
        if va == vb:
            return va
        q, r = divmod((vb - va) * (self.n - self.a), self.b - self.a)
        if r or va + q < 0:
            raise CtxLawError(f"{where}: {va} at ctx {self.a} and {vb} at ctx {self.b} give "
                              f"{va + (vb - va) * (self.n - self.a) / (self.b - self.a):g} at ctx {self.n}, "
                              "not a whole number of elements")
        return va + q

    def same(self, va, vb, where: str, what: str):
        if va != vb:
            raise CtxLawError(f"{where}: {what} {va!r} at ctx {self.a} but {vb!r} at ctx {self.b}")
        return va

    def tensor(self, ta: TensorInfo, tb: TensorInfo, where: str) -> TensorInfo:
        self.same(ta.name, tb.name, where, "tensor")
        where = f"{where} {ta.name}"
        self.same(ta.dtype, tb.dtype, where, "dtype")
        self.same(len(ta.shape), len(tb.shape), where, "rank")
        shape = tuple(self.same(da, db, where, "symbolic dimension") if da is None or db is None
                      else self.number(da, db, f"{where} dimension {i}")
                      for i, (da, db) in enumerate(zip(ta.shape, tb.shape, strict=True)))
        if ta.nbytes is None or tb.nbytes is None:
            self.same(ta.nbytes, tb.nbytes, where, "size")
            return replace(ta, shape=shape)
        return replace(ta, shape=shape, nbytes=tensor_nbytes(shape, ta.dtype))

    def tensors(self, xs: tuple[TensorInfo, ...], ys: tuple[TensorInfo, ...], where: str) -> tuple[TensorInfo, ...]:
        self.same(len(xs), len(ys), where, "count")
        return tuple(self.tensor(x, y, where) for x, y in zip(xs, ys, strict=True))

    def ref(self, ra: InputRef, rb: InputRef, where: str) -> InputRef:
        self.same((ra.param, ra.producer, ra.is_const), (rb.param, rb.producer, rb.is_const), where,
                  "input (param, producer, const)")
        return replace(ra, tensor=self.tensor(ra.tensor, rb.tensor, f"{where} {ra.param}"),
                       stored_bytes=self.number(ra.stored_bytes, rb.stored_bytes, f"{where} {ra.param} stored bytes"))

    def op(self, oa: OpRecord, ob: OpRecord) -> OpRecord:
        where = f"op {oa.index} ({oa.type} {oa.name})"
        self.same((oa.type, oa.name, oa.layer, oa.layer_from, oa.tile_kind, oa.const_zero, oa.parent, oa.composite),
                  (ob.type, ob.name, ob.layer, ob.layer_from, ob.tile_kind, ob.const_zero, ob.parent, ob.composite),
                  where, "(type, name, layer, layer from, tile kind, const zero, parent, composite)")
        self.same(len(oa.inputs), len(ob.inputs), where, "input count")
        pairs = zip(by_param(oa.inputs), by_param(ob.inputs), strict=True)
        return replace(oa, inputs=tuple(self.ref(x, y, where) for x, y in pairs),
                       outputs=self.tensors(oa.outputs, ob.outputs, f"{where} outputs"),
                       const_bytes=self.number(oa.const_bytes, ob.const_bytes, f"{where} const bytes"))


def derive_program(a: tuple[int, MilProgram], b: tuple[int, MilProgram], ctx: int) -> MilProgram:
    """The program at ``ctx`` from the same graph converted at ``a = (ctx_a, program)`` and ``b`` (ctx_a < ctx_b);
    raises :class:`CtxLawError` naming the first op or number that does not follow the law. It is
    :func:`canonical`: no package path (no package holds it), inputs by parameter name."""
    (ctx_a, pa), (ctx_b, pb) = a, b
    law = _Law(ctx_a, ctx_b, ctx)
    law.same((pa.function, pa.opset, pa.spec_version), (pb.function, pb.opset, pb.spec_version), "program",
             "(function, opset, spec version)")
    law.same(len(pa.ops), len(pb.ops), "program", "op count")
    law.same(len(pa.assumed_shapes), len(pb.assumed_shapes), "program", "assumed shapes")
    assumed = tuple(AssumedShape(law.same(x.name, y.name, "assumed shape", "name"),
                                 tuple(law.number(dx, dy, f"assumed shape {x.name}")
                                       for dx, dy in zip(x.shape, y.shape, strict=True)),
                                 law.same(x.how, y.how, f"assumed shape {x.name}", "how"))
                    for x, y in zip(pa.assumed_shapes, pb.assumed_shapes, strict=True))
    ops = tuple(law.op(x, y) for x, y in zip(pa.ops, pb.ops, strict=True))  # first: a difference names its op
    return MilProgram("", pa.function, pa.opset, pa.spec_version, law.tensors(pa.inputs, pb.inputs, "inputs"),
                      law.tensors(pa.states, pb.states, "states"), law.tensors(pa.outputs, pb.outputs, "outputs"),
                      ops, assumed)


def same_program(derived: MilProgram, converted: MilProgram) -> str | None:
    """None when the two are equal op for op and number for number (in :func:`canonical` form: the package path
    and the order of each op's inputs aside), else the first difference in words."""
    derived, converted = canonical(derived), canonical(converted)
    if derived == converted:
        return None
    if len(derived.ops) != len(converted.ops):
        return f"{len(derived.ops)} ops derived, {len(converted.ops)} converted"
    for d, c in zip(derived.ops, converted.ops, strict=True):  # ops first: a difference names its op
        if d != c:
            shapes = [t.shape_text for t in d.outputs], [t.shape_text for t in c.outputs]
            return (f"op {d.index} ({d.type} {d.name}): derived outputs {', '.join(shapes[0])}, converted "
                    f"{', '.join(shapes[1])}" + ("" if shapes[0] != shapes[1] else " (inputs or sizes differ)"))
    for label in ("inputs", "states", "outputs", "assumed_shapes"):
        if getattr(derived, label) != getattr(converted, label):
            return f"program {label}: {getattr(derived, label)} derived, {getattr(converted, label)} converted"
    return "the programs differ"


def prove_affine(a: tuple[int, MilProgram], b: tuple[int, MilProgram], c: tuple[int, MilProgram]) -> None:
    """Check the law on a third conversion: the program derived at ``c``'s ctx from ``a`` and ``b`` must equal
    ``c``'s program; raises :class:`CtxLawError` with the first difference."""
    derived = derive_program(a, b, c[0])
    difference = same_program(derived, c[1])
    if difference is not None:
        raise CtxLawError(f"derived at ctx {c[0]} from ctx {a[0]} and {b[0]}, the program differs from its "
                          f"conversion: {difference}")
