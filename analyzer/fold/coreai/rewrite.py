"""The Core AI fold as an MLIR rewrite, run in a child process (``python -m analyzer.fold.coreai.rewrite IN
OUT REPORT.json``): the MLIR bindings are native code, so the parent (``analyzer.fold.coreai.asset_fold``) never loads
a program itself.

Pattern (what coreai-torch emits for transformers' ``repeat_kv`` and inside the fallback body of an SDPA
``enable_gqa`` composite; probe/coreai/RESULTS.md, Q3/Q8)::

    %k  = cast(read_handle(%k_cache))                    # [1, Hkv, S, D]   the source, as stored
    %e  = reshape(%k)                                    # [1, Hkv, 1, S, D]
    %b  = broadcast_in_dims(%e, [G], [2])  (or tile)     # [1, Hkv, G, S, D]  the copy
    %kr = reshape(%b)                                    # [1, Hq, S, D]
    %s  = broadcasting_batch_matmul(%q, transpose(%kr))  # Q·Kᵀ  [1, Hq, N, S];  P·V reads %vr untransposed

Whether a copy is KV replication at all is asked of the one classifier (``analyzer.ir.replication.classify_copy``)
on the facts :func:`copy_facts` reads off the module (sources back through single-use reshape / transpose, every
read and the steps to it), as ``inspect`` asks it on the walked records and the Core ML pass on a pymil Program,
so inspect and fold cannot disagree on an asset. The rewrite adds what it needs: every read is the right operand
of a ``broadcasting_batch_matmul`` (Kᵀ read through a transpose included), one head mapping, ``h // G`` or
``h % Hkv``, batch 1. Rewrite::

    %qf = reshape(%q)                    # [1, Hkv, G·N, D]   (h % Hkv: reshape → transpose → reshape)
    %sf = broadcasting_batch_matmul(%qf, transpose(%k))   # [1, Hkv, G·N, S], K read as stored
    %s  = reshape(%sf)                   # [1, Hq, N, S]      (the inverse regrouping for h % Hkv)

Then the copy and its now-unused chain are erased, the module verified, Core AI's own pre-compilation clean-up
run (dead constants go) and the asset saved. The report JSON lists one decision per replication op (composite
bodies included, with their call count), and a digest of every constant before and after, so the parent can
prove no weight changed.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np

from analyzer.fold.fold_records import CopyDecision, Refusal
from analyzer.ir import replication as rp
from analyzer.ir.coreai.asset import PROGRAM_FILE, check_asset
from analyzer.ir.coreai.index_profile import GATHERS, ConstantReader, gather_profile
from analyzer.ir.coreai.op_ids import CALLEE, OP_ID
from analyzer.ir.opfacts import gather_steps

REPLICATING = ("coreai.broadcast_in_dims", "coreai.tile")  # a concat of one value, a repeating gather (_own_steps)
CHAIN = ("coreai.reshape", "coreai.transpose")  # ops that only move elements between the copy and the matmul
MATMUL = "coreai.decomposable.broadcasting_batch_matmul"
_RESOURCE = re.compile(r"dense_resource<([\w.$-]+)>")
_INPUT_NAMES = re.compile(r"input_names = \[([^\]]*)\]")
SDPA = "scaled_dot_product_attention"  # coreai-torch's SDPA composite (composite_decl)


# ------------------------------------------------------------------------------------------------ reading
def _shape(value) -> tuple[int, ...] | None:
    from coreai._compiler.ir import RankedTensorType

    try:
        t = RankedTensorType(value.type)
    except ValueError:
        return None
    shape = tuple(int(d) for d in t.shape)
    return None if any(d < 0 for d in shape) else shape


def _const(value) -> np.ndarray | None:
    """The value of a small integer constant operand (a shape or a permutation), or None."""
    from coreai._compiler.ir import DenseIntElementsAttr

    owner = value.owner
    if getattr(owner, "name", "") != "coreai.constant":
        return None
    try:
        return np.array([int(x) for x in DenseIntElementsAttr(owner.attributes["value"])])
    except (ValueError, TypeError):
        return None


def _sdpa_inputs(invoke) -> list[str] | None:
    """The declared input names of the SDPA composite an invoke calls (``["query", "key", "value"]``), else None."""
    callee = CALLEE.search(str(invoke.attributes["callee"])) if "callee" in invoke.attributes else None
    top = invoke
    while top is not None and top.name != "builtin.module":
        top = top.parent
    for g in top.regions[0].blocks[0].operations if callee and top is not None else ():
        attrs = g.operation.attributes
        if "sym_name" in attrs and attrs["sym_name"].value == callee.group(1) and "composite_decl" in attrs:
            decl = str(attrs["composite_decl"])
            names = _INPUT_NAMES.search(decl)
            return re.findall(r'"([^"]*)"', names.group(1)) if names and f'<"{SDPA}"' in decl else None
    return None


def _op_label(op) -> str:
    m = OP_ID.search(str(op.location))
    return f"{op.name.removeprefix('coreai.')}#{m.group(1) if m else '?'}"


def _walk_graphs(module):
    """(graph name, is composite, op) for every op of every ``coreai.graph``, nested regions included."""
    def visit(op, graph, composite):
        op = op.operation if hasattr(op, "operation") else op
        yield graph, composite, op
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    yield from visit(inner, graph, composite)

    for g in module.body.operations:
        g = g.operation if hasattr(g, "operation") else g
        name = g.attributes["sym_name"].value if "sym_name" in g.attributes else "?"
        composite = "composite_decl" in g.attributes
        for region in g.regions:
            for block in region.blocks:
                for op in block.operations:
                    yield from visit(op, name, composite)


def _own_steps(op, reader: ConstantReader) -> tuple[rp.ViewStep, ...] | Refusal | None:
    """The copy's own steps when ``op`` may copy (a tile, a broadcast, a ``concat(axis, x, x, …)`` of one value:
    ``torch.cat([k] * G)``, a gather whose constant index repeats slices: ``index_select``, ``k[:, idx]``), a
    Refusal when it is a gather that may copy and whose index cannot be read (listed as not classified, as the
    walk's ``opfacts.unread_copy``), else None."""
    if op.name in GATHERS:
        x, out, index = _shape(op.operands[0]), _shape(op.results[0]), _shape(op.operands[1])
        if x is None or out is None or index is None or getattr(op.operands[0].owner, "name", "") == "coreai.constant":
            return None
        prof = gather_profile(op, reader)
        if prof["values"] is None:
            return Refusal(f"not classified: {prof['why']}") if np.prod(out) > np.prod(x) else None
        return gather_steps(op.name, x, index, out, prof["axis"], tuple(prof["values"]))
    values = list(op.operands)[1:] if op.name == "coreai.concat" else []
    if op.name in REPLICATING or (len(values) > 1 and all(v == values[0] for v in values)):
        step = _view_step(op)
        return (step,) if step is not None else ()  # () : its shapes are not static (copy_facts says so)
    return None


def _data(op):
    """What a copy copies: a concat's value, else the first operand."""
    return op.operands[1] if op.name == "coreai.concat" else op.operands[0]


def _copies_kv(op, own: tuple[rp.ViewStep, ...], cache: rp.IndexCache) -> bool:
    """Whether the classifier calls the copy KV replication (whatever the rewrite then makes of it)."""
    found = copy_facts(op, own)
    return not isinstance(found, Refusal) and rp.classify_copy(found[0], cache).is_kv


def _view_step(op) -> rp.ViewStep | None:
    """A chain op (or the copy) as the classifier's step, read off its static result shape and constant operands."""
    out = _shape(op.results[0])
    if out is None:
        return None
    if op.name == "coreai.transpose":
        perm = _const(op.operands[1])
        return None if perm is None else rp.ViewStep("transpose", out, perm=tuple(int(p) for p in perm))
    if op.name == "coreai.broadcast_in_dims":
        return rp.ViewStep("broadcast", out)
    if op.name in ("coreai.tile", "coreai.concat"):  # a concat of one value n times is a tile by n on its axis
        src = _shape(_data(op))
        if src is None or len(src) != len(out):
            return None
        return rp.ViewStep("tile", out, reps=tuple(o // i for o, i in zip(out, src, strict=True)))
    return rp.ViewStep("reshape", out)


# ------------------------------------------------------------------------------------------------ matching
def _uses(rep) -> list[tuple[list, object, int]] | str:
    """(chain ops after the copy, its reader, which operand) for every read through reshape / transpose."""
    out, stack = [], [(rep.results[0], [])]
    while stack:
        value, path = stack.pop()
        for use in value.uses:
            user = use.owner
            if user.name in CHAIN:
                stack.append((user.results[0], [*path, user]))
            else:
                out.append((path, user, use.operand_number))
    return out or "nothing reads its copy"


def _sources(rep) -> list[tuple[object, list]]:
    """(value, ops from it to the copy): the copy's input, then back through single-use reshape / transpose ops."""
    out, value, path = [], _data(rep), [rep]
    while True:
        out.append((value, path))
        owner = value.owner
        if getattr(owner, "name", "") not in CHAIN or len(list(value.uses)) != 1:
            return out
        value, path = owner.operands[0], [owner, *path]


def copy_facts(rep, own: tuple[rp.ViewStep, ...]) -> tuple[rp.CopyFacts, list, list] | Refusal:
    """A Core AI copy's backend-neutral facts (as the walker's and the Core ML pass's), with the reads and sources
    they came from. A ``broadcasting_batch_matmul``'s right operand is K or V; its left one, and any other op, not."""
    uses = _uses(rep)
    if isinstance(uses, str):
        return Refusal(uses)
    if not own:
        return Refusal("has no static shapes")
    reads = []
    for path, user, operand in uses:
        steps = [_view_step(op) for op in path]
        if any(st is None for st in steps):
            return Refusal("its chain's shapes or permutations cannot be read")
        param = "y" if operand == 1 else "x"
        if user.name == MATMUL:
            kind = rp.MATMUL_RHS if operand == 1 else rp.MATMUL_LHS
        elif user.name == "coreai.invoke" and (declared := _sdpa_inputs(user)) and operand < len(declared):
            param = declared[operand]  # a call of coreai-torch's SDPA composite: the walk reads it the same way
            kind = rp.SDPA_KV if param in ("key", "value") else rp.SDPA_OTHER
        else:
            kind = rp.OTHER
        reads.append(rp.CopyRead(user.name, _op_label(user), kind, tuple(steps), param))
    candidates = []
    for depth, (value, back) in enumerate(_sources(rep)):
        shape, steps = _shape(value), [*(_view_step(op) for op in back[:-1]), *own]  # back ends with the copy
        if shape is None or any(st is None for st in steps):
            break
        candidates.append(rp.SourceCandidate(shape, tuple(steps), depth))
    in_shape, out_shape = _shape(_data(rep)), _shape(rep.results[0])
    if not candidates or in_shape is None or out_shape is None:
        return Refusal("has no static shapes")
    return rp.CopyFacts(_op_label(rep), in_shape, out_shape, tuple(candidates), tuple(reads)), uses, _sources(rep)


def _plan(rep, own: tuple[rp.ViewStep, ...], cache: rp.IndexCache | None = None):
    """(source, [1, Hkv, S, D], uses [(path, matmul, (Hkv, kv_map), transposed, shape)], chain) or a Refusal: the
    classifier decides; the rewrite adds what it needs (every read a matmul's right operand, one mapping, batch 1)."""
    if len(_shape(rep.results[0]) or ()) < 3:
        return Refusal("has no static head axis")
    found = copy_facts(rep, own)
    if isinstance(found, Refusal):
        return found
    facts, uses, sources = found
    verdict = rp.classify_copy(facts, cache)
    if not verdict.is_kv:
        return Refusal(verdict.reason)
    for (_, user, _), read in zip(uses, facts.reads, strict=True):
        if read.kind == rp.SDPA_KV:
            return Refusal(f"is the {read.operand} of SDPA composite call {_op_label(user)} (coreai-torch's "
                           "scaled_dot_product_attention without enable_gqa): only copies that batch matmuls read "
                           "are folded, not a composite's inputs")
        if read.kind != rp.MATMUL_RHS:
            return Refusal(f"is the left operand of matmul {_op_label(user)} (only K or V on the right is folded)")
    if len({m.kv_map for m in verdict.reads}) != 1:
        return Refusal("its uses read different head mappings")
    (source, back), candidate = sources[verdict.source_depth], facts.sources[verdict.source_depth]
    resolved = [(path, user, (m.kv_heads, m.kv_map), m.swapped, (candidate.steps + read.steps)[-1].out_shape)
                for (path, user, _), read, m in zip(uses, facts.reads, verdict.reads, strict=True)]
    *prefix, hkv, s, d = verdict.source_view
    if int(np.prod(prefix, dtype=np.int64)) != 1:
        return Refusal(f"reads a batch of {int(np.prod(prefix))} (only batch 1 is folded)")
    chain = " → ".join(op.name.removeprefix("coreai.") for op in back + resolved[0][0])
    return source, (1, hkv, s, d), resolved, chain


def _mapping_kind(kv_map: tuple[int, ...], hkv: int) -> str:
    hq, g = len(kv_map), len(kv_map) // hkv
    return "h // G" if kv_map == tuple(h // g for h in range(hq)) else "h % Hkv" if kv_map == tuple(
        h % hkv for h in range(hq)) else "permutation"


# ------------------------------------------------------------------------------------------------ rewriting
def _regroup(ops, value, shape: tuple[int, ...], hkv: int, g: int, kind: str, to_folded: bool):
    """``[1, Hq, R, X] ↔ [1, Hkv, G·R, X]``: a reshape for h // G; for h % Hkv the heads of a ``[G, Hkv]`` grid
    are swapped to ``[Hkv, G]`` (or back) by a transpose, each head's rows kept whole."""
    *_, r, x = shape
    if to_folded:
        if kind == "h % Hkv":
            value = ops.reshape(value, np.array([1, g, hkv, r * x], dtype=np.int32))
            value = ops.transpose(value, np.array([0, 2, 1, 3], dtype=np.uint32))
        return ops.reshape(value, np.array([1, hkv, g * r, x], dtype=np.int32))
    if kind == "h % Hkv":
        value = ops.reshape(value, np.array([1, hkv, g, r * x], dtype=np.int32))
        value = ops.transpose(value, np.array([0, 2, 1, 3], dtype=np.uint32))
    return ops.reshape(value, np.array(list(shape), dtype=np.int32))


def _fold_one(ops, rep, plan) -> str:
    """Rewrite every matmul reading ``rep``'s copy; returns "" or why it cannot (nothing changed then)."""
    from coreai._compiler.ir import InsertionPoint

    source, (_, hkv, _, _), uses, _ = plan
    kv_map = uses[0][2][1]
    kind = _mapping_kind(kv_map, hkv)
    if kind == "permutation":
        return "its head mapping is neither h // G nor h % Hkv"
    g = len(kv_map) // hkv
    for _, mm, _, _, _ in uses:
        lhs = _shape(mm.operands[0])
        if lhs is None or len(lhs) < 3 or lhs[-3] != len(kv_map) or int(np.prod(lhs[:-3], dtype=np.int64)) != 1:
            return f"matmul {_op_label(mm)}: its query side {list(lhs or ())} is not [1, Hq, N, X]"
    dead = _unique([op for path, *_ in uses for op in path[::-1]] + [rep] + _sources(rep)[-1][1][:-1][::-1])
    for _, mm, _, transposed, _ in uses:
        lhs, out = _shape(mm.operands[0]), _shape(mm.results[0])
        with InsertionPoint(mm):
            src = ops.reshape(source, np.array([1, hkv, *_shape(source)[-2:]], dtype=np.int32)) \
                if len(_shape(source)) != 4 else source
            if transposed:
                src = ops.transpose(src, np.array([0, 1, 3, 2], dtype=np.uint32))
            q = _regroup(ops, mm.operands[0], (1, lhs[-3], lhs[-2], lhs[-1]), hkv, g, kind, True)
            prod = ops.broadcasting_batch_matmul(q, src)
            back = _regroup(ops, prod, (1, out[-3], out[-2], out[-1]), hkv, g, kind, False)
            if tuple(out) != (1, out[-3], out[-2], out[-1]):
                back = ops.reshape(back, np.array(list(out), dtype=np.int32))
        mm.results[0].replace_all_uses_with(back)
        mm.erase()
    for op in dead:  # users first, so each one's results are unread by the time it is reached
        if all(not list(r.uses) for r in op.results):
            op.erase()
    return ""


def _unique(ops_) -> list:
    """Each op once (a chain op two uses share appears twice), compared while every handle is still valid."""
    out: list = []
    for op in ops_:
        if not any(op == o for o in out):
            out.append(op)
    return out


# ------------------------------------------------------------------------------------------------ weights
class _ResourceHasher:
    """A file-like sink for the module's text form: SHA-256 of each ``dialect_resources`` blob, streamed (a
    full-size program prints gigabytes of hex; nothing is held)."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}
        self._in_resources, self._name, self._hash, self._tail = False, None, None, ""

    def write(self, chunk) -> None:
        text = self._tail + (chunk.decode() if isinstance(chunk, bytes) else chunk)
        self._tail = ""
        if not self._in_resources:
            i = text.find("dialect_resources")
            if i < 0:
                self._tail = text[-32:]
                return
            self._in_resources, text = True, text[i:]
        while text:
            if self._hash is None:
                m = re.search(r'([\w.$-]+): "0x', text)
                if m is None:
                    self._tail = text[-200:]
                    return
                self._name, self._hash, text = m.group(1), hashlib.sha256(), text[m.end():]
            j = text.find('"')
            if j < 0:
                self._hash.update(text.encode())
                return
            self._hash.update(text[:j].encode())
            self.digests[self._name] = self._hash.hexdigest()
            self._name, self._hash, text = None, None, text[j + 1:]


def constant_digests(module) -> Counter:
    """A multiset of (graph, type, content digest) over every ``coreai.constant``: blobs by their bytes, inline
    values by their text."""
    sink = _ResourceHasher()
    module.operation.print(file=sink, binary=False)
    out: Counter = Counter()
    for graph, _, op in _walk_graphs(module):
        if op.name != "coreai.constant":
            continue
        attr = str(op.attributes["value"])
        m = _RESOURCE.search(attr)
        content = sink.digests.get(m.group(1), m.group(1)) if m else hashlib.sha256(attr.encode()).hexdigest()
        out[f"{graph}|{op.results[0].type}|{content}"] += 1
    return out


# ------------------------------------------------------------------------------------------------ the child
def rewrite_asset(src: Path, dst: Path) -> dict:
    """Fold ``src`` into ``dst`` (a new asset); returns the report (decisions, constant digests, op histograms)."""
    import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects: the other order is a circular import)
    from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import run_pre_compilation_rewrite
    from coreai._compiler.dialects import coreai as ops
    from coreai._compiler.ir import Location
    from coreai.authoring import AIModelAsset

    program = AIModelAsset.load(src).program
    module = program._module._mlir_module
    before = constant_digests(module)
    calls = Counter(m.group(1) for _, _, op in _walk_graphs(module) if op.name == "coreai.invoke"
                    for m in [CALLEE.search(str(op.attributes["callee"]) if "callee" in op.attributes else "")] if m)
    with ConstantReader(src / PROGRAM_FILE) as reader:  # a gather's index read in place, before anything changes
        reps = [(g, c, op, own) for g, c, op in _walk_graphs(module)
                if (own := _own_steps(op, reader)) is not None]
    decisions, cache = [], rp.IndexCache()
    with module.context, Location.unknown():
        for graph, composite, rep, own in reps:
            common = dict(function=graph, name=_op_label(rep), input_shape=_shape(_data(rep)) or (),
                          output_shape=_shape(rep.results[0]) or (), op_type=rep.name)
            where = f" (inside composite @{graph}, {calls.get(graph, 0)} calls)" if composite else ""
            plan = own if isinstance(own, Refusal) else _plan(rep, own, cache)
            if isinstance(plan, Refusal) and not isinstance(own, Refusal) and rep.name not in REPLICATING and (
                    not _copies_kv(rep, own, cache)):
                continue  # a concat or gather copying no K/V heads (a RoPE table's cat) is an ordinary op (opfacts)
            if isinstance(plan, Refusal):
                decisions.append(CopyDecision(**common, folded=False, reason=f"{rep.name} {plan.reason}{where}",
                                              replication=not isinstance(own, Refusal) and _copies_kv(rep, own, cache)))
                continue
            kv_map, hkv = plan[2][0][2][1], plan[1][1]
            reason = _fold_one(ops, rep, plan)
            decisions.append(CopyDecision(**common, folded=not reason, reason=reason + where if reason else "",
                                          mapping=_mapping_kind(kv_map, hkv), chain=plan[3] + where,
                                          kv_heads=hkv, group=len(kv_map) // hkv, replication=True))
        module.operation.verify()
        if any(d.folded for d in decisions):
            run_pre_compilation_rewrite(module=module)
    after = constant_digests(module)
    program.save_asset(dst)
    return {"decisions": [asdict(d) for d in decisions], "constants_before": dict(before),
            "constants_after": dict(after), "composite_calls": dict(calls)}


if __name__ == "__main__":
    report = rewrite_asset(check_asset(sys.argv[1]), Path(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(report))
