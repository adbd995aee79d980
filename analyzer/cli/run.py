"""``run``: evaluate an ML Program package on Linux with qfold's NumPy MIL interpreter.

    run PKG --inputs IN.npz --out OUT.npz [--states S.npz] [--function NAME]
        IN.npz: one array per input name (cast to the declared dtype). OUT.npz: one array per output name and,
        for a stateful program, each state's final value under the state's name (states start at zero unless
        S.npz gives them).
    run PKG --steps N [--input-spec SPEC.json] [--seed S] --out OUT.npz [--function NAME]
        N decode steps with seeded random token ids and matching positions / causal masks (the input spec names
        them; qfold's own builds need none). OUT.npz: each output stacked over the steps ``[N, ...]``, the final
        states, and ``tokens`` ``[N, Q]``.
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import numpy as np

from analyzer.cli.common import positive_int
from analyzer.errors import InterpretError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="evaluate a .mlpackage with the NumPy MIL interpreter (inputs from .npz)")
    p.add_argument("package", help="an ML Program .mlpackage or a build folder holding one")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", metavar="IN.npz", help="one array per input name")
    src.add_argument("--steps", type=positive_int, metavar="N", help="decode N steps with seeded random tokens")
    p.add_argument("--out", required=True, metavar="OUT.npz", help="outputs (and final states) are written here")
    p.add_argument("--states", metavar="S.npz", help="initial state values (default: zeros); a previous run's "
                                                     "OUT.npz works as is (its outputs are skipped)")
    p.add_argument("--function", metavar="NAME", help="function of a multi-function package (default: main)")
    p.add_argument("--input-spec", metavar="SPEC.json",
                   help="with --steps: which inputs are token ids, positions, masks, KV caches: JSON "
                        '{"token_ids": NAME, "position": NAME, "causal_mask": NAME, "vocab_size": N, '
                        '"masked_value": F, "mask_includes_current": B, "kv_inputs": [{"input", "output", '
                        '"index", "axis"}]} (analyzer/graph/interpret/decode.py); qfold builds need none')
    p.add_argument("--seed", type=int, default=0, help="with --steps: seed of the random token ids")
    p.set_defaults(func=cmd_run)


def read_npz(path: str, what: str) -> dict[str, np.ndarray]:
    """Arrays of an ``.npz`` (never unpickled: object arrays are refused)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):
                raise InterpretError(f"{path}: {what} must be an .npz archive (one array per name), not a single array")
            return {name: data[name] for name in data.files}
    except InterpretError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InterpretError(f"{path}: cannot read {what} as .npz: {e}") from e


def write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write beside ``path`` and rename into place (no half-written OUT.npz for a script to pick up)."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InterpretError(f"{path}: cannot write outputs: {e}") from e


def cmd_run(args) -> int:
    from analyzer.graph.interpret import decode_steps, load_program, load_roles

    if args.steps is None and (args.input_spec or args.seed):
        raise InterpretError("--input-spec and --seed go with --steps")
    t0 = time.monotonic()
    interp = load_program(args.package, args.function)
    t_load = time.monotonic() - t0
    states = read_npz(args.states, "--states") if args.states else None
    if states is not None:  # a previous run's OUT.npz holds its outputs beside the final states: it chains as is
        states = {k: v for k, v in states.items() if k not in interp.output_names and k != "tokens"}
    t1 = time.monotonic()
    if args.inputs is not None:
        result = interp.run(read_npz(args.inputs, "--inputs"), states)
        arrays, n_states, final = dict(result.outputs), len(result.states), result.states
    else:
        roles = load_roles(args.input_spec) if args.input_spec else None
        run = decode_steps(interp, args.steps, roles, seed=args.seed, states=states)
        arrays = {n: np.stack([o[n] for o in run.outputs]) for n in interp.output_names}
        if "tokens" in arrays:
            raise InterpretError("the package has an output named 'tokens'; --steps writes the token ids there")
        arrays["tokens"] = run.tokens
        n_states, final = len(run.states), run.states
    clash = sorted(set(arrays) & set(final))
    if clash:
        raise InterpretError(f"state {clash[0]!r} has the name of an output; cannot write both to one .npz")
    arrays.update(final)
    write_npz(args.out, arrays)
    print(f"{args.out}: {len(interp.output_names)} outputs, {n_states} states "
          f"({interp.op_count:,} ops; load {t_load:.2f} s, run {time.monotonic() - t1:.2f} s)")
    return 0
