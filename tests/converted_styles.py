"""Packages made the way people make them (issue #37, item 6): a tiny random transformers decoder, traced with
``torch.jit.trace`` and converted by plain ``ct.convert``, following each converter's published code path. The
hand-written ``mb.program`` styles (tests/shipped_styles.py) stay as unit tests of the pass; these are the evidence
that real packages fold.

``recipe_eager`` / ``recipe_sdpa``  Apple's "On Device Llama 3.1 with Core ML" recipe
    (machinelearning.apple.com/research/core-ml-on-device-llama): ``LlamaForCausalLM`` wrapped as its
    ``KvCacheStateLlamaForCausalLM``: a ``SliceUpdateKeyValueCache`` whose ``k``/``v`` tensors
    ``[L, 1, Hkv, S, D]`` are registered buffers ``keyCache``/``valueCache`` (converted to ``ct.StateType``),
    written at ``[past_seen_tokens, past_seen_tokens + q)`` and read up to that end; ``past_seen_tokens =
    causal_mask.shape[-1] - input_ids.shape[-1]``; traced on ``inputIds [1, 2]`` and ``causalMask [1, 1, 2, 5]``;
    attention ``eager`` (transformers' ``repeat_kv`` then matmuls) or ``sdpa`` (``sdpa_attention_forward``: with a
    mask it repeats K/V itself and calls ``F.scaled_dot_product_attention``).
``hf_export``  Hugging Face's Core ML export of Mistral (huggingface/swift-transformers,
    ``Examples/Mistral7B/export.py``): ``MistralForCausalLM`` whose attention is its ``SliceUpdateMistralAttention``
    (cache written at ``(end_step - q_len, end_step)`` with ``end_step = attention_mask.shape[-1]``, then
    ``repeat_kv`` on K and V and ``F.scaled_dot_product_attention``), the same buffers and trace, and an int4
    per-block ``linear_quantize_weights`` of the fp16 package.

Every style: ``ct.RangeDim(1, S)`` token ids and mask (``inputIds [1, q]``, ``causalMask [1, 1, q, end]``) or
``ct.EnumeratedShapes`` of them, ``minimum_deployment_target=ct.target.iOS18``, fp16, and int4 per block of 32
input values (the recipes' config; ``weight_threshold`` lowered so a tiny model's weights are quantized as a full
one's are). transformers 5.x renamed what the converters' code overrides (``cache`` for ``past_key_value``,
rotary embeddings passed in, no ``MISTRAL_ATTENTION_CLASSES``): the wrappers below keep each code path's ops and
take the new names.

Shapes: V vocab, H hidden, Hq query heads, Hkv KV heads (G = Hq / Hkv), D head dim, S cache slots, L layers.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

V, H, HQ, HKV, L, S = 64, 32, 4, 2, 2, 16
D = H // HQ
G = HQ // HKV
ENUMERATED_Q = (1, 2, 4)  # the enumerated shapes' query lengths (the mask sees all S slots)
STYLES = ("recipe_eager", "recipe_sdpa", "hf_export")
SHAPES = ("range", "enum")
PRECISIONS = ("fp16", "int4")
INT4_BLOCK = 32  # OpLinearQuantizerConfig(block_size=32) in both the recipe and swift-transformers' export


def _config(style: str):
    import torch
    from transformers import LlamaConfig, MistralConfig

    torch.manual_seed(37)
    common = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=L, num_attention_heads=HQ,
                  num_key_value_heads=HKV, max_position_embeddings=S)
    if style == "hf_export":
        return MistralConfig(**common, sliding_window=None, attn_implementation="sdpa")
    return LlamaConfig(**common, attn_implementation=style.removeprefix("recipe_"))


def _modules():
    """The converters' torch classes, written against transformers 5.x (imports deferred: torch is heavy)."""
    import torch
    from transformers import LlamaForCausalLM, MistralForCausalLM
    from transformers.cache_utils import Cache
    from transformers.models.mistral.modeling_mistral import MistralAttention, apply_rotary_pos_emb, repeat_kv

    class SliceUpdateKeyValueCache(Cache):
        """The recipe's cache: ``k``/``v`` of ``[L, 1, Hkv, S, D]``, written in place at a slice, read up to its
        end. ``update`` takes the slice the recipe computes (``past_seen_tokens`` + the new tokens) unless the
        caller names it (swift-transformers' ``slice_indices``)."""

        def __init__(self, *, shape, dtype=torch.float32) -> None:
            super().__init__(layers=[])
            self.past_seen_tokens = 0
            self.k = torch.zeros(shape, dtype=dtype)
            self.v = torch.zeros(shape, dtype=dtype)

        def update(self, k_state, v_state, layer_idx, *args, slice_indices=None, **kwargs):
            begin, end = slice_indices or (self.past_seen_tokens, self.past_seen_tokens + k_state.shape[-2])
            self.k[layer_idx, :, : k_state.shape[1], begin:end, :] = k_state
            self.v[layer_idx, :, : v_state.shape[1], begin:end, :] = v_state
            return self.k[layer_idx, :, :, :end, :], self.v[layer_idx, :, :, :end, :]

        def get_seq_length(self, _=0) -> int:
            return self.past_seen_tokens

    class SliceUpdateMistralAttention(MistralAttention):
        """swift-transformers' attention: the cache written at ``(end_step - q_len, end_step)``, then repeat_kv and
        ``F.scaled_dot_product_attention`` with the mask."""

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
            bsz, q_len, _ = hidden_states.size()
            q = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
            k = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
            v = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
            cos, sin = position_embeddings
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            end_step = attention_mask.shape[-1]
            k, v = cache.update(k, v, self.layer_idx, slice_indices=(end_step - q_len, end_step))
            k = repeat_kv(k, self.num_key_value_groups)
            v = repeat_kv(v, self.num_key_value_groups)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask)
            out = out.transpose(1, 2).contiguous().view(bsz, q_len, -1)
            return self.o_proj(out), None

    class KvCacheStateModel(torch.nn.Module):
        """The recipe's ``KvCacheStateLlamaForCausalLM`` (and swift-transformers' ``StatefulMistralForCausalLM``):
        the cache's tensors registered as buffers, ``past_seen_tokens`` from the input shapes."""

        def __init__(self, style: str) -> None:
            super().__init__()
            config = _config(style)
            self.model = (MistralForCausalLM if style == "hf_export" else LlamaForCausalLM)(config).eval()
            if style == "hf_export":
                for i, layer in enumerate(self.model.model.layers):
                    attn = SliceUpdateMistralAttention(config, i)
                    attn.load_state_dict(layer.self_attn.state_dict())
                    layer.self_attn = attn
            self.kv_cache_shape = (L, 1, HKV, S, D)
            self.kv_cache = SliceUpdateKeyValueCache(shape=self.kv_cache_shape)
            self.register_buffer("keyCache", self.kv_cache.k)
            self.register_buffer("valueCache", self.kv_cache.v)

        @torch.no_grad()
        def forward(self, input_ids, causal_mask):
            self.kv_cache.past_seen_tokens = causal_mask.shape[-1] - input_ids.shape[-1]
            return self.model(input_ids, attention_mask=causal_mask, past_key_values=self.kv_cache,
                              use_cache=True).logits

    return KvCacheStateModel


def convert(style: str, shapes: str, path: Path) -> Path:
    """One style traced and converted with plain coremltools (fp16), saved at ``path``."""
    import coremltools as ct
    import torch

    model = _modules()(style).eval()
    example = (torch.zeros((1, 2), dtype=torch.int32), torch.zeros((1, 1, 2, 5), dtype=torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example)
    if shapes == "range":
        query, end = ct.RangeDim(lower_bound=1, upper_bound=S, default=1), ct.RangeDim(lower_bound=1, upper_bound=S,
                                                                                       default=1)
        ids, mask = (1, query), (1, 1, query, end)
    else:
        ids = ct.EnumeratedShapes(shapes=[[1, q] for q in ENUMERATED_Q], default=[1, 1])
        mask = ct.EnumeratedShapes(shapes=[[1, 1, q, S] for q in ENUMERATED_Q], default=[1, 1, 1, S])
    states = [ct.StateType(wrapped_type=ct.TensorType(shape=model.kv_cache_shape, dtype=np.float16), name=n)
              for n in ("keyCache", "valueCache")]
    mlmodel = ct.convert(traced, inputs=[ct.TensorType(shape=ids, dtype=np.int32, name="inputIds"),
                                         ct.TensorType(shape=mask, dtype=np.float16, name="causalMask")],
                         outputs=[ct.TensorType(dtype=np.float16, name="logits")], states=states,
                         minimum_deployment_target=ct.target.iOS18, skip_model_load=True)
    mlmodel.save(str(path))
    return path


def quantize_int4(src: Path, dst: Path) -> Path:
    """The recipes' int4: ``linear_quantize_weights`` linear-symmetric int4 per block of 32 input values."""
    import coremltools as ct
    import coremltools.optimize.coreml as cto

    config = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4", granularity="per_block",
                                         block_size=INT4_BLOCK, weight_threshold=1)
    model = ct.models.MLModel(str(src), skip_model_load=True)
    cto.linear_quantize_weights(model, config=cto.OptimizationConfig(global_config=config)).save(str(dst))
    return dst


def causal_mask(q: int, end: int) -> np.ndarray:
    """``[1, 1, q, end]``: row i sees the slots up to ``end - q + i`` (the recipe's mask), -inf as fp16's -1e4."""
    seen = np.arange(end)[None, :] <= end - q + np.arange(q)[:, None]
    return np.where(seen, np.float16(0), np.float16(-1e4)).astype(np.float16)[None, None]


def call_inputs(q: int, end: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One call: q token ids after ``end - q`` cached tokens."""
    rng = np.random.default_rng(seed)
    return {"inputIds": rng.integers(0, V, (1, q)).astype(np.int32), "causalMask": causal_mask(q, end)}


# ------------------------------------------------------------------------------------------------ replication forms
# How a torch model may copy K/V heads (issue #37, item 3), each as plain coremltools converts it:
#   "repeat_kv"        transformers' repeat_kv at static shapes: expand + reshape → tile with constant reps (h // G)
#   "repeat"           k.repeat(1, G, 1, 1) → tile on the head axis (h % Hkv)
#   "index_select"     k.index_select(1, heads) with heads = arange(Hq) // G → gather along the head axis (h // G)
#   "cat"              torch.cat([k] * G, dim=1) → concat of one tensor G times (h % Hkv)
#   "repeat_interleave_tensor"  k.repeat_interleave(tensor([G] * Hkv), dim=1) → transpose → tile → reshape chain
#   "repeats_from_query"  k[:, :, None].expand(1, Hkv, q, S, D): the repeats are the query length, computed per call
FORMS = ("repeat_kv", "repeat", "index_select", "cat", "repeat_interleave_tensor")


def _form_module(form: str):
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    class Step(torch.nn.Module):
        """One attention layer over a KV cache held as state (``kc``/``vc`` ``[1, Hkv, S, D]``), written at the
        slot ``end - 1``; its K/V copy made by ``form``; an output projection after it (attention is not the
        program's output)."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(7)
            self.register_buffer("kc", torch.zeros(1, HKV, S, D))
            self.register_buffer("vc", torch.zeros(1, HKV, S, D))
            self.register_buffer("heads", torch.arange(HQ) // G)
            self.q, self.k, self.v = (torch.nn.Linear(H, n * D) for n in (HQ, HKV, HKV))
            self.o = torch.nn.Linear(HQ * D, H)

        def copy(self, x, q_len):
            if form == "repeat_kv":
                return repeat_kv(x, G)
            if form == "repeat":
                return x.repeat(1, G, 1, 1)
            if form == "index_select":
                return x.index_select(1, self.heads)
            if form == "cat":
                return torch.cat([x] * G, dim=1)
            if form == "repeat_interleave_tensor":
                return x.repeat_interleave(torch.tensor([G] * HKV), dim=1)
            # repeats_from_query: right only where the query length is G
            return x[:, :, None].expand(1, HKV, q_len, x.shape[-2], D).reshape(1, HKV * q_len, x.shape[-2], D)

        def forward(self, hidden, mask):
            q_len, end = hidden.shape[1], mask.shape[-1]
            q = self.q(hidden).view(1, q_len, HQ, D).transpose(1, 2)
            k = self.k(hidden).view(1, q_len, HKV, D).transpose(1, 2)
            v = self.v(hidden).view(1, q_len, HKV, D).transpose(1, 2)
            self.kc[:, :, end - q_len:end] = k
            self.vc[:, :, end - q_len:end] = v
            kk, vv = self.copy(self.kc[:, :, :end], q_len), self.copy(self.vc[:, :, :end], q_len)
            w = torch.softmax(q @ kk.transpose(2, 3) * D ** -0.5 + mask, dim=-1)
            return self.o((w @ vv).transpose(1, 2).reshape(1, q_len, HQ * D))

    return Step


def convert_form(form: str, path: Path) -> Path:
    """A one-layer step whose K/V copy is made by ``form``, traced and converted with plain coremltools: static
    shapes (hidden ``[1, 1, H]``, mask ``[1, 1, 1, S]``), or for ``repeats_from_query`` ``ct.RangeDim`` query and
    context lengths (traced at q = G)."""
    import coremltools as ct
    import torch

    model = _form_module(form)().eval()
    flexible = form == "repeats_from_query"
    q = G if flexible else 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, (torch.zeros(1, q, H), torch.zeros(1, 1, q, S)))
    if flexible:
        query, end = ct.RangeDim(1, S, default=1), ct.RangeDim(1, S, default=S)
        shapes = (1, query, H), (1, 1, query, end)
    else:
        shapes = (1, 1, H), (1, 1, 1, S)
    states = [ct.StateType(wrapped_type=ct.TensorType(shape=(1, HKV, S, D), dtype=np.float16), name=n)
              for n in ("kc", "vc")]
    mlmodel = ct.convert(traced, inputs=[ct.TensorType(shape=shapes[0], dtype=np.float16, name="hidden"),
                                         ct.TensorType(shape=shapes[1], dtype=np.float16, name="mask")],
                         states=states, minimum_deployment_target=ct.target.iOS18, skip_model_load=True)
    mlmodel.save(str(path))
    return path


# How a torch model may copy K/V heads as coreai-torch converts it (torch.export + TorchConverter):
#   "cat"           torch.cat([k] * G, dim=1) → coreai.concat of one value G times (h % Hkv)
#   "repeat"        k.repeat(1, G, 1, 1) → coreai.tile (h % Hkv)
#   "repeat_kv"     transformers' repeat_kv (expand + reshape) → coreai.broadcast_in_dims (h // G)
#   "index_select"  k.index_select(1, heads) → coreai.gather_along_axis whose constant index is heads broadcast to
#                   [1, Hq, S, D] (coreai_torch/_aten_to_core.py, replace_index_select)
#   "gather"        torch.gather(k, 1, heads[None, :, None, None].expand(1, Hq, S, D)) → the same gather_along_axis
#   "getitem"       k[:, heads] → coreai.gather_nd with index rows [[0, h0], [0, h1], …] (replace_index_tensor)
#   "index_input"   k.index_select(1, heads) with heads an input of the program: an index computed at run time
CORE_AI_FORMS = ("cat", "repeat", "index_select", "gather", "getitem")
CORE_AI_OP = {"cat": "coreai.concat", "repeat": "coreai.tile", "repeat_kv": "coreai.broadcast_in_dims",
              "index_select": "coreai.gather_along_axis", "gather": "coreai.gather_along_axis",
              "getitem": "coreai.gather_nd", "index_input": "coreai.gather_along_axis"}


def heads_of(hq: int, hkv: int, mapping: str) -> list[int]:
    """The KV head each query head reads: ``h // G`` (repeat_kv's order) or ``h % Hkv`` (``x.repeat``'s)."""
    return [h // (hq // hkv) if mapping == "h // G" else h % hkv for h in range(hq)]


def convert_coreai_form(form: str, path: Path, hq: int = HQ, hkv: int = HKV, mapping: str = "h // G",
                        sdpa: bool = False) -> Path:
    """One attention over K/V inputs ``[1, Hkv, S, D]`` (head dim D, S slots) whose copy is made by ``form`` (see
    :data:`CORE_AI_FORMS`), Hq query heads reading KV head ``heads_of(hq, hkv, mapping)[h]``, through matmuls or (with
    ``sdpa``) ``F.scaled_dot_product_attention`` without ``enable_gqa``; exported with ``torch.export`` and
    converted by coreai-torch's documented calls (``TorchConverter``), as someone porting a model would."""
    import torch
    from coreai_torch import TorchConverter, get_decomp_table
    from transformers.models.llama.modeling_llama import repeat_kv

    g = hq // hkv

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(7)
            self.o = torch.nn.Linear(hq * D, H)
            self.register_buffer("heads", torch.tensor(heads_of(hq, hkv, mapping)))

        def copy(self, x, heads):
            if form == "cat":
                return torch.cat([x] * g, dim=1)
            if form == "repeat":
                return x.repeat(1, g, 1, 1)
            if form == "repeat_kv":
                return repeat_kv(x, g)
            if form == "gather":
                return torch.gather(x, 1, heads[None, :, None, None].expand(1, hq, x.shape[2], x.shape[3]))
            if form == "getitem":
                return x[:, heads]
            return x.index_select(1, heads)  # index_select, index_input

        def forward(self, q, k, v, *heads):  # q [1, Hq, 1, D]; heads: the index_input form's [Hq] input
            heads = heads[0] if heads else self.heads
            kk, vv = self.copy(k, heads), self.copy(v, heads)
            if sdpa:
                out = torch.nn.functional.scaled_dot_product_attention(q, kk, vv)
            else:
                out = torch.softmax(q @ kk.transpose(2, 3) * D ** -0.5, dim=-1) @ vv
            return self.o(out.transpose(1, 2).reshape(1, 1, hq * D))

    example = (torch.zeros(1, hq, 1, D), torch.zeros(1, hkv, S, D), torch.zeros(1, hkv, S, D))
    if form == "index_input":
        example = (*example, torch.tensor(heads_of(hq, hkv, mapping)))
    ep = torch.export.export(Step().eval(), example).run_decompositions(get_decomp_table())
    TorchConverter().add_exported_program(ep).to_coreai().save_asset(Path(path))
    return Path(path)
