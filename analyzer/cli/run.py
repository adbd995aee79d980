"""``run``: evaluate an ML Program package on Linux with qfold's NumPy MIL interpreter, or a Core AI ``.aimodel``
on Apple's Core AI runtime (coreai-core; CPU-only and single-threaded on Linux, in a child process).

    run PKG --inputs IN.npz --out OUT.npz [--states S.npz] [--function NAME]
        IN.npz: one array per input name (cast to the declared dtype). OUT.npz: one array per output name and,
        for a stateful program, each state's final value under the state's name (states start at zero unless
        S.npz gives them).
        A flexible input takes the shape of the array given.
    run PKG --steps N [--input-spec SPEC.json] [--seed S] [--shape NAME=D0,…] --out OUT.npz [--function NAME]
        N decode steps with seeded random token ids and matching positions / causal masks (the input spec names
        them; qfold's own builds need none; any other package gets inputs drawn within what each can hold, each
        draw printed). A flexible input runs at ``--shape`` (else the stated default). OUT.npz: each output
        stacked over the steps ``[N, ...]``, the final states, and ``tokens`` ``[N, Q]``.
    PKG may also be a ``.aimodel`` or a Core AI build folder: the same contract, on the Core AI runtime (its
    ``main`` function; states are the asset's state handles).
"""

from __future__ import annotations

import math
import os
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

from analyzer.analysis.shapes import check_names, check_static_shapes, read_sized
from analyzer.cli.common import add_shape_option, positive_int, shapes_of
from analyzer.engines.coreai.runtime import CoreAIRuntime, asset_in
from analyzer.engines.interpret import decode_steps, infer_roles, load_interpreter, load_roles
from analyzer.engines.interpret.draws import draw_steps, plan_draws
from analyzer.engines.interpret.executor import shape_matches
from analyzer.engines.interpret.input_checks import check_role_values, check_steps
from analyzer.engines.interpret.values import max_array_bytes
from analyzer.errors import InterpretError
from analyzer.fsio import open_regular, resolved
from analyzer.ir.coreml.mil_reader import TensorInfo


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="evaluate a .mlpackage with the NumPy MIL interpreter, or a .aimodel on the "
                                   "Core AI runtime (inputs from .npz)")
    p.add_argument("package", help="an ML Program .mlpackage, a Core AI .aimodel, or a build folder holding one")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--inputs", metavar="IN.npz", help="one array per input name")
    src.add_argument("--steps", type=positive_int, metavar="N", help="decode N steps with seeded random tokens")
    p.add_argument("--out", required=True, metavar="OUT.npz", help="outputs (and final states) are written here")
    p.add_argument("--states", metavar="S.npz", help="initial state values (default: zeros); a previous run's "
                                                     "OUT.npz works as is (its outputs are skipped)")
    p.add_argument("--function", metavar="NAME", help="function of a multi-function package (default: main)")
    p.add_argument("--input-spec", metavar="SPEC.json",
                   help="which inputs are token ids, positions, masks, KV caches (--steps drives them; --inputs "
                        "are checked against them: token ids below the vocabulary, positions inside the cache): JSON "
                        '{"token_ids": NAME, "position": NAME, "causal_mask": NAME, "vocab_size": N, '
                        '"masked_value": F, "mask_includes_current": B, "kv_inputs": [{"input", "output", '
                        '"index", "axis"}]} (analyzer/engines/interpret/roles.py); qfold builds need none')
    p.add_argument("--seed", type=int, default=0, help="with --steps: seed of the random token ids")
    add_shape_option(p)
    p.set_defaults(func=cmd_run)


def read_npz(path: str, what: str, declared: dict[str, TensorInfo] | None = None,
             skip: set[str] | frozenset[str] = frozenset()) -> dict[str, np.ndarray]:
    """Arrays of an ``.npz``, bounded before anything is decompressed: the file must be a regular file (a FIFO
    would hang), every member's ``.npy`` header is read first and its shape checked against the program's
    declaration (``declared``: name → tensor) and the interpreter's array ceiling, so a deflate bomb or a wrong
    shape is refused at the cost of its header. Object arrays are never unpickled; members in ``skip`` are not
    read at all."""
    try:
        with os.fdopen(open_regular(Path(path), InterpretError), "rb") as f:
            with zipfile.ZipFile(f) as z:
                wanted = _check_members(z, path, what, declared, skip)
            f.seek(0)
            with np.load(f, allow_pickle=False) as data:
                if not hasattr(data, "files"):
                    raise InterpretError(f"{path}: {what} must be an .npz archive (one array per name), not a "
                                         "single array")
                return {name: data[name] for name in data.files if name in wanted}
    except InterpretError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise InterpretError(f"{path}: cannot read {what} as .npz: {e}") from e


def _check_members(z: zipfile.ZipFile, path: str, what: str, declared: dict[str, TensorInfo] | None,
                   skip: set[str] | frozenset[str]) -> set[str]:
    cap = max_array_bytes()
    wanted = set()
    for info in z.infolist():
        name = info.filename.removesuffix(".npy")
        if name in skip:
            continue
        where = f"{path}: {what} member {name!r}"
        if info.file_size > cap + 4096:
            raise InterpretError(f"{where}: {info.file_size:,} bytes uncompressed, more than the {cap:,} an array "
                                 "may take")
        with z.open(info) as member:  # the header only, no data
            version = np.lib.format.read_magic(member)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise InterpretError(f"{where}: .npy format version {version} is not read")
            shape, _, dtype = read_header(member)
        if dtype.hasobject:
            raise InterpretError(f"{path}: cannot read {what} as .npz: member {name!r} is an object array (it would "
                                 "need unpickling); refused")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > cap:
            raise InterpretError(f"{where}: shape {list(shape)} {dtype} would take {nbytes:,} bytes, more than the "
                                 f"{cap:,} an array may take")
        t = declared.get(name) if declared is not None else None
        if t is not None and not shape_matches(t.shape, tuple(shape)):
            kind = "state" if what == "--states" else "input"
            raise InterpretError(f"{path}: {kind} {name!r} has shape {list(shape)}; the program declares "
                                 f"{t.shape_text}")
        wanted.add(name)
    return wanted


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
    if args.steps is None and (args.seed or args.shape):
        raise InterpretError("--seed and --shape go with --steps (--inputs: the arrays' shapes)")
    asset = asset_in(args.package)
    if asset is None:
        return _run(args, lambda: load_interpreter(args.package, args.function))
    if args.function not in (None, "main"):
        raise InterpretError(f"{asset}: --function {args.function!r}: the Core AI runtime runs an asset's main "
                             "function only")
    with CoreAIRuntime() as runtime:
        return _run(args, lambda: runtime.load(asset))


def _run(args, load) -> int:
    """One run on the interpreter or the Core AI runtime: both answer ``inputs``/``output_names``/``run``."""
    t0 = time.monotonic()
    interp = load()
    t_load = time.monotonic() - t0
    for given in (args.inputs, args.states):  # OUT never replaces what the run reads
        if given is not None and resolved(Path(given)) == resolved(Path(args.out)):
            raise InterpretError(f"{args.out}: the output would overwrite {given}")
    if resolved(Path(args.package)) in resolved(Path(args.out)).parents:
        raise InterpretError(f"{args.out}: the output lies inside the package {args.package}")
    # a previous run's OUT.npz holds its outputs beside the final states: it chains as is (outputs not read)
    states = read_npz(args.states, "--states", {t.name: t for t in interp.states},
                      {*interp.output_names, "tokens"}) if args.states else None
    roles = load_roles(args.input_spec) if args.input_spec else infer_roles(interp)
    t1 = time.monotonic()
    if args.inputs is not None:
        inputs = read_npz(args.inputs, "--inputs", {t.name: t for t in interp.inputs})
        if roles is not None:
            check_role_values(interp, roles, inputs)
        result = interp.run(inputs, states)
        arrays, n_states, final = dict(result.outputs), len(result.states), result.states
    else:
        # a Core AI asset has static shapes (a --shape is its own or refused); a package is sized at --shape (else
        # the stated defaults)
        check_names(shapes_of(args), [{t.name for t in interp.inputs}])
        if asset_in(args.package) is not None:
            program = None
            check_static_shapes(shapes_of(args), interp.inputs, interp.path)
        else:
            program = read_sized(args.package, interp.function, shapes_of(args))
        assumed = program.assumed_shapes if program is not None else ()
        for a in assumed:
            print(f"flexible input run at {a.text}")
        if roles is not None or program is None:
            if roles is not None:
                check_steps(interp, roles, args.steps, {a.name: a.shape for a in assumed})
            run = decode_steps(interp, args.steps, roles, seed=args.seed, states=states,
                               shapes={a.name: a.shape for a in assumed} or None)
        else:  # a package no spec describes: inputs drawn within what each can hold
            plan = plan_draws(program)
            for draw in plan:
                print(f"drawn: {draw.text}")
            run = draw_steps(interp, plan, args.steps, args.seed, states)
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
    engine = f"{interp.op_count:,} ops" if hasattr(interp, "op_count") else "Core AI runtime, CPU"
    print(f"{args.out}: {len(interp.output_names)} outputs, {n_states} states "
          f"({engine}; load {t_load:.2f} s, run {time.monotonic() - t1:.2f} s)")
    return 0
