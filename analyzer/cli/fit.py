"""``qfold fit``: device logs + graph bytes → cross-check and bandwidth fits, headless.

A thin shell over ``analyzer.measure.logs`` and ``analyzer.predict.bandwidth_model`` so scripts and CI get the same
numbers as the dashboard. Exit codes: 0 done (row-level issues, if any, are listed), 1 a log was
rejected whole or no row was accepted, 2 a bad argument. Errors go to stderr as one line each,
never as a traceback.

    qfold fit LOG [LOG ...] [--build LABEL=BUILD_PATH|BYTES ...] [--bw BYTES_PER_S]
                           [--device NAME] [--label BUILD] [--overhead] [--keep-impossible] [--json]

LOG is any format ``analyzer.measure.logs`` reads, recognised by content (llama-bench markdown/CSV/JSON/SQL,
llama.cpp / mlx_lm / ExecuTorch / ANEMLL runner output, the Core AI benchmarks' JSON, qfold's CSV). Only decode
runs are fitted. Every row is held against its roof (:mod:`analyzer.predict.roof_check`: the cited bandwidth of its
device over the bytes its build must read per token); rows above their roof are left out of the fit unless
``--keep-impossible``, and the output says how many.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import stat
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from analyzer import fmt
from analyzer.analysis.record import load_analysis
from analyzer.errors import QfoldError
from analyzer.fmt import MB, table
from analyzer.fsio import file_kind
from analyzer.measure.logs import (
    FileReport,
    LogImport,
    LogIssue,
    LogLimits,
    check_size,
    normalize_label,
    parse_decimal,
    parse_logs,
)
from analyzer.measure.logs.text import file_label
from analyzer.predict.bandwidth_model import BW_RANGE_BYTES_PER_S
from analyzer.predict.fit import BandwidthReport, bandwidth_report
from analyzer.predict.profiles import load_profiles
from analyzer.predict.roof_check import BuildBytes, RoofRow, check_rows, without_impossible
from analyzer.report.assumptions import assumption_notes
from analyzer.sweep.table import read_table
from analyzer.sweep.timing_report import device_model_report, parse_map, report_json, report_text

PROG = "qfold fit"


class _ArgumentError(ValueError):
    """A bad command-line value; reported on stderr with exit code 2."""

def _bw_arg(text: str) -> float:
    try:
        value = parse_decimal(text, "--bw")
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}; give bytes/s, e.g. 55900000000") from e
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: bandwidth must be a finite number of bytes/s > 0")
    lo, hi = BW_RANGE_BYTES_PER_S
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: bandwidth must be between {lo:g} and {hi:g} bytes/s")
    return value


def _label_arg(text: str) -> str:
    label = normalize_label(text)
    if not label or any(ord(c) < 32 or c == "\x7f" for c in label):
        raise argparse.ArgumentTypeError(f"{text!r}: a label must be non-empty, without control characters")
    return label


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Register ``fit`` on the main CLI's subparsers; sets ``func=run_fit`` as the handler."""
    parser = subparsers.add_parser(
        "fit",
        help="cross-check device logs against graph bytes/token and fit a bandwidth per device",
        description=(
            "Import device logs (any format, recognised by content: llama-bench markdown/CSV/JSON/JSONL/SQL, "
            "llama.cpp, mlx_lm, ExecuTorch and ANEMLL runner output, qfold's CSV), compare measured decode tok/s "
            "with the "
            "bandwidth model tok/s = BW / bytes_per_token, and fit BW (and an optional per-token "
            "overhead) per device. MB = 10^6 bytes."
        ),
    )
    parser.add_argument("logs", nargs="+", metavar="LOG", help="device log files")
    parser.add_argument(
        "--build", action="append", default=[], dest="builds", metavar="LABEL=BUILD_PATH",
        help=("map a build label in the logs to a build folder or analysis.json (its total "
              "bytes/token), or to an integer number of bytes/token: LABEL=2013265920; repeatable"),
    )
    parser.add_argument("--bw", type=_bw_arg, metavar="BYTES_PER_S",
                        help="fixed bandwidth in bytes/s for all devices (default: fitted per device "
                             "where possible, else the write-up's 55,900 MB/s)")
    parser.add_argument("--device", type=_label_arg, metavar="NAME",
                        help="device name for rows whose format names none (llama-bench markdown, runner logs); "
                             "without it the file name stands in, with a warning")
    parser.add_argument("--label", type=_label_arg, metavar="BUILD",
                        help="build label for rows whose format names none (runner logs); map it to an analysis "
                             "with --build BUILD=PATH; without it the file name stands in")
    parser.add_argument("--overhead", action="store_true",
                        help="fit a fixed per-token time t0 as well: t = bytes/BW + t0")
    parser.add_argument("--keep-impossible", action="store_true",
                        help="fit rows faster than their roof too (cited device bandwidth ÷ the bytes the build must "
                             "read per token); by default they are left out, and counted")
    parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON object")
    parser.add_argument("--sweep", metavar="TABLE",
                        help="a `sweep` table: fit the device model t = Σ bytes_c/BW_c + n_ops·τ + t0 per device on "
                             "the logs joined to it by build label and context_length, and say which graph fits")
    parser.add_argument("--map", action="append", default=[], metavar="LABEL=COL:VALUE,...",
                        help="join a log build label to sweep rows by column values, e.g. "
                             "exaone-top8=model_label:exaone-4.0-1.2b,compression:top8 (repeatable)")
    parser.set_defaults(func=run_fit)
    return parser


# ---------------------------------------------------------------------------------------------
# Arguments → inputs


@dataclass(frozen=True, slots=True)
class GraphSource:
    """Where a ``--build`` label's graph bytes come from, and what they assume."""

    label: str
    bytes_per_token: int
    path: str | None  # None: given as a number
    assumptions: tuple[str, ...] = ()  # report.assumptions.assumption_notes of the analysis
    roof: BuildBytes | None = None  # what one token must read (the roof check's bytes)

    def roof_bytes(self) -> BuildBytes:
        return self.roof or BuildBytes(self.label, None, None, None, self.bytes_per_token, "given as a number")


def _graph_bytes(specs: Sequence[str]) -> dict[str, GraphSource]:
    """``LABEL=INT`` or ``LABEL=PATH`` → label → graph bytes/token and where they come from."""
    graph: dict[str, GraphSource] = {}
    for spec in specs:
        label, sep, value = spec.partition("=")
        label, value = normalize_label(label), value.strip()  # as the logs' labels are normalised
        if not sep or not label or not value:
            raise _ArgumentError(f"--build {spec!r}: expected LABEL=BUILD_PATH or LABEL=BYTES_PER_TOKEN")
        if label in graph:
            raise _ArgumentError(f"--build {spec!r}: label {label!r} is given twice")
        if re.fullmatch(r"[0-9]+", value):
            if int(value) <= 0:
                raise _ArgumentError(f"--build {spec!r}: bytes/token must be > 0")
            graph[label] = GraphSource(label, int(value), None)
            continue
        if re.fullmatch(r"[-+]?[0-9][0-9_.,eE+-]*", value) and not Path(value).exists():
            raise _ArgumentError(f"--build {spec!r}: bytes/token must be a whole number of bytes "
                                 "(digits only, no separators or exponent)")
        graph[label] = _load_build_bytes(spec, label, value)
    return graph


def _load_build_bytes(spec: str, label: str, path: str) -> GraphSource:
    try:
        analysis = load_analysis(path)
    except (OSError, QfoldError) as e:
        raise _ArgumentError(f"--build {spec!r}: {e}") from e
    if analysis.call.phase != "decode":
        raise _ArgumentError(f"--build {spec!r}: a {analysis.call.phase} analysis ({analysis.call.tokens_per_call} "
                             "tokens per call); the bandwidth fit models decode steps: give a decode build, or the "
                             "decode function of a decode+prefill build")
    if not analysis.sizing.sized:
        raise _ArgumentError(f"--build {spec!r}: {path} could not be sized, so its bytes per token leave something "
                             f"out ({analysis.sizing.unsized_reason}); the fit needs complete bytes per token")
    total = analysis.bytes_per_token.total
    if total <= 0:
        raise _ArgumentError(f"--build {spec!r}: the build reports {total!r} bytes/token, not an int > 0")
    return GraphSource(label, total, path, assumption_notes(analysis), BuildBytes.of_analysis(label, analysis))


def _read_logs(paths: Sequence[str], limits: LogLimits) -> tuple[list[tuple[str, bytes]], LogImport]:
    """The logs' bytes, and the files rejected whole before reading (over the size limit, or not a regular
    file): reported like any other rejected file (one ``error: FILE: …`` line each, exit 1), never read into memory."""
    files, issues, reports = [], [], []
    for name in paths:
        path = Path(name)
        try:
            st = path.stat()
            size = st.st_size
            refused = None if stat.S_ISREG(st.st_mode) else f"{file_kind(st.st_mode)}, not a regular file"
            refused = refused or check_size(size, limits)  # a folder, FIFO, socket or device is never opened
            if refused:
                issues.append(LogIssue(file_label(name), None, None, None, "error", refused))
                reports.append(FileReport(file_label(name), None, False, 0, 0, 0, 0))
                continue
            files.append((name, path.read_bytes()))
        except OSError as e:
            raise _ArgumentError(f"{name}: cannot read ({e.strerror or e})") from e
    return files, LogImport((), tuple(issues), tuple(reports))


# ---------------------------------------------------------------------------------------------
# Output


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: non-finite floats become null (a fit can be non-physical)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _row_json(r: RoofRow) -> dict[str, Any]:
    return {"file": r.file, "line": r.line, "device": r.device, "build": r.build, "phase": r.phase,
            "context_length": r.context_length, "tok_per_s": r.tok_per_s, "roof_tok_per_s": r.roof_tok_per_s,
            "roof_bytes_per_token": r.roof_bytes_per_token, "roof_bw_bytes_per_s": r.roof_bw_bytes_per_s,
            "roof_profile": r.roof_profile, "flags": list(r.flags), "roof_why": r.why}


def _json_payload(imported: LogImport, result: BandwidthReport, graph: dict[str, GraphSource],
                  roofs: tuple[RoofRow, ...], left_out: int) -> dict[str, Any]:
    summaries, bandwidth, fits, report = result.summaries, result.bandwidth, result.fits, result.crosscheck
    builds = []
    for row, s in zip(report.builds, summaries, strict=True):  # crosscheck keeps the summaries' order
        builds.append({
            "label": row.build,
            "device": row.device,
            "n": row.n,
            "measured_mean_tok_per_s": row.measured_tok_per_s,
            "std_tok_per_s": s.std_tok_per_s,
            "min_tok_per_s": s.min_tok_per_s,
            "max_tok_per_s": s.max_tok_per_s,
            "predicted_tok_per_s": row.predicted_tok_per_s,
            "residual_pct": row.residual_pct,
            "inferred_bytes_per_token": row.inferred_bytes_per_token,
            "graph_bytes_per_token": row.graph_bytes_per_token,
            "gap_bytes": row.gap_bytes,
            "gap_pct": row.gap_pct,
            "bw_bytes_per_s": row.bw_bytes_per_s,
            "overhead_s": row.overhead_s,
            "bw_source": row.bw_source,
        })
    return _finite({
        "units": {"bytes": "bytes", "bandwidth": "bytes/s", "time": "s", "MB": "10^6 bytes"},
        "files": [asdict(f) for f in imported.files],
        "bandwidth": [{"device": d, **asdict(a)} for d, a in bandwidth.items()],
        "builds": builds,
        "fits": [asdict(f) for f in fits],
        "ab": [asdict(p) for p in report.pairs],
        "unmapped_builds": list(report.unmapped_builds),
        "unused_build_labels": list(report.unused_graph_labels),
        "issues": [asdict(i) for i in imported.issues],
        "graph_sources": [{k: v for k, v in asdict(g).items() if k != "roof"} for g in graph.values()],
        "rows": [_row_json(r) for r in roofs],
        "left_out_above_roof": left_out,
    })


def _mb(n_bytes: float | None) -> int | None:
    """Whole MB (10^6 bytes) for a table cell; None prints empty."""
    return None if n_bytes is None else round(n_bytes / MB)


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def _print_text(imported: LogImport, result: BandwidthReport, graph: dict[str, GraphSource], *, fixed_bw: bool,
                out: TextIO) -> None:
    bandwidth, fits, report = result.bandwidth, result.fits, result.crosscheck
    files = imported.files
    print(f"{sum(f.n_accepted for f in files)} runs accepted from {len(files)} file(s); "
          f"{sum(f.n_rejected for f in files)} rejected, {sum(f.n_skipped for f in files)} skipped. "
          "MB = 10^6 bytes.", file=out)
    print("\nBandwidth used for predictions:", file=out)
    for device, a in bandwidth.items():
        extra = f" + {a.overhead_s * 1e3:.3f} ms/token" if a.overhead_s else ""
        print(f"  {device}: {fmt.bandwidth(a.bytes_per_s)}{extra} ({a.source})", file=out)
    print("\nBuilds:", file=out)
    print(table(
        [[r.build, r.device, r.n, _r(r.measured_tok_per_s), _r(r.predicted_tok_per_s),
          _mb(r.inferred_bytes_per_token), _mb(r.graph_bytes_per_token), _mb(r.gap_bytes), _r(r.gap_pct, 1)]
         for r in report.builds],
        ["build", "device", "n", "measured tok/s", "predicted tok/s", "inferred MB/token",
         "graph MB/token", "gap MB", "gap %"],
    ), file=out)
    for g in graph.values():
        source = "given as a number" if g.path is None else "; ".join(g.assumptions) or "fp16 weights"
        print(f"graph bytes of {g.label}: {g.bytes_per_token:,} ({source})", file=out)
    if report.unmapped_builds:
        print(f"no graph bytes (pass --build LABEL=...): {', '.join(report.unmapped_builds)}", file=out)
    if report.unused_graph_labels:
        print(f"--build labels with no measurements: {', '.join(report.unused_graph_labels)}", file=out)
    print("\nFits per device:", file=out)
    if not fits:
        print("  none: no build in the logs has graph bytes (pass --build LABEL=...)", file=out)
    elif fixed_bw:
        print("  (--bw is given: predictions use it; the fits are shown for reference)", file=out)
    for fit in fits:
        r2 = "-" if fit.r_squared is None else f"{fit.r_squared:.4f}"
        print(f"  {fit.device} [{fit.model}]: BW {fmt.bandwidth(fit.bw_bytes_per_s)}, "
              f"t0 {fit.overhead_s * 1e3:.3f} ms, {fit.n_points} builds, R² {r2}, "
              f"max |residual| {fit.max_abs_residual_pct:.1f}%", file=out)
        print(f"  {fit.verdict}", file=out)
        print(table(
            [[r.build, r.bytes_per_token, _r(r.measured_tok_per_s), _r(r.fitted_tok_per_s),
              _r(r.residual_tok_per_s), _r(r.residual_pct, 1)] for r in fit.residuals],
            ["build", "bytes/token", "measured tok/s", "fitted tok/s", "residual tok/s", "residual %"],
        ), file=out)
    if report.pairs:
        print("\nA/B pairs (a = the build with more graph bytes):", file=out)
        print(table(
            [[p.device, f"{p.build_a} -> {p.build_b}", _r(p.speedup), _mb(p.inferred_diff_bytes),
              _mb(p.graph_diff_bytes), _r(p.gap_pct, 1)] for p in report.pairs],
            ["device", "a -> b", "speedup", "inferred diff MB", "graph diff MB", "gap %"],
        ), file=out)


def _print_roofs(roofs: tuple[RoofRow, ...], left_out: int, *, keep: bool, out: TextIO) -> None:
    checked = [r for r in roofs if r.roof_tok_per_s is not None]
    flagged = [r for r in checked if r.flags]
    print(f"\nRoof check: {len(checked)} of {len(roofs)} row(s) have a roof (a decode run of a known build on a "
          f"device with a cited bandwidth); {len(flagged)} flagged.", file=out)
    for r in flagged:
        print(f"  {r.file}:{r.line} {r.build} on {r.device}: {r.describe_flags()}", file=out)
    if left_out:
        print(f"  {left_out} row(s) above their roof left out of the fit (--keep-impossible keeps them)", file=out)
    elif keep and any(r.above_roof for r in roofs):
        print("  rows above their roof are fitted (--keep-impossible)", file=out)


def _error(message: str, err: TextIO) -> None:
    print(f"{PROG}: error: {message}", file=err)


def run_fit(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the ``fit`` sub-command; returns the exit code (0 ok, 1 rejected log, 2 bad argument)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    limits = LogLimits()
    try:
        graph = _graph_bytes(args.builds)
        files, unread = _read_logs(args.logs, limits)
    except _ArgumentError as e:
        _error(str(e), err)
        return 2
    imported = parse_logs(files, limits, device=args.device, build=args.label)
    if unread.files:
        imported = LogImport(imported.measurements, (*unread.issues, *imported.issues),
                             (*unread.files, *imported.files))
    if imported.rejected_files or not imported.measurements:
        for issue in imported.issues:
            print(issue.describe(), file=err)
        reason = (f"rejected: {', '.join(imported.rejected_files)}" if imported.rejected_files
                  else "no row was accepted")
        _error(f"log import failed ({reason})", err)
        return 1
    if not any(m.phase == "decode" for m in imported.measurements):  # the model is a model of decode steps
        phases = ", ".join(sorted({m.phase for m in imported.measurements}))
        print(f"{PROG}: note: no decode run to fit (the accepted runs are {phases}); prefill and mixed runs "
              "are listed but never fitted", file=err)
    roofs = check_rows(imported.measurements, {g.label: g.roof_bytes() for g in graph.values()}, load_profiles())
    fitted, left_out = ((imported.measurements, 0) if args.keep_impossible
                        else without_impossible(imported.measurements, roofs))
    if not fitted:
        for issue in imported.issues:
            print(issue.describe(), file=err)
        _error(f"every accepted row ({left_out}) is above its roof: nothing to fit (--keep-impossible fits them)",
               err)
        return 1
    try:
        result = bandwidth_report(fitted, {g.label: g.bytes_per_token for g in graph.values()},
                                  fixed_bw_bytes_per_s=args.bw, overhead=args.overhead)
    except (TypeError, ValueError) as e:
        _error(str(e), err)
        return 1
    model_report = None
    if getattr(args, "sweep", None):
        try:
            model_report = device_model_report(imported.measurements, read_table(args.sweep), parse_map(args.map))
        except QfoldError as e:
            _error(str(e), err)
            return 2
    if args.as_json:
        payload = _json_payload(imported, result, graph, roofs, left_out)
        if model_report is not None:
            payload["device_model"] = report_json(model_report)
        print(json.dumps(payload, indent=2, ensure_ascii=False, allow_nan=False), file=out)
    else:
        for issue in imported.issues:
            print(issue.describe(), file=err)
        _print_text(imported, result, graph, fixed_bw=args.bw is not None, out=out)
        _print_roofs(roofs, left_out, keep=args.keep_impossible, out=out)
        if model_report is not None:
            print("\n" + report_text(model_report), file=out)
    return 0
