"""Each op's ``coreai`` op id, in the walker's record order: ``python -m analyzer.ir.coreai.op_ids ASSET OUT.json``.

coreai-torch stamps every op's debug location with ``"op_id": {type = "coreai", value = N}``; the runtime's
profiler names the same id for each timed op (``model._debug_infos``), so this list is how ``bench`` joins
profiled time to qfold's op records (:mod:`analyzer.measure.bench`). The order is the walker's
(:mod:`analyzer.ir.coreai.walk`): ``main``'s ops, terminators left out, each ``coreai.invoke`` followed by its
callee's ops once per call. The MLIR bindings are native code, so the list is read in a child process, as the
walk's dump is (:mod:`analyzer.ir.coreai.mlir_dump`); :func:`read_op_ids` starts it.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path

from analyzer.errors import CoreAIRuntimeError
from analyzer.ir.coreai.asset import PROGRAM_FILE, check_asset
from analyzer.ir.coreai.native_child import asset_bytes, child_limit, run_module

OP_ID = re.compile(r'"op_id": \{type = "coreai", value = (\d+)')  # in an op's debug location
CALLEE = re.compile(r"@([\w.$-]+)")  # a coreai.invoke's callee graph
TERMINATORS = ("coreai.output", "coreai.yield")
_MAX_INLINE_DEPTH = 8


def op_id_sequence(module) -> list[tuple[str, int | None]]:
    """(op name, ``coreai`` op id from its debug location, None without one) per op in the walker's record order
    (see the module docstring)."""
    graphs = {}
    for g in module.body.operations:
        g = g.operation if hasattr(g, "operation") else g
        if g.name == "coreai.graph":
            graphs[g.attributes["sym_name"].value] = g.regions[0].blocks[0]
    out: list[tuple[str, int | None]] = []

    def emit(block, depth: int) -> None:
        for op in block.operations:
            op = op.operation if hasattr(op, "operation") else op
            if op.name in TERMINATORS:
                continue
            m = OP_ID.search(str(op.location))
            out.append((op.name, int(m.group(1)) if m else None))
            if op.name == "coreai.invoke" and depth < _MAX_INLINE_DEPTH:
                callee = CALLEE.search(str(op.attributes["callee"])) if "callee" in op.attributes else None
                if callee and callee.group(1) in graphs:
                    emit(graphs[callee.group(1)], depth + 1)

    if "main" in graphs:
        emit(graphs["main"], 0)
    return out


def dump_op_ids(asset: Path) -> list[tuple[str, int | None]]:
    """The child's side: load the asset's MLIR (checked first) and list its op ids."""
    import coreai.authoring  # noqa: F401  (before coreai._compiler: the other order is a circular import)
    from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import load_module_from_bytecode
    from coreai.authoring.context import Context

    module = load_module_from_bytecode(context=Context()._mlir_context, path=check_asset(asset) / PROGRAM_FILE)
    return op_id_sequence(module)


def read_op_ids(asset: Path) -> list[tuple[str, int | None]]:
    """The parent's side: :func:`op_id_sequence` of ``asset`` read in a child (within its time limit,
    :mod:`analyzer.ir.coreai.native_child`). A child that fails, crashes or times out is a
    :class:`~analyzer.errors.CoreAIRuntimeError` in one line, never an empty list (which a join would report as
    nothing joined)."""
    with tempfile.TemporaryDirectory(prefix="qfold-opids-") as d:
        out = Path(d) / "ids.json"
        run_module("analyzer.ir.coreai.op_ids", [str(asset), str(out)], "reading its op ids", str(asset),
                   child_limit(asset_bytes(asset)), CoreAIRuntimeError)
        if not out.is_file():
            raise CoreAIRuntimeError(f"{asset}: reading its op ids wrote nothing")
        return [(str(n), None if i is None else int(i)) for n, i in json.loads(out.read_text())]


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(dump_op_ids(Path(sys.argv[1]))))
