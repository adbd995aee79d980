"""``bench``: measure Core AI builds on Apple's Core AI runtime, here and now, and log them like a device.

Every target (a Core AI build folder or a ``.aimodel``) is loaded into one runtime child
(:class:`~analyzer.engines.coreai.runtime.CoreAIRuntime`); after ``warmup`` unmeasured rounds, ``rounds`` rounds
interleave the targets (each runs ``steps`` decode steps from zeroed states), so a drifting shared machine hits
every target alike and their ratio is measured in one run. Decode tok/s is ``steps / round time``: the median over
rounds, with the slowest and fastest round as its spread.

Then each target runs its steps once more with the runtime's profiler on. Each profiled op carries the program's
``coreai`` op id (``model._debug_infos``), which is joined to qfold's op records of the same asset (the walker's,
:mod:`analyzer.ir.coreai.walk`; the order is checked op type by op type, else no join is claimed): per-op time,
the top ops, and time by byte category: each op's time split over the categories of its bytes in the byte
account, in proportion (:func:`analyzer.analysis.accounting.split_by_bytes`, as the placement join splits a plan's
cost); an op that moves no bytes of its own is ``compute``; an op inside a composite body, run once per call, shares
its time evenly between the calls; runtime events with no op, such as whole-state copies, are ``runtime``. Each
op's row names the category of most of its bytes. The op ids are read in a child (:mod:`analyzer.ir.coreai.op_ids`).
The machine (CPU model, cores, OS, runtime version) is the device; each target gives one qfold-schema log row
(``analyzer.measure.logs``) that ``fit`` reads.
"""

from __future__ import annotations

import csv
import importlib.metadata
import io
import os
import platform
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.analysis.accounting import CATEGORIES, OpBytes, account, split_by_bytes
from analyzer.engines.coreai.runtime import CoreAIRuntime, LoadedModel, Profile, asset_in
from analyzer.engines.interpret import decode_feeds
from analyzer.errors import CoreAIRuntimeError
from analyzer.fsio import read_json
from analyzer.ir.coreai.op_ids import read_op_ids
from analyzer.ir.coreai.walk import read_asset
from analyzer.ir.mil_records import MilProgram

DEFAULT_STEPS = 8
DEFAULT_ROUNDS = 5
DEFAULT_WARMUP = 1
TOP_OPS = 10
RUNTIME_CATEGORY = "runtime"  # profiled time of runtime events with no program op (NDArray copies, allocations)
COMPUTE_CATEGORY = "compute"  # ops that move no bytes the account charges (scalars, views)
FP16_NOTE = ("fp16 weights on the Linux Core AI runtime: its fp16 matmul kernel dominates the step (the probe "
             "measured Q-fold at ×0.96–0.99 of repeat_kv with fp16 weights, ×0.41 with fp32 at ctx 2048), so these "
             "timings say little about attention or KV traffic; build with --weights fp32 to time them")


@dataclass(frozen=True, slots=True)
class Machine:
    """Where the runtime ran: the device of the log rows."""

    cpu_model: str
    cores: int
    os: str  # "Linux 6.8.0-1026-aws"
    runtime_version: str  # coreai-core's version
    compute_units: str  # "CPU (single-threaded)" on Linux

    @property
    def device(self) -> str:
        return f"{self.cpu_model} ({self.cores} cores, {self.os}) · Core AI runtime {self.runtime_version}"


@dataclass(frozen=True, slots=True)
class OpTiming:
    """One op record's profiled time per decode token, with what the byte account says it moves."""

    index: int
    type: str
    name: str
    layer: int | None
    category: str
    time_ms: float  # per decode token
    bytes_per_token: int


@dataclass(frozen=True, slots=True)
class TargetBench:
    label: str
    path: str  # the .aimodel
    build_key: str | None
    weights_dtype: str  # the dtype most weight bytes are stored in ("fp16", "fp32")
    context_length: int | None
    steps: int
    round_s: tuple[float, ...]
    profile_ms_per_token: float  # the runtime's own "Function Execute" time, profiled
    ops: tuple[OpTiming, ...]  # every joined op, slowest first
    time_by_category_ms: dict[str, float]  # per decode token
    join: str  # "joined N of M profiled ms to op records" or why not

    @property
    def tok_per_s(self) -> tuple[float, ...]:
        return tuple(self.steps / s for s in self.round_s)

    @property
    def tok_per_s_median(self) -> float:
        return statistics.median(self.tok_per_s)

    @property
    def ms_per_token_median(self) -> float:
        return 1e3 / self.tok_per_s_median


@dataclass(frozen=True, slots=True)
class BenchResult:
    machine: Machine
    rounds: int
    warmup: int
    targets: tuple[TargetBench, ...]
    notes: tuple[str, ...] = ()
    date: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d"))

    def to_json(self) -> dict[str, Any]:
        return {"machine": {**asdict(self.machine), "device": self.machine.device}, "rounds": self.rounds,
                "warmup": self.warmup, "date": self.date, "notes": list(self.notes),
                "targets": [{**_target_summary(t), "top_ops": [asdict(o) for o in t.ops[:TOP_OPS]]}
                            for t in self.targets]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> BenchResult:
        """The result :meth:`to_json` wrote (``bench --json``), each target's ops its top :data:`TOP_OPS`."""
        m = doc["machine"]
        machine = Machine(m["cpu_model"], int(m["cores"]), m["os"], m["runtime_version"], m["compute_units"])
        targets = tuple(TargetBench(
            t["label"], t["path"], t["build_key"], t["weights_dtype"], t["context_length"], int(t["steps"]),
            tuple(float(x) for x in t["round_s"]), float(t["profile_ms_per_token"]),
            tuple(OpTiming(**o) for o in t["top_ops"]), {k: float(v) for k, v in t["time_by_category_ms"].items()},
            t["join"]) for t in doc["targets"])
        return cls(machine, int(doc["rounds"]), int(doc["warmup"]), targets, tuple(doc["notes"]), doc["date"])


def _target_summary(t: TargetBench) -> dict[str, Any]:
    tps = t.tok_per_s
    return {"label": t.label, "path": t.path, "build_key": t.build_key, "weights_dtype": t.weights_dtype,
            "context_length": t.context_length, "steps": t.steps, "round_s": list(t.round_s),
            "tok_per_s_median": t.tok_per_s_median, "tok_per_s_min": min(tps), "tok_per_s_max": max(tps),
            "ms_per_token_median": t.ms_per_token_median, "profile_ms_per_token": t.profile_ms_per_token,
            "time_by_category_ms": t.time_by_category_ms, "join": t.join}


# ------------------------------------------------------------------------------------------------ the machine
def machine() -> Machine:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        version = importlib.metadata.version("coreai-core")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    units = "CPU (single-threaded)" if sys.platform.startswith("linux") else "runtime default"
    return Machine(cpu, os.cpu_count() or 1, f"{platform.system()} {platform.release()}", version, units)


# ------------------------------------------------------------------------------------------------ targets
@dataclass(frozen=True, slots=True)
class Target:
    asset: Path
    label: str
    build_key: str | None


def resolve_target(path: str | Path, label: str | None = None) -> Target:
    """A Core AI build folder (its ``analysis.json`` key is the default label) or a ``.aimodel`` (its name)."""
    asset = asset_in(path)
    if asset is None and (Path(path) / "analysis.json").is_file() and not any(Path(path).glob("*.mlpackage")):
        raise CoreAIRuntimeError(f"{path}: this build keeps no model.aimodel (an analysis-mode build); build it "
                                 "with --mode materialised to time it")
    if asset is None:
        raise CoreAIRuntimeError(f"{path}: not a Core AI build folder or .aimodel (bench times Core AI builds)")
    folder = asset.parent if (asset.parent / "analysis.json").is_file() else None
    key = None
    if folder is not None:
        doc = read_json(folder / "analysis.json", error=CoreAIRuntimeError)
        key = doc.get("key") if isinstance(doc, dict) and isinstance(doc.get("key"), str) else folder.name
    return Target(asset, label or key or asset.stem, key)


def weights_dtype(program: MilProgram) -> str:
    """The dtype most constant bytes are stored in (fp16 / fp32 weights)."""
    by: dict[str, int] = defaultdict(int)
    for op in program.ops:
        if op.const_bytes and op.outputs:
            by[op.outputs[0].dtype] += op.const_bytes
    return max(by, key=by.get) if by else "?"


# ------------------------------------------------------------------------------------------------ the join
def join_profile(program: MilProgram, ids: list[tuple[str, int | None]], profile: Profile
                 ) -> tuple[tuple[OpTiming, ...], dict[str, float], str]:
    """Per-op time per token joined to the records, time by byte category, and what the join covered."""
    calls = max(profile.calls, 1)
    total_ms = sum(o.time_ns for o in profile.ops) / 1e6 / calls
    by_cat: dict[str, float] = {c: 0.0 for c in (*CATEGORIES, COMPUTE_CATEGORY, RUNTIME_CATEGORY)}
    types = [op.type for op in program.ops]
    if len(ids) != len(types) or any(n != t for (n, _), t in zip(ids, types, strict=True)):
        by_cat[RUNTIME_CATEGORY] = total_ms
        return (), by_cat, (f"not joined: the asset's ops ({len(ids)}) do not line up with the walker's records "
                            f"({len(types)}); per-op times are by event only")
    records: dict[int, list[int]] = defaultdict(list)
    for index, (_, op_id) in enumerate(ids):
        if op_id is not None:
            records[op_id].append(index)
    acct = {o.index: o for o in account(program).ops}
    time_ms: dict[int, float] = defaultdict(float)
    unjoined = 0.0
    for o in profile.ops:
        ms = o.time_ns / 1e6 / calls
        hit = records.get(o.coreai_op_id) if o.coreai_op_id is not None else None
        if not hit:
            unjoined += ms
            continue
        for index in hit:  # a composite body op: one record per call, the time shared evenly
            time_ms[index] += ms / len(hit)
    rows = []
    for index, ms in time_ms.items():
        op, b = program.ops[index], acct.get(index)
        mine = () if b is None else (b,)
        split_by_bytes(ms, mine, by_cat, COMPUTE_CATEGORY)
        rows.append(OpTiming(index, op.type, op.name, op.layer, _main_category(b), round(ms, 6), b.total if b else 0))
    by_cat[RUNTIME_CATEGORY] += unjoined
    rows.sort(key=lambda r: -r.time_ms)
    joined = total_ms - unjoined
    return tuple(rows), {k: round(v, 6) for k, v in by_cat.items()}, (
        f"joined {joined:.3f} of {total_ms:.3f} profiled ms per token to {len(rows)} op records")


def _main_category(b: OpBytes | None) -> str:
    """The category of most of an op's bytes (its label in the per-op table), ``compute`` when it moves none."""
    if b is None or b.total <= 0:
        return COMPUTE_CATEGORY
    return max(CATEGORIES, key=b.get)


# ------------------------------------------------------------------------------------------------ running
def run_bench(paths: list[str | Path], labels: list[str | None] | None = None, steps: int = DEFAULT_STEPS,
              rounds: int = DEFAULT_ROUNDS, warmup: int = DEFAULT_WARMUP, profile: bool = True,
              seed: int = 0, on_progress: Callable[[float, str], None] | None = None) -> BenchResult:
    """Time ``paths`` (a label each, None: the build key or asset name) in one runtime child; ``on_progress``
    hears (fraction done, what is running) before each stage: loads, the warmup, each round, each profile."""
    tell = on_progress or (lambda fraction, message: None)
    if labels and len(labels) != len(paths):
        raise CoreAIRuntimeError(f"--label: give one per target ({len(paths)} targets, {len(labels)} labels)")
    targets = [resolve_target(p, labels[i] if labels else None) for i, p in enumerate(paths)]
    seen = [t.label for t in targets]
    if len(set(seen)) != len(seen):
        raise CoreAIRuntimeError(f"two targets have the label {next(x for x in seen if seen.count(x) > 1)!r}; "
                                 "give --label once per target")
    tell(0.0, f"walking {len(targets)} asset(s)")
    programs = [read_asset(t.asset) for t in targets]
    with CoreAIRuntime() as rt:
        models: list[LoadedModel] = []
        for i, t in enumerate(targets):
            tell(0.05 + 0.15 * i / len(targets), f"loading {t.label} on the Core AI runtime")
            models.append(rt.load(t.asset))
        feeds = {m.id: decode_feeds(m, steps, seed=seed) for m in models}
        if warmup:
            tell(0.2, f"{warmup} warmup round(s) of {steps} decode steps per target")
            rt.time_decode(models, feeds, 0, warmup)
        round_s: dict[int, list[float]] = {m.id: [] for m in models}
        for r in range(rounds):  # one request per round: the same interleaving, and progress between rounds
            tell(0.25 + 0.55 * r / rounds, f"round {r + 1} of {rounds}: {steps} decode steps per target")
            for mid, seconds in rt.time_decode(models, feeds, 1, 0).round_s.items():
                round_s[mid].extend(seconds)
        profiles = []
        for i, (t, m) in enumerate(zip(targets, models, strict=True)):
            if profile:
                tell(0.8 + 0.2 * i / len(targets), f"profiling {t.label}'s ops")
            profiles.append(m.profile(feeds[m.id]) if profile else None)
    tell(1.0, "joining the profiles to the op records")
    results = []
    for t, program, m, prof in zip(targets, programs, models, profiles, strict=True):
        ops, by_cat, join = join_asset(program, t.asset, prof) if prof is not None else ((), {}, "not profiled")
        ctx = next((s.shape[-2] for s in m.states if len(s.shape) == 4), None)
        results.append(TargetBench(t.label, str(t.asset), t.build_key, weights_dtype(program), ctx, steps,
                                   tuple(round_s[m.id]), prof.execute_ns / 1e6 / steps if prof else 0.0,
                                   ops, by_cat, join))
    notes = ()
    if sys.platform.startswith("linux") and any(r.weights_dtype == "fp16" for r in results):
        notes = (FP16_NOTE,)
    return BenchResult(machine(), rounds, warmup, tuple(results), notes)


def join_asset(program: MilProgram, asset: Path, profile: Profile
               ) -> tuple[tuple[OpTiming, ...], dict[str, float], str]:
    """:func:`join_profile` with the asset's op ids; when their child fails, every profiled ms stays the
    runtime's and the join says why (never a join of nothing that looks like zero ops)."""
    try:
        ids = read_op_ids(asset)
    except CoreAIRuntimeError as e:
        by_cat = {c: 0.0 for c in (*CATEGORIES, COMPUTE_CATEGORY, RUNTIME_CATEGORY)}
        by_cat[RUNTIME_CATEGORY] = sum(o.time_ns for o in profile.ops) / 1e6 / max(profile.calls, 1)
        return (), by_cat, f"not joined: {e}"
    return join_profile(program, ids, profile)


# ------------------------------------------------------------------------------------------------ outputs
LOG_COLUMNS = ("device", "build", "tok_per_s", "context_length", "phase", "quantization", "compute_units",
               "os_version", "date", "notes")


def log_rows(result: BenchResult) -> list[dict[str, Any]]:
    """One qfold-schema log row per target (``analyzer.measure.logs.readers.qfold``)."""
    m = result.machine
    rows = []
    for t in result.targets:
        tps = t.tok_per_s
        rows.append({
            "device": m.device, "build": t.label, "tok_per_s": f"{t.tok_per_s_median:.4f}",
            "context_length": "" if t.context_length is None else t.context_length, "phase": "decode",
            "quantization": f"{t.weights_dtype} weights", "compute_units": m.compute_units, "os_version": m.os,
            "date": result.date,
            "notes": (f"qfold bench: median of {result.rounds} rounds x {t.steps} decode steps (tok/s "
                      f"{min(tps):.3f}-{max(tps):.3f}); coreai-core {m.runtime_version}"),
        })
    return rows


def log_csv(result: BenchResult) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=LOG_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(log_rows(result))
    return buf.getvalue()


def profile_json(result: BenchResult) -> dict[str, Any]:
    """``--profile-out``: every target's per-op times joined to op records, and time by byte category."""
    return {"machine": {**asdict(result.machine), "device": result.machine.device},
            "targets": [{"label": t.label, "path": t.path, "join": t.join, "time_by_category_ms": t.time_by_category_ms,
                         "profile_ms_per_token": t.profile_ms_per_token, "ops": [asdict(o) for o in t.ops]}
                        for t in result.targets]}
