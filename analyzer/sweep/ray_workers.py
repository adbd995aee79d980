"""Where a sweep's builds run: the Ray session (local in-process cluster, or ``--address``), the worker task that
builds one point in a scratch folder and sends back its analysis and log as text (analyzer.sweep.driver explains
why), and the driver's side, ``RayBuilds``, which submits points, follows their progress and stores what comes back."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import analyzer
from analyzer.analysis.record import ANALYSIS_FILE
from analyzer.convert.builds_folder import key_lock, tmp_folder
from analyzer.convert.launch import LOG_FILE, is_complete, run_build
from analyzer.errors import QfoldError
from analyzer.model.spec import BuildSpec
from analyzer.sweep.grid import SweepError
from analyzer.sweep.table import SweepRow, finished_row


# ------------------------------------------------------------------------------------------------- the worker
def _scratch_base() -> Path:
    return Path(os.environ.get("QFOLD_SWEEP_SCRATCH") or Path(tempfile.gettempdir()) / "qfold-sweep")


def build_on_worker(spec_json: dict[str, Any], driver_host: str, driver_equivalence: str,
                    progress=None) -> dict[str, Any]:
    """The Ray task: one ``run_build`` in a scratch folder of this host; returns the analysis and log as text.

    Never raises for a failed build: the error travels back as ``{"error": ...}`` so the driver keeps the rest.
    """

    host = socket.gethostname()
    t0 = time.monotonic()
    spec = BuildSpec.from_json(spec_json)
    base = _scratch_base()
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="task-", dir=base))
    same_host = host == driver_host and Path(driver_equivalence).parent.is_dir()
    shared_equivalence = Path(driver_equivalence) if same_host else base / ".equivalence"
    try:
        shared_equivalence.mkdir(parents=True, exist_ok=True)
        (root / ".equivalence").symlink_to(shared_equivalence, target_is_directory=True)

        def on_progress(p) -> None:
            if progress is not None:
                try:  # fire and forget: Queue.put_nowait waits in ray.get, and a task blocked there lends its CPU to
                    # the scheduler, which then starts one more conversion than there are CPUs (seen: 3 on 2)
                    progress.actor.put_nowait.remote((spec_json["_point"], p.fraction, p.stage, p.message))
                except Exception:  # a closed progress queue must never fail the build
                    pass

        result = run_build(spec, root, on_progress=on_progress)
        return {"key": result.key, "host": host, "seconds": time.monotonic() - t0,
                "analysis": (result.path / ANALYSIS_FILE).read_text(encoding="utf-8"),
                "log": (result.path / LOG_FILE).read_text(encoding="utf-8", errors="replace")}
    except QfoldError as e:
        return {"key": spec.key, "host": host, "seconds": time.monotonic() - t0, "error": str(e)}
    except Exception as e:  # anything else is still one failed point, reported, not a dead sweep
        return {"key": spec.key, "host": host, "seconds": time.monotonic() - t0,
                "error": f"{type(e).__name__}: {e}"[:500]}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def store_analysis(root: Path, key: str, analysis_text: str, log_text: str) -> Path:
    """Write a shipped-back analysis into ``root/<key>/`` the way a build finishes: into ``.tmp-<key>-<pid>``, then
    one rename, under the build's key lock. An existing finished build wins (it is identical by key)."""

    final = root / key
    try:
        doc = json.loads(analysis_text)
    except json.JSONDecodeError as e:
        raise SweepError(f"build {key}: the worker sent an analysis that is not JSON ({e.msg})") from e
    if doc.get("key") != key:
        raise SweepError(f"build {key}: the worker built {doc.get('key')!r}; its tool versions differ from the "
                         "driver's (the key hashes them): install the same versions on every node")
    with key_lock(root, key):
        if is_complete(final):
            return final
        tmp = tmp_folder(root, key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            (tmp / ANALYSIS_FILE).write_text(analysis_text, encoding="utf-8")
            (tmp / LOG_FILE).write_text(log_text, encoding="utf-8")
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


# ------------------------------------------------------------------------------------------------- Ray
@dataclass(frozen=True, slots=True)
class RayOptions:
    address: str | None = None  # None: a local cluster started in-process
    num_cpus: int | None = None  # local cluster only (default: all cores)
    memory_bytes: int | None = None  # local cluster only: the schedulable memory (default: Ray's estimate)
    object_store_bytes: int = 200 * 2**20  # local cluster only: analyses are small


def _runtime_env(address: str | None) -> dict[str, Any]:
    """Workers must import this ``analyzer``: a local cluster shares the disk (PYTHONPATH); a remote one gets
    the package uploaded (``py_modules``)."""

    package = Path(analyzer.__file__).resolve().parent
    scratch = {"QFOLD_SWEEP_SCRATCH": os.environ["QFOLD_SWEEP_SCRATCH"]} if "QFOLD_SWEEP_SCRATCH" in os.environ else {}
    if address:
        return {"py_modules": [str(package)], "env_vars": scratch}
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    return {"env_vars": {"PYTHONPATH": path, **scratch}}


LOCAL_START_ATTEMPTS = 3
"""Ray waits a fixed 30 s for a new raylet to register (ray/_private/node.py, Ray 2.60); on a loaded machine that
can run out, so a local cluster is started again, up to this many times, before the sweep gives up."""


CONNECT_TIMEOUT_S = 5.0
# RFC 9113 §3.4: the client connection preface, then an empty SETTINGS frame (length 0, type 4, flags 0, stream 0)
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HTTP2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
RAY_CLIENT_INSTALL = 'pip install -r requirements.txt "ray[client]==2.60.0"'


def check_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse an address Ray could only time out on (30-45 s, then a Ray traceback): not HOST:PORT, a
    ``ray://`` address without the Ray Client's grpcio, or a head that does not accept a TCP connection within
    ``timeout_s``. ``auto`` (a cluster on this machine) is left to Ray."""
    if address == "auto":
        return
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SweepError(f"--address {address!r}: expected HOST:PORT (a cluster's GCS, e.g. head:6379), "
                         "ray://HOST:PORT (Ray Client, e.g. ray://head:10001) or auto")
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise SweepError(f"--address {address}: the Ray Client needs ray[client] (grpcio); install it with: "
                         f"{RAY_CLIENT_INSTALL}")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as conn:
            conn.sendall(_HTTP2_PREFACE + _HTTP2_SETTINGS)  # both Ray endpoints are gRPC: HTTP/2 servers
            head = conn.recv(9)
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise SweepError(f"cannot reach the Ray cluster at {address}: {why} (tried for {timeout_s:g} s); is its "
                         "head node running and the port open?") from None
    if len(head) < 9 or head[3] != 0x04:  # a server's first frame is its SETTINGS (RFC 9113 §3.4)
        raise SweepError(f"{address} accepts connections but is not a Ray endpoint (no gRPC/HTTP/2 answer within "
                         f"{timeout_s:g} s): a GCS address (head:6379) or a Ray Client one (ray://head:10001)?")


# Ray itself tries an address that answers HTTP/2 but is no Ray cluster (a proxy) for 20-35 s (ray/_private/node.py
# NUM_REDIS_GET_RETRIES for a GCS address; ray/util/client/worker.py's backoff for a Ray Client one). A sweep
# waits for the connection this long, then says so; the connection attempt is left to finish in the background.
CONNECT_DEADLINE_S = 15.0


def _init_within(ray, kwargs: dict[str, Any], address: str, deadline_s: float = CONNECT_DEADLINE_S) -> None:
    outcome: dict[str, BaseException | None] = {}

    def connect() -> None:
        try:
            ray.init(**kwargs)
            outcome["error"] = None
        except BaseException as e:  # handed to the caller's thread
            outcome["error"] = e

    quiet = logging.getLogger("ray")  # "SIGTERM handler is not set because current thread is not the main thread"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    thread = threading.Thread(target=connect, name="qfold-ray-connect", daemon=True)
    thread.start()
    thread.join(deadline_s)
    quiet.setLevel(level)
    if "error" not in outcome:
        raise SweepError(f"cannot start Ray on {address}: no Ray cluster answered within {deadline_s:g} s (is it a "
                         "GCS address, head:6379, or a Ray Client one, ray://head:10001?)")
    if outcome["error"] is not None:
        raise outcome["error"]


@contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """Connect to (or start) Ray for the sweep; shut down only what this call started."""
    if options.address:
        check_address(options.address)  # before Ray is imported or waits
    import ray

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False,
                                      runtime_env=_runtime_env(options.address), ignore_reinit_error=True)
        if options.address:
            kwargs["address"] = options.address
        else:
            kwargs.update(num_cpus=options.num_cpus, object_store_memory=options.object_store_bytes)
            if options.memory_bytes:
                kwargs["_memory"] = options.memory_bytes
        for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
            try:
                if options.address:
                    _init_within(ray, kwargs, options.address)
                else:
                    ray.init(**kwargs)
                break
            except SweepError:
                raise
            except Exception as e:  # ConnectionError, RuntimeError: one line, not a Ray traceback
                ray.shutdown()  # whatever half-started before the failure
                slow_start = "timed out during startup" in str(e) and not options.address
                if slow_start and attempt < LOCAL_START_ATTEMPTS:
                    continue
                where = options.address or "a local cluster"
                raise SweepError(f"cannot start Ray on {where}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def largest_node_memory(ray) -> int:
    sizes = [int(n["Resources"].get("memory", 0)) for n in ray.nodes() if n.get("Alive")]
    return max(sizes, default=0)


# ------------------------------------------------------------------------------------------------- the driver
def equivalence_groups(specs: Sequence[BuildSpec]) -> list[list[int]]:
    """Indices of ``specs`` grouped by what the conversion's equivalence check depends on: everything in the
    build's fingerprint but the variant, the compression and the build mode (``analyzer.convert.checks``:
    it runs on a reduced model of the same geometry)."""
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        fingerprint = {k: v for k, v in spec.fingerprint().items()
                       if k not in ("variant", "compression", "build_mode")}
        groups.setdefault(json.dumps(fingerprint, sort_keys=True), []).append(i)
    return list(groups.values())


class RayBuilds:
    """Converts points on Ray, starting the session (a local in-process cluster, or ``--address``) only when there
    is something to convert, and keeping it for later batches."""

    def __init__(self, plans: Sequence[Any], rows: list[SweepRow], root: Path, profile, options: RayOptions,
                 emit, settle) -> None:
        self.plans, self.rows, self.root, self.profile, self.options = plans, rows, root, profile, options
        self.emit, self.settle = emit, settle
        self.used = False
        self._stack = ExitStack()
        self._ray = self._queue = self._task = None
        self._capacity = 0

    def __enter__(self) -> RayBuilds:
        return self

    def __exit__(self, *exc) -> None:
        if self._queue is not None:
            try:
                self._ray.kill(self._queue.actor)
            except Exception:
                pass
        self._stack.close()

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / ".equivalence").mkdir(exist_ok=True)
        ray = self._ray = self._stack.enter_context(ray_session(self.options))
        from ray.util.queue import Queue

        self.used = True
        self._capacity = largest_node_memory(ray)
        self._task = ray.remote(num_cpus=1, max_retries=0)(build_on_worker)
        self._queue = Queue(actor_options={"num_cpus": 0})

    def build(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        if self._ray is None:
            self._start()
        ray, plans, rows = self._ray, self.plans, self.rows
        where = self.options.address or f"local Ray, {int(ray.cluster_resources().get('CPU', 0))} CPUs"
        self.emit(message=f"converting {len(indices)} points on {where}")
        pending: dict[Any, int] = {}

        def submit(i: int) -> None:
            plan = plans[i]
            memory = plan.memory_bytes
            if self._capacity and memory > self._capacity:
                self.emit(message=f"{plan.row.point.describe()}: needs ~{memory / 1e9:.1f} GB, more than the "
                                  f"largest node's {self._capacity / 1e9:.1f} GB schedulable memory; it takes a "
                                  "whole node")
                memory = self._capacity
            payload = {**plan.spec.to_json(), "_point": i}
            ref = self._task.options(memory=memory).remote(payload, socket.gethostname(),
                                                           str(self.root / ".equivalence"), self._queue)
            pending[ref] = i
            rows[i] = replace(plan.row, memory_bytes=plan.memory_bytes, stage="queued")

        # The first point of each equivalence group goes first; the rest follow when it is done, so the torch
        # equivalence check (shared by every variant and compression of a source, KV mode and ctx) runs once.
        followers: dict[int, list[int]] = {}
        for group in equivalence_groups([plans[i].spec for i in indices]):
            leader, *rest = (indices[j] for j in group)
            followers[leader] = rest
            submit(leader)
        self.emit(message="submitted")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            while not self._queue.empty():
                try:
                    i, _fraction, stage, message = self._queue.get_nowait()
                except Exception:
                    break
                if rows[i].status in ("pending", "running"):
                    self.settle(i, replace(rows[i], status="running", stage=f"{stage}: {message}"[:200]))
            for ref in ready:
                i = pending.pop(ref)
                self.settle(i, _collect(ray, ref, rows[i], self.root, self.profile))
                for j in followers.pop(i, ()):
                    submit(j)


def _collect(ray, ref, row: SweepRow, root: Path, profile) -> SweepRow:
    try:
        out = ray.get(ref)
    except Exception as e:  # RayTaskError, WorkerCrashedError, OutOfMemoryError: this point only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return replace(row, status="failed", error=f"{type(e).__name__}: {first}"[:500], stage="ray")
    row = replace(row, host=out.get("host", ""), seconds=float(out.get("seconds", 0.0)))
    if "error" in out:
        return replace(row, status="failed", error=out["error"], stage="build")
    try:
        final = store_analysis(root, row.key, out["analysis"], out["log"])
        return finished_row(replace(row, status="built"), final, profile)
    except (QfoldError, OSError, KeyError, ValueError) as e:
        return replace(row, status="failed", error=str(e), stage="store")
