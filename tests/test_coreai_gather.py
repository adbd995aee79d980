"""A Core AI gather that copies K/V heads (issue #37, item 3), on programs coreai-torch converts for real
(tests/converted_styles.py ``convert_coreai_form``): any head count and group, either head order, MQA; read by
matmuls (folded, proven on the Core AI runtime) or by an SDPA composite call (found, left with the reason); an index
that cannot be read (listed as not classified, with why: never a silent zero); and the reader behind it: the
resource blobs of the bytecode file read in place, the profile checked in bounded pieces.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("coreai_torch")

from analyzer.fold.coreai.asset_fold import fold_asset
from analyzer.ir.coreai.bytecode import BlobIndex, BytecodeError, StoredArray
from analyzer.ir.coreai.index_profile import axis_profile
from analyzer.ir.coreai.walk import read_asset
from tests.cli_batch import run_case
from tests.conftest import representatives
from tests.converted_styles import CORE_AI_OP, D, S, convert_coreai_form, heads_of


def cli(*argv) -> dict:
    r = run_case([str(a) for a in argv], {}, timeout_s=120, memory_bytes=4 << 30)
    assert r["traceback"] is None, r["traceback"]
    return r


# (form, Hq, Hkv, mapping): other head counts and groups than the form tests' 4 / 2, both head orders, MQA
GEOMETRIES = [("index_select", 8, 2, "h % Hkv"), ("gather", 6, 3, "h // G"), ("getitem", 4, 1, "h // G"),
              ("getitem", 6, 2, "h % Hkv")]


@pytest.mark.parametrize(("form", "hq", "hkv", "mapping"), representatives(GEOMETRIES, (GEOMETRIES[0], GEOMETRIES[2])))
def test_a_gather_of_any_geometry_is_counted_and_folded(form, hq, hkv, mapping, tmp_path):
    src = convert_coreai_form(form, tmp_path / "src.aimodel", hq=hq, hkv=hkv, mapping=mapping)
    program = read_asset(src)
    copies = [op for op in program.ops if op.tile_kind is not None]
    assert [(op.type, op.tile_kind) for op in copies] == [(CORE_AI_OP[form], "kv_replication")] * 2
    assert all(op.outputs[0].nbytes == hq * S * D * 4 for op in copies)  # fp32 [1, Hq, S, D]
    (tmp_path / "spec.json").write_text("{}")
    report = fold_asset(src, tmp_path / "f.aimodel", roles_path=tmp_path / "spec.json")
    assert [(d.folded, d.mapping, d.kv_heads, d.group) for d in report.decisions] == [
        (True, mapping, hkv, hq // hkv)] * 2, [d.reason for d in report.decisions]
    (f,) = report.functions
    assert (f.kv_replication_tiles_before, f.kv_replication_tiles_after) == (2, 0)
    assert f.before["replication"] >= 2 * 2 * hq * S * D * 4 and f.after["replication"] == 0
    assert f.after["weights"] == f.before["weights"] and report.weights.identical == report.weights.checked > 0
    assert report.proof.checked and report.proof.bit_identical, report.proof


def test_the_profile_is_the_head_each_query_head_reads(tmp_path):
    """What the dump records for coreai-torch's index_select: the index's value along the head axis, exactly the
    index the torch module gave, for both gathers (they share one constant)."""
    src = convert_coreai_form("index_select", tmp_path / "src.aimodel", hq=8, hkv=2, mapping="h % Hkv")
    gathers = [op for op in read_asset(src).ops if op.type == "coreai.gather_along_axis"]
    profiles = {next(r.profile for r in op.inputs if r.param == "indices") for op in gathers}
    assert len(gathers) == 2 and {(p.axis, p.values, p.why) for p in profiles} == {
        (1, tuple(heads_of(8, 2, "h % Hkv")), "")}


@pytest.mark.parametrize("form", ["index_select", "repeat_kv"])
def test_copies_read_by_an_sdpa_composite_are_found_and_left_with_the_reason(form, tmp_path):
    """``F.scaled_dot_product_attention`` without ``enable_gqa`` over copied K/V: coreai-torch calls its SDPA
    composite with the copies as key and value. Inspect counts them as KV replication (the bytes are), the rewrite
    agrees and leaves them, saying why."""
    src = convert_coreai_form(form, tmp_path / "src.aimodel", sdpa=True)
    doc = json.loads(cli("inspect", src, "--json")["stdout"])
    assert [(t["op_type"], t["kind"]) for t in doc["tiles"]] == [(CORE_AI_OP[form], "kv_replication")] * 2
    assert doc["bytes_per_token"]["replication"] > 0
    report = fold_asset(src, tmp_path / "f.aimodel", prove=False)
    assert [(d.replication, d.folded) for d in report.decisions] == [(True, False)] * 2
    assert [d.reason.split(" is the ")[1].split(" of ")[0] for d in report.decisions] == ["key", "value"]
    assert all("SDPA composite call" in d.reason and "enable_gqa" in d.reason for d in report.decisions)


def test_an_index_that_cannot_be_read_is_listed_not_classified_with_why(tmp_path):
    """``k.index_select(1, heads)`` with ``heads`` an input of the program: whether the gather copies K/V heads
    depends on a value known only at run time. It is listed among the copies (not as an ordinary op, never as no
    copy), not classified, with the reason; the fold leaves it, saying the same."""
    src = convert_coreai_form("index_input", tmp_path / "src.aimodel")
    doc = json.loads(cli("inspect", src, "--json")["stdout"])
    gathers = [t for t in doc["tiles"] if t["op_type"] == "coreai.gather_along_axis"]
    assert len(gathers) == 2 and all(t["kind"] != "kv_replication" for t in gathers)
    assert all(t["reason"] == "not classified: its index is computed at run time (by an argument)" for t in gathers)
    report = fold_asset(src, tmp_path / "f.aimodel", prove=False)
    left = [d for d in report.decisions if d.op_type == "coreai.gather_along_axis"]
    assert [(d.folded, d.replication) for d in left] == [(False, False)] * 2
    assert all("not classified: its index is computed at run time" in d.reason for d in left)


# ------------------------------------------------------------------------------------------------ the reader
def test_resource_blobs_read_in_place_equal_the_bindings_copy(tmp_path):
    """Every resource blob of a converted asset (a weight, the index constant), read from the file, equals what the
    bindings copy out of the loaded module, whole and piece by piece."""
    import coreai.authoring  # noqa: F401
    from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import (
        copy_constant_value_to_array,
        load_module_from_bytecode,
    )
    from coreai._compiler.ir import RankedTensorType
    from coreai.authoring.context import Context

    src = convert_coreai_form("index_select", tmp_path / "src.aimodel")
    module = load_module_from_bytecode(context=Context()._mlir_context, path=src / "main.mlirb")
    seen = 0
    with BlobIndex(src / "main.mlirb") as blobs:
        for g in module.body.operations:
            for op in g.operation.regions[0].blocks[0].operations:
                op = op.operation
                text = str(op.attributes["value"]) if op.name == "coreai.constant" else ""
                if "dense_resource<" not in text:
                    continue
                name = text.split("dense_resource<")[1].split(">")[0]
                t = RankedTensorType(op.results[0].type)
                dtype = np.float32 if str(t.element_type) == "f32" else np.int32
                stored = blobs.stored(name, dtype, tuple(t.shape))
                copied = np.zeros(stored.size * stored.dtype.itemsize, np.uint8)
                copy_constant_value_to_array(constant_op=op, destination=copied)
                assert stored.read(0, stored.size).tobytes() == copied.tobytes()
                whole = copied.view(dtype)
                assert np.array_equal(stored.read(5, 7), whole[5:12])
                with pytest.raises(BytecodeError):
                    stored.read(stored.size - 1, 2)
                seen += 1
    assert seen == 2  # the output projection's weight and the [1, Hq, S, D] index


def test_the_bytecode_reader_refuses_what_it_cannot_read(tmp_path):
    (tmp_path / "x.mlirb").write_bytes(b"not bytecode")
    with pytest.raises(BytecodeError, match="no 'MLïR' magic"):
        BlobIndex(tmp_path / "x.mlirb")
    src = convert_coreai_form("index_select", tmp_path / "src.aimodel")
    data = (src / "main.mlirb").read_bytes()
    (tmp_path / "cut.mlirb").write_bytes(data[: len(data) // 2])
    with pytest.raises(BytecodeError):
        BlobIndex(tmp_path / "cut.mlirb")


@pytest.mark.parametrize("chunk", [4, 64, 1 << 20])
def test_the_axis_profile_is_checked_in_bounded_pieces(chunk, tmp_path):
    """The profile of a broadcast index, whatever the piece size (a piece smaller than a row, a few rows, all of
    it); one element changed anywhere off the axis makes it vary."""
    heads = np.array([0, 0, 1, 1, 2, 2], np.int32)
    index = np.broadcast_to(heads[None, :, None, None], (2, 6, 5, 3)).copy()
    values, why = axis_profile(index, 1, chunk_bytes=chunk)
    assert why == "" and values.tolist() == heads.tolist()
    (tmp_path / "i.bin").write_bytes(b"pad" + index.tobytes())
    with (tmp_path / "i.bin").open("rb") as f:  # the same, read from a file piece by piece
        values, why = axis_profile(StoredArray(f.fileno(), 3, np.int32, index.shape), 1, chunk_bytes=chunk)
    assert why == "" and values.tolist() == heads.tolist()
    assert axis_profile(index, 3, chunk_bytes=chunk)[1] == "its index varies along an axis other than 3 " \
                                                            "(not one slice per position)"
    for at in [(0, 0, 0, 1), (1, 5, 4, 2), (1, 2, 3, 0)]:
        bad = index.copy()
        bad[at] += 1
        assert axis_profile(bad, 1, chunk_bytes=chunk) == (None, "its index varies along an axis other than 1 "
                                                                 "(not one slice per position)")


def test_a_70b_sized_index_is_profiled_in_bounded_memory(tmp_path):
    """An index as large as a full-size 70B copy (``[1, 64, 8192, 128]`` int32: 256 MiB) is profiled from its file
    in a child process whose peak memory grows far less than the index's size (pieces of CHUNK_BYTES, read with
    pread: the file's pages stay in the page cache)."""
    import subprocess
    import sys

    shape, heads = (1, 64, 8192, 128), np.arange(64, dtype=np.int32) // 8
    with (tmp_path / "i.bin").open("wb") as f:
        for h in heads:  # written one head at a time (this process holds 4 MiB)
            f.write(np.full(shape[2:], h, np.int32).tobytes())
    code = ("import json, resource, sys, numpy as np; from analyzer.ir.coreai.bytecode import StoredArray; "
            "from analyzer.ir.coreai.index_profile import axis_profile; f = open(sys.argv[1], 'rb'); "
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"v, why = axis_profile(StoredArray(f.fileno(), 0, np.int32, {shape}), 1); "
            "print(json.dumps([v.tolist(), why, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "i.bin")], capture_output=True, text=True,
                         timeout=120, check=True)
    values, why, grown_kib = json.loads(out.stdout)
    assert (values, why) == (heads.tolist(), "")
    assert grown_kib < 64 * 1024, grown_kib  # < 64 MiB of peak growth for a 256 MiB index
