"""What a Core AI ``.aimodel`` asset must look like before any native code reads it.

coreai-core 1.0.0b3's ``AIProgram.save_asset`` writes a directory ``NAME.aimodel/`` holding ``metadata.json``
(``producer``, ``assetVersion``, ``creationDate``), ``main.mlirb`` (the program as MLIR bytecode, magic
``ML\\xefR``) and ``main.hash`` (the 32-byte SHA-256 digest of ``main.mlirb``). Its runtime segfaults on a folder
that is not one (the probe fed it an ``.mlpackage`` renamed ``.aimodel``: ../shared/probe/coreai/RESULTS.md, Q5),
so every path is checked here, in pure Python, and refused with one line naming the file and the reason. The
digest check catches a truncated or edited program before it is parsed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from analyzer.errors import AimodelError
from analyzer.fsio import read_json

ASSET_SUFFIX = ".aimodel"
PROGRAM_FILE = "main.mlirb"
HASH_FILE = "main.hash"
METADATA_FILE = "metadata.json"
MLIR_BYTECODE_MAGIC = b"ML\xefR"  # MLIR's bytecode format (mlir/Bytecode/BytecodeImplementation: "ML\xefR")
# metadata.json holds a handful of fields.
MAX_METADATA_BYTES = 1 << 20
_HASH_CHUNK = 16 << 20


def looks_like_asset(path: str | Path) -> bool:
    """Whether ``path`` is meant as a Core AI asset (by its name); :func:`check_asset` says whether it is one."""
    return Path(path).suffix == ASSET_SUFFIX


def _sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.digest()


def check_asset(path: str | Path) -> Path:
    """``path`` as a Core AI asset directory, or :class:`AimodelError` with a one-line reason: not a directory,
    a Core ML package under another name, no or malformed ``metadata.json``, no program, not MLIR bytecode,
    or a program whose SHA-256 differs from ``main.hash`` (truncated or edited)."""
    p = Path(path)
    if not p.exists():
        raise AimodelError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise AimodelError(f"{p}: a Core AI asset is a directory ({ASSET_SUFFIX}/ with {PROGRAM_FILE}); "
                           "this is a file")
    if (p / "Manifest.json").is_file() or (p / "Data").is_dir():
        raise AimodelError(f"{p}: a Core ML .mlpackage (Manifest.json, Data/), not a Core AI asset; "
                           "read it as an .mlpackage")
    meta = p / METADATA_FILE
    if not meta.is_file():
        raise AimodelError(f"{p}: no {METADATA_FILE} (not a Core AI asset)")
    doc = read_json(meta, MAX_METADATA_BYTES, AimodelError)
    if not isinstance(doc, dict) or not isinstance(doc.get("assetVersion"), str):
        raise AimodelError(f"{meta}: no assetVersion string (not a Core AI asset's metadata)")
    program = p / PROGRAM_FILE
    if not program.is_file():
        raise AimodelError(f"{p}: no {PROGRAM_FILE} (the asset holds no program)")
    with program.open("rb") as f:
        head = f.read(len(MLIR_BYTECODE_MAGIC))
    if head != MLIR_BYTECODE_MAGIC:
        raise AimodelError(f"{program}: not MLIR bytecode (starts {head!r}, expected {MLIR_BYTECODE_MAGIC!r})")
    digest_file = p / HASH_FILE
    if not digest_file.is_file():
        raise AimodelError(f"{p}: no {HASH_FILE} (the program's SHA-256), so a truncated program cannot be told apart")
    expected = digest_file.read_bytes()
    if len(expected) != 32:
        raise AimodelError(f"{digest_file}: {len(expected)} bytes, not a 32-byte SHA-256 digest")
    if _sha256(program) != expected:
        raise AimodelError(f"{program}: its SHA-256 differs from {HASH_FILE} ({program.stat().st_size:,} bytes): "
                           "truncated or modified")
    return p
