"""Figures of the task metric: one value per precision variant, and accuracy against speed per built engine.

Inputs are what the stages measured (``MetricRow``s of the quickstart, the calibration panel's rows,
``EngineCandidate``s of the export panel); nothing here computes or invents a number. None calls ``show()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from workbench.viz import palette


def metrics_figure(rows: Sequence[Any], highlight: str | None = None) -> go.Figure:
    """The task metric of each precision variant (ONNX Runtime CPU), coloured by precision, the chosen one outlined."""
    name = rows[0].metric if rows else "metric"
    figure = go.Figure(
        go.Bar(
            x=[str(row.variant) for row in rows],
            y=[row.value for row in rows],
            text=[f"{row.value:.4f}" for row in rows],
            textposition="outside",
            marker_color=[palette.precision_color(row.variant) for row in rows],
            marker_line=dict(width=[3 if row.variant == highlight else 0 for row in rows], color=palette.MARKER_EDGE),
            hovertemplate="%{x}: %{y:.4f}<extra></extra>",
        )
    )
    low = min((row.value for row in rows), default=0.0)
    figure.update_layout(
        title=f"{name} per precision ({rows[0].n_samples if rows else 0} samples)"
        + (f"; outlined: {highlight} (chosen)" if highlight else ""),
        yaxis_title=name,
        yaxis_range=[max(0.0, low - 0.05), 1.02 if all(r.value <= 1 for r in rows) else None],
        template=palette.TEMPLATE,
        margin=dict(l=60, r=20, t=50, b=50),
        height=320,
    )
    return figure


def metric_table_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Task-metric table: one row per variant (FP32 / INT8 / mixed) with its value, 95 % interval, sample count,
    paired difference to FP32, and INT8 node counts. Every cell has text (a dash where there is no number)."""
    keys = ("variant", "metric", "value", "interval", "n", "vs_fp32", "int8_nodes", "fallback")
    header = ["variant", "metric", "value", "95% interval", "samples", "vs FP32 [paired 95%]", "INT8 nodes", "fallback"]
    columns = [
        [f"{r[key]:.4f}" if isinstance(r.get(key), float) else str(r.get(key, "-")) for r in rows] for key in keys
    ]
    figure = go.Figure(
        go.Table(
            header={"values": header, "fill_color": palette.HEADER_FILL, "align": "left"},
            cells={"values": columns, "align": "left"},
            columnwidth=[110, 110, 60, 120, 60, 200, 70, 60],
        )
    )
    figure.update_layout(height=70 + 30 * max(1, len(rows)), margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return figure


def candidates_figure(candidates: Sequence[Any], chosen: str | None = None) -> go.Figure:
    """Accuracy against throughput, one marker per built engine coloured by its precision, the chosen one larger."""
    shown = [c for c in candidates if c.metric is not None and c.throughput_per_s is not None]
    figure = go.Figure(
        go.Scatter(
            x=[c.throughput_per_s for c in shown],
            y=[c.metric for c in shown],
            text=[c.precision for c in shown],
            mode="markers+text",
            textposition="top center",
            marker=dict(
                size=[18 if c.precision == chosen else 12 for c in shown],
                color=[palette.precision_color(c.variant) for c in shown],
                line=dict(width=[3 if c.precision == chosen else 0 for c in shown], color=palette.MARKER_EDGE),
            ),
        )
    )
    metric = next((c.metric_name for c in candidates if c.metric_name), "metric")
    figure.update_layout(
        title="Accuracy vs speed", xaxis_title="samples / s", yaxis_title=metric, template=palette.TEMPLATE, height=360
    )
    return figure
