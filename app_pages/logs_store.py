"""A browser session's device logs kept on the server, so a reload keeps them (Streamlit's session state is new on
every reload): uploads, pastes and bench logs, whether the write-up's example is shown, and the label mapping.

A session's store is a folder named by a random token (:func:`new_token`, 128 bits) that the URL carries
(``logs=TOKEN``), under ``$QFOLD_LOG_SESSIONS`` (default ``<builds folder>/.log-sessions``). Uploaded file names are
kept as text in its ``session.json``, never used as paths: the files are ``0.bin``, ``1.bin``, … A store is written
whole into a temporary folder and renamed into place, so a reader sees the old one or the new one; stores untouched
for :data:`KEEP_DAYS` days are deleted when another is written. No Streamlit here.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.measure.logs import LogLimits

STORE_ENV = "QFOLD_LOG_SESSIONS"
KEEP_DAYS = 14
MAX_FILES = 64
MAX_TOTAL_BYTES = 4 * LogLimits().max_file_bytes  # a session's logs together; past it nothing more is kept
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_KINDS = ("uploads", "pasted", "bench")

Files = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class LogSession:
    """What a session's device logs are: its files by kind, the example shown or not, label → analysis id."""

    uploads: Files = ()
    pasted: Files = ()
    bench: Files = ()
    example: bool = True
    mapping: dict[str, str | None] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.uploads or self.pasted or self.bench or self.mapping) and self.example


def new_token() -> str:
    return secrets.token_hex(16)


def is_token(text: object) -> bool:
    return isinstance(text, str) and bool(_TOKEN.match(text))


def store_root(builds: Path) -> Path:
    return Path(os.environ.get(STORE_ENV) or builds / ".log-sessions")


def save(root: Path, token: str, session: LogSession) -> bool:
    """Write ``session`` under ``token``; False (nothing written) when it is over :data:`MAX_FILES` files or
    :data:`MAX_TOTAL_BYTES` bytes."""
    if not is_token(token):
        raise ValueError(f"not a log-session token: {token!r}")
    files = [(kind, name, data) for kind in _KINDS for name, data in getattr(session, kind)]
    if len(files) > MAX_FILES or sum(len(d) for _, _, d in files) > MAX_TOTAL_BYTES:
        return False
    root.mkdir(parents=True, exist_ok=True)
    _prune(root)
    tmp = root / f".tmp-{token}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        meta = {"example": session.example, "mapping": session.mapping,
                "files": [{"kind": kind, "name": name} for kind, name, _ in files]}
        for i, (_, _, data) in enumerate(files):
            (tmp / f"{i}.bin").write_bytes(data)
        (tmp / "session.json").write_text(json.dumps(meta), encoding="utf-8")
        old = root / f".old-{token}-{secrets.token_hex(4)}"
        final = root / token
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def load(root: Path, token: str) -> LogSession | None:
    """The session stored under ``token``; None when there is none (expired, another server) or it is unreadable."""
    if not is_token(token):
        return None
    folder = root / token
    try:
        meta = json.loads((folder / "session.json").read_text(encoding="utf-8"))
        parts: dict[str, list[tuple[str, bytes]]] = {kind: [] for kind in _KINDS}
        for i, f in enumerate(meta["files"][:MAX_FILES]):
            if f["kind"] in parts:
                parts[f["kind"]].append((str(f["name"]), (folder / f"{i}.bin").read_bytes()))
        mapping = {str(k): (str(v) if v else None) for k, v in dict(meta.get("mapping") or {}).items()}
        os.utime(folder)  # in use: kept another KEEP_DAYS
        return LogSession(*(tuple(parts[k]) for k in _KINDS), example=bool(meta.get("example", True)),
                          mapping=mapping)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _prune(root: Path) -> None:
    cutoff = time.time() - KEEP_DAYS * 86_400
    for p in root.iterdir():
        try:
            if p.is_dir() and not p.is_symlink() and p.stat().st_mtime < cutoff:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            continue
