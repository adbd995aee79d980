"""Every placement-plan format on its cited fixture (tests/data/placement/SOURCES.md), exactly; a malformed
variant of each (one line changed here, beside its verdict) refuses that record alone; the join against the shipped
full-size Q-fold analysis by name, by order and with anemll-profile's cut names; the A/B warning; the page frames
and the graph's device badges. No conversion: the shipped analyses are read as they are."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.cli import main
from analyzer.measure.placement import compare_placement, is_compute, is_plan, join_plan, parse_plan
from analyzer.report import graphview as gv
from analyzer.report import placement_figures as pf
from analyzer.report.graphview.layout import OFF_ANE_BORDER
from tests.placement_plans import all_ane, plan_bytes, printf, slice_update_on_cpu

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "placement"
SHIPPED = REPO / "analyzer" / "shipped"


@pytest.fixture(scope="module")
def qfold():
    return load_analysis(SHIPPED / "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json")


def read(name: str, text: str | None = None):
    data = (DATA / name).read_bytes() if text is None else text.encode()
    return parse_plan(data, name)


# ------------------------------------------------------------------------------------------- the fixtures, exactly
def test_coreml_profiling_readme():
    plan = read("coreml_profiling_readme.txt")
    assert (plan.format, plan.accepted, plan.matching, plan.functions, plan.issues) == (
        "coreml-profiling-nslog", True, "by_order", ("main",), ())
    assert len(plan.ops) == 13 and Counter(op.preferred for op in plan.ops) == {"ANE": 10, "CPU": 3}
    assert [(op.line, op.bare_type, op.preferred) for op in plan.ops[:4]] == [
        (3, "mul", "CPU"), (4, "add", "CPU"), (5, "cast", "CPU"), (6, "conv", "ANE")]
    assert plan.ops[5].cost_weight == pytest.approx(0.045811) and plan.ops[0].outputs == ()


def test_coremlinspect_readme():
    plan = read("coremlinspect_readme.txt")
    assert (plan.format, plan.accepted, plan.functions, plan.issues) == ("coremlinspect", True, ("main",), ())
    consts = [op for op in plan.ops if op.bare_type == "const"]
    assert len(plan.ops) == 7 and len(consts) == 5 and all(op.preferred is None and op.cost_weight is None
                                                           for op in consts)
    gather, mul = plan.ops[3], plan.ops[6]
    assert (gather.outputs, gather.op_type, gather.preferred, gather.supported, gather.line) == (
        ("x_1_cast_fp16",), "ios16.gather", "GPU", ("GPU", "CPU"), 9)
    assert (mul.outputs, mul.preferred, mul.supported) == (("var_145_cast_fp16",), "GPU", ("GPU", "CPU", "ANE"))
    assert (gather.cost_weight, mul.cost_weight) == (pytest.approx(0.0068), pytest.approx(0.0017))


def test_anemll_profile_report():
    plan = read("anemll_profile_report.txt")
    assert (plan.format, plan.accepted, plan.coverage, plan.compute_units, plan.source, plan.issues) == (
        "anemll-profile", True, "off_ane_only", "CPU_AND_NE", "exaone-qfold.mlpackage", ())
    t = plan.timing
    assert (t.ms_per_prediction, t.iter_per_s, t.runs, t.weight_bytes_per_s, t.line) == (44.102, 22.7, 3, 55.35e9, 38)
    first = plan.op_type_times[0]
    assert (first.op_type, first.count, first.ms_per_op, first.total_time_ms, first.gflop, first.gb_per_s,
            first.share_percent, first.bound) == ("linear", 211, 0.110412, 23.297, 2.381, 109.95, 61.2, "Mem")
    top, fallback = plan.ops[:20], plan.ops[20:]
    assert {op.table for op in top} == {"top_ops"} and {op.table for op in fallback} == {"fallback"}
    logits = top[0]
    assert (logits.outputs, logits.op_type, logits.preferred, logits.estimate_ms, logits.moved_bytes,
            logits.bytes_per_s, logits.bound, logits.line) == (("logits",), "linear", "ANE", 3.816638, 419_640_000,
                                                               109.95e9, "Memory", 49)
    assert [op.outputs[0] for op in fallback] == ["..e_0_internal_tensor_assign_1_cast_fp16"] * 2 + [
        ".._29_internal_tensor_assign_1_cast_fp16", "hidden_states_1_cast_fp16"]
    assert fallback[3].supported == ("CPU", "ANE") and fallback[3].reason == "ANE supported but not preferred"
    assert fallback[0].reason == "ane: Cannot support standalone slice_update"


def test_qfold_compute_plan_json():
    plan = read("compute_plan_small.json")
    assert (plan.format, plan.accepted, plan.functions, plan.compute_units, plan.source, plan.issues) == (
        "qfold-compute-plan", True, ("main",), "CPU_AND_NE", "exaone-qfold.mlpackage", ())
    write = plan.ops[4]
    assert (write.outputs, write.inputs, write.preferred, write.line) == (
        (), ("k_cache_0", "k_cache_0_internal_tensor_assign_1_cast_fp16"), "CPU", 60)


def test_qfold_bench_profile_picks_the_target_of_the_analysis_by_its_build_key(qfold):
    plan = read("bench_profile_small.json")
    assert (plan.format, plan.accepted, plan.issues) == ("qfold-bench-profile", True, ())
    assert plan.functions == (qfold.build.key, "another-build") and {op.preferred for op in plan.ops} == {"CPU"}
    j = join_plan(plan, qfold)
    assert (j.plan_function, j.n_matched, j.unmatched_plan) == (qfold.build.key, 6, ())
    assert j.device("CPU").time_ms == pytest.approx(0.2 + 0.3 + 0.4 + 0.5 + 0.6 + 0.7)
    assert j.category_shares[0].basis == "profiled time, ms per token"
    assert sum(s.amount for s in j.category_shares) == pytest.approx(2.7)


def test_files_that_are_not_plans_are_refused_whole_with_the_reason():
    cases = {"malformed/compute_plan_v2.json": "schema_version 2",
             "malformed/not_a_plan.txt": "not a placement plan"}
    for name, fragment in cases.items():
        plan = read(name)
        assert not plan.accepted and len(plan.issues) == 1 and fragment in plan.issues[0].message
    assert "bench profile" in read("malformed/not_a_plan.txt").issues[0].message  # every format it would take
    assert not is_plan((DATA / "malformed" / "not_a_plan.txt").read_bytes())
    text = (DATA / "compute_plan_small.json").read_text()
    assert "only finite numbers" in read("x.json", text.replace('"cost": 0.0068', '"cost": NaN')).issues[0].message
    assert "NUL" in read("x.txt", "operation ios17.mul\x00").issues[0].message


# (fixture, old text, new text, column, fragment): the record on the changed line is refused, the rest kept
VARIANTS = [
    ("coreml_profiling_readme.txt", "<MLNeuralEngineComputeDevice: 0x6000036ec0e0>, cost 4.5811%",
     "<MLTPUComputeDevice: 0x6000036ec0e0>, cost 4.5811%", "device", "unknown compute device class"),
    ("coreml_profiling_readme.txt", "cost 2.9749%", "cost 2,9749%", None, "not a complete coreml_profiling line"),
    ("coremlinspect_readme.txt", "0.17% G|CN", "0.17% G|CX", "devices", "device letters are C, G and N"),
    ("coremlinspect_readme.txt", "0.68% G|C ", "250.0 G|C ", "cost", "from 0 to 100%"),
    ("anemll_profile_report.txt", "  matmul                              60",
     "  matmul                              sixty", None, "must be numbers"),
    ("anemll_profile_report.txt", "gather                    CPU CPU,ANE", "gather                    TPU CPU,ANE",
     "Dev", "device must be one of"),
    ("anemll_profile_report.txt", "  logits                                       linear                     3.816638",
     "  logits                                       linear                     3,816638", None,
     "must be finite numbers"),
    ("anemll_profile_report.txt", "linear                     0.152701    16.79   109.95 Memory\n  linear_5_cast",
     "linear                     0.152701    16.79   109.95\n  linear_5_cast", None, "a Top-N row has 6 fields"),
    ("compute_plan_small.json", '"preferred": "GPU"', '"preferred": "NPU"', "functions[0].ops[2]",
     "'preferred' is 'NPU'"),
    ("bench_profile_small.json", '"time_ms": 0.4', '"time_ms": -0.4', "targets[0].ops[2]", "'time_ms' is -0.4"),
]


@pytest.mark.parametrize(("name", "old", "new", "column", "fragment"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_malformed_variant_refuses_only_the_changed_record(name, old, new, column, fragment):
    text = (DATA / name).read_text(encoding="utf-8")
    assert text.count(old) == 1
    line = text[: text.index(old)].count("\n") + 1
    if name.endswith(".json"):  # a JSON op is reported where its object's outputs (or time) start
        key = '"time_ms"' if "bench" in name else '"outputs"'
        line = text[: text.index(old) + len(key)].rfind(key)
        line = text[:line].count("\n") + 1
    good, bad = read(name, text), read(name, text.replace(old, new))
    assert bad.accepted and bad.format == good.format
    (error,) = bad.errors
    assert (error.line, error.column) == (line, column) and fragment in error.message, error.describe()
    assert "Traceback" not in error.describe() and error.describe().startswith(f"error: {name}:{line}")
    assert records(good) - records(bad) == {line} and records(bad) < records(good)  # nothing else lost or shifted


def test_coreml_profilings_first_us_form_is_the_same_weight():
    """Its first version printed ``cost %lf us`` with ``weight * 1e3`` (coreml_profiling.m history): a weight, not
    a time; 45.811 "us" is the 4.5811% of the current form."""
    text = (DATA / "coreml_profiling_readme.txt").read_text(encoding="utf-8")
    plan = read("x.txt", text.replace("cost 4.5811%", "cost 45.811000 us"))
    assert plan.accepted and plan.issues == () and plan.ops[5].cost_weight == pytest.approx(0.045811)
    assert [op.cost_weight for op in plan.ops] == pytest.approx([op.cost_weight for op in read(
        "coreml_profiling_readme.txt").ops])


def test_coreml_profiling_of_a_neural_network_is_refused_whole():
    text = (DATA / "coreml_profiling_readme.txt").read_text(encoding="utf-8")
    assert text.count("] ML Program ") == 1
    plan = read("nn.txt", text.replace("] ML Program ", "] Neural Network"))
    (error,) = plan.issues
    assert not plan.accepted and error.line == 2 and "a Neural Network model" in error.message


@pytest.mark.parametrize(("old", "new", "column", "fragment"), [
    ("Measured:  44.102 ms/prediction  (22.7 iter/s, 3 runs)", "Measured:  44.102 ms/prediction",
     "Measured", "the timing is not used"),
    ("Weight BW: 55.35 GB/s", "Weight BW: 55,35 GB/s", "Weight BW", "the weight bandwidth is not used"),
])
def test_anemll_profiles_malformed_summary_lines_are_warned_about_and_left_out(old, new, column, fragment):
    text = (DATA / "anemll_profile_report.txt").read_text(encoding="utf-8")
    assert text.count(old) == 1
    line = text[: text.index(old)].count("\n") + 1
    plan = read("anemll.txt", text.replace(old, new))
    (warning,) = plan.issues
    assert plan.accepted and plan.errors == () and len(plan.ops) == 24  # the rest kept
    assert (warning.severity, warning.line, warning.column) == ("warning", line, column)
    assert fragment in warning.message
    good = read("anemll_profile_report.txt").timing
    if column == "Measured":
        assert plan.timing is None
    else:
        assert plan.timing.weight_bytes_per_s is None and plan.timing.ms_per_prediction == good.ms_per_prediction


def records(plan) -> set[int]:
    """The lines of a plan's records: its ops and anemll-profile's op-type rows."""
    return {op.line for op in plan.ops} | {t.line for t in plan.op_type_times}


def test_anemll_profiles_conv_detail_rows_name_ops_in_full_and_join_only_a_conv(qfold):
    header = printf("  %-40s %10s %8s %8s %8s %6s %6s %7s", "Name", "ms", "GFLOP/s", "MB", "GB/s", "InCh", "OutCh",
                    "WU%")
    rows = [printf("  %-40s %10.6f %8.2f %8.2f %8.2f %6d %6d %6.1f%%", "linear_4_cast_fp16", 0.152701, 1.1, 16.79,
                   109.95, 2048, 4096, 87.5),
            printf("  %-40s %10.6f %8.2f %8.2f %8.2f %6d %6d", "linear_5_cast_fp16", 0.1, 1.1, 16.79, 109.95, 2048,
                   4096)]
    text = "\n".join(["  ANE CostModel Report: x.mlpackage", "", "  Conv Detail (top 15)", "", header,
                      "  " + " ".join("─" * 8 for _ in range(8)), *rows, ""])
    plan = read("conv.txt", text)
    (op,) = plan.ops
    assert (op.table, op.outputs, op.estimate_ms, op.moved_bytes, op.bytes_per_s, op.line) == (
        "conv_detail", ("linear_4_cast_fp16",), 0.152701, 16_790_000, 109.95e9, 7)
    (bad,) = plan.errors
    assert bad.line == 8 and "8 fields" in bad.message
    (unmatched,) = join_plan(plan, qfold).unmatched_plan  # the table lists ops whose type contains conv
    assert "op type differs: the analysis has linear" in unmatched.why


# ------------------------------------------------------------------------------------------------- the joins
def test_anemll_profile_joins_the_shipped_qfold_analysis(qfold):
    j = join_plan(read("anemll_profile_report.txt"), qfold)
    compute = [op for op in qfold.program.ops if is_compute(op.type)]
    assert (j.n_matched, j.device("CPU").ops, j.device("GPU").ops, j.device("ANE").ops) == (
        20 + 3, 3, 0, len(compute) - 3)  # the Top-N's 20 ops on the ANE, with their cost-model time
    assert {o.name for o in j.off_ane} == {"hidden_states_1_cast_fp16", "k_cache_0_internal_tensor_assign_1_cast_fp16",
                                           "v_cache_0_internal_tensor_assign_1_cast_fp16"}  # two cut alike: both
    (cut,) = j.unmatched_plan  # the k/v of layer 29 cut to one tail: listed, never guessed
    assert cut.line == 78 and "ends 2 op records' names" in cut.why and cut.ambiguous
    assert j.unmatched_analysis == () and any("may include them" in n for n in j.notes)
    shares = {s.category: s.share for s in j.category_shares}
    assert j.category_shares[0].basis == "cost-model time, ms" and sum(shares.values()) == pytest.approx(1.0)
    assert shares["weights"] > shares["kv_read"] > 0


def test_a_dump_without_names_is_aligned_by_order_and_type(qfold):
    top = [op for op in qfold.program.ops if op.parent is None and op.type != "const"][:40]
    lines = [f"2024-06-13 16:59:10.785 coreml_profiling[1:2] operation ios18.{op.type}, device "
             f"<MLNeuralEngineComputeDevice: 0x6000036ec0e0>, cost 0.5000%" for op in top]
    lines[9] = lines[9].replace(f"ios18.{top[9].type},", "ios18.conv,")  # an op this program does not have there
    del lines[20]  # and one op the dump leaves out
    j = join_plan(read("x.txt", "\n".join(lines)), qfold)
    assert j.matching == "by_order" and j.n_matched == 38
    assert [(u.op_type, u.line) for u in j.unmatched_plan] == [("ios18.conv", 10)]
    compute = sum(1 for op in qfold.program.ops if is_compute(op.type))
    assert len(j.unmatched_analysis) == compute - 38 and top[20].name in j.unmatched_analysis


def test_names_join_with_the_op_type_as_a_check(qfold):
    ops = [op for op in qfold.program.ops][:30]
    body = []
    for op in ops:
        if op.type == "const":
            body.append(f"           {op.name} = const()")
        else:
            body.append(f"0.10% N|C  {op.name} = ios18.{'mul' if op.name == 'add_0' else op.type}(x: [\"a\"])")
    j = join_plan(read("x.txt", "func main(input_ids) {\n" + "\n".join(body) + "\n}\n"), qfold)
    assert j.n_matched == 29 and [u.label for u in j.unmatched_plan] == ["add_0"]
    assert "op type differs: the analysis has add" in j.unmatched_plan[0].why


def test_the_ab_warns_once_per_device_off_the_neural_engine_that_b_loads_more(qfold):
    repeat_kv = load_analysis(SHIPPED / "exaone-4.0-1.2b-repeat_kv-state-ctx4096.analysis.json")
    a = join_plan(parse_plan(plan_bytes(repeat_kv, all_ane), "a.json"), repeat_kv)
    b = join_plan(parse_plan(plan_bytes(qfold, slice_update_on_cpu), "b.json"), qfold)
    assert a.n_matched == len(repeat_kv.program.ops) and a.unmatched_analysis == () and b.unmatched_plan == ()
    ab = compare_placement(a, b)
    (w,) = ab.warnings
    assert (w.device, w.ops_a, w.ops_b) == ("CPU", 0, 60) and w.bytes_b == b.device("CPU").bytes_per_token > 0
    assert w.message.startswith("B moves work off the Neural Engine onto the CPU: +60 ops")
    assert compare_placement(b, a).warnings == () and compare_placement(a, a).warnings == ()

    frame = pf.device_frame(a, b)
    assert frame.set_index("device").loc["CPU", ["a_ops", "b_ops"]].tolist() == [0, 60]
    assert frame["b_bytes_per_token"].sum() == sum(d.bytes_per_token for d in b.by_device)
    fig = pf.device_figure(frame)
    assert list(fig.data[0].y) == frame["a_ops"].tolist() and list(fig.data[3].y) == (
        frame["b_bytes_per_token"] / 2**20).tolist()
    off = pf.off_ane_frame(b)
    assert len(off) == 60 and set(off["type"]) == {"slice_update"} and off["bytes_per_token"].dtype == "int64"
    assert json.loads(json.dumps(ab.to_json()))["warnings"][0]["device"] == "CPU"

    view = gv.layer_view(qfold.program, None, 0, devices=[pf.op_devices(b)], collapse=False)
    placed = {n.title: n.device for n in view.sides[0].op_nodes()}
    assert placed["slice_update"] == "CPU" and placed["linear"] == "ANE"
    dot = gv.side_dot(view)
    assert OFF_ANE_BORDER in dot and "device-CPU" in dot and "ANE/GPU/CPU" in gv.legend_text(view)


# ------------------------------------------------------------------------------------------------- the CLI
REPEAT_KV = SHIPPED / "exaone-4.0-1.2b-repeat_kv-state-ctx4096.analysis.json"
QFOLD = SHIPPED / "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json"


def _plan_file(path: Path, analysis_path: Path, placed: dict[str, str]) -> str:
    """A compute plan of the analysis with ops of the ``placed`` types on those devices, the rest on the ANE."""
    path.write_bytes(plan_bytes(load_analysis(analysis_path), lambda t: placed.get(t, "ANE")))
    return f"{path}"


def _cli(argv: list[str], capsys) -> tuple[int, str, list[str]]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.strip()]


def test_diff_warns_per_device_on_ops_alone_and_on_bytes_alone(tmp_path, capsys):
    """A: reshapes (free views) on the GPU, muls on the CPU. B: the same reshapes and its three free expand_dims
    on the GPU (more ops, no more bytes), its linears on the CPU (fewer ops than A's muls, far more bytes)."""
    a = _plan_file(tmp_path / "a.json", REPEAT_KV, {"reshape": "GPU", "mul": "CPU"})
    b = _plan_file(tmp_path / "b.json", QFOLD, {"reshape": "GPU", "expand_dims": "GPU", "linear": "CPU"})
    code, out, err = _cli(["diff", str(REPEAT_KV), str(QFOLD), "--plan", f"A={a}", "--plan", f"B={b}", "--json"],
                          capsys)
    assert code == 0 and err == []
    warnings = {w["device"]: w for w in json.loads(out)["placement"]["warnings"]}
    assert set(warnings) == {"GPU", "CPU"}  # never the ANE
    gpu, cpu = warnings["GPU"], warnings["CPU"]
    assert gpu["ops_b"] > gpu["ops_a"] == 181 and gpu["bytes_per_token_a"] == gpu["bytes_per_token_b"] == 0
    assert "ops" in gpu["message"] and "per token" not in gpu["message"]
    assert cpu["ops_b"] == 211 < cpu["ops_a"] == 483 and cpu["bytes_per_token_b"] > cpu["bytes_per_token_a"] > 0
    assert "per token" in cpu["message"] and " ops (" not in cpu["message"]
    code, out, _ = _cli(["diff", str(REPEAT_KV), str(QFOLD), "--plan", f"A={a}", "--plan", f"B={b}"], capsys)
    assert code == 0 and sum(line.startswith("warning: B moves work off the Neural Engine") for line in
                             out.splitlines()) == 2


@pytest.mark.parametrize(("plans", "message"), [
    (["--plan", "C=x.json"], "error: --plan 'C=x.json': write A=PLAN or B=PLAN"),
    (["--plan", "A"], "error: --plan 'A': write A=PLAN or B=PLAN"),
    (["--plan", "A=x.json"], "error: --plan: give both A=PLAN and B=PLAN"),
    (["--plan", "A=x.json", "--plan", "A=y.json"], "error: --plan A= is given twice"),
    (["--plan-function", "A=main"], "error: --plan-function: give --plan A=PLAN --plan B=PLAN too"),
    (["--plan", f"A={DATA / 'malformed' / 'not_a_plan.txt'}", "--plan", f"B={DATA / 'compute_plan_small.json'}"],
     "not_a_plan.txt: not a placement plan"),
    (["--plan", f"A={DATA / 'malformed' / 'compute_plan_v2.json'}", "--plan", f"B={DATA / 'compute_plan_small.json'}"],
     "compute_plan_v2.json"),
])
def test_bad_plan_arguments_and_refused_plans_end_in_one_line(plans, message, capsys):
    code, out, err = _cli(["diff", str(REPEAT_KV), str(QFOLD), *plans, "--json"], capsys)
    assert code == 1 and out == "" and len(err) == 1 and message in err[0] and err[0].startswith("error: "), err


def test_a_plans_function_is_chosen_with_plan_function_and_the_analysis_function_stays_function(capsys):
    """A bench profile of two targets, neither named like the analysis (its build key is the first target's, so
    the repeat_kv analysis matches neither): refused with the way out; ``--plan-function`` picks one; ``--function``
    still names the analysis's function (a single-function analysis has no 'another-build')."""
    plan = str(DATA / "bench_profile_small.json")
    code, _, err = _cli(["placement", plan, str(REPEAT_KV), "--json"], capsys)
    assert code == 1 and len(err) == 1 and "none named like the analysis's 'main'" in err[0]
    assert "pick one with --plan-function" in err[0]
    code, out, err = _cli(["placement", plan, str(REPEAT_KV), "--plan-function", "another-build", "--json"], capsys)
    assert code == 0 and err == [] and json.loads(out)["plan_function"] == "another-build"
    code, _, err = _cli(["placement", plan, str(REPEAT_KV), "--plan-function", "nope", "--json"], capsys)
    assert code == 1 and "no function 'nope'" in err[0]
    code, _, err = _cli(["placement", plan, str(REPEAT_KV), "--function", "another-build", "--json"], capsys)
    assert code == 1 and len(err) == 1 and "another-build" in err[0]  # the analysis has no such function
    code, out, _ = _cli(["diff", str(REPEAT_KV), str(QFOLD), "--plan", f"A={plan}", "--plan", f"B={plan}",
                         "--plan-function", "A=another-build", "--json"], capsys)
    assert code == 0 and json.loads(out)["placement"]["a"]["plan"] == "bench_profile_small.json"


# ------------------------------------------------------------------------------------- Core AI's inspect, segments
def test_coreai_build_inspects_summary_is_read_by_its_documented_fields_and_places_nothing(qfold):
    plan = read("coreai_inspect_tiny.json")
    assert (plan.format, plan.accepted, plan.coverage, plan.ops, plan.functions, plan.compute_types) == (
        "coreai-build-inspect", True, "op_counts", (), ("main",), ("f16",))
    counts = dict(plan.op_counts)
    assert (counts["coreai.broadcast_in_dims"], counts["coreai.slice_update"], sum(counts.values())) == (4, 4, 250)
    ((function, inputs, outputs, states),) = plan.signatures
    assert function == "main"
    assert [s[0] for s in states] == ["k_cache_0", "v_cache_0", "k_cache_1", "v_cache_1"]
    assert inputs[0] == ("input_ids", "tensor<1x1xsi32>") and outputs == (("logits", "tensor<1x1x1000xf16>"),)
    j = join_plan(plan, qfold)  # a Core ML analysis: no coreai.* op agrees, and nothing is placed either way
    assert (j.n_matched, j.matched, j.segments, j.to_json()["segments"]) == (0, (), None, None)
    assert "gives no regions" in j.segments_why and any("0 of 22 operation counts agree" in n for n in j.notes)
    text = (DATA / "coreai_inspect_tiny.json").read_text()
    bad = read("x.json", text.replace('"count" : 25,', '"count" : -25,'))
    (error,) = bad.errors
    assert bad.accepted and error.line == text[: text.index('"coreai.cast"')].count("\n") + 1  # its name's line
    assert "coreai.cast" not in dict(bad.op_counts) and len(bad.op_counts) == 21


def test_segments_are_the_runs_of_neural_engine_and_gpu_ops_in_program_order(qfold):
    one = join_plan(parse_plan(plan_bytes(qfold, all_ane), "a.json"), qfold)
    assert (one.segments.total, dict(one.segments.by_device)) == (1, {"ANE": 1, "GPU": 0})
    cut = join_plan(parse_plan(plan_bytes(qfold, slice_update_on_cpu), "b.json"), qfold)
    devices = [slice_update_on_cpu(op.type) for op in qfold.program.ops if is_compute(op.type)]
    runs = sum(1 for k, d in enumerate(devices) if d == "ANE" and (k == 0 or devices[k - 1] != "ANE"))
    assert runs > 30 and cut.segments.total == runs  # each cache write on the CPU cuts the Neural Engine's run
    assert cut.to_json()["segments_by_device"] == {"ANE": runs, "GPU": 0}
    assert cut.to_json()["segments_basis"].startswith("derived: runs of compute ops")
