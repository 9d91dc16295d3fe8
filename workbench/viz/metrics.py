"""Figures of the task metric: one value per precision variant, and accuracy against speed per built engine.

Inputs are what the stages measured (``MetricRow``s of the quickstart, the calibration panel's rows,
``EngineCandidate``s of the export panel); nothing here computes or invents a number. None calls ``show()``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from workbench.viz import palette
from workbench.viz.layout import fit_to_container

if TYPE_CHECKING:
    from workbench.flow.artifacts import MetricRow
    from workbench.flow.choose import EngineCandidate


def metric_range(values: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> list[float] | None:
    """A y range that holds every value and interval with some room, clipped to [0, 1] for fractions (accuracy);
    None (plotly's own) for other metrics."""
    finite = [v for v in (*values, *lows, *highs) if v is not None and math.isfinite(v)]
    if not finite or min(finite) < 0 or max(finite) > 1:
        return None
    low, high = min(finite), max(finite)
    room = max(0.1 * (high - low), 0.01)
    return [max(0.0, low - room), min(1.02, high + room)]  # 1.02: a marker at 1.0 is drawn whole


def interval_bars(values: Sequence[float], lows: Sequence[float], highs: Sequence[float]) -> dict[str, object]:
    """Plotly error bars drawing each value's interval ``[low, high]`` (asymmetric)."""
    return {
        "type": "data",
        "symmetric": False,
        "array": [high - value for value, high in zip(values, highs, strict=True)],
        "arrayminus": [value - low for value, low in zip(values, lows, strict=True)],
        "color": palette.MARKER_EDGE,
        "thickness": 1.5,
        "width": 8,
    }


def metrics_figure(rows: Sequence[MetricRow], highlight: str | None = None) -> go.Figure:
    """The task metric of each precision variant (ONNX Runtime CPU) with its 95 % interval (Wilson or bootstrap,
    from the per-sample scores), coloured by precision, the chosen one outlined.

    Points with error bars, not bars: the differences that matter are a few thousandths, which bars on a cut axis
    exaggerate and bars from zero hide."""
    name = rows[0].metric if rows else "metric"
    estimates = [getattr(row, "estimate", None) for row in rows]
    lows = [e.low if e is not None and e.has_interval else row.value for row, e in zip(rows, estimates, strict=True)]
    highs = [e.high if e is not None and e.has_interval else row.value for row, e in zip(rows, estimates, strict=True)]
    figure = go.Figure(
        go.Scatter(
            x=[str(row.variant) for row in rows],
            y=[row.value for row in rows],
            mode="markers+text",
            text=[f"{row.value:.4f}" for row in rows],
            textposition="middle right",
            error_y=interval_bars([row.value for row in rows], lows, highs),
            marker={
                "size": 14,
                "color": [palette.precision_color(row.variant) for row in rows],
                "line": {"width": [3 if row.variant == highlight else 0 for row in rows], "color": palette.MARKER_EDGE},
            },
            customdata=[
                e.text() if e is not None else f"{row.value:.4f}" for row, e in zip(rows, estimates, strict=True)
            ],
            hovertemplate="%{x}: %{customdata}<extra></extra>",
        )
    )
    n = rows[0].n_samples if rows else 0
    figure.update_layout(
        title=f"{name} per precision, 95% intervals ({n} samples)"
        + (f"; outlined: {highlight} (chosen)" if highlight else ""),
        yaxis_title=name,
        yaxis_range=metric_range([row.value for row in rows], lows, highs),
        xaxis_type="category",
        template=palette.TEMPLATE,
        showlegend=False,
        margin=dict(l=60, r=20, b=50),
        height=320,
    )
    return fit_to_container(figure)


def metric_table_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Task-metric table: one row per variant (FP32 / INT8 / mixed) with its value, 95 % interval, sample count,
    paired difference to FP32, and INT8 / FP8 node counts. Every cell has text (a dash where there is no number)."""
    keys = ("variant", "metric", "value", "interval", "n", "vs_fp32", "int8_nodes", "fp8_nodes", "fallback")
    header = [
        "variant",
        "metric",
        "value",
        "95% interval",
        "samples",
        "vs FP32 [paired 95%]",
        "INT8 nodes",
        "FP8 nodes",
        "wider",
    ]
    columns = [
        [f"{r[key]:.4f}" if isinstance(r.get(key), float) else str(r.get(key, "-")) for r in rows] for key in keys
    ]
    figure = go.Figure(
        go.Table(
            header={"values": header, "fill_color": palette.HEADER_FILL, "align": "left"},
            cells={"values": columns, "align": "left"},
            columnwidth=[110, 110, 60, 120, 60, 200, 70, 70, 60],
        )
    )
    figure.update_layout(height=70 + 30 * max(1, len(rows)), margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return fit_to_container(figure)


def candidates_figure(
    candidates: Sequence[EngineCandidate], chosen: str | None = None, *, exported: Sequence[str] = ()
) -> go.Figure:
    """Accuracy (with its 95 % interval) against throughput, one marker per built engine coloured by its precision;
    ``chosen`` (the rule's pick) larger and outlined, ``exported`` precisions ringed."""
    shown = [c for c in candidates if c.metric is not None and c.throughput_per_s is not None]
    lows = [c.metric_low if math.isfinite(c.metric_low) else c.metric for c in shown]
    highs = [c.metric_high if math.isfinite(c.metric_high) else c.metric for c in shown]
    figure = go.Figure(
        go.Scatter(
            x=[c.throughput_per_s for c in shown],
            y=[c.metric for c in shown],
            text=[c.precision + (" (rule's pick)" if c.precision == chosen else "") for c in shown],
            mode="markers+text",
            textposition="middle right",
            error_y=interval_bars([c.metric for c in shown], lows, highs),
            marker=dict(
                size=[18 if c.precision == chosen else 12 for c in shown],
                color=[palette.precision_color(c.variant) for c in shown],
                symbol=["circle-dot" if c.precision in exported else "circle" for c in shown],
                line=dict(width=[3 if c.precision == chosen else 0 for c in shown], color=palette.MARKER_EDGE),
            ),
            hovertemplate="%{text}: %{y:.4f} at %{x:.0f} samples/s<extra></extra>",
        )
    )
    metric = next((c.metric_name for c in candidates if c.metric_name), "metric")
    speeds = [c.throughput_per_s for c in shown]
    figure.update_layout(
        title="Accuracy vs speed" + (f"; outlined: {chosen} (the rule's pick)" if chosen else ""),
        xaxis_title="samples / s",
        yaxis_title=metric,
        yaxis_range=metric_range([c.metric for c in shown], lows, highs),
        xaxis_range=[0, max(speeds) * 1.3] if speeds else None,  # room for the labels right of the markers
        template=palette.TEMPLATE,
        showlegend=False,
        height=360,
    )
    return fit_to_container(figure)
