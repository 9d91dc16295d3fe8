"""Figures for serving: the SLA search's latency-throughput curves and the hot-reload timeline.

Functions take the typed results (or their JSON) and return plotly figures; they never compute statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from workbench.timing.serving.result import LoadProbe, ServeConfig, SlaSearchResult
from workbench.viz.layout import fit_to_container
from workbench.viz.timing import log_ticks, threshold_line

BUDGET_COLOR = "#d62728"
CHOSEN_COLOR = "#111111"
GRID_COLOR = "#c7c7c7"
VERSION_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")


def _config_label(config: ServeConfig) -> str:
    return f"{config.lanes} lanes, batch {config.max_batch}, delay {config.max_queue_delay_ms:g} ms"


def _p99_bars(probes: Sequence[LoadProbe]) -> dict[str, object]:
    """Each probe's p99 bootstrap 95% interval as error bars (none where it was not measured or is not finite)."""

    def ends(probe: LoadProbe) -> tuple[float, float]:
        low, high = probe.p99_ci_ms
        if not all(math.isfinite(v) for v in (low, high, probe.p99_ms)):
            return (0.0, 0.0)
        return (max(probe.p99_ms - low, 0.0), max(high - probe.p99_ms, 0.0))

    below, above = zip(*(ends(p) for p in probes), strict=True) if probes else ((), ())
    return {"type": "data", "symmetric": False, "array": list(above), "arrayminus": list(below), "thickness": 1}


def sla_search_figure(
    result: SlaSearchResult | Mapping[str, Any],
    *,
    grid: SlaSearchResult | Mapping[str, Any] | None = None,
    title: str | None = None,
) -> go.Figure:
    """p99 latency against achieved throughput for every probe of every configuration the search tried (one line
    per configuration, filled markers held the budget, open ones did not), the budget line, and the chosen point.
    With ``grid`` (an exhaustive search over the same space), its configurations are drawn underneath in grey."""
    result = SlaSearchResult.from_json(result) if isinstance(result, Mapping) else result
    grid = SlaSearchResult.from_json(grid) if isinstance(grid, Mapping) else grid
    figure = go.Figure()

    def add_curves(search: SlaSearchResult, background: bool) -> None:
        for index, tried in enumerate(search.tried):
            probes = sorted(tried.probes, key=lambda p: p.rate_per_s)
            if not probes:
                continue
            label = _config_label(tried.config)
            figure.add_trace(
                go.Scatter(
                    x=[p.throughput_per_s for p in probes],
                    y=[p.p99_ms if math.isfinite(p.p99_ms) else None for p in probes],
                    mode="lines+markers",
                    name=("grid: " if background else "") + label,
                    legendgroup="grid" if background else label,
                    showlegend=not background or index == 0,
                    line=dict(width=1, color=GRID_COLOR) if background else dict(width=1.5),
                    error_y=None if background else _p99_bars(probes),
                    marker=dict(
                        symbol=["circle" if p.passed else "circle-open" for p in probes],
                        size=5 if background else 8,
                        color=GRID_COLOR if background else None,
                    ),
                    customdata=[[p.rate_per_s, p.n_requests, p.mean_batch, p.why or "held"] for p in probes],
                    hovertemplate=(
                        label + "<br>offered %{customdata[0]:.0f}/s, achieved %{x:.0f}/s<br>p99 %{y:.2f} ms "
                        "(n=%{customdata[1]})<br>mean batch %{customdata[2]:.1f}<br>%{customdata[3]}<extra></extra>"
                    ),
                )
            )

    if grid is not None:
        add_curves(grid, background=True)
    add_curves(result, background=False)
    chosen = result.chosen.best if result.chosen is not None else None
    if chosen is not None:
        figure.add_trace(
            go.Scatter(
                x=[chosen.throughput_per_s],
                y=[chosen.p99_ms],
                mode="markers+text",
                name="chosen",
                marker=dict(symbol="star", size=16, color=CHOSEN_COLOR),
                text=[f"{_config_label(chosen.config)}: {chosen.rate_per_s:,.0f}/s"],
                textposition="bottom right",
                hovertemplate="chosen<br>%{x:.0f}/s, p99 %{y:.2f} ms<extra></extra>",
            )
        )
    threshold_line(figure, result.budget_ms, f"p99 budget {result.budget_ms:g} ms", BUDGET_COLOR, log_y=True)
    # a saturated probe's p99 can be 10^10 ms (requests never served): the axis holds the budget and the probes near
    # it, up to 100x the budget; probes above are off the top (their values in the hover text)
    finite = [
        p.p99_ms
        for search in (result, grid)
        if search is not None
        for tried in search.tried
        for p in tried.probes
        if math.isfinite(p.p99_ms) and p.p99_ms > 0
    ]
    top = min(max(finite, default=result.budget_ms), 100 * result.budget_ms)
    bottom = min(min(finite, default=result.budget_ms), result.budget_ms)
    y_axis = log_ticks(bottom, max(top, result.budget_ms))  # range with room, ticks at 1-2-5 of each decade
    runs = f"{result.strategy} search: {result.configurations} of {result.grid_size} configurations, {result.runs} runs"
    if grid is not None:
        runs += f" (grid: {grid.runs} runs, best {grid.best_rate_per_s:,.0f}/s)"
    figure.update_layout(
        title=title or f"{result.model} latency vs throughput, p99 budget {result.budget_ms:g} ms<br><sup>{runs}</sup>",
        template="plotly_white",
        xaxis_title="achieved throughput (requests/s, open loop)",
        yaxis_title="p99 latency (ms)",
        yaxis_type="log",
        height=460,
        legend=dict(font=dict(size=10)),
    )
    figure.update_yaxes(**y_axis)
    return fit_to_container(figure)


def reload_timeline_figure(
    arrivals_s: Sequence[float],
    latencies_ms: Sequence[float],
    versions: Sequence[str],
    *,
    swaps: Sequence[Mapping[str, Any]] = (),
    title: str = "Hot reload under load",
) -> go.Figure:
    """Each request's latency at its arrival time, coloured by the version that answered it; a vertical line per
    reload attempt (``swaps``: ReloadReport JSON with times relative to the same origin as ``arrivals_s``)."""
    figure = go.Figure()
    order = list(dict.fromkeys(versions))
    for index, version in enumerate(order):
        picked = [i for i, v in enumerate(versions) if v == version]
        figure.add_trace(
            go.Scattergl(
                x=[arrivals_s[i] for i in picked],
                y=[latencies_ms[i] for i in picked],
                mode="markers",
                name=f"version {version} ({len(picked)} responses)",
                marker=dict(size=3, color=VERSION_COLORS[index % len(VERSION_COLORS)]),
            )
        )
    for swap in swaps:
        accepted = bool(swap.get("accepted"))
        at = swap.get("swapped_s") if accepted else swap.get("started_s")
        if at is None:
            continue
        figure.add_vline(
            x=at,
            line_dash="solid" if accepted else "dot",
            line_color="#2ca02c" if accepted else BUDGET_COLOR,
            annotation_text=(f"→ {swap['new_version']}" if accepted else f"{swap['new_version']} rejected"),
            annotation_position="top",
        )
    figure.update_layout(
        title=title,
        template="plotly_white",
        xaxis_title="arrival time (s)",
        yaxis_title="latency (ms)",
        height=380,
    )
    return fit_to_container(figure)
