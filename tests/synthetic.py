"""Analyses of small decode programs written op by op in Python (no conversion), for the pure tests of the
figures, the report and the diff: their bytes can be added up by hand.

Each layer l reads its K and V caches (states ``k_cache_l``, ``v_cache_l``: [1, 8, 4096, 64] fp16 = 4 MiB) and
multiplies the query by them. With ``repeat_kv`` each cache goes through ``expand_dims → tile ×4 → reshape``
(a [1, 8, 4, 4096, 64] fp16 tile = 16 MiB, the default preset's: docs/measurements.md); with ``qfold`` the
matmul reads the cache directly. Each layer also has one ``linear`` with a [64, 64] fp16 weight, and outside
the layers an embedding ``gather`` and an ``lm_head`` linear.
"""

from __future__ import annotations

from analyzer.analysis.buildinfo import BuildInfo
from analyzer.analysis.record import Analysis
from analyzer.ir.mil_records import InputRef, MilProgram, OpRecord, TensorInfo, tensor_nbytes
from analyzer.ir.opfacts import derive_op_facts
from analyzer.model.equivalence_records import EquivalenceReport, PairResult, ReferenceCheck
from analyzer.model.sources import AttentionGeometry, resolve_source
from analyzer.model.spec import BuildSpec

MIB = 1 << 20
TILE_BYTES = 16 * MIB  # [1, 8, 4, 4096, 64] fp16
CACHE = (1, 8, 4096, 64)
VOCAB, HIDDEN = 1000, 64


def tensor(name: str, shape: tuple[int, ...], dtype: str = "fp16") -> TensorInfo:
    return TensorInfo(name, shape, dtype, tensor_nbytes(shape, dtype))


class ProgramWriter:
    """Appends ops in topological order; an input named after an earlier op's output reads that op."""

    def __init__(self, states: tuple[TensorInfo, ...] = ()):
        self.ops: list[OpRecord] = []
        self.states = states
        self._producer: dict[str, int] = {}
        self._tensor: dict[str, TensorInfo] = {t.name: t for t in states}

    def const(self, name: str, shape: tuple[int, ...], dtype: str = "fp16") -> str:
        out = tensor(name, shape, dtype)
        return self._add("const", (), (out,), const_bytes=out.nbytes or 0)

    def op(self, type_: str, out: TensorInfo, **inputs: str) -> str:
        refs = []
        for param, name in inputs.items():
            producer = self._producer.get(name)
            is_const = producer is not None and self.ops[producer].type == "const"
            refs.append(InputRef(param, self._tensor[name], producer, is_const,
                                 self.ops[producer].const_bytes if is_const else 0))
        return self._add(type_, tuple(refs), (out,))

    def _add(self, type_: str, refs: tuple[InputRef, ...], outs: tuple[TensorInfo, ...], const_bytes: int = 0) -> str:
        index = len(self.ops)
        self.ops.append(OpRecord(index, type_, outs[0].name, None, "", refs, outs, const_bytes))
        for t in outs:
            self._producer[t.name] = index
            self._tensor[t.name] = t
        return outs[0].name

    def program(self, outputs: tuple[TensorInfo, ...] = ()) -> MilProgram:
        return MilProgram("synthetic.mlpackage", "main", "CoreML8", 9, (tensor("input_ids", (1, 1), "int32"),),
                          self.states, outputs, tuple(derive_op_facts(self.ops)))


def decode_program(variant: str, layers: int = 2) -> MilProgram:
    """The program described in the module docstring."""
    states = tuple(tensor(f"{kv}_cache_{layer}", CACHE) for layer in range(layers) for kv in "kv")
    w = ProgramWriter(states)
    w._tensor["input_ids"] = tensor("input_ids", (1, 1), "int32")
    table = w.const("model_embed_tokens_weight", (VOCAB, HIDDEN))
    h = w.op("gather", tensor("hidden_0", (1, 1, HIDDEN)), x=table, indices="input_ids")
    for layer in range(layers):
        p = f"model_layers_{layer}"
        weight = w.const(f"{p}_mlp_weight", (HIDDEN, HIDDEN))
        h = w.op("linear", tensor(f"{p}_mlp_out", (1, 1, HIDDEN)), x=h, weight=weight)
        q = w.op("reshape", tensor(f"{p}_q", (1, 32, 1, 2)), x=h)
        for kv in "kv":
            cache = w.op("read_state", tensor(f"{p}_{kv}_read", CACHE), input=f"{kv}_cache_{layer}")
            if variant == "repeat_kv":
                e = w.op("expand_dims", tensor(f"{p}_{kv}_expanded", (1, 8, 1, 4096, 64)), x=cache)
                t = w.op("tile", tensor(f"{p}_{kv}_tiled", (1, 8, 4, 4096, 64)), x=e)
                cache = w.op("reshape", tensor(f"{p}_{kv}_repeated", (1, 32, 4096, 64)), x=t)
            w.op("matmul", tensor(f"{p}_{kv}_scores", (1, 32, 1, 4096)), x=q, y=cache)
    head = w.const("model_lm_head_weight", (VOCAB, HIDDEN))
    logits = w.op("linear", tensor("logits", (1, 1, VOCAB)), x=h, weight=head)
    return w.program((w._tensor[logits],))


def equivalence(fp16_identical: bool = True) -> EquivalenceReport:
    return EquivalenceReport("state", 4096, 8, tuple(range(8)), (
        PairResult("repeat_kv", "qfold", "fp32", 8, 9.3e-6, False, 8),
        PairResult("repeat_kv", "qfold", "fp16", 8, 0.0 if fp16_identical else 1e-3, fp16_identical, 8),
    ), ReferenceCheck("repeat_kv", 1e-6, 10.0, 8, 8))


def build_info(variant: str, layers: int, ctx: int = 4096, compression: str | None = None) -> BuildInfo:
    source = resolve_source("exaone-4.0-1.2b", ("hidden_size=256", "vocab_size=1000", f"num_hidden_layers={layers}"))
    return BuildInfo(
        key=f"synthetic-{variant}", created="2026-11-30T12:00:00+00:00",
        spec=BuildSpec(source, variant, "state", ctx, compression, 8),
        geometry=AttentionGeometry("exaone4", layers, 32, 8, 64, 256, 1000),
        versions={"qfold": "0.1.0", "coremltools": "9.0"}, timings_s={"convert_s": 1.0},
        peak_rss_bytes=1 << 30, package_bytes=1 << 20, equivalence=equivalence(), untied_embeddings=False)


def decode_analysis(variant: str, layers: int = 2, with_build: bool = True) -> Analysis:
    return Analysis(decode_program(variant, layers), build_info(variant, layers) if with_build else None)
