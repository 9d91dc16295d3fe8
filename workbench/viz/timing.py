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


LABEL_ROOM = (0.08, 0.07)  # a label needs this share of the x and y axes free of other labels


def _label_points(points: Sequence[tuple[Any, Any]], log_y: bool, line_y: float | None = None) -> list[bool]:
    """Which points get a text label: greedily, in order, each one whose place (as a share of the axes) is not within
    :data:`LABEL_ROOM` of a label already placed, nor of a threshold line's label at the left end of ``line_y``; the
    others keep their name for the hover."""

    def coordinate(value: Any, log: bool) -> float | None:
        if not isinstance(value, (int, float)) or not math.isfinite(value) or (log and value <= 0):
            return None
        return math.log10(value) if log else float(value)

    xs = [coordinate(x, False) for x, _y in points]
    ys = [coordinate(y, log_y) for _x, y in points]

    def spans(values: list[float | None]) -> tuple[float, float]:
        finite = [v for v in values if v is not None]
        return (min(finite), (max(finite) - min(finite)) or 1.0) if finite else (0.0, 1.0)

    (x0, xw), (y0, yw) = spans(xs), spans(ys)
    placed: list[tuple[float, float]] = []
    line = coordinate(line_y, log_y)
    if line is not None:  # the line's label spans about the first tenth of the x axis
        placed += [(0.0, (line - y0) / yw), (LABEL_ROOM[0], (line - y0) / yw)]
    keep = []
    for x, y in zip(xs, ys, strict=True):
        if x is None or y is None:
            keep.append(False)
            continue
        here = ((x - x0) / xw, (y - y0) / yw)
        free = all(abs(here[0] - px) >= LABEL_ROOM[0] or abs(here[1] - py) >= LABEL_ROOM[1] for px, py in placed)
        keep.append(free)
        if free:
            placed.append(here)
    return keep


def threshold_line(figure: go.Figure, y: float, text: str, color: str, *, log_y: bool) -> None:
    """A dotted horizontal line at ``y`` labelled at its left end (the fastest configurations sit at the right).

    The label is an annotation of its own: on a log axis plotly places an annotation at 10**y, so the line's own
    annotation would land far off the chart; here its y is given as log10(y) there."""
    figure.add_hline(y=y, line_dash="dot", line_color=color)
    figure.add_annotation(
        x=0,
        xref="x domain",
        y=math.log10(y) if log_y else y,
        yref="y",
        text=text,
        showarrow=False,
        xanchor="left",
        yanchor="bottom",
        font={"color": color},
    )


def log_ticks(low: float, high: float) -> dict[str, object]:
    """Tick values and labels at 1, 2 and 5 of each decade between ``low`` and ``high`` for a log axis (plotly's own
    log ticks crowd a short range with small digits), and a range with a little room."""
    values = [
        m * 10.0**e
        for e in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
        for m in (1, 2, 5)
        if low / 1.5 <= m * 10.0**e <= high * 1.5
    ]
    return {
        "tickvals": values,
        "ticktext": [f"{v:g}" for v in values],
        "range": [math.log10(low / 1.5), math.log10(high * 1.5)],
    }


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
    for label in groups:
        groups[label] = sorted(groups[label], key=lambda p: _field(p, "throughput_per_s"))
    every = [
        (_field(p, "throughput_per_s"), _field(p, "latency_ms")[percentile]) for items in groups.values() for p in items
    ]
    latencies = [y for _x, y in every if isinstance(y, (int, float)) and math.isfinite(y) and y > 0]
    # one slow configuration (155 ms among 3 ms ones) must not flatten the rest onto the axis: log scale past 20x
    log_y = bool(latencies) and max(latencies) / min(latencies) > 20
    shown = _label_points(every, log_y, sla_ms)
    position = 0
    for index, (label, items) in enumerate(groups.items()):
        streams = [_field(p, "streams") for p in items]
        x = [_field(p, "throughput_per_s") for p in items]
        y = [_field(p, "latency_ms")[percentile] for p in items]
        # the measured spread: each axis's bootstrap 95% interval (the percentile's, throughput's over sub-windows)
        y_ci = [_finite_pair((_field(p, "latency_ci_ms") or {}).get(percentile)) for p in items]
        x_ci = [_finite_pair(_field(p, "throughput_ci_per_s")) for p in items]
        names = [f"{n} stream{'s' if n != 1 else ''}" for n in streams]
        labelled = shown[position : position + len(items)]
        position += len(items)
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
                # a label only where it does not land on another (every point names its streams on hover)
                text=[name if keep else "" for name, keep in zip(names, labelled, strict=True)],
                customdata=names,
                # alternate above/below so labels of neighbouring points do not overlap
                textposition=["top center" if i % 2 == 0 else "bottom center" for i in range(len(items))],
                hovertemplate="%{x:.0f} samples/s<br>"
                + percentile
                + " %{y:.2f} ms<br>%{customdata}<extra>"
                + label
                + "</extra>",
            )
        )
    if sla_ms is not None:
        threshold_line(figure, sla_ms, f"SLA {sla_ms:g} ms", palette.THRESHOLD, log_y=log_y)
    figure.update_layout(
        title=title,
        template=palette.TEMPLATE,
        xaxis_title="throughput (samples/s); markers labelled by streams",
        yaxis_title=f"{percentile} latency (ms)" + (", log scale" if log_y else ""),
        height=400,
        legend=dict(orientation="h", y=-0.25, yanchor="top", x=0, xanchor="left"),  # below: covers no title
        margin=dict(t=60, b=110),
    )
    if log_y:
        figure.update_yaxes(type="log", **log_ticks(min(latencies), max(latencies + ([sla_ms] if sla_ms else []))))
    return fit_to_container(figure)
