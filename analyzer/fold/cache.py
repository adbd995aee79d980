"""Folds on disk (packages and assets): a content-hashed cache, and the ``repeat_kv+fold`` build route.

* ``fold_cached(pkg)``: the fold of any package, keyed by the SHA-256 of the package's files and the pass
  version, kept in ``builds/.folds/<key>/`` (``model.mlpackage`` + ``fold.json``: the pass's report and the
  interpreter's proof). Folding the same package twice reuses the first result; a different proof request
  (steps, seed, input spec) re-runs only the proof. Given a Core AI ``.aimodel`` (or a Core AI build folder), the
  same cache holds its fold (``analyzer.fold.coreai.asset_fold``: ``model.aimodel`` + ``fold.json``, keyed by the
  program's SHA-256 from ``main.hash``, proven on the Core AI runtime), so the dashboard folds either backend.
* ``build_folded(spec)``: ``--variant repeat_kv+fold``: the ``repeat_kv`` build of ``spec`` (converted once,
  cached like any build) plus the pass, saved as a build folder of its own beside it, so one conversion
  yields both sides of the A/B. Its ``analysis.json`` is a build analysis whose ``spec.variant`` is
  ``repeat_kv+fold``, with ``folded_from`` (the original's key), ``fold`` (the report and proof) and the
  equivalence checks of the original plus "folded vs original".
* ``fold_record_of(path)``: the record of a cached fold, so the dashboard's headline can say a package is a fold
  (importing this module imports neither coremltools nor torch: the pass and the rewrite are loaded when a fold runs).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.analysis.record import ANALYSIS_FILE, Analysis, load_analysis, write_analysis
from analyzer.convert.builds_folder import clean_stale_tmp, key_lock, tmp_folder
from analyzer.convert.launch import (
    ASSET_NAME,
    LOG_FILE,
    PACKAGE_NAME,
    BuildResult,
    Progress,
    builds_dir,
    is_complete,
    run_build,
)
from analyzer.convert.progress import peak_rss_bytes
from analyzer.engines.coreai.runtime import asset_in
from analyzer.errors import FoldError, QfoldError
from analyzer.fold.coreai import asset_fold
from analyzer.fold.coreml.package import fold_package, package_digest
from analyzer.fold.fold_records import PASS_NAME, PASS_VERSION, fold_summary
from analyzer.fold.proof import (
    DEFAULT_STEPS,
    NOT_REQUESTED,
    NOTHING_FOLDED,
    FoldProof,
    folded_check,
    prove_fold,
    refuse_failed,
)
from analyzer.fsio import check_disjoint, copy_tree, file_kind, read_bytes_bounded, read_json, write_json_atomic
from analyzer.ir.coreai.asset import HASH_FILE, check_asset
from analyzer.ir.coreml.mil_reader import find_package, read_program
from analyzer.model.spec import FOLD_BASE_VARIANT, FOLD_VARIANT, BuildSpec, check_fold_route

MAX_SPEC_BYTES = 1 << 20  # an input spec names a few inputs
FOLDS_DIR = ".folds"  # <builds>/.folds/<key>/: model.mlpackage (or model.aimodel) beside its record
FOLD_FILE = "fold.json"


@dataclass(frozen=True, slots=True)
class FoldResult:
    key: str
    path: Path  # the cache folder
    artifact: Path  # the folded package (model.mlpackage) or asset (model.aimodel) in it
    record: dict[str, Any]  # fold.json
    reused: bool
    seconds: float

    @property
    def proof(self) -> FoldProof:
        return FoldProof.from_json(self.record["proof"])

    @property
    def proof_headline(self) -> str:
        return self.proof.headline()

    def summary(self) -> str:
        """One line for the UI (:func:`~analyzer.fold.fold_records.fold_summary`)."""
        return fold_summary(self.record["report"], self.proof_headline)


def fold_key(digest: str) -> str:
    return f"{digest[:24]}-p{PASS_VERSION}"


def fold_record_of(package: str | Path | None) -> dict[str, Any] | None:
    """The ``fold.json`` of a cached fold's package or asset (``<builds>/.folds/<key>/model.mlpackage`` or
    ``model.aimodel``), else None."""
    if package is None:
        return None
    f = Path(package).parent / FOLD_FILE
    if Path(package).name not in (PACKAGE_NAME, ASSET_NAME) or Path(package).parent.parent.name != FOLDS_DIR or \
            not f.is_file():
        return None
    try:
        return read_json(f, error=FoldError)
    except QfoldError:
        return None


def _proof_request(steps: int, seed: int, roles_path: str | Path | None) -> dict[str, Any]:
    roles = None
    if roles_path is not None:
        roles = hashlib.sha256(read_bytes_bounded(Path(roles_path), MAX_SPEC_BYTES, FoldError)).hexdigest()[:16]
    return {"steps": steps, "seed": seed, "roles_sha256": roles}


def _not_needed() -> FoldProof:
    return FoldProof(False, reason=NOTHING_FOLDED, skipped=True)


# ------------------------------------------------------------------------------------------------ the cache
def fold_cached(src: str | Path, root: str | Path | None = None, steps: int = DEFAULT_STEPS, seed: int = 0,
                roles_path: str | Path | None = None, prove: bool = True,
                shapes: dict[str, tuple[int, ...]] | None = None) -> FoldResult:
    """The fold of ``src`` (any ML Program package or build folder, or a Core AI asset or build), from the cache
    when it is there. Given ``shapes`` (flexible inputs) key a fold of their own: its bytes and proof are at them."""

    t0 = time.monotonic()
    asset = asset_in(src)
    if asset is not None:
        if shapes:
            raise FoldError(f"{asset}: a Core AI asset has static input shapes; it is folded at them")
        return _fold_asset_cached(asset, builds_dir(root) / FOLDS_DIR, steps, seed, roles_path, prove, t0)
    pkg = find_package(src)
    digest = package_digest(pkg)
    key = fold_key(digest) + (f"-s{hashlib.sha256(repr(sorted(shapes.items())).encode()).hexdigest()[:8]}"
                              if shapes else "")
    request = _proof_request(steps, seed, roles_path)

    def reuse(record: dict[str, Any], folder: Path) -> dict[str, Any]:
        if prove and record["report"]["changed"] and (record.get("proof_request") != request
                                                      or _never_proven(record)):
            proof = prove_fold(pkg, folder / PACKAGE_NAME, steps, seed, roles_path, shapes=shapes)
            if proof.status == "failed":  # proven wrong now: the entry is not kept either
                shutil.rmtree(folder, ignore_errors=True)
            refuse_failed(proof, pkg)
            record["proof"] = proof.to_json()
            record["proof_request"] = request
            write_json_atomic(folder / FOLD_FILE, record)
        return record

    def make(tmp: Path) -> dict[str, Any]:
        report = fold_package(pkg, tmp / PACKAGE_NAME, shapes=shapes)
        if not report.changed:
            proof = _not_needed()
        elif prove:
            proof = prove_fold(pkg, tmp / PACKAGE_NAME, steps, seed, roles_path, shapes=shapes)
            refuse_failed(proof, pkg)  # raised before the entry is renamed into place: nothing is cached
        else:
            proof = FoldProof(False, reason=NOT_REQUESTED, skipped=True)
        return {"key": key, "source_sha256": digest, "source_name": pkg.name, "source_path": str(pkg.resolve()),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "package_sha256": package_digest(tmp / PACKAGE_NAME),
                "report": report.to_json(), "proof": proof.to_json(), "proof_request": request}

    return _cache_entry(builds_dir(root) / FOLDS_DIR, key, PACKAGE_NAME, t0, reuse, make)


def _fold_asset_cached(asset: Path, parent: Path, steps: int, seed: int, roles_path: str | Path | None,
                       prove: bool, t0: float) -> FoldResult:
    """:func:`fold_cached` of a checked Core AI asset (``check_asset`` verified ``main.hash``, its key). An entry
    proven at another request is folded again (the rewrite runs in a child with its proof; nothing to re-prove)."""
    digest = (asset / HASH_FILE).read_bytes().hex()
    key = f"{digest[:24]}-coreai-p{asset_fold.PASS_VERSION}"
    request = _proof_request(steps, seed, roles_path)

    def reuse(record: dict[str, Any], folder: Path) -> dict[str, Any] | None:
        if not prove or not record["report"]["changed"]:
            return record
        return record if record.get("proof_request") == request and not _never_proven(record) else None

    def make(tmp: Path) -> dict[str, Any]:
        report = asset_fold.fold_asset(asset, tmp / ASSET_NAME, steps, seed, roles_path, prove)
        return {"key": key, "backend": "coreai", "source_sha256": digest, "source_name": asset.name,
                "source_path": str(asset.resolve()), "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "package_sha256": _digest_of(tmp / ASSET_NAME), "report": report.to_json(),
                "proof": report.proof.to_json(), "proof_request": request}

    return _cache_entry(parent, key, ASSET_NAME, t0, reuse, make)


def _never_proven(record: dict[str, Any]) -> bool:
    """A cached fold made with ``--no-proof``: a request that asks for the proof runs it (never hands the unproven
    fold out as if the proof had been skipped on purpose)."""
    return FoldProof.from_json(record["proof"]).status == "skipped"


def _cache_entry(parent: Path, key: str, artifact: str, t0: float,
                 reuse: Callable[[dict[str, Any], Path], dict[str, Any] | None],
                 make: Callable[[Path], dict[str, Any]]) -> FoldResult:
    """One fold-cache entry under the builds folder's ownership rules (a ``.tmp-<key>-<pid>`` folder lives only under
    its key lock, so one whose lock is free is a killed fold's leftover). A verified entry goes to ``reuse(record,
    folder)``, which hands it out (updated if need be) or returns None; else ``make(tmp)`` folds into a temporary
    folder and returns its record, and the folder is renamed into place over any entry it replaces."""
    folder = parent / key
    parent.mkdir(parents=True, exist_ok=True)
    with key_lock(parent, key):
        clean_stale_tmp(parent, holding=(key,))
        record = _verified_entry(folder)
        kept = None if record is None else reuse(record, folder)
        if kept is not None:
            return FoldResult(key, folder, folder / artifact, kept, True, time.monotonic() - t0)
        tmp = tmp_folder(parent, key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            record = make(tmp)
            (tmp / FOLD_FILE).write_text(json.dumps(record))
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return FoldResult(key, folder, folder / artifact, record, False, time.monotonic() - t0)


def _digest_of(artifact: Path) -> str:
    """A cached fold's content hash: a package's files, or an asset's program (``main.hash``, checked first)."""
    if artifact.name == ASSET_NAME:
        return (check_asset(artifact) / HASH_FILE).read_bytes().hex()
    return package_digest(artifact)


def _verified_entry(folder: Path) -> dict[str, Any] | None:
    """A cache entry's ``fold.json`` if its package still has the content hash recorded when it was made, else
    None (the entry is folded again: an edited, truncated or foreign entry is never handed out)."""
    if not (folder / FOLD_FILE).is_file():
        return None
    try:
        record = read_json(folder / FOLD_FILE, error=FoldError)
        artifact = folder / (ASSET_NAME if isinstance(record, dict) and record.get("backend") == "coreai"
                             else PACKAGE_NAME)
        ok = isinstance(record, dict) and isinstance(record.get("report"), dict) and \
            record.get("package_sha256") == _digest_of(artifact) and _says_sized(record["report"])
    except QfoldError:
        ok = False
    return record if ok else None


def _says_sized(report: dict[str, Any]) -> bool:
    """Whether every function row of a cached report says if it was sized (an entry made before qfold said so is
    folded again rather than handed out without it)."""
    functions = report.get("functions")
    return isinstance(functions, list) and all(isinstance(f, dict) and "sized" in f for f in functions)


def copy_package(src: Path, dst: Path) -> None:
    """Copy a package's files to ``dst`` (reflinked where the file system shares blocks, never hard-linked: a
    user editing their output must not change the cache entry, nor the next fold handed out); written beside
    ``dst`` as ``.tmp-<pid>-<name>`` and renamed into place, an existing ``dst`` package moved to
    ``.old-<pid>-<name>`` first and removed after. Nothing is left behind on failure.

    The copy holds an exclusive ``flock`` of ``dst``'s folder from before it writes beside ``dst`` until it is done
    (the builds folder's ownership rule: by lock, never by pid; a folder's lock leaves no file behind), so a
    ``.tmp-*``/``.old-*`` folder of ``dst``'s name found while holding it is a killed copy's leftover: removed
    first."""
    tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")
    old = dst.with_name(f".old-{os.getpid()}-{dst.name}")
    try:
        folder = os.open(dst.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise FoldError(f"{dst}: cannot write the package ({e.strerror or e})") from e
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)  # released when closed, or when a killed holder's files are closed
        for leftover in leftovers_beside(dst):
            shutil.rmtree(leftover, ignore_errors=True)
        _copy_package(src, dst, tmp, old)
    finally:
        os.close(folder)


def leftovers_beside(dst: Path) -> list[Path]:
    """The ``.tmp-<pid>-<name>`` and ``.old-<pid>-<name>`` folders :func:`copy_package` writes beside ``dst``
    (folders only, never a link or a file of that name)."""
    pattern = re.compile(rf"^\.(tmp|old)-[0-9]{{1,10}}-{re.escape(dst.name)}$")
    try:
        return sorted(p for p in dst.parent.iterdir() if pattern.match(p.name) and p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _copy_package(src: Path, dst: Path, tmp: Path, old: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        copy_tree(src, tmp, FoldError, "package")
        if dst.exists() or dst.is_symlink():
            os.replace(dst, old)
        os.replace(tmp, dst)
    except OSError as e:
        raise FoldError(f"{dst}: cannot write the package ({e.strerror or e})") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def check_fold_output(src: Path, out: Path) -> Path:
    """``out`` resolved, refused before any work when writing it could touch ``src`` or a file that is not a
    package: OUT = IN, OUT inside IN, IN inside OUT, OUT an existing file or non-package folder, OUT's folder
    missing."""
    if out.suffix != ".mlpackage":
        raise FoldError(f"{out}: the output must end in .mlpackage")
    _, real = check_disjoint(src, out, FoldError)
    if real.exists() or real.is_symlink():
        if not real.is_dir():
            raise FoldError(f"{out}: exists and is not a package folder ({file_kind(real.lstat().st_mode)}); "
                            "refusing to replace it")
        if not (real / "Manifest.json").is_file():
            raise FoldError(f"{out}: an existing folder without Manifest.json (not an .mlpackage); refusing to "
                            "replace it")
    if not real.parent.is_dir():
        raise FoldError(f"{out}: its folder {real.parent} does not exist")
    return real


# ------------------------------------------------------------------------------------------------ the build route
def folded_build_key(spec: BuildSpec) -> str:
    """``<label>-repeat_kv+fold-<kv>-ctx<N>[-<compression>]-<digest>``: the repeat_kv key's parts with the
    route's name, and a digest of the repeat_kv key and the pass version."""
    if spec.variant != FOLD_BASE_VARIANT:
        raise FoldError(f"--variant {FOLD_VARIANT} folds a {FOLD_BASE_VARIANT} build, not {spec.variant!r}")
    base = spec.key
    prefix = base.rsplit("-", 1)[0]
    label = spec.source.label
    rest = prefix[len(label):].replace(f"-{FOLD_BASE_VARIANT}-", f"-{FOLD_VARIANT}-", 1)
    digest = hashlib.sha256(f"{base}|{PASS_NAME}|{PASS_VERSION}".encode()).hexdigest()[:10]
    return f"{label}{rest}-{digest}"


def build_folded(spec: BuildSpec, root: str | Path | None = None,
                 on_progress: Callable[[Progress], None] | None = None) -> BuildResult:
    """The ``repeat_kv+fold`` build of ``spec`` (a ``repeat_kv`` spec): convert (or reuse) the repeat_kv build,
    fold its package, prove the fold in the interpreter, and write a build folder beside it."""
    check_fold_route(spec)
    t0 = time.monotonic()
    root = builds_dir(root)
    key = folded_build_key(spec)
    final = root / key
    if is_complete(final):
        return BuildResult(key, final, True, 0.0)
    base = run_build(spec, root, on_progress=on_progress)
    if on_progress is not None:
        on_progress(Progress(0.9, "fold", f"folding {base.key} with {PASS_NAME}"))
    fold = fold_cached(base.path, root, steps=min(spec.equivalence_steps, DEFAULT_STEPS))  # a failed proof raises
    if on_progress is not None and fold.proof.status == "unproven":  # built, and stored and shown as unproven
        on_progress(Progress(0.95, "fold", f"the fold is {fold.proof_headline}"))
    original = load_analysis(base.path)
    with key_lock(root, key):  # a .tmp-* folder lives only under its key lock (analyzer.convert.builds_folder)
        if is_complete(final):  # a concurrent fold of the same build finished first
            return BuildResult(key, final, True, time.monotonic() - t0)
        tmp = tmp_folder(root, key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            copy_package(fold.artifact, tmp / PACKAGE_NAME)
            write_analysis(tmp / ANALYSIS_FILE, folded_analysis(original, fold, key))
            (tmp / LOG_FILE).write_text(f"folded {base.key} with {PASS_NAME} v{PASS_VERSION}: "
                                        f"{fold.record['report']['tiles_folded']} tiles folded; "
                                        f"{fold.proof_headline}\n")
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if on_progress is not None:
        on_progress(Progress(1.0, "done", str(final)))
    return BuildResult(key, final, False, time.monotonic() - t0)


def folded_analysis(original: Analysis, fold: FoldResult, key: str) -> Analysis:
    """A build analysis for the folded package: the original's spec (variant ``repeat_kv+fold``), geometry
    and equivalence plus the "folded vs original" check, the folded program, the fold report and its proof."""

    if original.build is None:
        raise FoldError(f"{original.file}: not a build analysis; a repeat_kv+fold build folds a qfold build")
    b = original.build
    program = replace(read_program(fold.artifact), path=PACKAGE_NAME)
    report = fold.record["report"]
    info = replace(
        b, key=key, created=datetime.now(UTC).isoformat(timespec="seconds"),
        spec=replace(b.spec, variant=FOLD_VARIANT),
        timings_s={f"fold_{stage}": float(t) for stage, t in report["timings_s"].items()},
        peak_rss_bytes=peak_rss_bytes(),
        package_bytes=sum(f.stat().st_size for f in fold.artifact.rglob("*") if f.is_file()),
        checks=(*b.checks, folded_check(fold.proof)),
        extra={**b.extra, "folded_from": b.key,
               "fold": {"key": fold.key, "reused": fold.reused, **report, "proof": fold.record["proof"]}},
    )
    return Analysis(program, info)
