"""MIL block helpers a graph rewrite needs: a block's inputs as a list, and removing ops once nothing reads them."""

from __future__ import annotations

from coremltools.converters.mil.mil import Block, Operation, Var


def block_inputs(block: Block) -> list[Var]:
    inputs = block.inputs
    return list(inputs.values()) if isinstance(inputs, dict) else list(inputs)


def remove_dead(block: Block, ops: list[Operation]) -> None:
    """Remove the given ops (and the constants only they read) once nothing reads them, latest first."""
    pending = list(ops)
    changed = True
    while changed:
        changed = False
        for op in list(reversed(pending)):
            if op.enclosing_block is None:
                pending.remove(op)
                continue
            if any(o.child_ops or o in block.outputs for o in op.outputs):
                continue
            producers = [v.op for v in op.inputs.values() if isinstance(v, Var) and v.op is not None]
            producers += [x.op for v in op.inputs.values() if isinstance(v, (list, tuple)) for x in v
                          if x.op is not None]
            block.remove_ops([op])
            pending.remove(op)
            changed = True
            for p in producers:
                if p.op_type == "const" and p not in pending:
                    pending.append(p)
