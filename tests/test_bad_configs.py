"""Every bad model source is refused by ``python -m analyzer build`` before any conversion starts: exit code 1
(2 for a bad flag), one line on stderr naming the file or field and why, no traceback, no build folder.

The corpus is tests/data/bad_configs/ (one file per case) plus command-line cases; all run through the CLI
in one child process (tests/cli_batch.py) to pay the torch import once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.errors import SourceError
from analyzer.model.cost import check_request, estimate
from analyzer.model.sources import load_config, resolve_source
from tests.cli_batch import run_batch

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "data" / "bad_configs"

# file → what the one-line error must say (a regex)
FILE_CASES: dict[str, str] = {
    "gpt2.json": r"model_type='gpt2' is not a family qfold converts \(supported: exaone4, gemma3_text, llama",
    "mixtral.json": r"model_type='mixtral' is not a family qfold converts",
    "typo-model-type.json": r"model_type='llamma'.*did you mean llama",
    "no-model-type.json": r"no-model-type.json: config has no 'model_type' field",
    "model-type-number.json": r"model_type=7 is not an architecture",
    "not-json.json": r"not-json.json: not valid JSON \(.* line 1",
    "array.json": r"array.json: a config.json must hold a JSON object, not list",
    "string.json": r"string.json: a config.json must hold a JSON object, not str",
    "empty.json": r"empty.json: not valid JSON",
    "latin1.json": r"latin1.json: not UTF-8 text \(byte 36\)",
    "nan.json": r"nan.json: field rms_norm_eps is NaN",
    "infinity.json": r"infinity.json: field rope_theta is Infinity",
    "neg-infinity-nested.json": r"field rope_scaling.factor is -Infinity",
    "deep-nesting.json": r"deep-nesting.json: nested deeper than 32 levels",
    "nesting-40.json": r"nesting-40.json: nested deeper than 32 levels",
    "hidden-1e9.json": r"hidden_size=1,000,000,000 is beyond qfold's ceiling of 131,072 \(estimated peak memory",
    "vocab-1e12.json": r"vocab_size=1,000,000,000,000 is beyond qfold's ceiling .*the limit is",
    "layers-100k.json": r"num_hidden_layers=100,000 is beyond qfold's ceiling of 1,024",
    "heads-zero.json": r"num_attention_heads=0",
    "kv-heads-not-divisor.json": r"num_attention_heads=32 is not divisible by num_key_value_heads=5",
    "kv-heads-negative.json": r"num_key_value_heads=-8",
    "hidden-string.json": r"hidden_size='2048': must be a positive integer",
    "hidden-float.json": r"hidden_size=2048.5: must be a positive integer",
    "hidden-bool.json": r"hidden_size=True: must be a positive integer",
    "head-dim-zero.json": r"head_dim=0",
    "vocab-null.json": r"vocab_size",
    "intermediate-negative.json": r"intermediate_size=-4096: must be a positive integer",
    "mla.json": r"kv_lora_rank=512: multi-head latent attention",
    "too-big-for-memory.json": r"this conversion does not fit: estimated peak memory .* GB .* of [0-9,]+ parameters",
}

# extra argv after `build --variant qfold` → (exit code, regex)
ARG_CASES: list[tuple[list[str], int, str]] = [
    (["--set", "rms_norm_eps=NaN"], 1, r"--set rms_norm_eps: the value is NaN"),
    (["--set", "hiden_size=8"], 1, r"no config field 'hiden_size'; did you mean hidden_size"),
    (["--set", "no_equals_sign"], 1, r"expected KEY=VALUE"),
    (["--set", "num_key_value_heads=[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"], 1,
     r"--set num_key_value_heads: nested deeper than 32 levels"),
    (["--ctx", "10000000", "--force-ctx"], 1, r"ctx=10,000,000 is beyond qfold's ceiling of 262,144"),
    (["--ctx", "131072"], 1, r"ctx=131,072 is beyond the model's max_position_embeddings=65,536.*--force-ctx"),
    (["--ctx", "0"], 2, r"--ctx: 0 must be at least 1"),
    (["--model", "no/such/config.json"], 1, r"not a preset .* nor an existing config.json or model folder"),
]


def _run_batch(cases: list[dict]) -> list[dict]:
    return run_batch(cases, workers=1)  # one long-lived child, 10 s and 1 GB per case


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("bad")
    builds = tmp / "builds"
    oversize = tmp / "oversize.json"
    oversize.write_text('{"model_type": "llama", "pad": "' + "x" * (2 << 20) + '"}')
    no_config = tmp / "empty-folder"
    no_config.mkdir()
    pickles = tmp / "pickle-folder"
    pickles.mkdir()
    (pickles / "config.json").write_text((CORPUS / "../../../analyzer/model/presets/llama-3.2-1b.json").read_text())
    (pickles / "pytorch_model.bin").write_bytes(b"\x80\x04 not unpickled")
    cases: dict[str, list[str]] = {}
    for name in FILE_CASES:
        cases[name] = ["--model", str(CORPUS / name)]
    # the memory limit is a materialised build's (weights with values); analysis mode's peak does not grow with
    # the parameter count, so that mode would analyse this config (test_fast_presets: 7-8B on a 16 GB machine)
    cases["too-big-for-memory.json"] += ["--mode", "materialised"]
    for i, (argv, _, _) in enumerate(ARG_CASES):
        cases[f"arg{i}"] = argv
    cases["oversize"] = ["--model", str(oversize)]
    cases["no-config-folder"] = ["--model", str(no_config)]
    cases["pickle-folder"] = ["--model", str(pickles)]
    batch = [{"argv": ["build", "--variant", "qfold", "--builds-dir", str(builds), *argv]} for argv in cases.values()]
    out = dict(zip(cases, _run_batch(batch), strict=True))
    assert not builds.exists() or not [p for p in builds.iterdir() if not p.name.startswith(".")]
    return out


EXPECTED: dict[str, tuple[int, str]] = {
    **{name: (1, regex) for name, regex in FILE_CASES.items()},
    **{f"arg{i}": (code, regex) for i, (_, code, regex) in enumerate(ARG_CASES)},
    "oversize": (1, r"oversize.json: [0-9,]+ bytes, more than the 1,048,576 this file may have"),
    "no-config-folder": (1, r"empty-folder: folder has no config.json"),
    "pickle-folder": (1, r"weights are only in pickle files \(pytorch_model.bin\).*safetensors only"),
}


def test_the_corpus_is_big_enough():
    assert len(EXPECTED) >= 30 and set(FILE_CASES) == {p.name for p in CORPUS.glob("*.json")}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_source_is_one_clear_line(results, case):
    r = results[case]
    code, regex = EXPECTED[case]
    assert r["traceback"] is None, r["traceback"]
    assert "Traceback" not in r["stderr"]
    assert r["code"] == code, r
    lines = [ln for ln in r["stderr"].splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    import re

    assert re.search(regex, lines[0]), lines[0]
    assert r["stdout"] == ""


def test_memory_limit_is_the_environments_when_set(monkeypatch):
    config = load_config(resolve_source("exaone-4.0-1.2b"))
    monkeypatch.setenv("QFOLD_MAX_BUILD_BYTES", "1000000000")
    refused = r"does not fit: estimated peak memory \d+\.\d GB \(at least .* the limit is 1.0 GB"
    with pytest.raises(SourceError, match=refused):
        check_request(config, 4096)
    monkeypatch.setenv("QFOLD_MAX_BUILD_BYTES", "1e12")
    assert check_request(config, 4096).fits


def test_the_estimate_counts_the_default_presets_parameters():
    """EXAONE 4.0 1.2B: 1,279,391,744 parameters per its model card (1.28 B incl. the tied embedding); the
    estimate leaves out norm scales (2 × 2048 per layer + q/k norms), so it is slightly below."""
    cost = estimate(load_config(resolve_source("exaone-4.0-1.2b")), 4096)
    layer = 2048 * 32 * 64 * 2 + 2048 * 8 * 64 * 2 + 3 * 2048 * 4096
    assert cost.params == 102400 * 2048 + 30 * layer
    assert cost.kv_state_bytes == 2 * 30 * 8 * 4096 * 64 * 2 == 251_658_240


def test_build_labels_never_start_with_a_dot(tmp_path):
    folder = tmp_path / ".tmp-x-1"
    folder.mkdir()
    (folder / "config.json").write_text((CORPUS / "../../../analyzer/model/presets/llama-3.2-1b.json").read_text())
    src = resolve_source(str(folder))
    assert src.label == "tmp-x-1"


def test_typed_paths_stay_under_the_data_roots(tmp_path, monkeypatch):
    from analyzer.errors import QfoldError
    from analyzer.fsio import path_under_roots

    root = tmp_path / "data"
    (root / "model").mkdir(parents=True)
    outside = tmp_path / "secret"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(root))
    assert path_under_roots(str(root / "model")) == (root / "model").resolve()
    assert path_under_roots(str(root / "missing")) == (root / "missing").resolve()  # existence is checked later
    for bad in (str(outside), str(root / ".." / "secret"), str(root / "link"), "/etc/passwd", "~"):
        with pytest.raises(QfoldError, match=r"outside the folders this server may read \(QFOLD_DATA_ROOTS: "):
            path_under_roots(bad)
