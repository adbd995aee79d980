"""Errors a user can act on. Each message names the offending field, value or file and says why."""


class QfoldError(ValueError):
    """A bad input or a failed step, explained in one line fit for a CLI or a UI banner."""

class SourceError(QfoldError):
    """The model source (preset, config.json, model folder, --set override) cannot be used."""

class BuildError(QfoldError):
    """A conversion failed; the message carries the child process's last error line."""

class MilError(QfoldError):
    """A file is not a readable ML Program .mlpackage."""

class AnalysisFileError(QfoldError):
    """A stored analysis that cannot be read: not JSON, another schema version, a missing or mistyped field."""

class InterpretError(QfoldError):
    """The MIL interpreter cannot evaluate a program, an op or the inputs it was given."""

class UnknownOpError(InterpretError):
    """A program uses an op type the interpreter has no kernel for (never passed through silently)."""

class FoldError(QfoldError):
    """A package cannot be folded, or folding it would change what it computes or stores."""


class AimodelError(QfoldError):
    """A path is not a readable Core AI ``.aimodel`` asset (or Core AI itself is not installed)."""


class CoreAIRuntimeError(QfoldError):
    """Apple's Core AI runtime (always run in a child process) crashed, or was given inputs it cannot take."""


class UnsizedError(QfoldError):
    """A figure qfold could not compute (a program not sized at its shapes, a copy without a size or a verdict)
    where a complete one is required: ``--strict``, or a fit that needs the bytes per token."""


class ShapeError(QfoldError):
    """A flexible input's shape is not given and has no default, or a ``--shape`` is outside its range."""
