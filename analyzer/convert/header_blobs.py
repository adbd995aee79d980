"""The ``analysis`` build mode: convert and analyse a decode step whose weights have a shape and a dtype but no values.

What qfold analyses (op counts, tiles, bytes by category, layer and op, compressed weight bytes) depends on
shapes, dtypes and which consts exist, never on weight values; only a runnable package and a numerical check
need them (design.md, "Second stage"). A value-free build:

1. builds the torch model with every parameter a zero placeholder (``model.valuefree.build_value_free_model``) and
   traces it: a forward over zero pages costs no memory;
2. turns every parameter into a zero-stride fp16 view of one constant per tensor
   (``model.valuefree.assign_value_free_weights_``), which the trace shares, and converts with
   ``convert_to="milinternal"``: the torch frontend and coremltools' passes carry the views as views (measured:
   a 330M-parameter toy converts in 3.3 s / 0.61 GB instead of 24 s / 6.1 GB);
3. runs the ``backend_mlprogram`` pipeline that ``convert_to="mlprogram"`` would run (:func:`to_program`);
4. compresses, if asked, with coremltools' own passes whose only change is where the LUT, indices and scales
   come from (:class:`ValueFreePalettizer`, :class:`ValueFreeLinearQuantizer`);
5. exports the program to protobuf with coremltools' own exporter, except that a weight blob is written as its
   MIL blob storage header only (:class:`HeaderOnlyBlobWriter`), and walks that skeleton package with the same
   ``analyzer.ir.coreml.mil_reader.read_program`` as any package (:func:`walk_program`). The skeleton is then deleted:
   an analysis-mode build keeps no package.

Peak memory then follows the graph (ops, activation shapes), not the parameter count. Everything here is
checked against materialised builds op for op (tests/test_fast_identity.py).
"""

from __future__ import annotations

import math
import shutil
import struct
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.convert.compress.apply import _const_weights, check_all_compressed, optimization_configs, plan_weights
from analyzer.convert.quick_passes import quick_passes
from analyzer.convert.step import convert_kwargs, main_pipeline, one_value_equal, reset_op_names, value_free_pipeline
from analyzer.ir.coreml.mil_reader import MilProgram, read_program
from analyzer.ir.coreml.milproto import ZERO_CHECK_MAX_BYTES

# MIL blob storage v2 (coremltools' libmilstoragepython ``_BlobStorageWriter``): a 64-byte file header
# (blob count, version 2), then per blob a 64-byte metadata record (sentinel, dtype code, size in bytes, data
# offset, padding bits) followed by the data, each 64-byte aligned. The dtype codes and sizes below were read
# back from coremltools 9.0's writer, one blob per dtype; tests/test_fast_valuefree.py compares our headers
# with its output byte for byte.
BLOB_STORAGE_VERSION = 2
BLOB_ALIGNMENT = 64
BLOB_SENTINEL = 0xDEADBEEF
BLOB_DTYPES: dict[str, tuple[int, int]] = {  # dtype name → (storage dtype code, bits per element)
    "fp16": (1, 16), "fp32": (2, 32), "uint8": (3, 8), "int8": (4, 8), "int16": (6, 16), "uint16": (7, 16),
    "int4": (8, 4), "uint1": (9, 1), "uint2": (10, 2), "uint4": (11, 4), "uint3": (12, 3), "uint6": (13, 6),
    "int32": (14, 32), "uint32": (15, 32),
}
HEADER_ONLY_FILE = "weight-shapes.bin"  # beside coremltools' own weight.bin in the skeleton package


class ValueFreeError(RuntimeError):
    """A value-free conversion step met something it cannot reproduce without weight values."""

# ------------------------------------------------------------------------------------------------- blobs
class HeaderOnlyBlobWriter:
    """Writes MIL blob storage v2 with every blob's metadata record in place and its data region left as a
    hole (the file is sparse). ``read_program`` reads a blob's size from its metadata and reads data only for
    small vectors (its zero-bias check), which the exporter writes with coremltools' own writer instead."""

    def __init__(self, path: Path):
        self.path = path
        self._f = path.open("wb")
        self._f.write(struct.pack("<II7Q", 0, BLOB_STORAGE_VERSION, *[0] * 7))
        self._end = BLOB_ALIGNMENT
        self.count = 0

    def write(self, dtype: str, elements: int) -> int:
        """Record a blob of ``elements`` values of ``dtype``; returns its metadata offset (what the proto stores)."""
        code, bits = BLOB_DTYPES[dtype]
        size = (elements * bits + 7) // 8
        offset = -(-self._end // BLOB_ALIGNMENT) * BLOB_ALIGNMENT
        data = offset + BLOB_ALIGNMENT
        self._f.seek(offset)
        self._f.write(struct.pack("<IIQQQ4Q", BLOB_SENTINEL, code, size, data, size * 8 - elements * bits, 0, 0, 0, 0))
        self._end = data + size
        self.count += 1
        return offset

    def close(self) -> None:
        self._f.truncate(self._end)  # extends the file over the last hole
        self._f.seek(0)
        self._f.write(struct.pack("<I", self.count))
        self._f.close()


def blob_dtype(var) -> str:
    """The storage dtype coremltools writes a const var's blob with (``backend.mil.helper`` dispatches on the
    MIL dtype for sub-byte types, else on the numpy dtype)."""
    from coremltools.converters.mil.mil import types

    for name in ("int4", "uint1", "uint2", "uint3", "uint4", "uint6"):
        if var.dtype == getattr(types, name):
            return name
    kind = (var.val.dtype.kind, var.val.dtype.itemsize)
    names = {("f", 2): "fp16", ("f", 4): "fp32", ("u", 1): "uint8", ("i", 1): "int8", ("u", 2): "uint16",
             ("i", 2): "int16", ("i", 4): "int32", ("u", 4): "uint32"}
    if kind not in names:
        raise ValueFreeError(f"const {var.name!r}: no blob storage for numpy dtype {var.val.dtype}")
    return names[kind]


def _exporter_class():
    from coremltools.converters.mil.backend.mil.helper import create_file_value_tensor, types_to_proto_primitive
    from coremltools.converters.mil.backend.mil.load import MILProtoExporter

    class ValueFreeExporter(MILProtoExporter):
        """coremltools' pymil → MIL protobuf exporter, but a weight's blob is written header-only unless
        ``read_program`` may read its data (a vector of at most ``ZERO_CHECK_MAX_BYTES``)."""

        def __init__(self, prog, weights_dir: str, specification_version: int):
            super().__init__(prog, weights_dir, specification_version)
            self.header_only = HeaderOnlyBlobWriter(Path(weights_dir) / HEADER_ONLY_FILE)

        def create_file_value(self, var):
            dtype = blob_dtype(var)
            shape = var.val.shape
            elements = math.prod(shape)
            if len(shape) <= 1 and (elements * BLOB_DTYPES[dtype][1] + 7) // 8 <= ZERO_CHECK_MAX_BYTES:
                return super().create_file_value(var)  # real data: the walker's zero-bias check reads it
            weight_id = var.op.weight_id or f"{var.op.enclosing_block.name}_{var.name}"  # as the base class
            if weight_id not in self.weight_id_to_file_value:
                primitive = var.sym_type.get_primitive() if hasattr(var.sym_type, "get_primitive") else var.sym_type
                self.weight_id_to_file_value[weight_id] = create_file_value_tensor(
                    file_name=f"@model_path/weights/{HEADER_ONLY_FILE}",
                    offset=self.header_only.write(dtype, elements), dim=shape,
                    data_type=types_to_proto_primitive(primitive))
            return self.weight_id_to_file_value[weight_id]

        def close(self) -> None:
            self.header_only.close()
            self.blob_writers.clear()  # coremltools' writers flush when released

    return ValueFreeExporter


def export_skeleton(prog, package: Path):
    """Write ``prog`` as an ``.mlpackage`` whose large weight blobs are headers over holes; returns the Model
    spec. As ``backend.mil.load.load``: MIL program, then the model description from the program's I/O."""
    import coremltools as ct
    from coremltools.converters.mil.backend.mil.load import CoreMLProtoExporter
    from coremltools.models.utils import _create_mlpackage

    version = ct.target.iOS18.value
    with tempfile.TemporaryDirectory(prefix="qfold-weights-") as weights_dir:
        exporter = _exporter_class()(prog, weights_dir, version)
        try:
            mil_proto = exporter.export()
        finally:
            exporter.close()
        del exporter
        spec = CoreMLProtoExporter(prog, mil_proto, None, None, classifier_config=None, convert_to="mlprogram",
                                   convert_from="pytorch", specification_version=version).export(version)
        _create_mlpackage(spec, None, str(package))
        dest = package / "Data" / "com.apple.CoreML" / "weights"
        dest.mkdir(parents=True, exist_ok=True)
        for f in Path(weights_dir).iterdir():
            shutil.move(str(f), str(dest / f.name))  # a rename within one file system keeps the holes
    return spec


def walk_program(prog, scratch: Path) -> MilProgram:
    """The op records of an in-memory program, read from a skeleton package in ``scratch`` (then deleted) by
    the same walker as any saved package. The record's ``path`` is empty: there is no package."""

    package = scratch / "skeleton.mlpackage"
    shutil.rmtree(package, ignore_errors=True)
    export_skeleton(prog, package)
    try:
        program = read_program(package)
    finally:
        shutil.rmtree(package, ignore_errors=True)
    return replace(program, path="")


# ------------------------------------------------------------------------------------------------- convert
def _backend_pipeline(main_pipeline, convert_from: str):
    """The ``backend_mlprogram`` pipeline ``ct.convert(..., convert_to="mlprogram")`` runs after ``main``."""
    from coremltools.converters.mil.converter import _construct_other_pipelines

    return _construct_other_pipelines(main_pipeline, convert_from, "mlprogram")[1]


def to_program(traced, step, keep_duplicate_consts: bool = False):
    """Convert a traced step (whose parameters are value-free views by now) to the pymil program that
    ``convert_to="mlprogram"`` would serialise: frontend, main pipeline, backend pipeline. What coremltools
    would do per weight element is done per tensor (``step.one_value_equal``, ``step.value_free_pipeline``: a
    70B model has 7·10^10 elements), and the pipeline skips its read-only bookkeeping (``quick_passes``:
    one validation instead of one per pass); the result is the same program (tests/test_fast_identity.py)."""
    import coremltools as ct
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager

    main = value_free_pipeline(main_pipeline(keep_duplicate_consts))
    reset_op_names()
    with one_value_equal(), quick_passes():
        prog = ct.convert(traced, **{**convert_kwargs(step, "milinternal", keep_duplicate_consts),
                                     "pass_pipeline": main})
        PassPipelineManager.apply_pipeline(prog, _backend_pipeline(main, "pytorch"))
    prog.validate()
    prog._check_early_error_out_for_invalid_program()
    reset_op_names()
    return prog


# ------------------------------------------------------------------------------------------------- compress
def _stand_in(shape: tuple[int, ...], block_sizes: list[int], index: int) -> tuple[np.ndarray, list[int]]:
    """A small array with the weight's block structure: every axis split into blocks (0 < block < size) keeps
    its length and block size, every other axis shrinks to 1 (block 0, "the whole axis"), so coremltools' own
    parameter computation on it yields the weight's LUT/scale layout. Its values (fp16, distinct per weight
    through ``index``) vary within each block, so a uniform LUT is well defined."""
    s_shape, s_blocks = [], []
    for dim, block in zip(shape, block_sizes, strict=True):
        keep = 0 < block < dim
        s_shape.append(dim if keep else 1)
        s_blocks.append(block if keep else 0)
    n = math.prod(s_shape)
    values = np.linspace(-0.5, 0.5, n) + 1.0 + index / 512
    return values.astype(np.float16).reshape(s_shape), s_blocks


def _passes():
    from coremltools.optimize.coreml import _quantization_passes as qp

    class ValueFreePalettizer(qp.palettize_weights):
        """coremltools' ``compression::palettize_weights`` with the LUT and indices computed on a stand-in
        (:func:`_stand_in`) by coremltools' own ``blockwise_compress`` in uniform mode, the indices then
        broadcast to the weight's shape. LUT shape (``[groups, 1, 2^nbits, 1]`` for per-grouped-channel),
        indices dtype (``uint<nbits>``) and skipping rules are coremltools'; k-means gives the same layout
        (a ``2^nbits``-entry LUT per group), so it is laid out as uniform."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.count = 0

        def blockwise_compress(self, original_data, mode, nbits, block_sizes, lut_function=None, cluster_dim=1,
                               channel_axis=None, num_kmeans_workers=1):
            if cluster_dim != 1 or mode.upper() not in ("UNIFORM", "KMEANS"):
                raise ValueFreeError(f"{mode} palettization with cluster_dim={cluster_dim} depends on the weight "
                                     "values; use a materialised build")
            self.count += 1
            values, blocks = _stand_in(original_data.shape, block_sizes, self.count)
            with np.errstate(all="ignore"):  # a one-channel group has one value: a constant LUT
                params = qp.palettize_weights.blockwise_compress(values, "UNIFORM", nbits, blocks, None, 1,
                                                                 channel_axis, 1)
            if params is None:
                return None
            return params._replace(indices=np.broadcast_to(params.indices, original_data.shape))

    class ValueFreeLinearQuantizer(qp.linear_quantize_weights):
        """coremltools' ``compression::linear_quantize_weights`` with data, scale and offset computed on a
        stand-in (:func:`_stand_in`) by coremltools' own ``blockwise_compress_by_dtype``, the data then
        broadcast to the weight's shape: scale shape (``[C, 1]`` per channel), dtype and offset rules are
        coremltools'."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.count = 0

        def blockwise_compress_by_dtype(self, original_data, dtype, mode, block_sizes):
            self.count += 1
            values, blocks = _stand_in(original_data.shape, block_sizes, self.count)
            params = qp.linear_quantize_weights.blockwise_compress_by_dtype(values, dtype, mode, blocks)
            if params is None:
                return None
            return params._replace(data=np.broadcast_to(params.data, original_data.shape))

    return ValueFreePalettizer, ValueFreeLinearQuantizer


@dataclass(frozen=True, slots=True)
class _SpecView:
    """What ``compress.plan_weights`` reads from a model: its spec."""

    spec: Any

    def get_spec(self):
        return self.spec


def compress_program(prog, plan, scratch: Path) -> None:
    """Compress a value-free program in place per ``plan``, as ``compress.compress_model`` does a materialised
    model: palettization, then int8 quantization, each followed by the pipelines
    ``coremltools.optimize.coreml`` re-runs (``_apply_graph_pass``: the default pipeline without the fp16
    casts, then the backend pipeline, on a program loaded back from protobuf, which carries no torch scope
    requirement)."""
    from coremltools.converters.mil.mil.passes.graph_pass import PassOption
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager
    from coremltools.optimize.coreml import OptimizationConfig


    package = scratch / "plan.mlpackage"
    shutil.rmtree(package, ignore_errors=True)
    try:
        assignments = plan_weights(_SpecView(export_skeleton(prog, package)), plan)
    finally:
        shutil.rmtree(package, ignore_errors=True)
    pal, lin = optimization_configs(assignments)
    for function in prog.functions.values():
        function._essential_scope_sources = []  # as a program loaded back from protobuf
    palettizer, quantizer = _passes()
    for cls, configs in ((palettizer, pal), (quantizer, lin)):
        if not configs:
            continue
        graph_pass = cls()
        graph_pass.set_options([PassOption("config", OptimizationConfig(op_name_configs=configs)),
                                PassOption("joint_compression", False)])
        graph_pass.apply(prog)
        main = PassPipeline()
        main.remove_passes({"common::add_fp16_cast", "common::add_int16_cast"})
        with quick_passes():  # the same program; validated once, by the check (quick_passes)
            PassPipelineManager.apply_pipeline(prog, main)
            PassPipelineManager.apply_pipeline(prog, _backend_pipeline(main, "milinternal"))
            prog._check_early_error_out_for_invalid_program()
        reset_op_names()
    if pal or lin:
        package = scratch / "check.mlpackage"
        try:
            check_all_compressed(assignments, _const_weights(export_skeleton(prog, package)))
        finally:
            shutil.rmtree(package, ignore_errors=True)
