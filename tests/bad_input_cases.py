"""The bad-input corpus of issue #24, made on disk: every case is a CLI invocation on a file broken one way, with
the exit code and the one error line it must give (tests/test_bad_inputs.py runs them through tests/cli_batch.py).

Inputs live under ``root/in`` (the test checks that no command modified or deleted any of them); outputs and
builds folders go to ``root/out``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tests.bad_input_packages import (
    S,
    blob_offset,
    const_count_mismatch,
    drop_outputs,
    edit_spec,
    gqa_package,
    huge_input,
    linear_package,
    unknown_feature_dtype,
    unknown_output_dtype,
    weight_path,
)

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "analyzer" / "shipped" / "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json"
BIG_INT = "9" * 5000  # past Python's 4,300-digit int() limit


@dataclass(frozen=True)
class Case:
    argv: list[str]
    code: int
    regex: str  # one stderr line must match it
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    max_lines: int = 1  # fit adds its summary line after the file's own
    without: tuple[str, ...] = ()  # modules the case's Python lacks (tests/cli_batch.py)

    def batch_item(self) -> dict:
        item: dict = {"argv": self.argv, "env": self.env, "without": list(self.without)}
        if self.timeout_s is not None:
            item["timeout_s"] = self.timeout_s
        return item


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SILENT_LISTENERS: list[socket.socket] = []  # open for as long as the process that made the corpus runs


def silent_port() -> int:
    """A port that accepts connections (the kernel completes them into the backlog) and never sends a byte: a Ray
    head that hangs."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    SILENT_LISTENERS.append(s)
    return s.getsockname()[1]


def _socket_file(path: Path) -> str:
    """A Unix socket's file at ``path`` (bound from its folder: a socket path may have at most 107 bytes)."""
    cwd = os.getcwd()
    os.chdir(path.parent)
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path.name)
    finally:
        os.chdir(cwd)
    return str(path)


def _padded_member(path: Path) -> str:
    """An .npz whose member 'k' has the header the program declares ([1, 2, 16, 8] fp16: 512 bytes) and 16 KiB
    more bytes after them: its uncompressed size, not its header, is what is too big."""
    with zipfile.ZipFile(path, "w") as z, z.open("k.npy", "w") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f2", "fortran_order": False, "shape": (1, 2, S, 8)})
        f.write(bytes(512 + (16 << 10)))
    return str(path)


def _npz(path: Path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


def _feed(pkg_dir: Path, name: str, **override) -> str:
    arrays = {"input_ids": np.array([[3]], np.int32), "current_pos": np.array([0], np.int32),
              "causal_mask": np.zeros((1, 1, 1, S), np.float16), "k": np.zeros((1, 2, S, 8), np.float16),
              "v": np.zeros((1, 2, S, 8), np.float16)}
    arrays.update(override)
    return _npz(pkg_dir / f"{name}.npz", **arrays)


def _bomb(path: Path) -> str:
    """An .npz whose one member declares 4 GiB of int32 (and stores 64 MiB of zeros, deflated to ~64 kB)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open("input_ids.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<i4", "fortran_order": False, "shape": (1 << 30,)})
        for _ in range(4):
            f.write(bytes(1 << 24))
    return str(path)


def _sparse(path: Path, size: int, head: bytes = b"") -> str:
    with path.open("wb") as f:
        f.write(head)
        f.truncate(size)
    return str(path)


def build_cases(root: Path) -> dict[str, Case]:
    inp, out = root / "in", root / "out"
    inp.mkdir()
    out.mkdir()
    builds = str(out / "builds")
    gqa = Path(gqa_package(inp / "gqa.mlpackage"))
    lin = Path(linear_package(inp / "lin.mlpackage"))
    spec = inp / "spec.json"
    spec.write_text(json.dumps({"token_ids": "input_ids", "position": "current_pos", "causal_mask": "causal_mask",
                                "vocab_size": 32}))

    def broken(src: Path, name: str, edit=None) -> Path:
        pkg = inp / f"{name}.mlpackage"
        shutil.copytree(src, pkg)
        if edit is not None:
            edit_spec(pkg, edit)
        return pkg

    def fold(src, dst, *extra) -> list[str]:
        return ["fold", str(src), str(dst), "--builds-dir", builds, *extra]

    def run(pkg, *extra) -> list[str]:
        return ["run", str(pkg), "--out", str(out / "o.npz"), "--input-spec", str(spec), *extra]

    cases: dict[str, Case] = {}
    # ---- 1. outputs never touch inputs
    cases["fold:out-inside-in"] = Case(fold(gqa, gqa / "x.mlpackage"), 1, r"gqa.mlpackage/x.mlpackage: the output "
                                       r"lies inside the input .*it would modify the input")
    outer = inp / "outer.mlpackage"
    outer.mkdir()
    shutil.copytree(gqa, outer / "in.mlpackage")
    cases["fold:in-inside-out"] = Case(fold(outer / "in.mlpackage", outer), 1,
                                       r"outer.mlpackage: the input .* lies inside the output .*would delete the input")
    (inp / "link.mlpackage").symlink_to(gqa)
    cases["fold:out-is-in-through-a-link"] = Case(fold(inp / "link.mlpackage", gqa), 1,
                                                  r"gqa.mlpackage: the output would overwrite the input")
    (inp / "file.mlpackage").write_text("a file, not a package\n")
    cases["fold:out-is-a-file"] = Case(fold(gqa, inp / "file.mlpackage"), 1,
                                       r"file.mlpackage: exists and is not a package folder \(a regular file\)")
    (inp / "folder.mlpackage").mkdir()
    (inp / "folder.mlpackage" / "notes.txt").write_text("mine\n")
    cases["fold:out-is-a-non-package-folder"] = Case(fold(gqa, inp / "folder.mlpackage"), 1,
                                                     r"folder.mlpackage: an existing folder without Manifest.json")
    secret = inp / "secret.txt"
    secret.write_text("not to be copied\n")
    leak = broken(gqa, "leak")
    (leak / "Data" / "secret.txt").symlink_to(secret)
    cases["fold:link-out-of-the-package"] = Case(fold(leak, out / "leak-out.mlpackage"), 1,
                                                 r"leak.mlpackage/Data/secret.txt: a symbolic link to .*secret.txt, "
                                                 r"outside the package; refused")
    loop = broken(gqa, "loop")
    (loop / "Data" / "loopy").symlink_to("loopy")
    cases["fold:link-loop-in-the-package"] = Case(fold(loop, out / "loop-out.mlpackage"), 1,
                                                  r"loop.mlpackage/Data/loopy: cannot resolve it \(a symbolic link "
                                                  r"loop")
    weights_out = broken(lin, "weights-link")
    os.replace(weight_path(weights_out), inp / "weight.bin")
    weight_path(weights_out).symlink_to(inp / "weight.bin")
    cases["inspect:weights-link-out"] = Case(["inspect", str(weights_out), "--json"], 1,
                                             r"blob file .* points outside the package")
    cases["fold:input-spec-is-a-folder"] = Case(fold(gqa, out / "a.mlpackage", "--input-spec", str(inp)), 1,
                                                r"in: a folder, not a regular file")
    cases["fold:input-spec-missing"] = Case(fold(gqa, out / "a.mlpackage", "--input-spec", str(inp / "no.json")), 1,
                                            r"no.json: cannot read \(No such file or directory\)")
    cases["fold:builds-dir-is-a-file"] = Case(["fold", str(gqa), str(out / "b.mlpackage"), "--builds-dir",
                                               str(secret)], 1, r"secret.txt: the builds folder is not a folder")
    cases["builds:builds-dir-is-a-file"] = Case(["builds", "--builds-dir", str(secret)], 1,
                                                r"secret.txt: the builds folder is not a folder")
    elsewhere = inp / "elsewhere.analysis.json"
    shutil.copyfile(SHIPPED, elsewhere)
    (out / "builds").mkdir()
    (out / "builds" / "linked.analysis.json").symlink_to(elsewhere)
    cases["reanalyze:link-out-of-the-builds-folder"] = Case(
        ["reanalyze", str(out / "builds" / "linked.analysis.json"), "--builds-dir", builds], 1,
        r"linked.analysis.json: reached through a symbolic link to .*elsewhere.analysis.json, outside the builds "
        r"folder")
    # ---- 2. readers bounded before they allocate
    fifo_pkg = broken(lin, "fifo")
    weight_path(fifo_pkg).unlink()
    os.mkfifo(weight_path(fifo_pkg))
    cases["inspect:weight-bin-is-a-fifo"] = Case(["inspect", str(fifo_pkg), "--json"], 1,
                                                 r"weight.bin: a FIFO \(named pipe\), not a regular file")
    cases["inspect:blob-offset-2^63"] = Case(["inspect", str(broken(lin, "offset", blob_offset(2**63 + 64))),
                                              "--json"], 1, r"weight.bin: truncated blob header at offset "
                                                            r"9223372036854775872 \(the file has")
    cases["inspect:unknown-dtype-enum"] = Case(["inspect", str(broken(gqa, "dtype", unknown_output_dtype)), "--json"],
                                               1, r"tensor 'gather_0': unknown dataType enum value 999")
    cases["inspect:unknown-dtype-in-description"] = Case(
        ["inspect", str(broken(gqa, "feature-dtype", unknown_feature_dtype)), "--json"], 1,
        r"feature 'logits' of the model description: unknown dataType enum value 999")
    cases["run:op-without-outputs"] = Case(run(broken(gqa, "no-outputs", drop_outputs("softmax")), "--steps", "1"),
                                           1, r"op '[^']+' \(softmax\) gave 1 outputs; the program declares 0")
    cases["run:const-count-mismatch"] = Case(run(broken(gqa, "count", const_count_mismatch), "--steps", "1"), 1,
                                             r"constant 'reshape_0_shape_0': 4 values stored for declared shape \[5\]")
    huge = broken(gqa, "huge", huge_input("k", (1, 1 << 20, 1 << 20, 8)))
    cases["run:declared-shape-2^40"] = Case(run(huge, "--steps", "1"), 1,
                                            r"input 'k': declared shape \[1, 1048576, 1048576, 8\] \(fp16\) would take "
                                            r"17,592,186,044,416 bytes, more than the")
    cases["inspect:declared-shape-2^40-is-analysed"] = Case(["inspect", str(huge), "--json"], 0, r"")
    cases["diff:declared-shape-2^40-is-analysed"] = Case(["diff", str(huge), str(gqa), "--json"], 0, r"")
    ceiling = root / "ceiling"  # not under out/: this fold is written (its proof is what the ceiling refuses)
    ceiling.mkdir()
    cases["fold:proof-past-the-array-ceiling"] = Case(  # unproven: written only when allowed (issue 37)
        ["fold", str(gqa), str(ceiling / "folded.mlpackage"), "--builds-dir", str(ceiling / "builds"), "--json",
         "--allow-unproven"], 0, r"", env={"QFOLD_MAX_ARRAY_BYTES": "256"})
    cases["fold:unproven-is-not-written-without-allow"] = Case(
        ["fold", str(gqa), str(out / "unproven.mlpackage"), "--builds-dir", str(ceiling / "refused-builds")], 1,
        r"gqa\.mlpackage: the fold could not be proven \(.*more than the 256 an interpreter array may take.*\); "
        r".*unproven\.mlpackage was not written \(--allow-unproven", env={"QFOLD_MAX_ARRAY_BYTES": "256"},
        max_lines=8)  # + coremltools' progress lines of the fold's conversion (6 here)
    cases["run:npz-member-past-the-cap-uncompressed"] = Case(
        run(gqa, "--inputs", _padded_member(inp / "padded.npz")), 1,
        r"padded.npz: .*member 'k': 17,\d{3} bytes uncompressed, more than the 4,096 an array may take",
        env={"QFOLD_MAX_ARRAY_BYTES": "4096"})  # every array of the program fits 4 KiB
    cases["run:npz-deflate-bomb"] = Case(run(gqa, "--inputs", _bomb(inp / "bomb.npz")), 1,
                                         r"bomb.npz: input 'input_ids' has shape \[1073741824\]; the program declares")
    os.mkfifo(inp / "fifo.npz")
    cases["run:npz-is-a-fifo"] = Case(run(gqa, "--inputs", str(inp / "fifo.npz")), 1,
                                      r"fifo.npz: a FIFO \(named pipe\), not a regular file")
    cases["run:npz-is-a-socket"] = Case(run(gqa, "--inputs", _socket_file(inp / "socket.npz")), 1,
                                        r"socket.npz: a socket, not a regular file")
    cases["run:npz-is-a-device"] = Case(run(gqa, "--inputs", "/dev/zero"), 1,
                                        r"/dev/zero: a character device, not a regular file")
    socket_pkg = broken(lin, "socket")
    weight_path(socket_pkg).unlink()
    _socket_file(weight_path(socket_pkg))
    cases["inspect:weight-bin-is-a-socket"] = Case(["inspect", str(socket_pkg), "--json"], 1,
                                                   r"weight.bin: a socket, not a regular file")
    cases["inspect:analysis-of-200-MB"] = Case(["inspect", _sparse(inp / "big.analysis.json", 200 << 20, b"{"),
                                                "--json"], 1, r"big.analysis.json: 209,715,200 bytes, more than the "
                                                              r"33,554,432 this file may have")
    (inp / "int.analysis.json").write_text('{"schema_version": 2, "program": ' + BIG_INT + "}")
    cases["inspect:analysis-integer-of-5000-digits"] = Case(["inspect", str(inp / "int.analysis.json"), "--json"], 1,
                                                            r"int.analysis.json: an integer of 5,000 digits")
    config = json.loads((REPO / "analyzer/model/presets/llama-3.2-1b.json").read_text())
    (inp / "config.json").write_text(json.dumps(config).replace('"num_hidden_layers": 16', '"num_hidden_layers": '
                                                                + BIG_INT))
    build = ["build", "--variant", "qfold", "--builds-dir", builds]
    cases["build:config-integer-of-5000-digits"] = Case([*build, "--model", str(inp / "config.json")], 1,
                                                        r"config.json: an integer of 5,000 digits")
    cases["build:set-integer-of-5000-digits"] = Case([*build, "--set", f"num_hidden_layers={BIG_INT}"], 1,
                                                     r"--set num_hidden_layers: an integer of 5,000 digits")
    cases["build:compression-layers-of-5000-digits"] = Case(
        [*build, "--compression", f"layers[{BIG_INT}]=int8"], 1,
        r"layer selector '9{40}'… \(5,000 characters\) is not N, N-M")  # quoted once, cut to 40 characters
    cases["compression:palette-bits-of-5000-digits"] = Case(["compression", f"ffn=pal{BIG_INT}"], 1,
                                                            r"unknown scheme 'pal9{37}'… \(5,003 characters\)")
    sweep = ["sweep", "--out", str(out / "s.csv"), "--builds-dir", builds]
    (inp / "int.toml").write_text(f"ctx = [{BIG_INT}]\n")
    cases["sweep:toml-integer-of-5000-digits"] = Case(
        [*sweep, "--spec", str(inp / "int.toml")], 1,
        r"int.toml: an integer of 5,000 digits \(more than the 32 accepted\)$")  # not Python's int_max_str advice
    (inp / "int.json").write_text('{"ctx": [' + BIG_INT + "]}")
    cases["sweep:json-integer-of-5000-digits"] = Case([*sweep, "--spec", str(inp / "int.json")], 1,
                                                      r"int.json: an integer of 5,000 digits")
    (inp / "deep.json").write_text('{"ctx": ' + "[" * 50_000 + "]" * 50_000 + "}")
    cases["sweep:json-nested-50000-deep"] = Case([*sweep, "--spec", str(inp / "deep.json")], 1,
                                                 r"deep.json: nested deeper than 8 levels")
    (inp / "deep.toml").write_text("ctx = " + "[" * 50_000 + "]" * 50_000 + "\n")
    cases["sweep:toml-nested-50000-deep"] = Case([*sweep, "--spec", str(inp / "deep.toml")], 1,
                                                 r"deep.toml: nested deeper than 8 levels")
    os.mkfifo(inp / "fifo.toml")
    cases["sweep:spec-is-a-fifo"] = Case([*sweep, "--spec", str(inp / "fifo.toml")], 1,
                                         r"fifo.toml: a FIFO \(named pipe\), not a regular file")
    cases["sweep:spec-is-a-socket"] = Case([*sweep, "--spec", _socket_file(inp / "socket.toml")], 1,
                                           r"socket.toml: a socket, not a regular file")
    (inp / "spec-dir.toml").mkdir()
    cases["sweep:spec-is-a-folder"] = Case([*sweep, "--spec", str(inp / "spec-dir.toml")], 1,
                                           r"spec-dir.toml: a folder, not a regular file")
    grid = ["--ctx", ",".join(map(str, range(1, 1001))), "--model", "llama-3.2-1b", "--model", "qwen3-0.6b",
            "--compression", "none", "--compression", "top8", "--phase", "decode,prefill", "--variant",
            "repeat_kv,qfold"]
    cases["sweep:grid-of-16000-points"] = Case([*sweep, *grid], 1,
                                           r"the sweep has 16,000 points \(2 model × 2 compression × 2 variant × "
                                           r"1000 ctx × 2 phase\), more than the cap of 1,000")
    cases["sweep:max-points-raises-the-cap"] = Case(  # past the cap: refused only by the address, checked next
        [*sweep, *grid, "--max-points", "16000", "--address", f"127.0.0.1:{closed_port()}"], 1,
        r"cannot reach the Ray cluster at 127.0.0.1:\d+: Connection refused", timeout_s=30, max_lines=2)
    cases["sweep:ctx-of-5000-digits"] = Case([*sweep, "--ctx", BIG_INT], 1, r"ctx '9{20}'…: a context length is a "
                                                                           r"positive integer \(at most 9 digits\)")
    log = {"build_commit": "x", "model_type": "m", "n_prompt": 0, "n_gen": int("1" * 30), "avg_ts": 1.0}
    (inp / "int.json.log").write_text("[" + json.dumps(log).replace("1" * 30, BIG_INT) + "]")
    cases["fit:json-log-integer-of-5000-digits"] = Case(["fit", str(inp / "int.json.log")], 1,
                                                        r"int.json.log: invalid JSON: an integer of 5,000 digits",
                                                        max_lines=2)
    cases["fit:log-is-a-device"] = Case(["fit", "/dev/zero"], 1,
                                        r"^error: /dev/zero: a character device, not a regular file", max_lines=2)
    cases["fit:log-over-the-size-limit"] = Case(["fit", _sparse(inp / "huge.csv", 6 << 20, b"device,build,"
                                                                                         b"tok_per_s\n")], 1,
                                                r"^error: .*huge.csv: file is 6,291,456 bytes, over the limit of "
                                                r"5,242,880 bytes", max_lines=2)
    line = "llama_perf_context_print:        eval time = " + "1ms/1runs(" * 1200 + " tokens per second)\n"
    (inp / "slow-line.txt").write_text(line)
    cases["fit:runner-line-that-took-79-s"] = Case(["fit", str(inp / "slow-line.txt")], 1,
                                                   r"not a complete llama.cpp timing line", max_lines=2)
    # ---- 3. run validates inputs against roles and dtypes
    for name, override, regex in (
            ("float-token-id", {"input_ids": np.array([[3.7]])}, r"input 'input_ids' \(int32\): 3.7 is not a whole"),
            ("nan-token-id", {"input_ids": np.array([[np.nan]])}, r"input 'input_ids' \(int32\): holds NaN"),
            ("token-id-past-vocab", {"input_ids": np.array([[32]], np.int32)},
             r"input 'input_ids' \(token ids\): 32 is outside the vocabulary \[0, 32\)"),
            ("negative-token-id", {"input_ids": np.array([[-1]], np.int32)},
             r"input 'input_ids' \(token ids\): -1 is outside the vocabulary"),
            ("position-past-cache", {"current_pos": np.array([S], np.int32)},
             rf"input 'current_pos' \(position\): {S} is outside the cache's {S} slots")):
        cases[f"run:{name}"] = Case(run(gqa, "--inputs", _feed(inp, name, **override)), 1, regex)
    cases["run:steps-past-cache"] = Case(run(gqa, "--steps", str(S + 1)), 1,
                                         rf"--steps {S + 1}: positions 0 to {S} do not fit the cache's {S} slots")
    # ---- 4. Ray addresses that cannot work (Ray's own wait is 20-35 s; ours 5 s for a port nobody listens on)
    port = closed_port()
    cases["sweep:ray-client-address-unreachable"] = Case(
        [*sweep, "--address", f"ray://127.0.0.1:{port}", "--ctx", "256", "--variant", "qfold", "--structure"], 1,
        rf"cannot reach the Ray cluster at ray://127.0.0.1:{port}: Connection refused", timeout_s=30,
        max_lines=2)  # the progress line, then the error
    cases["sweep:gcs-address-unreachable"] = Case(
        [*sweep, "--address", f"127.0.0.1:{port}", "--ctx", "256", "--variant", "qfold", "--structure"], 1,
        rf"cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused", timeout_s=30,
        max_lines=2)
    silent = silent_port()
    for name, address in (("ray-client", f"ray://127.0.0.1:{silent}"), ("gcs", f"127.0.0.1:{silent}")):
        cases[f"sweep:{name}-address-never-answers"] = Case(
            [*sweep, "--address", address, "--ctx", "256", "--variant", "qfold", "--structure"], 1,
            rf"cannot reach the Ray cluster at {address}: no answer \(tried for 5 s\)", timeout_s=30, max_lines=2)
    cases["sweep:ray-client-without-grpcio"] = Case(
        [*sweep, "--address", f"ray://127.0.0.1:{port}", "--ctx", "256", "--variant", "qfold", "--structure"], 1,
        r'the Ray Client needs ray\[client\] \(grpcio\); install it with: pip install -r requirements.txt '
        r'"ray\[client\]==2\.60\.0"', without=("grpc",), max_lines=2)
    return cases


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under ``folder`` (not following links): kind, size, mtime and the bytes of regular files."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            content = p.read_bytes() if p.is_file() and not p.is_symlink() and st.st_size < (1 << 20) else None
            link = os.readlink(p) if p.is_symlink() else None
            out[str(p.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime_ns, content, link)
    return out
