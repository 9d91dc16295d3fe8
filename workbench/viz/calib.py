"""Figures for INT8 calibration: per-layer SQNR in topological order, a tensor's histogram with each method's
threshold, the mixed-precision search's plans and the Pareto front across formats (the task-metric table with its
intervals is :func:`workbench.viz.metrics.metric_table_figure`). Functions return plotly figures; nothing is shown
here."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.calib.diff import LayerDiff
from workbench.calib.histogram import TensorHistogram
from workbench.viz import palette
from workbench.viz.layout import fit_to_container

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from workbench.flow.formats import FormatFront
    from workbench.flow.uncertainty import Estimate


def sqnr_figure(
    diff: LayerDiff, *, highlight: Sequence[str] = (), title: str = "Per-layer SQNR (topological order)"
) -> go.Figure:
    """Accumulated SQNR of every compared tensor (line) and local SQNR of each quantized tensor (markers).

    The culprit layers are where the accumulated line steps down; ``highlight`` marks tensors (e.g. the worst N).
    """
    import plotly.graph_objects as go

    rows = sorted((r for r in diff.tensors if r.kind in ("activation", "input")), key=lambda r: (r.index, r.name))
    x = list(range(len(rows)))
    labels = [r.name for r in rows]
    hover = [
        f"{r.name}<br>{r.op} ({r.node})<br>accumulated {_fmt(r.sqnr_db_accumulated)} dB, local {_fmt(r.sqnr_db_local)} dB"
        f"<br>clipped {_fmt(r.clipped_fraction, '.2e')}{'<br>' + r.cause if r.cause else ''}"
        for r in rows
    ]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=x,
            y=[r.sqnr_db_accumulated for r in rows],
            mode="lines+markers",
            name="accumulated (FP32 vs INT8 model)",
            text=labels,
            hovertext=hover,
            hoverinfo="text",
            marker={"size": 4},
            connectgaps=True,
        )
    )
    local = [(i, r) for i, r in zip(x, rows) if r.sqnr_db_local is not None]
    figure.add_trace(
        go.Scatter(
            x=[i for i, _ in local],
            y=[r.sqnr_db_local for _, r in local],
            mode="markers",
            name="local (tensor vs its fake-quant)",
            text=[r.name for _, r in local],
            hovertext=[hover[i] for i, _ in local],
            hoverinfo="text",
            marker={
                "symbol": "diamond",
                "size": 7,
                "color": [palette.ERROR if r.cause and r.cause != "ok" else palette.WARNING for _, r in local],
            },
        )
    )
    marked = [(i, r) for i, r in zip(x, rows) if r.name in set(highlight)]
    if marked:
        figure.add_trace(
            go.Scatter(
                x=[i for i, _ in marked],
                y=[r.sqnr_db_accumulated for _, r in marked],
                mode="markers",
                name="worst layers",
                text=[r.name for _, r in marked],
                marker={"symbol": "x", "size": 12, "color": palette.WORST},
            )
        )
    figure.update_layout(
        title=title,
        xaxis_title="tensor (topological order)",
        yaxis_title="SQNR (dB)",
        hovermode="closest",
        height=380,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fit_to_container(figure)


def histogram_figure(hist: TensorHistogram, thresholds: Mapping[str, float], *, max_bars: int = 512) -> go.Figure:
    """|x| histogram of one tensor (log counts) with a vertical line at each method's amax."""
    import plotly.graph_objects as go

    counts = hist.total_counts
    used = int(np.flatnonzero(counts)[-1]) + 1 if counts.any() else 1
    factor = max(1, int(np.ceil(used / max_bars)))  # merge adjacent bins for drawing only
    padded = np.zeros(int(np.ceil(used / factor)) * factor, dtype=np.int64)
    padded[:used] = counts[:used]
    merged = padded.reshape(-1, factor).sum(axis=1)
    width = hist.width * factor if hist.width else 1.0
    centres = (np.arange(merged.size) + 0.5) * width
    figure = go.Figure(
        go.Bar(
            x=centres,
            y=np.maximum(merged, 0),
            width=width,
            name="|x| counts",
            marker={"color": palette.NEUTRAL_LIGHT},
            hovertemplate="|x|≈%{x:.4g}: %{y}<extra></extra>",
        )
    )
    for method, amax in thresholds.items():
        figure.add_vline(
            x=float(amax),
            line={"color": palette.METHOD_COLORS.get(method, palette.MUTED), "dash": "dash"},
            annotation_text=f"{method} {amax:.3g}",
            annotation_position="top",
        )
    figure.update_layout(
        title=f"{hist.name}: |x| histogram ({hist.count:,} values, min {hist.minimum:.3g}, max {hist.maximum:.3g})",
        xaxis_title="|x|",
        yaxis_title="count",
        yaxis_type="log",
        height=340,
        bargap=0,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        showlegend=False,
    )
    return fit_to_container(figure)


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "–" if value is None else format(value, spec)


def pareto_rows(result: Any) -> list[dict[str, Any]]:
    """One row per plan the mixed-precision search evaluated (a ``MixedPrecisionResult`` or its JSON)."""
    data = result.to_json() if hasattr(result, "to_json") else result
    rows = []
    for plan in data["evaluated"]:
        cost = plan.get("cost") or {}
        rows.append(
            {
                "index": plan["index"],
                "metric": plan["metric"],
                "int8_share": plan["int8_share"],
                "engine_layers": cost.get("engine_layers"),
                "cost": (cost["engine_layers"] + cost["reformat_layers"]) if cost else None,
                "qdq_kernels": cost.get("qdq_kernels"),
                "reformat_layers": cost.get("reformat_layers"),
                "fallback": len(plan["fallback_nodes"]),
                "meets": plan["meets_target"],
                "chosen": plan["chosen"],
            }
        )
    return rows


def pareto_figure(
    result: Any,
    *,
    title: str | None = None,
    intervals: Sequence[Estimate] | None = None,
    front: Sequence[int] | None = None,
) -> go.Figure:
    """Task metric against INT8 share (left) and against engine cost (right) for every evaluated plan.

    Engine cost is the layer count plus reformat layers of a TensorRT-RTX CPU build: structure, not speed. The target
    is a dashed line, the chosen plan a large marker, plans that miss the target hollow. ``intervals`` (one per
    evaluated plan, objects with ``low``/``high``/``n``, e.g. :class:`workbench.flow.uncertainty.Estimate`) draw 95 %
    error bars; ``front`` (plan indices) rings the plans on the Pareto front.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from workbench.viz.metrics import metric_range

    data = result.to_json() if hasattr(result, "to_json") else result
    rows = pareto_rows(data)
    bars = {i: (iv.low, iv.high, iv.n) for i, iv in enumerate(intervals or ()) if iv is not None}
    on_front = set(front or ())
    has_cost = any(r["cost"] is not None for r in rows)
    fig = make_subplots(
        rows=1,
        cols=2 if has_cost else 1,
        shared_yaxes=True,
        subplot_titles=(
            # two lines each: at 1,280 px the one-line titles ran into each other
            ("INT8 share of<br>Conv/Gemm/MatMul", "engine layers + reformats<br>(RTX CPU build: structure, not speed)")
            if has_cost
            else ("INT8 share of Conv/Gemm/MatMul",)
        ),
    )
    axes = [("int8_share", 1)] + ([("cost", 2)] if has_cost else [])
    for key, col in axes:
        for meets, symbol, name in ((True, "circle", "meets target"), (False, "circle-open", "misses target")):
            subset = [r for r in rows if r["meets"] == meets and r[key] is not None]
            if not subset:
                continue
            error_y = None
            if bars:
                highs = [bars[r["index"]][1] - r["metric"] if r["index"] in bars else 0.0 for r in subset]
                lows = [r["metric"] - bars[r["index"]][0] if r["index"] in bars else 0.0 for r in subset]
                error_y = {
                    "type": "data",
                    "array": [max(h, 0.0) if h == h else 0.0 for h in highs],
                    "arrayminus": [max(low, 0.0) if low == low else 0.0 for low in lows],
                    "color": palette.MUTED,
                    "thickness": 1,
                    "width": 2,
                }
            fig.add_trace(
                go.Scatter(
                    x=[r[key] for r in subset],
                    y=[r["metric"] for r in subset],
                    mode="markers",
                    marker={"symbol": symbol, "size": 9, "color": palette.INT8},
                    error_y=error_y,
                    name=name + (" (95 % interval)" if bars else ""),
                    legendgroup=name,
                    showlegend=col == 1,
                    text=[
                        f"plan {r['index']}: {r['fallback']} node(s) to {data['fallback']}, "
                        f"{r['qdq_kernels']} Q/DQ kernels, {r['reformat_layers']} reformats"
                        + (
                            f"<br>95 % interval [{bars[r['index']][0]:.4f}, {bars[r['index']][1]:.4f}], "
                            f"n={bars[r['index']][2]}"
                            if r["index"] in bars
                            else ""
                        )
                        for r in subset
                    ],
                    hovertemplate="%{text}<br>metric %{y:.4f}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        ringed = [r for r in rows if r["index"] in on_front and r[key] is not None]
        if ringed:
            fig.add_trace(
                go.Scatter(
                    x=[r[key] for r in ringed],
                    y=[r["metric"] for r in ringed],
                    mode="markers",
                    marker={"symbol": "circle-open", "size": 15, "color": palette.TEXT, "line": {"width": 1.5}},
                    name="Pareto front",
                    legendgroup="front",
                    showlegend=col == 1,
                    text=[f"plan {r['index']} (on the front)" for r in ringed],
                    hovertemplate="%{text}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        chosen = [r for r in rows if r["chosen"] and r[key] is not None]
        if chosen:
            fig.add_trace(
                go.Scatter(
                    x=[chosen[0][key]],
                    y=[chosen[0]["metric"]],
                    mode="markers",
                    marker={"symbol": "star", "size": 18, "color": palette.FP16, "line": {"color": palette.TEXT}},
                    name="chosen plan",
                    legendgroup="chosen",
                    showlegend=col == 1,
                    hovertemplate="chosen plan<br>metric %{y:.4f}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        fig.add_hline(
            y=data["target"], line={"dash": "dash", "color": palette.MUTED}, annotation_text="target", row=1, col=col
        )
    fig.update_yaxes(title_text=data["metric_name"], row=1, col=1)
    values = [r["metric"] for r in rows]
    lows = [bars[r["index"]][0] if r["index"] in bars else r["metric"] for r in rows]
    highs = [bars[r["index"]][1] if r["index"] in bars else r["metric"] for r in rows]
    fig.update_yaxes(range=metric_range(values, [*lows, data["target"]], [*highs, data["target"]]))  # within 0..1
    shares = [r["int8_share"] for r in rows]
    narrow = bool(shares) and max(shares) - min(shares) < 0.1  # whole percents would repeat the same tick label
    # a share runs 0-100 %: a single plan at 100 % had plotly pad its axis to 150 %
    room = max(0.02, 0.1 * (max(shares) - min(shares))) if shares else 0.05
    share_range = [max(0.0, min(shares) - room), min(1.0, max(shares)) + room] if shares else None
    fig.update_xaxes(tickformat=".1%" if narrow else ".0%", range=share_range, row=1, col=1)
    if has_cost:  # layer counts are whole numbers: no 121.5 ticks
        costs = [r["cost"] for r in rows if r["cost"] is not None]
        fig.update_xaxes(dtick=max(1, math.ceil((max(costs) - min(costs)) / 6)), row=1, col=2)
    fig.update_layout(
        title=title
        or f"{data['model']}: {len(rows)} evaluated plans, {data['evaluations_used']} task evaluations "
        f"({'target met' if data['met'] else 'target NOT met'})",
        height=380,
        margin={"l": 60, "r": 20, "t": 90, "b": 50},
    )
    return fit_to_container(fig)


FORMAT_SYMBOLS = {"int8": "circle", "fp8": "diamond", "fp16": "square", "fp32": "triangle-up", "mixed": "hexagon"}


def format_front_figure(front: FormatFront, *, title: str | None = None) -> go.Figure:
    """Task metric (95 % error bars) against engine size for every plan or engine of ``front``, one colour and marker
    per format (a mix of formats: its own marker, coloured by its most common format), the Pareto front across
    formats joined by a line, the chosen one starred, the target dashed.

    The metric axis holds every interval with a little room (never past 0..1 for a fraction); the size axis starts at
    zero so sizes compare by length."""
    import plotly.graph_objects as go

    from workbench.viz.metrics import interval_bars, metric_range

    shown = [p for p in front.points if p.engine_bytes is not None and math.isfinite(p.metric)]
    figure = go.Figure()
    for fmt in FORMAT_SYMBOLS:
        group = [p for p in shown if p.format == fmt]
        if not group:
            continue
        lows = [p.metric_low if math.isfinite(p.metric_low) else p.metric for p in group]
        highs = [p.metric_high if math.isfinite(p.metric_high) else p.metric for p in group]
        figure.add_trace(
            go.Scatter(
                x=[p.engine_mb for p in group],
                y=[p.metric for p in group],
                mode="markers",
                name=fmt.upper() if fmt != "mixed" else "mixed formats",
                error_y=interval_bars([p.metric for p in group], lows, highs),
                marker={
                    "symbol": FORMAT_SYMBOLS[fmt],
                    "size": 11,
                    "color": [
                        palette.precision_color(max(p.formats, key=p.formats.__getitem__) if p.formats else fmt)
                        for p in group
                    ],
                    "line": {"width": 1, "color": palette.MARKER_EDGE},
                },
                customdata=[
                    [p.label, p.mix, p.estimate.text(), p.engine_layers if p.engine_layers is not None else "-"]
                    for p in group
                ],
                hovertemplate="%{customdata[0]}: %{customdata[1]}<br>%{customdata[2]}<br>%{x:.2f} MB, "
                "%{customdata[3]} layers<extra></extra>",
            )
        )
    line = [p for p in front.front if p in shown]
    if line:
        figure.add_trace(
            go.Scatter(
                x=[p.engine_mb for p in line],
                y=[p.metric for p in line],
                mode="lines",
                line={"shape": "hv", "color": palette.TEXT, "width": 1, "dash": "dot"},
                name="Pareto front",
                hoverinfo="skip",
            )
        )
    chosen = [p for p in shown if p.chosen]
    if chosen:
        figure.add_trace(
            go.Scatter(
                x=[chosen[0].engine_mb],
                y=[chosen[0].metric],
                mode="markers",
                marker={"symbol": "star", "size": 18, "color": palette.FP16, "line": {"color": palette.TEXT}},
                name="chosen",
                hovertemplate=f"chosen: {chosen[0].label}<extra></extra>",
            )
        )
    values = [p.metric for p in shown]
    lows = [p.metric_low if math.isfinite(p.metric_low) else p.metric for p in shown]
    highs = [p.metric_high if math.isfinite(p.metric_high) else p.metric for p in shown]
    if front.target is not None and math.isfinite(front.target):
        figure.add_hline(y=front.target, line={"dash": "dash", "color": palette.MUTED}, annotation_text="target")
        lows, highs = [*lows, front.target], [*highs, front.target]
    sizes = [p.engine_mb or 0.0 for p in shown]
    figure.update_layout(
        title=title
        or f"{front.model}: Pareto front across formats ({len(front.front)} of {len(shown)} on it), 95% intervals",
        xaxis_title="engine size (MB, TensorRT-RTX build; not speed)",
        yaxis_title=front.metric_name,
        xaxis_range=[0, max(sizes) * 1.15] if sizes else None,
        yaxis_range=metric_range(values, lows, highs),
        template=palette.TEMPLATE,
        height=380,
        legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0},
        margin={"l": 60, "r": 20, "b": 100},
    )
    return fit_to_container(figure)
