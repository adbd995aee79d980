"""Core ML states (iOS18): ``read_state`` and ``write_state``.

A state is bound in the program to a ``StateRef``, a handle on the run's mutable store; coremltools' in-memory
``coreml_update_state`` is serialized as ``write_state`` followed by ``read_state`` (coremltools
``backend/mil/load.py: translate_coreml_update_state_op``), so these two ops are all a saved package holds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.engines.interpret.registry import register


@dataclass(frozen=True, slots=True)
class StateRef:
    name: str
    store: dict  # state name → current value, owned by one run


@register("read_state", pure=False)
def read_state(input):
    return input.store[input.name]


@register("write_state", pure=False)
def write_state(input, data):
    current = input.store[input.name]
    data = np.asarray(data)
    if data.shape != current.shape:
        raise ValueError(f"state {input.name!r} is {list(current.shape)}; cannot write {list(data.shape)}")
    input.store[input.name] = data.astype(current.dtype, copy=False)
    return ()
