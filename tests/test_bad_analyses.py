"""Every malformed analysis.json, package or build folder is refused by ``inspect``, ``diff`` and ``fit --build``
with exit code 1 and one line on stderr naming the file and what is wrong — never a traceback.

Cases are made from one small valid package (a linear layer whose weight lives in weight.bin) and one valid
analysis, each broken one way; all run through the CLI in one long-lived child process (tests/cli_batch.py:
per-case time and memory limits).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from tests.cli_batch import run_batch

pytestmark = pytest.mark.conversion

HERE = Path(__file__).resolve().parent
EXAMPLE_LOG = HERE.parent / "examples" / "writeup_device_logs.csv"


def _package(path: Path) -> Path:
    weight = (np.arange(64 * 64, dtype=np.float16).reshape(64, 64) % 7) / 7

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 64), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.linear(x=x, weight=mb.const(val=weight), name="proj")

    ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
               minimum_deployment_target=ct.target.iOS18).save(str(path))
    return path


def _proto(pkg: Path) -> Path:
    return pkg / "Data" / "com.apple.CoreML" / "model.mlmodel"


def _edit_manifest(pkg: Path, path: str) -> None:
    manifest = json.loads((pkg / "Manifest.json").read_text())
    manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"] = path
    (pkg / "Manifest.json").write_text(json.dumps(manifest))


def _edit_spec(pkg: Path, edit) -> None:
    from coremltools.proto import Model_pb2

    spec = Model_pb2.Model()
    spec.ParseFromString(_proto(pkg).read_bytes())
    edit(spec)
    _proto(pkg).write_bytes(spec.SerializeToString())


def _blob_outside(spec) -> None:
    for op in spec.mlProgram.functions["main"].block_specializations["CoreML8"].operations:
        if op.type == "const" and op.attributes["val"].WhichOneof("value") == "blobFileValue":
            op.attributes["val"].blobFileValue.fileName = "@model_path/weights/../../../../../etc/passwd"


def _neural_network(spec) -> None:
    spec.ClearField("mlProgram")
    spec.neuralNetwork.SetInParent()


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, tuple[list[str], str]]:
    """name → (argv, regex the one error line must match)."""
    root = tmp_path_factory.mktemp("bad")
    good = _package(root / "good.mlpackage")
    analysis = root / "good.analysis.json"
    out = subprocess.run([sys.executable, "-m", "analyzer", "inspect", str(good), "--json"], capture_output=True,
                         text=True, cwd=HERE.parent, check=True)
    assert json.loads(out.stdout)["total_ops"] > 0
    from analyzer.analysis.record import load_analysis, write_analysis

    write_analysis(analysis, load_analysis(good))
    doc = json.loads(analysis.read_text())

    def broken_package(name: str, breaker) -> str:
        pkg = root / f"{name}.mlpackage"
        shutil.copytree(good, pkg)
        breaker(pkg)
        return str(pkg)

    def broken_analysis(name: str, content: bytes | str) -> str:
        path = root / f"{name}.analysis.json"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    def without(key: str) -> str:
        return json.dumps({k: v for k, v in doc.items() if k != key})

    def with_value(path: list, value) -> str:
        d = json.loads(json.dumps(doc))
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return json.dumps(d)

    two = root / "two-packages"
    two.mkdir()
    for n in ("a", "b"):
        shutil.copytree(good, two / f"{n}.mlpackage")
    not_a_package = root / "just-a-folder"
    not_a_package.mkdir()
    a = {
        "no-program": (broken_analysis("no-program", without("program")), r"no-program.analysis.json: .*program"),
        "ops-not-a-list": (broken_analysis("ops", with_value(["program", "ops"], {"x": 1})),
                           r"ops.analysis.json: field program.ops: expected a list"),
        "shape-of-strings": (broken_analysis("shape", with_value(["program", "inputs", 0, 1], ["a", "b"])),
                             r"shape.analysis.json: field program.inputs\[0\]"),
        "latin1": (broken_analysis("latin1", b'{"schema_version": 2, "x": "caf\xe9"}'),
                   r"latin1.analysis.json: not UTF-8 text"),
        "deep": (broken_analysis("deep", "[" * 50_000 + "]" * 50_000), r"deep.analysis.json: nested deeper than"),
        "nan": (broken_analysis("nan", re.sub(r'"schema_version": \d+', '"schema_version": NaN', json.dumps(doc),
                                              count=1)),
                r"nan.analysis.json: field schema_version is NaN"),
        "truncated": (broken_analysis("truncated", json.dumps(doc)[: len(json.dumps(doc)) // 2]),
                      r"truncated.analysis.json: not valid JSON"),
        "future-schema": (broken_analysis("future", with_value(["schema_version"], 99)),
                          r"future.analysis.json: .*schema.* 99"),
        "empty": (broken_analysis("empty", b""), r"empty.analysis.json: not valid JSON"),
        "array": (broken_analysis("array", "[1, 2]"), r"array.analysis.json: .*expected an object, got a list"),
    }
    p = {
        "manifest-outside": (broken_package("outside", lambda k: _edit_manifest(k, "../../../../../../etc/passwd")),
                             r"outside.mlpackage/Manifest.json: the root model path .* points outside the package"),
        "manifest-missing": (broken_package("nomanifest", lambda k: (k / "Manifest.json").unlink()),
                             r"nomanifest.mlpackage: no Manifest.json"),
        "manifest-garbage": (broken_package("badmanifest", lambda k: (k / "Manifest.json").write_text("{oops")),
                             r"badmanifest.mlpackage/Manifest.json: not valid JSON"),
        "model-missing": (broken_package("nomodel", lambda k: _proto(k).unlink()),
                          r"nomodel.mlpackage/Manifest.json: the root model .* is missing"),
        "proto-garbage": (broken_package("garbage", lambda k: _proto(k).write_bytes(b"\xff\x00garbage" * 9)),
                          r"garbage.mlpackage/Data/com.apple.CoreML/model.mlmodel: cannot parse the model protobuf"),
        "neural-network": (broken_package("nn", lambda k: _edit_spec(k, _neural_network)),
                           r"nn.mlpackage: a neuralNetwork model, not an ML Program"),
        "blob-outside": (broken_package("blobout", lambda k: _edit_spec(k, _blob_outside)),
                         r"blob file .* points outside the package"),
        "weights-truncated": (broken_package("trunc", lambda k: (k / "Data/com.apple.CoreML/weights/weight.bin")
                                             .write_bytes(b"\x00" * 10)),
                              r"trunc.mlpackage/Data/com.apple.CoreML/weights/weight.bin: truncated blob header"),
        "two-packages": (str(two), r"two-packages: holds 2 .mlpackage folders; name one"),
        "not-a-package": (str(not_a_package), r"just-a-folder: not an .mlpackage nor a build folder"),
        "missing": (str(root / "nowhere"), r"nowhere: not an .mlpackage nor a build folder"),
    }
    out: dict[str, tuple[list[str], str]] = {}
    for name, (path, regex) in {**a, **p}.items():
        out[f"inspect:{name}"] = (["inspect", path, "--json"], regex)
    # diff and fit --build read the same loader: one good side, one bad
    for name in ("ops-not-a-list", "manifest-outside", "nan"):
        path, regex = {**a, **p}[name]
        out[f"diff:{name}"] = (["diff", str(analysis), path, "--json"], regex)
        out[f"fit:{name}"] = (["fit", str(EXAMPLE_LOG), "--build", f"exaone-qfold-top8={path}", "--json"], regex)
    return out


@pytest.fixture(scope="module")
def results(cases) -> dict[str, dict]:
    batch = [{"argv": argv} for argv, _ in cases.values()]
    return dict(zip(cases, run_batch(batch, workers=1), strict=True))  # 10 s and 1 GB per case


def test_the_corpus_is_big_enough(cases):
    assert len({name.split(":", 1)[1] for name in cases}) >= 15


def test_every_bad_input_is_one_clear_line(cases, results):
    failures = []
    for name, (_argv, regex) in cases.items():
        r = results[name]
        lines = [ln for ln in r["stderr"].splitlines() if ln.strip() and not ln.startswith("warning")]
        ok = (r["traceback"] is None and "Traceback" not in r["stderr"] and r["code"] in (1, 2) and len(lines) >= 1
              and any(re.search(regex, ln) for ln in lines) and not r["stdout"].strip())
        if not ok:
            failures.append((name, r["code"], lines[-3:], (r["traceback"] or "")[-500:]))
    assert not failures, failures
