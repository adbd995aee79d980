"""The kernel registry: one function per MIL op type, registered by decorator.

A kernel takes the op's parameters as keyword arguments named as in the MIL op definition
(``coremltools/converters/mil/mil/ops/defs/iOS15..iOS18``) and returns one array, or a tuple for ops with
several outputs. A parameter the op does not bind is not passed (the kernel's default is the MIL default).
Scalars arrive as 0-d arrays and strings as ``str``; variadic parameters (``concat(values=...)``) as tuples.
The interpreter rounds every result to the output dtype the program declares, so a kernel may compute in
fp32 and return fp32 for an fp16 op.

    @register("relu")
    def relu(x):
        return np.maximum(x, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analyzer.errors import UnknownOpError


@dataclass(frozen=True, slots=True)
class Kernel:
    op_type: str
    fn: Callable
    variadic: frozenset[str]  # parameters that bind a list of values (concat's ``values``)
    pure: bool  # a function of its inputs only: evaluated once when every input is constant


KERNELS: dict[str, Kernel] = {}


def register(*op_types: str, variadic: tuple[str, ...] = (), pure: bool = True) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        for op_type in op_types:
            if op_type in KERNELS:
                raise ValueError(f"op type {op_type!r} already has a kernel ({KERNELS[op_type].fn.__name__})")
            KERNELS[op_type] = Kernel(op_type, fn, frozenset(variadic), pure)
        return fn

    return deco


def kernel_for(op_type: str, op_name: str) -> Kernel:
    """The kernel of ``op_type`` (the interpreter's loader imports ``ops``, which registers every kernel)."""
    try:
        return KERNELS[op_type]
    except KeyError:
        raise UnknownOpError(f"op {op_name!r} has type {op_type!r}, which the MIL interpreter does not implement "
                             f"({len(KERNELS)} op types are supported; see analyzer/engines/interpret/ops/)") from None


def supported_op_types() -> tuple[str, ...]:
    return tuple(sorted(KERNELS))
