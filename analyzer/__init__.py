"""qfold's analysis core: model source → decode variant → Core ML build → MIL walk → bytes → A/B diff.

This package never imports streamlit; the dashboard (app.py, app_pages/) and the CLI
(``qfold``) are thin shells over it.
"""
import logging

__version__ = "0.1.0"


def quiet_coremltools() -> None:
    """Silence coremltools' import-time warnings that say nothing a qfold user can act on: on Linux it
    logs one "Failed to load _ML...Proxy" per Core ML runtime class (there is no runtime here, which the
    UI states once) and that torch 2.13 is newer than it was tested with (docs/measurements.md: it works). Also
    torchao's (coreai-opt's dependency, which coremltools and transformers import whenever it is installed): one
    "Failed to load …so" per CUDA kernel library a CPU machine lacks, and torch's pytree note on its enum."""

    logging.getLogger("coremltools").setLevel(logging.ERROR)
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
