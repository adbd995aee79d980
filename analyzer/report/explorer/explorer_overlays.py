"""qfold's figures as Model Explorer node-data overlays (``model_explorer.node_data_builder``, as JSON-ready dicts).

One overlay per figure and side: a ``ModelNodeData`` document, ``{graph_id: GraphNodeData}``, whose results are
keyed by node id. Numbers get a white → colour gradient (Model Explorer colours each node by its value and sums
the values per layer in its side panel); the device and the structural-diff status are categories, each value
with its own colour. A node whose figure qfold could not compute has no result (and its attributes say why).

=====================  ===============================================================================
``bytes_per_token``    every byte the op moves per call (a decode call is one token), all categories
``<category>_bytes``   one byte category: weights, kv_read, kv_write, activations
``replication_bytes``  the KV-replication category: a copy's output written, and every read of it
``flops``              FLOPs per call
``device``             where a placement plan put the op (``--plan``), ANE / GPU / CPU
``profiled_ms``        profiled milliseconds per token, when the plan is a profile with times
``diff``               a pair's structural diff: matched, same op with other shapes, only in A, only in B
=====================  ===============================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.analysis.accounting import CATEGORIES
from analyzer.report.explorer.explorer_graph import STATUS_TEXT, SideGraph
from analyzer.report.figures import CATEGORY_COLORS
from analyzer.report.graphview.layout import ALARM, OFF_ANE_BORDER, STYLE

WHITE = "#ffffff"
# where a plan put an op: the Neural Engine green, the GPU in the Graph tab's off-the-Neural-Engine purple, the
# CPU orange
PLACEMENT_COLORS = {"ANE": "#54A24B", "GPU": OFF_ANE_BORDER, "CPU": "#F58518"}
FLOPS_COLOR = "#4C78A8"
TIME_COLOR = "#E45756"
# The overlays every side has, in the order they are listed; ``device``, ``profiled_ms`` and ``diff`` only where
# there is a plan, a profile with times, or a pair.
BYTE_OVERLAYS: tuple[tuple[str, str], ...] = (
    ("bytes_per_token", "total"), *((f"{c}_bytes", c) for c in CATEGORIES if c != "replication"),
    ("replication_bytes", "replication"))


def _gradient(color: str) -> list[dict[str, Any]]:
    return [{"stop": 0, "bgColor": WHITE}, {"stop": 1, "bgColor": color}]


def _numbers(name: str, results: Mapping[str, float | int], color: str) -> dict[str, Any]:
    return {"name": name, "results": {k: {"value": v} for k, v in results.items()}, "gradient": _gradient(color)}


def _categories(name: str, results: Mapping[str, str], colors: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "results": {k: {"value": v, "bgColor": colors[v]} for k, v in results.items()},
            "showExpandedSummaryOnGroupNode": True}


def side_overlays(graphs: Sequence[SideGraph], statuses: Mapping[str, Mapping[str, str]] | None = None
                  ) -> dict[str, dict[str, Any]]:
    """Overlay name → ModelNodeData document for one side's graphs. ``statuses``: graph id → node id → diff
    status (a pair)."""
    out: dict[str, dict[str, Any]] = {}
    for name, category in BYTE_OVERLAYS:
        color = CATEGORY_COLORS.get(category, ALARM[0]) if category != "total" else "#1f3b73"
        out[name] = {g.graph["id"]: _numbers(f"{category} bytes per {g.per}",
                                             {n: f.bytes_by_category[category] for n, f in g.figures.items()
                                              if f.bytes_by_category is not None}, color)
                     for g in graphs}
    out["flops"] = {g.graph["id"]: _numbers("FLOPs per call", {n: f.flops for n, f in g.figures.items()
                                                               if f.flops is not None}, FLOPS_COLOR)
                    for g in graphs}
    if any(f.device for g in graphs for f in g.figures.values()):
        out["device"] = {g.graph["id"]: _categories("device (placement plan)", {
            n: f.device for n, f in g.figures.items() if f.device}, PLACEMENT_COLORS) for g in graphs}
    if any(f.time_ms is not None for g in graphs for f in g.figures.values()):
        out["profiled_ms"] = {g.graph["id"]: _numbers("profiled ms per token", {
            n: f.time_ms for n, f in g.figures.items() if f.time_ms is not None}, TIME_COLOR) for g in graphs}
    if statuses:
        colors = {STATUS_TEXT[s]: STYLE[s][0] for s in STATUS_TEXT}
        out["diff"] = {gid: _categories("structural diff", {n: STATUS_TEXT[s] for n, s in nodes.items()},  # type: ignore[index]
                                        colors) for gid, nodes in statuses.items()}
    return out
