"""The compute-plan text dumps people paste: two public tools print ``MLComputePlan`` one op a line.

**coreml_profiling** (freedomtan/coreml_modelc_profling ``coreml_profiling.m`` @ cad5582d7896, ``check_mlprogram``:
``NSLog(@"operation %@, device %@, cost %02.4lf%%", operatorName, preferredComputeDevice, weight * 100)``; its
first version printed ``cost %lf us`` with ``weight * 1e3``, which is the same weight, not a time)::

    … coreml_profiling[67391:1771143] operation ios17.conv, device <MLNeuralEngineComputeDevice: 0x6000…>, cost 4.5811%

It prints the ``main`` function's top-level ops that have both a cost and a device (constants have neither), in
program order, with no output names: the join aligns them with the analysis by order and op type.

**CoreMLInspect** (smpanaro/CoreMLInspect ``Sources/CLI.swift`` @ 2803e84287b7, ``printBlock``: the cost padded to
5 characters, the devices to 4, then ``outputs = operator(inputs)``)::

    func main(input_ids) {
               x_1_axis_0 = const()
    0.68% G|C  x_1_cast_fp16 = ios16.gather(batch_dims: ["x_1_batch_dims_0"], x: [...], ...)
    0.17% G|CN var_145_cast_fp16 = ios16.mul(x: ["x_1_cast_fp16"], y: ["x_1_cast_fp16"])

``G|CN``: preferred device (C=CPU, G=GPU, N=Neural Engine), then the other supported ones. The cost is
``100 × weight ÷ the block's total weight`` (a share within its block); Swift's ``padding(toLength:)`` cuts it to
5 characters, so 12.34% prints as ``12.34`` and 100% as ``100.0``: both are read as percentages.
"""

from __future__ import annotations

import re

from analyzer.measure.logs.cells import NUMBER
from analyzer.measure.logs.rows import Collector, RejectError
from analyzer.measure.placement.plan_json import DEVICE_CLASSES
from analyzer.measure.placement.plan_records import Device, PlacedOp, PlanLimits

# --------------------------------------------------------------------------------------- coreml_profiling (NSLog)
_NSLOG_ANY = re.compile(r"\boperation \S+, device\b")
_NSLOG = re.compile(r"\boperation (?P<type>\S+), device <(?P<cls>\w+): 0x[0-9a-fA-F]+>, "
                    rf"cost (?P<cost>{NUMBER})\s*(?P<unit>%|us)\s*$")
_NEURAL_NETWORK = re.compile(r"\]\s+Neural Network\s*$")


def nslog_detect(text: str) -> bool:
    return any(_NSLOG_ANY.search(line) and "ComputeDevice" in line for line in text.splitlines())


def nslog_read(text: str, col: Collector, limits: PlanLimits) -> list[PlacedOp]:
    ops: list[PlacedOp] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if _NEURAL_NETWORK.search(raw):
            raise RejectError("a Neural Network model (layers, not ML Program ops): qfold joins ML Program ops only",
                              line=line)
        if not _NSLOG_ANY.search(raw):
            continue
        record = col.next_record()
        if record > limits.max_ops:
            raise RejectError(f"more than {limits.max_ops:,} ops (limit)", line=line)
        m = _NSLOG.search(raw)
        if m is None:
            col.add(line, None, raw.strip(), "error", "not a complete coreml_profiling line: expected 'operation "
                    "TYPE, device <MLxxxComputeDevice: 0x…>, cost N%'", record=record)
            continue
        device = DEVICE_CLASSES.get(m["cls"])
        if device is None:
            col.add(line, "device", m["cls"], "error", f"unknown compute device class (known: "
                    f"{', '.join(DEVICE_CLASSES)})", record=record)
            continue
        value = float(m["cost"])
        weight = value / 100 if m["unit"] == "%" else value / 1e3  # "us" printed weight × 1e3
        if not 0 <= weight <= 1:
            col.add(line, "cost", m["cost"] + m["unit"], "error", "a cost weight is a share of the work, from 0 "
                    "to 100%", record=record)
            continue
        ops.append(PlacedOp("main", (), m["type"], device, (), weight, None, line, record))
    return ops


# --------------------------------------------------------------------------------------------- CoreMLInspect
_LETTERS: dict[str, Device] = {"C": "CPU", "G": "GPU", "N": "ANE"}
_FUNC = re.compile(r"^\s*func (?P<name>[A-Za-z_]\w*)\((?P<args>.*)\) \{\s*$")
_OP = re.compile(r"^(?P<pre>.*?)(?P<outs>[^\s=,()]+(?:, [^\s=,()]+)*) = (?P<type>[A-Za-z_][\w.]*)\((?P<args>.*)\)\s*$")
_PRE = re.compile(rf"^\s*(?:(?P<cost>{NUMBER})%?)?\s*(?:(?P<pref>\S)\|(?P<sup>\S*))?\s*$")
_KEY = "Key: C=CPU, G=GPU, N=NeuralEngine"


def inspect_detect(text: str) -> bool:
    lines = text.splitlines()
    if any(_KEY in line for line in lines):
        return True
    return any(_FUNC.match(line) for line in lines) and any(
        (m := _OP.match(line)) and _PRE.match(m["pre"]) and "|" in m["pre"] for line in lines)


def inspect_read(text: str, col: Collector, limits: PlanLimits) -> list[PlacedOp]:
    ops: list[PlacedOp] = []
    function: str | None = None
    for line, raw in enumerate(text.splitlines(), start=1):
        if m := _FUNC.match(raw):
            function = m["name"]
            continue
        if raw.strip() == "}":
            function = None
            continue
        op = _OP.match(raw)
        if op is None or function is None:
            continue
        record = col.next_record()
        if record > limits.max_ops:
            raise RejectError(f"more than {limits.max_ops:,} ops (limit)", line=line)
        pre = _PRE.match(op["pre"])
        if pre is None:
            col.add(line, None, op["pre"].strip(), "error", "expected the cost (N%) and the devices (P|S) before "
                    "the op", record=record)
            continue
        preferred: Device | None = None
        supported: tuple[Device, ...] = ()
        if pre["pref"] is not None:
            letters = pre["pref"] + pre["sup"]
            unknown = [c for c in letters if c not in _LETTERS]
            if unknown:
                col.add(line, "devices", f"{pre['pref']}|{pre['sup']}", "error", "device letters are C, G and N "
                        f"(CoreMLInspect prints ? for a device it does not know): {''.join(unknown)!r}", record=record)
                continue
            preferred = _LETTERS[pre["pref"]]
            supported = tuple(dict.fromkeys(_LETTERS[c] for c in letters))
        cost = None
        if pre["cost"] is not None:
            cost = float(pre["cost"]) / 100
            if not 0 <= cost <= 1:
                col.add(line, "cost", pre["cost"], "error", "a cost share is from 0 to 100%", record=record)
                continue
        outputs = tuple(o.strip() for o in op["outs"].split(","))
        ops.append(PlacedOp(function, outputs, op["type"], preferred, supported, cost, None, line, record))
    if col.n_records == 0:
        raise RejectError("no op lines ('NAME = TYPE(…)' inside 'func NAME(…) {'): not CoreMLInspect output")
    return ops
