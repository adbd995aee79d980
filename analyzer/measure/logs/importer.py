"""The entry points: bytes of one or more uploads → a ``LogImport``. Never raises for bad content.

Per file: gate 1 (bytes → text), format detection by content, the format's reader (structure, per-record
errors), then validation (labels, cell syntax, typed checks). A file-level problem (encoding, limits, header,
an unknown format) rejects the whole file with one error; a bad record rejects that record only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from analyzer.measure.logs.detect import detect_format
from analyzer.measure.logs.records import DEFAULT_LIMITS, FileReport, LogImport, LogIssue, LogLimits, Measurement
from analyzer.measure.logs.rows import Collector, RejectError, preview
from analyzer.measure.logs.text import decode, file_label, normalize_label
from analyzer.measure.logs.validate import LabelDefaults, validate


def _label_arg(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    label = normalize_label(value)
    if not label:
        raise ValueError(f"the {what} label is empty")
    if any(c in label for c in "\r\n") or any(ord(c) < 32 for c in label):
        raise ValueError(f"the {what} label {value!r} holds a line break or control character")
    return label


def parse_log(data: bytes, name: str, limits: LogLimits = DEFAULT_LIMITS, *, device: str | None = None,
              build: str | None = None) -> LogImport:
    """Import one uploaded log. Bad content comes back as ``issues``, never as an exception.

    ``name`` is only a label for messages (an upload's file name); nothing is read from disk. ``device`` and
    ``build`` label the rows that lack them (a format that names neither, such as a runner log); without them
    the file name stands in, with a warning. ValueError for an unusable label.
    """
    labels = LabelDefaults(file_label(name), _label_arg(device, "device"), _label_arg(build, "build"))
    col = Collector(labels.file_label)
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        text = decode(data, limits, col)
        spec = detect_format(text, col)
        col.format = spec.name
        rows = spec.reader(text, limits, col)
        measurements = validate(rows, col, labels)
    except RejectError as e:
        issue = LogIssue(col.file_name, e.line, e.column, preview(e.value), "error", e.message)
        report = FileReport(col.file_name, col.format, False, col.n_records, 0, col.n_records - col.n_skipped,
                            col.n_skipped, sha256)
        return LogImport((), (issue,), (report,))
    issues = sorted(col.issues, key=lambda i: (i.line is not None, i.line or 0, i.record or 0))
    report = FileReport(
        file_name=col.file_name,
        format=col.format,
        accepted=True,
        n_records=col.n_records,
        n_accepted=len(measurements),
        n_rejected=col.n_records - len(measurements) - col.n_skipped,
        n_skipped=col.n_skipped,
        sha256=sha256,
        derived=_derived(measurements),
    )
    return LogImport(tuple(measurements), tuple(issues), (report,))


def _derived(measurements: Sequence[Measurement]) -> tuple[str, ...]:
    """Each derivation rule used in the file, once: ``context_length: n_depth + n_gen: …``."""
    return tuple(dict.fromkeys(f"{column}: {how}" for m in measurements for column, how in m.derived))


def parse_logs(files: Sequence[tuple[str, bytes]], limits: LogLimits = DEFAULT_LIMITS, *, device: str | None = None,
               build: str | None = None) -> LogImport:
    """Import several uploads into one result; each row keeps its file label and line.

    Two uploads with the same name get " (2)", " (3)" … appended to the later labels (with a warning) so that
    a line number always points into exactly one file. Two uploads with the same bytes (sha256) are one
    file: the later one is listed, with ``duplicate_of``, and its rows are not counted again.
    """
    measurements: list[Measurement] = []
    issues: list[LogIssue] = []
    reports: list[FileReport] = []
    seen_names: dict[str, int] = {}
    seen_content: dict[str, str] = {}
    for name, data in files:
        label = file_label(name)
        seen_names[label] = seen_names.get(label, 0) + 1
        if seen_names[label] > 1:
            renamed = f"{label} ({seen_names[label]})"
            issues.append(LogIssue(renamed, None, None, None, "warning",
                                   f"another file is also named {label!r}; this one is labelled {renamed!r}"))
            label = renamed
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen_content:
            first = seen_content[digest]
            issues.append(LogIssue(label, None, None, None, "warning",
                                   f"same content as {first!r} (sha256 {digest[:12]}…): counted once, as {first!r}"))
            reports.append(FileReport(label, None, True, 0, 0, 0, 0, digest, duplicate_of=first))
            continue
        seen_content[digest] = label
        result = parse_log(data, label, limits, device=device, build=build)
        measurements.extend(result.measurements)
        issues.extend(result.issues)
        reports.extend(result.files)
    return LogImport(tuple(measurements), tuple(issues), tuple(reports))
