"""Figures for pipeline timing: per-stream Gantt timeline, latency histogram, latency-throughput curve.

Functions return plotly figures and never show them. The Gantt uses horizontal bars on a numeric millisecond axis
(``go.Bar(orientation='h', base=start, x=duration)``); ``px.timeline`` would force a date axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from workbench.viz import palette
from workbench.viz.layout import fit_to_container

if TYPE_CHECKING:
    from workbench.timing.result import TimingResult

HOST_LANE = "host enqueue"
QUEUE_LANE = "host queue"


def _get(record: Any, key: str) -> Any:
    return record[key] if isinstance(record, Mapping) else getattr(record, key)


def timeline_spans(
    records: Iterable[Any], start_ms: float | None = None, window_ms: float | None = None
) -> dict[str, list[tuple[str, float, float]]]:
    """Spans per stage as (lane label, start_ms, duration_ms), restricted to [start_ms, start_ms + window_ms)."""
    spans: dict[str, list[tuple[str, float, float]]] = {k: [] for k in palette.PIPELINE_STAGE_COLORS}
    lo = -math.inf if start_ms is None else start_ms
    hi = math.inf if window_ms is None else lo + window_ms

    def add(stage: str, lane: str, s: float, e: float) -> None:
        if not (math.isnan(s) or math.isnan(e)) and e >= s and e > lo and s < hi:
            spans[stage].append((lane, s, e - s))

    for r in records:
        lane = f"stream {_get(r, 'lane')}"
        add("enqueue", HOST_LANE, _get(r, "dispatch_ms"), _get(r, "enqueue_end_ms"))
        arrivals = _get(r, "arrivals_ms")
        if arrivals and _get(r, "dispatch_ms") > min(arrivals):
            add("queue", QUEUE_LANE, min(arrivals), _get(r, "dispatch_ms"))
        add("h2d", lane, _get(r, "h2d_start_ms"), _get(r, "h2d_end_ms"))
        add("compute", lane, _get(r, "h2d_end_ms"), _get(r, "compute_end_ms"))
        add("d2h", lane, _get(r, "compute_end_ms"), _get(r, "d2h_end_ms"))
    return spans


def default_window(records: Sequence[Any], n_requests: int = 60) -> tuple[float, float]:
    """A readable window: from the first measured dispatch, long enough to hold ~``n_requests`` requests."""
    measured = [r for r in records if _get(r, "measured")] or list(records)
    if not measured:
        return 0.0, 1.0
    start = _get(measured[0], "dispatch_ms")
    ends = [_get(r, "d2h_end_ms") for r in measured[:n_requests]]
    end = max((e for e in ends if not math.isnan(e)), default=start + 1.0)
    return start, max(end - start, 1e-3)


def gantt_figure(
    records: Sequence[Any],
    *,
    start_ms: float | None = None,
    window_ms: float | None = None,
    title: str = "Pipeline timeline",
) -> go.Figure:
    """One row per stream (H2D / compute / D2H) plus host rows (enqueue, queue); x in ms since the run's t=0."""
    if start_ms is None or window_ms is None:
        start_ms, window_ms = default_window(records)
    spans = timeline_spans(records, start_ms, window_ms)
    lanes = sorted(
        {lane for items in spans.values() for lane, _, _ in items if lane.startswith("stream")},
        key=lambda s: int(s.split()[1]),
    )
    order = [HOST_LANE] + ([QUEUE_LANE] if spans["queue"] else []) + lanes
    figure = go.Figure()
    for stage, items in spans.items():
        if not items:
            continue
        figure.add_trace(
            go.Bar(
                name=stage,
                orientation="h",
                y=[i[0] for i in items],
                base=[i[1] for i in items],
                x=[i[2] for i in items],
                marker_color=palette.PIPELINE_STAGE_COLORS[stage],
                marker_line_width=0,
                hovertemplate=f"{stage}<br>start %{{base:.3f}} ms<br>%{{x:.3f}} ms<extra>%{{y}}</extra>",
            )
        )
    figure.update_layout(
        title=title,
        barmode="overlay",
        template=palette.TEMPLATE,
        height=220 + 28 * len(order),
        xaxis=dict(title="time since t0 (ms)", type="linear", range=[start_ms, start_ms + window_ms]),
        yaxis=dict(categoryorder="array", categoryarray=list(reversed(order)), title=None),
        legend=dict(orientation="h", y=-0.15, yanchor="top", x=0, xanchor="left"),  # below the axis: covers nothing
        margin=dict(l=110, r=20, t=60, b=90),
    )
    return fit_to_container(figure)


def latency_histogram(
    latencies_ms: Sequence[float], *, percentiles: Mapping[str, float] | None = None, title: str = "Request latency"
) -> go.Figure:
    data = np.asarray(latencies_ms, dtype=float)
    data = data[np.isfinite(data)]
    # robust range: a few outliers (e.g. one 155 ms request among 2 ms ones) must not squash the histogram;
    # they are counted in the title instead of drawn
    limit = float(np.percentile(data, 99.5)) * 1.5 if data.size else math.inf
    shown, outliers = data[data <= limit], data[data > limit]
    figure = go.Figure(go.Histogram(x=shown, nbinsx=60, marker_color=palette.NEUTRAL, name="requests"))
    if outliers.size:
        title += f" ({outliers.size} outlier(s) up to {outliers.max():.1f} ms not drawn)"
    for name, value in (percentiles or {}).items():
        if value is not None and not math.isnan(value):
            figure.add_vline(
                x=value,
                line_dash="dash",
                line_color=palette.THRESHOLD,
                annotation_text=f"{name} {value:.2f} ms",
                annotation_position="top",
            )
    figure.update_layout(
        title=title,
        template=palette.TEMPLATE,
        xaxis_title="latency (ms)",
        yaxis_title="requests",
        height=320,
        bargap=0.02,
        margin=dict(t=70),
    )
    return fit_to_container(figure)


def chosen_title(chosen: TimingResult) -> str:
    """The title of a timing figure whose first result is the configuration the user chose."""
    return f"Pipeline timing, chosen {chosen.streams} stream(s) x batch {chosen.batch}: {chosen.executor_label}"


def _field(point: Any, key: str, default: Any = None) -> Any:
    if isinstance(point, Mapping):
        return point.get(key, default)
    return getattr(point, key, default)


def sweep_point(result: TimingResult) -> dict[str, object]:
    """A TimingResult as a point of :func:`latency_throughput_figure`, its series named by executor, batch, load,
    batching and whether a requested CUDA graph fell back (so runs of different settings draw separate curves)."""
    series = f"{result.executor} b{result.batch} {result.load}"
    if result.dynamic_batching:
        series += f" batched {result.dynamic_batching['max_queue_delay_ms']:g}ms"
    if result.cuda_graph.get("requested") and not result.cuda_graph.get("active") and result.executor != "cpu":
        series += " (graph fell back)"
    return {
        "series": series,
        "streams": result.streams,
        "batch": result.batch,
        "throughput_per_s": result.throughput_per_s,
        "latency_ms": dict(result.latency_ms),
        "latency_ci_ms": dict(result.latency_ci_ms),
        "window_throughputs": tuple(result.window_throughputs),
        "throughput_ci_per_s": tuple(result.throughput_ci_per_s),
    }


def _finite_pair(pair: Sequence[float] | None) -> tuple[float, float] | None:
    """An interval ``(low, high)`` when both ends were measured, else None (drawn without a bar)."""
    if not pair or len(pair) != 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in pair):
        return None
    return (float(pair[0]), float(pair[1]))


def latency_throughput_figure(
    points: Sequence[Any],
    *,
    sla_ms: float | None = None,
    percentile: str = "p99",
    title: str = "Latency vs throughput",
) -> go.Figure:
    """One curve per series (e.g. batch size or batching on/off); one marker per timed configuration.

    ``points`` are :class:`~workbench.timing.TimingResult` objects or their ``to_json()`` dicts (anything with
    throughput_per_s, latency_ms, streams, batch), each with an optional "series" label (default: its batch size).
    """
    figure = go.Figure()
    groups: dict[str, list[Any]] = {}
    for p in points:
        label = str(_field(p, "series") or f"batch {_field(p, 'batch')}")
        groups.setdefault(label, []).append(p)
    for index, (label, items) in enumerate(groups.items()):
        items = sorted(items, key=lambda p: _field(p, "throughput_per_s"))
        streams = [_field(p, "streams") for p in items]
        x = [_field(p, "throughput_per_s") for p in items]
        y = [_field(p, "latency_ms")[percentile] for p in items]
        # the measured spread: each axis's bootstrap 95% interval (the percentile's, throughput's over sub-windows)
        y_ci = [_finite_pair((_field(p, "latency_ci_ms") or {}).get(percentile)) for p in items]
        x_ci = [_finite_pair(_field(p, "throughput_ci_per_s")) for p in items]
        figure.add_trace(
            go.Scatter(
                x=x,
                y=y,
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [max(ci[1] - v, 0.0) if ci else 0 for ci, v in zip(y_ci, y, strict=True)],
                    "arrayminus": [max(v - ci[0], 0.0) if ci else 0 for ci, v in zip(y_ci, y, strict=True)],
                    "thickness": 1,
                },
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": [max(ci[1] - v, 0.0) if ci else 0 for ci, v in zip(x_ci, x, strict=True)],
                    "arrayminus": [max(v - ci[0], 0.0) if ci else 0 for ci, v in zip(x_ci, x, strict=True)],
                    "thickness": 1,
                },
                mode="lines+markers+text",
                name=label,
                line_color=palette.SERIES_COLORS[index % len(palette.SERIES_COLORS)],
                text=[f"{n} stream{'s' if n != 1 else ''}" for n in streams],
                # alternate above/below so labels of neighbouring points do not overlap
                textposition=["top center" if i % 2 == 0 else "bottom center" for i in range(len(items))],
                hovertemplate="%{x:.0f} samples/s<br>"
                + percentile
                + " %{y:.2f} ms<br>%{text}<extra>"
                + label
                + "</extra>",
            )
        )
    if sla_ms is not None:
        figure.add_hline(
            y=sla_ms,
            line_dash="dot",
            line_color=palette.THRESHOLD,
            annotation_text=f"SLA {sla_ms:g} ms",
            annotation_position="bottom right",
        )
    figure.update_layout(
        title=title,
        template=palette.TEMPLATE,
        xaxis_title="throughput (samples/s); markers labelled by streams",
        yaxis_title=f"{percentile} latency (ms)",
        height=400,
        legend=dict(orientation="h", y=-0.25, yanchor="top", x=0, xanchor="left"),  # below: covers no title
        margin=dict(t=60, b=110),
    )
    return fit_to_container(figure)
