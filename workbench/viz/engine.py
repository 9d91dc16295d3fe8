"""Figures for the layer map: ONNX nodes beside engine layers, the layer table, fusion statistics and diffs.

Every function returns a plotly figure and never shows it. Large graphs stay readable because consecutive ONNX
nodes are collapsed by name scope (``/encoder/layer.3/...``) once there are more than ``max_items`` of them.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.engine.layermap import FusionDiff, LayerEntry, LayerMap, NodeEntry
from workbench.viz import palette
from workbench.viz.layout import fit_to_container
from workbench.viz.palette import precision_color

if TYPE_CHECKING:
    from collections.abc import Callable

    import plotly.graph_objects as go

INSERTED_SYMBOL = "diamond"
# Trace names the panel looks traces up by.
LINKS_TRACE, NODES_TRACE, LAYERS_TRACE, HIGHLIGHT_TRACE = "links", "ONNX nodes", "engine layers", "selection"
SORT_COLUMNS = ("index", "name", "type", "precision", "onnx nodes", "tactic")


@dataclass
class NodeItem:
    """One marker in the ONNX column: a single node, or a run of consecutive nodes of one name scope."""

    label: str
    members: list[NodeEntry]
    precision: str  # precision of the layers that absorbed it, or "folded"
    layers: list[int] = field(default_factory=list)  # indices into LayerMap.layers

    @property
    def collapsed(self) -> bool:
        return len(self.members) > 1


@dataclass
class SideBySide:
    """The geometry of the side-by-side view, computed once and shared by figure and panel."""

    items: list[NodeItem]
    layers: list[LayerEntry]
    item_of_node: dict[str, int]
    collapsed_by: str  # "" (one marker per node), "scope depth N" or "runs of N nodes"

    def _spread(self, position: int, count: int) -> float:
        # both columns span the same height so links stay short and roughly horizontal
        height = max(len(self.items), len(self.layers)) - 1
        return -position * height / (count - 1) if count > 1 else 0.0

    def node_y(self, item: int) -> float:
        return self._spread(item, len(self.items))

    def layer_y(self, layer: int) -> float:
        return self._spread(layer, len(self.layers))


def _scope_key(name: str, depth: int) -> str:
    """The name scope of a node cut at ``depth`` (never deeper than the node's own scope); "" for unscoped names."""
    parts = [p for p in name.split("/") if p]
    if len(parts) <= 1:
        return ""
    return "/".join(parts[: min(depth, len(parts) - 1)])


def _runs(nodes: Sequence[NodeEntry], key: Callable[[NodeEntry], str]) -> list[list[NodeEntry]]:
    """Consecutive nodes with the same key form a run; nodes without a key (unscoped names such as an exporter's
    ``Constant_163``) join the run before them instead of breaking it."""
    runs: list[list[NodeEntry]] = []
    last: str | None = None
    for node in nodes:
        k = key(node)
        if runs and (k == "" or k == last):
            runs[-1].append(node)
            continue
        runs.append([node])
        last = k
    return runs


def collapse_nodes(nodes: Sequence[NodeEntry], max_items: int) -> tuple[list[list[NodeEntry]], str]:
    """Group consecutive nodes (topological order kept) into at most ``max_items`` groups: by ONNX name scope at the
    depth that gives the most groups within the limit, or, for names without scopes, into runs of equal length."""
    if len(nodes) <= max_items:
        return [[node] for node in nodes], ""
    best: list[list[NodeEntry]] = []
    how = ""
    deepest = max((len([p for p in node.name.split("/") if p]) for node in nodes), default=0)
    for depth in range(1, deepest):
        runs = _runs(nodes, lambda n, d=depth: _scope_key(n.name, d))
        if len(best) < len(runs) <= max_items:
            best, how = runs, f"scope depth {depth}"
    if len(best) < 2:
        size = math.ceil(len(nodes) / max_items)
        return [list(nodes[i : i + size]) for i in range(0, len(nodes), size)], f"runs of {size} nodes"
    return best, how


def side_by_side_layout(layer_map: LayerMap, *, max_items: int = 400, hide_folded: bool = False) -> SideBySide:
    layer_index = {layer.name: layer.index for layer in layer_map.layers}
    nodes = [node for node in layer_map.nodes if not (hide_folded and node.folded)]
    groups, how = collapse_nodes(nodes, max_items)
    items: list[NodeItem] = []
    item_of_node: dict[str, int] = {}
    for members in groups:
        layer_ids = sorted(
            {layer_index[name] for node in members for name in node.engine_layers if name in layer_index}
        )
        if not layer_ids:
            precision = "folded"
        else:
            precision = Counter(layer_map.layers[i].precision for i in layer_ids).most_common(1)[0][0]
        if len(members) == 1:
            label = members[0].name or members[0].op_type
        else:
            scope = _common_scope([m.name for m in members])
            label = f"{scope or members[0].name} ({len(members)} nodes)"
        for node in members:
            item_of_node[node.name] = len(items)
        items.append(NodeItem(label, list(members), precision, layer_ids))
    return SideBySide(items, list(layer_map.layers), item_of_node, how)


def _common_scope(names: Sequence[str]) -> str:
    split = [[p for p in name.split("/") if p][:-1] for name in names if "/" in name.strip("/")]
    common: list[str] = []
    for parts in zip(*split):
        if all(p == parts[0] for p in parts):
            common.append(parts[0])
        else:
            break
    return "/" + "/".join(common) if common else ""


def _node_hover(item: NodeItem, layers: Sequence[LayerEntry]) -> str:
    if item.collapsed:
        ops = Counter(m.op_type for m in item.members).most_common(6)
        lines = [
            f"<b>{html.escape(item.label)}</b>",
            "ops: " + ", ".join(f"{op}×{n}" for op, n in ops),
            f"folded: {sum(1 for m in item.members if m.folded)} of {len(item.members)}",
        ]
    else:
        node = item.members[0]
        lines = [
            f"<b>{html.escape(node.name)}</b>",
            f"op: {node.op_type}",
            "folded away (in no engine layer)" if node.folded else f"in {len(node.engine_layers)} layer(s)",
        ]
    for index in item.layers[:6]:
        lines.append(f"→ {html.escape(layers[index].name)} [{layers[index].precision}]")
    if len(item.layers) > 6:
        lines.append(f"… {len(item.layers) - 6} more layers")
    return "<br>".join(lines)


def _layer_hover(layer: LayerEntry) -> str:
    lines = [
        f"<b>{html.escape(layer.name)}</b>",
        f"type: {html.escape(layer.layer_type)}",
        f"precision: {layer.precision}" + (f" (tensors: {', '.join(layer.datatypes)})" if layer.datatypes else ""),
    ]
    if layer.tactic:
        lines.append(f"tactic: {html.escape(layer.tactic[:90])}")
    if layer.op_tokens:
        lines.append("fused ops: " + " ".join(layer.op_tokens))
    if layer.inserted:
        lines.append("inserted by TensorRT (no ONNX source)")
    else:
        lines.append(f"{len(layer.onnx_nodes)} ONNX node(s):")
        lines += [f"  {html.escape(n)}" for n in layer.onnx_nodes[:8]]
        if len(layer.onnx_nodes) > 8:
            lines.append(f"  … {len(layer.onnx_nodes) - 8} more")
    return "<br>".join(lines)


def side_by_side_figure(
    layer_map: LayerMap,
    *,
    max_items: int = 400,
    hide_folded: bool = False,
    layout: SideBySide | None = None,
    title: str | None = None,
) -> go.Figure:
    """ONNX nodes (left, topological order) linked to the engine layers that execute them (right).

    Markers are coloured by precision; folded nodes are light grey, layers TensorRT inserted are diamonds. Over
    ``max_items`` nodes, consecutive nodes of one name scope collapse into one marker. Trace order is fixed:
    links, ONNX nodes, engine layers, selection (empty; the panel fills it), then legend entries.
    """
    import plotly.graph_objects as go

    view = layout or side_by_side_layout(layer_map, max_items=max_items, hide_folded=hide_folded)
    link_x: list[float | None] = []
    link_y: list[float | None] = []
    for item_index, item in enumerate(view.items):
        for layer_index in item.layers:
            link_x += [0.0, 1.0, None]
            link_y += [view.node_y(item_index), view.layer_y(layer_index), None]
    many = max(len(view.items), len(view.layers)) > 120
    node_text = [item.label if len(item.label) <= 48 else "…" + item.label[-47:] for item in view.items]
    layer_text = [layer.name if len(layer.name) <= 48 else layer.name[:47] + "…" for layer in view.layers]
    fig = go.Figure()
    fig.add_trace(
        go.Scattergl(
            x=link_x,
            y=link_y,
            mode="lines",
            name=LINKS_TRACE,
            hoverinfo="skip",
            showlegend=False,
            line={"color": palette.LINK, "width": 1},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[0.0] * len(view.items),
            y=[view.node_y(i) for i in range(len(view.items))],
            mode="markers" if many else "markers+text",
            text=node_text,
            textposition="middle left",
            name=NODES_TRACE,
            marker={
                "color": [precision_color(item.precision) for item in view.items],
                "size": [12 if item.collapsed else 9 for item in view.items],
                "symbol": ["square" if item.collapsed else "circle" for item in view.items],
                "line": {"width": 0.5, "color": palette.MARKER_EDGE},
            },
            hovertext=[_node_hover(item, view.layers) for item in view.items],
            hoverinfo="text",
            customdata=list(range(len(view.items))),
            showlegend=False,
            selected={"marker": {"opacity": 1.0}},
            unselected={"marker": {"opacity": 0.25}},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[1.0] * len(view.layers),
            y=[view.layer_y(i) for i in range(len(view.layers))],
            mode="markers" if many else "markers+text",
            text=layer_text,
            textposition="middle right",
            name=LAYERS_TRACE,
            marker={
                "color": [precision_color(layer.precision) for layer in view.layers],
                "size": [9 + min(len(layer.onnx_nodes), 12) for layer in view.layers],
                "symbol": [INSERTED_SYMBOL if layer.inserted else "circle" for layer in view.layers],
                "line": {"width": 0.5, "color": palette.MARKER_EDGE},
            },
            hovertext=[_layer_hover(layer) for layer in view.layers],
            hoverinfo="text",
            customdata=list(range(len(view.layers))),
            showlegend=False,
            selected={"marker": {"opacity": 1.0}},
            unselected={"marker": {"opacity": 0.25}},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[],
            y=[],
            mode="lines",
            name=HIGHLIGHT_TRACE,
            hoverinfo="skip",
            showlegend=False,
            line={"color": palette.SELECTION, "width": 3},
        )
    )
    present = sorted({item.precision for item in view.items} | {layer.precision for layer in view.layers})
    for precision in present:
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=precision,
                marker={"color": precision_color(precision), "size": 10},
            )
        )
    if view.layers and any(layer.inserted for layer in view.layers):
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name="inserted by TensorRT",
                marker={"color": palette.INSERTED, "symbol": INSERTED_SYMBOL, "size": 10},
            )
        )
    stats = layer_map.stats()
    subtitle = (
        f"{stats.onnx_nodes} ONNX nodes ({stats.folded_nodes} folded) → {stats.engine_layers} engine layers "
        f"({stats.inserted_layers} inserted)"
        + (f"; nodes collapsed by {view.collapsed_by}" if view.collapsed_by else "")
    )
    rows = max(len(view.items), len(view.layers), 1)
    fig.update_layout(
        title={"text": (title or f"Fusions: {layer_map.label or 'engine'}") + f"<br><sup>{subtitle}</sup>"},
        height=int(min(20000, max(500, 16 * rows + 160))),
        plot_bgcolor="white",
        hovermode="closest",
        xaxis={
            "range": [-0.9, 1.9],
            "showgrid": False,
            "zeroline": False,
            "tickvals": [0, 1],
            "ticktext": ["ONNX nodes (topological order)", "engine layers"],
            "side": "top",
        },
        yaxis={"showgrid": False, "zeroline": False, "showticklabels": False},
        margin={"l": 20, "r": 20, "t": 110, "b": 20},
        clickmode="event+select",
        dragmode="pan",
        legend={"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1.0, "xanchor": "right"},
    )
    return fit_to_container(fig)


def layer_table_rows(
    layer_map: LayerMap, sort_by: str = "index", descending: bool = False
) -> list[dict[str, int | str]]:
    """One row per engine layer, sorted by a column of :data:`SORT_COLUMNS`."""
    if sort_by not in SORT_COLUMNS:
        from workbench.errors import WorkbenchError

        raise WorkbenchError(f"cannot sort the layer table by {sort_by!r}.", expected=", ".join(SORT_COLUMNS))
    rows = [
        {
            "index": layer.index,
            "name": layer.name,
            "type": layer.layer_type,
            "precision": layer.precision,
            "onnx nodes": len(layer.onnx_nodes),
            "tactic": layer.tactic,
            "nodes": ", ".join(layer.onnx_nodes[:6])
            + (f" … +{len(layer.onnx_nodes) - 6}" if len(layer.onnx_nodes) > 6 else "")
            or "(inserted by TensorRT)",
        }
        for layer in layer_map.layers
    ]
    return sorted(rows, key=lambda row: (row[sort_by], row["index"]), reverse=descending)


def layer_table_figure(layer_map: LayerMap, sort_by: str = "index", descending: bool = False) -> go.Figure:
    """The engine layers as a table (sorted by ``sort_by``), precision cells coloured like the side-by-side view."""
    import plotly.graph_objects as go

    rows = layer_table_rows(layer_map, sort_by, descending)
    columns = ["index", "name", "type", "precision", "onnx nodes", "nodes", "tactic"]
    fill = [[palette.CELL_FILL] * len(rows) for _ in columns]
    fill[3] = [precision_color(row["precision"]) for row in rows]
    fig = go.Figure(
        go.Table(
            columnwidth=[40, 220, 90, 70, 60, 320, 200],
            header={
                "values": [
                    f"<b>{c}</b>" + (" ▼" if c == sort_by and descending else " ▲" if c == sort_by else "")
                    for c in columns
                ],
                "fill_color": palette.HEADER_FILL,
                "align": "left",
            },
            cells={
                "values": [[row[c] for row in rows] for c in columns],
                "fill_color": fill,
                "align": "left",
                "font": {"size": 11},
            },
        )
    )
    fig.update_layout(
        title=f"Engine layers of {layer_map.label or 'engine'} (sorted by {sort_by})",
        height=min(1400, 120 + 24 * max(len(rows), 1)),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fit_to_container(fig)


def fusion_stats_figure(layer_map: LayerMap) -> go.Figure:
    """Group sizes (ONNX nodes per engine layer), layers per precision, and the Q/DQ audit counts."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    stats = layer_map.stats()
    audit = Counter(pair.status for pair in layer_map.qdq_audit())
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("ONNX nodes per engine layer", "layers per precision", "Q/DQ pairs")
    )
    sizes = sorted(stats.group_sizes)
    fig.add_trace(
        go.Bar(
            x=[str(s) for s in sizes],
            y=[stats.group_sizes[s] for s in sizes],
            name="layers",
            marker_color=palette.NEUTRAL,
            showlegend=False,
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=list(stats.by_precision),
            y=list(stats.by_precision.values()),
            showlegend=False,
            marker_color=[precision_color(p) for p in stats.by_precision],
        ),
        row=1,
        col=2,
    )
    statuses = ["int8-kernel", "fp8-kernel", "standalone", "folded"]
    fig.add_trace(
        go.Bar(
            x=statuses,
            y=[audit.get(s, 0) for s in statuses],
            showlegend=False,
            marker_color=[palette.INT8, palette.FP8, palette.WARNING, palette.FOLDED],
        ),
        row=1,
        col=3,
    )
    fig.update_layout(
        title=f"{stats.onnx_nodes} ONNX nodes ({stats.onnx_compute_nodes} compute) → {stats.engine_layers} "
        f"layers; {stats.folded_nodes} nodes folded, {stats.inserted_layers} layers inserted",
        height=340,
        margin={"t": 80, "b": 30},
    )
    return fit_to_container(fig)


def fusion_diff_figure(diff: FusionDiff, max_rows: int = 200) -> go.Figure:
    """Counts of fusions kept, gained and lost between two builds, and a table of the changed node groups."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    summary = diff.summary()
    fig = make_subplots(
        rows=2, cols=1, row_heights=[0.3, 0.7], vertical_spacing=0.08, specs=[[{"type": "xy"}], [{"type": "table"}]]
    )
    names = ["common", "gained", "lost", "precision_changed"]
    fig.add_trace(
        go.Bar(
            x=names,
            y=[summary[n] for n in names],
            marker_color=[palette.UNCHANGED, palette.ADDED, palette.REMOVED, palette.CHANGED],
            text=[summary[n] for n in names],
            textposition="outside",
            showlegend=False,
        ),
        row=1,
        col=1,
    )
    rows: list[tuple[str, str, str, str, str]] = []
    for group in diff.gained:
        rows.append(("gained", group.layer, group.layer_type, group.precision, ", ".join(sorted(group.nodes))))
    for group in diff.lost:
        rows.append(("lost", group.layer, group.layer_type, group.precision, ", ".join(sorted(group.nodes))))
    for before, after in diff.precision_changes:
        rows.append(
            (
                "precision",
                after.layer,
                after.layer_type,
                f"{before.precision}→{after.precision}",
                ", ".join(sorted(after.nodes)),
            )
        )
    rows = rows[:max_rows]
    colors = {"gained": palette.ADDED_FILL, "lost": palette.REMOVED_FILL, "precision": palette.CHANGED_FILL}
    fig.add_trace(
        go.Table(
            columnwidth=[60, 220, 90, 80, 400],
            header={
                "values": ["<b>change</b>", "<b>layer</b>", "<b>type</b>", "<b>precision</b>", "<b>ONNX nodes</b>"],
                "fill_color": palette.HEADER_FILL,
                "align": "left",
            },
            cells={
                "values": [list(col) for col in zip(*rows)] if rows else [[] for _ in range(5)],
                "fill_color": [[colors[r[0]] for r in rows]] * 5 if rows else palette.CELL_FILL,
                "align": "left",
                "font": {"size": 11},
            },
        ),
        row=2,
        col=1,
    )
    fig.update_layout(
        title=f"Fusion diff: {diff.before_label or 'before'} → {diff.after_label or 'after'} "
        f"({summary['gained']} gained, {summary['lost']} lost, {summary['common']} unchanged)",
        height=min(1600, 420 + 24 * len(rows)),
        margin={"t": 60, "b": 10},
    )
    return fit_to_container(fig)


def fusions_html(
    layer_map: LayerMap, path: str | Path, *, compare_with: LayerMap | None = None, max_items: int = 400
) -> Path:
    """Write a self-contained page (plotly.js inline, works offline): side-by-side view, statistics, layer table,
    Q/DQ audit, folded nodes and inserted layers, and a fusion diff when ``compare_with`` is given."""
    import plotly.io as pio

    from workbench._io import write_text_atomic

    figures = [
        side_by_side_figure(layer_map, max_items=max_items),
        fusion_stats_figure(layer_map),
        layer_table_figure(layer_map),
    ]
    if compare_with is not None:
        from workbench.engine.layermap import diff_layer_maps

        figures.append(fusion_diff_figure(diff_layer_maps(compare_with, layer_map)))
    parts = [
        pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False, config={"responsive": True})
        for i, fig in enumerate(figures)
    ]
    folded = ", ".join(html.escape(f"{n.name or '(unnamed)'} [{n.op_type}]") for n in layer_map.folded_nodes) or "none"
    inserted = ", ".join(html.escape(f"{lyr.name} [{lyr.layer_type}]") for lyr in layer_map.inserted_layers) or "none"
    audit_rows = "".join(
        f"<tr><td>{html.escape(p.quantize)}</td><td>{html.escape(p.dequantize)}</td><td>{p.kind}</td><td>{p.status}</td>"
        f"<td>{html.escape(', '.join(p.layers))}</td></tr>"
        for p in layer_map.qdq_audit()
    )
    title = html.escape(f"Fusions: {layer_map.label or 'engine'}")
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:1em 2em}} table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px;font-size:12px}}</style>
</head><body>
<h1>{title}</h1>
<p>Generated by trt-workbench from layer records in format <code>{html.escape(layer_map.source_format)}</code>.
Left: ONNX nodes in topological order; right: engine layers; a line joins a node to each layer that executes it.
Colour = precision; grey = folded away; diamonds = layers TensorRT inserted.</p>
{parts[0]}
{parts[1]}
{"".join(parts[2:])}
<h2>Q/DQ audit</h2>
<table><tr><th>Quantize</th><th>Dequantize</th><th>kind</th><th>status</th><th>layers</th></tr>{audit_rows or "<tr><td colspan=5>no Q/DQ pairs</td></tr>"}</table>
<details><summary>ONNX nodes folded away ({len(layer_map.folded_nodes)})</summary><p>{folded}</p></details>
<details><summary>Engine layers with no ONNX source ({len(layer_map.inserted_layers)})</summary><p>{inserted}</p></details>
</body></html>
"""
    return write_text_atomic(path, page)
