"""Property tests: random small MIL programs through the walker and the byte account.

Hypothesis draws a program as a sequence of steps over a pool of fp16 tensors — KV replication into an
attention matmul (the repeat_kv chain), tiles that are not KV replication, elementwise ops with constants,
linear layers, softmax, reductions, views, transposes, concats, slices — builds it with coremltools' MIL
builder, saves it as a package and walks it. Whatever the program, nothing but qfold's own errors may be
raised, and the account's invariants hold:

* every op's bytes land in exactly one category and one layer (totals = Σ ops = Σ layers);
* replication bytes = each KV-replication tile's output written once plus every read of it by a non-view
  consumer (2 × the output for a tile read once, as in every converter's chain);
* a program with no tile has no replication bytes; views and constants move nothing.
"""

from __future__ import annotations

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.analysis.accounting import CATEGORIES, account
from analyzer.errors import QfoldError
from analyzer.ir.coreml.mil_reader import VIEW_OPS, read_program

pytestmark = pytest.mark.conversion

HKV, G, S, D = 2, 2, 4, 8  # KV heads, group, cache slots, head dim
STEPS = ("kv_attention", "tile_seq", "add_const", "mul", "linear", "softmax", "reduce", "transpose", "concat",
         "slice", "reshape")


def _build(steps: list[str], seed: int):
    rng = np.random.default_rng(seed)

    def const(shape):
        return (rng.standard_normal(shape) * 0.1 + 0.5).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, HKV * G, 1, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, HKV, S, D), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(query, k_cache_0):
        pool = [query, k_cache_0]  # every tensor is rank 4 with a last dim of D or S
        outputs = []
        for i, step in enumerate(steps):
            x = pool[i % len(pool)]
            if step == "kv_attention":
                e = mb.expand_dims(x=k_cache_0, axes=[2], name=f"kv_expand_{i}")  # [1, Hkv, 1, S, D]
                t = mb.tile(x=e, reps=[1, 1, G, 1, 1], name=f"kv_tile_{i}")  # [1, Hkv, G, S, D]
                r = mb.reshape(x=t, shape=[1, HKV * G, S, D], name=f"kv_rep_{i}")  # [1, Hq, S, D]
                y = mb.matmul(x=query, y=r, transpose_y=True, name=f"scores_{i}")  # [1, Hq, 1, S]
            elif step == "tile_seq":  # a tile that is not KV replication: along the sequence, then added
                t = mb.tile(x=x, reps=[1, 1, 2, 1], name=f"seq_tile_{i}")
                y = mb.add(x=t, y=mb.const(val=const((1, 1, 1, x.shape[-1]))), name=f"after_tile_{i}")
            elif step == "add_const":
                y = mb.add(x=x, y=mb.const(val=const((x.shape[-1],))), name=f"add_{i}")
            elif step == "mul":
                y = mb.mul(x=x, y=x, name=f"mul_{i}")
            elif step == "linear":
                n = x.shape[-1]
                y = mb.linear(x=x, weight=mb.const(val=const((D, n))), bias=mb.const(val=const((D,))),
                              name=f"linear_{i}")
            elif step == "softmax":
                y = mb.softmax(x=x, axis=-1, name=f"softmax_{i}")
            elif step == "reduce":
                y = mb.reduce_mean(x=x, axes=[-1], keep_dims=True, name=f"reduce_{i}")
            elif step == "transpose":
                y = mb.transpose(x=x, perm=[0, 2, 1, 3], name=f"transpose_{i}")
            elif step == "concat":
                y = mb.concat(values=[x, x], axis=2, name=f"concat_{i}")
            elif step == "slice":
                y = mb.slice_by_index(x=x, begin=[0, 0, 0, 0], end=[1, 1, 1, 1], end_mask=[True, True, True, False],
                                      name=f"slice_{i}")
            else:  # reshape: a view
                y = mb.reshape(x=x, shape=list(x.shape), name=f"view_{i}")
            pool.append(y)
            outputs.append(y)
        return tuple(outputs)

    return prog


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=st.lists(st.sampled_from(STEPS), min_size=1, max_size=7), seed=st.integers(0, 2**16))
def test_random_programs_keep_the_accounts_invariants(tmp_path_factory, steps, seed):
    path = tmp_path_factory.mktemp("prop") / "p.mlpackage"
    model = ct.convert(_build(steps, seed), convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
                       minimum_deployment_target=ct.target.iOS18)
    model.save(str(path))
    try:
        program = read_program(path)
        acc = account(program)
    except QfoldError:
        return  # a refusal is allowed; any other exception fails the test
    totals = acc.totals()
    assert sum(o.total for o in acc.ops) == totals["total"]
    for c in CATEGORIES:
        assert sum(o.get(c) for o in acc.ops) == totals[c]
    assert sum(r["total"] for r in acc.by_layer()) == totals["total"]
    assert len({o.index for o in acc.ops}) == len(program.ops)

    # replication = each KV tile's output written once + read once by each non-view consumer
    consumers = program.consumers()

    def reads(index: int) -> int:
        n = 0
        for c in consumers[index]:
            op = program.ops[c]
            n += reads(c) if op.type in VIEW_OPS else sum(1 for r in op.inputs if r.producer == index)
        return n

    kv_tiles = [op for op in program.ops if op.type == "tile" and op.tile_kind == "kv_replication"]
    expected = sum(op.output_bytes * (1 + reads(op.index)) for op in kv_tiles)
    assert totals["replication"] == expected
    assert len(kv_tiles) == steps.count("kv_attention")
    if not any(op.type == "tile" for op in program.ops):
        assert totals["replication"] == 0
    for o in acc.ops:
        if o.type in VIEW_OPS or o.type == "const":
            assert o.total == 0, o
