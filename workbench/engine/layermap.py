"""The layer map: which ONNX nodes each engine layer came from, and what became of every ONNX node.

Engine layer ↔ ONNX node is many-to-many: a layer fuses several nodes (Conv+BN+Relu in one kernel), and one node
can be split over several layers (an INT8 Conv appears in its quantize kernel, the convolution and the epilogue).
Nodes that appear in no layer were folded away (constants, identities, shape arithmetic); layers with no ONNX
source were inserted by TensorRT (reformats, casts, shape calls).

Everything here is plain data computed from layer records (:mod:`workbench.engine.records`) and the ONNX graph that was
built; the figures in :mod:`workbench.viz.engine` only read it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.engine.records import EngineLayers, LayerRecord, engine_layers_from_document, read_layers
from workbench.errors import WorkbenchError
from workbench.model.graph import onnx_node_list
from workbench.model.graph import qdq_edges as qdq_edges_of

if TYPE_CHECKING:
    import onnx

    from workbench.artifact import JsonObject

# Ops that only move, name or describe data; counted apart from compute nodes in the fusion statistics.
BOOKKEEPING_OPS = frozenset(
    {
        "Constant",
        "ConstantOfShape",
        "Identity",
        "Shape",
        "Size",
        "Cast",
        "CastLike",
        "Reshape",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "QuantizeLinear",
        "DequantizeLinear",
        "Dropout",
    }
)
# Ops that must end up in some engine layer unless the whole branch was folded (checked by the tests).
HEAVY_OPS = frozenset(
    {"Conv", "ConvTranspose", "Gemm", "MatMul", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}
)
# Engine layer types that are convolution / matrix-multiply kernels across TensorRT versions.
MATH_LAYER_TYPES = frozenset(
    {
        "correlation",
        "gemm",
        "convolution",
        "caskconvolution",
        "caskgemmconvolution",
        "caskdeconvolution",
        "gemmconvolution",
        "matrixmultiply",
        "caskgemmmatrixmultiply",
        "cublasmatrixmultiply",
        "deconvolution",
        "deconv",  # TensorRT-RTX 1.7 names its ConvTranspose layers so
        "caskconvolutionv2",
    }
)
_MYELIN_NAME = re.compile(r"^__myl_(?P<ops>[A-Za-z0-9]+?)_myl(?P<group>\d+)_(?P<index>\d+)$")
_MYELIN_SUFFIX = re.compile(r"_myl(?P<group>\d+)_(?P<index>\d+)$")
NodeFilter = Callable[[str], bool]


def myelin_op_tokens(layer_name: str) -> tuple[str, ...]:
    """The fused-op tokens in a Myelin kernel name: ``__myl_CorrMulAddRelu_myl0_2`` -> (Corr, Mul, Add, Relu)."""
    match = _MYELIN_NAME.match(layer_name)
    if not match:
        return ()
    return tuple(re.findall(r"[A-Z][a-z0-9]*", match["ops"]))


def myelin_group(layer_name: str) -> int | None:
    """The Myelin graph a layer belongs to (``..._myl<g>_<i>``), or None for non-Myelin layers."""
    match = _MYELIN_SUFFIX.search(layer_name)
    return int(match["group"]) if match else None


@dataclass(frozen=True)
class LayerEntry:
    """One engine layer in the map."""

    index: int
    name: str
    layer_type: str
    precision: str
    tactic: str
    onnx_nodes: tuple[str, ...]
    datatypes: tuple[str, ...]  # distinct datatypes of its inputs, constants and outputs
    input_datatypes: tuple[str, ...]
    myelin_group: int | None = None
    op_tokens: tuple[str, ...] = ()

    @property
    def inserted(self) -> bool:
        """TensorRT added this layer (reformat, cast, shape call): it has no ONNX source."""
        return not self.onnx_nodes

    @property
    def is_int8_kernel(self) -> bool:
        """A convolution / matrix-multiply kernel that reads INT8 data or weights."""
        return self.layer_type.lower() in MATH_LAYER_TYPES and "int8" in self.input_datatypes

    @property
    def is_fp8_kernel(self) -> bool:
        """A convolution / matrix-multiply kernel that reads FP8 (E4M3) data or weights."""
        return self.layer_type.lower() in MATH_LAYER_TYPES and "fp8" in self.input_datatypes

    @property
    def is_quantized_kernel(self) -> bool:
        """A convolution / matrix-multiply kernel that reads 8-bit (INT8 or FP8) data or weights."""
        return self.is_int8_kernel or self.is_fp8_kernel

    def to_json(self) -> JsonObject:
        data = asdict(self)
        data["inserted"] = self.inserted
        return data


@dataclass(frozen=True)
class NodeEntry:
    """One ONNX node of the built graph, in topological (graph) order."""

    index: int
    name: str
    op_type: str
    engine_layers: tuple[str, ...]

    @property
    def folded(self) -> bool:
        """The node appears in no engine layer: constant-folded or eliminated by the builder."""
        return not self.engine_layers

    @property
    def scope(self) -> str:
        """The ONNX name scope (``/encoder/layer.3/attention/MatMul`` -> ``/encoder/layer.3/attention``)."""
        return self.name.rsplit("/", 1)[0] if "/" in self.name.strip("/") else ""

    def to_json(self) -> JsonObject:
        data = asdict(self)
        data["folded"] = self.folded
        return data


@dataclass(frozen=True)
class QdqPair:
    """A QuantizeLinear feeding a DequantizeLinear, and where the builder put them."""

    quantize: str
    dequantize: str
    tensor: str  # the tensor being quantized
    kind: str  # "weights" (constant input) or "activations"
    status: str  # "int8-kernel" | "fp8-kernel" | "standalone" | "folded"
    layers: tuple[str, ...]

    def to_json(self) -> JsonObject:
        return asdict(self)


@dataclass(frozen=True)
class FusionStats:
    onnx_nodes: int
    onnx_compute_nodes: int
    engine_layers: int
    layers_from_onnx: int
    inserted_layers: int
    folded_nodes: int
    folded_compute_nodes: int
    nodes_in_several_layers: int
    stream_sync_layers: int  # signal/wait layers of multi-stream engines (counted in engine_layers and inserted_layers)
    group_sizes: dict[int, int]  # ONNX nodes per layer -> how many layers
    largest_group: int
    by_precision: dict[str, int]
    by_type: dict[str, int]

    @property
    def compute_nodes_per_layer(self) -> float:
        return self.onnx_compute_nodes / self.layers_from_onnx if self.layers_from_onnx else 0.0

    def to_json(self) -> JsonObject:
        data = asdict(self)
        data["group_sizes"] = {str(k): v for k, v in sorted(self.group_sizes.items())}
        data["compute_nodes_per_layer"] = round(self.compute_nodes_per_layer, 3)
        return data


@dataclass(frozen=True)
class LayerMap:
    """Engine layers and ONNX nodes of one build, linked both ways."""

    layers: tuple[LayerEntry, ...]
    nodes: tuple[NodeEntry, ...]
    source_format: str = ""
    label: str = ""
    # ONNX node names named by layers but absent from the ONNX node list (e.g. the ONNX was not given)
    unknown_nodes: tuple[str, ...] = ()
    qdq_edges: tuple[tuple[str, str, str, bool], ...] = field(default=(), repr=False)  # (Q, DQ, tensor, is_weight)
    # True when no ONNX graph was given and the node list was taken from the layers' metadata
    onnx_order_inferred: bool = False

    # --- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_engine_layers(
        cls,
        engine_layers: EngineLayers,
        onnx_nodes: Iterable[tuple[str, str]] | None = None,
        *,
        onnx_proto: onnx.ModelProto | None = None,
        label: str = "",
    ) -> LayerMap:
        """Link ``engine_layers`` to ONNX nodes given as (name, op_type) in graph order, or as an ONNX ModelProto."""
        qdq_edges: tuple[tuple[str, str, str, bool], ...] = ()
        if onnx_proto is not None:
            onnx_nodes = onnx_node_list(onnx_proto)
            qdq_edges = qdq_edges_of(onnx_proto)
        layers = [_layer_entry(index, layer) for index, layer in enumerate(engine_layers.layers)]
        by_node: dict[str, list[str]] = {}
        for layer in layers:
            for node in layer.onnx_nodes:
                by_node.setdefault(node, []).append(layer.name)
        nodes = []
        seen: set[str] = set()
        inferred = onnx_nodes is None
        # No graph given: the nodes are the ones the layers name, in order of first appearance. Folded nodes
        # cannot be known then, and op types are left empty.
        node_list = [(name, "") for name in by_node] if onnx_nodes is None else list(onnx_nodes)
        for index, (name, op_type) in enumerate(node_list):
            nodes.append(NodeEntry(index, name, op_type, tuple(by_node.get(name, ()))))
            seen.add(name)
        unknown = tuple(name for name in by_node if name not in seen)
        return cls(tuple(layers), tuple(nodes), engine_layers.source_format, label, unknown, qdq_edges, inferred)

    @classmethod
    def from_document(
        cls, document: Mapping[str, Any], *, onnx_proto: onnx.ModelProto | None = None, label: str = ""
    ) -> LayerMap:
        """From a ``.layers.json`` document (its ``onnx_nodes`` list gives the graph order)."""
        engine_layers = engine_layers_from_document(document)
        if onnx_proto is None and "qdq_edges" not in document:
            onnx_proto = _built_onnx_if_unchanged(document)
        if onnx_proto is not None:
            return cls.from_engine_layers(engine_layers, onnx_proto=onnx_proto, label=label)
        nodes = [(str(n["name"]), str(n.get("op_type", ""))) for n in document.get("onnx_nodes", [])]
        layer_map = cls.from_engine_layers(engine_layers, nodes, label=label)
        edges = tuple(
            (str(q), str(dq), str(tensor), bool(weight)) for q, dq, tensor, weight in document.get("qdq_edges", [])
        )
        return dataclasses.replace(layer_map, qdq_edges=edges)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], onnx_path: str | os.PathLike[str] | None = None, *, label: str = ""
    ) -> LayerMap:
        """From a ``.layers.json`` (ONNX order inside), or any layer-record file plus the ONNX that was built."""
        path = Path(path)
        onnx_proto = onnx_sha = None
        if onnx_path is not None:
            from workbench.model import load_onnx

            loaded = load_onnx(onnx_path, check=False)
            onnx_proto, onnx_sha = loaded.proto, loaded.sha256
        label = label or path.name.removesuffix(".layers.json")
        if path.suffix == ".json" and path.is_file():
            from workbench._io import read_json
            from workbench.engine.records import validate_layers_document

            data = read_json(path, what="a .layers.json document")
            if isinstance(data, Mapping) and "engine_layers" in data:
                validate_layers_document(data, str(path))
                raw_build = data.get("build")
                build: Mapping[str, Any] = raw_build if isinstance(raw_build, Mapping) else {}
                recorded = {build.get(key) for key in ("onnx_sha256", "built_onnx_sha256")} - {None, ""}
                if onnx_sha is not None and recorded and onnx_sha not in recorded:
                    raise WorkbenchError(
                        f"{onnx_path}: is not the ONNX these layer records were built from (sha256 "
                        f"{onnx_sha[:12]}…; {path} records {', '.join(sorted(str(r)[:12] + '…' for r in recorded))}).",
                        expected=f"the model {build.get('onnx', 'that was built')} (or leave the ONNX out: "
                        "a .layers.json carries the ONNX order itself)",
                    )
                return cls.from_document(data, onnx_proto=onnx_proto, label=label)
            return (
                cls.from_engine_layers(read_layers(data), onnx_proto=onnx_proto, label=label)
                if onnx_proto is not None
                else cls.from_engine_layers(read_layers(data), label=label)
            )
        engine_layers = read_layers(path)
        if onnx_proto is not None:
            return cls.from_engine_layers(engine_layers, onnx_proto=onnx_proto, label=label)
        return cls.from_engine_layers(engine_layers, label=label)

    # --- queries ---------------------------------------------------------------------------------------------
    def layer(self, name: str) -> LayerEntry:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise WorkbenchError(
            f"no engine layer named {name!r}.",
            expected=f"one of {len(self.layers)} layer names, e.g. {self.layers[0].name if self.layers else ''!r}",
        )

    def node(self, name: str) -> NodeEntry:
        for node in self.nodes:
            if node.name == name:
                return node
        raise WorkbenchError(
            f"no ONNX node named {name!r} in this layer map.", expected="an ONNX node name of the built graph"
        )

    def nodes_of(self, layer_name: str) -> tuple[str, ...]:
        return self.layer(layer_name).onnx_nodes

    def layers_of(self, node_name: str) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers if node_name in layer.onnx_nodes)

    @property
    def folded_nodes(self) -> list[NodeEntry]:
        """ONNX nodes absorbed into no engine layer."""
        return [node for node in self.nodes if node.folded]

    @property
    def inserted_layers(self) -> list[LayerEntry]:
        """Engine layers with no ONNX source (reformats, casts, shape calls)."""
        return [layer for layer in self.layers if layer.inserted]

    def unmapped_heavy_nodes(self) -> list[NodeEntry]:
        """Conv/Gemm/MatMul nodes that no engine layer names (should be empty for a correct map)."""
        return [node for node in self.nodes if node.op_type in HEAVY_OPS and node.folded]

    def stats(self) -> FusionStats:
        compute = [node for node in self.nodes if node.op_type not in BOOKKEEPING_OPS]
        group_sizes: dict[int, int] = {}
        by_precision: dict[str, int] = {}
        by_type: dict[str, int] = {}
        for layer in self.layers:
            size = len(layer.onnx_nodes)
            group_sizes[size] = group_sizes.get(size, 0) + 1
            by_precision[layer.precision] = by_precision.get(layer.precision, 0) + 1
            by_type[layer.layer_type] = by_type.get(layer.layer_type, 0) + 1
        return FusionStats(
            onnx_nodes=len(self.nodes),
            onnx_compute_nodes=len(compute),
            engine_layers=len(self.layers),
            layers_from_onnx=sum(1 for layer in self.layers if not layer.inserted),
            inserted_layers=len(self.inserted_layers),
            folded_nodes=len(self.folded_nodes),
            folded_compute_nodes=sum(1 for node in compute if node.folded),
            nodes_in_several_layers=sum(1 for node in self.nodes if len(node.engine_layers) > 1),
            stream_sync_layers=sum(1 for layer in self.layers if layer.layer_type.lower() in ("signal", "wait")),
            group_sizes=group_sizes,
            largest_group=max(group_sizes, default=0),
            by_precision=dict(sorted(by_precision.items())),
            by_type=dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
        )

    def qdq_audit(self) -> list[QdqPair]:
        """Each Q→DQ pair of the ONNX graph: inside an INT8 or FP8 kernel, left standalone, or folded away."""
        layer_by_name = {layer.name: layer for layer in self.layers}
        pairs = []
        for quantize, dequantize, tensor, is_weight in self.qdq_edges:
            names = tuple(dict.fromkeys(self.layers_of(quantize) + self.layers_of(dequantize)))
            dq_layers = [layer_by_name[name] for name in self.layers_of(dequantize)]
            if any(layer.is_int8_kernel for layer in dq_layers):
                status = "int8-kernel"
            elif any(layer.is_fp8_kernel for layer in dq_layers):
                status = "fp8-kernel"
            elif names:
                status = "standalone"
            else:
                status = "folded"
            pairs.append(
                QdqPair(quantize, dequantize, tensor, "weights" if is_weight else "activations", status, names)
            )
        return pairs

    # --- output ----------------------------------------------------------------------------------------------
    def to_json(self) -> JsonObject:
        return {
            "label": self.label,
            "source_format": self.source_format,
            "onnx_order_inferred": self.onnx_order_inferred,
            "stats": self.stats().to_json(),
            "engine_layers": [layer.to_json() for layer in self.layers],
            "onnx_nodes": [node.to_json() for node in self.nodes],
            "folded_nodes": [node.name for node in self.folded_nodes],
            "inserted_layers": [layer.name for layer in self.inserted_layers],
            "unknown_nodes": list(self.unknown_nodes),
            "qdq_audit": [pair.to_json() for pair in self.qdq_audit()],
        }


def _built_onnx_if_unchanged(document: Mapping[str, Any]) -> onnx.ModelProto | None:
    """The ONNX a document was built from (:func:`workbench.engine.build.built_onnx`), for documents that lack node
    names / Q/DQ pairs (older builds); None when it cannot be had or does not match the document's node count."""
    from workbench.engine.built_onnx import built_onnx

    proto = built_onnx(document)
    return proto if proto is not None and len(proto.graph.node) == len(document.get("onnx_nodes", [])) else None


def _layer_entry(index: int, layer: LayerRecord) -> LayerEntry:
    tensors = (*layer.inputs, *layer.constants, *layer.outputs)
    datatypes = tuple(sorted({t.precision for t in tensors if t.datatype}))
    input_datatypes = tuple(sorted({t.precision for t in (*layer.inputs, *layer.constants) if t.datatype}))
    return LayerEntry(
        index=index,
        name=layer.name,
        layer_type=layer.layer_type,
        precision=layer.precision if datatypes else "none",  # signal/wait and shape-call layers carry no tensors
        tactic=layer.tactic,
        onnx_nodes=layer.onnx_nodes,
        datatypes=datatypes,
        input_datatypes=input_datatypes,
        myelin_group=myelin_group(layer.name),
        op_tokens=myelin_op_tokens(layer.name),
    )


# --- fusion diff -------------------------------------------------------------------------------------------


def _ignore_autocast(name: str) -> bool:
    return name.startswith("autocast/")


@dataclass(frozen=True)
class FusionGroup:
    """A set of ONNX nodes that one engine layer executes, with that layer's facts in one build."""

    nodes: frozenset[str]
    layer: str
    layer_type: str
    precision: str

    def to_json(self) -> JsonObject:
        return {"nodes": sorted(self.nodes), "layer": self.layer, "type": self.layer_type, "precision": self.precision}


@dataclass
class FusionDiff:
    """Fusions of two builds compared by the set of ONNX nodes each engine layer executes."""

    before_label: str
    after_label: str
    common: list[tuple[FusionGroup, FusionGroup]]
    gained: list[FusionGroup]  # node sets only the second build fuses this way
    lost: list[FusionGroup]  # node sets only the first build fuses this way
    inserted_before: int
    inserted_after: int

    @property
    def precision_changes(self) -> list[tuple[FusionGroup, FusionGroup]]:
        return [(a, b) for a, b in self.common if a.precision != b.precision]

    def summary(self) -> dict[str, int]:
        return {
            "common": len(self.common),
            "gained": len(self.gained),
            "lost": len(self.lost),
            "precision_changed": len(self.precision_changes),
            "inserted_before": self.inserted_before,
            "inserted_after": self.inserted_after,
        }

    def to_json(self) -> JsonObject:
        return {
            "before": self.before_label,
            "after": self.after_label,
            "summary": self.summary(),
            "gained": [group.to_json() for group in self.gained],
            "lost": [group.to_json() for group in self.lost],
            "precision_changes": [
                {
                    "nodes": sorted(a.nodes),
                    "before": a.precision,
                    "after": b.precision,
                    "layer_before": a.layer,
                    "layer_after": b.layer,
                }
                for a, b in self.precision_changes
            ],
        }


def _groups(layer_map: LayerMap, ignore: NodeFilter) -> dict[frozenset[str], FusionGroup]:
    groups: dict[frozenset[str], FusionGroup] = {}
    for layer in layer_map.layers:
        key = frozenset(node for node in layer.onnx_nodes if not ignore(node))
        if key and key not in groups:
            groups[key] = FusionGroup(key, layer.name, layer.layer_type, layer.precision)
    return groups


def diff_layer_maps(before: LayerMap, after: LayerMap, *, ignore: NodeFilter = _ignore_autocast) -> FusionDiff:
    """Fusions gained and lost from ``before`` to ``after``, keyed by the set of ONNX nodes per engine layer.

    ``ignore`` drops node names from the keys, by default the Casts that AutoCast inserts, so an FP32 and an
    FP16 build of one model compare on the original nodes.
    """
    a = _groups(before, ignore)
    b = _groups(after, ignore)
    common = [(a[key], b[key]) for key in a if key in b]
    gained = [b[key] for key in b if key not in a]
    lost = [a[key] for key in a if key not in b]
    return FusionDiff(
        before.label, after.label, common, gained, lost, len(before.inserted_layers), len(after.inserted_layers)
    )
