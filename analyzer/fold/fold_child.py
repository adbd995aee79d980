"""The ``repeat_kv+fold`` build route's child process: ``python -m analyzer.fold.fold_child REQUEST.json
BUILDS_DIR``.

Folds a finished ``repeat_kv`` build (the request's spec; ``analyzer.fold.cache.build_folded``), proves the
fold in the MIL interpreter and writes the ``repeat_kv+fold`` build folder beside it, reporting to the parent as
the conversion child does (``@@qfold`` progress lines, then ``{"result": ..., "key": ...}``). The fold pass
imports coremltools, and torch with it (~6 s of CPU): in a process of its own, ``qfold build`` of every other
variant, its argument errors and its ``--help`` start without them (``analyzer.convert.launch.run_folded_build``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from analyzer import quiet_coremltools
from analyzer.convert.progress import emit, report_errors, result
from analyzer.fold.cache import build_folded
from analyzer.fsio import read_json
from analyzer.model.spec import BuildSpec


def run(request: Path, root: Path) -> int:
    spec = BuildSpec.from_json(read_json(request), str(request))
    done = build_folded(spec, root, on_progress=lambda p: emit(p.fraction, p.stage, p.message))
    result(done.key, "reused" if done.reused else "built")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m analyzer.fold.fold_child REQUEST.json BUILDS_DIR", file=sys.stderr)
        return 2
    quiet_coremltools()
    return report_errors(lambda: run(Path(argv[0]), Path(argv[1])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
