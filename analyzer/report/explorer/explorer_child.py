"""The Model Explorer process ``qfold explore`` and the dashboard start: Model Explorer's own command line, run
until its parent process ends (a dashboard stopped without cleaning up leaves no server behind).

It serves qfold's graph JSON, which the page reads itself, so Model Explorer's model converters are not loaded:
torch (its PyTorch adapter) and its native adapter package (TFLite, TF, MLIR) are kept out, which makes it
answer in ~1 s instead of ~4.5 s of imports here.

    python -m analyzer.report.explorer.explorer_child PARENT_PID MODEL_PATHS --node_data_paths=… --port=P …
"""

from __future__ import annotations

import os
import sys
import threading
import time

WATCH_S = 1.0


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(0)


def main(argv: list[str]) -> None:
    parent = int(argv[0])
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    sys.argv = ["model_explorer", *argv[1:]]
    for unused in ("torch", "ai_edge_model_explorer_adapter"):  # import of these now raises ImportError, which
        sys.modules[unused] = None  # type: ignore[assignment]   # Model Explorer takes as "not installed"
    from model_explorer import cmdline  # parses sys.argv when imported (Model Explorer's own CLI)

    cmdline.main()


if __name__ == "__main__":
    main(sys.argv[1:])
