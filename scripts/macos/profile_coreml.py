#!/usr/bin/env python3
"""Profile a Core ML package on a Mac for qfold: timed decode steps and the compute plan, as two files qfold reads.

    python scripts/macos/profile_coreml.py PKG --steps N --compute-units ALL|CPU_ONLY|CPU_AND_GPU|CPU_AND_NE

Run it from a qfold checkout on macOS 15+ with qfold's requirements installed. It writes, into ``--out-dir``:

* ``<name>.<units>.log.csv``: one qfold device-log row (device, build, tok_per_s, phase decode, context_length,
  compute_units, os_version, date, notes): N decode steps through ``MLModel.predict`` with the package's KV
  state, the first one a warm-up left out of the rate; the inputs are those of ``python -m analyzer run --steps``
  (seeded token ids, positions and causal masks; ``--input-spec`` for a package qfold did not build);
* ``<name>.<units>.plan.json``: qfold's compute-plan JSON (``analyzer/measure/placement/plan_json.py``) from
  ``MLComputePlan``: per function and op, the output names, type, preferred and supported devices and cost weight.

Give both to qfold (``fit LOG``, ``placement PLAN ANALYSIS``, the Device logs page, ``diff --plan``).

What ran where: the Core ML calls (``coreml_runtime.py``: loading, ``predict`` with a state, ``MLComputePlan``) run
only on macOS and were never exercised by qfold's tests, which run on Linux. Everything else here (arguments, the
decode-step inputs, the timing arithmetic, the CSV, the plan JSON and its device names) is tested on Linux with
qfold's MIL interpreter standing in for ``predict`` and a plan built from the package's ``Model.proto``
(tests/test_placement_companion.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # qfold's checkout, whatever the cwd

import numpy as np  # noqa: E402

from analyzer.engines.interpret.executor import RunResult  # noqa: E402
from analyzer.engines.interpret.roles import decode_steps, infer_roles, load_roles  # noqa: E402
from analyzer.fmt import to_csv  # noqa: E402
from analyzer.fsio import write_json_atomic  # noqa: E402
from analyzer.ir.coreml.mil_reader import find_package, read_program  # noqa: E402
from analyzer.measure.logs import KNOWN_COLUMNS  # noqa: E402
from analyzer.measure.placement.plan_json import DEVICE_CLASSES, plan_document  # noqa: E402
from scripts.macos.coreml_runtime import MACOS_ONLY, CoreMLRuntime, check_platform, machine  # noqa: E402

COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")  # coremltools.ComputeUnit names
WARMUP_STEPS = 1  # the first predict loads and specialises the model: not a decode step's cost
TESTED_HERE = ("arguments, decode-step inputs, timing arithmetic, the log CSV and the compute-plan JSON were "
               "tested on Linux with qfold's MIL interpreter standing in for predict")


class Runtime(Protocol):
    name: str

    def predictor(self, package: str, compute_units: str, function: str | None) -> Callable[[dict], dict]: ...

    def plan_ops(self, package: str, compute_units: str) -> list[tuple[str, list[dict[str, Any]]]]: ...


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="profile_coreml.py", description=__doc__.split("\n")[0])
    p.add_argument("package", help="a .mlpackage (or a qfold build folder holding one)")
    p.add_argument("--steps", type=int, default=16, help="decode steps, the first a warm-up (default 16)")
    p.add_argument("--compute-units", choices=COMPUTE_UNITS, default="ALL")
    p.add_argument("--function", help="one function of a multi-function package (default: its default one)")
    p.add_argument("--input-spec", help="which inputs are token ids, positions, mask (see python -m analyzer run "
                                        "--help); qfold's own builds need none")
    p.add_argument("--device", help="device label for the log (default: the Mac's chip)")
    p.add_argument("--label", help="build label for the log (default: the package's folder name)")
    p.add_argument("--out-dir", default=".", help="where the two files go (default: the current folder)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.steps < WARMUP_STEPS + 1:
        p.error(f"--steps {args.steps}: at least {WARMUP_STEPS + 1} (the first is a warm-up)")
    return args


class TimedSteps:
    """What ``roles.decode_steps`` drives: the package's declared inputs and outputs (read from its Model.proto)
    and a ``run`` that is one timed ``predict`` (the runtime keeps the KV state between calls)."""

    def __init__(self, package: Path, function: str | None, predict: Callable[[dict], dict]) -> None:
        program = read_program(package, function)
        self.path = package
        self.function = program.function
        self.inputs, self.states, self.outputs = program.inputs, program.states, program.outputs
        self.output_names = tuple(o.name for o in program.outputs)
        self.seconds: list[float] = []
        self._predict = predict

    def run(self, feed: dict[str, np.ndarray], state: Any = None) -> RunResult:
        start = time.perf_counter()
        outputs = self._predict(feed)
        self.seconds.append(time.perf_counter() - start)
        return RunResult({k: np.asarray(v) for k, v in outputs.items()}, {})


def decode_rate(seconds: Sequence[float], warmup: int = WARMUP_STEPS) -> tuple[float, float, float]:
    """tok/s over the timed steps (steps ÷ their total time: seconds per token averaged), and their min and max
    in ms."""
    timed = list(seconds[warmup:])
    if not timed or sum(timed) <= 0:
        raise ValueError("no timed decode step")
    return len(timed) / sum(timed), 1e3 * min(timed), 1e3 * max(timed)


def log_csv(steps: TimedSteps, context_length: int | None, device: str, build: str, compute_units: str,
            os_version: str, runtime: str, today: str) -> str:
    rate, fastest, slowest = decode_rate(steps.seconds)
    timed = len(steps.seconds) - WARMUP_STEPS
    row = {"device": device, "build": build, "tok_per_s": f"{rate:.6g}", "phase": "decode",
           "context_length": context_length if context_length is not None else "", "compute_units": compute_units,
           "os_version": os_version, "date": today,
           "notes": f"profile_coreml.py: {timed} decode steps ({runtime} predict with state) after "
                    f"{WARMUP_STEPS} warm-up; {fastest:.3f}-{slowest:.3f} ms per step"}
    return to_csv([row], [c for c in KNOWN_COLUMNS if c in row])


def plan_json(raw: list[tuple[str, list[dict[str, Any]]]], package: str, compute_units: str,
              made_with: dict[str, str]) -> dict[str, Any]:
    """The runtime's ops (device class names) → qfold's compute-plan document (device names ANE/GPU/CPU)."""
    def device(cls: str | None) -> str | None:
        if cls is None:
            return None
        if cls not in DEVICE_CLASSES:
            raise ValueError(f"unknown compute device class {cls!r} (known: {', '.join(DEVICE_CLASSES)})")
        return DEVICE_CLASSES[cls]

    functions = [(name, [{"outputs": op["outputs"], "inputs": op.get("inputs", []), "type": op["type"],
                          "preferred": device(op["preferred_class"]),
                          "supported": [device(c) for c in op["supported_classes"]], "cost": op["cost"]}
                         for op in ops]) for name, ops in raw]
    return plan_document(package, compute_units, functions, made_with)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_profile(args: argparse.Namespace, runtime: Runtime, made_with: dict[str, str]) -> tuple[Path, Path]:
    package = find_package(args.package)
    steps = TimedSteps(package, args.function, runtime.predictor(str(package), args.compute_units, args.function))
    roles = load_roles(args.input_spec) if args.input_spec else infer_roles(steps)  # type: ignore[arg-type]
    decode_steps(steps, args.steps, roles, seed=args.seed)  # type: ignore[arg-type]
    by_name = {t.name: t for t in steps.inputs}
    mask = by_name.get(roles.causal_mask) if roles is not None and roles.causal_mask else None
    context = mask.shape[-1] if mask is not None and mask.shape and mask.shape[-1] is not None else None
    label = args.label or (package.parent.name if package.name == "model.mlpackage" else package.stem)
    stem = f"{label}.{args.compute_units}"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path, plan_path = out / f"{stem}.log.csv", out / f"{stem}.plan.json"
    _write_text_atomic(log_path, log_csv(steps, context, args.device or made_with.get("machine", "Mac"), label,
                                         args.compute_units, made_with.get("macos", ""), runtime.name,
                                         datetime.date.today().isoformat()))
    write_json_atomic(plan_path, plan_json(runtime.plan_ops(str(package), args.compute_units), package.name,
                                           args.compute_units, made_with))
    return log_path, plan_path


def main(argv: Sequence[str] | None = None, runtime: Runtime | None = None,
         made_with: dict[str, str] | None = None) -> int:
    args = parse_args(argv)
    if runtime is None:
        check_platform()
        runtime = CoreMLRuntime()
        made_with = machine()
    print(f"profile_coreml.py: {MACOS_ONLY}; {TESTED_HERE}.")
    try:
        log_path, plan_path = run_profile(args, runtime, made_with or {})
    except (ValueError, OSError) as e:  # qfold's errors are ValueErrors: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {log_path} (python -m analyzer fit {log_path})")
    print(f"wrote {plan_path} (python -m analyzer placement {plan_path} ANALYSIS)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
