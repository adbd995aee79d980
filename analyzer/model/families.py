"""The model families qfold converts, one entry per transformers ``model_type``.

qfold's decode step (analyzer/model/decode.py) has no per-family code: it registers its attention with
transformers' ``AttentionInterface`` and hands the family's own ``ForCausalLM`` a buffer-backed cache.
That works for a family only if (a) every layer's attention goes through the interface with the query
``[B, Hq, q, D]`` and the un-repeated cache ``[B, Hkv, S, D]``, and (b) query head h uses KV head h // G.
A ``model_type`` whose config merely *looks* right (``gpt2`` has heads and a hidden size) can still fail
deep inside the conversion with an unrelated message, so a family is supported only once a conversion and
the torch equivalence check have run for it (tests/test_families.py) — everything else is refused before
any work starts, naming the supported families.
"""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.errors import SourceError


@dataclass(frozen=True, slots=True)
class Family:
    model_type: str
    example_preset: str  # the preset that exercises this family in the tests
    note: str = ""


FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    if family.model_type in FAMILIES:
        raise ValueError(f"model family {family.model_type!r} is registered twice")
    FAMILIES[family.model_type] = family
    return family


for _family in (
    Family("exaone4", "exaone-4.0-1.2b", "per-head q/k RMSNorm; the write-up's model"),
    Family("llama", "llama-3.2-1b"),
    Family("mistral", "mistral-7b-v0.3", "sliding window when sliding_window < ctx"),
    Family("qwen2", "qwen2.5-0.5b", "q/k/v biases; sliding window only with use_sliding_window"),
    Family("qwen3", "qwen3-0.6b", "per-head q/k RMSNorm"),
    Family("gemma3_text", "gemma-3-1b", "MQA; 5 of 6 layers slide; softcapping"),
    Family("phi3", "phi-3-mini-4k", "fused qkv and gate_up projections; MHA"),
):
    register_family(_family)


def check_family(model_type: object) -> Family:
    """The registered family of ``model_type``, or a SourceError naming the supported ones."""
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        supported = ", ".join(sorted(FAMILIES))
        raise SourceError(
            f"model_type={model_type!r} is not a family qfold converts (supported: {supported}); "
            "qfold supports a family once its decode step has been converted and checked against the "
            "family's own attention"
        )
    return family
