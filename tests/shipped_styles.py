"""Tiny decoder steps written with ``mb.program`` in the style of the converters people ship with (issue #20),
each saved as a package with plain coremltools. Written from what their public code and packages do, not
copied from it; every model here has random fp16 weights.

Shapes: V vocab, H hidden, Hq query heads, Hkv KV heads (G = Hq / Hkv), D head dim, S cache slots, L layers.

``coreml_llm``   CoreML-LLM: conv-1×1 projections on ``[1, C, 1, 1]``, one unified state ``kv_cache_0 [2L, Hkv,
                 S, D]`` sliced per layer (no layer number in its name), a masked cache write ``K·(1−m) + k·m`` with
                 an ``update_mask`` input and ``k.expand_as(K_cache)`` (a tile along the sequence axis),
                 repeat_interleave of K with the Kᵀ transpose merged into the chain, read through
                 ``matmul(transpose_x=True)``.
``llama_recipe`` Apple's "On Device Llama 3.1 with Core ML": flexible ``inputIds [1, 1…Q]`` and ``causalMask [1, 1,
                 q, end]``, ``keyCache``/``valueCache`` states over all layers, the cache written at ``end − q`` and
                 read up to the flexible ``end``, repeat_kv (expand → tile → reshape) before Q·Kᵀ.
``hf_sdpa``      swift-transformers' Mistral export: flexible inputs, states, K and V tile-copied into the iOS 18
                 fused ``scaled_dot_product_attention``.
``anemll_prefill`` ANEMLL's prefill: hidden states ``[1, 64, H]`` in (no token ids), ``position_ids [64]`` and
                 ``current_pos [1]``, a 64-row causal mask, one unified state, ``x.repeat`` replication (h % Hkv);
                 ``anemll_multifunction``: its ``infer`` (one row) and ``prefill`` functions in one package.
``compress``     any of them with LUT4/6 or int4 weights, as those converters ship them.
"""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import coremltools.optimize.coreml as cto
import numpy as np
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import get_new_symbol, types

IOS18 = ct.target.iOS18
FP16, I32 = types.fp16, types.int32
V, H, HQ, HKV, D, S, L = 64, 32, 4, 2, 8, 16, 2
G = HQ // HKV
PREFILL = 64  # ANEMLL's prefill chunk: 64 rows of hidden states per call
PREFILL_S = 80  # its cache (and RoPE table): room for one 64-row chunk at positions 0…16
QMAX, EMAX = 4, 16  # the flexible ranges: query length 1…QMAX, visible context 1…EMAX (the cache holds EMAX)


def _w(rng, *shape, scale: float = 0.2) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def save(prog, path: Path, inputs=None) -> str:
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=IOS18, inputs=inputs,
                       pass_pipeline=ct.PassPipeline.EMPTY, skip_model_load=True)
    model.save(str(path))
    return str(path)


# ------------------------------------------------------------------------------------------------ CoreML-LLM
def _repeat_interleave_kt(cache, transposed_k: bool):
    """``cache.repeat_interleave(G, dim=1)`` as coremltools lowers it, the last transpose merged with Kᵀ:
    [1, Hkv, S, D] → [Hkv, 1, S, D] → [Hkv, G, 1, S, D] → [Hq, 1, S, D] → [1, Hq, D, S] (or [1, Hq, S, D])."""
    t = mb.transpose(x=cache, perm=[1, 0, 2, 3])
    t = mb.tile(x=mb.expand_dims(x=t, axes=[1]), reps=[1, G, 1, 1, 1])
    t = mb.reshape(x=t, shape=[HQ, 1, S, D])
    return mb.transpose(x=t, perm=[1, 0, -1, -2] if transposed_k else [1, 0, 2, 3])


def coreml_llm(path: Path) -> str:
    rng = np.random.default_rng(1)
    emb = _w(rng, V, H, scale=1.0)
    cos = _w(rng, S, D, scale=1.0)

    @mb.program(input_specs=[mb.TensorSpec((1, 1), I32), mb.TensorSpec((1,), I32), mb.TensorSpec((1, 1, 1, S), FP16),
                             mb.TensorSpec((1, 1, S, 1), FP16), mb.StateTensorSpec((2 * L, HKV, S, D), FP16)],
                opset_version=IOS18)
    def prog(input_ids, position_ids, causal_mask, update_mask, kv_cache_0):
        x = mb.gather(x=emb, indices=input_ids, axis=0)  # [1, 1, H]
        c = mb.reshape(x=mb.gather(x=cos, indices=position_ids, axis=0), shape=[1, 1, 1, D])
        keep = mb.sub(x=np.float16(1), y=update_mask)
        for layer in range(L):
            xc = mb.expand_dims(x=mb.transpose(x=x, perm=[0, 2, 1]), axes=[3])  # [1, H, 1, 1]
            conv = {n: mb.conv(x=xc, weight=_w(rng, c_out, H, 1, 1)) for n, c_out in
                    (("q", HQ * D), ("k", HKV * D), ("v", HKV * D))}
            q = mb.mul(x=mb.reshape(x=conv["q"], shape=[1, HQ, D, 1]), y=mb.transpose(x=c, perm=[0, 1, 3, 2]))
            k = mb.mul(x=mb.transpose(x=mb.reshape(x=conv["k"], shape=[1, HKV, D, 1]), perm=[0, 1, 3, 2]), y=c)
            v = mb.transpose(x=mb.reshape(x=conv["v"], shape=[1, HKV, D, 1]), perm=[0, 1, 3, 2])  # [1, Hkv, 1, D]
            state = mb.read_state(input=kv_cache_0)
            new = {}
            for name, idx, row in (("k", layer, k), ("v", L + layer, v)):
                old = mb.slice_by_index(x=state, begin=[idx, 0, 0, 0], end=[idx + 1, HKV, S, D])
                spread = mb.tile(x=row, reps=[1, 1, S, 1])  # k.expand_as(K_cache): along the sequence axis
                new[name] = mb.add(x=mb.mul(x=old, y=keep), y=mb.mul(x=spread, y=update_mask))
                state = mb.slice_update(x=state, update=new[name], begin=[idx, 0, 0, 0], end=[idx + 1, HKV, S, D])
            mb.coreml_update_state(state=kv_cache_0, value=state)
            scores = mb.matmul(x=q, y=_repeat_interleave_kt(new["k"], True), transpose_x=True)  # [1, Hq, 1, S]
            scores = mb.add(x=mb.mul(x=scores, y=np.float16(D ** -0.5)), y=causal_mask)
            o = mb.matmul(x=mb.softmax(x=scores, axis=-1), y=_repeat_interleave_kt(new["v"], False))  # [1,Hq,1,D]
            o = mb.reshape(x=mb.transpose(x=o, perm=[0, 1, 3, 2]), shape=[1, HQ * D, 1, 1])
            o = mb.conv(x=o, weight=_w(rng, H, HQ * D, 1, 1))
            x = mb.add(x=x, y=mb.reshape(x=o, shape=[1, 1, H]))
        return mb.linear(x=x, weight=emb)

    return save(prog, path)


# ------------------------------------------------------------------------------------------------ Apple's recipe
def _repeat_kv(cache):
    """transformers' repeat_kv: [1, Hkv, E, D] → expand_dims → tile → reshape [1, Hq, E, D] (E may be symbolic)."""
    t = mb.tile(x=mb.expand_dims(x=cache, axes=[2]), reps=[1, 1, G, 1, 1])
    return mb.reshape(x=t, shape=[1, HQ, -1, D])


def _flexible_step(attention):
    """The recipe's step: token ids and a mask of flexible rows q and visible length ``end``; the cache is
    written at ``end − q … end`` and read up to ``end``; ``attention(q, k, v, mask)`` does the rest."""
    rng = np.random.default_rng(2)
    emb = _w(rng, V, H, scale=1.0)
    qs, es = get_new_symbol(), get_new_symbol()

    @mb.program(input_specs=[mb.TensorSpec((1, qs), I32), mb.TensorSpec((1, 1, qs, es), FP16),
                             mb.StateTensorSpec((L, 1, HKV, EMAX, D), FP16),
                             mb.StateTensorSpec((L, 1, HKV, EMAX, D), FP16)], opset_version=IOS18)
    def prog(inputIds, causalMask, keyCache, valueCache):
        x = mb.gather(x=emb, indices=inputIds, axis=0)  # [1, q, H]
        dims = mb.shape(x=causalMask)
        q_len = mb.slice_by_index(x=dims, begin=[2], end=[3])
        end = mb.slice_by_index(x=dims, begin=[3], end=[4])
        past = mb.sub(x=end, y=q_len)
        zero = np.array([0], dtype=np.int32)
        for layer in range(L):
            heads = {}
            for n, h in (("q", HQ), ("k", HKV), ("v", HKV)):
                y = mb.linear(x=x, weight=_w(rng, h * D, H))
                heads[n] = mb.transpose(x=mb.reshape(x=y, shape=[1, -1, h, D]), perm=[0, 2, 1, 3])  # [1, h, q, D]
            read = {}
            for n, cache in (("k", keyCache), ("v", valueCache)):
                lay = np.array([layer], dtype=np.int32)
                begin = mb.concat(values=[lay, zero, zero, past, zero], axis=0)
                stop = mb.concat(values=[lay + 1, np.array([1, HKV], np.int32), end, np.array([D], np.int32)], axis=0)
                upd = mb.expand_dims(x=heads[n], axes=[0])
                written = mb.slice_update(x=mb.read_state(input=cache), update=upd, begin=begin, end=stop)
                mb.coreml_update_state(state=cache, value=written)
                seen = mb.slice_by_index(x=written, begin=mb.concat(values=[lay, zero, zero, zero, zero], axis=0),
                                         end=stop)  # [1, 1, Hkv, end, D]
                read[n] = mb.reshape(x=seen, shape=[1, HKV, -1, D])  # [1, Hkv, end, D]
            o = attention(heads["q"], read["k"], read["v"], causalMask)  # [1, Hq, q, D]
            o = mb.reshape(x=mb.transpose(x=o, perm=[0, 2, 1, 3]), shape=[1, -1, HQ * D])
            x = mb.add(x=x, y=mb.linear(x=o, weight=_w(rng, H, HQ * D)))
        return mb.linear(x=x, weight=emb)

    return prog


FLEX_INPUTS = [ct.TensorType(name="inputIds", shape=ct.Shape((1, ct.RangeDim(1, QMAX)))),
               ct.TensorType(name="causalMask", shape=ct.Shape((1, 1, ct.RangeDim(1, QMAX), ct.RangeDim(1, EMAX))))]


def llama_recipe(path: Path) -> str:
    def eager(q, k, v, mask):
        s = mb.matmul(x=q, y=_repeat_kv(k), transpose_y=True)
        s = mb.add(x=mb.mul(x=s, y=np.float16(D ** -0.5)), y=mask)
        return mb.matmul(x=mb.softmax(x=s, axis=-1), y=_repeat_kv(v))

    return save(_flexible_step(eager), path, FLEX_INPUTS)


def hf_sdpa(path: Path) -> str:
    def fused(q, k, v, mask):
        return mb.scaled_dot_product_attention(query=q, key=_repeat_kv(k), value=_repeat_kv(v), attn_mask=mask)

    return save(_flexible_step(fused), path, FLEX_INPUTS)


# ------------------------------------------------------------------------------------------------ ANEMLL prefill
def anemll_prefill(path: Path, n: int = PREFILL) -> str:
    rng = np.random.default_rng(3)
    cos = _w(rng, PREFILL_S, D, scale=1.0)
    s = PREFILL_S

    @mb.program(input_specs=[mb.TensorSpec((1, n, H), FP16), mb.TensorSpec((n,), I32),
                             mb.TensorSpec((1, 1, n, s), FP16), mb.TensorSpec((1,), I32),
                             mb.StateTensorSpec((2 * L, HKV, s, D), FP16)],
                opset_version=IOS18)
    def prog(hidden_states, position_ids, causal_mask, current_pos, model_model_kv_cache_0):
        c = mb.reshape(x=mb.gather(x=cos, indices=position_ids, axis=0), shape=[1, 1, n, D])
        zero = np.array([0], dtype=np.int32)
        x = hidden_states
        for layer in range(L):
            heads = {}
            for name, h in (("q", HQ), ("k", HKV), ("v", HKV)):
                y = mb.linear(x=x, weight=_w(rng, h * D, H))
                heads[name] = mb.transpose(x=mb.reshape(x=y, shape=[1, n, h, D]), perm=[0, 2, 1, 3])
            q, k = mb.mul(x=heads["q"], y=c), mb.mul(x=heads["k"], y=c)
            state = mb.read_state(input=model_model_kv_cache_0)
            caches = []
            for idx, new in ((layer, k), (L + layer, heads["v"])):
                i = np.array([idx], dtype=np.int32)
                begin = mb.concat(values=[i, zero, current_pos, zero], axis=0)
                end = mb.concat(values=[i + 1, np.array([HKV], np.int32), mb.add(x=current_pos, y=n),
                                        np.array([D], np.int32)], axis=0)
                state = mb.slice_update(x=state, update=new, begin=begin, end=end)
                caches.append(mb.slice_by_index(x=state, begin=[idx, 0, 0, 0], end=[idx + 1, HKV, s, D]))
            mb.coreml_update_state(state=model_model_kv_cache_0, value=state)
            scores = mb.matmul(x=q, y=mb.tile(x=caches[0], reps=[1, G, 1, 1]), transpose_y=True)  # x.repeat
            scores = mb.add(x=mb.mul(x=scores, y=np.float16(D ** -0.5)), y=causal_mask)
            o = mb.matmul(x=mb.softmax(x=scores, axis=-1), y=mb.tile(x=caches[1], reps=[1, G, 1, 1]))
            o = mb.reshape(x=mb.transpose(x=o, perm=[0, 2, 1, 3]), shape=[1, n, HQ * D])
            x = mb.add(x=x, y=mb.linear(x=o, weight=_w(rng, H, HQ * D)))
        return x

    return save(prog, path)


def anemll_multifunction(path: Path) -> str:
    """ANEMLL's multi-function package: ``infer`` (one row) and ``prefill`` (PREFILL rows) over one state, the
    weights shared (equal values are stored once)."""
    parts = [("infer", anemll_prefill(path.with_name(path.stem + "-infer.mlpackage"), 1)),
             ("prefill", anemll_prefill(path.with_name(path.stem + "-prefill.mlpackage")))]
    desc = ct.utils.MultiFunctionDescriptor()
    for name, part in parts:
        desc.add_function(part, "main", name)
    desc.default_function_name = "infer"
    ct.utils.save_multifunction(desc, str(path))
    return str(path)


# ------------------------------------------------------------------------------------------------ compressed
def compress(src: str | Path, dst: Path, how: str) -> str:
    """A style's package with its weights compressed as the converters ship them, by coremltools.optimize.coreml
    (every weight, however small): ``lut4`` / ``lut6`` palettized, a 2^n-entry LUT per group of 16 output
    channels (ANEMLL's LUT4/6); ``int4`` linear-quantized, symmetric, a scale per block of 16 input values
    (CoreML-LLM's and Apple's recipe's int4)."""
    if how.startswith("lut"):
        config, apply = cto.OpPalettizerConfig(nbits=int(how[3:]), mode="uniform", granularity="per_grouped_channel",
                                               group_size=16, weight_threshold=1), cto.palettize_weights
    elif how == "int4":
        config, apply = cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4", granularity="per_block",
                                                    block_size=16, weight_threshold=1), cto.linear_quantize_weights
    else:
        raise ValueError(f"compression {how!r}: lut4, lut6 or int4")
    model = ct.models.MLModel(str(src), skip_model_load=True)
    apply(model, cto.OptimizationConfig(global_config=config)).save(str(dst))
    return str(dst)


STYLES = {"coreml_llm": coreml_llm, "llama_recipe": llama_recipe, "hf_sdpa": hf_sdpa,
          "anemll_prefill": anemll_prefill}
