"""A/B diff of two analysed programs: op counts, tiles, bytes per token by category."""

from __future__ import annotations

from typing import Any

from analyzer.graph.accounting import CATEGORIES


def diff_documents(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a`` and ``b`` are analysis documents (``analysis.program_document`` or a build's analysis.json)."""
    ca, cb = a["summary"]["op_counts"], b["summary"]["op_counts"]
    op_deltas = [
        {"type": t, "a": ca.get(t, 0), "b": cb.get(t, 0), "delta": cb.get(t, 0) - ca.get(t, 0)}
        for t in sorted(set(ca) | set(cb), key=lambda t: (-(abs(cb.get(t, 0) - ca.get(t, 0))), t))
    ]
    ba, bb = a["bytes"]["bytes_per_token"], b["bytes"]["bytes_per_token"]
    keys = (*CATEGORIES, "total", "kv_write_value_semantics")
    layers_a = {r["layer"]: r for r in a["bytes"]["bytes_by_layer"]}
    layers_b = {r["layer"]: r for r in b["bytes"]["bytes_by_layer"]}
    by_layer = [
        {"layer": layer, "a": layers_a.get(layer, {}).get("total", 0), "b": layers_b.get(layer, {}).get("total", 0)}
        for layer in sorted(set(layers_a) | set(layers_b), key=lambda x: (x is None, x or 0))
    ]
    for row in by_layer:
        row["delta"] = row["b"] - row["a"]
    sa, sb = a["summary"], b["summary"]
    return {
        "total_ops": {"a": sa["total_ops"], "b": sb["total_ops"], "delta": sb["total_ops"] - sa["total_ops"]},
        "non_const_ops": {"a": sa["non_const_ops"], "b": sb["non_const_ops"],
                          "delta": sb["non_const_ops"] - sa["non_const_ops"]},
        "op_count_deltas": [r for r in op_deltas if r["delta"]],
        "op_counts": op_deltas,
        "tiles": {"a": sa["tiles"], "b": sb["tiles"]},
        "tile_count": {"a": sa["tile_count"], "b": sb["tile_count"], "delta": sb["tile_count"] - sa["tile_count"]},
        "tile_bytes_removed": sa["tile_output_bytes"] - sb["tile_output_bytes"],
        "bytes_per_token": {k: {"a": ba[k], "b": bb[k], "delta": bb[k] - ba[k]} for k in keys},
        "bytes_by_layer": by_layer,
    }
