"""Walk a saved ML Program ``.mlpackage`` straight from its protobuf: one typed record per op.

Reading ``Model.proto`` (the MIL program) plus the headers of the blobs in ``weight.bin`` takes ~0.2 s and
~0.4 GB even for a 2.5 GB package (docs/measurements.md), needs no Core ML runtime, and works on any ML
Program package, including ones other tools built. (``MLModel(...)._mil_program`` is None for a loaded file,
and ``milproto.load`` takes ~9 s and ~5 GB and re-fuses state writes.)

A package may hold several functions (``coremltools.utils.save_multifunction``): :func:`list_functions`
names them and :func:`read_program` walks one. The records are in :mod:`analyzer.ir.mil_records`, the
protobuf reading in :mod:`analyzer.ir.coreml.milproto`, the per-op facts (layer, tile kind) in
:mod:`analyzer.ir.opfacts`; this module re-exports the names other code imports from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import DecodeError

from analyzer.errors import MilError
from analyzer.fsio import read_bytes_bounded, read_json, resolved
from analyzer.ir.coreml.milproto import Blobs, coreml_proto, feature_info, tensor_info, walk_block
from analyzer.ir.mil_records import (
    DTYPE_BITS,
    VIEW_OPS,
    InputRef,
    MilProgram,
    OpRecord,
    TensorInfo,
    consumer_map,
)
from analyzer.ir.opfacts import derive_op_facts, layer_from_name

__all__ = [
    "DTYPE_BITS",
    "VIEW_OPS",
    "Blobs",
    "InputRef",
    "LoadedFunction",
    "MilProgram",
    "OpRecord",
    "TensorInfo",
    "consumer_map",
    "find_package",
    "layer_from_name",
    "list_functions",
    "load_function",
    "read_program",
    "tensor_info",
]


def find_package(path: str | Path) -> Path:
    """A build folder (holding one ``.mlpackage``) or a ``.mlpackage`` itself."""
    p = Path(path)
    if p.suffix == ".mlpackage" and p.is_dir():
        return p
    if p.is_dir():
        found = sorted(p.glob("*.mlpackage"))
        if len(found) == 1:
            return found[0]
        if found:
            raise MilError(f"{p}: holds {len(found)} .mlpackage folders; name one")
        if (p / "analysis.json").is_file():
            raise MilError(f"{p}: a build folder with an analysis but no .mlpackage (an analysis-mode build keeps "
                           "none: its weights have no values; so does a sweep point); build it with --mode "
                           "materialised for a package to run or fold")
    raise MilError(f"{p}: not an .mlpackage nor a build folder holding one")


# A Manifest.json lists a handful of items; Model.proto of a full-size LLM is a few MB (the weights are in blobs).
MAX_MANIFEST_BYTES = 1 << 20
MAX_MODEL_PROTO_BYTES = 1 << 30


def root_model_path(pkg: Path) -> Path:
    """The package's root model file as its ``Manifest.json`` names it, refused when it points outside the
    package (``../..``) or anywhere but a regular file inside ``Data/`` — coremltools' own loader follows any
    path the manifest gives."""

    manifest = pkg / "Manifest.json"
    if not manifest.exists() and not manifest.is_symlink():
        raise MilError(f"{pkg}: no Manifest.json (not an .mlpackage)")
    if resolved(manifest, MilError).parent != resolved(pkg, MilError):
        raise MilError(f"{manifest}: a symbolic link out of the package; refused")
    doc = read_json(manifest, MAX_MANIFEST_BYTES, MilError)
    try:
        entry = doc["itemInfoEntries"][doc["rootModelIdentifier"]]
        rel = entry["path"]
    except (KeyError, TypeError) as e:
        raise MilError(f"{manifest}: no root model entry ({e!s})") from None
    if not isinstance(rel, str) or not rel:
        raise MilError(f"{manifest}: the root model's path is {rel!r}")
    data = resolved(pkg, MilError) / "Data"  # not resolved further: a Data/ that is a link out is outside
    path = resolved(pkg / "Data" / rel, MilError)
    if data not in path.parents:
        raise MilError(f"{manifest}: the root model path {rel!r} points outside the package")
    if not path.exists():
        raise MilError(f"{manifest}: the root model {rel!r} is missing")
    return path


def read_spec(path: str | Path):
    """A package's (or build folder's) ``Model.proto`` as coremltools' ``Model_pb2.Model``, read as qfold reads
    it (bounded, links checked), never through ``coremltools.models.MLModel(path)``: its package handle rewrites
    the package's ``Manifest.json`` when it is released, which would modify an input."""
    return _load_ml_program(find_package(path))


def weights_dir(pkg: Path) -> Path:
    """Where a package keeps its ``weight.bin`` blob files (coremltools' ``Data/com.apple.CoreML/weights``)."""
    return pkg / "Data" / "com.apple.CoreML" / "weights"


def _load_ml_program(pkg: Path):
    path = root_model_path(pkg)
    data = read_bytes_bounded(path, MAX_MODEL_PROTO_BYTES, MilError)
    spec = coreml_proto("Model_pb2").Model()
    try:
        spec.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise MilError(f"{path}: cannot parse the model protobuf ({e})") from e
    kind = spec.WhichOneof("Type")
    if kind != "mlProgram":
        raise MilError(f"{pkg}: a {kind or 'empty'} model, not an ML Program; qfold walks MIL programs")
    if not spec.mlProgram.functions:
        raise MilError(f"{pkg}: the ML Program has no function")
    return spec


def _default_function(spec) -> str:
    """The description's default function (multi-function packages), else ``main``, else the first."""
    funcs = spec.mlProgram.functions
    named = spec.description.defaultFunctionName
    if named and named in funcs:
        return named
    return "main" if "main" in funcs else next(iter(funcs))


def list_functions(path: str | Path) -> tuple[str, ...]:
    """The functions of a package, the default one first."""
    spec = _load_ml_program(find_package(path))
    default = _default_function(spec)
    return (default, *sorted(n for n in spec.mlProgram.functions if n != default))


@dataclass(frozen=True)
class LoadedFunction:
    """One function of a package's ``Model.proto``, ready to walk or evaluate."""

    package: Path
    spec: object  # coremltools.proto.Model_pb2.Model
    name: str
    function: object  # MIL_pb2.Function
    block: object  # MIL_pb2.Block of the function's opset

    @property
    def weights_dir(self) -> Path:
        return weights_dir(self.package)


def load_function(path: str | Path, function: str | None = None) -> LoadedFunction:
    """Read ``Model.proto`` of a package (or build folder) and pick a function: ``function``, else the default
    one. Raises ``MilError`` for anything that is not a readable ML Program."""
    pkg = find_package(path)
    spec = _load_ml_program(pkg)
    funcs = spec.mlProgram.functions
    fn = function or _default_function(spec)
    if fn not in funcs:
        raise MilError(f"{pkg}: no function {fn!r} (has {', '.join(funcs)})")
    func = funcs[fn]
    if func.opset not in func.block_specializations:
        raise MilError(f"{pkg}: function {fn!r} has no block for its opset {func.opset!r}")
    return LoadedFunction(pkg, spec, fn, func, func.block_specializations[func.opset])


def read_program(path: str | Path, function: str | None = None) -> MilProgram:
    """Parse a saved ML Program package into op records (with layers and tile kinds). ``function`` picks
    one function of a multi-function package; None is the default function."""
    loaded = load_function(path, function)
    pkg, spec, fn, func = loaded.package, loaded.spec, loaded.name, loaded.function
    blobs = Blobs(loaded.weights_dir)
    try:
        ops = walk_block(loaded.block, blobs, {i.name: tensor_info(i.name, i.type) for i in func.inputs})
    finally:
        blobs.close()
    desc = spec.description
    described = next((f for f in desc.functions if f.name == fn), desc)  # per-function descriptions, if any
    states = tuple(feature_info(s) for s in described.state)
    state_names = {s.name for s in states}
    inputs = tuple(tensor_info(i.name, i.type) for i in func.inputs if i.name not in state_names)
    outputs = tuple(feature_info(o) for o in described.output)
    return MilProgram(str(pkg), fn, func.opset, spec.specificationVersion, inputs, states, outputs,
                      tuple(derive_op_facts(ops)))
