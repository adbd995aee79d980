"""A sweep's table: one ``SweepRow`` per point (spec, build key, status, tiles, ``bytes_<category>``, FLOPs where
the analysis has them, predicted tok/s for a device profile), written and read as CSV, JSON or Parquet.

A row's ``status`` says where its figures come from: ``built`` (converted by this run), ``reused`` (a conversion
already in builds/), ``derived`` (from converted points of the same graph by the affine law in ctx,
``analyzer.sweep.derive``; ``derived_from_ctx`` names them: the two it was derived from, then the one that
checked the law), or ``failed``."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import pandas as pd
import pyarrow  # noqa: F401  (pandas' Parquet engine for --out .parquet; pinned in requirements.txt)

from analyzer.analysis.accounting import CATEGORIES
from analyzer.analysis.flop_account import FLOP_CATEGORIES
from analyzer.analysis.record import Analysis, load_analysis
from analyzer.fmt import to_csv
from analyzer.fsio import read_bytes_bounded
from analyzer.predict.bandwidth_model import predicted_tok_per_s
from analyzer.predict.roofline import Roof, predict
from analyzer.sweep.grid import DIMENSION_NAMES, TABLE_SUFFIXES, SweepError, SweepPoint

Status = Literal["pending", "running", "built", "reused", "derived", "failed"]
STATUSES: tuple[str, ...] = ("pending", "running", "built", "reused", "derived", "failed")
FINISHED: tuple[str, ...] = ("built", "reused", "derived")  # a row with figures


def check_table_path(path: str | Path) -> Path:
    """Fail before any work if the table cannot be written in the asked format."""
    p = Path(path)
    if p.suffix not in TABLE_SUFFIXES:
        raise SweepError(f"--out {p}: the table is written as {', '.join(TABLE_SUFFIXES)} (by suffix)")
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
    flops: tuple[tuple[str, float], ...] = ()  # per token (per prompt token for a prefill point), by category
    tokens_per_call: int | None = None  # 1 for decode, q_len for prefill: bytes_* are per call
    device_profile: str = ""
    bw_bytes_per_s: float | None = None
    predicted_tok_per_s: float | None = None  # memory roof only: tokens per call × BW ÷ bytes per call
    roofline_tok_per_s: float | None = None  # max(bytes/BW, FLOPs/peak) when the profile has a peak FLOP/s
    bound: str = ""  # "memory" | "compute" (roofline), "" without a peak FLOP/s
    stage: str = ""
    # a derived row: the ctx of the converted points of the same graph it was derived from (the law's two points,
    # then the point that checked it); () for a converted row
    derived_from_ctx: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status in FINISHED

    @property
    def derived_from_text(self) -> str:
        """``"512,1024,32768"``: the table cell of ``derived_from_ctx`` ("" for a converted row)."""
        return ",".join(map(str, self.derived_from_ctx))

    def bytes_of(self, category: str) -> int | None:
        return dict(self.bytes).get(category)

    def record(self) -> dict[str, Any]:
        """The table row: dimensions first, then the build, then the figures."""
        out: dict[str, Any] = {n: getattr(self.point, n) for n in DIMENSION_NAMES}
        out.update(key=self.key, status=self.status, derived_from_ctx=self.derived_from_text,
                   tile_count=self.tile_count, total_ops=self.total_ops, non_const_ops=self.non_const_ops)
        for c in (*CATEGORIES, "total", "kv_write_value_semantics"):
            out[f"bytes_{c}"] = self.bytes_of(c)
        for c, v in self.flops:
            out[f"flops_{c}"] = v
        out.update(tokens_per_call=self.tokens_per_call, predicted_tok_per_s=self.predicted_tok_per_s,
                   roofline_tok_per_s=self.roofline_tok_per_s, bound=self.bound, device_profile=self.device_profile,
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


MAX_TABLE_BYTES = 64 << 20  # a 10,000-point sweep's CSV is ~5 MB


def read_table(path: str | Path, data: bytes | None = None):
    """A sweep table (CSV, JSON or Parquet) → DataFrame; checks the contract columns are there."""

    p = Path(path)
    if data is None:  # a regular file of bounded size (a FIFO would hang the reader)
        data = read_bytes_bounded(p, MAX_TABLE_BYTES, SweepError)
    try:
        raw = io.BytesIO(data)
        if p.suffix == ".csv":
            frame = pd.read_csv(raw, keep_default_na=True)
        elif p.suffix == ".json":
            frame = pd.read_json(raw, orient="records")
        elif p.suffix == ".parquet":
            frame = pd.read_parquet(raw)
        else:
            raise SweepError(f"{p}: a sweep table is .csv, .json or .parquet")
    except (OSError, ValueError, RecursionError) as e:
        raise SweepError(f"{p}: cannot read the sweep table ({str(e).splitlines()[0] if str(e) else e!r})") from e
    if "phase" not in frame.columns and "ctx" in frame.columns:  # a table from before the phase: all decode
        frame.insert(list(frame.columns).index("ctx") + 1, "phase", "decode")
    need = [*DIMENSION_NAMES, "key", "status", "tile_count", *(f"bytes_{c}" for c in (*CATEGORIES, "total"))]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise SweepError(f"{p}: not a sweep table, missing column(s) {', '.join(missing)}")
    return frame


# ------------------------------------------------------------------------------------------------- analysis → row
def finished_row(row: SweepRow, path: Path, profile, analysis: Analysis | None = None) -> SweepRow:
    """A built point's row: tiles, ops, bytes per call by category, FLOPs per token by category (this version's
    rules), and the predicted tok/s on ``profile``: the memory roof always, the roofline where the profile has a
    peak FLOP/s (prefill is compute-bound where decode is not). ``analysis``: the one stored at ``path``, when the
    caller holds it already."""

    analysis = load_analysis(path) if analysis is None else analysis
    s, b, per_token = analysis.summary, analysis.bytes_per_token, analysis.flops.per_token()
    tokens = analysis.call.tokens_per_call
    total = b.total
    roofline = predict(analysis, Roof.of(profile)) if profile.flops_per_s is not None else None
    return replace(
        row, path=str(path), device_profile=profile.key, bw_bytes_per_s=float(profile.bytes_per_s), stage="done",
        tile_count=s.tile_count, total_ops=s.total_ops, non_const_ops=s.non_const_ops, tokens_per_call=tokens,
        bytes=tuple((c, b.get(c)) for c in (*CATEGORIES, "total", "kv_write_value_semantics")),
        flops=tuple((c, per_token.get(c)) for c in (*FLOP_CATEGORIES, "total")),
        predicted_tok_per_s=tokens * predicted_tok_per_s(profile.bytes_per_s, total) if total else None,
        roofline_tok_per_s=roofline.tok_per_s if roofline else None, bound=roofline.bound if roofline else "")


