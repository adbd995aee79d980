"""The decode-steps driver on a package qfold did not build (its inputs named by an input spec), and the ``run``
CLI contract: IN.npz → OUT.npz with outputs and final states, one-line errors, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from analyzer.cli import main
from analyzer.engines.interpret import decode_steps, infer_roles, load_interpreter, load_roles, roles_from_json
from analyzer.errors import InterpretError
from tests.shipped_styles import HKV, PREFILL, PREFILL_S, L, S

REPO = Path(__file__).resolve().parent.parent
SLOTS, DIM, VOCAB = 8, 4, 16
TABLE = (np.random.default_rng(3).standard_normal((VOCAB, DIM)) * 0.5).astype(np.float16)
SPEC = {"token_ids": "tok", "position": "where", "causal_mask": "bias", "vocab_size": VOCAB}


def _build_foreign(path: Path, q: int) -> Path:
    """A one-layer "decoder" with its own names: embed the ``q`` tokens ``tok`` (gather), write them into the
    ``memory`` state from slot ``where``, attend over the memory with the additive mask ``bias [1, 1, q, 8]``,
    scale by ``temperature``, project back onto the table: logits ``[q, 16]``."""

    @mb.program(input_specs=[mb.StateTensorSpec(shape=(1, 1, SLOTS, DIM), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, q), dtype=types.int32),
                             mb.TensorSpec(shape=(1,), dtype=types.int32),
                             mb.TensorSpec(shape=(1, 1, q, SLOTS), dtype=types.fp16),
                             mb.TensorSpec(shape=(1,), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(memory, tok, where, bias, temperature):
        e = mb.reshape(x=mb.gather(x=TABLE, indices=tok, axis=0), shape=[1, 1, q, DIM])
        begin = mb.concat(values=[np.array([0, 0], np.int32), where, np.array([0], np.int32)], axis=0)
        upd = mb.slice_update(x=mb.read_state(input=memory), update=e, begin=begin,
                              end=mb.add(x=begin, y=np.array([1, 1, q, DIM], np.int32)))
        mb.coreml_update_state(state=memory, value=upd)
        mem = mb.read_state(input=memory)
        scores = mb.add(x=mb.mul(x=mb.matmul(x=e, y=mem, transpose_y=True), y=temperature), y=bias)
        ctx = mb.matmul(x=mb.softmax(x=scores, axis=-1), y=mem)  # [1, 1, q, DIM]
        return mb.matmul(x=mb.reshape(x=ctx, shape=[q, DIM]), y=TABLE, transpose_y=True, name="logits")

    ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
               minimum_deployment_target=ct.target.iOS18).save(str(path))
    return path


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Path:
    return _build_foreign(tmp_path_factory.mktemp("foreign") / "foreign.mlpackage", 1)


def _reference(tokens: np.ndarray, temperature: float) -> list[np.ndarray]:
    """The same decode in float64, ``tokens [steps, q]``: the token at position p sees slots 0..p."""
    memory, out = np.zeros((SLOTS, DIM)), []
    steps, q = tokens.shape
    for s in range(steps):
        rows = []
        for r, tok in enumerate(tokens[s]):
            memory[s * q + r] = TABLE[tok]
        for r, tok in enumerate(tokens[s]):
            e = TABLE[tok].astype(np.float64)
            scores = memory @ e * temperature + np.where(np.arange(SLOTS) <= s * q + r, 0.0, -30000.0)
            p = np.exp(scores - scores.max())
            rows.append((p / p.sum()) @ memory @ TABLE.astype(np.float64).T)
        out.append(np.stack(rows))
    return out


def test_foreign_names_need_a_spec(foreign):
    interp = load_interpreter(foreign)
    assert infer_roles(interp) is None
    with pytest.raises(InterpretError, match=r"cannot tell which inputs are token ids.*give an input spec"):
        decode_steps(interp, 2)


def test_decode_steps_with_a_spec_matches_the_reference(foreign):
    interp = load_interpreter(foreign)
    run = decode_steps(interp, 4, roles_from_json(SPEC), seed=1)
    assert run.tokens.shape == (4, 1) and run.tokens.max() < VOCAB
    assert set(run.random_inputs) == {"temperature"}  # named by no role: seeded random, the same every step
    temperature = float(run.random_inputs["temperature"][0])
    for got, want in zip(run.outputs, _reference(run.tokens, temperature), strict=True):
        np.testing.assert_allclose(got["logits"].astype(np.float64), want, rtol=2e-3, atol=2e-3)
    written = run.states["memory"][0, 0]
    assert np.array_equal(written[:4], TABLE[run.tokens[:, 0]]) and not written[4:].any()
    again = decode_steps(interp, 4, roles_from_json(SPEC), seed=1)
    assert np.array_equal(again.tokens, run.tokens)  # seeded


def test_several_tokens_per_step(tmp_path):
    """q_len 2 (prefill-style chunks): positions advance by 2 and mask row r of a step sees its own slot."""
    interp = load_interpreter(_build_foreign(tmp_path / "q2.mlpackage", 2))
    run = decode_steps(interp, 3, roles_from_json(SPEC), seed=2)
    assert run.tokens.shape == (3, 2)
    temperature = float(run.random_inputs["temperature"][0])
    for got, want in zip(run.outputs, _reference(run.tokens, temperature), strict=True):
        np.testing.assert_allclose(got["logits"].astype(np.float64), want, rtol=2e-3, atol=2e-3)
    assert np.array_equal(run.states["memory"][0, 0, :6], TABLE[run.tokens.reshape(-1)])


@pytest.mark.parametrize(("doc", "message"), [
    ({"token_ids": "tok", "temperature": 1}, "unknown field 'temperature'"),
    ({"token_ids": 3}, "'token_ids' must name an input"),
    ({"token_ids": "tok", "position": [1]}, "'position' must name an input or list input names"),
    ({"token_ids": "tok", "vocab_size": 0}, "'vocab_size' must be a positive integer"),
    ({"token_ids": "tok", "kv_inputs": [{"input": "x"}]}, r"kv_inputs\[0\] must be an object"),
    ([1, 2], "expected a JSON object"),
])
def test_bad_input_specs(doc, message):
    with pytest.raises(InterpretError, match=message):
        roles_from_json(doc)


def test_spec_naming_a_missing_input(foreign):
    with pytest.raises(InterpretError, match="causal_mask names 'mask', not an input"):
        decode_steps(load_interpreter(foreign), 1, roles_from_json({**SPEC, "causal_mask": "mask"}))


# ------------------------------------------------------------------------------------------------- CLI
def _feed(tmp_path, **arrays) -> Path:
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    return path


def _good_inputs():
    return {"tok": np.array([[3]]), "where": np.array([0]), "bias": np.zeros((1, 1, 1, SLOTS)),
            "temperature": np.array([1.0])}


def test_run_writes_outputs_and_final_states(foreign, tmp_path, capsys):
    out = tmp_path / "out.npz"
    assert main(["run", str(foreign), "--inputs", str(_feed(tmp_path, **_good_inputs())), "--out", str(out)]) == 0
    assert "1 outputs, 1 states" in capsys.readouterr().out
    with np.load(out) as got:
        assert set(got.files) == {"logits", "memory"}
        assert got["logits"].shape == (1, VOCAB) and got["logits"].dtype == np.float16
        assert np.array_equal(got["memory"][0, 0, 0], TABLE[3]) and not got["memory"][0, 0, 1:].any()
        states = tmp_path / "s.npz"
        np.savez(states, memory=got["memory"])
    # the next step from the given states: slot 1 written, slot 0 kept
    second = {**_good_inputs(), "tok": np.array([[5]]), "where": np.array([1])}
    assert main(["run", str(foreign), "--inputs", str(_feed(tmp_path, **second)), "--states", str(states),
                 "--out", str(out)]) == 0
    with np.load(out) as got:
        assert np.array_equal(got["memory"][0, 0, :2], TABLE[[3, 5]])
    # a run's OUT.npz (outputs beside the final states) chains as the next --states as it is
    third = {**_good_inputs(), "tok": np.array([[7]]), "where": np.array([2])}
    chained = tmp_path / "chained.npz"
    assert main(["run", str(foreign), "--inputs", str(_feed(tmp_path, **third)), "--states", str(out),
                 "--out", str(chained)]) == 0
    with np.load(chained) as got:
        assert np.array_equal(got["memory"][0, 0, :3], TABLE[[3, 5, 7]])
    np.savez(states, memory=np.zeros((1, 1, SLOTS, DIM)), stray=np.zeros(1))  # a name that is no state or output
    assert main(["run", str(foreign), "--inputs", str(_feed(tmp_path, **third)), "--states", str(states),
                 "--out", str(chained)]) == 1
    assert "state 'stray' is not among the states" in capsys.readouterr().err


def test_run_decode_steps_from_the_cli(foreign, tmp_path):
    spec, out = tmp_path / "spec.json", tmp_path / "steps.npz"
    spec.write_text(json.dumps(SPEC))
    assert load_roles(spec).vocab_size == VOCAB
    assert main(["run", str(foreign), "--steps", "3", "--input-spec", str(spec), "--seed", "4", "--out", str(out)]) == 0
    with np.load(out) as got:
        assert got["logits"].shape == (3, 1, VOCAB) and got["tokens"].shape == (3, 1)
        assert np.array_equal(got["memory"][0, 0, :3], TABLE[got["tokens"][:, 0]])


@pytest.mark.parametrize(("change", "message"), [
    ({"drop": "bias"}, "input 'bias' (fp16 [1,1,1,8]) is missing"),
    ({"extra": np.zeros(2)}, "input 'extra' is not among the inputs"),
    ({"tok": np.zeros((1, 2))}, "input 'tok' has shape [1, 2]; the program declares [1,1]"),
])
def test_run_input_errors_are_one_line(foreign, tmp_path, capsys, change, message):
    inputs = _good_inputs()
    inputs.pop(change.pop("drop", None), None)
    inputs.update(change)
    out = tmp_path / "o.npz"
    assert main(["run", str(foreign), "--inputs", str(_feed(tmp_path, **inputs)), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()


def test_run_rejects_pickles_and_non_npz(foreign, tmp_path, capsys):
    pickled = tmp_path / "obj.npz"
    np.savez(pickled, tok=np.array([{"a": 1}], dtype=object))
    text = tmp_path / "text.npz"
    text.write_text("not a zip")
    for bad in (pickled, text):
        assert main(["run", str(foreign), "--inputs", str(bad), "--out", str(tmp_path / "o.npz")]) == 1
        err = capsys.readouterr().err
        assert "cannot read --inputs as .npz" in err and err.count("\n") == 1


def test_run_on_a_bad_package_exits_nonzero_without_traceback(tmp_path):
    fake = tmp_path / "fake.mlpackage"
    fake.mkdir()
    proc = subprocess.run([sys.executable, "-m", "analyzer", "run", str(fake), "--inputs", "in.npz", "--out",
                           str(tmp_path / "o.npz")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 or all(
        line.startswith(("Failed to load", "Torch version", "error: ")) for line in proc.stderr.strip().splitlines())


# ------------------------------------------------------------------------------------------------- spec fields
def test_run_steps_with_an_update_mask_several_positions_and_no_token_ids(shipped_styles, tmp_path, capsys):
    """The input spec's newer fields on the converters' own inputs (tests/shipped_styles.py): CoreML-LLM's
    ``update_mask`` one-hot at each step's slot (its masked write K·(1−m) + k·m then writes that slot only), and
    ANEMLL's prefill chunk: no token ids (hidden states in), two position inputs (``position_ids [64]`` from p,
    ``current_pos [1]`` = p)."""
    llm, anemll = shipped_styles["coreml_llm"][0], shipped_styles["anemll_prefill"][0]
    spec = tmp_path / "llm.json"
    spec.write_text(json.dumps({"token_ids": "input_ids", "position": ["position_ids"], "causal_mask": "causal_mask",
                                "update_mask": "update_mask"}))
    assert main(["run", str(llm), "--steps", "5", "--input-spec", str(spec), "--out", str(tmp_path / "a.npz")]) == 0
    with np.load(tmp_path / "a.npz") as got:
        cache = got["kv_cache_0"]  # [2L, Hkv, S, D], zeros before the first step
        assert cache.shape[:3] == (2 * L, HKV, S) and got["tokens"].shape == (5, 1)
        assert (np.abs(cache[:, :, :5]).max(axis=-1) > 0).all()  # every step wrote its slot, in every layer
        assert not cache[:, :, 5:].any()  # slots the update mask never named stay zero

    spec = tmp_path / "anemll.json"
    spec.write_text(json.dumps({"position": ["position_ids", "current_pos"], "causal_mask": "causal_mask"}))
    assert main(["run", str(anemll), "--steps", "1", "--input-spec", str(spec), "--out", str(tmp_path / "b.npz")]) == 0
    with np.load(tmp_path / "b.npz") as got:
        cache = got["model_model_kv_cache_0"]
        assert cache.shape[2] == PREFILL_S and got["tokens"].size == 0  # no token ids: none drawn
        assert (np.abs(cache[:, :, :PREFILL]).max(axis=-1) > 0).all() and not cache[:, :, PREFILL:].any()
    capsys.readouterr()
    assert main(["run", str(anemll), "--steps", "2", "--input-spec", str(spec), "--out", str(tmp_path / "c.npz")]) == 1
    err = capsys.readouterr().err  # 2 chunks of 64 rows do not fit 80 slots: refused before anything runs
    assert err.strip() == "error: --steps 2: positions 0 to 127 do not fit the cache's 80 slots"
