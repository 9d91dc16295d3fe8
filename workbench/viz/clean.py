"""Figures for the cleaner: node-count waterfall per pass, op-count delta table, before/after neighbourhood.

Each function takes results and returns a plotly Figure; none shows anything.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.clean.report import CleanResult, PassReport
from workbench.viz import palette
from workbench.viz.layout import fit_to_container


def node_waterfall_figure(result: CleanResult) -> go.Figure:
    """Node count of the original, then each pass's change (rolled-back passes count zero), then the result."""
    names = ["original"] + [report.name for report in result.passes] + ["cleaned"]
    deltas = [(report.nodes_after - report.nodes_before) if report.changed else 0 for report in result.passes]
    texts = (
        [str(result.nodes_before)]
        + [
            f"{delta:+d}" if report.changed else ("rolled back" if report.status == "rolled_back" else "·")
            for report, delta in zip(result.passes, deltas)
        ]
        + [str(result.nodes_after)]
    )
    hover = (
        ["original model"]
        + [
            f"{report.name}: {report.status}<br>{report.nodes_before} → {report.nodes_after} nodes<br>"
            f"{report.seconds:.3f} s (+{report.check_seconds:.3f} s checks)<br>max |diff| {report.max_abs_diff}"
            + (f"<br>{report.failure}" if report.failure else "")
            + (f"<br>proven in one check with {', '.join(report.checked_with)}" if report.checked_with else "")
            for report in result.passes
        ]
        + ["cleaned model"]
    )
    figure = go.Figure(
        go.Waterfall(
            x=names,
            measure=["absolute"] + ["relative"] * len(deltas) + ["total"],
            y=[result.nodes_before] + deltas + [result.nodes_after],
            text=texts,
            textposition="outside",
            hovertext=hover,
            hoverinfo="text",
            decreasing={"marker": {"color": palette.DECREASE}},
            increasing={"marker": {"color": palette.INCREASE}},
            totals={"marker": {"color": palette.TOTAL}},
            connector={"line": {"color": palette.EDGE}},
        )
    )
    figure.update_layout(
        title=f"Nodes per pass: {result.nodes_before} → {result.nodes_after}",
        yaxis_title="nodes",
        showlegend=False,
        margin={"t": 50, "b": 120},
        height=420,
    )
    return fit_to_container(figure)


def op_delta_rows(result: CleanResult, pass_name: str | None = None) -> list[tuple[str, int, int, int]]:
    """(op type, before, after, after - before) for the op types that changed: whole run, or one pass."""
    if pass_name is None:
        before, after = result.op_counts_before, result.op_counts_after
    else:
        report = result.report(pass_name)
        before, after = report.op_counts_before, report.op_counts_after
    rows = [
        (op, before.get(op, 0), after.get(op, 0), after.get(op, 0) - before.get(op, 0))
        for op in set(before) | set(after)
    ]
    return sorted((row for row in rows if row[3]), key=lambda row: (row[3], row[0]))


def op_delta_table_figure(result: CleanResult, pass_name: str | None = None) -> go.Figure:
    rows = op_delta_rows(result, pass_name)
    columns: list[tuple[Any, ...]] = list(zip(*rows)) if rows else [(), (), (), ()]
    colors = [[palette.ADDED_FILL if delta < 0 else palette.REMOVED_FILL for delta in columns[3]]] * 4
    figure = go.Figure(
        go.Table(
            header={
                "values": ["op type", "before", "after", "delta"],
                "fill_color": palette.HEADER_FILL,
                "align": "left",
            },
            cells={"values": [list(c) for c in columns], "fill_color": colors, "align": "left"},
        )
    )
    scope = "whole run" if pass_name is None else pass_name
    figure.update_layout(
        title=f"Op-count changes ({scope}): {len(rows)} op types",
        height=max(220, 60 + 24 * len(rows)),
        margin={"t": 50, "b": 10},
    )
    return fit_to_container(figure)


def _node_key(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}:{node.output[0] if node.output else ''}"


def _neighbourhood(graph: onnx.GraphProto, centre: set[str], radius: int) -> list[onnx.NodeProto]:
    """Nodes of ``graph`` within ``radius`` tensor hops of the nodes whose keys are in ``centre``, in graph order."""
    producers: dict[str, str] = {}
    consumers: dict[str, list[str]] = defaultdict(list)
    for node in graph.node:
        key = _node_key(node)
        for name in node.output:
            producers[name] = key
        for name in node.input:
            consumers[name].append(key)
    by_key = {_node_key(node): node for node in graph.node}
    chosen = {key for key in centre if key in by_key}
    frontier = set(chosen)
    for _ in range(radius):
        grown: set[str] = set()
        for key in frontier:
            node = by_key[key]
            grown.update(producers[name] for name in node.input if name in producers)
            for name in node.output:
                grown.update(consumers.get(name, []))
        frontier = grown - chosen
        chosen |= grown
    return [node for node in graph.node if _node_key(node) in chosen]


def _layered_positions(nodes: list[onnx.NodeProto]) -> dict[str, tuple[float, float]]:
    """x = longest path depth within the shown nodes (they come topologically sorted), y = slot in that layer."""
    produced_by: dict[str, str] = {}
    depth: dict[str, int] = {}
    for node in nodes:
        key = _node_key(node)
        depth[key] = 1 + max((depth[produced_by[name]] for name in node.input if name in produced_by), default=-1)
        for name in node.output:
            produced_by[name] = key
    slots: dict[int, int] = defaultdict(int)
    positions = {}
    for node in nodes:
        key = _node_key(node)
        positions[key] = (float(depth[key]), -float(slots[depth[key]]))
        slots[depth[key]] += 1
    return positions


def _elide(text: str, limit: int = 12) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _rows_needed(nodes: list[onnx.NodeProto]) -> int:
    """The most nodes stacked in one depth column (the figure's height follows it)."""
    return max((-int(y) + 1 for _, y in _layered_positions(nodes).values()), default=1)


def _graph_traces(nodes: list[onnx.NodeProto], highlight: set[str], color: str) -> list[go.Scatter]:
    positions = _layered_positions(nodes)
    produced_by = {name: _node_key(node) for node in nodes for name in node.output}
    edge_x: list[float | None] = []
    edge_y: list[float | None] = []
    for node in nodes:
        target = positions[_node_key(node)]
        for name in node.input:
            if name in produced_by:
                source = positions[produced_by[name]]
                edge_x += [source[0], target[0], None]
                edge_y += [source[1], target[1], None]
    keys = [_node_key(node) for node in nodes]
    # neighbouring columns put their labels on opposite sides, and long op names are elided (full name on hover),
    # so labels of adjacent nodes do not pile on top of each other
    positions_of_depth = [positions[k][0] for k in keys]
    return [
        go.Scatter(
            x=edge_x,
            y=edge_y,
            mode="lines",
            line={"color": palette.EDGE, "width": 1},
            hoverinfo="skip",
            showlegend=False,
        ),
        go.Scatter(
            x=[positions[k][0] for k in keys],
            y=[positions[k][1] for k in keys],
            mode="markers+text",
            text=[_elide(node.op_type) for node in nodes],
            textposition=["top center" if int(x) % 2 == 0 else "bottom center" for x in positions_of_depth],
            textfont={"size": 10},
            hovertext=[
                f"{k}<br>{node.op_type}<br>in: {', '.join(node.input)}<br>out: {', '.join(node.output)}"
                for k, node in zip(keys, nodes)
            ],
            hoverinfo="text",
            marker={
                "size": 12,
                "color": [color if k in highlight else palette.GRAPH_NODE for k in keys],
                "line": {"width": 1, "color": palette.MARKER_EDGE},
            },
            showlegend=False,
        ),
    ]


def neighbourhood_figure(report: PassReport, radius: int = 1, max_changed: int = 40) -> go.Figure:
    """Before (removed nodes red) and after (added nodes green) of just the part of the graph a pass changed."""
    figure = make_subplots(rows=1, cols=2, subplot_titles=("before", "after"), horizontal_spacing=0.04)
    title = f"{report.name}: {report.status}, {report.nodes_before} → {report.nodes_after} nodes"
    if report.graph_before is None or report.graph_after is None or not (report.nodes_removed or report.nodes_added):
        note = report.failure or (
            "the pass changed no node (only weights, attributes or nothing)" if report.changed else "nothing changed"
        )
        figure.add_annotation(text=note, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        figure.update_layout(title=title, height=360)
        return fit_to_container(figure)
    removed, added = set(report.nodes_removed[:max_changed]), set(report.nodes_added[:max_changed])
    before_nodes = _neighbourhood(report.graph_before, removed, radius)
    shown_before = {_node_key(node) for node in before_nodes}
    after_nodes = _neighbourhood(report.graph_after, added | (shown_before - removed), radius if added else 0)
    for trace in _graph_traces(before_nodes, removed, palette.REMOVED):
        figure.add_trace(trace, row=1, col=1)
    for trace in _graph_traces(after_nodes, added, palette.ADDED):
        figure.add_trace(trace, row=1, col=2)
    shown = (
        f" (first {max_changed} changes)"
        if max(len(report.nodes_removed), len(report.nodes_added)) > max_changed
        else ""
    )
    figure.update_layout(
        title=f"{title}: −{len(report.nodes_removed)} / +{len(report.nodes_added)} nodes{shown}",
        # about 46 px per stacked node, so labels above and below markers never meet the next row
        height=int(min(1400, max(360, 140 + 46 * max(_rows_needed(before_nodes), _rows_needed(after_nodes))))),
        margin={"t": 70},
    )
    figure.update_xaxes(showticklabels=False, showgrid=False, zeroline=False)
    figure.update_yaxes(showticklabels=False, showgrid=False, zeroline=False)
    return fit_to_container(figure)
