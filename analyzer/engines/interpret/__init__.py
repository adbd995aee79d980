"""A NumPy interpreter of ML Program packages: qfold's Linux stand-in for Core ML's ``predict``.

Public API (stable; the fold pass and the ``run`` CLI use it):

    load_interpreter(path, function=None) -> Interpreter
        path: an .mlpackage or a build folder holding one; function: default "main" (multi-function packages).
        Raises MilError (unreadable package) or UnknownOpError (an op type with no kernel, named with its op).
    Interpreter.run(inputs: dict[str, np.ndarray], states: dict[str, np.ndarray] | None = None) -> RunResult
        inputs are cast to the declared dtypes; missing / extra / wrong-shape inputs raise InterpretError.
        States start at zero unless given. RunResult(outputs: dict[name, array], states: dict[name, array]).
    Interpreter.inputs / .states / .outputs (TensorInfo tuples), .constant(name), .constant_names()
    decode_steps(interp, steps, roles=None, seed=0, tokens=None, states=None) -> DecodeRun
        N decode steps from position 0: seeded random token ids (or ``tokens``), matching positions and causal
        masks, states from zero, a host cache for KV inputs. roles=None infers them for qfold's own builds and
        raises InterpretError otherwise. DecodeRun(outputs: list[dict], states, tokens [steps, Q], roles,
        random_inputs: dict name → the seeded value given to every input no role names).
    decode_feeds(interp, steps, roles=None, seed=0) -> list[dict]: the inputs of those steps, nothing run
    infer_roles(interp) -> InputRoles | None;  load_roles(json_path) / roles_from_json(dict) -> InputRoles
    max_abs_diff(run_a, run_b) -> dict[output or state name, float]

Precision: values between ops are held in the program's own dtypes (fp16 in an fp16 graph). Each op computes at
fp32 or better (matmul / linear / conv / einsum accumulate in fp32 via BLAS; sums, means, softmax and norms
accumulate in fp32) and its result is rounded once to the dtype the program declares for that op's output.
Weights are memory-mapped from weight.bin and widened to fp32 block by block at use, never all at once
(with torch's vectorized fp16 → fp32 conversion when torch is installed, once a process has widened
512 Mi elements or imported torch anyway: exact, 8x NumPy's cast loop here);
constexpr_* (compressed) weights are decompressed once, on first use, and cached. Loading a program sets
glibc's malloc to reuse freed memory (process-wide; see program._reuse_freed_memory).
"""

from analyzer.engines.interpret.executor import Interpreter, RunResult, load_interpreter
from analyzer.engines.interpret.registry import KERNELS, register, supported_op_types
from analyzer.engines.interpret.roles import (
    DecodeRun,
    InputRoles,
    KvInput,
    decode_feeds,
    decode_steps,
    infer_roles,
    load_roles,
    max_abs_diff,
    roles_from_json,
)

__all__ = [
    "KERNELS", "DecodeRun", "InputRoles", "Interpreter", "KvInput", "RunResult", "decode_feeds",
    "decode_steps", "infer_roles",
    "load_interpreter", "load_roles", "max_abs_diff", "register", "roles_from_json", "supported_op_types",
]
