"""Where Q/DQ pairs go: TensorRT's explicit-quantization placement rules over a precision plan.

Rules (TensorRT 11 explicit quantization guide; ModelOpt's placement as the reference):

* symmetric int8, zero point 0 (a constant initializer), scale = amax / 127 > 0;
* per-tensor scales for activations, per-channel scales for weights (axis 0 for Conv and Gemm(transB=1),
  axis 1 for ConvTranspose, MatMul and Gemm(transB=0));
* Q/DQ on the *inputs* of Conv, ConvTranspose, Gemm and MatMul (outputs are left to TensorRT's fusions);
* the skip input of a residual Add fed by a Conv, so the Add fuses into that Conv's epilogue;
* quantized tensors meeting at a Concat share one scale (TensorRT moves Q/DQ through Concat);
* excluded by default: the attention core (MatMul with two activation inputs) and LayerNorm (never an input here).

A :class:`~workbench.precision.PrecisionPlan` picks nodes: a quantizable node is INT8 when the plan says ``int8``;
``fp16`` / ``fp32`` keep it out of INT8 (FP16 nodes are then cast by :mod:`workbench.precision.autocast`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.model.graph import is_constant, name_unnamed_nodes, producer
from workbench.precision.plan import PrecisionPlan

QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops TensorRT fuses after a Conv (so a residual Add behind them still joins the Conv's epilogue).
EPILOGUE_OPS = frozenset(
    {"BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Mul"}
)
MIN_OPSET = 13  # per-channel QuantizeLinear (axis attribute) needs opset 13


@dataclass
class WeightQuant:
    tensor: str
    axis: int
    consumers: list[str]


@dataclass
class QdqPlacement:
    """Which tensors get Q/DQ and for which consumers; plus why quantizable nodes were left out."""

    activations: dict[str, list[str]] = field(default_factory=dict)  # tensor -> consumer node names
    weights: dict[str, WeightQuant] = field(default_factory=dict)
    int8_nodes: list[str] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)  # node -> reason
    shared_scale_groups: list[list[str]] = field(default_factory=list)
    residual_skips: dict[str, str] = field(default_factory=dict)  # Add node -> skip tensor
    moved_before_pad: dict[str, str] = field(default_factory=dict)  # Pad output -> Pad input quantized instead

    def to_json(self) -> dict[str, Any]:
        return {
            "activations": {k: list(v) for k, v in self.activations.items()},
            "weights": {k: {"axis": w.axis, "consumers": w.consumers} for k, w in self.weights.items()},
            "int8_nodes": list(self.int8_nodes),
            "excluded": dict(self.excluded),
            "shared_scale_groups": [list(g) for g in self.shared_scale_groups],
            "residual_skips": dict(self.residual_skips),
            "moved_before_pad": dict(self.moved_before_pad),
        }


def prepare_model(proto: Any) -> Any:
    """A copy ready for Q/DQ: Constant-node weights become initializers, opset >= 13, every node named.

    PaddleOCR exports keep weights in Constant nodes and use opset 11/12; per-channel Q/DQ needs both fixed.
    Unnamed nodes get the names TensorRT's parser gives them, so precision plans and layer maps agree.
    """
    import onnx
    from onnx import numpy_helper, version_converter

    model = copy.deepcopy(proto)
    graph = model.graph
    constant_nodes = [
        n for n in graph.node if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"
    ]
    for node in constant_nodes:
        tensor = copy.deepcopy(node.attribute[0].t)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        try:
            model = version_converter.convert_version(model, MIN_OPSET)
        except Exception as error:  # the converter raises plain RuntimeError / ConvertError
            raise WorkbenchError(
                f"cannot upgrade the model from opset {opset} to {MIN_OPSET} for per-channel Q/DQ ({error}).",
                expected="an ONNX model at opset >= 13",
            ) from error
    # after conversion (the converter may add unnamed nodes): the names TensorRT's parser gives unnamed nodes
    name_unnamed_nodes(model)
    del numpy_helper, onnx
    return model


def _weight_axis(node: Any, weight_index: int, weight: Any) -> int:
    if node.op == "ConvTranspose":
        return 1
    if node.op == "Conv":
        return 0
    if node.op == "Gemm":
        trans = int(node.attrs.get("transB", 0)) if weight_index == 1 else int(node.attrs.get("transA", 0))
        return 0 if trans else 1
    return len(weight.shape) - 1  # MatMul B [.., K, N]: per output column


def _conv_behind(tensor: Any, int8_nodes: set[str], depth: int = 4) -> Any | None:
    """The INT8 Conv that produces ``tensor`` directly or through a short pointwise epilogue, if any."""
    node = producer(tensor)
    while node is not None and depth > 0:
        if node.op in ("Conv", "ConvTranspose"):
            return node if node.name in int8_nodes else None
        if node.op not in EPILOGUE_OPS or not node.inputs:
            return None
        node = producer(node.inputs[0])
        depth -= 1
    return None


def plan_placement(graph: Any, plan: PrecisionPlan | None = None, *, quantize_attention: bool = False) -> QdqPlacement:
    """Decide Q/DQ placement on a graphsurgeon graph (already prepared and topologically sorted)."""
    plan = plan or PrecisionPlan(default="int8")
    placement = QdqPlacement()
    int8: set[str] = set()
    for node in graph.nodes:
        if node.op not in QUANTIZABLE_OPS:
            continue
        if plan.precision_of(node.name) != "int8":
            placement.excluded[node.name] = f"plan says {plan.precision_of(node.name)}"
            continue
        variable_inputs = [t for t in node.inputs[:2] if t is not None and t.name and not is_constant(t)]
        if (
            node.op == "MatMul"
            and len(variable_inputs) == 2
            and not (quantize_attention and node.name in plan.overrides)
        ):
            placement.excluded[node.name] = "attention core (MatMul of two activations)"
            continue
        if not node.inputs or node.inputs[0] is None:
            continue
        int8.add(node.name)
        placement.int8_nodes.append(node.name)
        for index, tensor in enumerate(node.inputs[:2]):
            if tensor is None or not tensor.name:
                continue
            if is_constant(tensor):
                if index == 0:  # a constant left operand has no output-channel axis TensorRT accepts
                    continue
                values = tensor.values
                if values.dtype.kind != "f" or values.ndim < 1:
                    continue
                axis = _weight_axis(node, index, tensor)
                quant = placement.weights.setdefault(tensor.name, WeightQuant(tensor.name, axis, []))
                quant.consumers.append(node.name)
            else:
                placement.activations.setdefault(tensor.name, []).append(node.name)
    # Q/DQ after a zero Pad blocks TensorRT's Pad+Conv fusion: quantize the Pad's input instead (a zero pad commutes
    # with symmetric quantization, so the values are identical).
    for name in list(placement.activations):
        tensor = graph.tensors().get(name)
        pad = producer(tensor) if tensor is not None else None
        if pad is None or pad.op != "Pad" or pad.attrs.get("mode", "constant") not in ("constant", b"constant"):
            continue
        value = pad.inputs[2] if len(pad.inputs) > 2 and pad.inputs[2] is not None and pad.inputs[2].name else None
        if value is not None and (not is_constant(value) or np.any(value.values != 0)):
            continue
        if is_constant(pad.inputs[0]):
            continue
        consumers = placement.activations.pop(name)
        placement.activations.setdefault(pad.inputs[0].name, []).append(pad.name)
        placement.moved_before_pad[name] = pad.inputs[0].name
        del consumers
    # Residual Add: quantize the skip input so the Add fuses into the Conv on the other branch.
    for node in graph.nodes:
        if node.op != "Add" or len(node.inputs) != 2 or any(is_constant(t) for t in node.inputs):
            continue
        if plan.precision_of(node.name) != "int8":
            continue
        convs = [_conv_behind(t, int8) for t in node.inputs]
        if not any(convs):
            continue
        if all(convs):
            # both branches end in a Conv (projection shortcut): the branch whose Conv comes later in
            # topological order is the main path; the other (earlier) one is the skip.
            order = {n.name: i for i, n in enumerate(graph.nodes)}
            skip_index = 0 if order[convs[0].name] < order[convs[1].name] else 1  # type: ignore[union-attr]
        else:
            skip_index = 0 if convs[0] is None else 1
        skip = node.inputs[skip_index]
        placement.activations.setdefault(skip.name, []).append(node.name)
        placement.residual_skips[node.name] = skip.name
    # Concat: quantized tensors among a Concat's inputs and output share one scale.
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.get(name, name) != name:
            name = parent[name]
        return name

    for node in graph.nodes:
        if node.op != "Concat":
            continue
        members = [t.name for t in list(node.inputs) + list(node.outputs) if t.name in placement.activations]
        for other in members[1:]:
            parent[find(other)] = find(members[0])
    groups: dict[str, list[str]] = {}
    for name in parent:
        groups.setdefault(find(name), []).append(name)
    for root, members in groups.items():
        placement.shared_scale_groups.append(sorted(set(members) | {root}))
    return placement


def placement_for_model(
    proto: Any, plan: PrecisionPlan | None = None, *, quantize_attention: bool = False
) -> QdqPlacement:
    """Where Q/DQ pairs go in an ONNX ModelProto under ``plan`` (all quantizable nodes INT8 by default)."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(prepare_model(proto))
    graph.toposort()
    return plan_placement(graph, plan, quantize_attention=quantize_attention)


def activation_tensors(proto: Any, plan: PrecisionPlan | None = None) -> list[str]:
    """Names of the activation tensors that need a scale under ``plan`` (all quantizable nodes INT8 by default)."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(prepare_model(proto))
    graph.toposort()
    placement = plan_placement(graph, plan)
    names = list(placement.activations)
    # Both inputs of a residual Add: a fallback can change which side is the skip, and its range must be at hand.
    all_int8 = {n.name for n in graph.nodes if n.op in QUANTIZABLE_OPS}
    for node in graph.nodes:
        if node.op == "Add" and len(node.inputs) == 2 and not any(is_constant(t) for t in node.inputs):
            if any(_conv_behind(t, all_int8) for t in node.inputs):
                names.extend(t.name for t in node.inputs if t.name not in names)
    return names


def shared_amax(placement: QdqPlacement, amax: Mapping[str, float]) -> dict[str, float]:
    """Per-tensor amax with Concat groups unified to the group's largest amax."""
    result = {name: float(amax[name]) for name in placement.activations if name in amax}
    for group in placement.shared_scale_groups:
        present = [result[n] for n in group if n in result]
        if present:
            for name in group:
                if name in result:
                    result[name] = max(present)
    return result
