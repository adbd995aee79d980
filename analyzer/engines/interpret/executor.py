"""Load one function of an ML Program package into a list of kernel calls, and run it.

Loading parses ``Model.proto`` (``analyzer.ir.coreml.mil_reader.load_function``), memory-maps the ``weight.bin``
blobs, and
binds every op to its kernel; an op type with no kernel fails here, before anything runs. Running walks the ops
in program order over a dict of values:

    inputs (cast to the declared dtypes) ─┐
    const / constexpr values (cached) ────┼─► op 1 ─► op 2 ─► ... ─► outputs, final states
    states (zero unless given) ───────────┘     read_state / write_state update the run's state store

Every op's result is rounded to the dtype the program declares for it and checked against the declared shape,
so a kernel bug surfaces at the op that caused it, named.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import analyzer.engines.interpret.ops  # noqa: F401  (importing the package registers every kernel)
from analyzer.engines.interpret.ops._common import OperandError, describe
from analyzer.engines.interpret.ops.state import StateRef
from analyzer.engines.interpret.registry import Kernel, kernel_for
from analyzer.engines.interpret.values import NP_DTYPES, check_array_size, decode_value, np_dtype
from analyzer.errors import InterpretError, QfoldError
from analyzer.ir.coreml.mil_reader import Blobs, TensorInfo, load_function, tensor_info


@dataclass(frozen=True, slots=True)
class _Ref:
    """A parameter bound to a named value (a program input, state, const or another op's output)."""

    name: str


@dataclass(frozen=True, slots=True)
class _Step:
    index: int
    type: str
    name: str
    kernel: Kernel
    params: tuple[tuple[str, object], ...]  # (param, _Ref | value | tuple of those for variadic params)
    outputs: tuple[TensorInfo, ...]
    foldable: bool  # every input is constant and the kernel is pure: evaluated once, then cached


@dataclass(frozen=True)
class RunResult:
    """Outputs by name (in the program's declared dtypes) and the states' values after the run."""

    outputs: dict[str, np.ndarray]
    states: dict[str, np.ndarray] = field(default_factory=dict)


class Interpreter:
    """One function of a package, ready to run. Build it with ``load_interpreter``."""

    def __init__(self, path: Path, function: str, opset: str, inputs: tuple[TensorInfo, ...],
                 states: tuple[TensorInfo, ...], outputs: tuple[TensorInfo, ...], steps: tuple[_Step, ...],
                 consts: dict[str, object]):
        self.path, self.function, self.opset = path, function, opset
        self.inputs, self.states, self.outputs = inputs, states, outputs
        self.output_names = tuple(o.name for o in outputs)
        self._steps = steps
        self._consts = consts  # const op outputs and inline values; grows with folded constexpr results

    # -------------------------------------------------------------------------------------------- info
    @property
    def op_count(self) -> int:
        """Non-const ops (const ops are values, not steps)."""
        return len(self._steps)

    def op_types(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self._steps:
            out[s.type] = out.get(s.type, 0) + 1
        return out

    def constant(self, name: str) -> np.ndarray:
        """The value of a constant: a ``const`` op's output, or a constexpr/constant-only op's result (evaluated
        now if it has not been). Raises ``KeyError`` for a name that is not constant."""
        if name in self._consts:
            return np.asarray(self._consts[name])
        for step in self._steps:
            if step.foldable and any(o.name == name for o in step.outputs):
                self._fold_up_to(step.index)
                return np.asarray(self._consts[name])
        raise KeyError(f"{name!r} is not a constant of {self.path.name}:{self.function}")

    def constant_names(self) -> tuple[str, ...]:
        """Names of every constant value: const ops, then outputs of constexpr / constant-only ops."""
        folded = tuple(o.name for s in self._steps if s.foldable for o in s.outputs)
        return tuple(n for n in self._consts if n not in folded) + folded

    def is_constant(self, name: str) -> bool:
        """Whether ``name`` is a constant value (:meth:`constant` answers it)."""
        return name in self._consts or any(s.foldable and o.name == name for s in self._steps for o in s.outputs)

    def table_rows(self, indices: str) -> int | None:
        """The rows (along the gathered axis) of a constant table a ``gather`` indexes with the value named
        ``indices``: an embedding's vocabulary, read off the table, not guessed from an output."""
        for step in self._steps:
            params = dict(step.params)
            ref, table, axis = params.get("indices"), params.get("x"), params.get("axis")
            if step.type == "gather" and isinstance(ref, _Ref) and ref.name == indices and isinstance(table, _Ref) \
                    and self.is_constant(table.name):
                if isinstance(axis, _Ref):  # the axis as a const op's output, not inline
                    if not self.is_constant(axis.name):
                        return None
                    axis = self.constant(axis.name)
                shape = np.shape(self.constant(table.name))
                return int(shape[int(np.asarray(axis)) if axis is not None else 0])
        return None

    # -------------------------------------------------------------------------------------------- run
    def run(self, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray] | None = None) -> RunResult:
        """Evaluate the function once. ``inputs``: one array per input name (cast to the declared dtype);
        ``states``: initial state values (default zeros; not modified). Returns outputs and final states."""
        env, store = self._evaluate(inputs, states)
        return RunResult({n: np.asarray(env[n]) for n in self.output_names}, dict(store))

    def value_shapes(self, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray] | None = None
                     ) -> dict[str, tuple[int, ...]]:
        """The shape of every value one run computes (inputs, constants, op outputs), by name: what a flexible
        program's symbolic dimensions are at the given input shapes."""
        env, _ = self._evaluate(inputs, states)
        return {n: tuple(np.shape(v)) for n, v in env.items() if isinstance(v, np.ndarray)}

    def _evaluate(self, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray] | None):
        env: dict[str, object] = dict(self._consts)
        env.update(self._check_values(inputs, self.inputs, "input"))
        store = self._check_values(states, self.states, "state") if states else {}
        for s in self.states:  # a state not given starts at zero
            if s.name not in store:
                store[s.name] = np.zeros(_shape(s), dtype=np_dtype(s.dtype))
        for s in self.states:
            env[s.name] = StateRef(s.name, store)
        for step in self._steps:
            if step.foldable and step.outputs and step.outputs[0].name in self._consts:
                continue
            self._execute(step, env)
            if step.foldable:
                for o in step.outputs:
                    self._consts[o.name] = env[o.name]
        missing = [n for n in self.output_names if n not in env]
        if missing:
            raise InterpretError(f"{self.path.name}: outputs {missing} are never computed")
        return env, store

    def _fold_up_to(self, index: int) -> None:
        env: dict[str, object] = dict(self._consts)
        for step in self._steps[: index + 1]:
            if step.foldable and not all(o.name in self._consts for o in step.outputs):
                self._execute(step, env)
                for o in step.outputs:
                    self._consts[o.name] = env[o.name]

    def _execute(self, step: _Step, env: dict[str, object]) -> None:
        kwargs = {}
        for param, bound in step.params:
            kwargs[param] = tuple(_resolve(b, env) for b in bound) if isinstance(bound, tuple) else _resolve(bound, env)
        result = call_kernel(step.kernel, step.name, kwargs)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(step.outputs):
            raise InterpretError(f"op {step.name!r} ({step.type}) gave {len(results)} outputs; the program "
                                 f"declares {len(step.outputs)}")
        for info, value in zip(step.outputs, results, strict=True):
            env[info.name] = _conform(value, info, step)

    def _check_values(self, given: dict, declared: tuple[TensorInfo, ...], kind: str) -> dict[str, np.ndarray]:
        names = {t.name for t in declared}
        extra = sorted(set(given) - names)
        if extra:
            raise InterpretError(f"{kind} {extra[0]!r} is not among the {kind}s of {self.path.name}:{self.function} "
                                 f"({', '.join(sorted(names)) or 'none'})")
        out = {}
        for t in declared:
            if t.name not in given:
                if kind == "state":
                    continue
                raise InterpretError(f"input {t.name!r} ({t.dtype} {t.shape_text}) is missing")
            value = np.asarray(given[t.name])
            if not shape_matches(t.shape, value.shape):
                raise InterpretError(f"{kind} {t.name!r} has shape {list(value.shape)}; the program declares "
                                     f"{t.shape_text}")
            target = np_dtype(t.dtype)
            if target.kind in "iub":
                _check_integral(value, target, f"{kind} {t.name!r} ({t.dtype})")
            try:
                out[t.name] = value.astype(target, copy=False)
            except (TypeError, ValueError) as e:
                raise InterpretError(f"{kind} {t.name!r}: cannot cast {value.dtype} to {t.dtype}: {e}") from e
        return out


def call_kernel(kernel: Kernel, name: str, kwargs: dict[str, object]):
    """``kernel(**kwargs)`` for the op ``name``. A kernel that cannot run an operand says which and why
    (:class:`OperandError`); any other failure inside a kernel (a NumPy error) names the op and lists its
    operands. Either way an :class:`InterpretError` in words, never a Python exception's class name."""
    where = f"op {name!r} ({kernel.op_type})"
    try:
        return kernel.fn(**kwargs)
    except QfoldError:
        raise
    except OperandError as e:
        raise InterpretError(f"{where} cannot run its operand {e.operand!r}: {e.why}") from e
    except Exception as e:
        operands = ", ".join(f"{p}: " + (" ".join(describe(v) for v in value) if isinstance(value, tuple)
                                         else describe(value)) for p, value in kwargs.items())
        why = str(e).strip() or _WHY.get(type(e), "the kernel failed on them")
        raise InterpretError(f"{where} cannot run on its operands ({operands}): {why}") from e


# What a failure with no message of its own means (never printed as the exception's class name).
_WHY: dict[type, str] = {ZeroDivisionError: "a division by zero", IndexError: "an index is out of range",
                         MemoryError: "out of memory", OverflowError: "a value overflows its type"}


def _check_integral(value: np.ndarray, target: np.dtype, what: str) -> None:
    """Values for an integer (or bool) input must be whole numbers the dtype holds: a cast would silently turn
    3.7 into 3, NaN into an arbitrary integer and 2**40 into its low bits."""
    if value.dtype.kind not in "fc" or value.size == 0:
        if value.dtype.kind in "iu" and target.kind in "iu" and value.size:
            lo, hi = (np.iinfo(target).min, np.iinfo(target).max)
            if int(value.min()) < lo or int(value.max()) > hi:
                raise InterpretError(f"{what}: values from {int(value.min())} to {int(value.max())} do not fit "
                                     f"{target} ({lo} to {hi})")
        return
    if value.dtype.kind == "c" or not np.isfinite(value).all():
        raise InterpretError(f"{what}: holds NaN, infinite or complex values; an integer input takes whole numbers")
    frac = value != np.round(value)
    if frac.any():
        raise InterpretError(f"{what}: {value[frac].flat[0].item()!r} is not a whole number; an integer input takes "
                             "whole numbers (it would be truncated)")
    if target.kind in "iu" and (value.min() < np.iinfo(target).min or value.max() > np.iinfo(target).max):
        raise InterpretError(f"{what}: values from {value.min()} to {value.max()} do not fit {target}")
    if target.kind == "b" and not np.isin(value, (0, 1)).all():
        raise InterpretError(f"{what}: a bool input takes 0 or 1")


def _shape(t: TensorInfo) -> tuple[int, ...]:
    if any(d is None for d in t.shape):
        raise InterpretError(f"{t.name!r} has a symbolic shape {t.shape_text}")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def shape_matches(declared: tuple[int | None, ...], actual: tuple[int, ...]) -> bool:
    """Same rank, and equal sizes wherever the declared size is not symbolic (None)."""
    return len(declared) == len(actual) and all(d is None or d == a for d, a in zip(declared, actual, strict=True))


def _resolve(bound, env: dict[str, object]):
    if isinstance(bound, _Ref):
        try:
            return env[bound.name]
        except KeyError:
            raise InterpretError(f"value {bound.name!r} is used before it is computed") from None
    return bound


def _conform(value, info: TensorInfo, step: _Step):
    """Round a kernel result to the declared dtype and check its shape (None dimensions match anything)."""
    if isinstance(value, StateRef) or info.dtype in ("string", "unknown"):
        return value
    arr = np.asarray(value)
    target = np_dtype(info.dtype)
    if arr.dtype != target:
        arr = arr.astype(target)
    if not shape_matches(info.shape, arr.shape):
        raise InterpretError(f"op {step.name!r} ({step.type}) produced shape {list(arr.shape)}; the program "
                             f"declares {info.shape_text} for {info.name!r}")
    return arr


# glibc mallopt parameters (malloc.h): M_TRIM_THRESHOLD = -1, M_MMAP_THRESHOLD = -3. 32 MiB is the largest mmap
# threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_BYTES, _TRIM_THRESHOLD_BYTES = 32 << 20, 512 << 20


@functools.cache
def _reuse_freed_memory() -> bool:
    """Let glibc serve allocations up to 32 MiB from its heap and keep up to 512 MiB of freed memory.

    A decode step allocates the same multi-MiB intermediates every step (a full-size step: 60 tile outputs of
    16 MiB, 60 state updates of 4 MiB). By default each is a fresh ``mmap`` whose pages fault in again, and a page
    fault costs ~12 µs on this VM (a first 256 MB copy: 0.33 GB per CPU-second; a second: 5-8). Reusing the heap
    cut a full-size step from 3.4-5.6 to 2.9-3.3 CPU-seconds (bench/interpret_full_size.py). The setting is
    process-wide (the process keeps up to 512 MiB of freed memory) and is made once, when a program is loaded;
    elsewhere than glibc it is skipped."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def load_interpreter(path: str | Path, function: str | None = None) -> Interpreter:
    """Read a package (or a build folder holding one) and bind every op of ``function`` (default ``main``) to
    its kernel. Raises ``MilError`` for an unreadable package, ``UnknownOpError`` for an op type with no kernel."""
    loaded = load_function(path, function)
    _reuse_freed_memory()
    func = loaded.function
    blobs = Blobs(loaded.weights_dir)
    try:
        consts, steps = _compile(loaded.block, blobs)
    finally:
        blobs.close()  # the memory maps outlive the open files
    states = tuple(tensor_info(i.name, i.type) for i in func.inputs if i.type.WhichOneof("type") == "stateType")
    state_names = {s.name for s in states}
    inputs = tuple(tensor_info(i.name, i.type) for i in func.inputs if i.name not in state_names)
    for t in (*states, *inputs):  # states start as zeros of this shape; --steps fills inputs of it
        check_array_size(t.shape, t.dtype, f"{'state' if t.name in state_names else 'input'} {t.name!r}")
    declared = {t.name: t for t in (*inputs, *(o for s in steps for o in s.outputs))}
    declared.update({n: TensorInfo(n, np.shape(v), _dtype_of(v), None) for n, v in consts.items()})
    outputs = tuple(declared.get(n) or TensorInfo(n, (), "unknown", None) for n in loaded.block.outputs)
    return Interpreter(loaded.package, loaded.name, func.opset, inputs, states, outputs, steps, consts)


def _dtype_of(value) -> str:
    if isinstance(value, str):
        return "string"
    return next((k for k, v in NP_DTYPES.items() if v == np.asarray(value).dtype), "unknown")


def _op_name(op, index: int) -> str:
    """An op's ``name`` attribute (ops without outputs, such as ``write_state``, carry one), else its position."""
    attr = op.attributes.get("name") if "name" in op.attributes else None
    strings = attr.immediateValue.tensor.strings.values if attr is not None else ()
    return str(strings[0]) if strings else f"{op.type}_{index}"


def _compile(block, blobs: Blobs) -> tuple[dict[str, object], tuple[_Step, ...]]:
    consts: dict[str, object] = {}
    constant: set[str] = set()  # names whose value does not depend on inputs or states
    steps: list[_Step] = []
    for index, op in enumerate(block.operations):
        name = op.outputs[0].name if op.outputs else _op_name(op, index)  # write_state has no outputs
        if op.blocks:
            raise InterpretError(f"op {name!r} ({op.type}) has nested blocks (control flow), which the MIL "
                                 "interpreter does not run")
        outputs = tuple(tensor_info(o.name, o.type) for o in op.outputs)
        for o in outputs:  # every result is an array of its declared shape: refuse an absurd one before it runs
            check_array_size(o.shape, o.dtype, f"op {name!r} ({op.type}) output {o.name!r}")
        if op.type == "const":
            consts[outputs[0].name] = decode_value(op.attributes["val"], outputs[0], blobs)
            constant.add(outputs[0].name)
            continue
        kernel = kernel_for(op.type, name)
        params: list[tuple[str, object]] = []
        all_constant = True
        for param, arg in op.inputs.items():
            bound = []
            for i, binding in enumerate(arg.arguments):
                if binding.WhichOneof("binding") == "name":
                    bound.append(_Ref(binding.name))
                    all_constant &= binding.name in constant
                else:  # an inline value (iOS18 constexpr ops carry their data this way)
                    info = tensor_info(f"{name}.{param}[{i}]", binding.value.type)
                    bound.append(decode_value(binding.value, info, blobs))
            if param in kernel.variadic:
                params.append((param, tuple(bound)))
            elif len(bound) != 1:
                raise InterpretError(f"op {name!r} ({op.type}): parameter {param!r} binds {len(bound)} values")
            else:
                params.append((param, bound[0]))
        for param, value in op.attributes.items():  # iOS16 constexpr ops keep their data as attributes
            if param != "name":
                params.append((param, decode_value(value, tensor_info(f"{name}.{param}", value.type), blobs)))
        foldable = kernel.pure and all_constant and bool(outputs)
        if foldable:
            constant.update(o.name for o in outputs)
        steps.append(_Step(len(steps), op.type, name, kernel, tuple(params), outputs, foldable))
    return consts, tuple(steps)
