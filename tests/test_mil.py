"""The walker and the byte account on hand-built MIL programs whose bytes can be added up on paper."""

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from analyzer.graph.accounting import RULES, account
from analyzer.graph.mil import layer_from_name, read_program


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
