"""Helpers shared by the passes: import/export that keep model metadata, node bypassing, tensor facts."""

from __future__ import annotations

import math
import weakref
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, TypeGuard, cast

import numpy as np

from workbench.model.graph import is_constant, producer

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

Key = Hashable  # a fingerprint or cache key: nested tuples of plain values and identity tokens

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})  # default-domain ops with graph attributes
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    import onnx_graphsurgeon as gs

    return gs.import_onnx(model)


def export_graph(graph: gs.Graph, template: onnx.ModelProto) -> onnx.ModelProto:
    """Export ``graph`` keeping what graphsurgeon drops: metadata, doc string, model version, IR version."""
    import onnx_graphsurgeon as gs

    return copy_model_metadata(gs.export_onnx(graph, do_type_check=False), template)


def copy_model_metadata(model: onnx.ModelProto, template: onnx.ModelProto) -> onnx.ModelProto:
    """Give ``model`` the template's metadata, doc string, model version, IR version and opset imports."""
    model.ir_version = max(template.ir_version, 4)  # IR < 4 needs initializers listed as inputs; we drop them
    model.producer_name = template.producer_name
    model.producer_version = template.producer_version
    model.domain = template.domain
    model.model_version = template.model_version
    model.doc_string = template.doc_string
    del model.metadata_props[:]
    model.metadata_props.extend(template.metadata_props)
    # keep the original opset imports (graphsurgeon may drop unused domains, which is harmless, or add none)
    existing = {imp.domain for imp in model.opset_import}
    for imp in template.opset_import:
        if imp.domain not in existing:
            model.opset_import.append(imp)
    return model


def node_subgraphs(node: gs.Node) -> list[gs.Graph]:
    """The gs.Graph bodies held in ``node``'s attributes (If branches, Loop/Scan bodies)."""
    import onnx_graphsurgeon as gs

    if node.op not in CONTROL_FLOW_OPS and node.domain in (None, "", "ai.onnx"):
        return []  # only control-flow ops (and custom-domain ones) hold graphs
    found = []
    for value in node.attrs.values():
        if isinstance(value, gs.Graph):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, gs.Graph))
    return found


def _has_subgraphs(graph: gs.Graph) -> bool:
    return any(node_subgraphs(node) for node in graph.nodes)


def all_subgraphs(graph: gs.Graph) -> list[gs.Graph]:
    """Every subgraph nested in ``graph`` (any depth), outer ones first."""
    found: list[gs.Graph] = []
    stack = [sub for node in graph.nodes for sub in node_subgraphs(node)]
    stack.reverse()
    while stack:
        sub = stack.pop()
        found.append(sub)
        nested = [inner for node in sub.nodes for inner in node_subgraphs(node)]
        stack.extend(reversed(nested))
    return found


def outer_tensors(subgraph: gs.Graph) -> list[gs.Tensor]:
    """Tensors a subgraph (or its own subgraphs) reads from enclosing scopes: produced neither by its nodes nor
    listed as its inputs, and not constants. They belong to the outer graph and must never be removed or renamed."""
    local = {id(t) for node in subgraph.nodes for t in node.outputs} | {id(t) for t in subgraph.inputs}
    found: dict[int, gs.Tensor] = {}
    for node in subgraph.nodes:
        for tensor in node.inputs:
            if id(tensor) not in local and not tensor.is_empty() and not is_constant(tensor):
                found[id(tensor)] = tensor
        for sub in node_subgraphs(node):
            for tensor in outer_tensors(sub):
                if id(tensor) not in local:
                    found[id(tensor)] = tensor
    for tensor in subgraph.outputs:
        if id(tensor) not in local and not is_constant(tensor):
            found[id(tensor)] = tensor
    return list(found.values())


def node_reads(node: gs.Node) -> list[gs.Tensor]:
    """The tensors ``node`` depends on: its inputs plus what its subgraphs read from outside them."""
    reads = list(node.inputs)
    for sub in node_subgraphs(node):
        reads.extend(outer_tensors(sub))
    return reads


def prune_dead_nodes(graph: gs.Graph) -> int:
    """Drop nodes no graph output depends on, before graphsurgeon's cleanup (which formats every node it
    removes into a log string, arrays included: seconds on models with hundreds of Constant nodes). Subgraph
    bodies count as reads of the outer tensors they use."""
    producers = {id(out): node for node in graph.nodes for out in node.outputs}
    live: set[int] = set()
    stack = [producers[id(t)] for t in graph.outputs if id(t) in producers]
    while stack:
        node = stack.pop()
        if id(node) in live:
            continue
        live.add(id(node))
        stack.extend(producers[id(inp)] for inp in node_reads(node) if id(inp) in producers)
    removed = len(graph.nodes) - len(live)
    if removed:
        for node in graph.nodes:
            if id(node) not in live:
                node.inputs.clear()
                node.outputs.clear()
        graph.nodes = [node for node in graph.nodes if id(node) in live]
    return removed


def toposort(graph: gs.Graph) -> gs.Graph:
    """Kahn's algorithm, keeping the current order where it is already valid (graphsurgeon's toposort is
    recursive and takes ~50 ms on a 450-node graph; this one ~2 ms). A node with subgraphs comes after the
    producers of the outer tensors its subgraphs read; subgraph bodies are sorted too."""
    for sub in all_subgraphs(graph):
        _toposort_one(sub)
    return _toposort_one(graph)


def _toposort_one(graph: gs.Graph) -> gs.Graph:
    import heapq

    nodes = list(graph.nodes)
    index = {id(node): i for i, node in enumerate(nodes)}
    producers = {id(out): node for node in nodes for out in node.outputs}
    waiting = [0] * len(nodes)
    consumers: list[list[int]] = [[] for _ in nodes]
    for i, node in enumerate(nodes):
        sources = {index[id(producers[id(inp)])] for inp in node_reads(node) if id(inp) in producers}
        sources.discard(i)
        waiting[i] = len(sources)
        for source in sources:
            consumers[source].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in consumers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        return graph.toposort(recurse_subgraphs=False)  # a cycle: let graphsurgeon report it
    graph.nodes = order
    return graph


def iter_graph_protos(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    """An onnx.GraphProto and every GraphProto nested in its nodes' attributes, outer first."""
    yield graph
    for node in graph.node:
        if node.op_type not in CONTROL_FLOW_OPS and node.domain in ("", "ai.onnx"):
            continue  # only control-flow ops (and custom-domain ones) hold graphs
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from iter_graph_protos(attr.g)
            for sub in attr.graphs:
                yield from iter_graph_protos(sub)


def iter_node_protos(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    """Every NodeProto of a GraphProto, subgraph nodes included."""
    for sub in iter_graph_protos(graph):
        yield from sub.node


def subgraph_node_count(model: onnx.ModelProto) -> int:
    """Nodes inside If/Loop/Scan bodies (any depth), not counting the top-level graph's own nodes."""
    return sum(1 for _ in iter_node_protos(model.graph)) - len(model.graph.node)


def total_node_count(model: onnx.ModelProto) -> int:
    return sum(1 for _ in iter_node_protos(model.graph))


def apply_inferred_shapes(graph: gs.Graph, inferred: onnx.ModelProto) -> None:
    """Copy dtypes and shapes from a shape-inferred ModelProto onto the same graph's Variables (subgraphs
    included: ONNX shape inference records their value_info in each subgraph), in place."""
    import onnx

    infos = {info.name: info for sub in iter_graph_protos(inferred.graph) for info in sub.value_info}
    graphs = [graph, *all_subgraphs(graph)]
    # graph I/O keeps its declaration (subgraph outputs included: a loop's carried values may change shape)
    declared = {id(tensor) for g in graphs for tensor in list(g.inputs) + list(g.outputs)}
    tensors = {name: tensor for g in graphs for name, tensor in g.tensors().items()}
    for name, tensor in tensors.items():
        info = infos.get(name)
        if id(tensor) in declared:
            continue
        if info is None or is_constant(tensor) or not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        if tensor_type.elem_type:
            tensor.dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if tensor_type.HasField("shape"):
            tensor.shape = [
                int(d.dim_value) if d.HasField("dim_value") else (d.dim_param if d.HasField("dim_param") else None)
                for d in tensor_type.shape.dim
            ]


def node_skeleton(model: onnx.ModelProto) -> onnx.GraphProto:
    """The model's nodes and I/O names without weights: cheap to keep one per pass for before/after views."""
    import onnx

    graph = onnx.GraphProto(name=model.graph.name)
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    return graph


LIGHT_CONSTANT_BYTES = 4096  # constants above this size travel as data-free stubs in light exports


_ITEMSIZE: dict[np.dtype, int] = {}


def constant_nbytes(tensor: gs.Constant) -> int:
    """Payload size of a gs.Constant computed from its shape and dtype, without loading lazy values."""
    try:
        itemsize = _ITEMSIZE.get(tensor.dtype)
        if itemsize is None:
            itemsize = _ITEMSIZE[tensor.dtype] = np.dtype(tensor.dtype).itemsize
        return math.prod(map(int, tensor.shape)) * itemsize
    except (TypeError, ValueError):
        return int(np.asarray(tensor.values).nbytes)


_STUBBABLE: dict[tuple[np.dtype, np.dtype], bool] = {}


def _stubbable(tensor: gs.Constant) -> bool:
    """A numeric constant whose array is what its export would hold (it can travel beside the model)."""
    key = (tensor.dtype, tensor.export_dtype)
    known = _STUBBABLE.get(key)
    if known is None:
        try:
            dtype = np.dtype(tensor.dtype)
            known = dtype.kind in "biuf" and np.dtype(tensor.export_dtype) == dtype
        except TypeError:
            known = False
        _STUBBABLE[key] = known
    return known


_PLAIN_TYPES = frozenset({bool, int, float, str, bytes, type(None)})


class _Same:
    """An identity token for a fingerprint: equal only to a token of the very same live object. It holds the object
    weakly (a fingerprint or a cached key never keeps an old weight alive) and a dead object's token equals no
    other, so a new object that CPython places at a freed one's address is never taken for it (as ``id()`` would)."""

    __slots__ = ("_id", "_ref")

    def __init__(self, obj: object) -> None:
        self._ref, self._id = weakref.ref(obj), id(obj)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Same):
            return NotImplemented
        target = self._ref()
        return target is not None and target is other._ref()

    def __hash__(self) -> int:
        return self._id


def large_constant_array(tensor: gs.Constant) -> np.ndarray:
    """The array of a large constant, loaded and made read-only: from then on it can change only by being replaced
    (which a fingerprint sees), never in place (a pass writing into it raises and is rolled back)."""
    values = tensor.values  # loads lazy values once (graphsurgeon keeps the loaded array)
    if isinstance(values, np.ndarray) and values.flags.writeable:
        values.flags.writeable = False
    return values


class LightExporter:
    """Light exports of one gs graph as passes change it: nodes, graph I/O, small constants and sparse
    initializers, with large constants as data-free TensorProto stubs (If/Loop/Scan bodies too).

    Enough for shape inference, node and op counts and size accounting at a fraction of a full export's cost (a
    full export copies every weight). The NodeProto of a node and the TensorProto of a constant are made once
    and reused while what their export reads is unchanged, and :meth:`fingerprint` tells whether the graph
    changed without exporting at all: equal fingerprints mean equal light exports. A large constant is known by
    its array object (a pass replaces a weight by a new Constant, or a Constant's ``values`` by a new array), which
    is made read-only when first seen, so an in-place edit raises instead of going unnoticed; a small one by its
    bytes. Identities are :class:`_Same` tokens, never raw ``id()`` values, which a new object can reuse.
    """

    def __init__(self, track_values: bool = True) -> None:
        # track_values False (a one-off export, nothing compared): large weights stay as they are (not loaded, not
        # made read-only), so exporting a caller's graph has no side effect on it
        self._track_values = track_values
        # (id(node), bodies stubbed) -> (key, NodeProto, stubbed bytes); (id(tensor), stubbed) -> same for constants
        self._nodes: dict[tuple[int, bool], tuple[Key, onnx.NodeProto, int, weakref.ref[gs.Node]]] = {}
        self._constants: dict[tuple[int, bool], tuple[Key, onnx.TensorProto, int, weakref.ref[gs.Constant]]] = {}

    # ------------------------------------------------------------------ keys

    def _freeze(self, value: object) -> Key:
        import onnx_graphsurgeon as gs

        kind = type(value)
        if kind in _PLAIN_TYPES:
            return (kind, value)
        if kind is list or kind is tuple:  # exactly: a subclass (a named tuple) is an "object" below
            items = cast("list[object] | tuple[object, ...]", value)
            kinds = tuple(map(type, items))
            if _PLAIN_TYPES.issuperset(kinds):  # ints, floats, strings: the common case, without recursion
                return (kind, kinds, tuple(items))
            return (kind, tuple([self._freeze(item) for item in items]))
        if isinstance(value, np.ndarray):
            return ("ndarray", value.dtype.str, value.shape, value.tobytes())
        if isinstance(value, gs.Graph):
            return ("graph", self._graph_key(value))
        if isinstance(value, gs.Constant):
            return ("constant", self._constant_key(value))
        if isinstance(value, np.dtype):
            return ("dtype", value.str)
        if isinstance(value, np.generic):
            return ("scalar", value.dtype.str, value.item())
        if isinstance(value, (bool, int, float, str, bytes)):  # subclasses (e.g. enums)
            return (kind.__name__, value)
        return ("object", kind.__name__, repr(value))

    def _node_key(self, node: gs.Node) -> Key:
        freeze = self._freeze
        return (
            node.op,
            node.name,
            node.domain,
            tuple([t.name for t in node.inputs]),
            tuple([t.name for t in node.outputs]),
            tuple([(name, freeze(value)) for name, value in node.attrs.items()]),
        )

    def _constant_key(self, tensor: gs.Constant) -> Key:
        shape = tuple(tensor.shape)
        if constant_nbytes(tensor) > LIGHT_CONSTANT_BYTES and _stubbable(tensor):
            values = large_constant_array(tensor) if self._track_values else tensor
            return (tensor.name, tensor.dtype, shape, _Same(values))
        return (tensor.name, tensor.dtype, tensor.export_dtype, shape, np.asarray(tensor.values).tobytes())

    @staticmethod
    def _io_key(tensors: Iterable[gs.Tensor]) -> Key:
        return tuple((t.name, t.dtype, None if t.shape is None else tuple(t.shape)) for t in tensors)

    @staticmethod
    def _constant_tensors(graph: gs.Graph) -> list[gs.Constant]:
        from onnx_graphsurgeon.ir.tensor import Constant, SparseValues

        return [
            tensor
            for tensor in graph.tensors().values()
            if isinstance(tensor, Constant) and not isinstance(tensor._values, SparseValues)
        ]

    @staticmethod
    def _sparse_tensors(graph: gs.Graph) -> list[gs.Constant]:
        """The graph's sparse initializers (exported as they were imported, as graphsurgeon does)."""
        from onnx_graphsurgeon.ir.tensor import Constant, SparseValues

        return [
            tensor
            for tensor in graph.tensors().values()
            if isinstance(tensor, Constant) and isinstance(tensor._values, SparseValues)
        ]

    def fingerprint(self, graph: gs.Graph) -> Key:
        """A hashable summary of everything a light export of ``graph`` (the top-level graph) holds, the model's
        opset imports and model-local functions included (no export made)."""
        freeze = self._freeze
        return (
            self._graph_key(graph),
            getattr(graph, "opset", None),
            tuple((imp.domain, imp.version) for imp in getattr(graph, "import_domains", None) or []),
            tuple(
                (f.domain, f.name, tuple((k, freeze(v)) for k, v in (f.attrs or {}).items()), self._graph_key(f))
                for f in getattr(graph, "functions", None) or []
            ),
        )

    def _graph_key(self, graph: gs.Graph | gs.Function) -> Key:
        """The summary of one graph's own contents (a subgraph body, a function body or the top-level graph)."""
        node_key, constant_key = self._node_key, self._constant_key
        return (
            graph.name,
            tuple([node_key(node) for node in graph.nodes]),
            self._io_key(graph.inputs),
            self._io_key(graph.outputs),
            tuple([constant_key(tensor) for tensor in self._constant_tensors(graph)]),
            tuple([(tensor.name, _Same(tensor._values)) for tensor in self._sparse_tensors(graph)]),
        )

    # ------------------------------------------------------------------ export

    def _node_proto(self, node: gs.Node, stub_bodies: bool) -> tuple[onnx.NodeProto, int]:
        """(NodeProto, stubbed payload bytes inside its bodies)."""
        import onnx
        from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

        subgraphs = node_subgraphs(node)
        key = (self._node_key(node), stub_bodies and bool(subgraphs))
        cached = self._nodes.get((id(node), key[1]))
        if cached is not None and cached[0] == key and cached[3]() is node:
            return cached[1], cached[2]
        stub_bytes = 0
        if not subgraphs:
            proto = OnnxExporter.export_node(node)
        else:  # OnnxExporter.export_node would export the bodies with every weight: export them light too
            proto = onnx.helper.make_node(
                node.op,
                inputs=[t.name for t in node.inputs],
                outputs=[t.name for t in node.outputs],
                name=node.name,
                domain=node.domain,
            )
            for name, value in node.attrs.items():
                if any(value is sub for sub in subgraphs):
                    body, body_bytes, _ = self._graph_proto(value, stub=stub_bodies)
                    stub_bytes += body_bytes
                    proto.attribute.append(onnx.helper.make_attribute(name, body))
                else:
                    proto.attribute.extend(OnnxExporter.export_attributes({name: value}))
        self._nodes[(id(node), key[1])] = (key, proto, stub_bytes, weakref.ref(node))
        return proto, stub_bytes

    def _constant_proto(self, tensor: gs.Constant, stub: bool) -> tuple[onnx.TensorProto, int]:
        """(TensorProto or stub, stubbed payload bytes)."""
        import onnx
        from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, dtype_to_onnx

        key = (self._constant_key(tensor), stub)
        cached = self._constants.get((id(tensor), stub))
        if cached is not None and cached[0] == key and cached[3]() is tensor:
            return cached[1], cached[2]
        size = constant_nbytes(tensor)
        if stub and size > LIGHT_CONSTANT_BYTES and _stubbable(tensor):
            proto = onnx.TensorProto(
                name=tensor.name, data_type=dtype_to_onnx(tensor.export_dtype), dims=list(tensor.shape)
            )
            proto.doc_string = f"stub:{id(tensor)}"
            stubbed = size
        else:
            proto, stubbed = OnnxExporter.export_tensor_proto(tensor), 0
        self._constants[(id(tensor), stub)] = (key, proto, stubbed, weakref.ref(tensor))
        return proto, stubbed

    def _graph_proto(
        self, graph: gs.Graph, stub: bool, value_info: bool = False, stub_bodies: bool | None = None
    ) -> tuple[onnx.GraphProto, int, dict[str, gs.Constant]]:
        """(GraphProto, stubbed payload bytes, {stub name: gs.Constant} of this graph's own stubs)."""
        import onnx
        from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter
        from onnx_graphsurgeon.ir.tensor import Variable

        proto = onnx.GraphProto(name=graph.name or "graph")
        stub_bytes = 0
        nodes = []
        for node in graph.nodes:
            node_proto, body_bytes = self._node_proto(node, stub if stub_bodies is None else stub_bodies)
            nodes.append(node_proto)
            stub_bytes += body_bytes
        proto.node.extend(nodes)
        proto.input.extend(OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in graph.inputs)
        proto.output.extend(OnnxExporter.export_value_info_proto(t, do_type_check=False) for t in graph.outputs)
        stubs: dict[str, gs.Constant] = {}
        initializers = []
        for tensor in self._constant_tensors(graph):
            tensor_proto, stubbed = self._constant_proto(tensor, stub)
            initializers.append(tensor_proto)
            if stubbed:
                stub_bytes += stubbed
                stubs[tensor.name] = tensor
        proto.initializer.extend(initializers)
        proto.sparse_initializer.extend(
            OnnxExporter.export_sparse_tensor_proto(tensor) for tensor in self._sparse_tensors(graph)
        )
        if value_info:  # as graphsurgeon's exporter writes it: every Variable with a known dtype or shape
            io = {t.name for t in list(graph.inputs) + list(graph.outputs)}
            proto.value_info.extend(
                OnnxExporter.export_value_info_proto(t, do_type_check=False)
                for name, t in graph.tensors().items()
                if name not in io and isinstance(t, Variable) and (t.dtype is not None or t.shape is not None)
            )
        return proto, stub_bytes, stubs

    def export(
        self, graph: gs.Graph, template: onnx.ModelProto, *, value_info: bool = False, stub_bodies: bool = True
    ) -> tuple[onnx.ModelProto, int, dict[str, gs.Constant]]:
        """(light ModelProto, payload bytes of the stubbed constants, {name: gs.Constant} of the top-level
        graph's stubs). ``value_info``: also write the intermediate tensors' types; ``stub_bodies=False``: the
        constants inside If/Loop/Scan bodies keep their data (for a model ONNX Runtime runs with the top-level
        stubs given as external initializers, which it takes for the top-level graph only)."""
        import onnx
        from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

        onnx_graph, stub_bytes, stubs = self._graph_proto(
            graph, stub=True, value_info=value_info, stub_bodies=stub_bodies
        )
        onnx_graph.doc_string = graph.doc_string or ""
        functions = [OnnxExporter.export_function(function) for function in graph.functions]  # model-local ones
        opsets = [  # the template's, with the default domain at the graph's opset (a pass may change it)
            onnx.helper.make_opsetid(imp.domain, int(graph.opset))
            if imp.domain in ("", "ai.onnx") and getattr(graph, "opset", None) is not None
            else imp
            for imp in template.opset_import
        ]
        model = onnx.helper.make_model(onnx_graph, opset_imports=opsets, functions=functions)
        model.ir_version = max(template.ir_version, 4)
        for imp in graph.import_domains or []:
            if imp.domain not in {existing.domain for existing in model.opset_import}:
                model.opset_import.append(imp)
        return model, stub_bytes, stubs


def fill_stubs(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of a light model whose top-level stubs named in ``arrays`` hold those arrays: a full model."""
    import onnx

    full = onnx.ModelProto()
    full.CopyFrom(model)
    for init in full.graph.initializer:
        if init.name not in arrays:
            continue
        array = np.asarray(arrays[init.name])
        if array.dtype.byteorder == ">":  # ONNX raw data is little-endian: let onnx swap it
            init.CopyFrom(onnx.numpy_helper.from_array(array, init.name))
            continue
        init.raw_data = np.ascontiguousarray(array).tobytes()  # the stub already has the name, type and dims
        init.ClearField("doc_string")
    return full


def light_export(graph: gs.Graph, template: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A one-off light export (see :class:`LightExporter`): (model, payload bytes of the stubbed constants)."""
    model, stub_bytes, _ = LightExporter(track_values=False).export(graph, template)
    return model, stub_bytes


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Op type -> count over the whole model, subgraph nodes included."""
    counts = Counter(node.op_type for node in iter_node_protos(model.graph))
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


_RAW_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}  # TensorProto types


def _payload_bytes(tensor: onnx.TensorProto) -> int:
    if tensor.HasField("raw_data"):
        itemsize = _RAW_ITEMSIZE.get(tensor.data_type)
        # from the dims: reading raw_data would copy the payload
        return math.prod(tensor.dims) * itemsize if itemsize else len(tensor.raw_data)
    return tensor.ByteSize()


def model_bytes(model: onnx.ModelProto, stub_bytes: int = 0) -> int:
    """About the serialized size: weight payloads plus node protos (value_info and headers left out), computed
    without serializing the whole model (upb's ByteSize encodes everything: 0.4 s for a 90 MB model)."""
    weights = sum(_payload_bytes(t) for t in model.graph.initializer)
    return int(weights + stub_bytes + sum(node.ByteSize() for node in model.graph.node))


def node_names(model: onnx.ModelProto) -> list[str]:
    """A stable identity per node: its name, or (for unnamed nodes) op type and first output."""
    return [
        node.name or f"{node.op_type}:{node.output[0] if node.output else ''}" for node in iter_node_protos(model.graph)
    ]


def opset_of(graph_or_model: gs.Graph | onnx.ModelProto) -> int:
    if hasattr(graph_or_model, "opset"):
        return int(graph_or_model.opset)
    return int(next((imp.version for imp in graph_or_model.opset_import if imp.domain in ("", "ai.onnx")), 0))


def constant_values(tensor: gs.Tensor | None) -> np.ndarray | None:
    return np.asarray(tensor.values) if tensor is not None and is_constant(tensor) else None


def single_consumer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.outputs[0] if len(tensor.outputs) == 1 else None


def redirect_consumers(old: gs.Tensor, new: gs.Tensor, within: set[int] | None = None) -> None:
    """Make every node that reads tensor ``old`` read tensor ``new`` instead (graph outputs are not touched).
    ``within``: ids of the only nodes to change (a subgraph's own nodes, so an outer tensor keeps its outer readers)."""
    for consumer in list(old.outputs):
        if within is not None and id(consumer) not in within:
            continue
        for index, tensor in enumerate(consumer.inputs):
            if tensor is old:
                consumer.inputs[index] = new


def bypass_node(graph: gs.Graph, node: gs.Node, keep_input: int = 0) -> bool:
    """Remove a single-output pass-through node by wiring its input straight to its consumers.

    When the node's output is a graph output the output name must survive, so the *producer* of the input is
    made to write the graph-output tensor instead (only possible when the input is a plain intermediate tensor
    not itself a graph output; its other readers then read the graph-output tensor, which holds the same values).
    Returns False and leaves the graph alone when the node cannot be bypassed.
    """
    if len(node.outputs) < 1:
        return False
    source, out = node.inputs[keep_input], node.outputs[0]
    if any(extra.outputs for extra in node.outputs[1:]) or any(extra in graph.outputs for extra in node.outputs[1:]):
        return False
    if out in graph.outputs:
        upstream = producer(source)
        if (
            upstream is None
            or not any(candidate is upstream for candidate in graph.nodes)  # in an outer scope: never rename it
            or source in graph.outputs
            or source in graph.inputs
            or is_constant(source)
        ):
            return False
        # the upstream node now writes the graph output directly (two body outputs copied from one tensor: one
        # Identity goes, the other reads the graph output)
        node.outputs.clear()
        node.inputs.clear()
        redirect_consumers(source, out)
        index = upstream.outputs.index(source)
        upstream.outputs[index] = out
        return True
    redirect_consumers(out, source)
    node.outputs.clear()
    node.inputs.clear()
    return True


def tensor_shape(tensor: gs.Tensor | None) -> tuple[int | str | None, ...] | None:
    shape = getattr(tensor, "shape", None)
    return tuple(shape) if shape is not None else None


def is_static(shape: Iterable[int | str | None] | None) -> TypeGuard[tuple[int, ...]]:
    return shape is not None and all(isinstance(dim, (int, np.integer)) and dim >= 0 for dim in shape)


def dtype_name(tensor: gs.Tensor) -> str | None:
    dtype = np_dtype(tensor)
    return None if dtype is None else dtype.name


def np_dtype(tensor: gs.Tensor | None) -> np.dtype | None:
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return None
    try:
        import onnx

        if isinstance(dtype, int):
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype))
        return np.dtype(dtype)
    except TypeError:
        return None
