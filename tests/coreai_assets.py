"""Tiny Core AI assets (and a matching fp32 Core ML package) from qfold's own decode step, for the runtime,
fold and bench tests, converted by the Core AI build's own steps (``analyzer.convert.coreai_build``) without a
builds folder, so the torch step stays at hand as the reference; and one asset qfold did not build
(:func:`foreign_asset`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from analyzer.convert.coreai_build import export_step, save_asset, to_program
from analyzer.model.decode import DecodeStep, build_model
from analyzer.model.sources import DEFAULT_PRESET, resolve_source


def make_step(variant: str, overrides, ctx: int, dtype: torch.dtype, seed: int = 0) -> DecodeStep:
    model = build_model(resolve_source(DEFAULT_PRESET, overrides, seed=seed), dtype)
    return DecodeStep(model, ctx, variant, "state").eval()


def coreai_asset(step: DecodeStep, out: Path) -> Path:
    """Convert ``step`` to ``out`` (an ``.aimodel``); the step's cache is left empty."""
    save_asset(to_program(export_step(step), step), out)
    step.reset()
    return out


def coreml_fp32_package(step: DecodeStep, out: Path) -> Path:
    """The same step as an fp32-compute Core ML package with fp32 logits (fp16 KV state, as qfold's builds)."""
    import coremltools as ct
    import numpy as np

    from analyzer.convert.step import convert_kwargs, trace_step

    kwargs = convert_kwargs(step, "mlprogram")
    kwargs["compute_precision"] = ct.precision.FLOAT32
    kwargs["outputs"] = [ct.TensorType(name="logits", dtype=np.float32)]
    ct.convert(trace_step(step), **kwargs).save(str(out))
    step.reset()
    return out


def foreign_asset(out: Path) -> Path:
    """An ``.aimodel`` qfold did not build: a tiny Hugging Face Llama (2 layers, 4 query / 2 KV heads, head dim 16,
    eager attention with transformers' own ``repeat_kv``), its stock forward over 8 prompt tokens (no cache, no
    state) exported and converted with coreai-torch's documented calls, as someone porting a model would."""
    from coreai_torch import TorchConverter, get_decomp_table
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m: torch.nn.Module) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=input_ids, use_cache=False).logits

    ids = torch.randint(0, config.vocab_size, (1, 8))
    ep = torch.export.export(Logits(model), (ids,)).run_decompositions(get_decomp_table())
    TorchConverter().add_exported_program(ep).to_coreai().save_asset(out)
    return out
