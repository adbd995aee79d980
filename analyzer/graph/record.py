"""The analysis of one program: op records, counts and tiles, as a JSON-safe document and back.

``analysis.json`` in a build folder is this document plus the build's spec, timings and equivalence; the
shipped default analysis (no ``.mlpackage``) is the same document, so every view works from it alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError
from analyzer.graph.mil import InputRef, MilProgram, OpRecord, TensorInfo, read_program

SCHEMA_VERSION = 1
ANALYSIS_FILE = "analysis.json"


def tile_rows(program: MilProgram) -> list[dict[str, Any]]:
    """The CLI contract's tile list: name, layer, shapes, dtype, output bytes, kind."""
    rows = []
    for op in program.tiles():
        x = next((r.tensor for r in op.inputs if r.param == "x"), None)
        out = op.outputs[0]
        rows.append({
            "name": op.name,
            "layer": op.layer,
            "input_shape": list(x.shape) if x else None,
            "output_shape": list(out.shape),
            "dtype": out.dtype,
            "output_bytes": out.nbytes or 0,
            "kind": op.tile_kind,
        })
    return rows


def summarize(program: MilProgram) -> dict[str, Any]:
    counts = program.op_counts()
    tiles = tile_rows(program)
    return {
        "total_ops": program.total_ops,
        "const_ops": counts.get("const", 0),
        "non_const_ops": program.total_ops - counts.get("const", 0),
        "op_counts": counts,
        "tile_count": len(tiles),
        "tile_output_bytes": sum(t["output_bytes"] for t in tiles),
        "kv_replication_tiles": sum(1 for t in tiles if t["kind"] == "kv_replication"),
        "tiles": tiles,
    }


# ------------------------------------------------------------------------------------------------- JSON
def _tensor_json(t: TensorInfo) -> list[Any]:
    return [t.name, list(t.shape), t.dtype, t.nbytes]


def _tensor_from(v: list[Any]) -> TensorInfo:
    return TensorInfo(v[0], tuple(v[1]), v[2], v[3])


def program_to_json(program: MilProgram) -> dict[str, Any]:
    """Compact: tensors as [name, shape, dtype, nbytes], inputs as [param, tensor, producer, const, stored]."""
    return {
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
             [_tensor_json(t) for t in op.outputs], op.const_bytes, op.tile_kind, op.const_zero]
            for op in program.ops
        ],
    }


def program_from_json(d: dict[str, Any]) -> MilProgram:
    ops = tuple(
        OpRecord(i, o[0], o[1], o[2], o[3],
                 tuple(InputRef(r[0], _tensor_from(r[1]), r[2], r[3], r[4]) for r in o[4]),
                 tuple(_tensor_from(t) for t in o[5]), o[6], o[7], o[8])
        for i, o in enumerate(d["ops"])
    )
    return MilProgram(d["path"], d["function"], d["opset"], d["spec_version"],
                      tuple(_tensor_from(t) for t in d["inputs"]), tuple(_tensor_from(t) for t in d["states"]),
                      tuple(_tensor_from(t) for t in d["outputs"]), ops)


def program_document(program: MilProgram) -> dict[str, Any]:
    """summary + program, the part of analysis.json that any .mlpackage yields."""
    from analyzer.graph.accounting import account

    return {
        "schema_version": SCHEMA_VERSION,
        "summary": summarize(program),
        "bytes": account(program).to_json(),
        "program": program_to_json(program),
    }


def load_program(path: str | Path) -> tuple[MilProgram, dict[str, Any]]:
    """A build folder, an analysis.json, or any .mlpackage → (program, analysis document)."""
    p = Path(path)
    if (p.is_dir() and (p / ANALYSIS_FILE).is_file()) or (p.is_file() and p.suffix == ".json"):
        doc = load_analysis(p)
        program = program_from_json(doc["program"])
        # summary and bytes are derived data: recompute them with this version's rules (cheap) so a
        # stored analysis never shows figures the current code would not produce
        doc.update({k: v for k, v in program_document(program).items() if k in ("summary", "bytes")})
        return program, doc
    program = read_program(p)
    return program, program_document(program)


def equivalence_json(report) -> dict[str, Any]:
    return asdict(report)

def load_analysis(path: str | Path) -> dict[str, Any]:
    """The ``analysis.json`` of a build folder (or the file itself)."""
    p = Path(path)
    f = p / ANALYSIS_FILE if p.is_dir() else p
    if not f.is_file():
        raise QfoldError(f"{p}: no {ANALYSIS_FILE} (not a finished qfold build)")
    try:
        return json.loads(f.read_text())
    except json.JSONDecodeError as e:
        raise QfoldError(f"{f}: not valid JSON ({e.msg} at line {e.lineno})") from e
