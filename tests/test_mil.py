"""The walker and the byte account on hand-built MIL programs whose bytes can be added up on paper."""

import json
import subprocess
import sys
from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from analyzer.analysis.accounting import RULES, account
from analyzer.ir.coreml.mil_reader import layer_from_name, read_program

REPO = Path(__file__).resolve().parent.parent


def _save(prog, path):
    model = ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
                       minimum_deployment_target=ct.target.iOS18)
    model.save(str(path))
    return path


@pytest.fixture(scope="module")
def three_op_package(tmp_path_factory):
    """k_cache [1,2,1,8,4] fp16 → tile ×4 on the group axis → reshape [1,8,8,4] → matmul with a const
    query [1,8,1,4] (transpose_y) → scores [1,8,1,8]."""
    query = (np.arange(32, dtype=np.float16).reshape(1, 8, 1, 4) + 1)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 2, 1, 8, 4), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(k_cache):
        t = mb.tile(x=k_cache, reps=[1, 1, 4, 1, 1], name="tile_k")  # [1, 2, 4, 8, 4]
        r = mb.reshape(x=t, shape=[1, 8, 8, 4], name="k_rep")  # [1, 8, 8, 4], a view
        q = mb.const(val=query, name="q_weight")
        return mb.matmul(x=q, y=r, transpose_y=True, name="scores")  # [1, 8, 1, 8]

    return _save(prog, tmp_path_factory.mktemp("mil") / "three.mlpackage")


def test_walker_records_the_three_ops(three_op_package):
    program = read_program(three_op_package)
    compute = [op for op in program.ops if op.type != "const"]
    assert [op.type for op in compute] == ["tile", "reshape", "matmul"]
    tile = compute[0]
    assert tile.tile_kind == "kv_replication"  # reaches the matmul through a reshape
    assert tile.outputs[0].shape == (1, 2, 4, 8, 4) and tile.outputs[0].dtype == "fp16"
    assert tile.output_bytes == 2 * 4 * 8 * 4 * 2
    x = next(r for r in tile.inputs if r.param == "x")
    assert not x.is_const and x.producer is None and x.tensor.name == "k_cache"
    reps = next(r for r in tile.inputs if r.param == "reps")
    assert reps.is_const
    q = next(r for r in compute[2].inputs if r.param == "x")
    assert q.is_const and q.tensor.shape == (1, 8, 1, 4)


def test_account_matches_paper(three_op_package):
    totals = account(read_program(three_op_package)).totals()
    k_cache = 1 * 2 * 1 * 8 * 4 * 2  # 128 B read by the tile
    replica = 1 * 2 * 4 * 8 * 4 * 2  # 512 B written by the tile, read again by the matmul
    query = 8 * 4 * 2  # 64 B of const data read by the matmul
    scores = 8 * 8 * 2  # 128 B written by the matmul
    assert totals == {
        "weights": query,
        "kv_read": k_cache,
        "kv_write": 0,
        "replication": 2 * replica,
        "activations": scores,
        "total": query + k_cache + 2 * replica + scores,
        "kv_write_value_semantics": 0,
    }


def test_state_update_is_charged_in_place(tmp_path):
    """read_state → slice_update(one row) → write_state: kv_write is the row, not the tensor."""

    @mb.program(input_specs=[mb.StateTensorSpec(shape=(1, 2, 16, 4), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, 2, 1, 4), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(k_cache_3, new_k):
        cache = mb.read_state(input=k_cache_3)
        upd = mb.slice_update(x=cache, update=new_k, begin=[0, 0, 5, 0], end=[1, 2, 6, 4])
        mb.coreml_update_state(state=k_cache_3, value=upd)
        return mb.reduce_sum(x=mb.read_state(input=k_cache_3), axes=[2])

    program = read_program(_save(prog, tmp_path / "state.mlpackage"))
    acc = account(program)
    t = acc.totals()
    row, tensor = 2 * 4 * 2, 2 * 16 * 4 * 2
    assert t["kv_write"] == row
    assert t["kv_write_value_semantics"] == tensor
    assert t["kv_read"] == tensor  # reduce_sum reads the whole cache
    su = next(o for o in acc.ops if o.type == "slice_update")
    assert su.layer == 3  # the state's name reveals the layer


def test_unknown_op_types_are_reported_not_zero(three_op_package, monkeypatch):
    monkeypatch.delitem(RULES, "matmul")
    acc = account(read_program(three_op_package))
    assert acc.unruled_op_types == ("matmul",)
    assert next(o for o in acc.ops if o.type == "matmul").total > 0


@pytest.mark.parametrize(("name", "layer"), [
    ("model_model_layers_12_self_attn_q_proj_weight_to_fp16", 12),
    ("model.layers.3.mlp", 3),
    ("k_cache_29", 29),
    ("transformer_h_4_attn", 4),
    ("lm_head_weight_to_fp16", None),
    ("var_123", None),
])
def test_layer_from_name(name, layer):
    assert layer_from_name(name) == layer


def test_not_an_mlpackage_is_a_clear_error(tmp_path):
    from analyzer.errors import MilError

    with pytest.raises(MilError, match=r"not an \.mlpackage"):
        read_program(tmp_path)


# ---------------------------------------------------------------------------------------------- foreign graphs
def _cli(capsys, *argv) -> tuple[int, str, str]:
    from analyzer.cli import main

    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def symbolic_package(tmp_path_factory):
    """x [1, S, 4] fp16 with S flexible → relu → linear with an [8, 4] fp16 weight → y [1, S, 8]."""
    from coremltools.converters.mil.mil import get_new_symbol

    weight = np.ones((8, 4), dtype=np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, get_new_symbol(), 4), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(x):
        return mb.linear(x=mb.relu(x=x, name="r"), weight=weight, name="y")

    return _save(prog, tmp_path_factory.mktemp("sym") / "symbolic.mlpackage")


def test_a_symbolic_dimension_is_reported_not_counted_as_zero(symbolic_package, capsys):
    program = read_program(symbolic_package)
    relu = next(op for op in program.ops if op.type == "relu")
    assert relu.outputs[0].shape == (1, None, 4) and relu.outputs[0].nbytes is None
    acc = account(program)
    assert {(u.op_name, u.tensor, u.shape) for u in acc.unsized} == {
        ("r", "x", "[1,?,4]"), ("r", "r", "[1,?,4]"), ("y", "r", "[1,?,4]"), ("y", "y", "[1,?,8]")}
    assert acc.totals()["weights"] == 8 * 4 * 2  # the weight is sized; the activations are not
    assert acc.totals()["activations"] == 0
    # inspect analyses a flexible package at a stated shape (#20): the hidden-state length at its lower bound
    code, out, _ = _cli(capsys, "inspect", str(symbolic_package), "--json")
    doc = json.loads(out)
    assert code == 0 and "unsized_tensors" not in doc
    assert doc["assumed_shapes"] == [{"name": "x", "shape": [1, 1, 4], "how": "query length at its lower bound"}]
    assert doc["bytes_per_token"]["activations"] == 2 * (4 + 4 + 4 + 8)  # x, r read; r, y written (fp16)
    code, text, _ = _cli(capsys, "inspect", str(symbolic_package), "--shape", "x=1,2,4")
    assert code == 0 and "flexible input analysed at x [1,2,4] (given (--shape))" in text


@pytest.fixture(scope="module")
def control_flow_package(tmp_path_factory):
    """cond (both branches define a var named ``v``) feeding a while_loop whose condition and body each take the
    loop variable as a block input of the same name."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4), dtype=types.fp16),
                             mb.TensorSpec(shape=(1,), dtype=types.int32)], opset_version=ct.target.iOS18)
    def prog(x, p):
        def then():
            return mb.add(x=x, y=np.float16(1), name="v")

        def otherwise():
            return mb.mul(x=x, y=np.float16(2), name="v")

        c = mb.cond(pred=mb.cast(x=mb.squeeze(x=p), dtype="bool"), _true_fn=then, _false_fn=otherwise,
                    name="branch")

        def condition(a):
            return mb.less(x=mb.reduce_sum(x=a, axes=[0, 1]), y=np.float16(100))

        def body(a):
            return mb.add(x=a, y=a, name="loop_add")

        looped = mb.while_loop(_cond=condition, _body=body, loop_vars=(c,), name="loop")
        return mb.relu(x=looped[0] if isinstance(looped, list | tuple) else looped, name="out")

    return _save(prog, tmp_path_factory.mktemp("cf") / "control.mlpackage")


def test_nested_blocks_are_walked_with_their_own_scopes(control_flow_package):
    program = read_program(control_flow_package)
    by_name = {}
    for op in program.ops:
        by_name.setdefault(op.name, []).append(op)
    cond, loop = by_name["branch"][0], by_name["loop"][0]
    (then_v, else_v) = by_name["v"]  # one var name in two blocks, each its own op
    assert (then_v.type, else_v.type) == ("add", "mul") and then_v.parent == else_v.parent == cond.index
    body = by_name["loop_add"][0]
    assert body.parent == loop.index
    # the loop variable is the body's block input: known, sized, not produced by any op of the program
    assert [(r.tensor.name, r.tensor.shape, r.tensor.nbytes, r.producer) for r in body.inputs] == [
        ("branch_x0", (1, 4), 8, None)] * 2
    out = by_name["out"][0]
    assert out.inputs[0].producer == loop.index and out.parent is None  # after the loop: the outer scope again
    acc = account(program)
    assert not acc.unruled_op_types and not acc.unsized
    assert {o.rule for o in acc.ops if o.type in ("cond", "while_loop")} == {"control_flow"}
    assert next(o for o in acc.ops if o.name == "loop_add").activations == 3 * 8  # reads a twice, writes once


def test_layer_norm_and_prelu_parameters_are_weights(tmp_path):
    """LayerNorm's gamma and beta and PReLU's per-channel alpha are streamed like any weight; a scalar alpha
    (leaky_relu) is an attribute."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 2, 8), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        ones = np.arange(8, dtype=np.float16) + 1
        y = mb.layer_norm(x=x, axes=[-1], gamma=ones, beta=ones, name="ln")
        z = mb.prelu(x=y, alpha=np.arange(4, dtype=np.float16) + 1, name="pr")
        return mb.leaky_relu(x=z, alpha=0.1, name="lr")

    acc = account(read_program(_save(prog, tmp_path / "norm.mlpackage")))
    weights = {o.name: o.weights for o in acc.ops if o.type != "const"}
    assert weights == {"ln": 2 * 8 * 2, "pr": 4 * 2, "lr": 0}


@pytest.fixture(scope="module")
def multifunction_package(tmp_path_factory):
    """``prefill`` (linear) and ``decode`` (linear → relu, the default function) in one package."""
    folder = tmp_path_factory.mktemp("multi")
    weight = np.ones((8, 8), dtype=np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prefill(x):
        return mb.linear(x=x, weight=weight, name="y")

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def decode(x):
        return mb.relu(x=mb.linear(x=x, weight=weight * 2, name="h"), name="y")

    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(str(_save(prefill, folder / "prefill.mlpackage")), "main", "prefill")
    desc.add_function(str(_save(decode, folder / "decode.mlpackage")), "main", "decode")
    desc.default_function_name = "decode"
    ct.utils.save_multifunction(desc, str(folder / "multi.mlpackage"))
    return folder / "multi.mlpackage"


def test_a_multifunction_package_lists_and_reports_every_function(multifunction_package, capsys):
    from analyzer.ir.coreml.mil_reader import list_functions

    assert list_functions(multifunction_package) == ("decode", "prefill")
    assert [op.type for op in read_program(multifunction_package).ops if op.type != "const"] == ["linear", "relu"]
    assert [op.type for op in read_program(multifunction_package, "prefill").ops if op.type != "const"] == ["linear"]

    code, out, _ = _cli(capsys, "inspect", str(multifunction_package), "--json")
    doc = json.loads(out)
    assert code == 0 and [f["function"] for f in doc["functions"]] == ["decode", "prefill"]
    assert doc["op_counts"] == doc["functions"][0]["op_counts"] == {"const": 2, "linear": 1, "relu": 1}
    assert doc["functions"][1]["op_counts"] == {"const": 2, "linear": 1}
    code, out, _ = _cli(capsys, "inspect", str(multifunction_package), "--function", "prefill", "--json")
    one = json.loads(out)
    assert "functions" not in one and one["op_counts"] == {"const": 2, "linear": 1}
    code, text, _ = _cli(capsys, "inspect", str(multifunction_package))
    assert "2 functions (decode, prefill)" in text and "== function prefill" in text

    code, out, _ = _cli(capsys, "diff", str(multifunction_package), str(multifunction_package), "--json")
    d = json.loads(out)
    assert [f["function"] for f in d["functions"]] == ["decode", "prefill"] and d["functions_only_in"] == {
        "a": [], "b": []}
    code, _, err = _cli(capsys, "inspect", str(multifunction_package), "--function", "nope")
    assert code == 1 and "no function 'nope' (has" in err


def test_single_function_output_has_no_functions_key(three_op_package, capsys):
    code, out, _ = _cli(capsys, "inspect", str(three_op_package), "--json")
    assert code == 0 and "functions" not in json.loads(out)


def test_peak_rss_is_read_in_bytes_on_macos_and_kib_on_linux(monkeypatch):
    import resource

    from analyzer.convert.child import peak_rss_bytes

    class Usage:
        ru_maxrss = 1_000_000

    monkeypatch.setattr(resource, "getrusage", lambda who: Usage())
    assert peak_rss_bytes("darwin") == 1_000_000  # getrusage(2) on macOS: bytes
    assert peak_rss_bytes("linux") == 1_024_000_000  # on Linux: kilobytes


def test_the_dashboard_catalog_offers_each_function(multifunction_package, three_op_package):
    from analyzer.analysis.record import load_analysis
    from analyzer.report.catalog import package_refs

    refs = package_refs(multifunction_package)
    assert [(r.id.rsplit("#", 1)[-1], r.function) for r in refs] == [("decode", "decode"), ("prefill", "prefill")]
    assert load_analysis(refs[1].path, refs[1].function).function == "prefill"
    (single,) = package_refs(three_op_package)
    assert single.function is None and "#" not in single.id


def test_reading_or_running_a_small_package_imports_neither_coremltools_nor_torch(three_op_package):
    """Reading a package needs coremltools' protobuf modules only (analyzer.ir.coreml.milproto.coreml_proto), and the
    interpreter widens a small program's fp16 with NumPy (ops._common.TORCH_AFTER_ELEMENTS): a process that reads or
    runs one (inspect, diff, run, the dashboard) does not pay coremltools' import (~4-6 s of CPU: its converters
    import torch) nor torch's (~3 s). Imported afterwards, coremltools' message classes are the reader's."""
    code = (
        "import sys\n"
        "from analyzer.ir.coreml.mil_reader import read_program, read_spec\n"
        f"program = read_program({str(three_op_package)!r})\n"
        "assert [op.type for op in program.ops if op.type != 'const'] == ['tile', 'reshape', 'matmul'], program.ops\n"
        "from analyzer.engines.interpret import load_interpreter\n"
        "interp = load_interpreter(program.path)\n"
        "import numpy as np\n"
        "out = interp.run({'k_cache': np.ones((1, 2, 1, 8, 4), np.float16)}).outputs\n"
        "assert list(out) == ['scores'] and out['scores'].shape == (1, 8, 1, 8)\n"
        "assert 'coremltools' not in sys.modules and 'torch' not in sys.modules, 'imported to read or run'\n"
        f"spec = read_spec({str(three_op_package)!r})\n"
        "from coremltools.proto import Model_pb2\n"
        "assert type(spec) is Model_pb2.Model\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
