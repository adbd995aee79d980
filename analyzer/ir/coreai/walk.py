"""Walk any Core AI ``.aimodel`` into the same op records as a Core ML package (:class:`MilProgram`).

The asset is checked in pure Python (:func:`~analyzer.ir.coreai.asset.check_asset`), its MLIR is dumped by a
child process (:mod:`analyzer.ir.coreai.mlir_dump`), and the dump becomes records here:

* one record per op of the entry graph ``main``; a ``coreai.invoke`` is a record too, followed by the called
  graph's ops **inlined once per call** (``parent`` = the invoke; ``composite`` = the composite's declared name,
  e.g. ``scaled_dot_product_attention``, for a composite's fallback body), so what a call runs is counted per call;
* operands named as MIL names them and op kinds from :mod:`analyzer.ir.coreai.dialect`; state handles are the
  program's states, ``!coreai.token`` values (ordering only) are left out;
* layers from the debug-info call stack: the outermost module class with several instances
  (``Exaone4DecoderLayer$1``, ``$2`` …) is the decoder layer, its instances in order are layers 0, 1, …; an op
  with a call stack outside them is outside the layers; ops without one (state reads, shared constants) take
  their inputs' layer, as in the MIL walker;
* tensor names are the torch node the op came from plus the value number (``permute_22.%267``); a value the graph
  returns is named after the result (``logits``, ``new_k``);
* KV replication is decided by the one classifier both backends use (``analyzer.ir.replication`` through
  ``opfacts.classify_copies``, which reads op kinds: a Core AI ``broadcast_in_dims`` / ``tile`` is a copy).
"""

from __future__ import annotations

import re
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from analyzer.errors import AimodelError
from analyzer.fsio import read_json
from analyzer.ir.coreai.asset import METADATA_FILE, check_asset
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION, TERMINATORS, kind_of, operand_names
from analyzer.ir.coreai.native_child import asset_bytes, child_limit, run_module
from analyzer.ir.mil_records import IndexProfile, InputRef, MilProgram, OpRecord, TensorInfo, tensor_nbytes
from analyzer.ir.opfacts import classify_copies, layer_from_name

ENTRY = "main"
OPSET = "coreai"  # MilProgram.opset of a walked asset (MilProgram.backend reads it)
MAX_DUMP_BYTES = 1 << 30
_MAX_INLINE_DEPTH = 8
_FRAME = re.compile(r"^(.+)\$(\d+)$")
_FFN_CLASSES = ("mlp", "feedforward", "ffn", "moe")


def read_asset(path: str | Path) -> MilProgram:
    """Check and walk an ``.aimodel`` (its MLIR read in a child process) into op records."""
    asset = check_asset(path)
    with tempfile.TemporaryDirectory(prefix="qfold-aimodel-") as d:
        out = Path(d) / "dump.json"
        proc = run_module("analyzer.ir.coreai.mlir_dump", [str(asset), str(out)], "reading its MLIR", str(asset),
                          child_limit(asset_bytes(asset)), AimodelError, check=False)
        if proc.returncode != 0 or not out.is_file():
            lines = [ln.strip() for ln in proc.stderr.strip().splitlines() if ln.strip()]
            last = lines[-1][:300] if lines else ""
            if proc.returncode < 0:  # the native reader crashed: its process, not this one
                raise AimodelError(f"{asset}: the MLIR reader died (signal {-proc.returncode}"
                                   + (f": {last}" if last else "") + "); the program is not readable MLIR")
            why = last or f"exit code {proc.returncode}"
            raise AimodelError(why if why.startswith(str(asset)) else f"{asset}: cannot read its MLIR ({why})")
        doc = read_json(out, MAX_DUMP_BYTES, AimodelError)
    meta = read_json(asset / METADATA_FILE, error=AimodelError)
    return program_from_dump(doc, str(asset), f"{OPSET}-{meta.get('assetVersion', '?')}")


class _Walker:
    """Builds the records of one program from a dump (one instance per walk)."""

    def __init__(self, graphs: dict[str, dict[str, Any]]):
        self.graphs = graphs
        rows = [row for g in graphs.values() for row in g["ops"]]
        self.modules = _Modules([row["stack"] for row in rows])
        self.first_reader: dict[int, list[str]] = {}  # value id → the call stack of the first op reading it
        for row in rows:
            for v in row["operands"]:
                if row["stack"]:
                    self.first_reader.setdefault(v, row["stack"])
        for row in reversed(rows):  # a compressed weight's constants: known by what reads the dense weight
            if not row["stack"] and (row["op"] in PER_CALL_DECOMPRESSION or row["op"] == "coreai.cast"):
                reader = next((self.first_reader[r[0]] for r in row["results"] if r[0] in self.first_reader), None)
                for v in row["operands"] if reader else ():
                    self.first_reader.setdefault(v, reader)
        self.ops: list[OpRecord] = []
        self.stacks: list[list[str]] = []  # the call stack of each record (a body op: its invoke's)

    def tensor(self, name: str, t: list[Any]) -> TensorInfo:
        shape, dtype = tuple(t[0]), t[1]
        return TensorInfo(name, shape, dtype, tensor_nbytes(shape, dtype))

    def graph(self, g: dict[str, Any], env: dict[int, InputRef], parent: int | None, composite: str | None,
              call_stack: list[str] | None, out_names: dict[int, str], depth: int) -> list[int]:
        """Emit the records of graph ``g`` with its arguments bound in ``env``; returns the value ids it outputs."""
        returned: list[int] = []
        for row in g["ops"]:
            if row["op"] in TERMINATORS:
                returned = row["operands"]
                continue
            data = [v for v in row["operands"] if v in env]  # tokens are never bound: ordering, not data
            names = operand_names(row["op"], len(data))
            declared = (self.graphs.get(row.get("callee", ""), {}).get("composite_inputs")
                        if row["op"] == "coreai.invoke" else None)
            if declared and len(declared) == len(data):  # a composite call's operands: "query", "key", "value"
                names = tuple(declared)
            index = len(self.ops)
            refs = tuple(replace_param(env[v], n) for v, n in zip(data, names, strict=True))
            if "index_profile" in row:  # a gather: what its index selects, on its indices operand
                refs = tuple(replace(r, profile=_profile(row["index_profile"])) if r.param == "indices" else r
                             for r in refs)
            results = [(vid, t) for vid, t in row["results"] if t[2] in ("tensor", "other")]
            call = "" if parent is None else f"@{parent}"  # a body inlined per call: names stay unique
            is_const = kind_of(row["op"]) == "const"
            what = row["source"] or row["op"][7:]
            if is_const and results:  # a weight is known by the module that reads it (no names in the asset)
                what = self.modules.label(row["stack"] or self.first_reader.get(results[0][0], [])) or what
            outs = tuple(self.tensor(out_names.get(vid) or f"{what}.%{vid}{call}", t) for vid, t in results)
            const_bytes = outs[0].nbytes or 0 if is_const and outs else 0
            self.ops.append(OpRecord(index, row["op"], outs[0].name if outs else f"{row['op'][7:]}.{index}", None,
                                     "", refs, outs, const_bytes, const_zero=bool(row.get("zero")), parent=parent,
                                     composite=composite))
            self.stacks.append(call_stack if call_stack is not None else row["stack"])
            for (vid, _), t in zip(results, outs, strict=True):
                value = tuple(row["value"]) if is_const and row.get("value") is not None else None
                env[vid] = InputRef("", t, index, is_const, const_bytes if is_const else 0, value)
            if row["op"] == "coreai.invoke":
                self.invoke(row, index, env, out_names, depth)
        return returned

    def invoke(self, row: dict[str, Any], index: int, env: dict[int, InputRef], out_names: dict[int, str],
               depth: int) -> None:
        callee = self.graphs.get(row.get("callee", ""))
        if callee is None:
            raise AimodelError(f"an invoke calls graph {row.get('callee')!r}, which the asset does not define")
        if depth >= _MAX_INLINE_DEPTH:
            raise AimodelError(f"graph {callee['name']!r}: calls nested deeper than {_MAX_INLINE_DEPTH}")
        inner = {a[0]: env[v] for a, v in zip(callee["args"], [v for v in row["operands"] if v in env],
                                                strict=False)}
        returned = self.graph(callee, inner, index, callee["composite"] or f"graph {callee['name']}",
                              row["stack"], {}, depth + 1)
        for (vid, _), inner_vid in zip(row["results"], returned, strict=False):
            if inner_vid in inner:
                env[vid] = inner[inner_vid]  # consumers read what the body computed, not the invoke
        return None


def constant_labels(doc: dict[str, Any]) -> dict[tuple[str, int], str]:
    """(graph name, row index) → the label a walk names each ``coreai.constant`` of a dump by (the module that
    reads it: ``layers.0.mlp.TransposedLinear$3``, ``embed_tokens.Embedding$1``), for a caller that picks weights by
    the same names before the program is saved (``analyzer.convert.compress.coreai_apply``)."""
    walker = _Walker({g["name"]: g for g in doc.get("graphs", [])})
    return {(g["name"], i): walker.modules.label(row["stack"] or walker.first_reader.get(row["results"][0][0], []))
            for g in doc.get("graphs", []) for i, row in enumerate(g["ops"])
            if row["op"] == "coreai.constant" and row["results"]}


def _profile(doc: dict[str, Any]) -> IndexProfile:
    values = doc.get("values")
    return IndexProfile(doc.get("axis"), None if values is None else tuple(values), doc.get("why") or "")


def replace_param(ref: InputRef, param: str) -> InputRef:
    return replace(ref, param=param)


def program_from_dump(doc: dict[str, Any], path: str, opset: str = OPSET) -> MilProgram:
    """The records of a dumped asset (:mod:`analyzer.ir.coreai.mlir_dump`)."""
    graphs = {g["name"]: g for g in doc.get("graphs", [])}
    main = graphs.get(ENTRY)
    if main is None:
        raise AimodelError(f"{path}: no graph {ENTRY!r} (has {', '.join(graphs) or 'none'})")
    env: dict[int, InputRef] = {}
    inputs, states = [], []
    for vid, name, t in main["args"]:
        if t[2] == "token":
            continue
        info = TensorInfo(name or f"arg{vid}", tuple(t[0]), t[1], tensor_nbytes(tuple(t[0]), t[1]))
        (states if t[2] == "handle" else inputs).append(info)
        env[vid] = InputRef("", info, None, False, 0)
    returned = next((r["operands"] for r in main["ops"] if r["op"] in TERMINATORS), [])
    out_names = {vid: name for vid, name in zip(returned, main["results"], strict=False) if name}
    walker = _Walker(graphs)
    walker.graph(main, env, None, None, None, out_names, 0)
    outputs = tuple(env[v].tensor for v in returned if v in env and env[v].producer is not None)
    ops = classify_copies(_layers(walker.ops, walker.stacks, walker.modules))  # the one classifier (replication.py)
    return MilProgram(path, ENTRY, opset, 0, tuple(inputs), tuple(states), outputs, tuple(ops))


class _Modules:
    """The torch modules a program's debug info names (``Exaone4DecoderLayer$2``: the second instance of a class):
    which class is the decoder layer, each op's layer, and a weight's label in the names the compression and FLOP
    rules read (``layers.0.attn.Linear$1``, ``embed_tokens.Embedding$1``, ``lm_head.Linear$15``)."""

    def __init__(self, stacks: list[list[str]]):
        # the decoder layer: of the classes with several instances that hold other modules (a frame with frames
        # inside it, so not a leaf Linear), the outermost
        instances: dict[str, set[int]] = defaultdict(set)
        depth: dict[str, int] = {}
        for stack in stacks:
            for d, frame in enumerate(stack[:-1]):
                m = _FRAME.match(frame)
                if m:
                    instances[m.group(1)].add(int(m.group(2)))
                    depth[m.group(1)] = min(depth.get(m.group(1), d), d)
        several = [c for c, n in instances.items() if len(n) > 1]
        self.layer_class = min(several, key=lambda c: depth[c]) if several else None
        self.rank = {n: i for i, n in enumerate(sorted(instances.get(self.layer_class or "", ())))}

    def layer(self, stack: list[str]) -> tuple[int | None, bool]:
        """(layer, whether the stack says): an op with a call stack is in the layer it names, or outside all."""
        frames = [m for f in stack if (m := _FRAME.match(f))]
        if not frames or self.layer_class is None:
            return None, False
        hit = next((m for m in frames if m.group(1) == self.layer_class), None)
        return (self.rank.get(int(hit.group(2))) if hit else None), True

    def label(self, stack: list[str]) -> str:
        frames = [m for f in stack if (m := _FRAME.match(f))]
        if not frames:
            return ""
        leaf = frames[-1].group(0)
        at = next((i for i, m in enumerate(frames) if m.group(1) == self.layer_class), None)
        if at is not None:
            inner = frames[at + 1].group(1).lower() if at + 1 < len(frames) else ""
            part = ("attn" if "attention" in inner else "mlp" if any(k in inner for k in _FFN_CLASSES)
                    else inner or "block")
            return f"layers.{self.rank.get(int(frames[at].group(2)))}.{part}.{leaf}"
        if any("embedding" in m.group(1).lower() for m in frames):
            return f"embed_tokens.{leaf}"
        if frames[-1].group(1).endswith("Linear") and len(frames) >= 2 and frames[-2].group(1).endswith("ForCausalLM"):
            return f"lm_head.{leaf}"
        return leaf


def _layers(ops: list[OpRecord], stacks: list[list[str]], modules: _Modules) -> list[OpRecord]:
    out: list[OpRecord] = []
    for op, stack in zip(ops, stacks, strict=True):
        layer, said = modules.layer(stack)
        how = "debuginfo" if said else ""
        if not said:  # no call stack: the latest layer among what it reads
            seen = [out[r.producer].layer if r.producer is not None else layer_from_name(r.tensor.name)
                    for r in op.inputs if not r.is_const]
            seen = [x for x in seen if x is not None]
            layer, how = (max(seen), "dataflow") if seen else (None, "")
        out.append(replace(op, layer=layer, layer_from=how if layer is not None else ""))
    return out
