"""A sweep's spec: its dimensions (one ``Dimension`` per axis), the grid of ``SweepPoint`` s, and the TOML/JSON
spec file that stands in for the flags. See ``analyzer.device.sweep`` for how a sweep runs."""

from __future__ import annotations

import itertools
import json
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError

NO_COMPRESSION = "none"
TABLE_SUFFIXES: tuple[str, ...] = (".csv", ".json", ".parquet")


class SweepError(QfoldError):
    """A sweep spec, table or run cannot be used as given."""


# ------------------------------------------------------------------------------------------------- dimensions
def _split_commas(values: Sequence[str]) -> list[str]:
    return [v.strip() for text in values for v in str(text).split(",") if v.strip()]


def _parse_ctx(values: Sequence[Any]) -> tuple[int, ...]:
    out = []
    for v in _split_commas([str(x) for x in values]):
        if not v.isdigit() or int(v) < 1:
            raise SweepError(f"ctx {v!r}: a context length is a positive integer")
        out.append(int(v))
    return tuple(out)


def _parse_variant(values: Sequence[Any]) -> tuple[str, ...]:
    from analyzer.model.variants import VARIANTS

    out = tuple(_split_commas([str(x) for x in values]))
    for v in out:
        if v not in VARIANTS:
            raise SweepError(f"variant {v!r}: choose from {', '.join(sorted(VARIANTS))}")
    return out


def _parse_phase(values: Sequence[Any]) -> tuple[str, ...]:
    from analyzer.model.prefill import PHASES

    out = tuple(_split_commas([str(x) for x in values]))
    for v in out:
        if v not in PHASES:
            raise SweepError(f"phase {v!r}: choose from {', '.join(PHASES)} (a prefill point has q_len prompt tokens "
                             "per call: --q-len)")
    return out


def _parse_verbatim(values: Sequence[Any]) -> tuple[str, ...]:
    """One value per item, never split: a model path or a compression spec may contain commas."""
    out = tuple(str(v).strip() for v in values)
    if any(not v for v in out):
        raise SweepError("an empty value: give one model or compression spec per item")
    return out


@dataclass(frozen=True, slots=True)
class Dimension:
    """One axis of a sweep: its name (= the table column and the ``SweepPoint`` field), how values are read from
    flags or a spec file, and the default when none are given."""

    name: str
    parse: Callable[[Sequence[Any]], tuple[Any, ...]]
    default: tuple[Any, ...]
    help: str


def _default_model() -> tuple[str, ...]:
    from analyzer.model.sources import DEFAULT_PRESET

    return (DEFAULT_PRESET,)


# In grid order (outermost first): points of one model and compression run side by side, ctx then phase innermost.
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("model", _parse_verbatim, (), "preset, config.json or local HF folder (one per value)"),
    Dimension("compression", _parse_verbatim, (NO_COMPRESSION,), "compression spec, 'none' = fp16 (one per value)"),
    Dimension("variant", _parse_variant, ("repeat_kv", "qfold"), "attention variants, comma-separated"),
    Dimension("ctx", _parse_ctx, (4096,), "context lengths (static cache slots), comma-separated"),
    Dimension("phase", _parse_phase, ("decode",), "what one call does: decode, prefill (of --q-len prompt tokens), "
                                                  "comma-separated"),
)
DIMENSION_NAMES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)


@dataclass(frozen=True, slots=True, order=True)
class SweepPoint:
    """One cell of the grid; field names and order are ``DIMENSION_NAMES`` (a test holds them together)."""

    model: str
    compression: str
    variant: str
    ctx: int
    phase: str = "decode"

    def describe(self) -> str:
        return " ".join(f"{n}={getattr(self, n)}" for n in DIMENSION_NAMES)


# ------------------------------------------------------------------------------------------------- the spec
@dataclass(frozen=True, slots=True)
class SweepSpec:
    """What to sweep and how every point is built. ``axes`` holds the values of every dimension."""

    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    structure: bool = False
    overrides: tuple[str, ...] = ()
    kv_mode: str = "state"
    seed: int = 0
    equivalence_steps: int = 8
    device: str = ""  # device profile key for predicted_tok_per_s ("" = the default profile)
    q_len: int = 64  # prompt tokens per call of a prefill point (analyzer.model.prefill.DEFAULT_Q_LEN)
    # analysis (value-free weights, no package: a sweep keeps no package anyway) or materialised
    build_mode: str = "analysis"

    def values(self, name: str) -> tuple[Any, ...]:
        return dict(self.axes)[name]

    def points(self) -> tuple[SweepPoint, ...]:
        combos = itertools.product(*(self.values(n) for n in DIMENSION_NAMES))
        return tuple(dict.fromkeys(SweepPoint(**dict(zip(DIMENSION_NAMES, c, strict=True))) for c in combos))

    def to_json(self) -> dict[str, Any]:
        return {**{n: list(v) for n, v in self.axes}, "structure": self.structure, "set": list(self.overrides),
                "kv": self.kv_mode, "seed": self.seed, "steps": self.equivalence_steps, "device": self.device,
                "q_len": self.q_len, "mode": self.build_mode}


OPTION_KEYS: Mapping[str, str] = {"structure": "structure", "set": "overrides", "kv": "kv_mode", "seed": "seed",
                                  "steps": "equivalence_steps", "device": "device", "q_len": "q_len",
                                  "mode": "build_mode"}
SPEC_KEYS: tuple[str, ...] = (*DIMENSION_NAMES, *OPTION_KEYS, "out")


def make_spec(values: Mapping[str, Any]) -> SweepSpec:
    """A spec from a mapping of ``SPEC_KEYS`` (flags or a spec file): each dimension a list (or one value),
    missing dimensions take their defaults. Unknown keys are an error, never ignored."""
    unknown = sorted(set(values) - set(SPEC_KEYS))
    if unknown:
        raise SweepError(f"unknown sweep key(s) {', '.join(map(repr, unknown))}; known: {', '.join(SPEC_KEYS)}")
    axes = []
    for dim in DIMENSIONS:
        raw = values.get(dim.name)
        if raw is None or raw == []:
            parsed = dim.default or _default_model()
        else:
            parsed = dim.parse(raw if isinstance(raw, list | tuple) else [raw])
        if not parsed:
            raise SweepError(f"{dim.name}: no values")
        axes.append((dim.name, tuple(dict.fromkeys(parsed))))
    options: dict[str, Any] = {}
    for key, attr in OPTION_KEYS.items():
        if values.get(key) is not None:
            options[attr] = values[key]
    if "overrides" in options:
        sets = options["overrides"]
        options["overrides"] = tuple([sets] if isinstance(sets, str) else sets)
    for attr, kind in (("structure", bool), ("seed", int), ("equivalence_steps", int), ("kv_mode", str),
                       ("device", str), ("q_len", int), ("build_mode", str)):
        if attr in options and (not isinstance(options[attr], kind) or
                                (kind is int and isinstance(options[attr], bool))):
            raise SweepError(f"{attr}={options[attr]!r}: expected {kind.__name__}")
    if options.get("q_len", 1) < 1:
        raise SweepError(f"q_len={options['q_len']!r}: prompt tokens per prefill call must be a positive integer")
    if options.get("build_mode", "analysis") not in ("analysis", "materialised"):
        raise SweepError(f"mode={options['build_mode']!r}: expected analysis or materialised")
    return SweepSpec(tuple(axes), **options)


def read_spec_file(path: str | Path) -> tuple[SweepSpec, str | None]:
    """A TOML (``.toml``) or JSON (``.json``) sweep spec → (spec, its ``out`` path or None). Example::

        model = ["exaone-4.0-1.2b"]
        ctx = [512, 1024, 2048, 4096]
        variant = ["repeat_kv", "qfold"]
        compression = ["none", "top8"]
        structure = true
        out = "sweep.csv"
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SweepError(f"{p}: cannot read the sweep spec ({e})") from e
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            raise SweepError(f"{p}: a sweep spec is a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise SweepError(f"{p}: not valid {p.suffix[1:].upper()} ({e})") from e
    if not isinstance(data, dict):
        raise SweepError(f"{p}: a sweep spec is a table/object of keys {', '.join(SPEC_KEYS)}")
    try:
        spec = make_spec(data)
    except SweepError as e:
        raise SweepError(f"{p}: {e}") from e
    out = data.get("out")
    if out is not None and not isinstance(out, str):
        raise SweepError(f"{p}: out={out!r}: expected a file name")
    return spec, out
