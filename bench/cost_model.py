"""The cost model against measurement (issues 43 and 44): build each kind of request qfold runs, as one child runs it
(``run_builds``: an A/B's variants in one child), in a fresh builds folder, and record its wall time and the peak RSS
of its process tree (the conversion child and the workers it starts, as the Builds page measures it:
``analyzer.convert.jobs.TreeWatch``; with the fork server it was forked from beside) beside what
``analyzer.model.cost.estimate_builds`` says before it starts.

    PYTHONPATH=. .venv/bin/python bench/cost_model.py run KIND [KIND ...]      (analysis-mode kinds, ~1-3 GB)
    flock /tmp/qfold-fullsize.lock env PYTHONPATH=. .venv/bin/python bench/cost_model.py run coreml-mat-ab
    PYTHONPATH=. .venv/bin/python bench/cost_model.py fit [--write]   (coefficients per backend and mode → cost.py)
    PYTHONPATH=. .venv/bin/python bench/cost_model.py check     (every measured row against today's estimate)
    PYTHONPATH=. .venv/bin/python bench/cost_model.py table [--write]   (the README's table, from the results)
    PYTHONPATH=. .venv/bin/python bench/cost_model.py list

Kinds (``KINDS``): both backends, both build modes, 2 layers to 70B, decode, prefill, decode+prefill and compressed.
Full-size materialised kinds (``heavy``) must run alone, under the machine-wide lock. Results go to
bench/results/cost_model.json, one row per kind (an earlier row of the same kind moves to ``history``), each with the
machine's load average, the commit measured, the request's features (parameters, weight bytes, KV state bytes,
layers, variants) and the estimate; ``check`` exits 1 when an estimate is more than ``TOLERANCE`` off a measured
peak, and prints the time estimates beside (wall time depends on the machine's load: stated, not enforced).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from bench.fast import TreeRss, code_commit, machine

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cost_model.json"
TOLERANCE = 0.25  # issue 43: the estimate within 25% of the measured peak for every kind measured
STRUCTURE = ("hidden_size=256", "intermediate_size=512", "vocab_size=1000")  # analyzer.model.sources
TWO_LAYERS = (*STRUCTURE, "num_hidden_layers=2")


@dataclass(frozen=True)
class Kind:
    """One request as the Builds page, the CLI or a sweep makes it."""

    preset: str
    ctx: int = 4096
    variants: tuple[str, ...] = ("repeat_kv", "qfold")
    mode: str = "analysis"
    backend: str = "coreml"
    weights: str = "fp16"
    overrides: tuple[str, ...] = ()
    phase: str = "decode"
    q_len: int = 1
    compression: str | None = None  # a preset name (analyzer.convert.compress.PRESETS)
    heavy: bool = False  # a full-size materialised build: alone, under flock /tmp/qfold-fullsize.lock

    def specs(self):
        from analyzer.convert.compress import canonical_spec
        from analyzer.model.sources import geometry_of, load_config, resolve_source
        from analyzer.model.spec import BuildSpec

        source = resolve_source(self.preset, list(self.overrides))
        comp = canonical_spec(self.compression, geometry_of(load_config(source)).num_layers) \
            if self.compression else None
        return [BuildSpec(source, v, "state", self.ctx, comp, phase=self.phase, q_len=self.q_len,
                          build_mode=self.mode, backend=self.backend, weights=self.weights) for v in self.variants]


E = "exaone-4.0-1.2b"
KINDS: dict[str, Kind] = {
    # analysis mode, Core ML: the Builds page's default (structure A/B), 2 layers, full size 1.2B-70B, long ctx
    "coreml-an-structure-ab": Kind(E, overrides=STRUCTURE),
    "coreml-an-2layer-ab": Kind(E, overrides=TWO_LAYERS),
    "coreml-an-exaone-ab": Kind(E),
    "coreml-an-exaone-ab-prefill64": Kind(E, phase="prefill", q_len=64),
    "coreml-an-exaone-ab-top8": Kind(E, compression="top8"),
    "coreml-an-llama8b-ab": Kind("llama-3.1-8b"),
    "coreml-an-llama8b-ab-ctx32768": Kind("llama-3.1-8b", ctx=32768),
    "coreml-an-qwen7b-ab": Kind("qwen2.5-7b"),
    "coreml-an-mistral7b-ab": Kind("mistral-7b-v0.3"),
    "coreml-an-llama70b-ab": Kind("llama-3.1-70b"),
    # analysis mode, Core AI
    "coreai-an-2layer-ab": Kind(E, overrides=TWO_LAYERS, backend="coreai"),
    "coreai-an-structure-ab": Kind(E, overrides=STRUCTURE, backend="coreai"),
    "coreai-an-exaone-qfold": Kind(E, variants=("qfold",), backend="coreai"),
    "coreai-an-llama8b-qfold": Kind("llama-3.1-8b", variants=("qfold",), backend="coreai", heavy=True),
    "coreai-an-llama1b-qfold": Kind("llama-3.2-1b", variants=("qfold",), backend="coreai"),  # tied, like exaone
    # materialised, small
    "coreml-mat-2layer-ab": Kind(E, overrides=TWO_LAYERS, mode="materialised"),
    "coreml-mat-structure-ab": Kind(E, overrides=STRUCTURE, mode="materialised"),
    "coreai-mat-2layer-ab": Kind(E, overrides=TWO_LAYERS, mode="materialised", backend="coreai"),
    # materialised, full size (one at a time, under the lock)
    "coreml-mat-exaone-qfold": Kind(E, variants=("qfold",), mode="materialised", heavy=True),
    "coreml-mat-exaone-ab": Kind(E, mode="materialised", heavy=True),
    "coreml-mat-exaone-ab-prefill64": Kind(E, mode="materialised", phase="prefill", q_len=64, heavy=True),
    "coreml-mat-exaone-ab-decode+prefill64": Kind(E, mode="materialised", phase="decode+prefill", q_len=64,
                                                  heavy=True),
    "coreml-mat-exaone-ab-top8": Kind(E, mode="materialised", compression="top8", heavy=True),
    "coreai-mat-exaone-qfold": Kind(E, variants=("qfold",), mode="materialised", backend="coreai", heavy=True),
    "coreai-mat-exaone-qfold-fp32": Kind(E, variants=("qfold",), mode="materialised", backend="coreai",
                                         weights="fp32", heavy=True),
}


def features(specs) -> dict:
    """What the cost model reads: the request's parameters, weight, KV and layer figures (as the estimate sees them)."""
    from analyzer.model.cost import estimate_builds

    cost = estimate_builds(specs)
    return {"params": cost.params, "weight_bytes": cost.weight_bytes, "kv_state_bytes": cost.kv_state_bytes,
            "layers": cost.layers, "builds": len(specs), "estimated_peak_rss_bytes": cost.peak_rss_bytes,
            "estimated_wall_s": round(cost.wall_s, 1)}


def run_kind(name: str) -> dict:
    from analyzer.convert.jobs import TreeWatch
    from analyzer.convert.launch import run_builds

    kind = KINDS[name]
    specs = kind.specs()
    before = features(specs)
    tmp = Path(tempfile.mkdtemp(prefix="qfold-cost-"))
    try:
        with TreeRss() as rss, TreeWatch(tuple(s.key for s in specs), tmp) as watch:
            t0 = time.monotonic()
            run_builds(specs, tmp, on_progress=lambda p: print(
                f"  [{time.monotonic() - t0:7.1f} s {p.fraction * 100:3.0f}%] {p.stage}: {p.message}", flush=True))
            wall = time.monotonic() - t0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"kind": {k: v for k, v in kind.__dict__.items()}, **before, "wall_s": round(wall, 1),
            "peak_rss_tree_bytes": watch.peak_bytes, "peak_rss_with_fork_server_bytes": rss.peak_bytes,
            "cpu_s": round(watch.cpu_s, 1),
            "max_process_rss_bytes": rss.max_process_bytes,
            "when": time.strftime("%Y-%m-%d %H:%M:%S"), "code_commit": code_commit(), "machine": machine()}


def save(name: str, row: dict) -> None:
    """Merge ``row`` into the results (under a lock: two bench runs may finish at once)."""
    from filelock import FileLock

    with FileLock(os.path.join(tempfile.gettempdir(), "qfold-cost-model-results.lock")):
        data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"rows": {}, "history": {}}
        old = data["rows"].get(name)
        if old is not None:
            data["history"].setdefault(name, []).append(old)
        data["rows"][name] = row
        tmp = RESULTS.with_suffix(f".json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(RESULTS)


def check() -> int:
    """Every measured row against today's estimate of the same request; 1 when a peak is off by more than 25%."""
    from analyzer.model.cost import estimate_builds

    data = json.loads(RESULTS.read_text())
    bad = 0
    print(f"{'kind':40s} {'measured':>9s} {'estimate':>9s} {'off':>7s}   {'CPU':>7s} {'est. CPU':>9s} {'off':>7s}")
    for name, row in data["rows"].items():
        cost = estimate_builds(_kind_of(row).specs())
        off = cost.peak_rss_bytes / row["peak_rss_tree_bytes"] - 1
        bad += abs(off) > TOLERANCE
        cpu = f"{row['cpu_s']:6.0f}s {cost.cpu_s:8.0f}s {cost.cpu_s / row['cpu_s'] - 1:+7.0%}" if row.get("cpu_s") \
            else f"{'—':>7s} {cost.cpu_s:8.0f}s {'':>7s}"
        print(f"{name:40s} {row['peak_rss_tree_bytes'] / 1e9:8.2f}G {cost.peak_rss_bytes / 1e9:8.2f}G {off:+7.0%}"
              f"{' !' if abs(off) > TOLERANCE else '  '} {cpu}  (load {row['machine']['load_average_1_5_15'][0]:.1f})")
    print(f"{bad} of {len(data['rows'])} peaks more than {TOLERANCE:.0%} off")
    return 1 if bad else 0


def _rows_with_history(data: dict) -> list[tuple[str, dict]]:
    """Every measured row: each kind's latest and its earlier runs (the same request measured again)."""
    out = [(name, row) for name, row in data["rows"].items()]
    out += [(name, old) for name, olds in data.get("history", {}).items() for old in olds
            if name in data["rows"] and "peak_rss_with_fork_server_bytes" in old]  # measured as TreeWatch does
    return out


def _kind_of(row: dict) -> Kind:
    k = row["kind"]
    return Kind(**{**k, "variants": tuple(k["variants"]), "overrides": tuple(k["overrides"])})


def _features(kind: Kind) -> tuple[dict, dict]:
    from analyzer.model.cost import request_features
    from analyzer.model.sources import load_config

    specs = kind.specs()
    s = specs[0]
    return request_features(load_config(s.source), s.ctx, s.build_mode, s.backend, s.weights, builds=len(specs),
                            phase=s.phase, q_len=s.q_len, compressed=s.compression is not None)


GRAPH_TERMS = ("layers", "kv")  # what a materialised build shares with its backend's analysis mode...
MIN_KINDS_ALONE = 4  # ...when fewer kinds than this were measured materialised (too few to fit every term alone)


def _minimax(x, y, relative_to=None):
    """Coefficients ≥ 0 of ``x @ c ≈ y`` with the smallest largest error relative to ``relative_to`` (default
    ``y``): the linear programme min t subject to −t ≤ (x @ c − y) / rel ≤ t, c ≥ 0 (scipy's HiGHS)."""
    import numpy as np
    from scipy.optimize import linprog

    x, y = np.asarray(x, float), np.asarray(y, float)
    rel = np.asarray(relative_to if relative_to is not None else y, float)
    # columns scaled to 1 and rows to the largest measurement: the programme's numbers near 1 (HiGHS reads ~1e-9 as 0)
    scale = np.where(np.abs(x).max(axis=0) > 0, np.abs(x).max(axis=0), 1.0) / np.abs(rel).max()
    a, b = x / scale / rel[:, None], y / rel
    n = a.shape[1]
    ones = np.ones((len(b), 1))
    res = linprog(np.r_[np.zeros(n), 1.0], A_ub=np.r_[np.c_[a, -ones], np.c_[-a, -ones]], b_ub=np.r_[b, -b],
                  bounds=[(0, None)] * (n + 1), method="highs")
    if not res.success:
        raise SystemExit(f"the fit failed: {res.message}")
    return res.x[:n] / scale, float(res.x[n])


def fit(write: bool) -> int:
    """Coefficients per backend and build mode from every measured row (minimax relative error), the error each
    states, and (``--write``) the FIT block of analyzer/model/cost.py replaced by them."""
    from analyzer.model.cost import FEATURES, TIME_FEATURES

    data = json.loads(RESULTS.read_text())
    groups: dict[tuple[str, str], list] = {}
    for name, row in _rows_with_history(data):
        kind = _kind_of(row)
        peak_f, cpu_f = _features(kind)
        groups.setdefault((kind.backend, kind.mode), []).append((name, peak_f, cpu_f, row))
    # the same request measured again varies (which of a child's and its worker's peaks overlap): no fit states a
    # smaller error than that spread, half the range over the mean, of any kind measured more than once
    runs: dict[str, list[float]] = {}
    for name, row in _rows_with_history(data):
        runs.setdefault(name, []).append(row["peak_rss_tree_bytes"])
    noise = max([(max(v) - min(v)) / (max(v) + min(v)) for v in runs.values() if len(v) > 1] or [0.0])
    print(f"run-to-run spread of the same request: up to ±{noise:.1%}")
    lines, shared = [], {}
    # analysis mode first: a materialised build holds, per layer and per KV byte, what an analysis-mode conversion
    # holds, plus the weight values; with few materialised kinds measured it takes those two coefficients from its
    # backend's analysis fit and fits the rest (the layer and KV terms stay measured, not guessed from two rows)
    for (backend, mode), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "analysis")):
        kinds = {name for name, *_ in rows}
        fixed = {k: shared[backend][k] for k in GRAPH_TERMS} \
            if mode == "materialised" and backend in shared and len(kinds) < MIN_KINDS_ALONE else {}
        free = [k for k in FEATURES if k not in fixed]
        offset = [sum(v * f[k] for k, v in fixed.items()) for _, f, _, _ in rows]
        free_c, err = _minimax([[f[k] for k in free] for _, f, _, _ in rows],
                               [r["peak_rss_tree_bytes"] - o for (_, _, _, r), o in zip(rows, offset, strict=True)],
                               relative_to=[r["peak_rss_tree_bytes"] for _, _, _, r in rows])
        peak_c = [fixed.get(k, dict(zip(free, free_c, strict=True)).get(k, 0.0)) for k in FEATURES]
        if mode == "analysis":
            shared[backend] = dict(zip(FEATURES, peak_c, strict=True))
        timed = [(f, r["cpu_s"]) for _, _, f, r in rows if r.get("cpu_s")]
        cpu_c = _minimax([[f[k] for k in TIME_FEATURES] for f, _ in timed], [c for _, c in timed])[0] \
            if timed else [0.0] * len(TIME_FEATURES)
        print(f"{backend} {mode}: {len(rows)} rows, largest relative error {err:.1%}")
        for name, f, _, r in rows:
            est = sum(c * f[k] for c, k in zip(peak_c, FEATURES, strict=True))
            print(f"   {name:40s} {r['peak_rss_tree_bytes'] / 1e9:6.2f} GB measured, {est / 1e9:6.2f} estimated "
                  f"({est / r['peak_rss_tree_bytes'] - 1:+.0%})")
        peak = ", ".join(f'"{k}": {v:.4g}' for k, v in zip(FEATURES, peak_c, strict=True))
        cpu = ", ".join(f'"{k}": {v:.4g}' for k, v in zip(TIME_FEATURES, cpu_c, strict=True))
        const = {"coreml": "COREML", "coreai": "COREAI"}[backend] + ", " + \
            {"analysis": "ANALYSIS_MODE", "materialised": "MATERIALISED_MODE"}[mode]
        peak = textwrap.fill(peak, 100, subsequent_indent=" " * 14, break_on_hyphens=False)
        cpu = textwrap.fill(cpu, 100, subsequent_indent=" " * 13, break_on_hyphens=False)
        # the error stated: the fit's or the run-to-run spread, whichever is larger, + 0.1% for the 4 digits written
        lines.append(f"    ({const}): Coefficients(\n        peak={{{peak}}},\n        cpu={{{cpu}}},\n"
                     f"        error={math.ceil((max(err, noise) + 0.001) * 1000) / 1000:.3f}, rows={len(rows)}),")
    if write:
        path = ROOT / "analyzer" / "model" / "cost.py"
        text = path.read_text()
        start = text.index("FIT: dict[tuple[str, str], Coefficients] = {")
        end = text.index("}\n# <!-- end of bench/cost_model.py fit -->")
        path.write_text(text[:start] + "FIT: dict[tuple[str, str], Coefficients] = {\n" + "\n".join(lines) + "\n"
                        + text[end:])
        print(f"wrote {path}")
    return 0


README = ROOT / "README.md"
TABLE_START = "<!-- bench/cost_model.py table: generated from bench/results/cost_model.json -->"
TABLE_END = "<!-- end of bench/cost_model.py table -->"


def table(write: bool) -> int:
    """The README's table of every measured kind: measured peak and CPU beside today's estimate."""
    from analyzer.model.cost import estimate_builds

    data = json.loads(RESULTS.read_text())
    lines = ["| request (one child) | params | measured peak | estimated | off | CPU measured | estimated | load |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, row in sorted(data["rows"].items(), key=lambda kv: (kv[1]["kind"]["backend"], kv[1]["kind"]["mode"],
                                                                   kv[1]["params"])):
        cost = estimate_builds(_kind_of(row).specs())
        cpu = f"{row['cpu_s']:.0f} s" if row.get("cpu_s") else "—"
        off = cost.peak_rss_bytes / row["peak_rss_tree_bytes"] - 1
        params = f"{row['params'] / 1e9:,.2f} B" if row["params"] >= 1e8 else f"{row['params'] / 1e6:,.1f} M"
        lines.append(f"| `{name}` | {params} | {row['peak_rss_tree_bytes'] / 1e9:.2f} GB | "
                     f"{cost.peak_rss_bytes / 1e9:.2f} GB | {off:+.0%} | {cpu} | {cost.cpu_s:.0f} s | "
                     f"{row['machine']['load_average_1_5_15'][0]:.0f} |")
    text = "\n".join(lines)
    print(text)
    if write:
        readme = README.read_text()
        start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
        README.write_text(readme[:start] + "\n" + text + "\n" + readme[end:])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("run")
    pr.add_argument("kinds", nargs="+", choices=sorted(KINDS))
    sub.add_parser("check")
    sub.add_parser("list")
    pt = sub.add_parser("table")
    pt.add_argument("--write", action="store_true", help="replace the table in README.md")
    pf = sub.add_parser("fit")
    pf.add_argument("--write", action="store_true", help="replace the FIT block of analyzer/model/cost.py")
    a = p.parse_args(argv)
    if a.cmd == "list":
        for name, kind in KINDS.items():
            print(f"{name:40s} {'heavy' if kind.heavy else ''}")
        return 0
    if a.cmd == "check":
        return check()
    if a.cmd == "fit":
        return fit(a.write)
    if a.cmd == "table":
        return table(a.write)
    for name in a.kinds:
        print(f"{name}: {KINDS[name]}", flush=True)
        row = run_kind(name)
        save(name, row)
        print(f"{name}: {row['wall_s']:.0f} s, {row['peak_rss_tree_bytes'] / 1e9:.2f} GB tree peak "
              f"(estimated {row['estimated_wall_s']:.0f} s, {row['estimated_peak_rss_bytes'] / 1e9:.2f} GB)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
