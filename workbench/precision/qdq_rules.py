"""Where Q/DQ pairs go: TensorRT's explicit-quantization placement rules over a precision plan.

Rules (TensorRT 11 explicit quantization guide; ModelOpt's placement as the reference):

* symmetric int8 (scale = amax / 127) or FP8 E4M3FN (scale = amax / 448), zero point 0 (a constant initializer) of
  the format's type, scale > 0; FP8 needs opset 19 (FLOAT8E4M3FN Q/DQ) and a target of compute capability 8.9+;
* per-tensor scales for activations, per-channel scales for weights (axis 0 for Conv and Gemm(transB=1),
  axis 1 for ConvTranspose, MatMul and Gemm(transB=0)); a constant *left* operand (``MatMul(W, x)``, a Gemm's
  constant A) per output row (its axis -2; measured: TensorRT-RTX 1.7 builds such a MatMul as an INT8 GEMM, where
  an unquantized left weight left it computing in FP32 inside a generated kernel);
* Q/DQ on the *inputs* of Conv, ConvTranspose, Gemm and MatMul (outputs are left to TensorRT's fusions);
* the skip input of a residual Add fed by a Conv, so the Add fuses into that Conv's epilogue;
* quantized tensors meeting at a Concat share one scale (TensorRT moves Q/DQ through Concat);
* excluded by default in INT8: the attention core (MatMul with two activation inputs) and LayerNorm (never an input
  here). In FP8 the attention core is quantized too, Q/DQ on both inputs of Q·Kᵀ and of softmax·V: TensorRT's FP8
  attention takes FP8 BMM inputs (measured: TensorRT-RTX 1.7 for SM89 builds MiniLM's attention MatMuls as FP8
  layers), and E4M3's relative grid suits the softmax probabilities that INT8's uniform grid flattens.

A :class:`~workbench.precision.PrecisionPlan` picks nodes: a quantizable node is INT8 or FP8 when the plan says
``int8`` / ``fp8`` (the FP8 rules are TensorRT's INT8 ones: Q/DQ on the inputs and weights of Conv, Gemm and MatMul;
TensorRT-RTX builds them as FP8 convolutions and GEMMs); ``fp16`` / ``fp32`` keep it out of both (FP16 nodes are
then cast by :mod:`workbench.precision.autocast`). Every quantized tensor gets its Q/DQ pair in the format of the
node that reads it; a tensor read in both formats gets one pair per format.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError
from workbench.model.graph import is_constant, name_unnamed_nodes, producer
from workbench.precision.plan import PrecisionPlan

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops TensorRT fuses after a Conv (so a residual Add behind them still joins the Conv's epilogue).
EPILOGUE_OPS = frozenset(
    {"BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Mul"}
)
MIN_OPSET = 13  # per-channel QuantizeLinear (axis attribute) needs opset 13
FP8_MIN_OPSET = 19  # QuantizeLinear / DequantizeLinear of FLOAT8E4M3FN
QUANTIZED_PRECISIONS = frozenset({"int8", "fp8"})
# Quantizable ops with no FP8 kernel (measured on TensorRT-RTX 1.7.1 for SM89: an FP8 Q/DQ ConvTranspose builds as an
# FP32 "deconv" layer): a blanket fp8 plan leaves them out; an explicit per-node fp8 override still places the pair.
FP8_NO_KERNEL_OPS = {"ConvTranspose": "no FP8 ConvTranspose kernel in TensorRT-RTX 1.7 (it runs FP32)"}


@dataclass
class WeightQuant:
    tensor: str
    axis: int
    consumers: list[str]
    format: str = "int8"  # "int8" or "fp8"


@dataclass
class QdqPlacement:
    """Which tensors get Q/DQ and for which consumers; plus why quantizable nodes were left out."""

    activations: dict[str, list[str]] = field(default_factory=dict)  # tensor -> consumer node names
    # weight tensor -> its quantization; a weight read in two formats has its second one under "NAME|fp8"
    weights: dict[str, WeightQuant] = field(default_factory=dict)
    int8_nodes: list[str] = field(default_factory=list)
    fp8_nodes: list[str] = field(default_factory=list)
    # the format each consumer of a quantized tensor reads it in (math nodes, residual Adds, moved-to Pads)
    formats: dict[str, str] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)  # node -> reason
    shared_scale_groups: list[list[str]] = field(default_factory=list)
    residual_skips: dict[str, str] = field(default_factory=dict)  # Add node -> skip tensor
    moved_before_pad: dict[str, str] = field(default_factory=dict)  # Pad output -> Pad input quantized instead

    @property
    def quantized_nodes(self) -> list[str]:
        """INT8 and FP8 math nodes, in topological order (the fallback candidates of a search)."""
        quantized = set(self.int8_nodes) | set(self.fp8_nodes)
        return [name for name in self.formats if name in quantized]

    def format_of(self, consumer: str) -> str:
        return self.formats.get(consumer, "int8")

    @property
    def uses_fp8(self) -> bool:
        return "fp8" in self.formats.values()

    def to_json(self) -> JsonObject:
        return {
            "activations": {k: list(v) for k, v in self.activations.items()},
            "weights": {
                k: {"tensor": w.tensor, "axis": w.axis, "consumers": w.consumers, "format": w.format}
                for k, w in self.weights.items()
            },
            "int8_nodes": list(self.int8_nodes),
            "fp8_nodes": list(self.fp8_nodes),
            "formats": dict(self.formats),
            "excluded": dict(self.excluded),
            "shared_scale_groups": [list(g) for g in self.shared_scale_groups],
            "residual_skips": dict(self.residual_skips),
            "moved_before_pad": dict(self.moved_before_pad),
        }


def _constants_to_initializers(graph: onnx.GraphProto) -> None:
    constant_nodes = [
        n for n in graph.node if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"
    ]
    for node in constant_nodes:
        tensor = copy.deepcopy(node.attribute[0].t)
        tensor.name = node.output[0]
        graph.initializer.append(tensor)
        graph.node.remove(node)


# ONNX float types a weight may be stored in and cast to FLOAT before use (a "half-saved" model)
_STORED_FLOAT_TYPES = (10, 16, 11)  # FLOAT16, BFLOAT16, DOUBLE


def stored_weight_casts(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The Cast-to-FLOAT nodes that read a weight stored in another float type: the model computes in FP32."""
    initializers = {init.name: init.data_type for init in graph.initializer}
    return [
        node
        for node in graph.node
        if node.op_type == "Cast"
        and node.input
        and initializers.get(node.input[0]) in _STORED_FLOAT_TYPES
        and next((a.i for a in node.attribute if a.name == "to"), 0) == 1
    ]


def _stored_weights_to_float(graph: onnx.GraphProto) -> None:
    """Each Cast of a stored FP16/BF16/FP64 weight to FLOAT becomes the FP32 initializer it computes (the same
    values: the cast is done once here instead of on every run), so the weight gets its per-channel Q/DQ."""
    from onnx import numpy_helper

    casts = stored_weight_casts(graph)
    if not casts:
        return
    stored = {init.name: init for init in graph.initializer}
    for node in casts:
        values = numpy_helper.to_array(stored[node.input[0]]).astype(np.float32)
        graph.initializer.append(numpy_helper.from_array(values, node.output[0]))
        graph.node.remove(node)
    still_read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    for name in {node.input[0] for node in casts} - still_read:
        graph.initializer.remove(stored[name])


def model_opset(proto: onnx.ModelProto) -> int:
    return next((imp.version for imp in proto.opset_import if imp.domain in ("", "ai.onnx")), 0)


def prepare_model(proto: onnx.ModelProto, min_opset: int = MIN_OPSET) -> onnx.ModelProto:
    """A copy ready for Q/DQ: Constant-node weights become initializers, weights stored in FP16/BF16/FP64 and cast
    to FLOAT become FP32 initializers, opset >= ``min_opset``, every node named.

    PaddleOCR exports keep weights in Constant nodes and use opset 11/12; per-channel Q/DQ needs both fixed (FP8
    Q/DQ needs opset 19: ``min_opset=FP8_MIN_OPSET``). Constants the opset converter adds become initializers too,
    so the nodes and their names are the same at every opset. Unnamed nodes get the names TensorRT's parser gives
    them, so precision plans and layer maps agree.
    """
    import onnx
    from onnx import numpy_helper, version_converter

    model = copy.deepcopy(proto)
    _constants_to_initializers(model.graph)
    _stored_weights_to_float(model.graph)
    opset = model_opset(model)
    if opset < min_opset:
        what = "FP8 Q/DQ" if min_opset >= FP8_MIN_OPSET else "per-channel Q/DQ"
        try:
            model = version_converter.convert_version(model, min_opset)
        except Exception as error:  # the converter raises plain RuntimeError / ConvertError
            raise WorkbenchError(
                f"cannot upgrade the model from opset {opset} to {min_opset} for {what} ({error}).",
                expected=f"an ONNX model at opset >= {min_opset}",
            ) from error
        _constants_to_initializers(model.graph)
        _stored_weights_to_float(model.graph)
    # after conversion (the converter may add unnamed nodes): the names TensorRT's parser gives unnamed nodes
    name_unnamed_nodes(model)
    del numpy_helper, onnx
    return model


def _weight_axis(node: gs.Node, weight_index: int, weight: gs.Tensor) -> int | None:
    """The output-channel axis of a constant operand (its per-channel scales), or None when it has none."""
    if node.op == "ConvTranspose":
        return 1 if weight_index == 1 else None
    if node.op == "Conv":
        return 0 if weight_index == 1 else None
    rank = len(weight.shape)
    if node.op == "Gemm":
        if weight_index == 1:  # B [K, N], or [N, K] with transB
            return 0 if int(node.attrs.get("transB", 0)) else 1
        return 1 if int(node.attrs.get("transA", 0)) else 0  # A [M, K], or [K, M] with transA: per output row
    if rank < 2:  # a vector operand: no output channel
        return None
    return rank - 1 if weight_index == 1 else rank - 2  # MatMul B [.., K, N] per column; A [.., M, K] per row


def _conv_behind(tensor: gs.Tensor, int8_nodes: set[str], depth: int = 4) -> gs.Node | None:
    """The quantized Conv that produces ``tensor`` directly or through a short pointwise epilogue, if any."""
    node = producer(tensor)
    while node is not None and depth > 0:
        if node.op in ("Conv", "ConvTranspose"):
            return node if node.name in int8_nodes else None
        if node.op not in EPILOGUE_OPS or not node.inputs:
            return None
        node = producer(node.inputs[0])
        depth -= 1
    return None


def plan_placement(
    graph: gs.Graph, plan: PrecisionPlan | None = None, *, quantize_attention: bool = False
) -> QdqPlacement:
    """Decide Q/DQ placement on a graphsurgeon graph (already prepared and topologically sorted)."""
    plan = plan or PrecisionPlan(default="int8")
    placement = QdqPlacement()
    int8: set[str] = set()  # every quantized (INT8 or FP8) math node
    for node in graph.nodes:
        if node.op not in QUANTIZABLE_OPS:
            continue
        fmt = plan.precision_of(node.name)
        if fmt not in QUANTIZED_PRECISIONS:
            placement.excluded[node.name] = f"plan says {fmt}"
            continue
        if fmt == "fp8" and node.op in FP8_NO_KERNEL_OPS and node.name not in plan.overrides:
            placement.excluded[node.name] = FP8_NO_KERNEL_OPS[node.op]
            continue
        variable_inputs = [t for t in node.inputs[:2] if t is not None and t.name and not is_constant(t)]
        if (
            node.op == "MatMul"
            and len(variable_inputs) == 2
            and fmt != "fp8"
            and not (quantize_attention and node.name in plan.overrides)
        ):
            placement.excluded[node.name] = "attention core (MatMul of two activations)"
            continue
        if not node.inputs or node.inputs[0] is None:
            continue
        operands = [(i, t) for i, t in enumerate(node.inputs[:2]) if t is not None and t.name]
        axes = {i: _weight_axis(node, i, t) for i, t in operands if is_constant(t) and t.values.dtype.kind == "f"}
        if any(axis is None for axis in axes.values()):
            # half a quantized node would run in float behind a Q/DQ that only costs (a vector weight, a Conv's
            # constant data input: no output-channel axis to scale per channel)
            placement.excluded[node.name] = (
                "a constant operand without an output-channel axis (a vector, or a Conv's data)"
            )
            continue
        int8.add(node.name)
        (placement.fp8_nodes if fmt == "fp8" else placement.int8_nodes).append(node.name)
        placement.formats[node.name] = fmt
        for index, tensor in operands:
            if index in axes:
                axis = axes[index]
                key = tensor.name
                if key in placement.weights and placement.weights[key].format != fmt:
                    key = f"{tensor.name}|{fmt}"  # a weight shared by nodes of two formats: one pair per format
                if key in placement.weights and placement.weights[key].axis != axis:
                    key = f"{key}|axis{axis}"  # read as a left and a right operand: rows and columns differ
                quant = placement.weights.setdefault(key, WeightQuant(tensor.name, cast(int, axis), [], fmt))
                quant.consumers.append(node.name)
            elif not is_constant(tensor):
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
        formats = {placement.format_of(c) for c in placement.activations[name]}
        if len(formats) != 1:  # read in two formats behind the Pad: one pair per format stays after it
            continue
        placement.activations.pop(name)
        placement.activations.setdefault(pad.inputs[0].name, []).append(pad.name)
        placement.formats[pad.name] = formats.pop()
        placement.moved_before_pad[name] = pad.inputs[0].name
    # Residual Add: quantize the skip input so the Add fuses into the Conv on the other branch.
    for node in graph.nodes:
        if node.op != "Add" or len(node.inputs) != 2 or any(is_constant(t) for t in node.inputs):
            continue
        fmt = plan.precision_of(node.name)
        if fmt not in QUANTIZED_PRECISIONS:
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
        placement.formats[node.name] = fmt
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
    proto: onnx.ModelProto, plan: PrecisionPlan | None = None, *, quantize_attention: bool = False
) -> QdqPlacement:
    """Where Q/DQ pairs go in an ONNX ModelProto under ``plan`` (all quantizable nodes INT8 by default)."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(prepare_model(proto))
    graph.toposort()
    return plan_placement(graph, plan, quantize_attention=quantize_attention)


def activation_tensors(proto: onnx.ModelProto, plan: PrecisionPlan | None = None) -> list[str]:
    """Names of the activation tensors that need a scale under ``plan`` (all quantizable nodes INT8 by default)."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(prepare_model(proto))
    graph.toposort()
    placement = plan_placement(graph, plan)
    names = list(placement.activations)
    # A Pad's output too: read in two formats (a format search), its Q/DQ pairs stay behind the Pad.
    names.extend(t for t in placement.moved_before_pad if t not in names)
    # Both inputs of an attention MatMul (two activations): FP8 quantizes them (see the module's rules).
    for node in graph.nodes:
        if node.op == "MatMul" and len(node.inputs) >= 2:
            operands = [t for t in node.inputs[:2] if t is not None and t.name and not is_constant(t)]
            if len(operands) == 2:
                names.extend(t.name for t in operands if t.name not in names)
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


def qdq_formats(proto: onnx.ModelProto) -> set[str]:
    """The quantized formats of a model's QuantizeLinear nodes ("int8", "uint8", "fp8", ...), from their zero points.

    A QuantizeLinear without a zero point quantizes to uint8 (the ONNX default)."""
    from onnx import TensorProto

    names = {
        TensorProto.INT8: "int8",
        TensorProto.UINT8: "uint8",
        TensorProto.FLOAT8E4M3FN: "fp8",
        TensorProto.FLOAT8E5M2: "fp8-e5m2",
        TensorProto.INT4: "int4",
        TensorProto.UINT4: "uint4",
    }
    types = {init.name: init.data_type for init in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.output:
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    found: set[str] = set()
    for node in proto.graph.node:
        if node.op_type != "QuantizeLinear":
            continue
        if len(node.input) < 3 or not node.input[2]:
            found.add("uint8")
            continue
        found.add(names.get(types.get(node.input[2], -1), "unknown"))
    return found


FP8_CONV_MIN_CHANNELS = 16  # TensorRT's FP8 convolution kernels want more than this many channels in and out
FP8_CONV_MAX_FILTER = 32  # and at most this many filter taps (ModelOpt's FP8 mode applies both rules)


def fp8_conv_exclusions(proto: onnx.ModelProto) -> dict[str, str]:
    """Conv nodes TensorRT's FP8 kernels do not serve well, with the reason: at most 16 input or output channels per
    group (the stem, depthwise convolutions) or a filter of more than 32 taps. ModelOpt's ONNX FP8 mode leaves these
    in higher precision; TensorRT-RTX 1.7 still builds them in FP8 (measured), so the workbench's FP8 plan keeps them
    unless a plan asks otherwise, e.g. ``plan.with_overrides(dict.fromkeys(fp8_conv_exclusions(m), "fp32"))``."""
    from onnx import numpy_helper

    shapes = {init.name: tuple(init.dims) for init in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.output:
            for attribute in node.attribute:
                if attribute.name == "value":
                    shapes[node.output[0]] = tuple(numpy_helper.to_array(attribute.t).shape)
    excluded: dict[str, str] = {}
    for node in proto.graph.node:
        if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in shapes:
            continue
        weight = shapes[node.input[1]]
        if len(weight) < 3:
            continue
        out_channels, in_channels = int(weight[0]), int(weight[1])
        taps = int(np.prod(weight[2:]))
        if out_channels <= FP8_CONV_MIN_CHANNELS or in_channels <= FP8_CONV_MIN_CHANNELS:
            excluded[node.name] = (
                f"{in_channels} input / {out_channels} output channels per group "
                f"(FP8 kernels want more than {FP8_CONV_MIN_CHANNELS})"
            )
        elif taps > FP8_CONV_MAX_FILTER:
            excluded[node.name] = f"a {taps}-tap filter (FP8 kernels take at most {FP8_CONV_MAX_FILTER})"
    return excluded


FP8_STEM_MAX_SHARE = 0.05  # the stem kept out of FP8 is at most this share of the Conv/GEMM layers


def fp8_stem_layers(
    proto: onnx.ModelProto, max_share: float = FP8_STEM_MAX_SHARE, *, prepared: bool = False
) -> dict[str, str]:
    """The network's stem for FP8: the leading Conv/GEMM layers, in topological order, that TensorRT's FP8 conv rules
    flag (:func:`fp8_conv_exclusions`: few channels per group, e.g. the convolution reading the image and the
    depthwise one after it), up to the first layer they do not flag, and at most ``max_share`` of all Conv/GEMM
    layers (none on a model of fewer than 20). FP8 rounding noise (3 mantissa bits, about 3.6 % RMS of every value)
    added there is not averaged by many inputs per output and travels through the whole network: measured on
    EfficientNet-Lite0, keeping its stem Conv and first depthwise Conv (2 of 50) out of FP8 lifts the all-FP8 logits'
    SQNR from 8.3 to 12.8 dB; keeping every flagged Conv out (ModelOpt's rule, 19 of 50) costs the FP8 layer share.
    ``prepared=True``: ``proto`` already went through :func:`prepare_model`."""
    import onnx_graphsurgeon as gs

    model = proto if prepared else prepare_model(proto)
    flagged = fp8_conv_exclusions(model)
    graph = gs.import_onnx(model)
    graph.toposort()
    layers = [n.name for n in graph.nodes if n.op in QUANTIZABLE_OPS]
    budget = int(len(layers) * max_share)
    stem: dict[str, str] = {}
    for name in layers:
        if name not in flagged or len(stem) >= budget:
            break
        stem[name] = f"FP8 stem ({flagged[name]})"
    return stem
