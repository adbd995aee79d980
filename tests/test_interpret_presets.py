"""The MIL interpreter against torch on qfold's own conversions of every preset (2 layers, small MLP and vocab,
the preset's own attention geometry: conftest ``preset_source``): teacher-forced fp16 logits over 5 decode steps.

Tolerance: max |Δ logits| ≤ 1e-2 × max |logit|. Both sides compute in fp16 but round at different points:
torch's CPU kernels and the interpreter each accumulate products in fp32, while coremltools' passes reorder and
fuse the graph (the attention scale folded into the query, norms rewritten as pow/reduce_mean/rsqrt, casts
moved). One fp16 rounding is 2^-11 ≈ 4.9e-4 relative; measured differences are 0.9e-3 to 1.6e-3 × max |logit|
across the presets (a few roundings), and the bound leaves room for that while a real semantic error (a mask
off by one slot, a wrong KV head, a RoPE position off by one) moves logits by O(max |logit|):
``test_a_wrong_mask_is_caught`` shows one such error failing the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analyzer.engines.interpret import decode_steps, infer_roles, load_interpreter
from analyzer.engines.interpret.roles import InputRoles
from analyzer.model.decode import DecodeStep, build_model, run_decode
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from tests.conftest import PRESET_CTX, TINY_CTX, TINY_OVERRIDES, preset_source
from tests.test_families import GQA

PRESETS = [*GQA, "phi-3-mini-4k"]
CTX, STEPS, VOCAB = PRESET_CTX, 5, 512  # VOCAB: PRESET_SHRINK's vocab_size
REL_TOL = 1e-2


def _torch_fp16(source, kv_mode: str, variant: str, ctx: int, tokens: list[int]) -> np.ndarray:
    step = DecodeStep(build_model(source, torch.float16), ctx, variant, kv_mode).eval()
    return run_decode(step, tokens, torch.float16).float().numpy()


def _logits(run) -> np.ndarray:
    return np.stack([o["logits"][0, -1].astype(np.float32) for o in run.outputs])


def _rel_diff(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


def _converted(preset_packages, preset: str, kv_mode: str):
    """The session's repeat_kv package of the preset (conftest ``preset_packages``), tokens and torch's logits."""
    source = preset_source(preset)
    path = preset_packages(preset, "repeat_kv", kv_mode)
    tokens = np.random.default_rng(11).integers(0, VOCAB, STEPS).tolist()
    return path, tokens, _torch_fp16(source, kv_mode, "repeat_kv", CTX, tokens)


@pytest.fixture(scope="module", params=PRESETS)
def preset_build(request, preset_packages):
    """One conversion per preset (KV as state), shared by the tests below."""
    return request.param, *_converted(preset_packages, request.param, "state")


@pytest.mark.conversion
def test_interpreter_agrees_with_torch(preset_build):
    preset, path, tokens, reference = preset_build
    interp = load_interpreter(path)
    roles = infer_roles(interp)
    assert roles is not None and roles.token_ids == "input_ids" and not roles.kv_inputs  # KV as state
    run = decode_steps(interp, STEPS, tokens=tokens)
    assert np.array_equal(run.tokens[:, 0], tokens)
    assert _rel_diff(_logits(run), reference) <= REL_TOL, preset
    # the states hold exactly the STEPS written slots and zeros after them
    for name, value in run.states.items():
        assert np.any(value[:, :, STEPS - 1] != 0) and not np.any(value[:, :, STEPS:]), name


@pytest.mark.conversion
def test_a_wrong_mask_is_caught(preset_build):
    """Hiding each token's own slot (the mask of the KV-as-inputs layout) must fail the tolerance."""
    preset, path, tokens, reference = preset_build
    interp = load_interpreter(path)
    wrong = InputRoles("input_ids", "current_pos", "causal_mask", mask_includes_current=False)
    assert _rel_diff(_logits(decode_steps(interp, STEPS, wrong, tokens=tokens)), reference) > REL_TOL, preset


@pytest.mark.conversion
def test_kv_as_inputs_is_driven_through_the_host_cache(preset_packages):
    """KV as inputs: the driver writes ``new_k[i]`` / ``new_v[i]`` into ``k_cache_i`` / ``v_cache_i`` at each
    position, as the torch decode's host does."""
    path, tokens, reference = _converted(preset_packages, "qwen3-0.6b", "input")
    interp = load_interpreter(path)
    roles = infer_roles(interp)
    assert roles is not None and not roles.mask_includes_current and len(roles.kv_inputs) == 4
    assert {(k.input, k.output, k.index) for k in roles.kv_inputs} >= {("k_cache_1", "new_k", 1)}
    run = decode_steps(interp, STEPS, tokens=tokens)
    assert not interp.states and run.states == {}
    assert _rel_diff(_logits(run), reference) <= REL_TOL


@pytest.mark.conversion
@pytest.mark.parametrize("variant", ["repeat_kv", "qfold"])
def test_both_variants_of_the_shared_tiny_build(tiny_builds, variant):
    """The session's tiny builds (the default preset's geometry, ctx 256) of both variants agree with torch."""
    tokens = np.random.default_rng(5).integers(0, 1000, STEPS).tolist()
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    reference = _torch_fp16(source, "state", variant, TINY_CTX, tokens)
    run = decode_steps(load_interpreter(tiny_builds[variant]), STEPS, tokens=tokens)
    assert _rel_diff(_logits(run), reference) <= REL_TOL
