"""Where a sweep's builds run: the Ray session (local in-process cluster, or ``--address``) and the worker task
that builds one point in a scratch folder and sends back its analysis and log as text (analyzer.device.sweep
explains why)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.build.builds import LOG_FILE, BuildSpec, is_complete
from analyzer.device.sweep_spec import SweepError
from analyzer.errors import QfoldError
from analyzer.graph.record import ANALYSIS_FILE


# ------------------------------------------------------------------------------------------------- the worker
def _scratch_base() -> Path:
    return Path(os.environ.get("QFOLD_SWEEP_SCRATCH") or Path(tempfile.gettempdir()) / "qfold-sweep")


def build_on_worker(spec_json: dict[str, Any], driver_host: str, driver_equivalence: str,
                    progress=None) -> dict[str, Any]:
    """The Ray task: one ``run_build`` in a scratch folder of this host; returns the analysis and log as text.

    Never raises for a failed build: the error travels back as ``{"error": ...}`` so the driver keeps the rest.
    """
    from analyzer.build.builds import run_build

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
                try:
                    progress.put_nowait((spec_json["_point"], p.fraction, p.stage, p.message))
                except Exception:  # a full or closed progress queue must never fail the build
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
    from filelock import FileLock

    final = root / key
    try:
        doc = json.loads(analysis_text)
    except json.JSONDecodeError as e:
        raise SweepError(f"build {key}: the worker sent an analysis that is not JSON ({e.msg})") from e
    if doc.get("key") != key:
        raise SweepError(f"build {key}: the worker built {doc.get('key')!r}; its tool versions differ from the "
                         "driver's (the key hashes them): install the same versions on every node")
    (root / ".locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".locks" / f"{key}.lock")):
        if is_complete(final):
            return final
        tmp = root / f".tmp-{key}-{os.getpid()}"
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
    import analyzer

    package = Path(analyzer.__file__).resolve().parent
    scratch = {"QFOLD_SWEEP_SCRATCH": os.environ["QFOLD_SWEEP_SCRATCH"]} if "QFOLD_SWEEP_SCRATCH" in os.environ else {}
    if address:
        return {"py_modules": [str(package)], "env_vars": scratch}
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    return {"env_vars": {"PYTHONPATH": path, **scratch}}


LOCAL_START_ATTEMPTS = 3
"""Ray waits a fixed 30 s for a new raylet to register (ray/_private/node.py, Ray 2.60); on a loaded machine that
can run out, so a local cluster is started again, up to this many times, before the sweep gives up."""


@contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """Connect to (or start) Ray for the sweep; shut down only what this call started."""
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
                ray.init(**kwargs)
                break
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


