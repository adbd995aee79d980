"""Walk a Core AI asset's MLIR in a child process: ``python -m analyzer.ir.coreai.mlir_dump ASSET OUT.json``.

The asset is checked first (:func:`analyzer.ir.coreai.asset.check_asset`); the MLIR bytecode is then read with
the bindings coreai-core ships (``coreai._compiler``: ``load_module_from_bytecode``, the loader behind
``AIModelAsset.program``), in a process of its own because native code that fails on odd input takes the process
with it (the probe saw the runtime segfault on a folder that was no asset). The child writes plain JSON, one
object per ``coreai.graph``, that :mod:`analyzer.ir.coreai.walk` turns into op records:

``{"graphs": [{"name", "composite", "composite_inputs", "args": [[name, type]], "results": [name], "ops": [op]}]}``
(``composite_inputs``: a composite's declared input names, ``["query", "key", "value"]``) with each op
``{"op": "coreai.reshape", "operands": [value id], "results": [[value id, type]], "stack": [frame],
"source": torch node, "callee": graph, "zero": bool, "value": [int] | null, "index_profile": {…}}``; a type is
``[shape, dtype, kind]`` (kind ``tensor``, ``handle`` for a state, ``token``, or ``other``); value ids are unique
across the module; ``stack`` is the debug-info call stack outermost first (``Exaone4DecoderLayer$2``: the second
instance of that module class).
A constant's ``value`` is kept when it has at most :data:`SMALL_INTS` integers (shapes, permutations, axes); a
``gather_along_axis`` / ``gather_nd`` row has ``index_profile``, what its index selects
(:func:`analyzer.ir.coreai.index_profile.gather_profile`: a large index constant is read in place from the file,
checked in chunks and recorded as its values along the gather axis only).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.errors import QfoldError
from analyzer.ir.coreai.asset import PROGRAM_FILE, check_asset
from analyzer.ir.coreai.index_profile import GATHERS, ConstantReader, gather_profile

_TENSOR = re.compile(r"tensor<((?:\?|\d+)(?:x(?:\?|\d+))*x)?([a-zA-Z]+[0-9A-Za-z]*)>")
_CALL_STACK = re.compile(r'<"call_stack": \[([^\]]*)\]>')
_SOURCE = re.compile(r'identifiers = \["([^"]*)"')
_COMPOSITE = re.compile(r'composite_declaration<"(\w+)"')
_COMPOSITE_INPUTS = re.compile(r"input_names = \[([^\]]*)\]")
_DTYPES = {"f16": "fp16", "f32": "fp32", "f64": "fp64", "bf16": "bf16", "i1": "bool",
           # compressed weights (coreai-opt 0.4.0: sub-byte LUT indices ui1-ui8, fp8 LUTs and data, e8m0 scales)
           "f8E4M3FN": "fp8e4m3fn", "f8E5M2": "fp8e5m2", "f8E8M0FNU": "fp8e8m0fnu", "f4E2M1FN": "fp4e2m1fn"}
_INT = re.compile(r"(s|u)?i(\d+)")  # si8 / i8 → int8, ui4 → uint4
SMALL_INTS = 16  # integers kept of a constant (a shape, a permutation, axes): what the replication classifier reads


def type_json(text: str) -> list[Any]:
    """``[shape, dtype, kind]`` of an MLIR type's text: ``tensor<1x2x256x32xf16>`` → ``[[1,2,256,32], "fp16",
    "tensor"]``; a ``!coreai.handle<tensor<…>>`` (a state) has kind ``handle``; ``?`` dimensions are None."""
    kind = "handle" if text.startswith("!coreai.handle") else "token" if text == "!coreai.token" else "tensor"
    m = _TENSOR.search(text)
    if m is None or kind == "token":
        return [[], text, kind if kind == "token" else "other"]
    dims = [None if d == "?" else int(d) for d in (m.group(1) or "").split("x") if d]
    return [dims, dtype_name(m.group(2)), kind]


def dtype_name(mlir: str) -> str:
    """qfold's (MIL's) name of an MLIR element type: ``f16`` → ``fp16``, ``si8``/``i8`` → ``int8``, ``ui4`` →
    ``uint4``, ``f8E4M3FN`` → ``fp8e4m3fn``; an unknown one keeps its MLIR name."""
    if mlir in _DTYPES:
        return _DTYPES[mlir]
    m = _INT.fullmatch(mlir)
    return f"{'uint' if m.group(1) == 'u' else 'int'}{m.group(2)}" if m else mlir


def _debug(op) -> tuple[list[str], str]:
    loc = str(op.location)
    stack = _CALL_STACK.search(loc)
    frames = [f.strip().strip('"') for f in stack.group(1).split(",")] if stack else []
    source = _SOURCE.search(loc)
    return frames[::-1], source.group(1) if source else ""  # the asset lists the innermost frame first


def _is_zero_splat(op) -> bool:
    from coreai._compiler.ir import DenseElementsAttr

    try:
        attr = DenseElementsAttr(op.attributes["value"])
    except (ValueError, TypeError, KeyError):
        return False  # a resource blob (weights): its values are not read here
    if not attr.is_splat:
        return False
    text = str(attr.get_splat_value())
    return re.fullmatch(r"(?:-?0(?:\.0*)?(?:e[+-]?0+)?)", text.split(":")[0].strip(), re.IGNORECASE) is not None


def _small_ints(op) -> list[int] | None:
    """A small integer constant's values (permutations, shapes, axes: what the replication classifier reads); a
    splat (``dense<1> : tensor<si32>``, a gather's or a concat's axis) as its value repeated."""
    from coreai._compiler.ir import DenseIntElementsAttr, RankedTensorType

    try:
        attr = DenseIntElementsAttr(op.attributes["value"])
        numel = int(np.prod(RankedTensorType(op.results[0].type).shape, dtype=np.int64))
    except (ValueError, TypeError, KeyError):
        return None
    if numel > SMALL_INTS:
        return None
    return [int(attr[0])] * numel if attr.is_splat else [int(attr[i]) for i in range(numel)]


def dump_module(module, handles: dict[tuple[str, int], Any] | None = None,
                reader: ConstantReader | None = None) -> dict[str, Any]:
    """Every ``coreai.graph`` of an MLIR module as JSON-ready rows (see the module docstring). ``handles``, when
    given, receives each row's MLIR operation under (graph name, row index): a caller that edits the program in
    its own process (``analyzer.convert.compress.coreai_apply``) finds the op a row describes. ``reader`` reads
    gathers' index constants (from the asset's file, when it was read from one; else by copying, bounded)."""
    ids: dict[Any, int] = {}
    reader = reader or ConstantReader()

    def vid(value) -> int:
        return ids.setdefault(value, len(ids))

    graphs = []
    for top in module.body.operations:
        g = top.operation
        if g.name != "coreai.graph":
            continue
        attrs = g.attributes
        block = g.regions[0].blocks[0]
        arg_names = _names(attrs, "arg_attrs", len(block.arguments))
        decl = _COMPOSITE.search(str(attrs["composite_decl"])) if "composite_decl" in attrs else None
        ops = []
        name = attrs["sym_name"].value
        for inner in block.operations:
            op = inner.operation
            if handles is not None:
                handles[(name, len(ops))] = op
            stack, source = _debug(op)
            row: dict[str, Any] = {"op": op.name, "operands": [vid(v) for v in op.operands],
                                   "results": [[vid(r), type_json(str(r.type))] for r in op.results],
                                   "stack": stack, "source": source}
            if op.name == "coreai.invoke":
                callee = re.search(r"@([\w$.-]+)", str(op.attributes["callee"]))
                row["callee"] = callee.group(1) if callee else str(op.attributes["callee"])
            if op.name == "coreai.constant":
                row["zero"] = _is_zero_splat(op)
                row["value"] = _small_ints(op)
            if op.name in GATHERS:
                row["index_profile"] = gather_profile(op, reader)
            ops.append(row)
        n_results = len(ops[-1]["operands"]) if ops and ops[-1]["op"] == "coreai.output" else 0
        inputs = _COMPOSITE_INPUTS.search(str(attrs["composite_decl"])) if decl else None
        graphs.append({"name": name, "composite": decl.group(1) if decl else None,
                       "composite_inputs": re.findall(r'"([^"]*)"', inputs.group(1)) if inputs else None,
                       "args": [[vid(a), n, type_json(str(a.type))] for a, n in zip(block.arguments, arg_names,
                                                                                    strict=True)],
                       "results": _names(attrs, "res_attrs", n_results), "ops": ops})
    return {"graphs": graphs}


def _names(attrs, key: str, n: int) -> list[str]:
    """The ``coreai.name`` of each argument or result (``arg_attrs`` / ``res_attrs``), ``""`` where there is none."""
    if key not in attrs:
        return [""] * n
    out = [m.group(1) if (m := re.search(r'coreai\.name = "([^"]*)"', str(a))) else "" for a in attrs[key]]
    return (out + [""] * n)[:n]


def dump_asset(asset: Path) -> dict[str, Any]:
    """Load an asset's program (checked first) and dump it."""
    import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects: the other order is a circular import)
    from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import load_module_from_bytecode
    from coreai.authoring.context import Context

    path = check_asset(asset)
    module = load_module_from_bytecode(context=Context()._mlir_context, path=path / PROGRAM_FILE)
    with ConstantReader(path / PROGRAM_FILE) as reader:
        return dump_module(module, reader=reader)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m analyzer.ir.coreai.mlir_dump ASSET.aimodel OUT.json", file=sys.stderr)
        return 2
    try:
        doc = dump_asset(Path(argv[0]))
    except QfoldError as e:
        print(str(e), file=sys.stderr)
        return 1
    except Exception as e:  # a native loader's error: one line for the parent
        print(f"{argv[0]}: the MLIR reader failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:300]})",
              file=sys.stderr)
        return 1
    out = Path(argv[1])
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
