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
import math
import os
import platform
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.analysis.accounting import CATEGORIES, OpBytes, account, split_by_bytes
from analyzer.analysis.record import load_analysis
from analyzer.engines.coreai.runtime import CoreAIRuntime, LoadedModel, Profile, asset_in, check_compute_units
from analyzer.engines.interpret import decode_feeds
from analyzer.errors import CoreAIRuntimeError
from analyzer.fsio import read_json
from analyzer.ir.coreai.op_ids import read_op_ids
from analyzer.ir.coreai.walk import read_asset
from analyzer.ir.mil_records import MilProgram
from analyzer.ir.phase import call_shape

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


RATIO_METHOD = ("per-round time ratio to the first target of the same phase (the rounds interleave the targets, so "
                "each round's ratio is paired); its median, and a distribution-free confidence interval for that "
                "median from the order statistics of the rounds' ratios (binomial, p = 1/2): with 5 rounds the "
                "interval is [slowest, fastest round's ratio] at 93.75 % (1 − 2·2⁻⁵), no interval reaches 95 % "
                "below 6 rounds")
MEMORY_METHOD = ("the runtime child's resident set (Linux /proc/PID/status VmRSS, VmHWM): its growth when the target "
                 "loaded, and its peak above that while the target ran alone (its profiled pass; the peak reset "
                 "before it through /proc/PID/clear_refs); peak = the child's RSS before any load + both, what a "
                 "process holding only this model would reach. The first target loaded also pays the runtime's own "
                 "start (its libraries, ~0.2 GB here), which its figures include")


@dataclass(frozen=True, slots=True)
class RatioCI:
    """A target's time per token over the first target's of its phase, from the interleaved rounds
    (:data:`RATIO_METHOD`)."""

    median: float
    low: float
    high: float
    level: float  # the interval's coverage
    rounds: int


@dataclass(frozen=True, slots=True)
class TargetMemory:
    """A target's memory on the runtime (:data:`MEMORY_METHOD`), in bytes."""

    baseline_bytes: int  # the runtime child before any model was loaded
    resident_bytes: int  # its growth when this target loaded
    run_extra_bytes: int  # its peak above that while this target ran alone

    @property
    def peak_bytes(self) -> int:
        return self.baseline_bytes + self.resident_bytes + self.run_extra_bytes


@dataclass(frozen=True, slots=True)
class TargetBench:
    label: str
    path: str  # the .aimodel
    build_key: str | None
    weights_dtype: str  # the dtype most weight bytes are stored in ("fp16", "fp32")
    context_length: int | None
    steps: int  # calls per round (a decode step, or a prefill call of tokens_per_call prompt tokens)
    round_s: tuple[float, ...]
    profile_ms_per_token: float  # the runtime's own "Function Execute" time, profiled
    ops: tuple[OpTiming, ...]  # every joined op, slowest first
    time_by_category_ms: dict[str, float]  # per (decode or prompt) token
    join: str  # "joined N of M profiled ms to op records" or why not
    phase: str = "decode"  # "prefill": each call takes tokens_per_call prompt tokens
    tokens_per_call: int = 1
    memory: TargetMemory | None = None
    memory_note: str = ""  # why there is no memory figure
    ratio: RatioCI | None = None  # to the first target of its phase (None for that one)
    ttft_ms: float | None = None  # time to the first token of a q_len-token prompt
    ttft_how: str = ""

    @property
    def tok_per_s(self) -> tuple[float, ...]:
        """Tokens per second per round: decode tokens, or prompt tokens of a prefill call."""
        return tuple(self.steps * self.tokens_per_call / s for s in self.round_s)

    @property
    def ms_per_call_median(self) -> float:
        return self.ms_per_token_median * self.tokens_per_call

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
                "warmup": self.warmup, "date": self.date, "notes": list(self.notes), "ratio_method": RATIO_METHOD,
                "memory_method": MEMORY_METHOD,
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
            t["join"], t.get("phase", "decode"), int(t.get("tokens_per_call", 1)), _memory_from_json(t.get("memory")),
            t.get("memory_note", ""), RatioCI(**t["ratio_to_first"]) if t.get("ratio_to_first") else None,
            t.get("ttft_ms"), t.get("ttft_how", "")) for t in doc["targets"])
        return cls(machine, int(doc["rounds"]), int(doc["warmup"]), targets, tuple(doc["notes"]), doc["date"])


def _memory_from_json(doc: dict[str, Any] | None) -> TargetMemory | None:
    if not doc:
        return None
    return TargetMemory(int(doc["baseline_bytes"]), int(doc["resident_bytes"]), int(doc["run_extra_bytes"]))


def _target_summary(t: TargetBench) -> dict[str, Any]:
    tps = t.tok_per_s
    memory = None if t.memory is None else {**asdict(t.memory), "peak_bytes": t.memory.peak_bytes}
    return {"label": t.label, "path": t.path, "build_key": t.build_key, "weights_dtype": t.weights_dtype,
            "context_length": t.context_length, "phase": t.phase, "tokens_per_call": t.tokens_per_call,
            "steps": t.steps, "round_s": list(t.round_s),
            "tok_per_s_median": t.tok_per_s_median, "tok_per_s_min": min(tps), "tok_per_s_max": max(tps),
            "ms_per_token_median": t.ms_per_token_median, "ms_per_call_median": t.ms_per_call_median,
            "profile_ms_per_token": t.profile_ms_per_token,
            "ratio_to_first": None if t.ratio is None else asdict(t.ratio),
            "ttft_ms": t.ttft_ms, "ttft_how": t.ttft_how, "memory": memory, "memory_note": t.memory_note,
            "time_by_category_ms": t.time_by_category_ms, "join": t.join}


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """(median, low, high, coverage): the distribution-free interval [x_(k), x_(n+1-k)] for the median of
    ``values`` with the largest k whose coverage 1 − 2·P(Binomial(n, 1/2) < k) reaches ``level``; below that
    (n < 6 for 95 %) the widest, [min, max], with its own coverage."""
    xs, n = sorted(values), len(values)
    k, coverage = 1, 1 - 2 / 2**n
    for j in range(1, n // 2 + 1):
        c = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n
        if c >= level:
            k, coverage = j, c
    return statistics.median(xs), xs[k - 1], xs[n - k], coverage


def ratio_ci(rounds: tuple[float, ...], first: tuple[float, ...]) -> RatioCI:
    """:data:`RATIO_METHOD` for one target's times per token, round by round, against the first target's (the same
    rounds, paired)."""
    med, low, high, level = median_ci([a / b for a, b in zip(rounds, first, strict=True)])
    return RatioCI(med, low, high, level, len(rounds))


# ------------------------------------------------------------------------------------------------ the machine
def machine(compute_units: str | None = None) -> Machine:
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
    return Machine(cpu, os.cpu_count() or 1, f"{platform.system()} {platform.release()}", version,
                   compute_units_text(compute_units))


def compute_units_text(units: str | None) -> str:
    """What ran the model: on Linux the runtime's only unit; elsewhere what ``--compute-units`` asked for."""
    if sys.platform.startswith("linux"):
        return "CPU (single-threaded)"
    return "runtime default" if units in (None, "default") else f"{units} (preferred)"


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
PHASES = ("decode", "prefill")


def prefill_sibling(target: Target, q_len: int) -> Target:
    """The prefill build (``--phase prefill --q-len N``) of the spec a decode build folder holds, beside it in the
    same builds folder; refused with what to build when there is none."""
    folder = target.asset.parent
    if target.build_key is None or not (folder / "analysis.json").is_file():
        raise CoreAIRuntimeError(f"{target.asset}: --phase prefill needs a build folder (its prefill build is found "
                                 "by its spec); give the prefill asset as a target instead")
    spec = load_analysis(folder).build.spec
    if spec.phase != "decode":
        return target
    key = replace(spec, phase="prefill", q_len=q_len).key
    sibling = folder.parent / key
    asset = asset_in(sibling) if sibling.is_dir() else None
    if asset is None:
        raise CoreAIRuntimeError(f"{folder}: no prefill build of its spec with --q-len {q_len} ({sibling} does not "
                                 f"hold a model.aimodel); build it: qfold build --backend coreai --mode materialised "
                                 f"--phase prefill --q-len {q_len} and the same model, variant, ctx and weights")
    return Target(asset, f"{target.label} · prefill {q_len}", key)


def _expand_phases(targets: list[Target], phases: tuple[str, ...], q_len: int | None) -> list[Target]:
    bad = [p for p in phases if p not in PHASES]
    if bad or not phases:
        raise CoreAIRuntimeError(f"--phase {','.join(phases)}: give decode, prefill or decode,prefill")
    if "prefill" not in phases:
        return targets
    if q_len is None or q_len < 2:
        raise CoreAIRuntimeError("--phase prefill: give --q-len N (N ≥ 2 prompt tokens per call)")
    prefill = [prefill_sibling(t, q_len) for t in targets]
    return (targets if "decode" in phases else []) + [p for p in prefill if p not in targets]


def _call_shape(program: MilProgram) -> tuple[str, int]:
    shape = call_shape(program)
    return shape.phase, shape.tokens_per_call


def run_bench(paths: list[str | Path], labels: list[str | None] | None = None, steps: int = DEFAULT_STEPS,
              rounds: int = DEFAULT_ROUNDS, warmup: int = DEFAULT_WARMUP, profile: bool = True,
              seed: int = 0, on_progress: Callable[[float, str], None] | None = None,
              phases: tuple[str, ...] = ("decode",), q_len: int | None = None, compute_units: str | None = None,
              prefill_calls: int = 1) -> BenchResult:
    """Time ``paths`` (a label each, None: the build key or asset name) in one runtime child; ``on_progress``
    hears (fraction done, what is running) before each stage: loads, the warmup, each round, each profile.
    ``phases`` with ``prefill``: each decode build's prefill build of ``q_len`` tokens per call (beside it) is timed
    too, ``prefill_calls`` calls from an empty cache per round; every target of a phase is interleaved with the
    others of that phase. ``compute_units``: asked of the runtime (Linux: ``cpu`` only)."""
    check_compute_units(compute_units)
    tell = on_progress or (lambda fraction, message: None)
    if labels and len(labels) != len(paths):
        raise CoreAIRuntimeError(f"--label: give one per target ({len(paths)} targets, {len(labels)} labels)")
    targets = _expand_phases([resolve_target(p, labels[i] if labels else None) for i, p in enumerate(paths)],
                             tuple(phases), q_len)
    seen = [t.label for t in targets]
    if len(set(seen)) != len(seen):
        raise CoreAIRuntimeError(f"two targets have the label {next(x for x in seen if seen.count(x) > 1)!r}; "
                                 "give --label once per target")
    tell(0.0, f"walking {len(targets)} asset(s)")
    programs = [read_asset(t.asset) for t in targets]
    shapes = [_call_shape(p) for p in programs]
    with CoreAIRuntime() as rt:
        models: list[LoadedModel] = []
        before = rt.memory()
        baseline = None if before is None else before[0]
        resident: list[int | None] = []
        for i, t in enumerate(targets):
            tell(0.05 + 0.15 * i / len(targets), f"loading {t.label} on the Core AI runtime")
            rss = rt.memory()
            models.append(rt.load(t.asset, compute_units))
            after = rt.memory()
            resident.append(None if rss is None or after is None else max(0, after[0] - rss[0]))
        calls = {m.id: steps if shape[0] == "decode" else prefill_calls for m, shape in zip(models, shapes,
                                                                                            strict=True)}
        feeds = {m.id: decode_feeds(m, calls[m.id], seed=seed) for m in models}
        groups = [[m for m, sh in zip(models, shapes, strict=True) if sh[0] == ph] for ph in PHASES]
        groups = [g for g in groups if g]
        if warmup:
            tell(0.2, f"{warmup} warmup round(s) per target")
            for g in groups:
                rt.time_decode(g, feeds, 0, warmup)
        round_s: dict[int, list[float]] = {m.id: [] for m in models}
        for r in range(rounds):  # one request per round: the same interleaving, and progress between rounds
            tell(0.25 + 0.55 * r / rounds, f"round {r + 1} of {rounds}: every target of each phase in turn")
            for g in groups:
                for mid, seconds in rt.time_decode(g, feeds, 1, 0).round_s.items():
                    round_s[mid].extend(seconds)
        profiles, extra = [], []
        for i, (t, m) in enumerate(zip(targets, models, strict=True)):
            tell(0.8 + 0.2 * i / len(targets), f"profiling {t.label}'s ops" if profile else f"running {t.label} "
                 "alone (its memory)")
            reset = rt.reset_peak()
            start = rt.memory()
            profiles.append(m.profile(feeds[m.id]) if profile else None)
            if not profile:
                rt.time_decode([m], feeds, 1, 0)
            end = rt.memory()
            extra.append(max(0, end[1] - start[0]) if reset and start is not None and end is not None else None)
    tell(1.0, "joining the profiles to the op records")
    results = []
    for i, (t, program, m, prof) in enumerate(zip(targets, programs, models, profiles, strict=True)):
        ops, by_cat, join = join_asset(program, t.asset, prof) if prof is not None else ((), {}, "not profiled")
        phase, per_call = shapes[i]
        ctx = next((s.shape[-2] for s in m.states if len(s.shape) == 4), None)
        memory = (TargetMemory(baseline, resident[i], extra[i])
                  if None not in (baseline, resident[i], extra[i]) else None)
        by_cat = {k: v / per_call for k, v in by_cat.items()}  # per (prompt) token
        results.append(TargetBench(t.label, str(t.asset), t.build_key, weights_dtype(program), ctx, calls[m.id],
                                   tuple(round_s[m.id]), prof.execute_ns / 1e6 / calls[m.id] / per_call if prof
                                   else 0.0, ops, by_cat, join, phase, per_call, memory,
                                   "" if memory is not None else "not measured: no /proc on this system"))
    results = _with_ratios_and_ttft(results, q_len)
    notes = ()
    if sys.platform.startswith("linux") and any(r.weights_dtype == "fp16" for r in results):
        notes = (FP16_NOTE,)
    return BenchResult(machine(compute_units), rounds, warmup, tuple(results), notes)


def _with_ratios_and_ttft(results: list[TargetBench], q_len: int | None) -> list[TargetBench]:
    """Each target's time ratio to the first of its phase (:func:`ratio_ci`) and its time to first token: a prefill
    call of the prompt (measured), or, for a decode target, one decode step per prompt token (derived)."""
    out, first = [], {}
    for t in results:
        base = first.setdefault(t.phase, t)
        per_token = [r / (t.steps * t.tokens_per_call) for r in t.round_s]
        ratio = None if base is t else ratio_ci(tuple(per_token), tuple(r / (base.steps * base.tokens_per_call)
                                                                         for r in base.round_s))
        if t.phase == "prefill":
            ttft, how = t.ms_per_call_median, f"one prefill call of {t.tokens_per_call} prompt tokens (measured)"
        elif q_len:
            ttft, how = q_len * t.ms_per_token_median, (f"{q_len} decode steps, one per prompt token (derived from "
                                                         "the decode rounds; no prefill function)")
        else:
            ttft, how = None, ""
        out.append(replace(t, ratio=ratio, ttft_ms=ttft, ttft_how=how))
    return out


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
LOG_COLUMNS = ("device", "build", "tok_per_s", "context_length", "prompt_tokens", "phase", "quantization",
               "compute_units", "os_version", "date", "notes")


def log_rows(result: BenchResult) -> list[dict[str, Any]]:
    """One qfold-schema log row per target (``analyzer.measure.logs.readers.qfold``)."""
    m = result.machine
    rows = []
    for t in result.targets:
        tps = t.tok_per_s
        rows.append({
            "device": m.device, "build": t.label, "tok_per_s": f"{t.tok_per_s_median:.4f}",
            "context_length": "" if t.context_length is None else t.context_length,
            "prompt_tokens": t.tokens_per_call if t.phase == "prefill" else "", "phase": t.phase,
            "quantization": f"{t.weights_dtype} weights", "compute_units": m.compute_units, "os_version": m.os,
            "date": result.date,
            "notes": (f"qfold bench: median of {result.rounds} rounds x {t.steps} "
                      + ("decode steps" if t.phase == "decode" else f"prefill calls of {t.tokens_per_call} tokens")
                      + f" (tok/s {min(tps):.3f}-{max(tps):.3f}); coreai-core {m.runtime_version}"),
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
