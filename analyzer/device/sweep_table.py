"""A sweep's table: one ``SweepRow`` per point (spec, build key, status, tiles, ``bytes_<category>``, FLOPs where
the analysis has them, predicted tok/s for a device profile), written and read as CSV, JSON or Parquet."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from analyzer.device.sweep_spec import DIMENSION_NAMES, TABLE_SUFFIXES, SweepError, SweepPoint
from analyzer.graph.accounting import CATEGORIES

Status = Literal["pending", "running", "built", "reused", "failed"]
STATUSES: tuple[str, ...] = ("pending", "running", "built", "reused", "failed")


def check_table_path(path: str | Path) -> Path:
    """Fail before any work if the table cannot be written in the asked format."""
    p = Path(path)
    if p.suffix not in TABLE_SUFFIXES:
        raise SweepError(f"--out {p}: the table is written as {', '.join(TABLE_SUFFIXES)} (by suffix)")
    if p.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401  (pandas' Parquet engine; not a qfold requirement)
        except ImportError as e:
            raise SweepError(f"--out {p}: Parquet needs pyarrow, which is not installed; use .csv or .json") from e
    if p.parent and not p.parent.exists():
        raise SweepError(f"--out {p}: folder {p.parent} does not exist")
    return p


# ------------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True, slots=True)
class SweepRow:
    """One point's outcome. Bytes are per decode token, logical, from the MIL graph; ``bytes`` and ``flops``
    hold (category, value) pairs so new categories need no new field."""

    point: SweepPoint
    status: Status
    key: str = ""
    model_label: str = ""
    structure: bool = False
    kv_mode: str = "state"
    path: str = ""
    error: str = ""
    seconds: float = 0.0
    host: str = ""
    memory_bytes: int = 0
    tile_count: int | None = None
    total_ops: int | None = None
    non_const_ops: int | None = None
    bytes: tuple[tuple[str, int], ...] = ()
    flops: tuple[tuple[str, float], ...] = ()
    device_profile: str = ""
    bw_bytes_per_s: float | None = None
    predicted_tok_per_s: float | None = None
    stage: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("built", "reused")

    def bytes_of(self, category: str) -> int | None:
        return dict(self.bytes).get(category)

    def record(self) -> dict[str, Any]:
        """The table row: dimensions first, then the build, then the figures."""
        out: dict[str, Any] = {n: getattr(self.point, n) for n in DIMENSION_NAMES}
        out.update(key=self.key, status=self.status, tile_count=self.tile_count, total_ops=self.total_ops,
                   non_const_ops=self.non_const_ops)
        for c in (*CATEGORIES, "total", "kv_write_value_semantics"):
            out[f"bytes_{c}"] = self.bytes_of(c)
        for c, v in self.flops:
            out[f"flops_{c}"] = v
        out.update(predicted_tok_per_s=self.predicted_tok_per_s, device_profile=self.device_profile,
                   bw_bytes_per_s=self.bw_bytes_per_s, model_label=self.model_label, structure=self.structure,
                   kv_mode=self.kv_mode, seconds=round(self.seconds, 3), host=self.host,
                   memory_bytes=self.memory_bytes, path=self.path, error=self.error)
        return out


def table_columns(rows: Sequence[SweepRow]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows or [SweepRow(SweepPoint("", "", "", 0), "pending")]:
        cols.update(dict.fromkeys(r.record()))
    return list(cols)


def write_table(rows: Sequence[SweepRow], path: str | Path) -> Path:
    """CSV (formula cells escaped), JSON (a list of records) or Parquet, by suffix; written atomically."""
    import pandas as pd

    from analyzer.fmt import to_csv

    p = check_table_path(path)
    columns = table_columns(rows)
    records = [r.record() for r in rows]
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    if p.suffix == ".csv":
        tmp.write_text(to_csv(records, columns), encoding="utf-8")
    elif p.suffix == ".json":
        tmp.write_text(json.dumps([{c: r.get(c) for c in columns} for r in records], indent=1), encoding="utf-8")
    else:
        pd.DataFrame.from_records(records, columns=columns).to_parquet(tmp, index=False)
    os.replace(tmp, p)
    return p


def read_table(path: str | Path, data: bytes | None = None):
    """A sweep table (CSV, JSON or Parquet) → DataFrame; checks the contract columns are there."""
    import io

    import pandas as pd

    p = Path(path)
    try:
        raw = io.BytesIO(data) if data is not None else p
        if p.suffix == ".csv":
            frame = pd.read_csv(raw, keep_default_na=True)
        elif p.suffix == ".json":
            frame = pd.read_json(raw, orient="records")
        elif p.suffix == ".parquet":
            frame = pd.read_parquet(raw)
        else:
            raise SweepError(f"{p}: a sweep table is .csv, .json or .parquet")
    except (OSError, ValueError) as e:
        raise SweepError(f"{p}: cannot read the sweep table ({e})") from e
    need = [*DIMENSION_NAMES, "key", "status", "tile_count", *(f"bytes_{c}" for c in (*CATEGORIES, "total"))]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise SweepError(f"{p}: not a sweep table, missing column(s) {', '.join(missing)}")
    return frame


# ------------------------------------------------------------------------------------------------- analysis → row
def _figures(analysis_path: Path) -> dict[str, Any]:
    """Tiles, ops, bytes and FLOPs of a build's analysis, recomputed with this version's rules."""
    from analyzer.graph.record import load_analysis

    analysis = load_analysis(analysis_path)
    s, b = analysis.summary, analysis.bytes_per_token
    return {
        "tile_count": s.tile_count,
        "total_ops": s.total_ops,
        "non_const_ops": s.non_const_ops,
        "bytes": tuple((c, b.get(c)) for c in (*CATEGORIES, "total", "kv_write_value_semantics")),
        "flops": (),
    }


def finished_row(row: SweepRow, path: Path, profile) -> SweepRow:
    from analyzer.device.bandwidth import predicted_tok_per_s

    figures = _figures(path)
    total = dict(figures["bytes"]).get("total")
    predicted = predicted_tok_per_s(profile.bytes_per_s, total) if total else None
    return replace(row, path=str(path), device_profile=profile.key, bw_bytes_per_s=float(profile.bytes_per_s),
                   predicted_tok_per_s=predicted, stage="done", **figures)


