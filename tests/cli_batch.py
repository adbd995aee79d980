"""Run many ``python -m analyzer`` invocations in ONE child process (importing torch and transformers once
costs ~3 s; a corpus of bad inputs would pay it per case). Each case goes through ``analyzer.cli.main``
exactly as the command line does; anything but a clean exit is reported with its traceback.

stdin: a JSON list of ``{"argv": [...], "env": {...}}``; stdout: a JSON list of
``{"code": int, "stdout": str, "stderr": str, "traceback": str | null}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback


def run_case(argv: list[str], env: dict[str, str]) -> dict:
    from analyzer.cli import main

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    out, err = io.StringIO(), io.StringIO()
    tb = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # what a user would see as a traceback
        code, tb = -1, traceback.format_exc()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "traceback": tb}


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    json.dump([run_case(c["argv"], c.get("env", {})) for c in cases], sys.stdout)
