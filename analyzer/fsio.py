"""Files qfold writes and reads back, and the folders a shared dashboard may read.

* Atomic JSON writes: other processes read while we write.
* Strict JSON reads: NaN/Infinity refused naming the field, nesting and size bounded, every failure one line
  naming the file — never a traceback. Configs, analyses and caches all go through :func:`loads_strict`.
* Bounded reads: a file is opened without blocking and refused unless it is a regular file (a FIFO, device or
  socket would hang or stream forever), its size is checked before a byte is read, and integers in JSON are
  parsed with a digit limit (Python refuses > 4,300 digits with a bare ValueError; far fewer are ours).
* Trees that are inputs stay inputs: :func:`check_disjoint` refuses an output inside, around or equal to an
  input; :func:`copy_file` copies (or reflinks) — never hard-links — so editing one output cannot change
  another file.
* Data roots: a dashboard shared by a team must not let a visitor probe the server's files through its "local
  folder" and "existing .mlpackage" fields: such paths are accepted only under the roots in
  ``$QFOLD_DATA_ROOTS`` (``os.pathsep``-separated; default: the home directory of the user running qfold, which
  is the machine's owner when it listens on localhost as it does by default; the Docker image sets ``/data``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError

DATA_ROOTS_ENV = "QFOLD_DATA_ROOTS"
# A full-size analysis is ~1 MB (analyzer/shipped: 30 layers); 32 MiB holds a 900-layer one, and parsing it
# stays well under 1 GB (Python objects take ~10-20x the JSON text).
MAX_JSON_BYTES = 32 << 20
# Counts, byte sizes and shapes are below 2**64 (20 digits); 32 leaves room without letting a 4,300-digit
# integer reach int() (a bare ValueError) or arithmetic.
MAX_INT_DIGITS = 32
_MAX_INT_BITS = int(MAX_INT_DIGITS * math.log2(10))  # 106 bits: every int of 32 digits fits
_LONG_NUMBER = re.compile(rf"\d{{{MAX_INT_DIGITS + 1}}}|[eE][+-]?\d{{3}}")
# qfold's own files nest < 10 levels (an analysis: ops → inputs → tensor → shape); configs a few.
MAX_JSON_DEPTH = 64


def write_json_atomic(path: Path, obj: Any, compact: bool = False) -> None:
    """Write JSON beside ``path`` and rename it into place, so readers in other processes never see a
    half-written file (nor a leftover temp file when the write fails)."""
    write_text_atomic(path, json.dumps(obj, separators=(",", ":") if compact else None, allow_nan=False))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` beside ``path`` and rename it into place (no leftover temp file when the write fails)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ bounded reads
def file_kind(mode: int) -> str:
    """What kind of file a mode is, for a message."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "of an unknown kind"


def _kind_of(path: Path) -> str | None:
    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return None


def open_regular(path: Path, error: type[QfoldError] = QfoldError) -> int:
    """A file descriptor of ``path`` opened for reading, refused (``error`` naming the file) unless it is a
    regular file. Opened non-blocking, so a FIFO without a writer cannot hang the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except RuntimeError:
        raise error(f"{path}: cannot read (a symbolic link loop)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{path}: cannot read (a symbolic link loop)") from e
        kind = _kind_of(path) if e.errno == errno.ENXIO else None  # a socket cannot be opened: say what it is
        if kind is not None:
            raise error(f"{path}: {kind}, not a regular file") from None
        raise error(f"{path}: cannot read ({e.strerror or e})") from e
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path}: {file_kind(mode)}, not a regular file")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def read_bytes_bounded(path: Path, max_bytes: int, error: type[QfoldError] = QfoldError) -> bytes:
    """A regular file's bytes, its size checked before any is read (``error`` naming the file otherwise)."""
    fd = open_regular(Path(path), error)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise error(f"{path}: {size:,} bytes, more than the {max_bytes:,} this file may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(size + 1)  # read(n) allocates n bytes first: never the ceiling itself (1 GiB for a proto)
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from e
    finally:
        os.close(fd)
    if len(data) > max(size, max_bytes):  # it grew while we read
        raise error(f"{path}: more than the {max_bytes:,} bytes this file may have")
    return data


# ------------------------------------------------------------------------------------------------ trees
FICLONE = 0x40049409  # linux/fs.h _IOW(0x94, 9, int): share the source's blocks (btrfs, XFS); else a real copy


def resolved(path: Path, error: type[QfoldError] = QfoldError) -> Path:
    """``path`` with every symbolic link followed (it need not exist); a link loop is ``error``."""
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # Python 3.11 raises RuntimeError for a loop
        raise error(f"{path}: cannot resolve it (a symbolic link loop?): {e}") from None


def check_disjoint(src: Path, dst: Path, error: type[QfoldError] = QfoldError) -> tuple[Path, Path]:
    """(src, dst) resolved, refused when writing ``dst`` could touch ``src``: the same path, ``dst`` inside
    ``src`` (it would be written into the input) or ``src`` inside ``dst`` (replacing ``dst`` deletes it)."""
    rs, rd = resolved(src, error), resolved(dst, error)
    if rs == rd:
        raise error(f"{dst}: the output would overwrite the input {src}")
    if rs in rd.parents:
        raise error(f"{dst}: the output lies inside the input {src} (resolved: {rd}); it would modify the input")
    if rd in rs.parents:
        raise error(f"{dst}: the input {src} lies inside the output (resolved: {rs}); replacing the output "
                    "would delete the input")
    return rs, rd


def tree_files(root: Path, error: type[QfoldError] = QfoldError, what: str = "folder") -> list[Path]:
    """Every regular file under ``root`` (relative paths, sorted), read without leaving it: a symbolic link is
    followed only to a regular file inside ``root``; one that leaves it, loops, dangles or names a folder is
    ``error`` naming the entry, and so is a FIFO, socket or device."""
    base = resolved(root, error)
    out: list[Path] = []
    stack = [Path(root)]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            raise error(f"{folder}: cannot list it ({e.strerror or e})") from e
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(root)
            if entry.is_symlink():
                target = resolved(path, error)
                if base not in target.parents:
                    raise error(f"{path}: a symbolic link to {target}, outside the {what}; refused")
                if not target.is_file() or target.is_symlink():
                    raise error(f"{path}: a symbolic link to {target}, not to a regular file in the {what}")
                out.append(rel)
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                stack.append(path)
            elif stat.S_ISREG(mode):
                out.append(rel)
            else:
                raise error(f"{path}: {file_kind(mode)} in the {what}; refused")
    return sorted(out)


def copy_file(src: Path, dst: Path, error: type[QfoldError] = QfoldError) -> None:
    """Copy a regular file to a new ``dst`` (never a hard link: writing one must not change the other); the
    blocks are shared (reflink) where the file system can, copied in the kernel otherwise."""
    fd_in = open_regular(src, error)
    try:
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.ioctl(fd_out, FICLONE, fd_in)
                return
            except OSError:
                pass
            size = os.fstat(fd_in).st_size
            try:
                while size > 0 and (n := os.copy_file_range(fd_in, fd_out, min(size, 1 << 30))) > 0:
                    size -= n
            except OSError:  # another file system, an old kernel: plain reads and writes
                os.lseek(fd_in, 0, os.SEEK_SET)
                os.ftruncate(fd_out, 0)
                os.lseek(fd_out, 0, os.SEEK_SET)
                with os.fdopen(fd_in, "rb", closefd=False) as fi, os.fdopen(fd_out, "wb", closefd=False) as fo:
                    shutil.copyfileobj(fi, fo, 1 << 24)
        finally:
            os.close(fd_out)
    except OSError as e:
        raise error(f"cannot copy {src} to {dst}: {e.strerror or e}") from e
    finally:
        os.close(fd_in)


def copy_tree(src: Path, dst: Path, error: type[QfoldError] = QfoldError, what: str = "folder") -> None:
    """Copy the files :func:`tree_files` lists into a new folder ``dst`` (symbolic links become the regular
    files they name, inside ``src`` only)."""
    files = tree_files(src, error, what)
    Path(dst).mkdir(parents=True)
    for rel in files:
        (Path(dst) / rel).parent.mkdir(parents=True, exist_ok=True)
        copy_file(Path(src) / rel, Path(dst) / rel, error)


def replace_dir(tmp: Path, dst: Path) -> None:
    """Move the finished folder ``tmp`` to ``dst``; an existing ``dst`` is moved aside first and removed after,
    so ``dst`` is never half-written."""
    old = None
    if dst.exists():
        old = dst.with_name(f".old-{os.getpid()}-{dst.name}")
        os.replace(dst, old)
    os.replace(tmp, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class _NonFinite:
    """Stands in for a NaN/Infinity literal (or a number too large for a float) while parsing, so the refusal
    can name where it was."""

    def __init__(self, literal: str):
        self.literal = literal


class IntegerTooLongError(ValueError):
    """A JSON integer longer than ``MAX_INT_DIGITS`` digits (raised while parsing)."""

    def __init__(self, digits: int):
        super().__init__(f"an integer of {digits:,} digits (more than the {MAX_INT_DIGITS} accepted)")


def bounded_int(text: str) -> int:
    """``int(text)`` for a JSON integer literal, refusing more than ``MAX_INT_DIGITS`` digits."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise IntegerTooLongError(digits)
    return int(text)


def _finite_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(f"{text[:12]}… (too large for a float)")


def _clean(value: Any, max_depth: int) -> bool:
    """Whether ``value`` certainly passes :func:`check_structure`, found without naming any field: an analysis
    holds ~10^5 values, and naming each one's path as it is visited took most of the check's time. Anything this
    walk does not know for certain (a violation, a type it does not list) sends the caller to the full check."""
    if max_depth < 1:
        return False
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        kind = type(v)
        if kind is dict:
            children = v.values()
        elif kind is list:
            children = v
        else:
            children = (v,) if depth == 1 else ()  # a scalar document; nested scalars are checked below
        if depth == max_depth and kind in (dict, list) and children:
            return False  # its members would be nested deeper than max_depth
        for x in children:
            k = type(x)
            if k is str or k is bool or x is None:
                continue
            if k is dict or k is list:
                stack.append((x, depth + 1))
                continue
            if k is int:
                if x.bit_length() > _MAX_INT_BITS:
                    return False
            elif k is float:
                if not math.isfinite(x):
                    return False
            else:
                return False
    return True


def check_structure(value: Any, where: str, max_depth: int = MAX_JSON_DEPTH,
                    error: type[QfoldError] = QfoldError) -> None:
    """Refuse NaN/Infinity and integers of more than ``MAX_INT_DIGITS`` digits (naming the field), and nesting
    deeper than ``max_depth``: for values parsed by another reader (TOML) as for JSON."""
    if _clean(value, max_depth):
        return
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        v, path, depth = stack.pop()
        if depth > max_depth:
            raise error(f"{where}: nested deeper than {max_depth} levels")
        field = f"field {path}" if path else "the value"
        if isinstance(v, _NonFinite) or (isinstance(v, float) and not math.isfinite(v)):
            raise error(f"{where}: {field} is {getattr(v, 'literal', v)}; only finite numbers are accepted")
        if isinstance(v, int) and v.bit_length() > _MAX_INT_BITS:
            raise error(f"{where}: {field} is an integer of more than {MAX_INT_DIGITS} digits")
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k), depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))


def loads_strict(text: str, where: str, max_depth: int = MAX_JSON_DEPTH,
                 error: type[QfoldError] = QfoldError) -> Any:
    """Parse JSON text strictly; ``json.JSONDecodeError`` passes through for callers that fall back to text."""
    # The number hooks run in Python for every number; they can only act on a run of more than MAX_INT_DIGITS
    # digits or an exponent of 3 digits or more (a float past 1e308). Text with neither parses without them.
    hooks = {"parse_int": bounded_int, "parse_float": _finite_float} if _LONG_NUMBER.search(text) else {}
    try:
        value = json.loads(text, parse_constant=_NonFinite, **hooks)
    except RecursionError:
        raise error(f"{where}: nested deeper than {max_depth} levels") from None
    except IntegerTooLongError as e:
        raise error(f"{where}: {e}") from None
    check_structure(value, where, max_depth, error)
    return value


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES, error: type[QfoldError] = QfoldError,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a UTF-8 JSON file strictly (no NaN/Infinity, bounded size and depth); every failure is ``error``
    naming the file."""
    data = read_bytes_bounded(Path(path), max_bytes, error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from e
    try:
        return loads_strict(text, str(path), max_depth, error)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e


def data_roots() -> tuple[Path, ...]:
    """The folders user-typed paths may point into (resolved)."""
    text = os.environ.get(DATA_ROOTS_ENV)
    roots = [Path(p).expanduser() for p in text.split(os.pathsep) if p.strip()] if text else [Path.home()]
    return tuple(r.resolve() for r in roots)


def path_under_roots(text: str, roots: tuple[Path, ...] | None = None) -> Path:
    """``text`` as a resolved path (symlinks followed) if it lies under one of the data roots, else a
    QfoldError that says nothing about whether the path exists."""
    roots = data_roots() if roots is None else roots
    if "\0" in text:
        raise QfoldError("a path cannot contain a NUL character")
    try:
        path = Path(text.strip()).expanduser().resolve()
    except (RuntimeError, OSError):  # ~nosuchuser (no such home directory), a symbolic link loop
        raise QfoldError(f"{text.strip()}: cannot resolve it (an unknown ~user or a symbolic link loop)") from None
    if not any(path == r or r in path.parents for r in roots):
        names = ", ".join(str(r) for r in roots) or "none"
        raise QfoldError(f"{text.strip()}: outside the folders this server may read ({DATA_ROOTS_ENV}: {names})")
    return path
