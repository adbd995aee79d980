"""A fold that is not proven is not delivered as proven (issue 37, item 5).

* A proof that runs and finds the folded package computing something else (here: the rewrite handed a wrong head
  mapping through the pass's own ``match``) exits 1, writes no OUT and leaves nothing in the fold cache.
* A proof that cannot run (here: the package holds MIL ``avg_pool``, which the interpreter has no kernel for) says
  why on stderr and in ``--json`` and exits 1 without writing OUT, unless ``--allow-unproven`` or ``--no-proof``.
* The dashboard's A/B equivalence and a ``repeat_kv+fold`` build's show an unproven fold as unproven.

The packages are made as other tools make them (``tests.traced_steps``: torch ``repeat_kv`` step, traced, plain
``ct.convert``), at a fixed sequence length: both fold (two K/V tiles each).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.analysis.buildinfo import EquivalenceCheck
from analyzer.analysis.record import read_analysis_file
from analyzer.cli import main
from analyzer.errors import FoldError
from analyzer.fold.cache import FOLDS_DIR, fold_cached
from analyzer.report.headline import equivalence_summary, equivalence_text, package_fold_summary
from tests.traced_steps import convert_gqa_step

pytestmark = pytest.mark.conversion
V1 = Path(__file__).resolve().parent / "data" / "v1-tiny-repeat_kv-top8.analysis.json"


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """(plain: folds and is proven; pooled: folds, and the interpreter cannot run it)."""
    root = tmp_path_factory.mktemp("proven")
    return (convert_gqa_step(root / "plain.mlpackage", flexible=False, pool=False),
            convert_gqa_step(root / "pooled.mlpackage", flexible=False, pool=True))


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.out, out.err


def _entries(builds: Path) -> list[str]:
    """The fold cache's entries and leftovers (its lock files aside: a lock folder leaves no entry)."""
    folds = builds / FOLDS_DIR
    return sorted(p.name for p in folds.iterdir() if p.name != ".locks") if folds.is_dir() else []


@pytest.fixture
def wrong_head_mapping(monkeypatch):
    """The pass's ``match`` with every replica's head mapping reversed (query head h reads KV head Hkv−1−h//G
    instead of h//G): a rewrite that pairs queries with the wrong K/V heads."""
    from analyzer.fold.coreml.gqa_fold import fold_gqa_replication
    from analyzer.fold.coreml.gqa_pattern import Replica

    right = fold_gqa_replication.match

    def match(self, *args):
        m, *rest = right(self, *args)
        if isinstance(m, Replica):
            hkv = m.source_shape[-3]
            m = replace(m, uses=tuple(replace(u, kv_map=tuple(hkv - 1 - h for h in u.kv_map)) for u in m.uses))
        return (m, *rest)

    monkeypatch.setattr(fold_gqa_replication, "match", match)


def test_a_fold_proven_in_tolerance_is_written_and_cached(packages, capsys, tmp_path):
    builds = tmp_path / "builds"
    code, out, err = _cli(capsys, "fold", packages[0], str(tmp_path / "f.mlpackage"), "--json",
                          "--builds-dir", str(builds))
    doc = json.loads(out)
    assert code == 0 and "warning:" not in err and doc["tiles_folded"] == 2 and doc["output_written"] is True
    assert doc["proof"]["status"] == "proven" and doc["proof"]["roles"].startswith("random draws")
    assert (tmp_path / "f.mlpackage").is_dir() and len(_entries(builds)) == 1


def test_a_fold_whose_proof_fails_exits_1_and_leaves_nothing(packages, capsys, tmp_path, wrong_head_mapping):
    builds = tmp_path / "builds"
    for extra in ((), ("--json",)):
        code, out, err = _cli(capsys, "fold", packages[0], str(tmp_path / "f.mlpackage"), *extra,
                              "--builds-dir", str(builds))
        assert code == 1 and out == ""
        assert f"error: {packages[0]}: the folded model does not compute what the original does: " in err
        assert "over the tolerance" in err and "nothing was kept" in err
        assert not (tmp_path / "f.mlpackage").exists() and _entries(builds) == []
    with pytest.raises(FoldError, match="does not compute what the original does"):
        fold_cached(packages[0], builds)  # the dashboard's "Fold it" route: refused too, nothing cached
    assert _entries(builds) == []


def test_a_fold_cached_without_its_proof_is_proven_when_asked_and_dropped_when_wrong(packages, capsys, tmp_path,
                                                                                    monkeypatch, wrong_head_mapping):
    """``--no-proof`` caches the (here wrong) fold unverified, by the user's choice; the next fold that asks for the
    proof runs it on the cached entry, finds it wrong, exits 1 and removes the entry."""
    builds = tmp_path / "builds"
    code, out, _ = _cli(capsys, "fold", packages[0], str(tmp_path / "u.mlpackage"), "--no-proof", "--json",
                        "--builds-dir", str(builds))
    assert code == 0 and json.loads(out)["proof"]["status"] == "skipped" and len(_entries(builds)) == 1
    monkeypatch.undo()  # the pass is right again: only the cached entry is wrong
    code, out, err = _cli(capsys, "fold", packages[0], str(tmp_path / "p.mlpackage"), "--builds-dir", str(builds))
    assert code == 1 and "does not compute what the original does" in err and _entries(builds) == []
    assert not (tmp_path / "p.mlpackage").exists()
    code, out, _ = _cli(capsys, "fold", packages[0], str(tmp_path / "p.mlpackage"), "--json",
                        "--builds-dir", str(builds))
    assert code == 0 and json.loads(out)["proof"]["status"] == "proven"  # folded again, right this time


def test_a_fold_whose_proof_cannot_run_is_refused_unless_allowed(packages, capsys, tmp_path):
    pooled, builds = packages[1], str(tmp_path / "builds")
    out_pkg = tmp_path / "f.mlpackage"
    code, out, err = _cli(capsys, "fold", pooled, str(out_pkg), "--json", "--builds-dir", builds)
    doc = json.loads(out)
    assert code == 1 and not out_pkg.exists() and doc["output_written"] is False and doc["tiles_folded"] == 2
    assert doc["proof"]["status"] == "unproven" and "avg_pool" in doc["proof"]["reason"]
    assert "error: " in err and "could not be proven" in err and "avg_pool" in err and "--allow-unproven" in err
    code, out, err = _cli(capsys, "fold", pooled, str(out_pkg), "--builds-dir", builds)
    assert code == 1 and "UNPROVEN, the proof could not run" in out and "not written" in out
    code, out, err = _cli(capsys, "fold", pooled, str(out_pkg), "--allow-unproven", "--json", "--builds-dir", builds)
    doc = json.loads(out)
    assert code == 0 and out_pkg.is_dir() and doc["output_written"] is True and doc["proof"]["status"] == "unproven"
    assert f"warning: {pooled}: the fold is unproven" in err and "avg_pool" in err
    code, out, err = _cli(capsys, "fold", pooled, str(tmp_path / "n.mlpackage"), "--no-proof", "--json",
                          "--builds-dir", str(tmp_path / "other-builds"))
    doc = json.loads(out)
    assert code == 0 and doc["proof"]["status"] == "skipped" and (tmp_path / "n.mlpackage").is_dir()
    # --no-proof of a fold cached with a proof that could not run: written, exit 0, and still said to be unproven
    code, out, err = _cli(capsys, "fold", pooled, str(tmp_path / "m.mlpackage"), "--no-proof", "--json",
                          "--builds-dir", builds)
    assert code == 0 and json.loads(out)["proof"]["status"] == "unproven" and "the fold is unproven" in err


def test_the_dashboard_shows_an_unproven_fold_as_unproven(packages, tmp_path):
    pooled = packages[1]
    result = fold_cached(pooled, tmp_path / "builds")
    assert result.proof.status == "unproven" and "UNPROVEN" in result.summary()
    eq = package_fold_summary(pooled, result.artifact)
    assert eq is not None and eq.unproven and eq.fp16_bit_identical is None
    assert "NOT PROVEN" in equivalence_text(eq) and "avg_pool" in equivalence_text(eq)
    proven = fold_cached(packages[0], tmp_path / "builds")
    eq = package_fold_summary(packages[0], proven.artifact)
    assert eq is not None and not eq.unproven and "NOT PROVEN" not in equivalence_text(eq)


def test_a_repeat_kv_fold_build_with_an_unproven_fold_is_shown_unproven():
    """The A/B equivalence of a build and its ``repeat_kv+fold`` build reads the build's "folded vs original"
    check: one that did not run is NOT PROVEN, with why, never "bit-identical" nor left out."""
    original = read_analysis_file(V1)
    b = original.build
    check = EquivalenceCheck("folded_vs_original", "folded vs original", "the stored weights", 4, False,
                             note="UNPROVEN, the proof could not run: op 'x' has type 'avg_pool'")
    folded = replace(original, build=replace(b, key="folded-key", spec=replace(b.spec, variant="repeat_kv+fold"),
                                             extra={"folded_from": b.key}, checks=(*b.checks, check)))
    eq = equivalence_summary(original, folded)
    assert eq is not None and eq.unproven == check.note
    assert equivalence_text(eq).startswith("repeat_kv vs repeat_kv+fold, MIL interpreter, folded vs original: NOT "
                                           "PROVEN — UNPROVEN, the proof could not run: op 'x'")


def test_the_dashboard_folds_a_package_it_cannot_prove_and_says_so(packages, builds_root, monkeypatch):
    """Builds → "Fold it" of a package the interpreter cannot run: a warning saying the fold is UNPROVEN and why,
    never a success; the A/B page's equivalence is NOT PROVEN, with the reason."""
    from tests.test_app import open_page, texts

    pooled = str(Path(packages[1]).resolve())
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(Path(pooled).parent))
    at = open_page("app_pages/builds.py", builds_packages=[pooled])
    at.selectbox(key="builds_fold_pick").set_value(pooled)
    next(b for b in at.button if b.label == "Fold it").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warned = " ".join(texts(at.warning))
    assert "2 of 2 tile ops folded" in warned and "UNPROVEN, the proof could not run" in warned, warned
    assert "avg_pool" in warned and "UNPROVEN" not in " ".join(texts(at.success))
    at.switch_page("app_pages/ab.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warned = " ".join(texts(at.warning))
    assert "Equivalence**: original vs folded, MIL interpreter, folded vs original: NOT PROVEN — UNPROVEN" in warned
    assert not any("Equivalence" in t for t in texts(at.success))
