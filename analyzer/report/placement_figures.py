"""Where the ops ran, as tables and one chart: pure functions (frames of ints, a plotly figure), no streamlit.

The A/B page's Placement tab shows :func:`device_frame` (A vs B per device) drawn by :func:`device_figure`, the
warnings of :func:`~analyzer.measure.placement.compare_placement`, and per side :func:`off_ane_frame`,
:func:`unmatched_frame` and :func:`share_frame`; the Graph tab badges ops with :func:`op_devices`.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analyzer import fmt
from analyzer.fmt import MIB
from analyzer.measure.placement import DEVICES, PlacementJoin
from analyzer.report.figures import COLOR_A, COLOR_B, style

DEVICE_NAMES = {"ANE": "Neural Engine", "GPU": "GPU", "CPU": "CPU"}
DEVICE_COLUMNS = ("device", "a_ops", "b_ops", "delta_ops", "a_bytes_per_token", "b_bytes_per_token",
                  "delta_bytes_per_token")


def device_frame(a: PlacementJoin | None, b: PlacementJoin | None) -> pd.DataFrame:
    """Ops and bytes per token on each device, A and B (a side without a plan has zeros and is named so by the
    caller); bytes are ints."""
    rows = []
    for d in DEVICES:
        ta, tb = (j.device(d) if j is not None else None for j in (a, b))
        oa, ob = (t.ops if t else 0 for t in (ta, tb))
        ba, bb = (t.bytes_per_token if t else 0 for t in (ta, tb))
        rows.append({"device": d, "a_ops": oa, "b_ops": ob, "delta_ops": ob - oa, "a_bytes_per_token": ba,
                     "b_bytes_per_token": bb, "delta_bytes_per_token": bb - ba})
    return pd.DataFrame(rows, columns=list(DEVICE_COLUMNS))


def device_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """Two panels, ops and MiB per token, one bar pair (A, B) per device: exactly ``frame``."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("ops", "MiB per token"), horizontal_spacing=0.12)
    names = [DEVICE_NAMES[d] for d in frame["device"]]
    for side, label, color in (("a", fmt.plot_text(label_a), COLOR_A), ("b", fmt.plot_text(label_b), COLOR_B)):
        fig.add_trace(go.Bar(x=names, y=frame[f"{side}_ops"], name=label, marker_color=color,
                             legendgroup=side), row=1, col=1)
        fig.add_trace(go.Bar(x=names, y=frame[f"{side}_bytes_per_token"] / MIB, name=label, marker_color=color,
                             legendgroup=side, showlegend=False,
                             hovertext=[fmt.size(int(v), "auto", None) for v in frame[f"{side}_bytes_per_token"]]),
                      row=1, col=2)
    fig.update_layout(barmode="group")
    return style(fig, "Where the ops ran: A vs B")


OFF_ANE_COLUMNS = ("device", "type", "op", "layer", "bytes_per_token", "cost_percent", "supported", "reason")


def off_ane_frame(j: PlacementJoin) -> pd.DataFrame:
    """The ops not on the Neural Engine, costliest first, with the tool's reason where it gives one."""
    rows = [{"device": o.device, "type": o.op_type, "op": o.name, "layer": o.layer, "bytes_per_token": o.bytes.total,
             "cost_percent": None if o.cost_weight is None else 100 * o.cost_weight,
             "supported": ",".join(o.supported), "reason": o.reason or ""} for o in j.off_ane]
    frame = pd.DataFrame(rows, columns=list(OFF_ANE_COLUMNS))
    frame["layer"] = frame["layer"].astype("Int64")
    frame["bytes_per_token"] = frame["bytes_per_token"].astype("int64")
    return frame


def unmatched_frame(j: PlacementJoin) -> pd.DataFrame:
    """Everything the join could not pair: plan ops with why, and the analysis's compute ops the plan omits."""
    rows = [{"where": "plan", "name": u.label, "type": u.op_type, "why": u.why} for u in j.unmatched_plan]
    rows += [{"where": "analysis", "name": n, "type": "", "why": "not in the plan"} for n in j.unmatched_analysis]
    return pd.DataFrame(rows, columns=["where", "name", "type", "why"])


def share_frame(j: PlacementJoin) -> pd.DataFrame:
    """The plan's cost (or cost-model time) by byte category, as a share."""
    rows = [{"category": s.category, "amount": s.amount, "share_percent": 100 * s.share, "basis": s.basis}
            for s in j.category_shares]
    return pd.DataFrame(rows, columns=["category", "amount", "share_percent", "basis"])


def op_devices(j: PlacementJoin | None) -> tuple[tuple[int, str], ...]:
    """Op index → device, for the graph's badges (hashable, so a cached layout can take it)."""
    if j is None:
        return ()
    return tuple((o.index, o.device) for o in j.matched if o.device is not None)


def join_caption(j: PlacementJoin) -> str:
    """One line: what was joined, how many ops matched, what did not."""
    parts = [f"{j.plan_file} ({j.plan_format}): {j.n_matched:,} ops matched"]
    if j.unmatched_plan:
        parts.append(f"{len(j.unmatched_plan):,} plan op(s) match no op record")
    if j.unmatched_analysis:
        parts.append(f"{len(j.unmatched_analysis):,} compute op(s) not in the plan "
                     f"({fmt.size(j.unplaced_bytes_per_token, 'auto', None)} per token unplaced)")
    inferred = sum(1 for o in j.matched if o.inferred)
    if inferred:
        parts.append(f"{inferred:,} op(s) counted on the Neural Engine because the plan lists only the others")
    return "; ".join(parts) + "."
