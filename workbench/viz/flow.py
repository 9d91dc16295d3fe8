"""Figures of the quickstart journey: functions from stage results to plotly figures. None calls ``show()``.

Inputs are the real objects the stages produce (CleanResult, fusion rows, LayerDiff, MetricRow list, TimingResult
list); nothing here computes or invents a number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

PRECISION_COLORS = {"fp32": "#4C78A8", "fp16": "#F58518", "int8": "#54A24B", "bf16": "#B279A2"}
_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=50), height=360)


def cleaning_waterfall(clean_result: Any) -> go.Figure:
    """ONNX node count from the original model through every cleaning pass to the cleaned model."""
    passes = list(clean_result.passes)
    labels = ["original"] + [p.name for p in passes] + ["cleaned"]
    values = [clean_result.nodes_before] + [p.nodes_after - p.nodes_before for p in passes] + [clean_result.nodes_after]
    measures = ["absolute"] + ["relative"] * len(passes) + ["total"]
    hover = (
        ["ONNX nodes in the model as shipped"]
        + [
            f"{p.status}; {p.seconds * 1e3:.0f} ms"
            + (f"; max |diff| {p.max_abs_diff:.2e}" if p.max_abs_diff is not None else "")
            + (f"; rolled back: {p.failure}" if p.failure else "")
            for p in passes
        ]
        + ["ONNX nodes after cleaning"]
    )
    figure = go.Figure(
        go.Waterfall(
            x=labels,
            y=values,
            measure=measures,
            hovertext=hover,
            textposition="outside",
            text=[str(v) for v in values],
            connector={"line": {"color": "#999"}},
        )
    )
    figure.update_layout(
        title=f"Cleaning: {clean_result.nodes_before} -> {clean_result.nodes_after} ONNX nodes",
        yaxis_title="ONNX nodes",
        **_LAYOUT,
    )
    return figure


def fusion_figure(rows: Sequence[dict[str, Any]], title: str = "Fusion view") -> go.Figure:
    """One bar per engine layer: how many ONNX nodes it absorbed, coloured by precision; hover lists the nodes."""
    figure = go.Figure()
    for precision in sorted({row["precision"] for row in rows}):
        chosen = [row for row in rows if row["precision"] == precision]
        figure.add_trace(
            go.Bar(
                y=[row["layer"] for row in chosen],
                x=[len(row["onnx_nodes"]) for row in chosen],
                orientation="h",
                name=precision,
                marker_color=PRECISION_COLORS.get(precision, "#999"),
                customdata=[
                    [row["type"], "<br>".join(row["onnx_nodes"]) or "(no ONNX node: inserted by TensorRT)"]
                    for row in chosen
                ],
                hovertemplate="%{y}<br>type %{customdata[0]}<br>ONNX nodes:<br>%{customdata[1]}<extra>"
                + precision
                + "</extra>",
            )
        )
    order = [row["layer"] for row in rows]
    figure.update_layout(
        title=title,
        xaxis_title="ONNX nodes fused into the layer",
        barmode="stack",
        yaxis=dict(categoryorder="array", categoryarray=order[::-1], automargin=True),
        **{**_LAYOUT, "height": max(300, 22 * len(rows) + 120)},
    )
    return figure


def layer_diff_figure(diff: Any, fallback: Sequence[str] = ()) -> go.Figure:
    """Accumulated SQNR (INT8 vs FP32) per activation in graph order, and the local SQNR of quantized inputs."""
    activations = sorted((t for t in diff.tensors if t.kind == "activation"), key=lambda t: t.index)
    x = [f"{t.index}: {t.node}" for t in activations]
    colors = ["#E45756" if t.node in fallback else "#4C78A8" for t in activations]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=x,
            y=[t.sqnr_db_accumulated for t in activations],
            mode="lines+markers",
            name="accumulated SQNR (dB)",
            marker=dict(color=colors, size=9),
            customdata=[[t.name, t.drop_db, t.cause or ""] for t in activations],
            hovertemplate="%{x}<br>%{customdata[0]}<br>SQNR %{y:.1f} dB, drop %{customdata[1]:.1f} dB<br>%{customdata[2]}<extra></extra>",
        )
    )
    local = [t for t in activations if t.sqnr_db_local is not None]
    if local:
        figure.add_trace(
            go.Bar(
                x=[f"{t.index}: {t.node}" for t in local],
                y=[t.sqnr_db_local for t in local],
                name="local SQNR of its own Q/DQ (dB)",
                marker_color="#BAB0AC",
                opacity=0.6,
            )
        )
    figure.update_layout(
        title=f"Per-layer INT8 diff on {diff.num_samples} samples (red: fallen back to FP32)",
        yaxis_title="SQNR vs FP32 (dB, higher is better)",
        xaxis_tickangle=-40,
        **_LAYOUT,
    )
    return figure


def metrics_figure(rows: Sequence[Any], highlight: str | None = None) -> go.Figure:
    """The task metric of each precision variant (ONNX Runtime CPU), the chosen one outlined."""
    figure = go.Figure(
        go.Bar(
            x=[row.variant for row in rows],
            y=[row.value for row in rows],
            text=[f"{row.value:.4f}" for row in rows],
            textposition="outside",
            marker_color=["#54A24B" if row.variant == highlight else "#9ecae9" for row in rows],
            marker_line=dict(width=[3 if row.variant == highlight else 0 for row in rows], color="#222"),
        )
    )
    name = rows[0].metric if rows else "metric"
    low = min((row.value for row in rows), default=0.0)
    figure.update_layout(
        title=f"{name} per precision ({rows[0].n_samples if rows else 0} samples)",
        yaxis_title=name,
        yaxis_range=[max(0.0, low - 0.05), 1.02 if all(r.value <= 1 for r in rows) else None],
        **{**_LAYOUT, "height": 320},
    )
    return figure


def timing_figure(results: Sequence[Any]) -> go.Figure:
    """Throughput and p50/p99 latency of each timed (streams, batch) configuration."""
    labels = [f"{r.streams} stream(s) x batch {r.batch}" for r in results]
    figure = go.Figure()
    figure.add_trace(
        go.Bar(
            x=labels,
            y=[r.throughput_per_s for r in results],
            name="throughput (samples/s)",
            text=[f"{r.throughput_per_s:.0f}" for r in results],
            textposition="outside",
            marker_color="#4C78A8",
        )
    )
    for quantile, color in (("p50", "#F58518"), ("p99", "#E45756")):
        figure.add_trace(
            go.Scatter(
                x=labels,
                y=[r.latency_ms.get(quantile, math.nan) for r in results],
                name=f"{quantile} latency (ms)",
                yaxis="y2",
                mode="markers+lines",
                marker=dict(color=color, size=10),
            )
        )
    executor = results[0].executor_label if results else ""
    figure.update_layout(
        title=f"Pipeline timing: {executor}",
        yaxis_title="samples / s",
        yaxis2=dict(title="latency (ms)", overlaying="y", side="right", rangemode="tozero"),
        legend=dict(orientation="h", y=-0.2),
        **{**_LAYOUT, "height": 380},
    )
    return figure
