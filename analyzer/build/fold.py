"""Folded packages on disk: a content-hashed cache, and the ``repeat_kv+fold`` build route.

* ``fold_cached(pkg)``: the fold of any package, keyed by the SHA-256 of the package's files and the pass
  version, kept in ``builds/.folds/<key>/`` (``model.mlpackage`` + ``fold.json``: the pass's report and the
  interpreter's proof). Folding the same package twice reuses the first result; a different proof request
  (steps, seed, input spec) re-runs only the proof.
* ``build_folded(spec)``: ``--variant repeat_kv+fold``: the ``repeat_kv`` build of ``spec`` (converted once,
  cached like any build) plus the pass, saved as a build folder of its own beside it, so one conversion
  yields both sides of the A/B. Its ``analysis.json`` is a build analysis whose ``spec.variant`` is
  ``repeat_kv+fold``, with ``folded_from`` (the original's key), ``fold`` (the report and proof) and the
  equivalence checks of the original plus "folded vs original".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.build.builds import (
    LOG_FILE,
    MATERIALISED_MODE,
    PACKAGE_NAME,
    BuildResult,
    BuildSpec,
    Progress,
    builds_dir,
    is_complete,
    run_build,
)
from analyzer.build.state import key_lock, tmp_folder
from analyzer.errors import FoldError
from analyzer.fsio import read_json, write_json_atomic
from analyzer.graph.mil import find_package
from analyzer.graph.passes.proof import DEFAULT_STEPS, FoldProof
from analyzer.graph.record import ANALYSIS_FILE, Analysis, load_analysis, write_analysis

if TYPE_CHECKING:  # the pass imports coremltools; importing this module (CLI --help) must stay light
    from analyzer.graph.passes.package import FoldReport

FOLD_VARIANT = "repeat_kv+fold"  # a build route, not an attention variant: repeat_kv converted, then folded
FOLD_BASE_VARIANT = "repeat_kv"
FOLDS_DIR = ".folds"
FOLD_FILE = "fold.json"


@dataclass(frozen=True, slots=True)
class FoldResult:
    key: str
    path: Path  # the cache folder
    package: Path
    record: dict[str, Any]  # fold.json
    reused: bool
    seconds: float

    @property
    def proof_headline(self) -> str:
        return proof_from_json(self.record["proof"]).headline()

    def summary(self) -> str:
        """One line for the UI: tiles, bytes per token of the first function, and the proof."""
        r = self.record["report"]
        if not r["changed"]:
            return f"nothing to fold: {r['tiles_found']} tile ops, none copies K/V for attention"
        f = r["functions"][0]
        before, after = f["before"]["total"], f["after"]["total"]
        return (f"{r['tiles_folded']} of {r['tiles_found']} tile ops folded; bytes per token "
                f"{before / (1 << 20):,.1f} → {after / (1 << 20):,.1f} MiB; equivalence: {self.proof_headline}")


def _pass():
    from analyzer.graph.passes import gqa_fold

    return gqa_fold


def fold_key(digest: str) -> str:
    return f"{digest[:24]}-p{_pass().PASS_VERSION}"


def report_json(report: FoldReport) -> dict[str, Any]:
    """The CLI's and the cache's JSON: tiles found / folded / left (with reasons), bytes per token before and
    after, the per-constant weight check and timings."""
    return {
        "source": report.source,
        "pass": _pass().PASS_NAME,
        "pass_version": report.pass_version,
        "changed": report.changed,
        "tiles_found": report.tiles_found,
        "tiles_folded": report.tiles_folded,
        "tiles_left": len(report.tiles_left),
        "tiles": [asdict(d) for d in report.decisions],
        "functions": [asdict(f) for f in report.functions],
        "weights": None if report.weights is None else {**asdict(report.weights), "ok": report.weights.ok},
        "timings_s": report.timings_s,
    }


def proof_json(proof: FoldProof) -> dict[str, Any]:
    return {**asdict(proof), "bit_identical": proof.bit_identical, "within_tolerance": proof.within_tolerance,
            "headline": proof.headline()}


def proof_from_json(d: dict[str, Any]) -> FoldProof:
    fields = {k: v for k, v in d.items() if k in FoldProof.__dataclass_fields__}
    fields["random_inputs"] = tuple(fields.get("random_inputs", ()))
    return FoldProof(**fields)


def _proof_request(steps: int, seed: int, roles_path: str | Path | None) -> dict[str, Any]:
    roles = None
    if roles_path is not None:
        roles = hashlib.sha256(Path(roles_path).read_bytes()).hexdigest()[:16]
    return {"steps": steps, "seed": seed, "roles_sha256": roles}


def _not_needed() -> FoldProof:
    return FoldProof(False, reason="nothing was folded: the output is a byte copy of the input")


# ------------------------------------------------------------------------------------------------ the cache
def fold_cached(src: str | Path, root: str | Path | None = None, steps: int = DEFAULT_STEPS, seed: int = 0,
                roles_path: str | Path | None = None, prove: bool = True) -> FoldResult:
    """The fold of ``src`` (any ML Program package or build folder), from the cache when it is there."""
    from filelock import FileLock

    from analyzer.graph.passes.package import fold_package, package_digest
    from analyzer.graph.passes.proof import prove_fold

    t0 = time.monotonic()
    pkg = find_package(src)
    digest = package_digest(pkg)
    key = fold_key(digest)
    parent = builds_dir(root) / FOLDS_DIR
    folder = parent / key
    parent.mkdir(parents=True, exist_ok=True)
    request = _proof_request(steps, seed, roles_path)
    with FileLock(str(parent / f"{key}.lock")):
        if (folder / FOLD_FILE).is_file():
            record = read_json(folder / FOLD_FILE, error=FoldError)
            if prove and record.get("proof_request") != request and record["report"]["changed"]:
                record["proof"] = proof_json(prove_fold(pkg, folder / PACKAGE_NAME, steps, seed, roles_path))
                record["proof_request"] = request
                write_json_atomic(folder / FOLD_FILE, record)
            return FoldResult(key, folder, folder / PACKAGE_NAME, record, True, time.monotonic() - t0)
        tmp = parent / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            report = fold_package(pkg, tmp / PACKAGE_NAME)
            if not report.changed:
                proof = _not_needed()
            elif prove:
                proof = prove_fold(pkg, tmp / PACKAGE_NAME, steps, seed, roles_path)
            else:
                proof = FoldProof(False, reason="not requested")
            record = {"key": key, "source_sha256": digest, "source_name": pkg.name, "source_path": str(pkg.resolve()),
                      "created": datetime.now(UTC).isoformat(timespec="seconds"),
                      "report": report_json(report), "proof": proof_json(proof), "proof_request": request}
            (tmp / FOLD_FILE).write_text(json.dumps(record))
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return FoldResult(key, folder, folder / PACKAGE_NAME, record, False, time.monotonic() - t0)


def fold_record_of(package: str | Path | None) -> dict[str, Any] | None:
    """The ``fold.json`` of a cached fold's package (``<builds>/.folds/<key>/model.mlpackage``), else None."""
    if package is None:
        return None
    f = Path(package).parent / FOLD_FILE
    if Path(package).name != PACKAGE_NAME or Path(package).parent.parent.name != FOLDS_DIR or not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def copy_package(src: Path, dst: Path) -> None:
    """Hard-link a package's files into ``dst`` (a cached fold stays one copy on disk), copying where the
    file system cannot link; written beside ``dst`` and renamed into place."""
    tmp = dst.with_name(f".tmp-{os.getpid()}-{dst.name}")
    shutil.rmtree(tmp, ignore_errors=True)

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, tmp, copy_function=link)
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)


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
    digest = hashlib.sha256(f"{base}|{_pass().PASS_NAME}|{_pass().PASS_VERSION}".encode()).hexdigest()[:10]
    return f"{label}{rest}-{digest}"


def build_folded(spec: BuildSpec, root: str | Path | None = None,
                 on_progress: Callable[[Progress], None] | None = None) -> BuildResult:
    """The ``repeat_kv+fold`` build of ``spec`` (a ``repeat_kv`` spec): convert (or reuse) the repeat_kv build,
    fold its package, prove the fold in the interpreter, and write a build folder beside it."""
    if spec.build_mode != MATERIALISED_MODE:
        raise FoldError(f"a {FOLD_VARIANT} build folds a saved package and proves it in the MIL interpreter, which "
                        f"needs weight values: its {FOLD_BASE_VARIANT} build must be materialised, not "
                        f"{spec.build_mode}")
    if spec.phase != "decode":
        raise FoldError(f"--phase {spec.phase}: a {FOLD_VARIANT} build folds the decode step only; build the "
                        f"prefill package with --variant {FOLD_BASE_VARIANT} and fold it with "
                        "`python -m analyzer fold` (the pass handles q_len > 1; the interpreter's proof runs decode)")
    t0 = time.monotonic()
    root = builds_dir(root)
    key = folded_build_key(spec)
    final = root / key
    if is_complete(final):
        return BuildResult(key, final, True, 0.0)
    base = run_build(spec, root, on_progress=on_progress)
    if on_progress is not None:
        on_progress(Progress(0.9, "fold", f"folding {base.key} with {_pass().PASS_NAME}"))
    fold = fold_cached(base.path, root, steps=min(spec.equivalence_steps, DEFAULT_STEPS))
    original = load_analysis(base.path)
    with key_lock(root, key):  # a .tmp-* folder lives only under its key lock (analyzer.build.state)
        if is_complete(final):  # a concurrent fold of the same build finished first
            return BuildResult(key, final, True, time.monotonic() - t0)
        tmp = tmp_folder(root, key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            copy_package(fold.package, tmp / PACKAGE_NAME)
            write_analysis(tmp / ANALYSIS_FILE, folded_analysis(original, fold, key))
            (tmp / LOG_FILE).write_text(f"folded {base.key} with {_pass().PASS_NAME} v{_pass().PASS_VERSION}: "
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
    from analyzer.build.equivalence import folded_check
    from analyzer.build.progress import peak_rss_bytes
    from analyzer.graph.mil import read_program

    if original.build is None:
        raise FoldError(f"{original.file}: not a build analysis; a repeat_kv+fold build folds a qfold build")
    b = original.build
    program = replace(read_program(fold.package), path=PACKAGE_NAME)
    report = fold.record["report"]
    info = replace(
        b, key=key, created=datetime.now(UTC).isoformat(timespec="seconds"),
        spec=replace(b.spec, variant=FOLD_VARIANT),
        timings_s={f"fold_{stage}": float(t) for stage, t in report["timings_s"].items()},
        peak_rss_bytes=peak_rss_bytes(),
        package_bytes=sum(f.stat().st_size for f in fold.package.rglob("*") if f.is_file()),
        checks=(*b.checks, folded_check(proof_from_json(fold.record["proof"]))),
        extra={**b.extra, "folded_from": b.key,
               "fold": {"key": fold.key, "reused": fold.reused, **report, "proof": fold.record["proof"]}},
    )
    return Analysis(program, info)
