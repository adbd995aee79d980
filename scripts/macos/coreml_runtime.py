"""Every Core ML runtime call ``profile_coreml.py`` makes, and nothing else: load a package for a compute-unit
setting, predict with a state, and read ``MLComputePlan``. These run only on macOS (14.4+ for the compute plan, 15+
for states); qfold's tests never run them (there is no Core ML runtime on Linux).

The calls, from coremltools 9.0 (``coremltools/models/model.py``, ``compute_plan.py``, ``compute_device.py``):
``MLModel(path, compute_units=ComputeUnit[...], function_name=...)``, ``model.make_state()``,
``model.predict(inputs, state=state)``, ``model.get_compiled_model_path()``,
``MLComputePlan.load_from_path(compiled, compute_units=...)``, ``plan.model_structure.program.functions``,
``plan.get_compute_device_usage_for_mlprogram_operation(op)`` (``preferred_compute_device``,
``supported_compute_devices``) and ``plan.get_estimated_cost_for_mlprogram_operation(op)`` (``weight``).
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

MACOS_ONLY = ("loading the package, predict with a state (the timed decode steps) and MLComputePlan (the "
              "placement) call Core ML: they run on macOS only and were never run by qfold's Linux tests")


def check_platform() -> None:
    if platform.system() != "Darwin":
        raise SystemExit(f"error: this script needs macOS ({MACOS_ONLY}); this is {platform.system()}")


def machine() -> dict[str, str]:
    """What the files say they were made on: the chip (``sysctl machdep.cpu.brand_string``), macOS and
    coremltools versions."""
    import coremltools as ct

    try:
        chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                              timeout=10, check=False).stdout.strip()
    except OSError:
        chip = ""
    return {"machine": chip or platform.machine(), "macos": platform.mac_ver()[0], "coremltools": ct.__version__}


class CoreMLRuntime:
    """The runtime ``profile_coreml.run_profile`` drives (a test passes a stand-in with the same two methods)."""

    name = "Core ML"

    def predictor(self, package: str, compute_units: str, function: str | None) -> Callable[[dict], dict]:
        """``predict(inputs) -> outputs`` on one function, its KV state (if any) kept between calls."""
        import coremltools as ct

        kwargs: dict[str, Any] = {"compute_units": ct.ComputeUnit[compute_units]}
        if function is not None:
            kwargs["function_name"] = function
        model = ct.models.MLModel(package, **kwargs)
        desc = model.get_spec().description
        states = next((f.state for f in desc.functions if f.name == model.function_name), []) if desc.functions \
            else desc.state
        state = model.make_state() if len(states) else None

        def predict(inputs: dict) -> dict:
            return model.predict(inputs, state=state) if state is not None else model.predict(inputs)

        return predict

    def plan_ops(self, package: str, compute_units: str) -> list[tuple[str, list[dict[str, Any]]]]:
        """Per function, per op (nested blocks after their op): output names, operator name, the preferred and
        supported device classes' names and the cost weight, as ``MLComputePlan`` gives them."""
        import coremltools as ct
        from coremltools.models.compute_plan import MLComputePlan

        model = ct.models.MLModel(package, compute_units=ct.ComputeUnit[compute_units])  # compiles the package
        plan = MLComputePlan.load_from_path(model.get_compiled_model_path(),
                                            compute_units=ct.ComputeUnit[compute_units])
        program = plan.model_structure.program
        if program is None:
            raise SystemExit("error: not an ML Program package: MLComputePlan has no program structure")
        out = []
        for name, function in program.functions.items():
            ops = []
            for op in _walk(function.block.operations):
                usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
                cost = plan.get_estimated_cost_for_mlprogram_operation(op)
                ops.append({"outputs": [o.name for o in op.outputs], "type": op.operator_name,
                            "inputs": [b.name for arg in op.inputs.values() for b in arg.bindings if b.name],
                            "preferred_class": type(usage.preferred_compute_device).__name__ if usage else None,
                            "supported_classes": [type(d).__name__ for d in usage.supported_compute_devices]
                            if usage else [],
                            "cost": cost.weight if cost is not None else None})
            out.append((name, ops))
        return out


def _walk(operations) -> Iterator[Any]:
    for op in operations:
        yield op
        for block in op.blocks:
            yield from _walk(block.operations)
