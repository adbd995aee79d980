"""Byte accounting on real conversions: KV bytes scale with ctx, every byte belongs to one op."""

import pytest

from analyzer.analysis.accounting import CATEGORIES, account, split_by_bytes
from analyzer.convert.child import convert_step
from analyzer.convert.launch import PACKAGE_NAME
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.decode import DecodeStep, build_model
from analyzer.model.sources import DEFAULT_PRESET, geometry_of, resolve_source

from .conftest import TINY_CTX, TINY_OVERRIDES

pytestmark = pytest.mark.conversion


@pytest.fixture(scope="module")
def model():
    return build_model(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES))


@pytest.fixture(scope="module")
def accounts(model, tiny_builds, tmp_path_factory):
    """(variant, ctx) → the account of a real conversion of the tiny model: ctx 256 is the session's tiny pair
    (the same source, converted by the build child), ctx 64 is converted here."""
    out = {(v, TINY_CTX): account(read_program(path / PACKAGE_NAME)) for v, path in tiny_builds.items()}
    root = tmp_path_factory.mktemp("ctx")
    for variant in ("repeat_kv", "qfold"):
        path = root / f"{variant}-64.mlpackage"
        convert_step(DecodeStep(model, 64, variant, "state").eval()).save(str(path))
        out[variant, 64] = account(read_program(path))
    return out


@pytest.mark.parametrize("ctx", [64, TINY_CTX])
def test_kv_read_is_the_whole_static_cache_and_scales_with_ctx(accounts, model, ctx):
    g = geometry_of(model.config)
    cache_bytes = g.num_layers * 2 * g.num_kv_heads * ctx * g.head_dim * 2
    for variant in ("repeat_kv", "qfold"):
        t = accounts[variant, ctx].totals()
        assert t["kv_read"] == cache_bytes
        assert t["kv_write"] == g.num_layers * 2 * g.num_kv_heads * g.head_dim * 2  # one slot, whatever ctx
        assert t["kv_write_value_semantics"] == cache_bytes
    rk = accounts["repeat_kv", ctx].totals()
    assert rk["replication"] == 2 * g.group_size * cache_bytes  # G copies written, then read again
    assert rk["total"] - accounts["qfold", ctx].totals()["total"] == rk["replication"]


def test_weights_do_not_depend_on_ctx(accounts):
    assert len({a.totals()["weights"] for a in accounts.values()}) == 1


def test_every_byte_belongs_to_exactly_one_op_and_category(accounts):
    for a in accounts.values():
        t = a.totals()
        assert sum(o.total for o in a.ops) == t["total"]
        for c in CATEGORIES:
            assert sum(o.get(c) for o in a.ops) == t[c]
        assert sum(r["total"] for r in a.by_layer()) == t["total"]
        assert not a.unruled_op_types


def test_measured_time_splits_over_an_ops_categories_by_its_bytes(accounts):
    """The one attribution bench's profile and the placement join make (``split_by_bytes``): an op's time over its
    categories in proportion to its bytes, not all of it to its largest; an op moving nothing: the no-bytes bucket."""
    acct = accounts["repeat_kv", TINY_CTX]
    linear = next(o for o in acct.ops if o.weights > 0 and o.activations > 0)  # reads a weight and an activation
    into: dict[str, float] = {}
    split_by_bytes(1.0, (linear,), into, "compute")
    assert into == pytest.approx({c: linear.get(c) / linear.total for c in CATEGORIES if linear.get(c)})
    assert len(into) > 1 and sum(into.values()) == pytest.approx(1.0)
    split_by_bytes(2.0, (next(o for o in acct.ops if o.total == 0),), into, "compute")
    split_by_bytes(0.5, (), into, "compute")  # an op with no account
    assert into["compute"] == 2.5
    whole: dict[str, float] = {}
    split_by_bytes(7.0, acct.ops, whole, "compute")  # several ops (one op type's time): over their summed bytes
    t = acct.totals()
    assert whole == pytest.approx({c: 7.0 * t[c] / t["total"] for c in CATEGORIES if t[c]})


def test_views_move_nothing(accounts):
    a = accounts["repeat_kv", TINY_CTX]
    views = [o for o in a.ops if o.type in ("reshape", "expand_dims", "squeeze", "read_state", "write_state", "const")]
    assert views and all(o.total == 0 for o in views)
