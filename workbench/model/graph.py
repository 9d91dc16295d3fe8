"""Facts about an ONNX graph that every stage agrees on: node names, node lists, Q/DQ pairs, constants, producers.

One place so that the cleaner, the precision rewrite, calibration and the engine layer map name and classify nodes
the same way. Works on ``onnx.ModelProto`` graphs (``onnx_node_name``, ``onnx_node_list``, ``qdq_edges``,
``name_unnamed_nodes``) and on onnx-graphsurgeon graphs (``is_constant``, ``producer``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

# Quantization ops: never folded by the cleaner, never cast by AutoCast, and what "a Q/DQ model" means.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def onnx_node_name(node: onnx.NodeProto) -> str:
    """The name TensorRT's ONNX parser gives a node: its own, or ``node_of_<first output>`` when unnamed."""
    if node.name:
        return str(node.name)
    return f"node_of_{node.output[0]}" if node.output else f"unnamed_{node.op_type}"


def onnx_node_list(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """(name, op_type) of every top-level node of an ONNX ModelProto, in graph order, named as TensorRT names them
    in our builds (duplicate and non-printable names as :func:`fix_node_names` rewrites them for the builder)."""
    nodes = list(proto.graph.node)
    names = _unique_printable([node.name for node in nodes])
    return [(name if node.name else onnx_node_name(node), str(node.op_type)) for name, node in zip(names, nodes)]


def name_unnamed_nodes(proto: onnx.ModelProto) -> None:
    """Give every unnamed node (in place) the name TensorRT's parser would give it, so plans and layer maps agree."""
    used = {node.name for node in proto.graph.node if node.name}
    for node in proto.graph.node:
        if not node.name:
            candidate = onnx_node_name(node)
            while candidate in used:
                candidate += "_"
            node.name = candidate
            used.add(candidate)


def escape_name(name: str) -> str:
    """``name`` with every non-printable character written as a Python escape (a newline becomes ``\\n``):
    TensorRT's build log and our layer records are line-based, and a terminal shows escapes, not raw controls."""
    if name.isprintable():
        return name
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in name)


def node_names_to_fix(proto: onnx.ModelProto) -> list[str]:
    """Top-level node names :func:`fix_node_names` would change: repeats of a name, and names with characters that
    are not printable (newlines, tabs, control characters)."""
    seen: set[str] = set()
    bad: list[str] = []
    for node in proto.graph.node:
        if node.name and (node.name in seen or not node.name.isprintable()):
            bad.append(node.name)
        seen.add(node.name)
    return bad


def _unique_printable(names: list[str]) -> list[str]:
    """Names with control characters escaped and repeats suffixed ``~2``, ``~3``, ... (empty names stay empty)."""
    taken = {name for name in names if name}
    used: set[str] = set()
    result: list[str] = []
    for name in names:
        if not name:
            result.append(name)
            continue
        fixed = escape_name(name)
        if fixed in used:
            index = 2
            while f"{fixed}~{index}" in used or f"{fixed}~{index}" in taken:
                index += 1
            fixed = f"{fixed}~{index}"
        used.add(fixed)
        result.append(fixed)
    return result


def fix_node_names(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """Make every top-level node name (in place) printable and unique, as the engine's layer map needs: TensorRT
    keeps duplicate names (two nodes then read as one) and writes newlines into its line-based build log. Returns
    (old, new) for every renamed node; unnamed nodes keep the names TensorRT gives them."""
    renamed: list[tuple[str, str]] = []
    nodes = list(proto.graph.node)
    for node, name in zip(nodes, _unique_printable([node.name for node in nodes])):
        if name != node.name:
            renamed.append((node.name, name))
            node.name = name
    return renamed


# ONNX Runtime's quantized operator format (quantize_static QOperator, quantize_dynamic): integer kernels ONNX Runtime
# runs and TensorRT has none of; TensorRT takes INT8 only as Q/DQ pairs around float ops
ORT_QUANTIZED_OPS = frozenset(
    {
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearConcat",
        "QLinearGlobalAveragePool",
        "QLinearAveragePool",
        "QLinearLeakyRelu",
        "QLinearSigmoid",
        "QLinearSoftmax",
        "QLinearReduceMean",
        "QLinearWhere",
        "QGemm",
        "QAttention",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
    }
)


@contextmanager
def quiet_graphsurgeon() -> Iterator[None]:
    """onnx-graphsurgeon's logger at ERROR inside: it warns, per FP8 constant, that numpy has no float8 type (the
    value stays an ONNX tensor, what is wanted here), each time with a hint to `pip install colored`."""
    from onnx_graphsurgeon.logger import G_LOGGER

    severity, G_LOGGER.severity = G_LOGGER.severity, G_LOGGER.ERROR
    try:
        yield
    finally:
        G_LOGGER.severity = severity


def ort_operator_quantization(proto: onnx.ModelProto) -> str | None:
    """Why TensorRT cannot build ``proto`` when ONNX Runtime quantized it in its operator format (no TensorRT
    kernels for these integer ops), or None."""
    counts: dict[str, int] = {}
    for node in proto.graph.node:
        if node.op_type in ORT_QUANTIZED_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    if not counts:
        return None
    ops = ", ".join(f"{op} x{count}" for op, count in sorted(counts.items(), key=lambda item: -item[1])[:5])
    return (
        f"it is quantized in ONNX Runtime's operator format ({ops}): TensorRT has no kernels for these integer "
        "ops; it takes INT8 only as QuantizeLinear/DequantizeLinear pairs around float ops (the QDQ format)"
    )


def parser_refused_qdq(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """(node, why) for every Q/DQ node the TensorRT(-RTX) parser refuses outright, measured: a non-zero zero point
    ("Assertion failed: shiftIsAllZeros(zeroPoint)", ONNX Runtime's asymmetric uint8 QDQ default) and a scale that
    is not > 0 ("Scale coefficients must all be positive"). The same rules as ``qdq-zero-point-nonzero`` and
    ``qdq-scale-not-positive`` of ``workbench.clean.qdq_lint``, read straight from the initializers here because the
    engine layer may not import the cleaner."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    initializers = {init.name: init for init in proto.graph.initializer}
    refused: list[tuple[str, str]] = []
    for node in proto.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        name = node.name or node.output[0]
        scale = initializers.get(node.input[1]) if len(node.input) > 1 else None
        if scale is not None:
            values = numpy_helper.to_array(scale).astype(np.float64)
            if not np.all(np.isfinite(values)) or np.any(values <= 0):
                refused.append((name, f"{node.op_type} scale must be finite and > 0"))
                continue
        zero = initializers.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if zero is not None and zero.data_type != TensorProto.FLOAT8E4M3FN and numpy_helper.to_array(zero).any():
            refused.append((name, f"{node.op_type} zero point must be a constant 0 (TensorRT quantizes symmetrically)"))
    return refused


def has_qdq(proto_or_graph: onnx.ModelProto | onnx.GraphProto) -> bool:
    graph = proto_or_graph.graph if hasattr(proto_or_graph, "graph") else proto_or_graph
    return any(node.op_type in QDQ_OPS for node in graph.node)


def qdq_edges(proto: onnx.ModelProto) -> tuple[tuple[str, str, str, bool], ...]:
    """Every QuantizeLinear -> DequantizeLinear pair: (Q node, DQ node, quantized tensor, tensor is a constant)."""
    graph = proto.graph
    constants = {init.name for init in graph.initializer}
    constants |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    edges = []
    for node in graph.node:
        if node.op_type != "QuantizeLinear":
            continue
        for consumer in consumers.get(node.output[0], []):
            if consumer.op_type == "DequantizeLinear":
                edges.append(
                    (onnx_node_name(node), onnx_node_name(consumer), str(node.input[0]), node.input[0] in constants)
                )
    return tuple(edges)


# --- onnx-graphsurgeon graphs ----------------------------------------------------------------------------------


def is_constant(tensor: gs.Tensor) -> bool:
    """A graphsurgeon tensor whose value is known at build time (an initializer or folded constant)."""
    import onnx_graphsurgeon as gs

    return isinstance(tensor, gs.Constant)


def producer(tensor: gs.Tensor) -> gs.Node | None:
    """The node that writes a graphsurgeon tensor (None for graph inputs and constants)."""
    inputs = getattr(tensor, "inputs", None)
    return inputs[0] if inputs else None


def subgraph_node_count(graph: onnx.GraphProto) -> int:
    """Nodes inside the If/Loop/Scan bodies of an ONNX GraphProto (recursively), not counting the top level."""
    return sum(len(body.node) for body in subgraph_bodies(graph.node))


def subgraph_bodies(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.GraphProto]:
    """Every If/Loop/Scan body under ``nodes`` (a graph's ``.node``), at any depth."""
    for node in nodes:
        for attribute in node.attribute:
            for body in [attribute.g] if attribute.type == attribute.GRAPH else list(attribute.graphs):
                yield body
                yield from subgraph_bodies(body.node)


def subgraph_reads(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    """Every tensor name the If/Loop/Scan bodies of ``nodes`` (a graph's ``.node``; any depth) read or pass out as
    outputs: a superset of what the bodies take from outer scopes."""
    names: set[str] = set()
    for body in subgraph_bodies(nodes):
        for node in body.node:
            names.update(name for name in node.input if name)
        names.update(output.name for output in body.output)
    return names
