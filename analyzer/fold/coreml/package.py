"""Fold a saved ``.mlpackage``: read it back into a pymil Program, run the pass, save a new package.

The route (design.md, "Second stage")::

    Model.proto + weight.bin ──milproto.load──► pymil Program ──fold_gqa_replication──► Program
        ──ct.convert(program, pass_pipeline=FOLD_PIPELINE, minimum_deployment_target=<the original's>)──► save

The pass runs on the Program itself (so its per-tile decisions can be read back); ``ct.convert`` then runs
``FOLD_PIPELINE``, dead-code elimination alone. coremltools also drops from its backend pipeline every default
pass the main pipeline leaves out, so no const is deduplicated, folded, cast or renamed; what remains are the
backend's own I/O-type and activation-fusion passes, which find nothing left to do in a package coremltools
saved. Every stored weight keeps its name, dtype and bytes (:func:`weight_digests` checks that, per constant).
Inputs, outputs, states, the spec version (deployment target), the metadata and multi-function layouts are
kept; the result is written beside the destination and renamed into place.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from analyzer.analysis.shapes import input_ranges, probe_shapes, range_bounds, read_sized
from analyzer.engines.interpret import load_interpreter
from analyzer.engines.interpret.values import np_dtype
from analyzer.errors import FoldError, MilError, QfoldError
from analyzer.fold.fold_records import PASS_NAME, PASS_VERSION, FoldReport, FunctionBytes, WeightCheck
from analyzer.fsio import check_disjoint, copy_tree, open_regular, replace_dir, tree_files
from analyzer.ir.coreml.mil_reader import (
    Blobs,
    MilProgram,
    find_package,
    load_function,
    read_spec,
    tensor_info,
    weights_dir,
)

# What runs after the fold (it is run on the Program first, so its decisions can be read back).
FOLD_PIPELINE: tuple[str, ...] = ("common::dead_code_elimination",)
METADATA_KEY = "com.github.qfold.fold"  # user-defined metadata the folded package carries


# ------------------------------------------------------------------------------------------------ reading
def package_digest(path: str | Path) -> str:
    """SHA-256 over a package's files (relative path and bytes, in sorted order): the fold cache key."""
    pkg = find_package(path)
    h = hashlib.sha256()
    for rel in tree_files(pkg, MilError, "package"):  # never follows a link out of the package
        h.update(rel.as_posix().encode() + b"\0")
        with os.fdopen(open_regular(pkg / rel, MilError), "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def weight_digests(path: str | Path) -> dict[str, tuple[str, str]]:
    """Every constant stored in ``weight.bin`` (const ops and the inline data of ``constexpr_*`` ops), by
    function and name: ``(dtype/shape, sha256 of the stored bytes)``."""
    pkg = find_package(path)
    spec = read_spec(pkg)  # not coremltools' load_spec: its package handle rewrites the input's Manifest.json
    blobs = Blobs(weights_dir(pkg))
    out: dict[str, tuple[str, str]] = {}

    def visit(fn: str, block) -> None:
        for op in block.operations:
            values = []
            if op.type == "const":
                values.append((op.outputs[0].name, op.attributes["val"], op.outputs[0].type))
            for param, arg in op.inputs.items():
                for b in arg.arguments:
                    if b.WhichOneof("binding") == "value":
                        values.append((f"{op.outputs[0].name}.{param}", b.value, b.value.type))
            for name, value, vtype in values:
                if value.WhichOneof("value") != "blobFileValue":
                    continue
                info = tensor_info(name, vtype)
                data = blobs.data(value.blobFileValue.fileName, value.blobFileValue.offset)
                out[f"{fn}/{name}"] = (f"{info.dtype}{list(info.shape)}", hashlib.sha256(data).hexdigest())
            for b in op.blocks:
                visit(fn, b)

    try:
        for fn, func in spec.mlProgram.functions.items():
            visit(fn, func.block_specializations[func.opset])
    finally:
        blobs.close()
    return out


def compare_weights(before: dict[str, tuple[str, str]], after: dict[str, tuple[str, str]]) -> WeightCheck:
    removed = tuple(sorted(set(before) - set(after)))
    changed = tuple(sorted(n for n in set(before) & set(after) if before[n] != after[n]))
    identical = len(set(before) & set(after)) - len(changed)
    return WeightCheck(len(before), identical, removed, changed)


def _io(program: MilProgram) -> tuple:
    return tuple((t.name, t.shape, t.dtype) for group in (program.inputs, program.states, program.outputs)
                 for t in group)


# ------------------------------------------------------------------------------------------------ folding
def fold_package(src: str | Path, dst: str | Path, check_weights: bool = True,
                 shapes: Mapping[str, tuple[int, ...]] | None = None) -> FoldReport:
    """Fold every KV-replicating tile of every function of ``src`` and write the result to ``dst``
    (replaced if it exists). When nothing is folded, ``dst`` is a byte copy of ``src``. The bytes before and
    after of a flexible package are at ``shapes`` (else the defaults of ``analyzer.analysis.shapes``)."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline

    from analyzer.fold.coreml.gqa_fold import fold_gqa_replication  # the pass: coremltools' pymil

    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal t0
        now = time.monotonic()
        timings[name] = round(now - t0, 3)
        t0 = now

    pkg = find_package(src)
    dst = Path(dst)
    check_disjoint(pkg, dst, FoldError)
    tree_files(pkg, MilError, "package")  # a link out of the package, a loop, a FIFO: refused before reading
    functions = _function_names(pkg)
    before = {fn: read_sized(pkg, fn, shapes) for fn in functions}
    lap("walk_before_s")
    spec = read_spec(pkg)  # not ct.models.MLModel(pkg): that rewrites the input's Manifest.json
    try:
        program = milproto_load(spec, specification_version=spec.specificationVersion,
                                file_weights_dir=str(weights_dir(pkg)))
    except Exception as e:  # coremltools raises bare Exceptions (NotImplementedError for a docstring, ...)
        raise MilError(f"{pkg}: coremltools cannot read it back into a MIL program: {type(e).__name__}: {e}") from e
    if spec.description.functions:  # a multi-function package: save it as one again, same default
        program.default_function_name = spec.description.defaultFunctionName or functions[0]
        program.export_as_multifunction = True
    lap("load_s")
    graph_pass = fold_gqa_replication()
    graph_pass.contexts = {fn: _context(pkg, before[fn]) for fn in functions}
    graph_pass(program)
    program.validate()
    decisions = tuple(graph_pass.decisions)
    lap("pass_s")
    tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")  # keeps the .mlpackage suffix save() insists on
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if not any(d.folded for d in decisions):
            copy_tree(pkg, tmp, MilError, "package")
            lap("copy_s")
        else:
            target = _deployment_target(spec.specificationVersion, pkg)
            pipeline = PassPipeline(pass_names=list(FOLD_PIPELINE), pipeline_name="qfold_fold")
            folded = ct.convert(program, convert_to="mlprogram", minimum_deployment_target=target,
                                pass_pipeline=pipeline, skip_model_load=True)
            lap("convert_s")
            _keep_description(spec, folded, pkg)
            folded.save(str(tmp))
            lap("save_s")
        replace_dir(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    after = {fn: read_sized(dst, fn, shapes) for fn in functions}
    for fn in functions:
        if _io(before[fn]) != _io(after[fn]):
            raise FoldError(f"{pkg}: folding changed the inputs, outputs or states of function {fn!r}; "
                            "the output was not kept")
    lap("walk_after_s")
    weights = None
    if check_weights and any(d.folded for d in decisions):
        weights = compare_weights(weight_digests(pkg), weight_digests(dst))
        lap("weights_s")
        if not weights.ok:
            raise FoldError(f"{pkg}: folding changed constant {weights.changed[0]!r}; the output was not kept")
    rows = tuple(FunctionBytes.of(before[fn], after[fn]) for fn in functions)
    return FoldReport("coreml", str(pkg), str(dst), PASS_NAME, PASS_VERSION, decisions, rows, weights, timings)


def _context(pkg: Path, sized: MilProgram):
    """What the pass knows of a function beyond its program: every value's size at the stated shapes (the sized
    walk), the flexible inputs' ranges, and the repeats of a tile at the range's probe shapes (one interpreter run
    per probe, made when a tile's repeats cannot be shown constant on symbols)."""
    from analyzer.fold.coreml.gqa_pattern import FoldContext

    known = {t.name: tuple(t.shape) for op in sized.ops for t in (*op.outputs, *(r.tensor for r in op.inputs))
             if not t.symbolic}
    known.update({t.name: tuple(t.shape) for t in sized.inputs if not t.symbolic})
    ranges = input_ranges(pkg, sized.function)
    if not any(r.flexible for r in ranges):
        return FoldContext(known)
    runs: dict[str, dict[str, tuple[int, ...]] | str] = {}
    probes = probe_shapes(ranges, sized.assumed_shapes)

    def probe(x: str, out: str) -> list:
        found = []
        for label, shapes in probes:
            if label not in runs:
                runs[label] = _shapes_at(pkg, sized.function, shapes)
            run = runs[label]
            if isinstance(run, str):
                found.append((shapes, label, run))
            elif x in run and out in run and len(run[x]) == len(run[out]) and all(run[x]):
                found.append((shapes, label, tuple(o // i for i, o in zip(run[x], run[out], strict=True))))
            else:
                found.append((shapes, label, "the tile is not computed there"))
        return found

    return FoldContext(known, range_bounds(ranges), probe)


def _shapes_at(pkg: Path, function: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]] | str:
    """Every value's shape from one interpreter run on zero inputs of ``shapes``, or why it cannot run."""
    try:
        interp = load_interpreter(pkg, function)
        feed = {t.name: np.zeros(shapes.get(t.name) or tuple(d or 1 for d in t.shape), dtype=np_dtype(t.dtype))
                for t in interp.inputs}
        return interp.value_shapes(feed)
    except QfoldError as e:
        return str(e)


def _function_names(pkg: Path) -> tuple[str, ...]:
    loaded = load_function(pkg)  # validates that it is a readable ML Program
    return tuple(loaded.spec.mlProgram.functions)


def _deployment_target(spec_version: int, pkg: Path):
    import coremltools as ct

    try:
        return ct.target(spec_version)
    except ValueError:
        raise FoldError(f"{pkg}: specification version {spec_version} is unknown to coremltools "
                        f"{ct.__version__}; cannot save a package for the same deployment target") from None


def _keep_description(original, folded, pkg: Path) -> None:
    """Carry the original's metadata and feature descriptions over, and say the package was folded."""
    desc, new = original.description, folded._spec.description  # the spec save() writes
    new.metadata.CopyFrom(desc.metadata)
    for group, new_group in ((desc.input, new.input), (desc.output, new.output), (desc.state, new.state)):
        texts = {f.name: f.shortDescription for f in group}
        for f in new_group:
            f.shortDescription = texts.get(f.name, f.shortDescription)
    # flexible inputs keep their ranges / enumerated shapes (a Program saved again only knows "symbolic")
    for old_desc, new_desc in ((desc, new), *((f, g) for f in desc.functions for g in new.functions
                                              if f.name == g.name)):
        kept = {f.name: f.type for f in old_desc.input}
        for f in new_desc.input:
            if f.name in kept:
                f.type.CopyFrom(kept[f.name])
    new.metadata.userDefined[METADATA_KEY] = f"{PASS_NAME} v{PASS_VERSION} of {pkg.name}"
