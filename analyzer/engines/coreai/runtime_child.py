"""The Core AI runtime's server side: the child process a :class:`~analyzer.engines.coreai.runtime.CoreAIRuntime`
starts (``python -m analyzer.engines.coreai.runtime_child FD``), and the messages both sides exchange.

The child imports coreai-core (native code that segfaults on a bad asset, hence a process of its own), keeps the
loaded models between requests and answers load / run / time / profile / close until the parent closes the socket.
A message is one JSON header and one ``.npz`` body (arrays are read back with ``allow_pickle=False``; nothing is
pickled either way). A request the runtime fails is answered ``{"error": ...}`` and the child keeps serving; a
crash ends the process, which the parent reports (:mod:`analyzer.engines.coreai.runtime`).

Facts the calls rely on (probe/coreai/RESULTS.md, Q4/Q6): a stateful call is ``await fn(inputs=..., state=
{name: NDArray})`` and the runtime writes the states in place; ``NDArray.from_descriptor`` is uninitialised, so
states are built from NumPy zeros; ``executable()`` lowers the program on every load; it prints "ODIE ... Loading
function" on stdout. Per-op times come from ``load_function("main", profiler=Profiler(on_log_event_begin=...,
on_log_event_end=...))``: event ids ``call.coreai.<op>``, each with a compile id that ``model._debug_infos`` maps to
the program's ``coreai`` op id.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

FUNCTION = "main"  # the function of an asset qfold loads


# ------------------------------------------------------------------------------------------------ messages
def send(conn: Connection, header: dict, arrays: dict[str, np.ndarray] | None = None) -> None:
    """One message: a JSON header, then the arrays as one ``.npz``."""
    buf = io.BytesIO()
    np.savez(buf, **(arrays or {}))
    conn.send_bytes(json.dumps(header).encode())
    conn.send_bytes(buf.getvalue())


def recv(conn: Connection) -> tuple[dict, dict[str, np.ndarray]]:
    header = json.loads(conn.recv_bytes().decode())
    with np.load(io.BytesIO(conn.recv_bytes()), allow_pickle=False) as data:
        return header, {k: data[k] for k in data.files}


# ------------------------------------------------------------------------------------------------ the child
def serve(fd: int) -> None:
    """The child's loop: load / run / time / profile / close, until the parent closes the socket."""
    import coreai.authoring  # noqa: F401  (before coreai._compiler: the other order is a circular import)
    from coreai.authoring import AIModelAsset
    from coreai.runtime import NDArray, Profiler

    conn = Connection(fd)
    loop = asyncio.new_event_loop()
    models: dict[int, tuple] = {}  # id → (context manager, AIModel, function, descriptor)

    def zero_states(desc) -> dict:
        return {n: NDArray(np.zeros(tuple(desc.state_descriptor(name=n).shape),
                                    np.dtype(desc.state_descriptor(name=n).dtype))) for n in desc.state_names}

    def describe(desc) -> dict:
        def one(kind: str, n: str) -> dict:
            d = getattr(desc, f"{kind}_descriptor")(name=n)
            return {"name": n, "shape": list(d.shape), "dtype": str(d.dtype)}
        return {"inputs": [one("input", n) for n in desc.input_names],
                "states": [one("state", n) for n in desc.state_names],
                "outputs": [one("output", n) for n in desc.output_names]}

    def feeds(arrays: dict, prefix: str, steps: int) -> list[dict]:
        return [{k.split("/", 2 if prefix else 1)[-1]: NDArray(np.ascontiguousarray(v)) for k, v in arrays.items()
                 if k.startswith(f"{prefix}{i}/")} for i in range(steps)]

    def op_ids(model) -> dict[int, int]:
        """compile id (odix) → the program's coreai op id, from the asset's debug information."""
        out = {}
        for fn in json.loads(model._debug_infos):
            for op in fn.get("operations", []):
                for m in op.get("metadatas", []):
                    d = m.get("value", {}).get("dictionary", {}).get("_0", {}) if m.get("key") == "op_id" else {}
                    if d.get("type", {}).get("string", {}).get("_0") == "coreai":
                        out[int(op["odixId"])] = int(d["value"]["integer"]["_0"])
        return out

    async def handle(header: dict, arrays: dict) -> tuple[dict, dict]:
        op = header["op"]
        if op == "load":
            cm = AIModelAsset.load(Path(header["path"])).executable(
                specialization_options=specialization(header.get("compute_units")))
            model = await cm.__aenter__()
            fn = model.load_function(FUNCTION)
            mid = len(models)
            models[mid] = (cm, model, fn, fn.desc)
            return {"id": mid, **describe(fn.desc)}, {}
        _, model, fn, desc = models[header["id"]] if "id" in header else (None,) * 4
        if op == "run":
            ins = {k[3:]: NDArray(np.ascontiguousarray(v)) for k, v in arrays.items() if k.startswith("in/")}
            state = zero_states(desc)
            for k, v in arrays.items():
                if k.startswith("state/"):
                    state[k[6:]] = NDArray(np.ascontiguousarray(v))
            out = await fn(inputs=ins, state=state) if state else await fn(inputs=ins)
            result = {f"out/{k}": np.array(v.numpy()) for k, v in out.items()}
            result.update({f"state/{k}": np.array(v.numpy()) for k, v in state.items()})
            return {}, result
        if op == "time":
            ids, steps = header["ids"], header["steps"]
            plan = {i: (models[i][2], models[i][3], feeds(arrays, f"{i}/", steps)) for i in ids}
            rounds: dict[int, list[float]] = {i: [] for i in ids}
            for r in range(header["warmup"] + header["rounds"]):
                for i in ids:  # interleaved: drift of the shared machine hits every model alike
                    f, d, feed = plan[i]
                    state = zero_states(d)
                    t0 = time.perf_counter()
                    for step in feed:
                        await f(inputs=step, state=state)
                    if r >= header["warmup"]:
                        rounds[i].append(time.perf_counter() - t0)
            return {"steps": steps, "round_s": rounds}, {}
        if op == "profile":
            events: dict[int, tuple] = {}
            totals: dict[tuple, list[int]] = {}
            on = [False]

            def begin(e):
                events[len(events) + 1] = (e.timestamp, e.event_id, e.phase, e.compile_ids.id)
                return len(events)

            def end(e, key):
                t0, eid, phase, cid = events.pop(key, (None,) * 4)
                if t0 is not None and on[0] and phase == "inference":
                    acc = totals.setdefault((eid, cid), [0, 0])
                    acc[0] += e.timestamp - t0
                    acc[1] += 1

            pf = model.load_function(FUNCTION, profiler=Profiler(on_log_event_begin=begin, on_log_event_end=end))
            feed = feeds(arrays, "", header["steps"])
            for enabled in (False, True):  # one pass to warm up, one measured
                state = zero_states(desc)
                on[0] = enabled
                for step in feed:
                    await pf(inputs=step, state=state)
            await asyncio.sleep(0.2)  # end events may arrive after the call returns
            on[0] = False
            ids = op_ids(model)
            execute = sum(t for (eid, _), (t, _) in totals.items() if eid == "Function Execute")
            ops = [(eid, ids.get(cid), t, n) for (eid, cid), (t, n) in totals.items() if eid.startswith("call.")]
            return {"execute_ns": execute, "ops": ops}, {}
        raise ValueError(f"unknown request {op!r}")

    try:
        while True:
            try:
                header, arrays = recv(conn)
            except EOFError:
                break
            if header["op"] == "close":
                break
            try:
                reply, out = loop.run_until_complete(handle(header, arrays))
            except Exception as e:  # the runtime's own errors: report them, keep serving
                reply, out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}, {}
            send(conn, reply, out)
    finally:
        for cm, *_ in models.values():
            loop.run_until_complete(cm.__aexit__(None, None, None))
        conn.close()


def specialization(units: str | None):
    """Core AI's specialisation options for ``--compute-units`` (runtime.COMPUTE_UNITS), None for the runtime's own
    choice. Only the OS's Core AI specialises (macOS 27, USE_OS_COREAI=1); on Linux the runtime is CPU-only, so
    ``cpu`` asks for nothing and the parent refuses the rest before loading (runtime.check_compute_units)."""
    if units in (None, "default") or (units == "cpu" and not sys.platform.startswith("darwin")):
        return None
    from coreai.runtime import ComputeUnitKind, SpecializationOptions

    if not SpecializationOptions.is_supported():
        raise ValueError(f"--compute-units {units}: this Core AI runtime cannot specialise (set USE_OS_COREAI=1 on "
                         "macOS 27)")
    if units == "cpu":
        return SpecializationOptions.cpu_only()
    return SpecializationOptions.from_preferred_compute_unit_kind(getattr(ComputeUnitKind, units)())


if __name__ == "__main__":
    serve(int(sys.argv[1]))
