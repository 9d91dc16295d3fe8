"""Node-data overlays for the explorer graphs, written with Model Explorer's ``node_data_builder``.

Each overlay is one node-data file holding values for both graphs (``onnx`` and ``engine``), keyed by node id, with
a colour scale (thresholds or a gradient) that Model Explorer shows as the overlay's legend:

* precision of the layer that executes each node (categorical colours from the shared palette);
* fusion group size (ONNX nodes per engine layer);
* INT8 damage from ``workbench diff``: accumulated SQNR drop (dB) and noise added, per ONNX node; a layer gets the
  worst of its nodes;
* lint findings per layer (count, warnings weigh more);
* per-layer time, where a profile exists (TensorRT layer names, or ONNX node names from torch.profiler).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.engine.lint import LintReport
from workbench.explore.builders import node_data_builder as ndb
from workbench.explore.graphs import (
    ENGINE_GRAPH_ID,
    ONNX_GRAPH_ID,
    BuildView,
    node_home_layer,
    onnx_node_id,
)
from workbench.viz import palette

if TYPE_CHECKING:
    from workbench.calib.diff import LayerDiff
    from workbench.engine.layermap import FusionDiff
    from workbench.timing.layer_profile import LayerProfile

GraphIds = tuple[str, str]  # (ONNX graph id, engine graph id)
DEFAULT_IDS: GraphIds = (ONNX_GRAPH_ID, ENGINE_GRAPH_ID)
GRADIENT_LOW = "#f7fbff"
GRADIENT_HIGH = "#d7301f"


@dataclass(frozen=True)
class Overlay:
    """One node-data overlay: its name, the file stem, and the Model Explorer node data for both graphs."""

    key: str
    name: str
    data: ndb.ModelNodeData
    legend: tuple[tuple[str, str], ...]  # (label, colour) for our own documentation / tests

    def values(self, graph_id: str) -> dict[str, object]:
        return {node: result.value for node, result in self.data.graphsData[graph_id].results.items()}

    def save(self, directory: str | Path, prefix: str = "") -> Path:
        from workbench._io import write_text_atomic

        path = Path(directory) / f"{prefix}{self.key}.nodedata.json"
        return write_text_atomic(path, self.json_text())

    def json_text(self) -> str:
        """The node-data file: the document ``ModelNodeData.to_json_string`` writes, written without its deep copy."""
        import json

        from workbench.explore.graphs import builder_fields

        return json.dumps(self.data.graphsData, default=builder_fields, separators=(",", ":"))


def _graph_data(name: str, results: Mapping[str, float | str], **scale: list[ndb.GradientItem]) -> ndb.GraphNodeData:
    typed = {node: ndb.NodeDataResult(value=value) for node, value in results.items()}
    return ndb.GraphNodeData(name=name, results=typed, **scale)


def _gradient() -> list[ndb.GradientItem]:
    return [
        ndb.GradientItem(stop=0, bgColor=GRADIENT_LOW),
        ndb.GradientItem(stop=0.5, bgColor="#fdae61"),
        ndb.GradientItem(stop=1, bgColor=GRADIENT_HIGH),
    ]


def _per_layer_to_nodes(view: BuildView, per_layer: Mapping[str, float], ids: GraphIds) -> dict[str, dict[str, float]]:
    """Engine-layer values -> values for both graphs: the engine's layer nodes, and in the ONNX graph each layer's
    pinned node and every ONNX node that layer's group holds."""
    home = node_home_layer(view.layer_map)
    onnx_values: dict[str, float] = {name: value for name, value in per_layer.items()}
    for node, layer in home.items():
        if layer.name in per_layer:
            onnx_values[onnx_node_id(node)] = per_layer[layer.name]
    return {ids[0]: onnx_values, ids[1]: dict(per_layer)}


def graph_io_ids(view: BuildView) -> list[tuple[str, str]]:
    """("onnx" | "engine", node id) of the Input/Output nodes the two graphs draw."""
    from workbench.explore.graphs import INPUT_ID_PREFIX, OUTPUT_ID_PREFIX

    ids: list[tuple[str, str]] = []
    if view.onnx_proto is not None:
        initializers = {init.name for init in view.onnx_proto.graph.initializer}
        ids += [("onnx", INPUT_ID_PREFIX + i.name) for i in view.onnx_proto.graph.input if i.name not in initializers]
        ids += [("onnx", OUTPUT_ID_PREFIX + o.name) for o in view.onnx_proto.graph.output]
    for io in view.engine_layers.io_tensors:
        prefix = INPUT_ID_PREFIX if io.io_mode.lower().startswith("in") else OUTPUT_ID_PREFIX
        ids.append(("engine", prefix + io.name))
    return ids


def precision_overlay(view: BuildView, ids: GraphIds = DEFAULT_IDS) -> Overlay:
    """Categorical: each node coloured by the precision of the layer that runs it (folded nodes grey)."""
    home = node_home_layer(view.layer_map)
    engine = {layer.name: "inserted" if layer.inserted else layer.precision for layer in view.layer_map.layers}
    onnx = dict(engine)
    for node in view.layer_map.nodes:
        layer = home.get(node.name)
        onnx[onnx_node_id(node.name)] = "folded" if layer is None else layer.precision
    for io_id in graph_io_ids(view):  # graph inputs/outputs too, so the overlay covers every node
        (onnx if io_id[0] == "onnx" else engine)[io_id[1]] = "graph I/O"
    used = sorted(set(onnx.values()) | set(engine.values()))
    legend = tuple((label, "#ffffff" if label == "graph I/O" else palette.precision_color(label)) for label in used)
    colours = dict(legend)

    def data(results: Mapping[str, str]) -> ndb.GraphNodeData:
        typed = {k: ndb.NodeDataResult(value=v, bgColor=colours[v]) for k, v in results.items()}
        return ndb.GraphNodeData(
            name="precision",
            results=typed,
            showExpandedSummaryOnGroupNode=True,
            showLabelCountColumnsInChildrenStatsTable=True,
        )

    return Overlay("precision", "precision", ndb.ModelNodeData({ids[0]: data(onnx), ids[1]: data(engine)}), legend)


def _numeric_overlay(
    key: str,
    name: str,
    view: BuildView,
    per_layer: Mapping[str, float],
    per_onnx: Mapping[str, float] | None = None,
    ids: GraphIds = DEFAULT_IDS,
) -> Overlay:
    values = _per_layer_to_nodes(view, per_layer, ids)
    if per_onnx:
        values[ids[0]].update({onnx_node_id(k): v for k, v in per_onnx.items()})
    finite = [v for vals in values.values() for v in vals.values() if math.isfinite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    legend = ((f"{low:.3g}", GRADIENT_LOW), (f"{high:.3g}", GRADIENT_HIGH))
    data = ndb.ModelNodeData(
        {
            graph: _graph_data(name, {k: v for k, v in vals.items() if math.isfinite(v)}, gradient=_gradient())
            for graph, vals in values.items()
        }
    )
    return Overlay(key, name, data, legend)


def fusion_size_overlay(view: BuildView, ids: GraphIds = DEFAULT_IDS) -> Overlay:
    sizes = {layer.name: float(len(layer.onnx_nodes)) for layer in view.layer_map.layers}
    return _numeric_overlay("fusion_size", "ONNX nodes fused per layer", view, sizes, ids=ids)


def int8_damage_overlays(view: BuildView, diff: LayerDiff, ids: GraphIds = DEFAULT_IDS) -> list[Overlay]:
    """Accumulated SQNR drop (dB, relative to the best tensor of the model) and noise added, from a ``LayerDiff``
    of this build's FP32 and quantized ONNX; a layer shows the worst value of the nodes it executes."""
    drop: dict[str, float] = {}
    noise: dict[str, float] = {}
    for row in diff.tensors:
        if row.kind != "activation":
            continue
        if row.drop_db is not None and math.isfinite(row.drop_db):
            drop[row.node] = max(drop.get(row.node, -math.inf), float(row.drop_db))
        if row.noise_added is not None and math.isfinite(row.noise_added):
            noise[row.node] = max(noise.get(row.node, -math.inf), float(row.noise_added))
    overlays = []
    for key, name, per_node in (
        ("int8_sqnr_drop", "INT8: drop of accumulated SQNR at the node (dB)", drop),
        ("int8_noise_added", "INT8: noise power added at the node (relative)", noise),
    ):
        per_layer = {
            layer.name: max(per_node[n] for n in layer.onnx_nodes if n in per_node)
            for layer in view.layer_map.layers
            if any(n in per_node for n in layer.onnx_nodes)
        }
        overlays.append(_numeric_overlay(key, name, view, per_layer, per_node, ids))
    return overlays


def lint_overlay(view: BuildView, report: LintReport, ids: GraphIds = DEFAULT_IDS) -> Overlay:
    """Per layer: 1 per info finding, 3 per warning; 0 where the linter found nothing."""
    score = {layer.name: 0.0 for layer in view.layer_map.layers}
    for finding in report.findings:
        if finding.layer in score:
            score[finding.layer] += 3.0 if finding.severity == "warning" else 1.0
    overlay = _numeric_overlay("lint", "lint findings (3 per warning, 1 per info)", view, score, ids=ids)
    thresholds = [
        ndb.ThresholdItem(value=0, bgColor="#ffffff"),
        ndb.ThresholdItem(value=2, bgColor="#fff3b0"),
        ndb.ThresholdItem(value=1e9, bgColor="#f4a582"),
    ]
    for graph in overlay.data.graphsData.values():
        graph.gradient = []
        graph.thresholds = thresholds
    return Overlay(
        overlay.key, overlay.name, overlay.data, (("none", "#ffffff"), ("info", "#fff3b0"), ("warning", "#f4a582"))
    )


def profile_overlay(view: BuildView, profile: LayerProfile, ids: GraphIds = DEFAULT_IDS) -> Overlay:
    """Per-layer time (ms) from a ``LayerProfile``: by engine layer name when the profile is TensorRT's, else spread
    from ONNX node names (torch.profiler) onto the layers that execute them."""
    by_name = {layer.name: layer.time_ms for layer in profile.layers}
    layer_names = {layer.name for layer in view.layer_map.layers}
    per_onnx: dict[str, float] = {}
    if by_name.keys() & layer_names:
        per_layer = {name: t for name, t in by_name.items() if name in layer_names}
    else:
        per_onnx = profile.per_onnx_node()
        per_layer = {}
        for layer in view.layer_map.layers:
            times = [per_onnx[n] for n in layer.onnx_nodes if n in per_onnx]
            if times:
                per_layer[layer.name] = sum(times)
    return _numeric_overlay(
        "layer_time", f"layer time (ms, {profile.source}, {profile.clock})", view, per_layer, per_onnx, ids
    )


def fusion_diff_overlay(view: BuildView, fusion_diff: FusionDiff, side: str, ids: GraphIds = DEFAULT_IDS) -> Overlay:
    """Two builds compared (``workbench.engine.layermap.diff_layer_maps``): on the 'before' side the layers whose
    fusion the 'after' build lost, on the 'after' side the fusions it gained; precision changes and unchanged too."""
    changed_layers = {pair[0 if side == "before" else 1].layer for pair in fusion_diff.precision_changes}
    marked = {g.layer for g in (fusion_diff.lost if side == "before" else fusion_diff.gained)}
    mark = "lost" if side == "before" else "gained"
    engine: dict[str, str] = {}
    for layer in view.layer_map.layers:
        if layer.inserted:
            engine[layer.name] = "inserted"
        elif layer.name in marked:
            engine[layer.name] = mark
        elif layer.name in changed_layers:
            engine[layer.name] = "precision changed"
        else:
            engine[layer.name] = "unchanged"
    home = node_home_layer(view.layer_map)
    onnx = dict(engine)
    for node in view.layer_map.nodes:
        home_layer = home.get(node.name)
        onnx[onnx_node_id(node.name)] = "folded" if home_layer is None else engine[home_layer.name]
    colours = {
        "gained": palette.OK,
        "lost": palette.ERROR,
        "precision changed": palette.WARNING,
        "unchanged": "#ffffff",
        "inserted": palette.INSERTED,
        "folded": palette.FOLDED,
    }

    def data(results: Mapping[str, str]) -> ndb.GraphNodeData:
        typed = {k: ndb.NodeDataResult(value=v, bgColor=colours[v]) for k, v in results.items()}
        return ndb.GraphNodeData(name=f"fusions {mark}", results=typed, showExpandedSummaryOnGroupNode=True)

    used = sorted(set(engine.values()) | set(onnx.values()))
    return Overlay(
        f"fusion_diff_{side}",
        f"fusions {mark} vs the other build",
        ndb.ModelNodeData({ids[0]: data(onnx), ids[1]: data(engine)}),
        tuple((label, colours[label]) for label in used),
    )


# The overlay shown first, most telling first: where INT8 hurts when a diff is given, else what a compared build
# gained or lost, else the precision of every node.
ACTIVE_PREFERENCE = ("int8_sqnr_drop", "int8_noise_added", "fusion_diff_after", "fusion_diff_before", "precision")


def active_last(overlays: Sequence[Overlay]) -> list[Overlay]:
    """``overlays`` in loading order, the one to show first last: Model Explorer adds the node-data files of a graph
    in URL order and selects each as it is added, so the last one is the active overlay when the page opens."""
    rank = {key: len(ACTIVE_PREFERENCE) - i for i, key in enumerate(ACTIVE_PREFERENCE)}
    best = max(overlays, key=lambda overlay: rank.get(overlay.key, 0), default=None)
    if best is None or best.key not in rank:
        return list(overlays)
    return [overlay for overlay in overlays if overlay is not best] + [best]


def build_overlays(
    view: BuildView,
    *,
    diff: LayerDiff | None = None,
    profile: LayerProfile | None = None,
    lint_report: LintReport | None = None,
    ids: GraphIds = DEFAULT_IDS,
) -> list[Overlay]:
    """Every overlay of one build, the active one (INT8 damage when a diff is given, else precision) last."""
    overlays = [fusion_size_overlay(view, ids)]
    if lint_report is not None:
        overlays.append(lint_overlay(view, lint_report, ids))
    if profile is not None:
        overlays.append(profile_overlay(view, profile, ids))
    overlays.append(precision_overlay(view, ids))
    if diff is not None:
        overlays += int8_damage_overlays(view, diff, ids)
    return active_last(overlays)
