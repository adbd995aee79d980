"""Model sources: presets, config.json files, local folders with safetensors, --set overrides, clear errors."""

import json

import pytest
import torch

from analyzer.errors import SourceError
from analyzer.model.decode import build_model
from analyzer.model.sources import geometry_of, list_presets, load_config, preset_names, resolve_source

REQUIRED_PRESETS = {"exaone-4.0-1.2b", "llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b-v0.3"}


def test_presets_ship_with_their_source_cited():
    presets = {p.name: p for p in list_presets()}
    assert REQUIRED_PRESETS <= set(presets)
    for p in presets.values():
        assert "config.json" in p.source, p.name


def test_default_preset_geometry_is_the_writeups():
    g = geometry_of(load_config(resolve_source("exaone-4.0-1.2b")))
    assert (g.num_layers, g.num_q_heads, g.num_kv_heads, g.head_dim, g.group_size) == (30, 32, 8, 64, 4)
    assert (g.hidden_size, g.vocab_size) == (2048, 102400)


@pytest.mark.parametrize("name", sorted(REQUIRED_PRESETS | {"gemma-3-1b", "phi-3-mini-4k", "llama-3.1-70b"}))
def test_every_preset_resolves(name):
    g = geometry_of(load_config(resolve_source(name)))
    assert g.num_q_heads % g.num_kv_heads == 0


def test_overrides_are_typed_and_keep_layer_types_consistent():
    src = resolve_source("exaone-4.0-1.2b", ["num_hidden_layers=3", "rms_norm_eps=1e-6", "num_key_value_heads=4"])
    cfg = load_config(src)
    assert cfg.num_hidden_layers == 3 and cfg.layer_types == ["full_attention"] * 3
    assert cfg.rms_norm_eps == 1e-6 and cfg.num_key_value_heads == 4
    assert src.overrides == ("num_hidden_layers=3", "rms_norm_eps=1e-6", "num_key_value_heads=4")


def test_fingerprint_changes_with_what_changes_the_model():
    a = resolve_source("exaone-4.0-1.2b")
    assert a.fingerprint() == resolve_source("exaone-4.0-1.2b").fingerprint()
    assert a.fingerprint() != resolve_source("exaone-4.0-1.2b", ["num_key_value_heads=4"]).fingerprint()
    assert a.fingerprint() != resolve_source("exaone-4.0-1.2b", seed=1).fingerprint()


@pytest.mark.parametrize(("overrides", "match"), [
    (["hiden_size=8"], r"no config field 'hiden_size'.*hidden_size"),
    (["num_key_value_heads=5"], r"num_attention_heads=32 is not divisible by num_key_value_heads=5"),
    (["num_key_value_heads=0"], r"num_key_value_heads=0"),
    (["num_hidden_layers=-1"], r"num_hidden_layers=-1"),
    (["no_equals_sign"], r"expected KEY=VALUE"),
])
def test_bad_overrides_name_field_and_value(overrides, match):
    with pytest.raises(SourceError, match=match):
        resolve_source("exaone-4.0-1.2b", overrides)


def test_unknown_source_and_architecture(tmp_path):
    with pytest.raises(SourceError, match="not a preset"):
        resolve_source("no-such-model")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llamma", "hidden_size": 8}))
    with pytest.raises(SourceError, match=r"model_type='llamma'.*did you mean llama"):
        resolve_source(str(cfg))
    cfg.write_text("{not json")
    with pytest.raises(SourceError, match="not valid JSON"):
        resolve_source(str(cfg))


def test_mla_is_refused_by_name(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "deepseek_v3", "kv_lora_rank": 512, "num_hidden_layers": 2}))
    with pytest.raises(SourceError, match="kv_lora_rank=512"):
        resolve_source(str(cfg))


def test_config_json_path_is_a_source(tmp_path):
    raw = json.loads((list_presets() and open(_preset_path("llama-3.2-1b"))).read())
    raw.pop("_qfold")
    path = tmp_path / "my-llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(raw))
    src = resolve_source(str(path), ["num_hidden_layers=2"])
    assert src.kind == "config" and src.label == "my-llama" and not src.has_real_weights


def _preset_path(name):
    from analyzer.model.sources import _presets_dir

    return _presets_dir() / f"{name}.json"


TINY = ["hidden_size=64", "intermediate_size=128", "vocab_size=100", "num_hidden_layers=2", "head_dim=16"]


def _tiny_folder(tmp_path, with_weights=True):
    from safetensors.torch import save_file

    src = resolve_source("llama-3.2-1b", TINY, seed=7)
    model = build_model(src)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(src.config_json)
    if with_weights:
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(folder / "model.safetensors"))
    return folder, model


def test_local_folder_loads_safetensors_weights(tmp_path):
    folder, model = _tiny_folder(tmp_path)
    src = resolve_source(str(folder))
    assert src.kind == "folder" and src.has_real_weights and src.weights[0].name == "model.safetensors"
    loaded = build_model(src)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    # the weights' content is part of the fingerprint (and so of the build key)
    assert len(src.weights[0].sha256) == 64


def test_pickle_only_folder_is_refused(tmp_path):
    folder, _ = _tiny_folder(tmp_path, with_weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(SourceError, match="safetensors only"):
        resolve_source(str(folder))


def test_mismatched_safetensors_shape_is_named(tmp_path):
    from safetensors.torch import save_file

    folder, model = _tiny_folder(tmp_path)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["model.norm.weight"] = torch.ones(3)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(SourceError, match=r"'model.norm.weight' has shape \[3\]"):
        build_model(resolve_source(str(folder)))


def test_presets_list_is_stable():
    assert preset_names() == sorted(preset_names())
