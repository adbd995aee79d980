"""Context sweeps at the price of two conversions (issue 23, item 3): the affine law on programs written by hand, and
the plan (which points are converted, which derived, never across a config threshold). No conversion: the real
sweep whose derived rows equal direct builds is in tests/test_sweep.py, beside the builds it shares."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analyzer.analysis.accounting import account
from analyzer.analysis.ctx_affine import CtxLawError, canonical, derive_program, prove_affine, same_program
from analyzer.ir.mil_records import InputRef, MilProgram, OpRecord, TensorInfo, tensor_nbytes
from analyzer.sweep.derive import plan_segments
from analyzer.sweep.driver import plan_points
from analyzer.sweep.grid import make_spec


# ------------------------------------------------------------------------------------------------- the law by hand
def _t(name: str, shape: tuple[int, ...], dtype: str = "fp16") -> TensorInfo:
    return TensorInfo(name, shape, dtype, tensor_nbytes(shape, dtype))


def _program(ctx: int, *, half: int | None = None, name: str = "x_1", drop_last: bool = False) -> MilProgram:
    """read_state [1, 2, S, 4] → tile (reps [1, 1, 2, 1, 1] as a const) → [1, 2, 2, S, 4]: the tile writes
    1·2·2·S·4 fp16 = 32·S bytes. ``half``: the tile's S axis is ``half`` instead (a number of one's choosing)."""
    cache = _t("k_cache_0", (1, 2, ctx, 4))
    read = _t("read_0", (1, 2, ctx, 4))
    reps = _t("reps", (5,), "int32")
    tiled = _t(name, (1, 2, 2, ctx if half is None else half, 4))
    ops = (OpRecord(0, "read_state", "read_0", 0, "name", (InputRef("input", cache, None, False, 0),), (read,), 0),
           OpRecord(1, "const", "reps", None, "", (), (reps,), 20),
           OpRecord(2, "tile", name, 0, "name", (InputRef("x", read, 0, False, 0), InputRef("reps", reps, 1, True, 20)),
                    (tiled,), 0, tile_kind="kv_replication"))
    return MilProgram("", "main", "CoreML8", 9, (), (cache,), (tiled,), ops[:2] if drop_last else ops)


def test_a_program_at_any_ctx_follows_from_two_and_its_bytes_add_up_by_hand():
    a, b = (256, _program(256)), (512, _program(512))
    for ctx in (384, 1024, 65536):  # between, and past the second point
        derived = derive_program(a, b, ctx)
        assert derived == canonical(_program(ctx)) and same_program(derived, _program(ctx)) is None
        assert derived.ops[2].outputs[0].nbytes == 32 * ctx
        assert account(derived).per_token().get("replication") == account(_program(ctx)).per_token().get(
            "replication")
    prove_affine(a, b, (4096, _program(4096)))
    # an op's inputs are a protobuf map: their order differs between conversions and is not structure
    tile = _program(512).ops[2]
    swapped = replace(_program(512), ops=(*_program(512).ops[:2], replace(tile, inputs=tile.inputs[::-1])))
    assert derive_program(a, (512, swapped), 1024) == derive_program(a, b, 1024)


@pytest.mark.parametrize(("check", "needle"), [
    (_program(1024, half=1025), r"op 2 \(tile x_1\): derived outputs \[1,2,2,1024,4\], converted \[1,2,2,1025,4\]"),
    (_program(1024, drop_last=True), "3 ops derived, 2 converted"),
])
def test_a_check_that_does_not_follow_the_law_is_refused_naming_the_first_difference(check, needle):
    with pytest.raises(CtxLawError, match=needle):
        prove_affine((256, _program(256)), (512, _program(512)), (1024, check))


def test_programs_of_another_structure_or_a_fractional_size_are_refused():
    with pytest.raises(CtxLawError, match=r"op 2 \(tile x_1\).*'x_1'.* at ctx 256 but .*'x_2'.* at ctx 512"):
        derive_program((256, _program(256)), (512, _program(512, name="x_2")), 1024)
    with pytest.raises(CtxLawError, match="program: op count 3 at ctx 256 but 2 at ctx 512"):
        derive_program((256, _program(256)), (512, _program(512, drop_last=True)), 1024)
    halves = (256, _program(256, half=128)), (512, _program(512, half=256))  # an axis of S/2
    assert derive_program(*halves, 300).ops[2].outputs[0].shape == (1, 2, 2, 150, 4)
    with pytest.raises(CtxLawError, match=r"dimension 3: 128 at ctx 256 and 256 at ctx 512 give 150.5 at ctx 301"):
        derive_program(*halves, 301)


# ------------------------------------------------------------------------------------------------- the plan
def _segments(model: str, ctx: list[int], overrides=()):
    spec = make_spec({"model": [model], "ctx": [",".join(map(str, ctx))], "set": list(overrides)})
    plans = plan_points(spec, spec.points())
    specs = [p.spec for p in plans]
    return specs, plan_segments(specs)


def test_the_8b_sweep_of_the_issue_converts_three_points_per_variant_and_derives_the_largest():
    ctx = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    specs, segments = _segments("llama-3.1-8b", ctx)
    # Llama 3.1's RoPE original_max_position_embeddings (8,192) is no threshold: one segment per variant
    assert sorted(specs[s.converted[0]].variant for s in segments) == ["qfold", "repeat_kv"]
    for s in segments:
        assert [specs[i].ctx for i in s.converted] == [512, 1024, 32768]
        assert [specs[i].ctx for i in s.derived] == [2048, 4096, 8192, 16384, 65536]
        assert s.regime == ()


def test_nothing_is_derived_across_a_sliding_window_or_past_max_positions():
    # gemma 3: five of six layers slide over 512 tokens; its max_position_embeddings is 32,768
    ctx = [256, 384, 512, 768, 1024, 1536, 2048, 40000, 50000, 60000, 65536]
    specs, segments = _segments("gemma-3-1b", ctx, ["num_hidden_layers=2"])
    assert len(segments) == 2  # one per variant: the points above the window, below max positions
    for s in segments:
        assert s.regime == ("sliding_window=512 < ctx",)
        assert [specs[i].ctx for i in s.converted] == [768, 1024, 1536]
        assert [specs[i].ctx for i in s.derived] == [2048]  # 256-512 are three points: all converted
    # without the window the same points form one segment per variant, and 2048 is derived from 256, 384 and 1536
    specs, segments = _segments("gemma-3-1b", ctx[:7], ["num_hidden_layers=2", "sliding_window=4096"])
    assert [[specs[i].ctx for i in s.converted] for s in segments] == [[256, 384, 1536]] * 2
