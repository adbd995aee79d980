"""The macOS companion (scripts/macos/profile_coreml.py) on Linux, its Core ML calls replaced by a stand-in: qfold's
MIL interpreter for ``predict`` and, for ``MLComputePlan``, a plan made from the package's own Model.proto (read by
the helper below straight from the protobuf, not by qfold's reader, so the join is tested against names qfold did
not produce). What only macOS can run (coreml_runtime.py) is not exercised here, and the script says so.

A qfold build's plan joins to every compute op of its analysis; the plan of the other variant's package reports the
ops it does not share, from both sides.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from coremltools.proto import Model_pb2

from analyzer.analysis.record import load_analysis
from analyzer.cli import main as cli_main
from analyzer.engines.interpret.executor import load_interpreter
from analyzer.measure.logs import parse_log
from analyzer.measure.placement import is_compute, join_plan, parse_plan

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "macos" / "profile_coreml.py"


def _script():
    spec = importlib.util.spec_from_file_location("profile_coreml", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("profile_coreml", module)
    spec.loader.exec_module(module)
    return module


profile_coreml = _script()


def proto_ops(package: Path) -> list[tuple[str, list[tuple[list[str], list[str], str]]]]:
    """(function, [(output names, input names, op type), …]) from the package's Model.proto, nested blocks after
    their op; input names are the names bound to the op's arguments (as MLModelStructure's bindings)."""
    model = Model_pb2.Model()
    model.ParseFromString((package / "Data" / "com.apple.CoreML" / "model.mlmodel").read_bytes())
    out = []

    def walk(block, into):
        for op in block.operations:
            inputs = [a.name for arg in op.inputs.values() for a in arg.arguments if a.name]
            into.append(([o.name for o in op.outputs], inputs, op.type))
            for inner in op.blocks:
                walk(inner, into)

    for name, function in model.mlProgram.functions.items():
        ops: list[tuple[list[str], list[str], str]] = []
        walk(function.block_specializations[function.opset], ops)
        out.append((name, ops))
    return out


class StandIn:
    """A Linux stand-in for Core ML: the interpreter predicts (state kept between calls); the plan puts every op
    of the proto on the Neural Engine except ``slice_update`` (a known Neural Engine fallback) on the CPU, with an
    equal cost weight per compute op and none for constants (as MLComputePlan gives none)."""

    name = "qfold MIL interpreter (stand-in)"

    def predictor(self, package, compute_units, function):
        interp = load_interpreter(package, function)
        state: dict = {}

        def predict(feed):
            result = interp.run(feed, state or None)
            state.update(result.states)
            return result.outputs

        return predict

    def plan_ops(self, package, compute_units):
        out = []
        for name, ops in proto_ops(Path(package)):
            n = sum(1 for _, _, t in ops if t != "const")
            raw = []
            for outputs, inputs, op_type in ops:
                if op_type == "const":
                    raw.append({"outputs": outputs, "inputs": inputs, "type": op_type, "preferred_class": None,
                                "supported_classes": [], "cost": None})
                    continue
                cls = "MLCPUComputeDevice" if op_type == "slice_update" else "MLNeuralEngineComputeDevice"
                raw.append({"outputs": outputs, "inputs": inputs, "type": f"ios18.{op_type}", "preferred_class": cls,
                            "supported_classes": [cls, "MLCPUComputeDevice"] if cls != "MLCPUComputeDevice"
                            else [cls], "cost": 1 / n})
            out.append((name, raw))
        return out


@pytest.fixture(scope="module")
def profiled(tiny_builds, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    out = tmp_path_factory.mktemp("profiles")
    made = {}
    for variant, folder in tiny_builds.items():
        assert profile_coreml.main([str(folder), "--steps", "3", "--compute-units", "CPU_AND_NE", "--out-dir",
                                    str(out), "--label", variant, "--device", "stand-in"], runtime=StandIn(),
                                   made_with={"macos": "", "machine": "linux stand-in"}) == 0
        made[variant] = (out / f"{variant}.CPU_AND_NE.log.csv", out / f"{variant}.CPU_AND_NE.plan.json")
    return made


def test_the_log_is_one_decode_row_the_importer_accepts(profiled, capsys):
    log, _ = profiled["qfold"]
    imported = parse_log(log.read_bytes(), log.name)
    assert imported.errors == () and imported.files[0].format == "qfold-csv"
    (row,) = imported.measurements
    assert (row.phase, row.device, row.build, row.compute_units, row.context_length) == (
        "decode", "stand-in", "qfold", "CPU_AND_NE", 256)  # the tiny builds' static cache
    assert row.tok_per_s > 0 and "2 decode steps" in row.notes and "after 1 warm-up" in row.notes


def test_a_builds_plan_joins_to_every_compute_op_of_its_analysis(profiled, tiny_builds, capsys):
    _, plan_path = profiled["qfold"]
    plan = parse_plan(plan_path.read_bytes(), plan_path.name)
    assert plan.accepted and plan.errors == () and plan.format == "qfold-compute-plan"
    analysis = load_analysis(tiny_builds["qfold"])
    compute = [op for op in analysis.program.ops if is_compute(op.type)]
    j = join_plan(plan, analysis)
    assert j.n_matched == len(plan.ops) and j.unmatched_plan == () and j.unmatched_analysis == ()
    assert {op.index for op in j.matched} >= {op.index for op in compute}
    slice_updates = [op for op in compute if op.type == "slice_update"]
    assert len(slice_updates) == 4  # 2 layers x K and V
    cpu, ane = j.device("CPU"), j.device("ANE")
    assert cpu.ops == 4 and ane.ops == len(compute) - 4
    assert cpu.bytes_per_token == sum(analysis.account.ops[op.index].total for op in slice_updates)
    assert ane.bytes_per_token + cpu.bytes_per_token == sum(analysis.account.ops[op.index].total for op in compute)
    assert sum(s.share for s in j.category_shares) == pytest.approx(1.0)

    # the CLI contract, in process: matched, unmatched, by_device
    assert cli_main(["placement", str(plan_path), str(tiny_builds["qfold"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["matched"] == j.n_matched and doc["unmatched"] == {"plan_ops": [], "analysis_ops": []}
    assert doc["by_device"]["CPU"] == {**doc["by_device"]["CPU"], "ops": 4, "bytes_per_token": cpu.bytes_per_token}


def test_another_packages_plan_reports_what_does_not_match(profiled, tiny_builds, capsys):
    _, other = profiled["repeat_kv"]  # repeat_kv's plan against the Q-fold analysis
    assert cli_main(["placement", str(other), str(tiny_builds["qfold"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan_only = {d["name"]: d for d in doc["unmatched_plan_ops"]}
    assert plan_only and set(doc["unmatched"]["plan_ops"]) == set(plan_only)
    assert any(d["type"] == "ios18.tile" for d in plan_only.values())  # repeat_kv's KV copies
    assert doc["unmatched"]["analysis_ops"]  # and Q-fold ops repeat_kv's plan never names
    assert doc["matched"] > 0

    # and the A/B: same placement rule, so no device off the Neural Engine gains ops
    _, plan_q = profiled["qfold"]
    assert cli_main(["diff", str(tiny_builds["repeat_kv"]), str(tiny_builds["qfold"]), "--plan", f"A={other}",
                     "--plan", f"B={plan_q}", "--json"]) == 0
    placement = json.loads(capsys.readouterr().out)["placement"]
    assert placement["warnings"] == [] and placement["by_device"]["CPU"]["ops"] == {"a": 4, "b": 4, "delta": 0}


def test_the_script_refuses_bad_arguments_and_names_what_runs_only_on_macos(tiny_builds, tmp_path, capsys):
    with pytest.raises(SystemExit):
        profile_coreml.main([str(tiny_builds["qfold"]), "--steps", "1"], runtime=StandIn())
    assert "at least 2" in capsys.readouterr().err
    assert profile_coreml.main([str(tmp_path / "missing.mlpackage"), "--out-dir", str(tmp_path)],
                               runtime=StandIn()) == 1
    out = capsys.readouterr()
    assert "run on macOS only" in out.out and "not an .mlpackage" in out.err and "Traceback" not in out.err
    with pytest.raises(ValueError, match="unknown compute device class"):
        profile_coreml.plan_json([("main", [{"outputs": ["x"], "type": "relu", "preferred_class": "MLTPUDevice",
                                              "supported_classes": [], "cost": 0.1}])], "p", "ALL", {})
