"""coremltools' pass pipelines without the work that cannot change the program they make: one whole-program
validation instead of one per pass, no program text for debug logs nobody prints, no propagation of sets that are
empty and stay empty. About half of a small conversion's CPU (tests/test_convert_step.py: the same program, byte for
byte). Light on purpose (coremltools is imported when a context is entered): ``analyzer.convert.compress`` uses it
without importing torch.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager


@contextmanager
def validated_once():
    """coremltools' pass pipelines validate the whole program after every pass (``PassPipelineManager.
    apply_pipeline``: ~110 validations per conversion, a third of a 70B conversion's time in
    bench/results/profile_build.json). Inside this context ``Program.validate`` checks only what coremltools
    checks beyond structure, where it does (after ``common::dead_code_elimination``: every op keeps its essential
    scopes, ``Function._check_has_scope_info``); the caller validates the finished program once. Validation only
    reads the program, so the program is the same; a pass that broke its structure is reported at the end instead
    of at that pass. A conversion to a package validates the finished program inside the context too: right
    before it is serialised (``_check_early_error_out_for_invalid_program``, which ``mil_convert_to_proto`` calls
    once, after the backend pipeline)."""
    from coremltools.converters.mil.mil.program import Program

    original, original_check = Program.validate, Program._check_early_error_out_for_invalid_program

    def validate(self, check_essential_scope: bool = False) -> None:
        if check_essential_scope:  # that part alone (``Function._check_has_scope_info``); the structure at the end
            for function in self.functions.values():
                function._check_has_scope_info()

    def check(self) -> None:
        original(self)
        original_check(self)

    Program.validate, Program._check_early_error_out_for_invalid_program = validate, check
    try:
        yield
    finally:
        Program.validate, Program._check_early_error_out_for_invalid_program = original, original_check


@contextmanager
def quick_passes():
    """coremltools' pass pipeline without three kinds of work that cannot change the program it makes (the same
    ``model.mlmodel`` program, tests/test_convert_step.py), about half of a 2-layer conversion's CPU:

    * whole-program validation after every pass (``validated_once``);
    * the program's text for ``logger.debug`` f-strings (``PassPipelineManager.apply_pipeline`` before and after
      each pipeline, ``reduce_transposes`` per block), built whether or not DEBUG is on: while coremltools' logger
      is below DEBUG, ``str()`` of a program or block says it was not printed;
    * the non-replaceable-var propagation at every block exit (``Block._propagate_nonreplaceable_vars``, rerun
      after each pass): it unions each var's upstream ``constexpr_*`` vars, so in a function block with no
      ``constexpr_*`` op, no nested block and every output's set already empty (no compression yet) it would
      set every set to the empty set it already is; any other block is propagated as ever.

    The shortcuts are class attributes, so they hold process-wide while the context is open: another thread's
    conversion in that window makes the same program too (only its debug text and its structure errors move)."""
    from coremltools.converters.mil.mil.block import Block, Function
    from coremltools.converters.mil.mil.program import Program

    logger = logging.getLogger("coremltools")
    texts = {cls: cls.__dict__["__str__"] for cls in (Program, Block, Function)}
    propagate = Block._propagate_nonreplaceable_vars

    def text(original):
        def __str__(self, *args, **kwargs) -> str:
            if logger.isEnabledFor(logging.DEBUG):
                return original(self, *args, **kwargs)
            return f"<{type(self).__name__}: text not built (coremltools' logger is below DEBUG)>"
        return __str__

    def propagate_if_needed(self) -> None:
        if _may_hold_sets(self):
            propagate(self)

    for cls, original in texts.items():
        cls.__str__ = text(original)
    Block._propagate_nonreplaceable_vars = propagate_if_needed
    try:
        with validated_once():
            yield
    finally:
        for cls, original in texts.items():
            cls.__str__ = original
        Block._propagate_nonreplaceable_vars = propagate


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
