"""Small real packages the bad-input corpus breaks one way each: a linear layer whose weight lives in weight.bin,
and a GQA attention whose K/V are copied by repeat_kv's tile (so ``fold`` has something to fold)."""

from __future__ import annotations

from pathlib import Path

import coremltools as ct
import numpy as np
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

IOS18 = ct.target.iOS18
HQ, HKV, S, D = 4, 2, 16, 8  # 4 query heads over 2 KV heads, 16 cache slots, head_dim 8


def _save(prog, path) -> str:
    ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY, minimum_deployment_target=IOS18,
               skip_model_load=True).save(str(path))
    return str(path)


def linear_package(path) -> str:
    weight = (np.arange(64 * 64, dtype=np.float16).reshape(64, 64) % 7) / 7

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 64), dtype=types.fp16)], opset_version=IOS18)
    def prog(x):
        return mb.linear(x=x, weight=mb.const(val=weight), name="proj")

    return _save(prog, path)


def gqa_package(path, vocab: int = 32) -> str:
    """``softmax(q·repeat_kv(k)ᵀ + mask)·repeat_kv(v)`` with token ids feeding q through an embedding, so `run
    --steps` has token ids (< ``vocab``), a position (< 16) and a mask to drive. The embedding table is
    ``vocab`` × 32 fp16 (64 B a row: ``vocab=1 << 20`` makes a 64 MiB weight.bin)."""
    g = HQ // HKV
    table = (np.arange(vocab * HQ * D, dtype=np.float16).reshape(vocab, HQ * D) % 5) / 5

    @mb.program(input_specs=[mb.TensorSpec((1, 1), types.int32), mb.TensorSpec((1,), types.int32),
                             mb.TensorSpec((1, 1, 1, S), types.fp16), mb.TensorSpec((1, HKV, S, D), types.fp16),
                             mb.TensorSpec((1, HKV, S, D), types.fp16)], opset_version=IOS18)
    def prog(input_ids, current_pos, causal_mask, k, v):
        emb = mb.gather(x=mb.const(val=table), indices=input_ids, axis=0)  # [1, 1, HQ·D]
        q = mb.transpose(x=mb.reshape(x=emb, shape=[1, 1, HQ, D]), perm=[0, 2, 1, 3])
        pos = mb.cast(x=current_pos, dtype="fp16")
        reps = []
        for x in (k, v):
            e = mb.expand_dims(x=x, axes=[2])
            t = mb.tile(x=e, reps=[1, 1, g, 1, 1])
            reps.append(mb.reshape(x=t, shape=[1, HQ, S, D]))
        scores = mb.add(x=mb.matmul(x=q, y=reps[0], transpose_y=True), y=causal_mask)
        out = mb.matmul(x=mb.softmax(x=scores, axis=-1), y=reps[1])
        return mb.add(x=out, y=mb.mul(x=pos, y=np.float16(0.0)), name="logits")

    return _save(prog, path)


# ------------------------------------------------------------------------------------------------ breaking them
def proto_path(pkg) -> Path:
    return Path(pkg) / "Data" / "com.apple.CoreML" / "model.mlmodel"


def weight_path(pkg) -> Path:
    return Path(pkg) / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"


def edit_spec(pkg, edit) -> None:
    """Rewrite a package's Model.proto with ``edit(spec)`` applied (protobuf keeps what coremltools would refuse)."""
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    spec.ParseFromString(proto_path(pkg).read_bytes())
    edit(spec)
    proto_path(pkg).write_bytes(spec.SerializeToString())


def main_ops(spec):
    return spec.mlProgram.functions["main"].block_specializations["CoreML8"].operations


def first_op(spec, op_type: str, value_kind: str | None = None):
    for op in main_ops(spec):
        if op.type == op_type and (value_kind is None or op.attributes["val"].WhichOneof("value") == value_kind):
            return op
    raise LookupError(op_type)


def blob_offset(offset: int):
    def edit(spec):
        first_op(spec, "const", "blobFileValue").attributes["val"].blobFileValue.offset = offset
    return edit


def unknown_output_dtype(spec) -> None:
    first_op(spec, "gather").outputs[0].type.tensorType.dataType = 999


def unknown_feature_dtype(spec) -> None:
    spec.description.output[0].type.multiArrayType.dataType = 999


def drop_outputs(op_type: str):
    def edit(spec):
        del first_op(spec, op_type).outputs[:]
    return edit


def const_count_mismatch(spec) -> None:
    """The reshape's target-shape const declares 5 values but stores 4."""
    op = next(o for o in main_ops(spec) if o.type == "const" and o.outputs[0].name.startswith("reshape_0_shape"))
    op.outputs[0].type.tensorType.dimensions[0].constant.size = 5


def huge_input(name: str, dims: tuple[int, ...]):
    """An input declared with ``dims`` (2**40 elements: TiB of fp16) in the function and the description."""
    def edit(spec):
        for i in spec.mlProgram.functions["main"].inputs:
            if i.name == name:
                del i.type.tensorType.dimensions[:]
                for d in dims:
                    i.type.tensorType.dimensions.add().constant.size = d
        for f in spec.description.input:
            if f.name == name:
                del f.type.multiArrayType.shape[:]
                f.type.multiArrayType.shape.extend(dims)
    return edit
