"""What grows with ctx in an analysis-mode build (issue 40, item 2): a ctx sweep converts its largest-but-one point,
and that point cost several times a ctx-4096 build although no tensor of that size holds a value. Measured per ctx,
in CPU seconds of this process (``time.process_time``: what other work on the machine does not inflate):

* the conversion of each variant (``analyzer.convert.modes.value_free_programs``: trace, convert, walk), then, in a
  second, profiled run at the smallest and the largest ctx, the functions whose time grew most (``--cprofile``);
* the variants' torch equivalence check on the reduced model (``analyzer.model.equivalence.check_equivalence``),
  at the build's ctx (what every build ran before) and at ``analyzer.convert.checks.equivalence_ctx`` (what it
  runs now).

    env PYTHONPATH=. .venv/bin/python -P bench/ctx_cost.py [--preset llama-3.1-8b] [--layers 2] [--ctx 512,4096,32768]

Found (bench/results/ctx_cost.json): the equivalence check grew linearly with ctx (its decode reads and repeat_kv
copies the whole static cache every step); in the conversion, coremltools' TorchScript lowering read every KV buffer
(``torch.equal`` of each buffer with itself) and repeat_kv's trace copied the empty cache G times per layer. Results
are merged into bench/results/ctx_cost.json with the machine's CPU count, memory and load average.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.fast import code_commit, machine  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ctx_cost.json"


def _cpu(fn, *args):
    c = time.process_time()
    out = fn(*args)
    return out, round(time.process_time() - c, 3)


def measure(preset: str, layers: int, ctxs: list[int], top: int) -> dict:
    from analyzer import quiet_coremltools

    quiet_coremltools()
    import torch

    from analyzer.convert.checks import equivalence_ctx
    from analyzer.convert.modes import value_free_programs
    from analyzer.model.decode import build_model
    from analyzer.model.equivalence import check_equivalence
    from analyzer.model.sources import resolve_source
    from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
    from analyzer.model.valuefree import reduced_source

    torch.set_num_threads(1)
    source = resolve_source(preset, [f"num_hidden_layers={layers}"])
    reduced = build_model(reduced_source(source))
    rows, profiles = {}, {}
    for ctx in ctxs:
        row: dict = {}
        for variant in ("repeat_kv", "qfold"):
            spec = BuildSpec(source, variant, "state", ctx, build_mode=ANALYSIS_MODE)
            profiled = top and ctx in (min(ctxs), max(ctxs))
            for prof in ([None, cProfile.Profile()] if profiled else [None]):  # timed unprofiled, then profiled
                scratch = Path(tempfile.mkdtemp(prefix="qfold-ctx-cost-"))
                try:
                    if prof:
                        prof.enable()
                    (_, timings, _), cpu = _cpu(value_free_programs, spec, scratch)
                    if prof:
                        prof.disable()
                        profiles[(ctx, variant)] = pstats.Stats(prof).stats
                    else:
                        row[f"convert_{variant}_cpu_s"], row[f"convert_{variant}_wall_s"] = cpu, timings
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
        spec = BuildSpec(source, "qfold", "state", ctx, build_mode=ANALYSIS_MODE)
        _, row["equivalence_at_build_ctx_cpu_s"] = _cpu(check_equivalence, reduced, "state", ctx, 8)
        row["equivalence_ctx_now"] = equivalence_ctx(spec)
        _, row["equivalence_now_cpu_s"] = _cpu(check_equivalence, reduced, "state", row["equivalence_ctx_now"], 8)
        rows[str(ctx)] = row
        print(ctx, row, flush=True)
    out = {"preset": preset, "layers": layers, "per_ctx": rows}
    if top and len(ctxs) > 1:
        lo, hi = min(ctxs), max(ctxs)
        for variant in ("repeat_kv", "qfold"):
            a, b = profiles[(lo, variant)], profiles[(hi, variant)]
            grown = sorted(((b.get(k, (0, 0, 0))[2] - a.get(k, (0, 0, 0))[2], k) for k in set(a) | set(b)),
                           reverse=True)[:top]
            out.setdefault("grew_most_tottime_s", {})[variant] = [
                f"{d:+.3f} s  {k[0].split('site-packages/')[-1]}:{k[1]}({k[2]})" for d, k in grown]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama-3.1-8b")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--ctx", default="512,4096,32768")
    p.add_argument("--cprofile", type=int, default=8, metavar="N", help="the N functions whose time grew most")
    p.add_argument("--label", default="")
    a = p.parse_args()
    start, commit = machine(), code_commit()
    row = measure(a.preset, a.layers, [int(c) for c in a.ctx.split(",")], a.cprofile)
    row.update(when=time.strftime("%Y-%m-%d %H:%M:%S"), machine_at_start=start, machine_at_end=machine(),
               code_commit=commit)
    key = "-".join([a.preset, f"{a.layers}layers", *([a.label] if a.label else [])])
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data[key] = row
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(row.get("grew_most_tottime_s", {}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
