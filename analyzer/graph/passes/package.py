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
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import FoldError, MilError
from analyzer.graph.mil import Blobs, MilProgram, find_package, read_program
from analyzer.graph.passes.gqa_fold import PASS_NAME, PASS_VERSION, TileDecision, fold_gqa_replication

# What runs after the fold (it is run on the Program first, so its decisions can be read back).
FOLD_PIPELINE: tuple[str, ...] = ("common::dead_code_elimination",)
METADATA_KEY = "com.github.qfold.fold"  # user-defined metadata the folded package carries


@dataclass(frozen=True, slots=True)
class FunctionBytes:
    """One function's bytes per decode token by category (``analyzer.graph.accounting``), before and after."""

    function: str
    before: dict[str, int]
    after: dict[str, int]
    kv_replication_tiles_before: int
    kv_replication_tiles_after: int


@dataclass(frozen=True, slots=True)
class WeightCheck:
    """Every stored constant of the original, compared with the folded package's by name."""

    checked: int
    identical: int
    removed: tuple[str, ...]  # constants only the removed replication ops read (none in practice)
    changed: tuple[str, ...]  # names whose dtype, shape or bytes differ (a bug if ever non-empty)

    @property
    def ok(self) -> bool:
        return not self.changed


@dataclass(frozen=True, slots=True)
class FoldReport:
    source: str
    output: str
    pass_version: int
    decisions: tuple[TileDecision, ...]
    functions: tuple[FunctionBytes, ...]
    weights: WeightCheck | None  # None when nothing was folded (the output is a byte copy)
    timings_s: dict[str, float] = field(default_factory=dict)

    @property
    def tiles_found(self) -> int:
        return len(self.decisions)

    @property
    def tiles_folded(self) -> int:
        return sum(d.folded for d in self.decisions)

    @property
    def tiles_left(self) -> tuple[TileDecision, ...]:
        return tuple(d for d in self.decisions if not d.folded)

    @property
    def changed(self) -> bool:
        return self.tiles_folded > 0


# ------------------------------------------------------------------------------------------------ reading
def package_digest(path: str | Path) -> str:
    """SHA-256 over a package's files (relative path and bytes, in sorted order): the fold cache key."""
    pkg = find_package(path)
    h = hashlib.sha256()
    for f in sorted(p for p in pkg.rglob("*") if p.is_file()):
        h.update(f.relative_to(pkg).as_posix().encode() + b"\0")
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def weight_digests(path: str | Path) -> dict[str, tuple[str, str]]:
    """Every constant stored in ``weight.bin`` (const ops and the inline data of ``constexpr_*`` ops), by
    function and name: ``(dtype/shape, sha256 of the stored bytes)``."""
    from coremltools.models.utils import load_spec

    from analyzer.graph.mil import tensor_info

    pkg = find_package(path)
    spec = load_spec(str(pkg))
    blobs = Blobs(pkg / "Data" / "com.apple.CoreML" / "weights")
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
def fold_package(src: str | Path, dst: str | Path, check_weights: bool = True) -> FoldReport:
    """Fold every KV-replicating tile of every function of ``src`` and write the result to ``dst``
    (replaced if it exists). When nothing is folded, ``dst`` is a byte copy of ``src``."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline

    from analyzer.graph.accounting import account

    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal t0
        now = time.monotonic()
        timings[name] = round(now - t0, 3)
        t0 = now

    pkg = find_package(src)
    dst = Path(dst)
    if dst.resolve() == pkg.resolve():
        raise FoldError(f"{dst}: the output would overwrite the input package")
    functions = _function_names(pkg)
    before = {fn: read_program(pkg, fn) for fn in functions}
    lap("walk_before_s")
    try:
        model = ct.models.MLModel(str(pkg), skip_model_load=True)
        spec = model.get_spec()
        program = milproto_load(spec, specification_version=spec.specificationVersion,
                                file_weights_dir=model.weights_dir)
    except Exception as e:  # coremltools raises bare Exceptions (NotImplementedError for a docstring, ...)
        raise MilError(f"{pkg}: coremltools cannot read it back into a MIL program: {type(e).__name__}: {e}") from e
    if spec.description.functions:  # a multi-function package: save it as one again, same default
        program.default_function_name = spec.description.defaultFunctionName or functions[0]
        program.export_as_multifunction = True
    lap("load_s")
    graph_pass = fold_gqa_replication()
    graph_pass(program)
    program.validate()
    decisions = tuple(graph_pass.decisions)
    lap("pass_s")
    tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")  # keeps the .mlpackage suffix save() insists on
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if not any(d.folded for d in decisions):
            shutil.copytree(pkg, tmp)
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
        _replace_dir(tmp, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    after = {fn: read_program(dst, fn) for fn in functions}
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
    rows = tuple(
        FunctionBytes(fn, account(before[fn]).totals(), account(after[fn]).totals(),
                      sum(op.tile_kind == "kv_replication" for op in before[fn].ops),
                      sum(op.tile_kind == "kv_replication" for op in after[fn].ops))
        for fn in functions
    )
    return FoldReport(str(pkg), str(dst), PASS_VERSION, decisions, rows, weights, timings)


def _function_names(pkg: Path) -> tuple[str, ...]:
    from analyzer.graph.mil import load_function

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
    new.metadata.userDefined[METADATA_KEY] = f"{PASS_NAME} v{PASS_VERSION} of {pkg.name}"


def _replace_dir(tmp: Path, dst: Path) -> None:
    """Move ``tmp`` to ``dst``; an existing ``dst`` is moved aside first and removed after."""
    old = None
    if dst.exists():
        old = dst.with_name(f".old-{os.getpid()}-{dst.name}")
        os.replace(dst, old)
    os.replace(tmp, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
