"""A sweep's spec: its dimensions (one ``Dimension`` per axis), the grid of ``SweepPoint`` s, and the TOML/JSON
spec file that stands in for the flags. See ``analyzer.sweep.driver`` for how a sweep runs."""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError
from analyzer.fsio import IntegerTooLongError, check_structure, loads_strict, read_bytes_bounded
from analyzer.model.sources import DEFAULT_PRESET
from analyzer.model.spec import ANALYSIS_MODE, DEFAULT_Q_LEN, PHASES
from analyzer.model.variants import VARIANTS

NO_COMPRESSION = "none"
# Every point is a conversion (seconds to minutes each): a grid past a thousand points is a typo, not a plan.
DEFAULT_MAX_POINTS = 1_000
MAX_SPEC_BYTES = 1 << 20
MAX_SPEC_DEPTH = 8  # keys → a list of values
TABLE_SUFFIXES: tuple[str, ...] = (".csv", ".json", ".parquet")


class SweepError(QfoldError):
    """A sweep spec, table or run cannot be used as given."""

# ------------------------------------------------------------------------------------------------- dimensions
def _split_commas(values: Sequence[str]) -> list[str]:
    return [v.strip() for text in values for v in str(text).split(",") if v.strip()]


def _parse_ctx(values: Sequence[Any]) -> tuple[int, ...]:
    out = []
    for v in _split_commas([str(x) for x in values]):
        if not re.fullmatch(r"[0-9]{1,9}", v) or int(v) < 1:  # ASCII digits, bounded: never a 4,300-digit int()
            raise SweepError(f"ctx {v[:20]!r}{'…' if len(v) > 20 else ''}: a context length is a positive integer "
                             "(at most 9 digits)")
        out.append(int(v))
    return tuple(out)


def _parse_variant(values: Sequence[Any]) -> tuple[str, ...]:
    out = tuple(_split_commas([str(x) for x in values]))
    for v in out:
        if v not in VARIANTS:
            raise SweepError(f"variant {v!r}: choose from {', '.join(sorted(VARIANTS))}")
    return out


def _parse_phase(values: Sequence[Any]) -> tuple[str, ...]:
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
    q_len: int = DEFAULT_Q_LEN  # prompt tokens per call of a prefill point
    # analysis (value-free weights, no package: a sweep keeps no package anyway) or materialised
    build_mode: str = ANALYSIS_MODE

    def values(self, name: str) -> tuple[Any, ...]:
        return dict(self.axes)[name]

    @property
    def point_count(self) -> int:
        """Cells of the grid (the product of the axes' lengths), known before any point is made."""
        return math.prod(len(self.values(n)) for n in DIMENSION_NAMES)

    def points(self, max_points: int = DEFAULT_MAX_POINTS) -> tuple[SweepPoint, ...]:
        """Every cell of the grid; a grid of more than ``max_points`` cells is refused with both numbers."""
        check_point_count(self, max_points)
        combos = itertools.product(*(self.values(n) for n in DIMENSION_NAMES))
        return tuple(dict.fromkeys(SweepPoint(**dict(zip(DIMENSION_NAMES, c, strict=True))) for c in combos))

    def to_json(self) -> dict[str, Any]:
        return {**{n: list(v) for n, v in self.axes}, "structure": self.structure, "set": list(self.overrides),
                "kv": self.kv_mode, "seed": self.seed, "steps": self.equivalence_steps, "device": self.device,
                "q_len": self.q_len, "mode": self.build_mode}


def check_point_count(spec: SweepSpec, max_points: int = DEFAULT_MAX_POINTS) -> int:
    n = spec.point_count
    if n > max_points:
        sizes = " × ".join(f"{len(spec.values(d))} {d}" for d in DIMENSION_NAMES)
        raise SweepError(f"the sweep has {n:,} points ({sizes}), more than the cap of {max_points:,}; "
                         "give fewer values or raise the cap (--max-points)")
    return n


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
    if p.suffix not in (".toml", ".json"):
        raise SweepError(f"{p}: a sweep spec is a .toml or .json file")
    raw = read_bytes_bounded(p, MAX_SPEC_BYTES, SweepError)  # a regular file (a FIFO would hang), size first
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SweepError(f"{p}: not UTF-8 text (byte {e.start})") from e
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
            check_structure(data, str(p), MAX_SPEC_DEPTH, SweepError)
        else:
            data = loads_strict(text, str(p), MAX_SPEC_DEPTH, SweepError)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise SweepError(f"{p}: not valid {p.suffix[1:].upper()} ({e})") from e
    except RecursionError:
        raise SweepError(f"{p}: nested deeper than {MAX_SPEC_DEPTH} levels") from None
    except SweepError:
        raise
    except ValueError as e:  # tomllib: an integer past Python's 4,300-digit limit (its advice is not ours to give)
        digits = re.search(r"value has (\d+) digits", str(e))
        too_long = str(IntegerTooLongError(int(digits[1]))) if digits else "an integer of more than 4,300 digits"
        raise SweepError(f"{p}: {too_long}") from None
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
