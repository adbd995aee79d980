"""coremltools' pass pipelines without the work that cannot change the program they make: one whole-program
validation instead of one per pass, no program text for debug logs nobody prints, no propagation of sets that are
empty and stay empty. About half of a small conversion's CPU.

Proven per kind of build: the patched and unpatched conversions save byte-identical packages (the same
``Model.proto``, the same weight files) for compressed (palettized, int8, per-block LUTs), prefill, decode+prefill
multi-function, KV-as-input builds and a 2-layer build of every preset family (tests/test_quick_passes_kinds.py; the
whole matrix with ``QFOLD_EXTENDED=1``). The shortcuts replace private coremltools attributes, so they are installed
only on the coremltools versions they were proven on (:data:`PROVEN_ON`); on any other the pipelines run as
coremltools ships them, and one line says so. ``QFOLD_QUICK_PASSES=0`` turns them off (to compare).

Installing is reference-counted under a lock: the first context to open installs, the last to close restores, so
two threads' conversions that overlap never leave the patch installed nor remove it under each other. Light on
purpose (coremltools is imported when a context is entered): ``analyzer.convert.compress`` uses it without importing
torch.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager

PROVEN_ON = ("9.0",)  # coremltools versions the shortcuts were proven on (tests/test_quick_passes_kinds.py)
SWITCH_ENV = "QFOLD_QUICK_PASSES"  # "0": coremltools' pipelines as shipped (read at each conversion)

_LOCK = threading.Lock()
_USERS = 0  # contexts open now, in every thread
_RESTORE: list[Callable[[], None]] = []  # how to put coremltools back, while installed
_SAID: set[str] = set()


def shortcuts_apply() -> bool:
    """Whether conversions take the shortcuts: on unless ``QFOLD_QUICK_PASSES=0``, and only on a coremltools of
    :data:`PROVEN_ON` that has every attribute they replace (else off, with one line on stderr, once)."""
    if os.environ.get(SWITCH_ENV) == "0":
        return False
    import coremltools
    from coremltools.converters.mil.mil.block import Block, Function
    from coremltools.converters.mil.mil.program import Program

    version = getattr(coremltools, "__version__", "?")
    missing = [f"{cls.__name__}.{name}" for cls, name in (
        (Program, "validate"), (Program, "_check_early_error_out_for_invalid_program"),
        (Block, "_check_has_scope_info"), (Block, "_propagate_nonreplaceable_vars"),
        (Program, "__str__"), (Block, "__str__"), (Function, "__str__")) if name not in vars(cls)]
    why = (f"coremltools {version} is not one the conversion shortcuts were proven on ({', '.join(PROVEN_ON)})"
           if version not in PROVEN_ON else
           f"coremltools {version} lacks {', '.join(missing)}" if missing else "")
    if why and why not in _SAID:
        _SAID.add(why)
        print(f"qfold: {why}: its pass pipelines run as shipped (slower, the same packages)", file=sys.stderr,
              flush=True)
    return not why


@contextmanager
def quick_passes():
    """coremltools' pass pipeline without three kinds of work that cannot change the program it makes (the same
    package, byte for byte: tests/test_quick_passes_kinds.py), about half of a 2-layer conversion's CPU:

    * whole-program validation after every pass (``PassPipelineManager.apply_pipeline``: ~110 validations per
      conversion, a third of a 70B conversion's time in bench/results/profile_build.json): ``Program.validate``
      checks only what coremltools checks beyond structure, where it does (after ``common::dead_code_elimination``:
      every op keeps its essential scopes, ``Function._check_has_scope_info``); the finished program is validated
      once, right before it is serialised (``_check_early_error_out_for_invalid_program``, which
      ``mil_convert_to_proto`` calls once, after the backend pipeline) or by the caller. Validation only reads the
      program; a pass that broke its structure is reported at the end instead of at that pass;
    * the program's text for ``logger.debug`` f-strings (``apply_pipeline`` before and after each pipeline,
      ``reduce_transposes`` per block), built whether or not DEBUG is on: while coremltools' logger is below
      DEBUG, ``str()`` of a program or block says it was not printed;
    * the non-replaceable-var propagation at every block exit (``Block._propagate_nonreplaceable_vars``, rerun
      after each pass): it unions each var's upstream ``constexpr_*`` vars, so in a function block with no
      ``constexpr_*`` op, no nested block and every output's set already empty (no compression yet) it would
      set every set to the empty set it already is; any other block is propagated as ever.

    The shortcuts are class attributes, so they hold process-wide while any context is open: another thread's
    conversion in that window makes the same program too (only its debug text and its structure errors move).
    Where they do not apply (:func:`shortcuts_apply`) the context does nothing."""
    if not shortcuts_apply():
        yield
        return
    _enter()
    try:
        yield
    finally:
        _leave()


def _enter() -> None:
    global _USERS
    with _LOCK:
        if _USERS == 0:
            _RESTORE[:] = _install()
        _USERS += 1


def _leave() -> None:
    global _USERS
    with _LOCK:
        _USERS -= 1
        if _USERS == 0:
            for restore in reversed(_RESTORE):
                restore()
            _RESTORE.clear()


def _install() -> list[Callable[[], None]]:
    """Replace the attributes; returns how to put each back."""
    from coremltools.converters.mil.mil.block import Block, Function
    from coremltools.converters.mil.mil.program import Program

    restore: list[Callable[[], None]] = []

    def replace(cls, name: str, new) -> None:
        old = vars(cls)[name]
        setattr(cls, name, new)
        restore.append(lambda: setattr(cls, name, old))

    validate, check = Program.validate, Program._check_early_error_out_for_invalid_program

    def only_scopes(self, check_essential_scope: bool = False) -> None:
        if check_essential_scope:  # that part alone (``Function._check_has_scope_info``); the structure at the end
            for function in self.functions.values():
                function._check_has_scope_info()

    def validate_then_check(self) -> None:
        validate(self)
        check(self)

    replace(Program, "validate", only_scopes)
    replace(Program, "_check_early_error_out_for_invalid_program", validate_then_check)

    logger = logging.getLogger("coremltools")

    def text(original):
        def __str__(self, *args, **kwargs) -> str:
            if logger.isEnabledFor(logging.DEBUG):
                return original(self, *args, **kwargs)
            return f"<{type(self).__name__}: text not built (coremltools' logger is below DEBUG)>"
        return __str__

    for cls in (Program, Block, Function):
        replace(cls, "__str__", text(vars(cls)["__str__"]))

    propagate = Block._propagate_nonreplaceable_vars

    def propagate_if_needed(self) -> None:
        if _may_hold_sets(self):
            propagate(self)

    replace(Block, "_propagate_nonreplaceable_vars", propagate_if_needed)
    return restore


def _may_hold_sets(block) -> bool:
    """Whether propagating ``block`` could give any var a set other than the empty one it has: a nested block, a
    ``constexpr_*`` op or a set already non-empty. Plain loops: this runs over every op at every block exit."""
    if block.outer_op is not None:
        return True
    for op in block.operations:
        if op.blocks or op.op_type.startswith("constexpr_"):
            return True
        for o in op._output_vars or ():
            if o._nonreplaceable_vars_upstream:
                return True
    return False
