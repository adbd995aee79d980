"""Every kernel, one module per op family; importing this package registers them all."""

from analyzer.engines.interpret.ops import (  # noqa: F401
    constexpr,
    elementwise,
    linalg,
    reduce,
    state,
    tensor,
)
