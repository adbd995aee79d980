"""``sweep``: build models × compression × variant × ctx on Ray and write one table row per point.

    qfold sweep --model M [--model M2 ...] --ctx 512,1024 --variant repeat_kv,qfold
        [--compression SPEC ...] [--structure] [--set K=V ...] [--address ADDR] --out TABLE.csv
    qfold sweep --spec sweep.toml [--out TABLE.csv]

Points of one graph at four or more context lengths cost three conversions; the others are derived from them
(``analyzer.sweep.derive``) and marked ``derived`` in the table, with the ctx they came from.
Progress goes to stderr; the last stdout line is the table's path. Exit 0 when every point is built or reused,
1 (after writing the table) when any point failed, 2 for a bad argument.
"""

from __future__ import annotations

import sys

from analyzer.cli.common import positive_int
from analyzer.fmt import table
from analyzer.model.spec import BUILD_MODES
from analyzer.predict.profiles import DEFAULT_PROFILE, get_profile, load_profiles
from analyzer.sweep.driver import RayOptions, progress_printer, run_sweep
from analyzer.sweep.grid import (
    DEFAULT_MAX_POINTS,
    DIMENSIONS,
    TABLE_SUFFIXES,
    SweepError,
    make_spec,
    read_spec_file,
)
from analyzer.sweep.table import check_table_path, write_table


def add_parser(sub) -> None:
    helps = {d.name: d.help for d in DIMENSIONS}
    p = sub.add_parser("sweep", help="build a grid of models × compression × variant × ctx on Ray, one row each",
                       description="Build every point of a sweep (a local Ray cluster started in-process, or "
                                   "--address) into the same builds/ as `build`, reusing what exists, and write "
                                   f"a table ({', '.join(TABLE_SUFFIXES)} by suffix). One graph at four or more "
                                   "context lengths costs three conversions: the other points are derived from "
                                   "them (affine in ctx, checked op for op on the third) and marked derived.")
    p.add_argument("--spec", metavar="FILE", help="a .toml or .json sweep spec (flags given as well override it)")
    p.add_argument("--model", action="append", metavar="M", help=helps["model"] + "; repeatable")
    p.add_argument("--ctx", action="append", metavar="N,N", help=helps["ctx"] + " (default 4096)")
    p.add_argument("--variant", action="append", metavar="V,V", help=helps["variant"] + " (default both)")
    p.add_argument("--compression", action="append", metavar="SPEC",
                   help=helps["compression"] + "; repeatable (see `compression --help`)")
    p.add_argument("--phase", action="append", metavar="P,P", help=helps["phase"] + " (default decode)")
    p.add_argument("--q-len", type=positive_int, metavar="N",
                   help="prompt tokens per call of the prefill points (default 64)")
    p.add_argument("--structure", action="store_true", default=None,
                   help="shrink hidden/intermediate/vocab but keep layers and attention geometry")
    p.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE",
                   help="override a config field of every model (repeatable)")
    p.add_argument("--kv", choices=("state", "input"), help="KV cache as Core ML state (default) or inputs")
    p.add_argument("--mode", choices=tuple(BUILD_MODES),
                   help="build mode of every point (default analysis: value-free weights, no package; a sweep keeps "
                        "no package either way)")
    p.add_argument("--seed", type=int, help="seed of the random weights (default 0)")
    p.add_argument("--steps", type=positive_int, help="decode steps of the equivalence check (default 8)")
    p.add_argument("--device", metavar="PROFILE",
                   help=f"device profile for predicted tok/s (default {DEFAULT_PROFILE}; see --list-devices)")
    p.add_argument("--profiles", metavar="CSV",
                   help="device profiles file (default analyzer/predict/device_profiles.csv)")
    p.add_argument("--list-devices", action="store_true", help="print the device profiles and exit")
    p.add_argument("--address", help="an existing Ray cluster (e.g. ray://head:10001 or auto); default: local")
    p.add_argument("--num-cpus", type=positive_int, help="CPUs of the local cluster (default: all)")
    p.add_argument("--builds-dir", help="where builds live (default: $QFOLD_BUILDS or ./builds)")
    p.add_argument("--max-points", type=positive_int, default=DEFAULT_MAX_POINTS, metavar="N",
                   help=f"refuse a grid of more than N points (default {DEFAULT_MAX_POINTS:,})")
    p.add_argument("--out", metavar="TABLE", help="the table: .csv, .json or .parquet")
    p.set_defaults(func=cmd_sweep)


def _list_devices(profiles) -> int:
    print(table([[p.key, p.device, p.unit, p.kind, round(p.bytes_per_s / 1e9, 2)] for p in profiles.values()],
                ["key", "device", "unit", "kind", "GB/s"]))
    return 0


def cmd_sweep(args) -> int:
    profiles = load_profiles(args.profiles)
    if args.list_devices:
        return _list_devices(profiles)
    values: dict = {}
    out = args.out
    if args.spec:
        spec, spec_out = read_spec_file(args.spec)
        values = spec.to_json()
        out = out or spec_out
    flags = {"model": args.model, "ctx": args.ctx, "variant": args.variant, "compression": args.compression,
             "structure": args.structure, "set": args.overrides, "kv": args.kv, "seed": args.seed,
             "steps": args.steps, "device": args.device, "phase": args.phase, "q_len": args.q_len,
             "mode": args.mode}
    values.update({k: v for k, v in flags.items() if v is not None})
    if not out:
        raise SweepError("--out TABLE is required (or `out` in the spec file)")
    table_path = check_table_path(out)
    spec = make_spec(values)
    points = spec.points(args.max_points)  # a grid over the cap is refused before Ray starts
    profile = get_profile(spec.device or DEFAULT_PROFILE, profiles)
    result = run_sweep(spec, args.builds_dir, points=points, profile=profile, on_event=progress_printer(),
                       ray_options=RayOptions(address=args.address, num_cpus=args.num_cpus))
    path = write_table(result.rows, table_path)
    new = "0 new builds (everything was already built)" if result.n_built == 0 else f"{result.n_built} new builds"
    derived = (f", {result.n_derived} derived from converted points (affine in ctx; status derived, "
               "derived_from_ctx)") if result.n_derived else ""
    print(f"sweep: {len(result.rows)} points, {new}, {result.n_reused} reused{derived}, {result.n_failed} failed, "
          f"in {result.seconds:.1f} s; builds in {result.root}", file=sys.stderr)
    for row in result.rows:
        if row.status == "failed":
            print(f"failed: {row.point.describe()}: {row.error}", file=sys.stderr)
    print(path)
    return 0 if result.ok else 1
