"""The shape an analysis assumes for each flexible input (analyzer/analysis/shapes.py, issue #20): query lengths at
their lower bound, contexts at their upper bound, an enumerated input at its default, anything else given or
refused naming the input; and the fold's refusal of a size it needs static, naming it."""

from __future__ import annotations

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import get_new_symbol, types

from analyzer.analysis.record import load_analysis
from analyzer.analysis.shapes import InputRange, assume_shapes, parse_shape_text
from analyzer.cli import main
from analyzer.engines.interpret.values import MAX_ARRAY_BYTES_ENV
from analyzer.errors import ShapeError
from analyzer.fold.coreml.gqa_fold import fold_gqa_replication
from tests.shipped_styles import save

H = 8


def flexible(name: str, dtype: str, lower: tuple, upper: tuple) -> InputRange:
    return InputRange(name, dtype, lower, lower, upper)


def test_query_lengths_at_their_lower_bound_contexts_at_their_upper_bound():
    ranges = (flexible("inputIds", "int32", (1, 1), (1, 64)),
              flexible("causalMask", "fp16", (1, 1, 1, 1), (1, 1, 64, 2048)),
              flexible("hidden_states", "fp16", (1, 1, 256), (1, 64, 256)),
              flexible("past_key_values", "fp16", (1, 8, 1, 64), (1, 8, 4096, 64)),
              InputRange("position", "int32", (1,), (1,), (1,)))  # static: not listed
    assert [(a.name, a.shape, a.how) for a in assume_shapes(ranges)] == [
        ("inputIds", (1, 1), "query length at its lower bound"),
        ("causalMask", (1, 1, 1, 2048), "query length at its lower bound, context at its upper bound"),
        ("hidden_states", (1, 1, 256), "query length at its lower bound"),
        ("past_key_values", (1, 8, 4096, 64), "context at its upper bound")]
    given = assume_shapes(ranges, parse_shape_text("inputIds=1,8; causalMask=1,1,8,512"))
    assert [(a.shape, a.how) for a in given[:2]] == [((1, 8), "given (--shape)"), ((1, 1, 8, 512), "given (--shape)")]


def test_what_cannot_be_defaulted_is_refused_naming_the_input(monkeypatch):
    features = flexible("features", "fp16", (1, 1), (1, 8))  # neither a query length nor a context
    with pytest.raises(ShapeError, match=r"input 'features' accepts \[1,1…8\]: its flexible dimension 1 is not a "
                                         r"query length or a context; give --shape features=1,1"):
        assume_shapes((features,))
    unbounded = InputRange("causalMask", "fp16", (1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, None))
    with pytest.raises(ShapeError, match=r"its flexible dimension 3 has no upper bound; give --shape causalMask="):
        assume_shapes((unbounded,))
    assert assume_shapes((unbounded,), {"causalMask": (1, 1, 1, 4096)})[0].shape == (1, 1, 1, 4096)
    monkeypatch.setenv(MAX_ARRAY_BYTES_ENV, str(1 << 20))  # any size is in range: the arrays made at it are not
    with pytest.raises(ShapeError, match=r"causalMask=1,1,1,1000000: 2,000,000 bytes, more than the 1,048,576"):
        assume_shapes((unbounded,), {"causalMask": (1, 1, 1, 1_000_000)})
    with pytest.raises(ShapeError, match=r"outside what input 'features' accepts \(\[1,1…8\]\)"):
        assume_shapes((features,), {"features": (1, 9)})


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """Two tiny flexible packages: hidden states of an enumerated length ([1, 2 | 4, H], default 4) and a
    ``features [1, 1…8]`` input no default rule covers."""
    root = tmp_path_factory.mktemp("shapes")
    w = np.random.default_rng(0).standard_normal((H, H)).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec((1, get_new_symbol(), H), types.fp16)], opset_version=ct.target.iOS18)
    def rows(hidden_states):
        return mb.linear(x=hidden_states, weight=w)

    @mb.program(input_specs=[mb.TensorSpec((1, get_new_symbol()), types.fp16)], opset_version=ct.target.iOS18)
    def feats(features):
        return mb.mul(x=features, y=np.float16(2))

    enum = ct.TensorType(name="hidden_states", shape=ct.EnumeratedShapes(shapes=[(1, 2, H), (1, 4, H)],
                                                                          default=(1, 4, H)))
    free = ct.TensorType(name="features", shape=ct.Shape((1, ct.RangeDim(1, 8))))
    return save(rows, root / "enumerated.mlpackage", [enum]), save(feats, root / "features.mlpackage", [free])


def test_an_enumerated_input_is_analysed_at_its_default_and_takes_only_its_shapes(packages, capsys):
    enumerated, _ = packages
    a = load_analysis(enumerated)
    assert [(x.name, x.shape, x.how) for x in a.program.assumed_shapes] == [
        ("hidden_states", (1, 4, H), "the enumerated default")]
    assert (a.call.phase, a.call.tokens_per_call) == ("prefill", 4)  # 4 rows of hidden states per call
    assert load_analysis(enumerated, shapes={"hidden_states": (1, 2, H)}).call.tokens_per_call == 2
    assert main(["inspect", enumerated, "--shape", f"hidden_states=1,3,{H}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --shape hidden_states=1,3,{H}: outside what input 'hidden_states' accepts "
                   f"(one of [1,4,{H}], [1,2,{H}])")  # as the package lists them


@pytest.mark.parametrize("command", ["inspect", "fold", "run"])
def test_a_dimension_no_rule_covers_must_be_given(packages, command, tmp_path, capsys):
    _, features = packages
    argv = {"inspect": ["inspect", features],
            "fold": ["fold", features, str(tmp_path / "out.mlpackage"), "--builds-dir", str(tmp_path / "b")],
            "run": ["run", features, "--steps", "2", "--out", str(tmp_path / "o.npz")]}[command]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "input 'features' accepts [1,1…8]" in err[0] and "give --shape features=1,1" in err[0]
    assert main([*argv, "--shape", "features=1,5"]) == 0
    out = capsys.readouterr().out
    assert "nothing to fold" in out if command == "fold" else "features [1,5] (given (--shape))" in out


def test_the_fold_refuses_a_symbolic_batch_naming_the_size_it_needs():
    """The rewrite works with a symbolic query length or context, but regroups heads on static batch and head
    axes: a symbolic batch is refused, and the refusal says which size."""
    b = get_new_symbol()

    @mb.program(input_specs=[mb.TensorSpec((b, 4, 1, H), types.fp16), mb.TensorSpec((b, 2, 16, H), types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(q, k):
        kr = mb.reshape(x=mb.tile(x=mb.expand_dims(x=k, axes=[2]), reps=[1, 1, 2, 1, 1]), shape=[-1, 4, 16, H])
        return mb.softmax(x=mb.matmul(x=q, y=kr, transpose_y=True), axis=-1)

    graph_pass = fold_gqa_replication()
    graph_pass(prog)
    (decision,) = graph_pass.decisions
    assert not decision.folded and decision.replication
    assert "its batch or head axes are symbolic (the fold needs them static)" in decision.reason
