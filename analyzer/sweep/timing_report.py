"""Device logs + a sweep table → the device model per device, its residuals, and which graph explains the logs.

One core for the CLI (``fit --sweep TABLE``) and the Bandwidth page. A measured row (``Measurement``) is joined to
the sweep rows of its build label at its ``context_length`` (the KV positions each decode step attends over: the
static cache size for Core ML static caches), and the sweep rows that remain — e.g. the repeat_kv and the Q-fold
analysis at that ctx — are its candidate graphs. Each distinct choice is a hypothesis; a fit per hypothesis and,
with two or more, a model selection follow (``analyzer.predict.timing_model``).

Label matching, per log build label L: an explicit ``--map L=col:value,col:value`` selects table rows by column
values; otherwise L matches rows whose ``model``, ``model_label``, ``{model_label}-{compression}``,
``{model_label}-{variant}`` or ``{model_label}-{variant}-{compression}`` equals L.

Averaging: runs of one (device, build, context_length, compute units, quantization, OS) are averaged as seconds
per token (the model is linear in time; the mean of tok/s is the wrong average); rows that differ in any of these
are never pooled. (The log reader's own summary takes this over once it does the same.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from analyzer.analysis.accounting import CATEGORIES
from analyzer.fmt import table
from analyzer.measure.logs import GROUP_FIELDS, summarize
from analyzer.predict.timing_model import DeviceModelFit, GraphPoint, Observation, describe_term, fit_device_model
from analyzer.predict.timing_select import Selection, select_graphs
from analyzer.sweep.grid import SweepError
from analyzer.sweep.table import FINISHED

if TYPE_CHECKING:
    from analyzer.analysis.record import Analysis


def observations_from(measurements: Sequence[Any]) -> list[Observation]:
    """Decode runs averaged per condition as seconds per token: the log importer's own summary (one average, one
    set of conditions kept apart), with the file:lines each observation came from."""

    lines: dict[tuple, list[Any]] = {}
    for m in measurements:
        lines.setdefault(tuple(getattr(m, f) for f in GROUP_FIELDS), []).append(m)
    out = []
    for s in summarize(measurements):
        runs = lines[tuple(getattr(s, f) for f in GROUP_FIELDS)]
        where = ",".join(str(r.line) for r in runs[:8]) + ("…" if len(runs) > 8 else "")
        out.append(Observation(s.device, s.build, s.mean_s_per_token, s.n, s.context_length,
                               f"{runs[0].file_name}:{where}"))
    return out


def parse_map(specs: Sequence[str]) -> dict[str, dict[str, str]]:
    """``LABEL=col:value,col:value`` (repeatable) → label → selector."""
    out: dict[str, dict[str, str]] = {}
    for spec in specs:
        label, sep, rest = spec.partition("=")
        pairs = [p.partition(":") for p in rest.split(",") if p.strip()]
        if not sep or not label.strip() or not pairs or any(not s or not k.strip() for k, s, _ in pairs):
            raise SweepError(f"--map {spec!r}: expected LABEL=column:value[,column:value...], "
                             "e.g. exaone-top8=model_label:exaone-4.0-1.2b,compression:top8")
        out[label.strip()] = {k.strip(): v.strip() for k, _, v in pairs}
    return out


def _graph(row: Mapping[str, Any]) -> GraphPoint:
    b = tuple((c, int(row[f"bytes_{c}"])) for c in CATEGORIES if _num(row.get(f"bytes_{c}")))
    ops = row.get("non_const_ops")
    return GraphPoint(str(row.get("key") or f"{row['variant']}@ctx{row['ctx']}"), b,
                      int(ops) if _num(ops) else 0, int(row["ctx"]))


def _num(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _names(row: Mapping[str, Any]) -> set[str]:
    label = str(row.get("model_label") or row["model"])
    v, c = row["variant"], row["compression"]
    return {str(row["model"]), label, f"{label}-{c}", f"{label}-{v}", f"{label}-{v}-{c}"}


@dataclass(frozen=True, slots=True)
class DeviceReport:
    device: str
    observations: tuple[Observation, ...]
    fits: tuple[DeviceModelFit, ...]  # one per hypothesis, per-category terms
    selection: Selection | None
    notes: tuple[str, ...]  # unmatched rows, ctx mismatches, hypotheses dropped


@dataclass(frozen=True, slots=True)
class DeviceModelReport:
    devices: tuple[DeviceReport, ...]
    notes: tuple[str, ...]


def device_model_report(measurements: Sequence[Any], table, mapping: Mapping[str, Mapping[str, str]] | None = None
                        ) -> DeviceModelReport:
    """Fit the device model per device on ``measurements`` joined to the sweep ``table`` (a DataFrame)."""
    mapping = mapping or {}
    ok = table[table["status"].isin(FINISHED)] if "status" in table.columns else table  # derived rows too
    if "phase" in ok.columns:  # the model is a model of decode steps (observations are decode runs)
        ok = ok[ok["phase"] == "decode"]
    records = ok.to_dict("records")
    for label, selector in mapping.items():
        unknown = [k for k in selector if k not in table.columns]
        if unknown:
            raise SweepError(f"--map {label}: the sweep table has no column(s) {', '.join(unknown)}")
    devices: dict[str, list[tuple[Observation, list[dict]]]] = {}
    notes: list[str] = []
    for obs in observations_from(measurements):
        selector = mapping.get(obs.build)
        rows = [r for r in records if (all(str(r.get(k)) == v for k, v in selector.items()) if selector
                                       else obs.build in _names(r))]
        if not rows:
            notes.append(f"{obs.device} / {obs.build}: no sweep row for this build label (use --map)")
            continue
        ctxs = sorted({int(r["ctx"]) for r in rows})
        if obs.context_length is None:
            if len(ctxs) != 1:
                notes.append(f"{obs.device} / {obs.build}: no context_length, and the sweep has ctx {ctxs}")
                continue
            at = rows
        else:
            at = [r for r in rows if int(r["ctx"]) == obs.context_length]
            if not at:
                notes.append(f"{obs.device} / {obs.build}: context_length {obs.context_length} differs from every "
                             f"mapped build's ctx ({', '.join(map(str, ctxs))}); not fitted")
                continue
        devices.setdefault(obs.device, []).append((obs, at))
    return DeviceModelReport(tuple(_device(d, pairs) for d, pairs in devices.items()), tuple(notes))


def _hypothesis(row: Mapping[str, Any], varying: Sequence[str]) -> str:
    return ",".join(f"{k}={row[k]}" for k in varying) or "as mapped"


def _device(device: str, pairs: list[tuple[Observation, list[dict]]]) -> DeviceReport:
    notes: list[str] = []
    varying = [k for k in ("variant", "compression", "model") if any(len({str(r[k]) for r in rows}) > 1
                                                                      for _, rows in pairs)]
    per_row: list[dict[str, dict]] = [{_hypothesis(r, varying): r for r in rows} for _, rows in pairs]
    multi = [set(m) for m in per_row if len(m) > 1]
    hypotheses = sorted(set.intersection(*multi)) if multi else ["as mapped"]
    candidates: dict[str, list[GraphPoint]] = {}
    for h in hypotheses:
        graphs = []
        for m in per_row:
            graphs.append(_graph(m[h] if h in m else next(iter(m.values()))))
        candidates[h] = graphs
    observations = tuple(o for o, _ in pairs)
    fits = []
    for h, graphs in candidates.items():
        try:
            fits.append(fit_device_model(observations, graphs, device=device, hypothesis=h))
        except ValueError as e:
            notes.append(f"{h}: {e}")
    selection = None
    if len(candidates) >= 2:
        selection = select_graphs(observations, candidates, device=device)
    return DeviceReport(device, observations, tuple(fits), selection, tuple(notes))


def report_json(report: DeviceModelReport) -> dict[str, Any]:
    """JSON-safe: non-finite numbers become null."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return clean(asdict(report))


def report_text(report: DeviceModelReport) -> str:
    lines = []
    for d in report.devices:
        lines.append(f"Device model on {d.device} ({len(d.observations)} measured conditions; "
                     "t = Σ bytes_c/BW_c + n_ops·τ + t0, GB = 10^9 bytes):")
        for fit in d.fits:
            lines.append(f"  [{fit.hypothesis}] {fit.verdict}")
            lines.append(f"    rank {fit.rank}, condition number {fit.condition_number:.3g}")
            lines.extend(f"    {describe_term(t)}" for t in fit.terms)
            lines.extend(f"    {n.name}: {n.status}: {n.reason}" for n in fit.notes)
            lines.append(table([[r.build, r.context_length, round(r.measured_tok_per_s, 2),
                                 round(r.fitted_tok_per_s, 2), round(r.residual_pct, 2), round(r.loo_residual_pct, 2)]
                                for r in fit.residuals],
                               ["build", "ctx", "measured tok/s", "fitted tok/s", "residual %", "held-out %"]))
        if d.selection is not None:
            lines.append(f"  Which graph explains {d.device}: {d.selection.verdict}")
            lines.extend(f"    {c.verdict}" for c in d.selection.comparisons)
        lines.extend(f"  note: {n}" for n in d.notes)
    lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines)


def table_from_analyses(analyses: Mapping[str, Analysis]) -> Any:
    """Mapped analyses (log label → analysis) as sweep-table rows, so the Bandwidth page's mapping feeds the same
    ``device_model_report`` as ``fit --sweep``: one row per label, model = the label."""

    rows = []
    for label, a in analyses.items():
        spec = a.build.spec if a.build is not None else None
        b = a.bytes_per_token
        rows.append({"model": label, "model_label": label, "variant": (spec.variant if spec else None) or "as mapped",
                     "compression": (spec.compression if spec else None) or "none",
                     "ctx": spec.ctx if spec else 0, "key": a.build.key if a.build is not None else label,
                     "status": "built", "tile_count": a.summary.tile_count, "non_const_ops": a.summary.non_const_ops,
                     **{f"bytes_{c}": b.get(c) for c in (*CATEGORIES, "total")}})
    return pd.DataFrame.from_records(rows)
