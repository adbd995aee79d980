"""Model sources: a preset name, a path to a Hugging Face ``config.json``, or a local model folder.

A source resolves to a :class:`ModelSource`: the config after ``--set`` overrides (as canonical JSON), the
safetensors files that hold real weights (if any) and the seed for random ones. Everything that changes
the torch model is in the record, so its hash can key a build.

Security: configs are read as JSON and built with transformers' config classes; no remote code is ever
run (``trust_remote_code`` is never passed) and weights are read from ``*.safetensors`` only.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import threading
import unicodedata
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from safetensors import SafetensorError, safe_open

from analyzer.errors import SourceError
from analyzer.fsio import loads_strict, read_json
from analyzer.model.families import check_family

DEFAULT_PRESET = "exaone-4.0-1.2b"

# Overrides that keep the attention geometry but make a full-depth build cheap (docs/measurements.md, "structure"
# config: same tiles and tile bytes in ~50 s and ~1 GB instead of ~2.5 min and ~15 GB).
STRUCTURE_OVERRIDES = ("hidden_size=256", "intermediate_size=512", "vocab_size=1000")

_PRIVATE_KEY = "_qfold"  # provenance block inside shipped preset JSON; not a config field
_POSITIVE_FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
                    "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings")


@dataclass(frozen=True, slots=True)
class PresetInfo:
    name: str
    model_type: str
    source: str
    note: str


@dataclass(frozen=True, slots=True)
class WeightFile:
    name: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True, slots=True)
class AttentionGeometry:
    """What decides tile count and size: per layer, K and V of ``[Hkv, ctx, D]`` shared by G query heads."""

    model_type: str
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


@dataclass(frozen=True, slots=True)
class ModelSource:
    kind: Literal["preset", "config", "folder"]
    ref: str  # preset name, or the resolved path of the config.json / folder
    label: str  # short, filesystem-safe name used in build folder names
    config_json: str  # canonical JSON of the config dict after overrides
    overrides: tuple[str, ...]
    weights: tuple[WeightFile, ...]
    seed: int

    @property
    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config_json)

    @property
    def has_real_weights(self) -> bool:
        return bool(self.weights)

    def fingerprint(self) -> dict[str, Any]:
        """Everything about the source that changes the converted model (the path itself does not)."""
        return {
            "config": self.config_dict,
            "weights": [(w.name, w.size_bytes, w.sha256) for w in self.weights],
            "seed": None if self.weights else self.seed,
        }


def _presets_dir() -> Path:
    return Path(str(resources.files("analyzer.model") / "presets"))


def list_presets() -> list[PresetInfo]:
    out = []
    for path in sorted(_presets_dir().glob("*.json")):
        raw = json.loads(path.read_text())
        meta = raw.get(_PRIVATE_KEY, {})
        out.append(PresetInfo(path.stem, raw["model_type"], meta.get("source", ""), meta.get("note", "")))
    return out


def preset_names() -> list[str]:
    return [p.name for p in list_presets()]


# A Hugging Face config.json is a few KB (the presets' are < 2 KB); anything over this is not a config.
MAX_CONFIG_BYTES = 1 << 20
# Configs nest a few levels (rope_scaling, quantization_config, text_config); deeper is not a config.
MAX_CONFIG_DEPTH = 32


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; VALUE is read as JSON when it parses (``8``, ``1e-6``, ``null``, ``[..]``), else text."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise SourceError(f"--set {text!r}: expected KEY=VALUE, e.g. --set num_key_value_heads=4")
    try:
        return key, loads_strict(value, f"--set {key}", MAX_CONFIG_DEPTH, SourceError)
    except json.JSONDecodeError:
        return key, value


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_config_file(path: Path) -> dict[str, Any]:
    raw = read_json(path, MAX_CONFIG_BYTES, SourceError, MAX_CONFIG_DEPTH)
    if not isinstance(raw, dict):
        raise SourceError(f"{path}: a config.json must hold a JSON object, not {type(raw).__name__}")
    return raw


# transformers' lazy modules are not safe to import from two threads at once: the dashboard serves each browser
# session from its own thread, and two sessions resolving a source at the same moment got "ImportError: cannot
# import name 'CONFIG_MAPPING' from 'transformers'". The first import (and each family's lazily imported config
# module) happens under this lock.
_TRANSFORMERS_IMPORT = threading.Lock()


def config_class(model_type: Any):
    with _TRANSFORMERS_IMPORT:
        from transformers import CONFIG_MAPPING

        if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
            close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise SourceError(
                f"model_type={model_type!r} is not an architecture this transformers version implements{hint}; "
                "qfold never runs remote code"
            )
        return CONFIG_MAPPING[model_type]


def _fit_layer_types(raw: dict[str, Any]) -> None:
    """Keep an explicit ``layer_types`` list consistent with ``num_hidden_layers`` after an override:
    the list is the model's repeating pattern, so it is cut or cycled to the new depth."""
    types_ = raw.get("layer_types")
    n = raw.get("num_hidden_layers")
    if isinstance(types_, list) and types_ and isinstance(n, int) and n > 0 and len(types_) != n:
        raw["layer_types"] = [types_[i % len(types_)] for i in range(n)]


def _drop_out_of_vocab_token_ids(raw: dict[str, Any]) -> None:
    """A shrunken ``vocab_size`` (a structure build) can leave special-token ids past the end of the
    embedding, which torch rejects for ``pad_token_id``. They do not change the decode graph: drop them."""
    vocab = raw.get("vocab_size")
    if not isinstance(vocab, int):
        return
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        ids = raw.get(key)
        listed = ids if isinstance(ids, list) else [ids]
        if any(isinstance(i, int) and i >= vocab for i in listed):
            raw[key] = None


def _apply_overrides(raw: dict[str, Any], overrides: tuple[str, ...], origin: str) -> dict[str, Any]:
    if not overrides:
        return raw
    known = set(load_config_dict(raw).to_dict()) | set(raw)
    out = dict(raw)
    for text in overrides:
        key, value = parse_override(text)
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise SourceError(f"--set {key}: {origin} has no config field {key!r}{hint}")
        out[key] = value
    _fit_layer_types(out)
    _drop_out_of_vocab_token_ids(out)
    return out


def safe_label(text: str) -> str:
    """A build-folder-safe name: ASCII letters, digits, ``.``, ``_``, ``-``; never starting with ``.`` (the
    builds folder keeps its own state in dot-folders) or ``-``. NFKC first, so a fullwidth ``ｂ１`` is ``b1``;
    zero-width and bidi controls become separators and are trimmed, so ``b1\u200b`` is ``b1`` too."""

    label = re.sub(r"[^A-Za-z0-9._-]+", "-", unicodedata.normalize("NFKC", text))
    return label.lstrip(".-").rstrip("-")[:40] or "model"


def resolve_source(model: str, overrides: tuple[str, ...] | list[str] = (), seed: int = 0) -> ModelSource:
    """Resolve ``--model`` (preset name, config.json path or model folder) plus ``--set`` overrides."""
    overrides = tuple(overrides)
    weights: tuple[WeightFile, ...] = ()
    names = preset_names()
    if model in names:
        raw = _read_config_file(_presets_dir() / f"{model}.json")
        kind, ref, label = "preset", model, model
    else:
        path = Path(model).expanduser()
        if path.is_dir():
            cfg_path = path / "config.json"
            if not cfg_path.is_file():
                raise SourceError(f"--model {model}: folder has no config.json")
            raw = _read_config_file(cfg_path)
            files = sorted(path.glob("*.safetensors"))
            pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
            if not files and pickles:
                raise SourceError(
                    f"--model {model}: weights are only in pickle files ({', '.join(pickles[:3])}); "
                    "qfold loads safetensors only (convert them with `safetensors` first)"
                )
            weights = tuple(WeightFile(p.name, p.stat().st_size, _sha256_file(p)) for p in files)
            kind, ref, label = "folder", str(path.resolve()), safe_label(path.resolve().name)
        elif path.is_file():
            raw = _read_config_file(path)
            kind, ref = "config", str(path.resolve())
            label = safe_label(path.resolve().parent.name if path.name == "config.json" else path.stem)
        else:
            raise SourceError(
                f"--model {model!r}: not a preset ({', '.join(names)}), nor an existing config.json or model folder"
            )
    raw.pop(_PRIVATE_KEY, None)
    if "model_type" not in raw:
        raise SourceError(f"--model {model}: config has no 'model_type' field")
    config_class(raw["model_type"])  # a transformers architecture at all (with a did-you-mean)
    _refuse_mla(raw.get("kv_lora_rank"))
    check_family(raw["model_type"])
    raw = _apply_overrides(raw, overrides, f"--model {model}")
    for field in _POSITIVE_FIELDS:
        value = raw.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise SourceError(f"{field}={value!r}: must be a positive integer")
    config = load_config_dict(raw)  # validates: architecture known, heads divisible
    geometry_of(config)
    return ModelSource(
        kind=kind,
        ref=ref,
        label=label,
        config_json=json.dumps(raw, sort_keys=True),
        overrides=overrides,
        weights=weights,
        seed=seed,
    )


def load_config_dict(raw: dict[str, Any]):
    cls = config_class(raw.get("model_type"))
    try:
        return cls.from_dict(dict(raw))
    except Exception as e:  # transformers' strict-dataclass validators raise their own error types
        detail = " ".join(str(e).split())
        raise SourceError(f"config (model_type={raw.get('model_type')!r}) is invalid: {detail}") from e


def safetensors_shapes(source: ModelSource) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of a folder source's safetensors files, from their headers only (no tensor data is
    read, nor torch imported): what a value-free build checks its model against, and what ``run_builds`` reads
    before it starts a conversion child, so a corrupt or truncated file is refused at once."""
    out: dict[str, tuple[int, ...]] = {}
    for w in source.weights:
        path = Path(source.ref) / w.name  # names come from a glob of that folder
        try:
            with safe_open(str(path), framework="numpy") as f:
                out.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
        except (SafetensorError, OSError) as e:
            raise SourceError(f"{path}: not a readable safetensors file ({e})") from e
    return out


def load_config(source: ModelSource):
    return load_config_dict(source.config_dict)


def _positive_int(config, field: str) -> int:
    value = getattr(config, field, None)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SourceError(f"{field}={value!r}: must be a positive integer")
    return value


def _refuse_mla(kv_lora_rank: Any) -> None:
    if kv_lora_rank:
        raise SourceError(
            f"kv_lora_rank={kv_lora_rank}: multi-head latent attention (MLA) caches a latent, not "
            "per-head K/V; qfold's variants do not apply"
        )


def geometry_of(config) -> AttentionGeometry:
    """Read and check the attention geometry; the errors name the field and its value."""
    _refuse_mla(getattr(config, "kv_lora_rank", None))
    nq = _positive_int(config, "num_attention_heads")
    nkv = getattr(config, "num_key_value_heads", None)
    nkv = nq if nkv is None else nkv  # families without the field are multi-head attention
    if not isinstance(nkv, int) or isinstance(nkv, bool) or nkv <= 0:
        raise SourceError(f"num_key_value_heads={nkv!r}: must be a positive integer")
    if nq % nkv:
        raise SourceError(
            f"num_attention_heads={nq} is not divisible by num_key_value_heads={nkv}: "
            "grouped-query attention needs every KV head to serve the same number of query heads"
        )
    hidden = _positive_int(config, "hidden_size")
    head_dim = getattr(config, "head_dim", None) or hidden // nq
    if not isinstance(head_dim, int) or head_dim <= 0:
        raise SourceError(f"head_dim={head_dim!r}: must be a positive integer")
    return AttentionGeometry(
        model_type=config.model_type,
        num_layers=_positive_int(config, "num_hidden_layers"),
        num_q_heads=nq,
        num_kv_heads=nkv,
        head_dim=head_dim,
        hidden_size=hidden,
        vocab_size=_positive_int(config, "vocab_size"),
    )


def source_from_fingerprint(kind: str, ref: str, label: str, fingerprint: dict, overrides=()) -> ModelSource:
    """Rebuild a ModelSource from what a build stored (used by the conversion child process)."""
    return ModelSource(
        kind=kind,  # type: ignore[arg-type]
        ref=ref,
        label=label,
        config_json=json.dumps(fingerprint["config"], sort_keys=True),
        overrides=tuple(overrides),
        weights=tuple(WeightFile(*w) for w in fingerprint["weights"]),
        seed=fingerprint["seed"] if fingerprint["seed"] is not None else 0,
    )
