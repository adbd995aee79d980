"""Builds: one folder per content-hashed key under ``builds/``, made by a child process, reused when present.

Two build modes (:data:`BUILD_MODES`), part of the key: ``analysis`` converts with value-free weights (shapes and
dtypes, no values: ``analyzer.build.valuefree``) and keeps only the analysis; ``materialised`` converts real or
seeded random weights and keeps a runnable ``model.mlpackage``. Both give the same analysis, op for op.

A build folder holds ``analysis.json`` and ``build.log`` (and ``model.mlpackage`` when materialised). The child
(``python -m analyzer.build.convert``) writes into ``builds/.tmp-<key>-<pid>/`` and renames it into place only
when everything is written, so an interrupted build never leaves a folder that looks finished. Shared
state lives on disk with file locks (several Streamlit sessions and CLIs may build at once): one lock per
key (two requests for the same build wait for one conversion) and one machine-wide conversion lock
(a materialised full-size conversion needs gigabytes: analyzer/build/costs.py), so further conversions queue.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import BuildError, QfoldError
from analyzer.fsio import write_json_atomic
from analyzer.graph.record import ANALYSIS_FILE, load_analysis
from analyzer.model.sources import ModelSource
from analyzer.model.variants import KV_MODES

PACKAGE_NAME = "model.mlpackage"
ANALYSIS_MODE, MATERIALISED_MODE = "analysis", "materialised"
BUILD_MODES: dict[str, str] = {
    ANALYSIS_MODE: "value-free weights (shapes and dtypes, no values): op counts, tiles and bytes per token, "
                   "identical to a materialised build's, at a memory that does not grow with the parameter "
                   "count; no .mlpackage is kept",
    MATERIALISED_MODE: "weights with values (seeded random, or a folder's safetensors): a runnable .mlpackage "
                       "to export, at the cost of a full conversion",
}
# How the numerical check is made (part of the key: changing it changes every analysis document).
EQUIVALENCE_MODEL = "reduced-2-layers-random"
LOG_FILE = "build.log"
PROGRESS_PREFIX = "@@qfold "  # child → parent protocol: one JSON object per line after this prefix
DEFAULT_EQUIVALENCE_STEPS = 8
REPO_ROOT = Path(__file__).resolve().parents[2]



def builds_dir(path: str | Path | None = None) -> Path:
    """``--builds-dir``, else ``$QFOLD_BUILDS``, else ``builds/`` beside the code."""
    return Path(path or os.environ.get("QFOLD_BUILDS") or REPO_ROOT / "builds")


def tool_versions() -> dict[str, str]:
    from importlib.metadata import version

    import analyzer

    out = {"qfold": analyzer.__version__}
    for pkg in ("torch", "coremltools", "transformers", "numpy"):
        out[pkg] = version(pkg)
    return out


@dataclass(frozen=True, slots=True)
class BuildSpec:
    source: ModelSource
    variant: str
    kv_mode: str = "state"
    ctx: int = 4096
    compression: str | None = None  # canonical compression spec text (analyzer.build.compress), None = fp16
    equivalence_steps: int = DEFAULT_EQUIVALENCE_STEPS
    build_mode: str = MATERIALISED_MODE  # the API default keeps a package; the CLI and dashboard default to analysis

    def __post_init__(self) -> None:
        from analyzer.model.variants import get_variant

        get_variant(self.variant)
        if self.build_mode not in BUILD_MODES:
            raise QfoldError(f"build mode {self.build_mode!r}: choose one of {', '.join(BUILD_MODES)}")
        if self.kv_mode not in KV_MODES:
            raise QfoldError(f"--kv {self.kv_mode!r}: choose one of {', '.join(KV_MODES)}")
        if not isinstance(self.ctx, int) or self.ctx < 1:
            raise QfoldError(f"--ctx {self.ctx!r}: must be a positive integer")
        if not 1 <= self.equivalence_steps <= self.ctx:
            raise QfoldError(f"equivalence steps {self.equivalence_steps}: must be between 1 and ctx={self.ctx}")

    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the converted model or its analysis."""
        return {
            "source": self.source.fingerprint(),
            "variant": self.variant,
            "kv_mode": self.kv_mode,
            "ctx": self.ctx,
            "compression": self.compression,
            "equivalence_steps": self.equivalence_steps,
            "equivalence_model": EQUIVALENCE_MODEL,
            "build_mode": self.build_mode,
            "torch_dtype": "fp16",
            "target": "iOS18",
            "compute_precision": "fp16",
            "versions": tool_versions(),
        }

    @property
    def key(self) -> str:
        digest = hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:10]
        parts = [self.source.label, self.variant, self.kv_mode, f"ctx{self.ctx}"]
        if self.compression:
            parts.append(_compression_label(self.compression, self.source.config_dict.get("num_hidden_layers", 0)))
        if self.build_mode == ANALYSIS_MODE:
            parts.append(ANALYSIS_MODE)
        return "-".join([*parts, digest])

    def to_json(self) -> dict[str, Any]:
        s = self.source
        return {
            "source": {"kind": s.kind, "ref": s.ref, "label": s.label, "overrides": list(s.overrides),
                       "fingerprint": s.fingerprint()},
            "variant": self.variant,
            "kv_mode": self.kv_mode,
            "ctx": self.ctx,
            "compression": self.compression,
            "equivalence_steps": self.equivalence_steps,
            "build_mode": self.build_mode,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BuildSpec:
        from analyzer.model.sources import source_from_fingerprint

        s = d["source"]
        source = source_from_fingerprint(s["kind"], s["ref"], s["label"], s["fingerprint"], s["overrides"])
        return cls(source, d["variant"], d["kv_mode"], d["ctx"], d["compression"], d["equivalence_steps"],
                   d.get("build_mode", MATERIALISED_MODE))


def materialised_spec(spec_json: dict[str, Any]) -> BuildSpec:
    """What exporting a runnable ``.mlpackage`` from an analysis (an analysis-mode build, or a shipped analysis)
    builds: the same spec with weight values. Its cost: ``analyzer.build.costs.estimate_cost``."""
    from dataclasses import replace

    return replace(BuildSpec.from_json(spec_json), build_mode=MATERIALISED_MODE)


def _compression_label(canonical: str, num_layers: int) -> str:
    """The preset's name when the spec is one (``top8``), else ``custom``; the hash tells customs apart."""
    from analyzer.build.compress import PRESETS, canonical_spec

    for name in PRESETS:
        if canonical_spec(name, num_layers) == canonical:
            return name
    return "custom"


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float
    stage: str
    message: str


@dataclass(frozen=True, slots=True)
class BuildResult:
    key: str
    path: Path
    reused: bool
    seconds: float


def build_path(spec: BuildSpec, root: str | Path | None = None) -> Path:
    return builds_dir(root) / spec.key


def is_complete(path: Path) -> bool:
    return (path / ANALYSIS_FILE).is_file()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(root: Path) -> list[Path]:
    """Remove ``.tmp-<key>-<pid>`` folders whose process is gone (a killed build)."""
    removed = []
    for tmp in root.glob(".tmp-*"):
        pid_text = tmp.name.rsplit("-", 1)[-1]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def run_build(spec: BuildSpec, root: str | Path | None = None,
              on_progress: Callable[[Progress], None] | None = None,
              timeout_s: float | None = None) -> BuildResult:
    """Return the build for ``spec``, converting it in a child process unless it already exists."""
    return run_builds([spec], root, on_progress, timeout_s)[0]


def run_builds(specs: list[BuildSpec] | tuple[BuildSpec, ...], root: str | Path | None = None,
               on_progress: Callable[[Progress], None] | None = None,
               timeout_s: float | None = None) -> list[BuildResult]:
    """Return the builds for ``specs`` (in order), converting the missing ones in ONE child process: the two
    variants of an A/B share its model, its equivalence check and (analysis mode) one value-free model traced
    once per variant."""
    t0 = time.monotonic()
    root = builds_dir(root)
    if not specs:
        return []
    missing = [s for s in dict.fromkeys(specs) if not is_complete(root / s.key)]
    if missing:
        _convert_in_child(missing, root, on_progress, timeout_s, t0)
    seconds = time.monotonic() - t0
    built = {s.key for s in missing}
    return [BuildResult(s.key, root / s.key, s.key not in built, seconds if s.key in built else 0.0) for s in specs]


def _convert_in_child(specs: list[BuildSpec], root: Path, on_progress, timeout_s: float | None, t0: float) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".logs").mkdir(exist_ok=True)
    name = specs[0].key if len(specs) == 1 else f"{specs[0].key}+{len(specs) - 1}"
    request = root / ".logs" / f"{name}.request.json"
    request.write_text(json.dumps({"specs": [s.to_json() for s in specs]}, indent=1))
    log_path = root / ".logs" / f"{name}.log"
    for s in specs if len(specs) > 1 else ():  # every key finds the shared log under its own name
        alias = root / ".logs" / f"{s.key}.log"
        alias.unlink(missing_ok=True)
        alias.symlink_to(log_path.name)
    cmd = [sys.executable, "-m", "analyzer.build.convert", str(request), str(root)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    what = specs[0].key if len(specs) == 1 else " + ".join(s.key for s in specs)
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=str(REPO_ROOT), bufsize=1, start_new_session=True)  # its own group: killpg
        last_error = ""
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if line.startswith(PROGRESS_PREFIX):
                    msg = json.loads(line[len(PROGRESS_PREFIX):])
                    if msg.get("error"):
                        last_error = msg["error"]
                    elif on_progress is not None:
                        on_progress(Progress(msg["fraction"], msg["stage"], msg["message"]))
                if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                    raise BuildError(f"build {what} timed out after {timeout_s:.0f} s; log: {log_path}")
            code = proc.wait()
        except BaseException:
            _kill_group(proc)
            raise
    unfinished = [s.key for s in specs if not is_complete(root / s.key)]
    if code != 0 or unfinished:
        reason = last_error or _last_line(log_path) or f"exit code {code}"
        raise BuildError(f"build {' + '.join(unfinished) or what} failed: {reason} (log: {log_path})")


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop a conversion child and the worker it may have started (same process group)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# ------------------------------------------------------------------------------------------------- reading

def list_builds(root: str | Path | None = None) -> list[dict[str, Any]]:
    """Finished builds, newest first: key, path and the analysis headline."""
    out = []
    for d in builds_dir(root).iterdir() if builds_dir(root).is_dir() else []:
        if d.name.startswith(".") or not is_complete(d):
            continue
        try:
            a = load_analysis(d)
        except QfoldError:
            continue
        out.append({"key": d.name, "path": str(d), "created": a.get("created", ""), "spec": a.get("spec", {}),
                    "summary": a.get("summary", {}), "build_mode": a.get("build_mode", MATERIALISED_MODE)})
    return sorted(out, key=lambda b: b["created"], reverse=True)


def queue(root: str | Path | None = None) -> list[dict[str, Any]]:
    """Conversions queued or running on this machine (from ``builds/.queue``; dead entries skipped)."""
    qdir = builds_dir(root) / ".queue"
    out = []
    for f in sorted(qdir.glob("*.json")) if qdir.is_dir() else []:
        try:
            entry = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if _pid_alive(int(entry.get("pid", -1))):
            out.append(entry)
    return sorted(out, key=lambda e: e.get("since", 0))


def load_bytes_per_token(path: str | Path) -> int:
    """Total logical bytes per decode token of a build folder, an analysis.json or any .mlpackage."""
    from analyzer.graph.record import load_program

    return int(load_program(path)[1]["bytes"]["bytes_per_token"]["total"])

def reanalyze_build(path: str | Path) -> dict[str, Any]:
    """Walk a build's saved package again and rewrite its analysis.json (summary, bytes, program), keeping
    spec, timings and equivalence: for builds made before the walker learned something new."""
    from analyzer.graph.mil import read_program
    from analyzer.graph.record import program_document

    build = Path(path)
    doc = load_analysis(build)
    if not (build / PACKAGE_NAME).is_dir():
        raise QfoldError(f"{build}: an {doc.get('build_mode', 'analysis')}-mode build keeps no .mlpackage to walk "
                         "again; build it again instead")
    fresh = program_document(read_program(build / PACKAGE_NAME))
    fresh["program"]["path"] = PACKAGE_NAME
    doc.update(fresh)
    write_json_atomic(build / ANALYSIS_FILE, doc, compact=True)
    return doc
