"""Read a parsed JSON document into typed records, failing on the first wrong value with the file and the
field path (``analysis.json: field program.ops[12][4][0][1]: expected a list, got a string``)."""

from __future__ import annotations

import math
from typing import Any, NoReturn

from analyzer.errors import AnalysisFileError

_JSON_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
               float: "a number", type(None): "null"}


def json_kind(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


class Field:
    """One JSON value in ``where`` (a file name), reached from ``parent`` by ``key``; accessors check its type.
    The path is spelled out only for an error message."""

    __slots__ = ("key", "parent", "value", "where")

    def __init__(self, value: Any, where: str, parent: Field | None = None, key: str | int | None = None):
        self.value, self.where, self.parent, self.key = value, where, parent, key

    @property
    def path(self) -> str:
        if self.parent is None:
            return ""
        head = self.parent.path
        if isinstance(self.key, int):
            return f"{head}[{self.key}]"
        return f"{head}.{self.key}" if head else str(self.key)

    def fail(self, why: str) -> NoReturn:
        raise AnalysisFileError(f"{self.where}: field {self.path or '(the document)'}: {why}")

    def _expected(self, what: str) -> NoReturn:
        self.fail(f"expected {what}, got {json_kind(self.value)}")

    # -- containers
    def __getitem__(self, key: str) -> Field:
        if not isinstance(self.value, dict):
            self._expected("an object")
        if key not in self.value:
            Field(None, self.where, self, key).fail("missing")
        return Field(self.value[key], self.where, self, key)

    def get(self, key: str) -> Field | None:
        """An optional member; None when absent."""
        if not isinstance(self.value, dict):
            self._expected("an object")
        return Field(self.value[key], self.where, self, key) if key in self.value else None

    def dict(self) -> dict[str, Field]:
        if not isinstance(self.value, dict):
            self._expected("an object")
        return {k: Field(v, self.where, self, k) for k, v in self.value.items()}

    def list(self, length: int | None = None) -> list[Field]:
        if not isinstance(self.value, list | tuple):  # a tuple: an in-memory document not yet serialised
            self._expected("a list")
        if length is not None and len(self.value) != length:
            self.fail(f"expected {length} items, got {len(self.value)}")
        return [Field(v, self.where, self, i) for i, v in enumerate(self.value)]

    # -- scalars
    def str(self) -> str:
        if not isinstance(self.value, str):
            self._expected("a string")
        return self.value

    def int(self) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            self._expected("an integer")
        return self.value

    def count(self) -> int:
        """An integer ≥ 0 (a size, a count, an index)."""
        value = self.int()
        if value < 0:
            self.fail(f"expected a count ≥ 0, got {value}")
        return value

    def number(self) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float) or not math.isfinite(self.value):
            self._expected("a finite number")
        return float(self.value)

    def bool(self) -> bool:
        if not isinstance(self.value, bool):
            self._expected("true or false")
        return self.value

    def optional(self) -> Field | None:
        """None for a JSON null, else this field."""
        return None if self.value is None else self

    def opt_str(self) -> str | None:
        return None if self.value is None else self.str()

    def opt_int(self) -> int | None:
        return None if self.value is None else self.int()

    def strs(self) -> tuple[str, ...]:
        return tuple(f.str() for f in self.list())

    def ints(self) -> tuple[int, ...]:
        return tuple(f.int() for f in self.list())
