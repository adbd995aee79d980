"""The parts of the analysis build mode that need no conversion: value-free weights, the header-only blob
writer against coremltools' own, zero pages, the reduced model, keys and modes."""

import math
import struct

import numpy as np
import psutil
import pytest
import torch

from analyzer.convert.header_blobs import BLOB_DTYPES, HeaderOnlyBlobWriter, _stand_in
from analyzer.errors import QfoldError
from analyzer.model.decode import untie_embeddings_
from analyzer.model.sources import DEFAULT_PRESET, geometry_of, load_config, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BUILD_MODES, MATERIALISED_MODE, BuildSpec
from analyzer.model.valuefree import (
    assign_value_free_weights_,
    build_value_free_model,
    reduced_source,
    value_free_constant,
    zero_pages,
)

from .conftest import TINY_OVERRIDES

# coremltools' writer method and numpy element type per blob dtype (backend/mil/helper.py dispatch)
_WRITERS = {
    "fp16": ("write_fp16_data", np.uint16), "fp32": ("write_float_data", np.float32),
    "uint8": ("write_uint8_data", np.uint8), "int8": ("write_int8_data", np.int8),
    "int16": ("write_int16_data", np.int16), "uint16": ("write_uint16_data", np.uint16),
    "int4": ("write_int4_data", np.int8), "uint1": ("write_uint1_data", np.uint8),
    "uint2": ("write_uint2_data", np.uint8), "uint3": ("write_uint3_data", np.uint8),
    "uint4": ("write_uint4_data", np.uint8), "uint6": ("write_uint6_data", np.uint8),
    "int32": ("write_int32_data", np.int32), "uint32": ("write_uint32_data", np.uint32),
}


def test_header_only_blobs_have_coremltools_own_headers(tmp_path):
    """Every dtype, element counts that do and do not fill whole bytes: same offsets, same 64-byte metadata
    records, same file length as coremltools' BlobWriter; only the data regions are holes."""
    from coremltools.libmilstoragepython import _BlobStorageWriter

    assert set(_WRITERS) == set(BLOB_DTYPES)
    blobs = [(dtype, n) for dtype in _WRITERS for n in (1, 13, 70)]
    real_path, ours_path = tmp_path / "real.bin", tmp_path / "ours.bin"
    real = _BlobStorageWriter(str(real_path))
    real_offsets = [getattr(real, _WRITERS[d][0])(np.zeros(n, dtype=_WRITERS[d][1])) for d, n in blobs]
    del real  # flushes
    ours = HeaderOnlyBlobWriter(ours_path)
    our_offsets = [ours.write(d, n) for d, n in blobs]
    ours.close()
    assert our_offsets == real_offsets
    a, b = real_path.read_bytes(), ours_path.read_bytes()
    assert len(a) == len(b)
    assert a[:64] == b[:64]  # blob count, storage version
    for off in real_offsets:
        assert a[off:off + 64] == b[off:off + 64]
    assert struct.unpack_from("<I", b, 0)[0] == len(blobs)


def test_zero_pages_read_as_zeros_without_becoming_resident():
    rss = psutil.Process().memory_info().rss
    w = zero_pages((16384, 16384))  # 512 MiB of fp16
    assert float(w.float()[::4096].abs().sum()) == 0.0
    y = torch.nn.functional.linear(torch.ones(1, 16384, dtype=torch.float16), w)  # reads every page
    assert not y.any()
    assert psutil.Process().memory_info().rss - rss < 128 << 20


def test_value_free_constants_are_distinct_exact_fp16_and_never_zero_or_one():
    values = [value_free_constant(i) for i in range(5000)]
    assert len(set(values)) == len(values)
    assert all(float(torch.tensor(v, dtype=torch.float16)) == v for v in values)
    assert 0.0 not in values and 1.0 not in values


@pytest.fixture(scope="module")
def value_free_tiny():
    return build_value_free_model(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES))


def test_value_free_model_ties_one_tensor_and_assigns_one_constant_per_parameter(value_free_tiny):
    model = value_free_tiny
    assert model.lm_head.weight is model.model.embed_tokens.weight  # EXAONE ties them: ONE const
    assert not any(p.any() for p in model.parameters())  # zero pages until assigned
    n = assign_value_free_weights_(model)
    params = list(model.parameters())
    assert n == len(params)
    assert all(p.dtype == torch.float16 and all(s == 0 for s in p.stride()) for p in params)
    firsts = [float(p.reshape(-1)[0]) for p in params]
    assert len(set(firsts)) == len(firsts)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(b.dtype == torch.float16 for n_, b in model.named_buffers() if b.is_floating_point())


def test_untie_without_values_gives_lm_head_its_own_placeholder():
    model = build_value_free_model(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES))
    assert untie_embeddings_(model, copy_values=False)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert model.lm_head.weight.shape == model.model.embed_tokens.weight.shape
    assert not untie_embeddings_(model, copy_values=False)  # already untied


@pytest.mark.parametrize("preset", ["exaone-4.0-1.2b", "llama-3.1-8b", "qwen2.5-7b", "gemma-3-1b"])
def test_reduced_model_keeps_the_attention_geometry(preset):
    full = resolve_source(preset)
    reduced = reduced_source(full)
    g, r = geometry_of(load_config(full)), geometry_of(load_config(reduced))
    assert (r.num_q_heads, r.num_kv_heads, r.head_dim, r.model_type) == \
        (g.num_q_heads, g.num_kv_heads, g.head_dim, g.model_type)
    assert r.vocab_size <= 1000
    types_ = full.config_dict.get("layer_types")
    if types_:  # every attention kind of the pattern occurs (gemma 3: five sliding, then one full)
        assert set(load_config(reduced).layer_types) == set(types_)
    else:
        assert r.num_layers == 2


def test_stand_in_keeps_block_axes_and_shrinks_the_rest():
    values, blocks = _stand_in((4096, 2048), [16, 0], 3)
    assert values.shape == (4096, 1) and blocks == [16, 0] and values.dtype == np.float16
    assert len(np.unique(values[:16])) > 1  # a group's values vary: a defined uniform LUT
    values, blocks = _stand_in((512, 2048), [1, 0], 1)  # per-channel int8
    assert values.shape == (512, 1) and blocks == [1, 0]
    values, blocks = _stand_in((64, 64), [64, 0], 1)  # one group over the whole axis = per tensor
    assert values.shape == (1, 1) and blocks == [0, 0]
    assert math.prod(values.shape) == 1


def test_build_mode_is_part_of_the_key_and_of_the_spec():
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    analysis = BuildSpec(src, "qfold", "state", 256, build_mode=ANALYSIS_MODE)
    materialised = BuildSpec(src, "qfold", "state", 256, build_mode=MATERIALISED_MODE)
    assert analysis.key != materialised.key
    assert "-analysis-" in analysis.key and "-analysis-" not in materialised.key
    assert BuildSpec.from_json(analysis.to_json()) == analysis
    legacy = {k: v for k, v in materialised.to_json().items() if k != "build_mode"}
    assert BuildSpec.from_json(legacy).build_mode == MATERIALISED_MODE  # requests written before the mode
    assert set(BUILD_MODES) == {ANALYSIS_MODE, MATERIALISED_MODE}
    with pytest.raises(QfoldError, match="build mode 'fast'"):
        BuildSpec(src, "qfold", "state", 256, build_mode="fast")


def test_stored_spec_records_the_mode_and_old_documents_read_as_materialised():
    from analyzer.jsonfields import Field
    from analyzer.model.spec import BuildSpec

    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    stored = BuildSpec(src, "qfold", "state", 256, build_mode=ANALYSIS_MODE)
    assert stored.build_mode == ANALYSIS_MODE and stored.to_json()["build_mode"] == ANALYSIS_MODE
    assert BuildSpec.from_json(Field(stored.to_json(), "spec")) == stored
    legacy = {k: v for k, v in stored.to_json().items() if k != "build_mode"}  # schema 1 and early schema 2
    assert BuildSpec.from_json(Field(legacy, "spec")).build_mode == MATERIALISED_MODE
    with pytest.raises(QfoldError, match=r"build_mode.*expected one of analysis, materialised, got 'fast'"):
        BuildSpec.from_json(Field({**legacy, "build_mode": "fast"}, "spec"))


def test_a_fold_build_is_never_made_from_value_free_weights(tmp_path):
    from analyzer.errors import FoldError
    from analyzer.fold.cache import build_folded

    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    with pytest.raises(FoldError, match="needs weight values"):
        build_folded(BuildSpec(src, "repeat_kv", "state", 256, build_mode=ANALYSIS_MODE), tmp_path)
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------- per tensor, not per element
def test_torch_equal_of_one_value_broadcasts_reads_one_element():
    """Inside ``one_value_equal`` torch.equal answers as torch does (equal, unequal, NaN, other shapes, strided
    and empty tensors), and two 8.6·10^9-element broadcasts compare at once (torch scans every element: ~30 s)."""
    import time

    from analyzer.convert.step import one_value_equal

    def one(v, shape):
        return torch.full((), v, dtype=torch.float16).expand(shape)

    dense = torch.arange(6, dtype=torch.float16).reshape(2, 3)
    cases = [(one(0.5, (4, 5)), one(0.5, (4, 5))), (one(0.5, (4, 5)), one(0.25, (4, 5))),
             (one(float("nan"), (4, 5)), one(float("nan"), (4, 5))), (one(0.5, (4, 5)), one(0.5, (5, 4))),
             (dense, dense.clone()), (dense, dense * 2),
             (one(0.5, (2, 3)), torch.full((2, 3), 0.5, dtype=torch.float16)),
             (one(0.5, (0, 3)), one(0.25, (0, 3))), (one(0.5, (4, 5)), one(0.5, (4, 5)).float())]
    expected = [torch.equal(a, b) for a, b in cases]
    assert expected == [True, False, False, False, True, False, True, True, True]  # torch promotes dtypes
    huge = one(2.0 ** -7, (1 << 17, 1 << 16))
    with one_value_equal():
        assert [torch.equal(a, b) for a, b in cases] == expected
        t = time.monotonic()
        assert torch.equal(huge, huge) and not torch.equal(huge, one(2.0 ** -6, huge.shape))
        assert time.monotonic() - t < 2.0
    assert torch.equal is not None and torch.equal.__module__ != "analyzer.convert.header_blobs"  # restored


def _transposes_program(weight):
    """x → transpose → relu → transpose back (a pair reduce_transposes cancels) → linear with ``weight``."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 8, weight.shape[1]), dtype=types.fp16)])
    def prog(x):
        y = mb.transpose(x=x, perm=[0, 2, 1, 3])
        y = mb.relu(x=y)
        y = mb.transpose(x=y, perm=[0, 2, 1, 3])
        return mb.linear(x=y, weight=weight)

    return prog


def test_reduce_transposes_consts_kept_is_coremltools_pass_without_comparing_weights():
    """``qfold::reduce_transposes_consts_kept`` (step.value_free_pipeline) rewrites as coremltools'
    ``common::reduce_transposes`` does, op for op; only coremltools' pass compares every weight with itself, in
    a temporary as large as the weight (traced here by tracemalloc: numpy reports its buffers to it)."""
    import copy
    import tracemalloc

    import coremltools as ct
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY

    from analyzer.convert.step import VALUE_FREE_TRANSPOSES, value_free_pipeline

    pipeline = value_free_pipeline(ct.PassPipeline.DEFAULT)
    assert VALUE_FREE_TRANSPOSES in pipeline.passes and "common::reduce_transposes" not in pipeline.passes
    weight = np.broadcast_to(np.float16(2.0 ** -7), (1 << 13, 1 << 13))  # 64 Mi elements, 2 bytes stored
    prog = _transposes_program(weight)
    peaks, ops = {}, {}
    for name in ("common::reduce_transposes", VALUE_FREE_TRANSPOSES):
        p = copy.deepcopy(prog)
        tracemalloc.start()
        PASS_REGISTRY[name](p)
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        ops[name] = [(op.op_type, tuple(o.shape for o in op.outputs)) for op in p.functions["main"].operations]
        assert p.find_ops(op_type="const")[-1].outputs[0].val is not None
    assert ops["common::reduce_transposes"] == ops[VALUE_FREE_TRANSPOSES]
    assert [t for t, _ in ops[VALUE_FREE_TRANSPOSES]].count("transpose") == 0  # the pair was cancelled
    assert peaks["common::reduce_transposes"] >= weight.size  # a bool per element
    assert peaks[VALUE_FREE_TRANSPOSES] < weight.size // 16


def test_a_trace_over_zero_pages_skips_the_products_and_records_the_same_graph():
    """``ZeroPageProducts``: every projection and the lm_head (2 layers × 7 + 1 products) and the attention
    products (2 per layer) answered without multiplying, repeat_kv's copies of the empty cache (K and V per layer)
    made lazy zeros, and the traced graph identical op for op, tensor types and strides included, to a trace that
    multiplies and copies (names of torch's mangled classes aside)."""
    import re

    from analyzer.convert.modes import make_step
    from analyzer.convert.step import trace_step
    from analyzer.model.valuefree import ZeroPageProducts

    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    layers = load_config(source).num_hidden_layers
    for variant in ("repeat_kv", "qfold"):
        spec = BuildSpec(source, variant, "state", 512, build_mode=ANALYSIS_MODE)  # repeat_kv's copies: 2^20 each
        graphs, hits = [], []
        for skip in (False, True):
            model = build_value_free_model(source)
            step = make_step(model, spec, "decode", lazy_cache=True)
            mode = ZeroPageProducts(model)
            if skip:
                with mode:
                    traced = trace_step(step)
            else:
                traced = trace_step(step)
            hits.append((mode.weight_hits, mode.activation_hits, mode.copy_hits))
            graphs.append(re.sub(r"\.?___torch_mangle_\d+", "", str(traced.inlined_graph)))
        copies = 2 * layers if variant == "repeat_kv" else 0  # K and V copied per layer, from an empty cache
        assert hits == [(0, 0, 0), (7 * layers + 1, 2 * layers, copies)], variant
        assert graphs[0] == graphs[1] and graphs[0].count("aten::linear") == 7 * layers + 1, variant
