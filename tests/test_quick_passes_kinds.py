"""coremltools' pipelines with qfold's shortcuts (``analyzer.convert.quick_passes``) save the package coremltools'
own pipelines save, byte for byte (``Model.proto`` and every weight file), for every kind of build: compressed
(palettized, int8, per-block LUTs, a per-layer mix), prefill, decode+prefill multi-function, KV as inputs, and a
2-layer build of every preset family. Each package is made by the materialised build's own code
(``analyzer.convert.modes.write_package``) twice from one model's weights: shortcuts on, then off
(``QFOLD_QUICK_PASSES=0``).

The default suite runs :data:`DEFAULT_KINDS`, one package that combines every kind but the families (decode+prefill,
KV as inputs, palettes of 4-channel blocks for the FFN, int8 attention, an untied pal4 embedding and pal6 head) and
one other family's plain decode (~17 s of CPU); ``QFOLD_EXTENDED=1`` runs every kind on its own and every preset
(29 packages twice: 143 s of CPU, all byte-identical on coremltools 9.0, 2026-12-06). Also here: the shortcuts are
off, with one line, on a coremltools they were not proven on, and installing them is safe when two threads'
conversions overlap."""

from __future__ import annotations

import copy
import hashlib
import os
import threading
from pathlib import Path

import pytest
import torch

from analyzer.convert import quick_passes
from analyzer.convert.modes import write_package
from analyzer.model.decode import build_model
from analyzer.model.sources import DEFAULT_PRESET, preset_names, resolve_source
from analyzer.model.spec import BuildSpec
from tests.conftest import TINY_OVERRIDES, preset_source

pytestmark = pytest.mark.conversion

CTX, Q_LEN = 128, 16
TINY = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
# kind → (source, variant, kv_mode, phase, compression)
KINDS: dict[str, tuple] = {
    "all-but-families": (TINY, "repeat_kv", "input", "decode+prefill",
                         "ffn=pal4,attn=int8,embed=pal4,lm_head=pal6,group=4"),
    "palettized": (TINY, "qfold", "state", "decode", "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal4"),
    "int8": (TINY, "qfold", "state", "decode", "ffn=int8,attn=int8,embed=int8,lm_head=int8"),
    "per-block": (TINY, "repeat_kv", "state", "decode", "ffn=pal4,attn=pal6,group=4"),
    "per-layer-mix": (TINY, "qfold", "state", "decode", "ffn=pal4,attn=pal4,layers[last:1]=int8,lm_head=pal6"),
    "prefill": (TINY, "repeat_kv", "state", "prefill", None),
    "decode+prefill": (TINY, "qfold", "state", "decode+prefill", None),
    "kv-input": (TINY, "repeat_kv", "input", "decode", None),
    "kv-input-prefill": (TINY, "qfold", "input", "prefill", None),
    **{f"{preset}-{variant}": (preset, variant, "state", "decode", None)
       for preset in preset_names() for variant in ("repeat_kv", "qfold")},
}
DEFAULT_KINDS = ("all-but-families", "gemma-3-1b-repeat_kv")


def digests(pkg: Path) -> dict[str, str]:
    """sha256 of the package's ``Model.proto`` and of every weight file (``Manifest.json`` names its parts by fresh
    UUIDs, so it is left out)."""
    data = pkg / "Data" / "com.apple.CoreML"
    files = [data / "model.mlmodel", *sorted((data / "weights").rglob("*"))]
    return {str(f.relative_to(pkg)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def packages(kind: str, root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(with the shortcuts, without) digests of ``kind``'s package, both converted from one model's weights."""
    source, variant, kv_mode, phase, compression = KINDS[kind]
    source = preset_source(source) if isinstance(source, str) else source
    spec = BuildSpec(source, variant, kv_mode, CTX, compression=compression, phase=phase,
                     q_len=1 if phase == "decode" else Q_LEN)
    model = build_model(source, torch.float16)
    out = []
    for quick in (True, False):
        before = os.environ.pop(quick_passes.SWITCH_ENV, None)
        if not quick:
            os.environ[quick_passes.SWITCH_ENV] = "0"
        try:
            write_package(spec, copy.deepcopy(model), root / f"{kind}-{quick}.mlpackage")  # untying edits a model
        finally:
            os.environ.pop(quick_passes.SWITCH_ENV, None)
            if before is not None:
                os.environ[quick_passes.SWITCH_ENV] = before
        out.append(digests(root / f"{kind}-{quick}.mlpackage"))
    return out[0], out[1]


@pytest.mark.parametrize("kind", [pytest.param(k, marks=() if k in DEFAULT_KINDS else pytest.mark.extended)
                                  for k in KINDS])
def test_the_shortcuts_save_the_package_coremltools_saves(kind, tmp_path):
    assert quick_passes.shortcuts_apply()  # else this would compare coremltools with itself
    quick, plain = packages(kind, tmp_path)
    assert "Data/com.apple.CoreML/model.mlmodel" in plain and any("weights/" in f for f in plain)
    assert quick == plain


def test_a_coremltools_they_were_not_proven_on_gets_no_shortcuts_and_one_line(monkeypatch, capfd):
    import coremltools
    from coremltools.converters.mil.mil.program import Program

    monkeypatch.setattr(coremltools, "__version__", "9.1")
    monkeypatch.setattr(quick_passes, "_SAID", set())
    original = Program.validate
    capfd.readouterr()
    for _ in range(2):
        with quick_passes.quick_passes():
            assert Program.validate is original
    said = capfd.readouterr().err.splitlines()
    assert said == ["qfold: coremltools 9.1 is not one the conversion shortcuts were proven on (9.0): its pass "
                    "pipelines run as shipped (slower, the same packages)"]


def test_overlapping_conversions_in_two_threads_leave_coremltools_as_it_was():
    """Thread A opens, B opens, A closes (B still converting: still installed), B closes: restored. Then many
    threads at random: restored at the end, installed whenever one is open."""
    from coremltools.converters.mil.mil.block import Block
    from coremltools.converters.mil.mil.program import Program

    originals = (Program.validate, Program.__str__, Block._propagate_nonreplaceable_vars)
    a_in, b_in, a_out, b_checked = (threading.Event() for _ in range(4))
    seen = {}

    def a():
        with quick_passes.quick_passes():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with quick_passes.quick_passes():
            b_in.set()
            a_out.wait(10)
            seen["after A closed"] = Program.validate is not originals[0]
            b_checked.set()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"after A closed": True}
    assert (Program.validate, Program.__str__, Block._propagate_nonreplaceable_vars) == originals

    errors = []

    def busy(i):
        for _ in range(200):
            with quick_passes.quick_passes():
                if Program.validate is originals[0]:
                    errors.append(i)

    threads = [threading.Thread(target=busy, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert (Program.validate, Program.__str__, Block._propagate_nonreplaceable_vars) == originals
