"""Core AI builds without the work that grows with weights or layers but cannot change the asset they make: the
Core AI analogue of ``header_blobs`` and ``quick_passes`` (bench/profile_coreai_build.py measures it).

* :class:`OneValueConstants` (analysis mode): coreai-torch's ``TorchConverter._constant_from_tensor`` makes every
  weight contiguous before MLIR stores it, so a value-free weight (a zero-stride fp16 view of one value,
  ``analyzer.model.valuefree``) is materialised, then scanned and found a splat: 2 bytes per parameter written and
  read (a 70B model: 140 GB). Given one element, ``coreai.create_elements_attr`` makes the same splat attribute
  (MLIR attributes are uniqued: the same object, so the same bytecode), at no cost.

It is exact by construction: tests/test_coreai_quick.py builds the same step with and without it and compares
the saved bytecode's program (its MLIR text, debug locations included) and the walked op records.
"""

from __future__ import annotations

import math


def is_one_value_view(tensor) -> bool:
    """Whether ``tensor`` holds one value by construction: a plain tensor of two or more elements whose every
    stride is 0 (``torch.full((), c).expand(shape)``, and its transposes). Sub-byte and reduced-precision
    float tensors (coreai-torch's own paths for them) never are."""
    import torch

    if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        return False
    if hasattr(tensor, "elem") or hasattr(tensor, "future_dtype"):
        return False
    if tensor.dtype not in (torch.float16, torch.float32, torch.int32, torch.int8, torch.uint8, torch.bool):
        return False
    return math.prod(tensor.shape) > 1 and all(s == 0 for s, n in zip(tensor.stride(), tensor.shape, strict=True)
                                               if n > 1)


def one_value_converter():
    """``coreai_torch.TorchConverter`` whose constants of one value (:func:`is_one_value_view`) are made from that
    value; every other constant takes coreai-torch's own path."""
    import coreai._compiler._mlir_libs._coreaiIR._bindings.mlir as _mlir  # type: ignore[attr-defined]
    from coreai._compiler.dialects import coreai
    from coreai_torch import TorchConverter
    from coreai_torch._utils import get_tensor_type, validate_and_cast_numpy_array

    class OneValueConstants(TorchConverter):
        """See the module docstring. ``one_value_constants``: how many constants took the shortcut."""

        one_value_constants = 0

        def _constant_from_tensor(self, tensor):
            if not is_one_value_view(tensor):
                return super()._constant_from_tensor(tensor)
            tensor_type = get_tensor_type(tensor, self._location, dtype=tensor.dtype)
            one = tensor.detach().as_strided((1,), (1,)).contiguous().numpy()  # the one value, not the view
            attr = _mlir.dialects.coreai.create_elements_attr(self._location, tensor_type,
                                                                validate_and_cast_numpy_array(one))
            self.one_value_constants += 1
            return coreai.ConstantOp(value=attr).result

    return OneValueConstants
