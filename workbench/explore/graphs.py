"""Model Explorer graphs of one engine build: the ONNX graph grouped by engine layer, and the engine graph.

Both are built with Model Explorer's own ``graph_builder`` and saved as the graphs JSON its JSON loader reads, so the
stock ``model-explorer`` command opens them without this package.

* ONNX graph (id ``onnx``): every ONNX node sits in a namespace (a collapsible group) named after the engine layer
  that executes it; a node several layers execute sits in the first one's group and names the others; nodes no layer
  executes sit in ``folded by TensorRT``; layers TensorRT inserted (reformats, casts) are their own nodes in
  ``inserted by TensorRT``. Each layer group starts with a pinned node whose id is the layer's name, the same id as
  that layer in the engine graph: with Model Explorer's "match node id" sync, selecting a layer on one side selects
  it (and reveals its ONNX nodes) on the other. Collapsing the groups shows the engine; expanding one shows what was
  fused. Large models get more levels above the layer groups, so that no level holds more than
  ``MAX_BOXES_PER_LEVEL`` boxes and the first paint shows a few labelled boxes, not a column of hundreds: the ONNX name
  scope of the layer's first node where the names have scopes, and nested topological blocks of consecutive engine
  layers (``L040-L079``; the engine runs its layers in a topological order) where they do not, or where one scope
  still holds too many layers.
* Engine graph (id ``engine``): one node per layer, edges from the tensors one layer writes and another reads;
  layer type, tactic, precision, tensor formats and the fused ONNX nodes as attributes; grouped by the same scopes
  and blocks as the ONNX graph's layer groups.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from workbench.engine.built_onnx import built_onnx
from workbench.engine.layermap import BOOKKEEPING_OPS, LayerEntry, LayerMap
from workbench.engine.precision_check import PrecisionCheck
from workbench.engine.records import EngineLayers, LayerRecord, TensorRecord
from workbench.errors import WorkbenchError
from workbench.explore.builders import graph_builder as gb
from workbench.viz.engine_view import fused_ops_label as _fused_ops_label
from workbench.viz.palette import precision_color

if TYPE_CHECKING:
    import types

    import onnx

    from workbench.artifact import JsonObject
    from workbench.engine.build import EngineArtifact

ONNX_GRAPH_ID = "onnx"
ENGINE_GRAPH_ID = "engine"
FOLDED_GROUP = "folded by TensorRT"
INSERTED_GROUP = "inserted by TensorRT"
LAYER_NODE_LABEL_MAX = 48
# Above this many engine layers, layer groups are nested under the ONNX name scope of their first node (where the
# names have scopes that group several layers each).
SCOPE_NESTING_MIN_LAYERS = 120
# The most boxes one level of a graph shows: more are nested in topological blocks. Model Explorer fits the whole
# level into the pane on first paint, so hundreds of boxes in a chain paint as a column a pixel wide.
MAX_BOXES_PER_LEVEL = 40
ONNX_ID_PREFIX = "onnx:"
INPUT_ID_PREFIX = "input:"
OUTPUT_ID_PREFIX = "output:"


@dataclass(frozen=True)
class BuildView:
    """What the explorer needs from one build: its layer map, layer records and (when known) the ONNX that was built."""

    label: str
    layer_map: LayerMap
    engine_layers: EngineLayers
    onnx_proto: onnx.ModelProto | None = field(default=None, repr=False)
    precision: str = ""
    precision_check: PrecisionCheck | None = None  # the build's requested vs actual precision (lint lists mismatches)

    @property
    def has_onnx_edges(self) -> bool:
        return self.onnx_proto is not None


def _safe(text: str) -> str:
    """A namespace component: Model Explorer splits namespaces on '/', so slashes become '|' (its WebGL font has
    only ASCII, so no look-alike slash)."""
    return (text or "(unnamed)").replace("/", "|")


def onnx_node_id(name: str) -> str:
    return ONNX_ID_PREFIX + name


def layer_group_name(layer: LayerEntry) -> str:
    """The namespace component of a layer's group: its index and name (unique, sorts in engine order)."""
    return _safe(f"L{layer.index:03d} {layer.name}")


def fused_ops_label(layer: LayerEntry, op_types: Mapping[str, str]) -> str:
    """``Conv+BatchNormalization+Relu``: the op types a layer fused (shared with the static view; repeats as
    ``Add x2``, since Model Explorer's WebGL font has no ×)."""
    return _fused_ops_label(layer, op_types, LAYER_NODE_LABEL_MAX, repeat=" x")


def scope_of(node_name: str, depth: int = 2) -> str:
    """The first ``depth`` levels of an ONNX name scope (``/features/denseblock1/denselayer3/conv1/Conv`` ->
    ``features/denseblock1``); '' for names without one."""
    parts = [p for p in node_name.split("/") if p]
    if len(parts) < 2:
        return ""
    return "/".join(_safe(p) for p in parts[:-1][:depth])


def _incoming_edges(
    gb: types.ModuleType, inputs: list[str], producers: dict[str, tuple[str, int]], skip_source: str | None = None
) -> list[gb.IncomingEdge]:
    """One Model Explorer edge per input tensor that a node of the graph produces (``skip_source``: no self-loop)."""
    edges = []
    for target_index, tensor in enumerate(inputs):
        if tensor in producers and producers[tensor][0] != skip_source:
            source, output_index = producers[tensor]
            edges.append(
                gb.IncomingEdge(
                    sourceNodeId=source, sourceNodeOutputId=str(output_index), targetNodeInputId=str(target_index)
                )
            )
    return edges


def _kv(key: str, value: object) -> gb.KeyValue:
    return gb.KeyValue(key=key, value=str(value))


def _tensor_text(tensors: Sequence[TensorRecord]) -> str:
    return (
        "; ".join(f"{t.name} {'x'.join(map(str, t.dimensions))} {t.datatype} {t.format}".strip() for t in tensors)
        or "-"
    )


def _layer_attrs(layer: LayerEntry, record: LayerRecord | None) -> list[gb.KeyValue]:
    attrs = [
        _kv("engine layer", layer.name),
        _kv("layer index", layer.index),
        _kv("layer type", layer.layer_type),
        _kv("precision", layer.precision),
        _kv("tactic", layer.tactic or "-"),
        _kv("fused ONNX nodes", len(layer.onnx_nodes)),
        _kv("ONNX nodes", ", ".join(layer.onnx_nodes) or "none: inserted by TensorRT"),
    ]
    if record is not None:
        attrs += [
            _kv("inputs", _tensor_text(record.inputs)),
            _kv("outputs", _tensor_text(record.outputs)),
            _kv("formats", ", ".join(sorted({t.format for t in (*record.inputs, *record.outputs) if t.format})) or "-"),
        ]
        if record.constants:
            attrs.append(_kv("constants", _tensor_text(record.constants)))
    if layer.myelin_group is not None:
        attrs.append(_kv("myelin graph", layer.myelin_group))
    return attrs


def _layer_summary_attrs(layer: LayerEntry) -> list[gb.KeyValue]:
    """A layer's pinned node in the ONNX graph: what it is, in brief (the engine graph's node of the same id holds the
    whole record: tactic, tensors, formats, constants; repeating it here made the graphs JSON half again as big)."""
    return [
        _kv("layer type", layer.layer_type),
        _kv("precision", layer.precision),
        _kv("fused ONNX nodes", len(layer.onnx_nodes)),
    ]


def tint(colour: str, amount: float = 0.75) -> str:
    """``colour`` mixed with white (Model Explorer's WebGL renderer takes only plain #rrggbb colours)."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * amount):02x}" for c in rgb)


def _layer_style(layer: LayerEntry) -> gb.GraphNodeStyle:
    colour = precision_color("inserted" if layer.inserted else layer.precision)
    return gb.GraphNodeStyle(backgroundColor=tint(colour), borderColor=colour, hoveredBorderColor=colour)


def _scoped(use_scopes: bool, layer: LayerEntry) -> str:
    if not use_scopes or not layer.onnx_nodes:
        return ""
    return scope_of(layer.onnx_nodes[0])


def block_name(members: Sequence[LayerEntry]) -> str:
    """A topological block's namespace component: the engine indices of its first and last layer (``L040-L079``)."""
    return f"L{members[0].index:03d}-L{members[-1].index:03d}"


def topological_blocks(
    members: Sequence[LayerEntry], limit: int = MAX_BOXES_PER_LEVEL
) -> dict[str, tuple[tuple[LayerEntry, ...], ...]]:
    """Layer name -> the nested blocks above it (outermost first), for ``members`` in engine (topological) order.

    No block when ``limit`` or fewer; else the fewest levels of blocks that keep every level at ``limit`` boxes or
    fewer, with as few boxes as possible on the outermost level and consecutive layers of equal-sized blocks below."""
    if len(members) <= limit:
        return {layer.name: () for layer in members}
    levels = 1
    while len(members) > limit ** (levels + 1):
        levels += 1
    parts = -(-len(members) // limit**levels)  # boxes on this level
    nested: dict[str, tuple[tuple[LayerEntry, ...], ...]] = {}
    for part in range(parts):
        block = tuple(members[part * len(members) // parts : (part + 1) * len(members) // parts])
        for name, inner in topological_blocks(block, limit).items():
            nested[name] = (block, *inner)
    return nested


def uses_scopes(layer_map: LayerMap) -> bool:
    """Layer groups nest under name scopes in large models whose node names have scopes that each hold several
    layers (exporters without module names give none, or one per node)."""
    executed = [layer for layer in layer_map.layers if not layer.inserted]
    if len(layer_map.layers) < SCOPE_NESTING_MIN_LAYERS:
        return False
    scopes = {scope_of(layer.onnx_nodes[0]) for layer in executed}
    scoped = sum(1 for layer in executed if scope_of(layer.onnx_nodes[0]))
    return scoped * 2 >= len(executed) and len(scopes) * 3 <= len(executed)


@dataclass(frozen=True)
class Nesting:
    """Where each layer sits: the namespace above its group (name scope, then topological blocks), and each block's
    description (shown when the block is hovered or selected)."""

    parents: dict[str, str]
    blocks: dict[str, dict[str, str]]
    use_scopes: bool

    @property
    def blocked(self) -> bool:
        return bool(self.blocks)


def _block_attrs(block: Sequence[LayerEntry], op_types: Mapping[str, str]) -> dict[str, str]:
    ops = Counter(op_types.get(node, "?") for layer in block for node in layer.onnx_nodes)
    return {
        "engine layers": f"{len(block)} (L{block[0].index:03d} {block[0].name} ... L{block[-1].index:03d} {block[-1].name})",
        "ONNX nodes executed": str(sum(ops.values())),
        "ONNX op types": ", ".join(f"{op} x{count}" for op, count in ops.most_common(8)) or "-",
        "precisions": ", ".join(sorted({layer.precision for layer in block})),
    }


def layer_nesting(layer_map: LayerMap, limit: int = MAX_BOXES_PER_LEVEL) -> Nesting:
    """Scope and block path of every layer (both graphs use it, so a layer sits in the same place on both sides).

    Layers under one parent (a name scope, or the top level) are split into topological blocks when there are more
    than ``limit`` of them. Without scopes, TensorRT's inserted layers stay among their neighbours (in their block)."""
    use_scopes = uses_scopes(layer_map)
    op_types = {node.name: node.op_type for node in layer_map.nodes}
    siblings: dict[str, list[LayerEntry]] = {}
    for layer in layer_map.layers:
        parent = (INSERTED_GROUP if layer.inserted else _scoped(True, layer)) if use_scopes else ""
        siblings.setdefault(parent, []).append(layer)
    parents: dict[str, str] = {}
    blocks: dict[str, dict[str, str]] = {}
    for parent, members in siblings.items():
        for name, path in topological_blocks(members, limit).items():
            namespace = parent
            for block in path:
                namespace = f"{namespace}/{block_name(block)}" if namespace else block_name(block)
                if namespace not in blocks:  # once per block (every layer of the block passes here)
                    blocks[namespace] = _block_attrs(block, op_types)
            parents[name] = namespace
    return Nesting(parents, blocks, use_scopes)


def layer_namespace(layer: LayerEntry, nesting: Nesting) -> str:
    """The full namespace of a layer's group in the ONNX graph (an inserted layer: the group it stands in)."""
    parent = nesting.parents.get(layer.name, "")
    if layer.inserted:
        if nesting.use_scopes:
            return parent  # under "inserted by TensorRT" (in blocks when there are many)
        return f"{parent}/{INSERTED_GROUP}" if parent else INSERTED_GROUP
    return f"{parent}/{layer_group_name(layer)}" if parent else layer_group_name(layer)


def node_home_layer(layer_map: LayerMap) -> dict[str, LayerEntry]:
    """ONNX node -> the layer whose group holds it (the first layer that executes it)."""
    by_name = {layer.name: layer for layer in layer_map.layers}
    return {node.name: by_name[node.engine_layers[0]] for node in layer_map.nodes if node.engine_layers}


def folded_placement(view: BuildView) -> dict[str, LayerEntry]:
    """Folded ONNX node -> the layer of its nearest executed consumer (its ``folded by TensorRT`` group is drawn
    inside that layer's group, so folded constants and shape arithmetic sit where they were used)."""
    if view.onnx_proto is None:
        return {}
    from workbench.model.graph import onnx_node_name

    home = node_home_layer(view.layer_map)
    consumers: dict[str, list[str]] = {}
    names = []
    for proto_node in view.onnx_proto.graph.node:
        name = onnx_node_name(proto_node)
        names.append((name, list(proto_node.output)))
        for tensor in proto_node.input:
            consumers.setdefault(tensor, []).append(name)
    placed: dict[str, LayerEntry] = {}
    for name, outputs in reversed(names):  # consumers come later in topological order: placed first
        if name in home:
            continue
        for tensor in outputs:
            for consumer in consumers.get(tensor, ()):
                layer = home.get(consumer) or placed.get(consumer)
                if layer is not None:
                    placed[name] = layer
                    break
            if name in placed:
                break
    return placed


def onnx_graph(view: BuildView, *, graph_id: str = ONNX_GRAPH_ID) -> gb.Graph:
    """The ONNX graph of ``view`` with every node nested in the group of the engine layer that executes it."""
    layer_map = view.layer_map
    nesting = layer_nesting(layer_map)
    home = node_home_layer(layer_map)
    op_types = {node.name: node.op_type for node in layer_map.nodes}
    graph = gb.Graph(id=graph_id, nodes=[])
    graph.groupNodeConfigs = [
        gb.GroupNodeConfig(namespaceRegex=f"(^|/){FOLDED_GROUP}$", backgroundColor="#f2f2f2", textColor="#777777"),
        gb.GroupNodeConfig(namespaceRegex=f"(^|/){INSERTED_GROUP}$", backgroundColor="#e6e6e6"),
    ]
    graph.groupNodeAttributes = {namespace: dict(attrs) for namespace, attrs in nesting.blocks.items()}
    # one pinned node per layer that executes ONNX nodes (the sync anchor); inserted layers stand alone
    for layer in layer_map.layers:
        namespace = layer_namespace(layer, nesting)
        if not layer.inserted:
            graph.groupNodeAttributes[namespace] = {
                "engine layer": layer.name,
                "layer type": layer.layer_type,
                "precision": layer.precision,
                "fused": fused_ops_label(layer, op_types),
            }
        node = gb.GraphNode(
            id=layer.name,
            label=f"{layer.layer_type} ({layer.precision})",
            namespace=namespace,
            attrs=_layer_summary_attrs(layer),
            style=_layer_style(layer),
            config=gb.GraphNodeConfig(pinToGroupTop=not layer.inserted),
        )
        if layer.onnx_nodes:
            node.attrs.append(
                gb.KeyValue(
                    key="ONNX nodes (select)",
                    value=gb.NodeIdsNodeAttributeValue(nodeIds=[onnx_node_id(n) for n in layer.onnx_nodes]),
                )
            )
        graph.nodes.append(node)

    producers: dict[str, tuple[str, int]] = {}
    proto_nodes: dict[str, onnx.NodeProto] = {}
    if view.onnx_proto is not None:
        from workbench.model.graph import onnx_node_name

        for proto_node in view.onnx_proto.graph.node:
            name = onnx_node_name(proto_node)
            proto_nodes[name] = proto_node
            for index, tensor in enumerate(proto_node.output):
                if tensor:
                    producers[tensor] = (onnx_node_id(name), index)
        initializers = {init.name for init in view.onnx_proto.graph.initializer}
        for graph_input in view.onnx_proto.graph.input:
            if graph_input.name in initializers:
                continue
            producers[graph_input.name] = (INPUT_ID_PREFIX + graph_input.name, 0)
            graph.nodes.append(
                gb.GraphNode(
                    id=INPUT_ID_PREFIX + graph_input.name,
                    label="Input",
                    attrs=[_kv("name", graph_input.name)],
                    outputsMetadata=[gb.MetadataItem(id="0", attrs=[_kv("__tensor_tag", graph_input.name)])],
                )
            )

    folded_near = folded_placement(view)
    for node in layer_map.nodes:
        home_layer = home.get(node.name)
        if home_layer is not None:
            namespace = layer_namespace(home_layer, nesting)
        elif node.name in folded_near:
            namespace = f"{layer_namespace(folded_near[node.name], nesting)}/{FOLDED_GROUP}"
        else:
            namespace = FOLDED_GROUP
        # the node's id is "onnx:" + its ONNX name, and the side panel shows the id: no attribute repeats it
        attrs = [_kv("op type", node.op_type or "?")]
        if node.op_type in BOOKKEEPING_OPS:
            attrs.append(_kv("kind", "bookkeeping"))
        if not node.engine_layers:
            attrs.append(_kv("engine layers", "none: folded by TensorRT"))
        else:  # shown as the layers' ids, each a link that selects the layer
            attrs.append(
                gb.KeyValue(
                    key="engine layers (select)", value=gb.NodeIdsNodeAttributeValue(nodeIds=list(node.engine_layers))
                )
            )
        graph_node = gb.GraphNode(
            id=onnx_node_id(node.name), label=node.op_type or node.name, namespace=namespace, attrs=attrs
        )
        proto_node = proto_nodes.get(node.name)
        if proto_node is not None:
            graph_node.incomingEdges.extend(_incoming_edges(gb, list(proto_node.input), producers))
            graph_node.outputsMetadata = [
                gb.MetadataItem(id=str(i), attrs=[_kv("__tensor_tag", tensor)])
                for i, tensor in enumerate(proto_node.output)
            ]
        graph.nodes.append(graph_node)

    if view.onnx_proto is not None:
        for graph_output in view.onnx_proto.graph.output:
            output_node = gb.GraphNode(
                id=OUTPUT_ID_PREFIX + graph_output.name, label="Output", attrs=[_kv("name", graph_output.name)]
            )
            if graph_output.name in producers:
                source, index = producers[graph_output.name]
                output_node.incomingEdges.append(gb.IncomingEdge(sourceNodeId=source, sourceNodeOutputId=str(index)))
            graph.nodes.append(output_node)
    graph.layoutConfigs = gb.LayoutConfigs(keepLayersWithASingleChild=True)
    return graph


def engine_graph(view: BuildView, *, graph_id: str = ENGINE_GRAPH_ID) -> gb.Graph:
    """The engine as a graph: layers as nodes, an edge for every tensor one layer writes and another reads."""
    layer_map = view.layer_map
    nesting = layer_nesting(layer_map)
    op_types = {node.name: node.op_type for node in layer_map.nodes}
    records = {record.name: record for record in view.engine_layers.layers}
    producers: dict[str, tuple[str, int]] = {}
    for layer in layer_map.layers:
        record = records.get(layer.name)
        for index, tensor in enumerate(record.outputs if record else ()):
            producers.setdefault(tensor.name, (layer.name, index))
    graph = gb.Graph(id=graph_id, nodes=[])
    graph.groupNodeAttributes = {namespace: dict(attrs) for namespace, attrs in nesting.blocks.items()}
    for io in view.engine_layers.io_tensors:
        if io.io_mode.lower().startswith("in"):
            producers.setdefault(io.name, (INPUT_ID_PREFIX + io.name, 0))
            graph.nodes.append(
                gb.GraphNode(
                    id=INPUT_ID_PREFIX + io.name,
                    label="Input",
                    attrs=[_kv("name", io.name), _kv("datatype", io.datatype), _kv("dimensions", io.dimensions)],
                )
            )
    for layer in layer_map.layers:
        record = records.get(layer.name)
        node = gb.GraphNode(
            id=layer.name,
            label=fused_ops_label(layer, op_types) if not layer.inserted else f"{layer.layer_type} (inserted)",
            namespace=nesting.parents.get(layer.name, ""),
            attrs=_layer_attrs(layer, record),
            style=_layer_style(layer),
        )
        if record is not None:
            node.incomingEdges.extend(
                _incoming_edges(gb, [t.name for t in record.inputs], producers, skip_source=layer.name)
            )
            node.outputsMetadata = [
                gb.MetadataItem(
                    id=str(i), attrs=[_kv("__tensor_tag", t.name), _kv("shape", t.dimensions), _kv("dtype", t.datatype)]
                )
                for i, t in enumerate(record.outputs)
            ]
        graph.nodes.append(node)
    for io in view.engine_layers.io_tensors:
        if io.io_mode.lower().startswith("out"):
            output_node = gb.GraphNode(
                id=OUTPUT_ID_PREFIX + io.name,
                label="Output",
                attrs=[_kv("name", io.name), _kv("datatype", io.datatype)],
            )
            if io.name in producers:
                source, index = producers[io.name]
                output_node.incomingEdges.append(gb.IncomingEdge(sourceNodeId=source, sourceNodeOutputId=str(index)))
            graph.nodes.append(output_node)
    return graph


def graph_collection(label: str, graphs: Iterable[gb.Graph]) -> gb.GraphCollection:
    return gb.GraphCollection(label=label, graphs=list(graphs))


# node fields Model Explorer reads as optional (``node.incomingEdges || []``): an empty list need not be sent
_OPTIONAL_NODE_LISTS = ("incomingEdges", "inputsMetadata", "outputsMetadata", "subgraphIds", "attrs")


def builder_fields(value: object) -> dict[str, object]:
    """``json.dumps(default=...)`` for Model Explorer's builder dataclasses: their fields, None dropped, as the stock
    ``remove_none(asdict(...))`` writes them, and a node's empty optional lists left out (the browser parses, copies
    and posts every byte between its threads a few times before the first paint). The stock way deep-copies every
    object first: 3.0 s against 0.4 s for a 10,000-node graph on a loaded machine."""
    fields = {key: item for key, item in vars(value).items() if item is not None}
    if type(value) is gb.GraphNode:
        for key in _OPTIONAL_NODE_LISTS:
            if fields.get(key) == []:
                del fields[key]
    return fields


def graphs_text(collection: gb.GraphCollection) -> str:
    """The graphs JSON Model Explorer's JSON loader reads: one collection ``{"label": ..., "graphs": [...]}``."""
    return json.dumps(collection, default=builder_fields, separators=(",", ":"))


def graphs_json(collection: gb.GraphCollection) -> JsonObject:
    """:func:`graphs_text` as a JSON object."""
    return cast("JsonObject", json.loads(graphs_text(collection)))


def write_graphs(collection: gb.GraphCollection, path: str | Path) -> Path:
    from workbench._io import write_text_atomic

    return write_text_atomic(path, graphs_text(collection))


# --- building a view from what the user has ---------------------------------------------------------------------


def view_from_artifact(artifact: EngineArtifact, *, label: str = "") -> BuildView:
    """A :class:`BuildView` of an :class:`~workbench.engine.build.EngineArtifact`: its own layer map, and the ONNX it
    was built from when that can be had (for the graph's edges)."""
    proto = artifact.built_onnx()
    layer_map = artifact.layer_map
    if proto is not None and len(proto.graph.node) != len(layer_map.nodes):
        proto = None
    return BuildView(
        label=label or artifact.label,
        layer_map=dataclasses.replace(layer_map, label=label or artifact.label),
        engine_layers=artifact.engine_layers,
        onnx_proto=proto,
        precision=artifact.precision,
        precision_check=artifact.precision_check,
    )


def load_view(source: BuildView | EngineArtifact | str | Path, *, label: str = "") -> BuildView:
    """A view from an EngineArtifact, a BuildView, an ``.engine`` path or a ``.layers.json`` path."""
    if isinstance(source, BuildView):
        return dataclasses.replace(source, label=label) if label else source
    if hasattr(source, "layer_map") and hasattr(source, "engine_layers") and hasattr(source, "layers_path"):
        return view_from_artifact(cast("EngineArtifact", source), label=label)
    path = Path(str(source))
    if path.suffix == ".engine" and path.is_file():
        from workbench.engine.build import EngineArtifact

        return view_from_artifact(EngineArtifact.load(path), label=label)
    if path.name.endswith(".layers.json") and path.is_file():
        from workbench.engine.records import engine_layers_from_document, read_layers_document

        document = read_layers_document(path)
        proto = built_onnx(document)
        engine_layers = engine_layers_from_document(document)
        name = label or path.name.removesuffix(".layers.json")
        if proto is not None and len(proto.graph.node) == len(document.get("onnx_nodes", ())):
            layer_map = LayerMap.from_engine_layers(engine_layers, onnx_proto=proto, label=name)
        else:
            proto = None
            layer_map = LayerMap.from_document(document, label=name)
        precision = str((document.get("build") or {}).get("precision", ""))
        check = document.get("precision_check")
        return BuildView(
            name,
            layer_map,
            engine_layers,
            proto,
            precision,
            PrecisionCheck.from_json(check) if isinstance(check, dict) else None,
        )
    raise WorkbenchError(
        f"cannot explore {source!r}: not an engine build.",
        expected="an EngineArtifact, an .engine written by `workbench build` (with its .layers.json), or a .layers.json",
    )
