"""Run a ``.aimodel`` on Apple's Core AI runtime (``coreai-core``), always in a child process: the client side.

The runtime is native code that segfaults on a bad asset (the probe saw it on a ``.mlpackage`` renamed
``.aimodel``), so qfold never calls it in its own process and never hands it a path that
:func:`~analyzer.ir.coreai.asset.check_asset` has not checked. One :class:`CoreAIRuntime` owns one child, the server
side (:mod:`analyzer.engines.coreai.runtime_child`: it keeps the loaded models between requests); the parent talks
to it over a socket pair, in that module's messages. A child that dies mid-request is one line:
``<asset>: the Core AI runtime crashed (signal 11) while <what>``; the child's stdout and stderr go to a log file,
whose last line a crash report quotes.

A :class:`LoadedModel` answers like qfold's MIL interpreter (``inputs``/``states``/``outputs`` as
:class:`~analyzer.ir.mil_records.TensorInfo` with qfold dtype names, ``run(inputs, states) -> RunResult``),
so :func:`analyzer.engines.interpret.decode_steps` drives N stateful decode steps on either. The Linux runtime is
CPU-only and single-threaded; :meth:`LoadedModel.profile` gives per-op times with each op's ``coreai`` op id.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from analyzer.engines.coreai.runtime_child import FUNCTION, recv, send
from analyzer.engines.interpret.executor import RunResult
from analyzer.errors import CoreAIRuntimeError
from analyzer.ir.coreai.asset import ASSET_SUFFIX, check_asset, looks_like_asset
from analyzer.ir.coreai.native_child import asset_bytes, child_limit
from analyzer.ir.mil_records import TensorInfo, tensor_nbytes

# The runtime's dtype names (NDArray descriptors) → qfold's (MIL) names, and back.
QFOLD_DTYPES = {"float16": "fp16", "float32": "fp32", "float64": "fp64", "int8": "int8", "int16": "int16",
                "int32": "int32", "int64": "int64", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
                "bool": "bool"}
NP_NAMES = {v: k for k, v in QFOLD_DTYPES.items()}
# How close the runtime must come to another engine on the same weights, as a fraction of max |logit|. fp32: the
# probe measured 1.8e-5 against torch (probe/coreai/RESULTS.md, Q4). fp16: the Linux runtime accumulates fp16
# matmuls in fp16 (ones·ones over K = 4096 gives 2048, torch 4096), so fp16 logits sit ~1e-2 from fp32 math where
# torch's fp16 sits ~2e-3 (Q4: 0.0104-0.0129 of logits up to 1.2): 3e-2 leaves room for that, no more.
FP32_TOLERANCE = 1e-4
FP16_TOLERANCE = 3e-2
POLL_S = 0.2  # how often a waiting parent checks that the child is still alive
# A runtime call's time per GB it reads (the asset's weights, the states): the 2-layer fp32 asset of
# bench/results/coreai.json ("attention", ctx 2048, repeat_kv: 117 ms a decode step for ~25 MB) → ~5 s per GB, the
# single-threaded CPU runtime's pace. Each request's limit is native_child's (fixed + 20x the estimate).
RUNTIME_SECONDS_PER_GB = 5.0


@dataclass(frozen=True, slots=True)
class OpTime:
    """Profiled time of one program op over the profiled calls: ``coreai_op_id`` from the asset's debug
    information (None for runtime-internal events such as ``NDArray.copy`` without one)."""

    event: str  # "call.coreai.broadcast_in_dims", "call.NDArray.copy", ...
    coreai_op_id: int | None
    time_ns: int
    count: int


@dataclass(frozen=True, slots=True)
class Profile:
    """One profiled stretch of decode calls: per-op times and the runtime's own total per call."""

    calls: int
    execute_ns: int  # "Function Execute" events: the runtime's time for the calls themselves
    ops: tuple[OpTime, ...]


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock seconds per round of ``steps`` decode calls, for each loaded model (interleaved rounds)."""

    steps: int
    warmup: int
    round_s: dict[int, tuple[float, ...]] = field(default_factory=dict)  # model id → seconds per round


def asset_in(path: str | Path) -> Path | None:
    """The checked asset ``path`` names: an ``.aimodel`` itself, or the one a build folder holds; None when
    ``path`` is neither (a Core ML package or its build folder)."""
    p = Path(path)
    if looks_like_asset(p):
        return check_asset(p)
    found = sorted(p.glob(f"*{ASSET_SUFFIX}")) if p.is_dir() else []
    if len(found) > 1:
        raise CoreAIRuntimeError(f"{p}: holds {len(found)} Core AI assets ({', '.join(f.name for f in found)}); "
                                 "name one")
    return check_asset(found[0]) if found else None


# ------------------------------------------------------------------------------------------------ the parent
class CoreAIRuntime:
    """The child process hosting Core AI models. Use as a context manager; :meth:`load` checks and loads."""

    def __init__(self) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="qfold-coreai-", suffix=".log", delete=False)
        parent, child = socket.socketpair()
        root = str(Path(__file__).resolve().parents[3])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        cmd = [sys.executable, "-m", "analyzer.engines.coreai.runtime_child", str(child.fileno())]
        self._proc = subprocess.Popen(cmd, pass_fds=[child.fileno()], stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=env)
        child.close()
        self._conn = Connection(parent.detach())
        self._models: list[LoadedModel] = []

    def __enter__(self) -> CoreAIRuntime:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                send(self._conn, {"op": "close"})
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._conn.close()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def request(self, header: dict, arrays: dict[str, np.ndarray] | None, what: str, where: str,
                limit: tuple[float, str]) -> tuple[dict, dict[str, np.ndarray]]:
        """One request to the child, answered within ``limit`` (seconds, how they were set: scaled to the request's
        work); its death, its error or its silence past the limit (the child is then stopped) is a
        :class:`CoreAIRuntimeError` naming ``where``."""
        deadline = time.monotonic() + limit[0]
        try:
            send(self._conn, header, arrays)
            while not self._conn.poll(POLL_S):
                if self._proc.poll() is not None:
                    break
                if time.monotonic() > deadline:
                    self._proc.kill()
                    self._proc.wait()
                    raise CoreAIRuntimeError(f"{where}: the Core AI runtime did not answer within {limit[0]:.0f} s "
                                             f"(its limit, {limit[1]}) while {what}; stopped")
            reply, out = recv(self._conn)
        except (EOFError, OSError):
            raise CoreAIRuntimeError(f"{where}: the Core AI runtime {self._death()} while {what}"
                                     f"{self._last_log_line()}") from None
        if "error" in reply:
            raise CoreAIRuntimeError(f"{where}: {reply['error']}")
        return reply, out

    def _death(self) -> str:
        try:
            code = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            try:
                return f"crashed ({signal.Signals(-code).name})"
            except ValueError:
                return f"crashed (signal {-code})"
        return f"exited with status {code}"

    def _last_log_line(self) -> str:
        lines = [ln for ln in Path(self._log.name).read_text(errors="replace").splitlines()
                 if ln.strip() and "Loading function" not in ln]
        return f"; last output: {lines[-1].strip()[:200]}" if lines else ""

    def load(self, path: str | Path, compute_units: str | None = None) -> LoadedModel:
        """Check ``path`` is a Core AI asset, then load its ``main`` function in the child. ``compute_units``
        (:data:`COMPUTE_UNITS`): the specialisation the runtime is asked for; None or ``cpu`` on Linux, whose
        runtime has only the CPU (:func:`check_compute_units`)."""
        asset = check_asset(path)
        check_compute_units(compute_units)
        size = asset_bytes(asset)
        header = {"op": "load", "path": str(asset), **({"compute_units": compute_units} if compute_units else {})}
        reply, _ = self.request(header, None, "loading it", str(asset), child_limit(size))
        model = LoadedModel(self, reply["id"], asset, *(tuple(_tensor(t) for t in reply[k])
                                                        for k in ("inputs", "states", "outputs")))
        model.call_bytes = size + sum(t.nbytes for t in model.states)
        self._models.append(model)
        return model

    def memory(self) -> tuple[int, int] | None:
        """The child's resident set and its peak so far (``VmRSS``, ``VmHWM`` of /proc/PID/status), in bytes;
        None where there is no /proc (macOS)."""
        try:
            text = Path(f"/proc/{self._proc.pid}/status").read_text()
        except OSError:
            return None
        kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in text.splitlines() if ln.startswith(("VmRSS", "VmHWM"))}
        return (kb["VmRSS"] * 1024, kb["VmHWM"] * 1024) if len(kb) == 2 else None

    def reset_peak(self) -> bool:
        """Reset the child's peak resident set to its current one (Linux ≥ 4.0: ``5`` written to
        /proc/PID/clear_refs, proc(5)), so the next :meth:`memory` peak belongs to what ran since."""
        try:
            Path(f"/proc/{self._proc.pid}/clear_refs").write_text("5")
            return True
        except OSError:
            return False

    def time_decode(self, models: list[LoadedModel], feeds: dict[int, list[dict[str, np.ndarray]]], rounds: int,
                    warmup: int) -> Timing:
        """``rounds`` interleaved rounds: in each, every model runs its feed (one dict of inputs per decode step)
        from zeroed states; seconds per round are measured in the child around the calls only."""
        arrays = {f"{m.id}/{i}/{k}": v for m in models for i, feed in enumerate(feeds[m.id]) for k, v in feed.items()}
        steps = {len(feeds[m.id]) for m in models}
        if len(steps) != 1:
            raise CoreAIRuntimeError(f"every model needs the same number of decode steps, got {sorted(steps)}")
        n = steps.pop()
        work = (rounds + warmup) * n * sum(m.call_bytes for m in models)
        reply, _ = self.request({"op": "time", "ids": [m.id for m in models], "steps": n,
                                 "rounds": rounds, "warmup": warmup}, arrays, "timing decode steps",
                                ", ".join(str(m.path) for m in models), child_limit(work, RUNTIME_SECONDS_PER_GB))
        return Timing(reply["steps"], warmup, {int(k): tuple(v) for k, v in reply["round_s"].items()})


# What ``--compute-units`` may ask the runtime for: Core AI's ComputeUnitKind (coreai-core 1.0.0b3,
# coreai/runtime/__init__.pyi: cpu, gpu, neural_engine) or the runtime's own choice. Only macOS's Core AI specialises
# (``SpecializationOptions``, USE_OS_COREAI=1); the Linux runtime has the CPU only, single-threaded.
COMPUTE_UNITS = ("cpu", "gpu", "neural_engine", "default")


def check_compute_units(units: str | None, platform: str = sys.platform) -> None:
    """Refuse what this platform's runtime cannot do, before anything loads."""
    if units is None:
        return
    if units not in COMPUTE_UNITS:
        raise CoreAIRuntimeError(f"--compute-units {units!r}: choose one of {', '.join(COMPUTE_UNITS)}")
    if units != "cpu" and not platform.startswith("darwin"):
        raise CoreAIRuntimeError(f"--compute-units {units}: Apple's Core AI runtime on {platform} runs on the CPU "
                                 "only (single-threaded; no GPU or Neural Engine specialisation); give cpu, or bench "
                                 "on a Mac (macOS 27, USE_OS_COREAI=1)")


def _tensor(t: dict) -> TensorInfo:
    dtype = QFOLD_DTYPES.get(t["dtype"], t["dtype"])
    shape = tuple(int(d) for d in t["shape"])
    return TensorInfo(t["name"], shape, dtype, tensor_nbytes(shape, dtype))


@dataclass
class LoadedModel:
    """One asset's ``main`` function, loaded in the runtime's child; runs like qfold's MIL interpreter."""

    runtime: CoreAIRuntime
    id: int
    path: Path
    inputs: tuple[TensorInfo, ...]
    states: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    function: str = FUNCTION
    call_bytes: int = 0  # what one call reads at most: the asset's files and the states (a request's time limit)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    def run(self, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray] | None = None) -> RunResult:
        """One call. ``inputs``: one array per input (cast to the declared dtype); ``states``: initial values
        (default zeros; not modified). Returns outputs and the states after the call."""
        arrays = {f"in/{k}": v for k, v in _checked(inputs, self.inputs, "input", self.path).items()}
        arrays.update({f"state/{k}": v for k, v in _checked(states or {}, self.states, "state", self.path,
                                                              partial=True).items()})
        _, out = self.runtime.request({"op": "run", "id": self.id}, arrays, "running it", str(self.path),
                                      child_limit(self.call_bytes, RUNTIME_SECONDS_PER_GB))
        return RunResult({k[4:]: v for k, v in out.items() if k.startswith("out/")},
                         {k[6:]: v for k, v in out.items() if k.startswith("state/")})

    def profile(self, feed: list[dict[str, np.ndarray]]) -> Profile:
        """Run ``feed`` (one input dict per decode step, from zeroed states) once more with the runtime's
        profiler on (after one unprofiled pass), summing each op's time over the calls."""
        arrays = {f"{i}/{k}": v for i, step in enumerate(feed) for k, v in step.items()}
        reply, _ = self.runtime.request({"op": "profile", "id": self.id, "steps": len(feed)}, arrays,
                                        "profiling it", str(self.path),
                                        child_limit(2 * len(feed) * self.call_bytes, RUNTIME_SECONDS_PER_GB))
        ops = tuple(OpTime(e, c, int(t), int(n)) for e, c, t, n in reply["ops"])
        return Profile(len(feed), int(reply["execute_ns"]), ops)


def _checked(values: dict[str, np.ndarray], declared: tuple[TensorInfo, ...], what: str, path: Path,
             partial: bool = False) -> dict[str, np.ndarray]:
    """Arrays cast to their declared dtype, or a one-line error for a missing, extra or wrong-shape one."""
    by_name = {t.name: t for t in declared}
    extra = sorted(set(values) - set(by_name))
    if extra:
        raise CoreAIRuntimeError(f"{path}: {extra[0]!r} is not a{'n' if what == 'input' else ''} {what} "
                                 f"(expected: {', '.join(by_name) or 'none'})")
    missing = [n for n in by_name if n not in values]
    if missing and not partial:
        raise CoreAIRuntimeError(f"{path}: missing {what} {missing[0]!r}")
    out = {}
    for name, value in values.items():
        t = by_name[name]
        arr = np.asarray(value)
        if arr.shape != t.shape:
            raise CoreAIRuntimeError(f"{path}: {what} {name!r} has shape {list(arr.shape)}, the asset declares "
                                     f"{list(t.shape)}")
        if arr.dtype.kind not in "biuf":
            raise CoreAIRuntimeError(f"{path}: {what} {name!r} has dtype {arr.dtype}, not a number")
        out[name] = np.ascontiguousarray(arr, dtype=np.dtype(NP_NAMES.get(t.dtype, t.dtype)))
    return out
