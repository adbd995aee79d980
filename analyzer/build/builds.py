"""Builds: one folder per content-hashed key under ``builds/``, made by a child process, reused when present.

Two build modes (:data:`BUILD_MODES`), part of the key: ``analysis`` converts with value-free weights (shapes and
dtypes, no values: ``analyzer.build.valuefree``) and keeps only the analysis; ``materialised`` converts real or
seeded random weights and keeps a runnable ``model.mlpackage``. Both give the same analysis, op for op.

A build folder holds ``analysis.json`` and ``build.log`` (and ``model.mlpackage`` when materialised). The child
(``python -m analyzer.build.convert``) writes into ``builds/.tmp-<key>-<pid>/`` and renames it into place only
when everything is written, so an interrupted build never leaves a folder that looks finished. Shared
state lives on disk with file locks (several Streamlit sessions and CLIs may build at once): one lock per
key (two requests for the same build wait for one conversion) and one machine-wide conversion lock
(a full-size materialised conversion needs ~15 GB: bench/results/full_size.json; analysis mode ~1-2 GB:
bench/results/fast.json), so further conversions queue.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.build.state import request_paths
from analyzer.errors import BuildError, QfoldError
from analyzer.graph.buildinfo import StoredSpec
from analyzer.graph.jsonfields import Field
from analyzer.graph.record import ANALYSIS_FILE, Analysis, read_analysis_file, write_analysis
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
    phase: str = "decode"  # what a call does: decode | prefill | decode+prefill (one package, two functions)
    q_len: int = 1  # prompt tokens per prefill call; 1 for decode
    build_mode: str = MATERIALISED_MODE  # the API default keeps a package; CLI, dashboard and sweep default to analysis

    def __post_init__(self) -> None:
        from analyzer.model.prefill import BUILD_PHASES
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
        if self.phase not in BUILD_PHASES:
            raise QfoldError(f"--phase {self.phase!r}: choose one of {', '.join(BUILD_PHASES)}")
        if isinstance(self.q_len, bool) or not isinstance(self.q_len, int):
            raise QfoldError(f"--q-len {self.q_len!r}: must be an integer")
        if self.phase == "decode" and self.q_len != 1:
            raise QfoldError(f"--q-len {self.q_len}: a decode build runs one token per call; "
                             "use --phase prefill or decode+prefill for q_len > 1")
        if self.phase != "decode" and not 2 <= self.q_len <= self.ctx:
            raise QfoldError(f"--q-len {self.q_len}: a prefill call takes 2 to ctx={self.ctx} prompt tokens")

    def fingerprint(self) -> dict[str, Any]:
        """Everything that changes the converted model or its analysis (a decode build's is what it was before
        prefill existed, so its key is unchanged)."""
        out = {
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
        if self.phase != "decode":
            out.update(phase=self.phase, q_len=self.q_len)
        return out

    @property
    def key(self) -> str:
        digest = hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:10]
        parts = [self.source.label, self.variant, self.kv_mode, f"ctx{self.ctx}"]
        if self.phase != "decode":
            parts.append(phase_label(self.phase, self.q_len))
        if self.compression:
            parts.append(_compression_label(self.compression, self.source.config_dict.get("num_hidden_layers", 0)))
        if self.build_mode == ANALYSIS_MODE:
            parts.append(ANALYSIS_MODE)
        return "-".join([*parts, digest])

    def stored(self) -> StoredSpec:
        """The spec as a build's analysis stores it."""
        return StoredSpec(self.source, self.variant, self.kv_mode, self.ctx, self.compression, self.equivalence_steps,
                          phase=self.phase, q_len=self.q_len, build_mode=self.build_mode)

    def to_json(self) -> dict[str, Any]:
        return self.stored().to_json()

    @classmethod
    def from_json(cls, d: Any, where: str = "build request") -> BuildSpec:
        return cls.from_stored(StoredSpec.from_json(Field(d, where)))

    @classmethod
    def from_stored(cls, s: StoredSpec) -> BuildSpec:
        return cls(s.source, s.variant, s.kv_mode, s.ctx, s.compression, s.equivalence_steps, s.phase, s.q_len,
                   s.build_mode)

    def for_phase(self, phase: str) -> BuildSpec:
        """The single-phase spec of one function of this build (``decode`` or ``prefill``)."""
        from dataclasses import replace

        return replace(self, phase=phase, q_len=1 if phase == "decode" else self.q_len)


def materialised_spec(spec: StoredSpec | BuildSpec) -> BuildSpec:
    """What exporting a runnable ``.mlpackage`` from an analysis (an analysis-mode build, or a shipped analysis)
    builds: the same spec with weight values. Its cost: ``analyzer.model.cost.estimate(..., "materialised")``."""
    from dataclasses import replace

    live = spec if isinstance(spec, BuildSpec) else BuildSpec.from_stored(spec)
    return replace(live, build_mode=MATERIALISED_MODE)


def phase_label(phase: str, q_len: int) -> str:
    """``prefill64`` / ``decode+prefill64``: a build key's phase part (decode builds have none)."""
    return f"{phase}{q_len}"


def _compression_label(canonical: str, num_layers: int) -> str:
    """The preset's name when the spec is one (``top8``), else ``custom``; the hash tells customs apart."""
    from analyzer.build.compress.spec import preset_of

    return preset_of(canonical, num_layers) or "custom"


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


def run_build(spec: BuildSpec, root: str | Path | None = None,
              on_progress: Callable[[Progress], None] | None = None,
              timeout_s: float | None = None, force_ctx: bool = False) -> BuildResult:
    """Return the build for ``spec``, converting it in a child process unless it already exists. A request
    that cannot work (absurd sizes, more memory than the limit, ctx past the model's positions unless
    ``force_ctx``) is refused here, before the child starts."""
    return run_builds([spec], root, on_progress, timeout_s, force_ctx)[0]


def run_builds(specs: list[BuildSpec] | tuple[BuildSpec, ...], root: str | Path | None = None,
               on_progress: Callable[[Progress], None] | None = None,
               timeout_s: float | None = None, force_ctx: bool = False) -> list[BuildResult]:
    """Return the builds for ``specs`` (in order), converting the missing ones in ONE child process: the two
    variants of an A/B share its process, its equivalence check and (analysis mode) one value-free model.
    Every missing build is checked against the cost model first (``analyzer.model.cost.check_request``)."""
    from analyzer.model.cost import check_request
    from analyzer.model.sources import load_config

    t0 = time.monotonic()
    root = builds_dir(root)
    if not specs:
        return []
    missing = [s for s in dict.fromkeys(specs) if not is_complete(root / s.key)]
    for s in missing:
        check_request(load_config(s.source), s.ctx, force_ctx=force_ctx, mode=s.build_mode)
    outcomes = _convert_in_child(missing, root, on_progress, timeout_s, t0) if missing else {}
    seconds = time.monotonic() - t0
    built = {k for k, outcome in outcomes.items() if outcome == "built"}
    return [BuildResult(s.key, root / s.key, s.key not in built, seconds if s.key in built else 0.0) for s in specs]


def _convert_in_child(specs: list[BuildSpec], root: Path, on_progress, timeout_s: float | None,
                      t0: float) -> dict[str, str]:
    """Convert ``specs`` in one child; returns key → "built" or "reused" (an identical request elsewhere may
    have finished a build while this one waited for its key lock)."""
    root.mkdir(parents=True, exist_ok=True)
    name = specs[0].key if len(specs) == 1 else f"{specs[0].key}+{len(specs) - 1}"
    request, log_path = request_paths(root, name)
    request.write_text(json.dumps({"specs": [s.to_json() for s in specs]}, indent=1))
    cmd = [sys.executable, "-m", "analyzer.build.convert", str(request), str(root)]
    what = specs[0].key if len(specs) == 1 else " + ".join(s.key for s in specs)
    outcomes = run_child(what, cmd, log_path, on_progress, timeout_s, t0)
    unfinished = [s.key for s in specs if not is_complete(root / s.key)]
    if unfinished:
        raise BuildError(f"build {' + '.join(unfinished)} failed: the conversion ended without a finished build "
                         f"(log: {log_path})")
    return {s.key: outcomes.get(s.key, "built") for s in specs}


def run_child(what: str, cmd: list[str], log_path: Path, on_progress: Callable[[Progress], None] | None = None,
              timeout_s: float | None = None, t0: float | None = None) -> dict[str, str]:
    """Run the conversion child ``cmd`` (building ``what``), relaying its progress; returns what it did per key
    (``{"result": "built"|"reused", "key": K}`` lines). The child runs in its own session, so a timeout or an
    interrupt stops it and every process it started (the equivalence worker); the timeout holds even while the
    child prints nothing (its output is read by a thread)."""
    import queue as queue_mod
    import threading

    t0 = time.monotonic() if t0 is None else t0
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    lines: queue_mod.Queue[str | None] = queue_mod.Queue()
    last_error, outcomes = "", {}
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=str(REPO_ROOT), bufsize=1, start_new_session=True)
        assert proc.stdout is not None

        def pump(stream=proc.stdout) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True, name="qfold-build").start()
        try:
            while True:
                wait = None if timeout_s is None else max(0.0, t0 + timeout_s - time.monotonic())
                try:
                    line = lines.get(timeout=wait)
                except queue_mod.Empty:
                    raise BuildError(f"build {what} timed out after {timeout_s:.0f} s; log: {log_path}") from None
                if line is None:
                    break
                log.write(line)
                log.flush()
                if not line.startswith(PROGRESS_PREFIX):
                    continue
                try:
                    msg = json.loads(line[len(PROGRESS_PREFIX):])
                except json.JSONDecodeError:
                    continue
                if msg.get("error"):
                    last_error = msg["error"]
                elif msg.get("result"):
                    outcomes[str(msg.get("key", ""))] = msg["result"]
                elif on_progress is not None:
                    on_progress(Progress(msg["fraction"], msg["stage"], msg["message"]))
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
    if code != 0:
        reason = last_error or _last_line(log_path) or f"exit code {code}"
        raise BuildError(f"build {what} failed: {reason} (log: {log_path})")
    return outcomes


def _stop(proc: subprocess.Popen) -> None:
    """Kill a conversion child and everything it started (its own process group)."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# ------------------------------------------------------------------------------------------------- reading
def list_builds(root: str | Path | None = None) -> list[Analysis]:
    """Finished builds, newest first (a folder whose analysis cannot be read is left out)."""
    out = []
    folder = builds_dir(root)
    for d in folder.iterdir() if folder.is_dir() else []:
        if d.name.startswith(".") or not is_complete(d):
            continue
        try:
            analysis = read_analysis_file(d)
        except QfoldError:
            continue
        if analysis.build is not None:
            out.append(analysis)
    return sorted(out, key=lambda a: a.build.created if a.build else "", reverse=True)


def build_folder(analysis: Analysis) -> Path:
    """The build folder an analysis was read from."""
    return Path(analysis.file).parent


def load_bytes_per_token(path: str | Path) -> int:
    """Total logical bytes per decode token of a build folder, an analysis.json or any .mlpackage."""
    from analyzer.graph.record import load_analysis

    return load_analysis(path).bytes_per_token.total


def reanalyze(path: str | Path) -> Analysis:
    """Rewrite an analysis with this version's walker: a build folder's saved package is walked again; an
    ``analysis.json`` without a package (a shipped one, or an analysis-mode build, which keeps none) has its
    stored ops' facts derived again (schema migration). Build metadata (spec, timings, equivalence) is kept."""
    from dataclasses import replace

    from analyzer.graph.mil import read_program
    from analyzer.graph.record import function_analysis_files

    p = Path(path)
    file = p / ANALYSIS_FILE if p.is_dir() else p
    package = file.parent / PACKAGE_NAME
    for f in function_analysis_files(p) if p.is_dir() else (file,):  # every function of a multi-function build
        old = read_analysis_file(f)
        if p.is_dir() and package.is_dir():
            fresh = replace(old, program=replace(read_program(package, old.function), path=PACKAGE_NAME))
        else:
            fresh = old
        write_analysis(f, fresh)
    return read_analysis_file(file)
