"""Error messages for the dashboard: the core words its errors for the CLI (``--ctx 0: must be a positive
integer``), and a page has no flags, so a page shows them through :func:`for_ui`, which names the setting
instead::

    "--model '/x': not a preset (…)"                 → "'/x': not a preset (…)"
    "… max_position_embeddings=65,536; … (--force-ctx if you mean it)" → "… (choose a context length within it)"
    "--ctx 0: must be a positive integer"            → "context length 0: must be a positive integer"
    "inputIds [1,8] (given (--shape))"              → "inputIds [1,8] (given)"
"""

from __future__ import annotations

import re

# Specific phrasings first (a page offers no such flag), then flag → the setting's name on the pages.
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\s*\(--force-ctx if you mean it\)"), " (choose a context length within it)"),
    (re.compile(r"\(use --map\)"), "(map it on the Device logs page)"),
    (re.compile(r", e\.g\. --set \S+"), ""),
    (re.compile(r"(?<![\w-])--model\s+"), ""),
    (re.compile(r"given \(--shape\)"), "given"),  # an assumed shape's how (analyzer.analysis.shapes)
)
_FLAG_NAMES: dict[str, str] = {
    "set": "setting",
    "ctx": "context length",
    "kv": "KV mode",
    "layer": "layer",
    "device": "device profile",
    "weight-charge": "weight charge",
    "compression": "compression",
    "variant": "variant",
    "shape": "shape",
    "backend": "backend",
    "weights": "weights",
    "mode": "build mode",
    "phase": "phase",
}
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z-]*)")


def for_ui(message: str) -> str:
    """``message`` with every command-line flag replaced by the name of the setting it stands for."""
    for pattern, replacement in _PHRASES:
        message = pattern.sub(replacement, message)
    return _FLAG.sub(lambda m: _FLAG_NAMES.get(m.group(1), m.group(1).replace("-", " ")), message)
