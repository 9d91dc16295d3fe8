"""Where Q/DQ pairs go (TensorRT's explicit-quantization rules) and the onnx-graphsurgeon rewrite that puts them there.

Rules (TensorRT 11 explicit quantization guide; ModelOpt's placement as the reference):

* symmetric int8, zero point 0 (a constant initializer), scale = amax / 127 > 0;
* per-tensor scales for activations, per-channel scales for weights (axis 0 for Conv and Gemm(transB=1),
  axis 1 for ConvTranspose, MatMul and Gemm(transB=0));
* Q/DQ on the *inputs* of Conv, ConvTranspose, Gemm and MatMul (outputs are left to TensorRT's fusions);
* the skip input of a residual Add fed by a Conv, so the Add fuses into that Conv's epilogue;
* quantized tensors meeting at a Concat share one scale (TensorRT moves Q/DQ through Concat);
* excluded by default: the attention core (MatMul with two activation inputs) and LayerNorm (never an input here).

A :class:`~workbench.precision.PrecisionPlan` picks nodes: a quantizable node is INT8 when the plan says ``int8``;
``fp16`` / ``fp32`` keep it out of INT8 (FP16 nodes are then cast by :mod:`workbench.autocast`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from workbench.calib.methods import scale_from_amax
from workbench.errors import WorkbenchError
from workbench.precision import PrecisionPlan

QUANTIZABLE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# Ops TensorRT fuses after a Conv (so a residual Add behind them still joins the Conv's epilogue).
EPILOGUE_OPS = frozenset({"BatchNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Mul"})
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
    Node names are assigned deterministically (``op_index``) so precision plans can refer to them.
    """
    import onnx
    from onnx import numpy_helper, version_converter

    model = copy.deepcopy(proto)
    graph = model.graph
    constant_nodes = [n for n in graph.node if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"]
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
            raise WorkbenchError(f"cannot upgrade the model from opset {opset} to {MIN_OPSET} for per-channel Q/DQ ({error}).",
                                 expected="an ONNX model at opset >= 13") from error
    # after conversion: the converter may add unnamed nodes
    used: set[str] = {n.name for n in model.graph.node if n.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{index}"
            while candidate in used:
                candidate += "_"
            node.name = candidate
            used.add(candidate)
    del numpy_helper, onnx
    return model


def _is_constant(tensor: Any) -> bool:
    import onnx_graphsurgeon as gs

    return isinstance(tensor, gs.Constant)


def _weight_axis(node: Any, weight_index: int, weight: Any) -> int:
    if node.op == "ConvTranspose":
        return 1
    if node.op == "Conv":
        return 0
    if node.op == "Gemm":
        trans = int(node.attrs.get("transB", 0)) if weight_index == 1 else int(node.attrs.get("transA", 0))
        return 0 if trans else 1
    return len(weight.shape) - 1  # MatMul B [.., K, N]: per output column


def _producer(tensor: Any) -> Any | None:
    return tensor.inputs[0] if getattr(tensor, "inputs", None) else None


def _conv_behind(tensor: Any, int8_nodes: set[str], depth: int = 4) -> Any | None:
    """The INT8 Conv that produces ``tensor`` directly or through a short pointwise epilogue, if any."""
    node = _producer(tensor)
    while node is not None and depth > 0:
        if node.op in ("Conv", "ConvTranspose"):
            return node if node.name in int8_nodes else None
        if node.op not in EPILOGUE_OPS or not node.inputs:
            return None
        node = _producer(node.inputs[0])
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
        variable_inputs = [t for t in node.inputs[:2] if t is not None and t.name and not _is_constant(t)]
        if node.op == "MatMul" and len(variable_inputs) == 2 and not (quantize_attention and node.name in plan.overrides):
            placement.excluded[node.name] = "attention core (MatMul of two activations)"
            continue
        if not node.inputs or node.inputs[0] is None:
            continue
        int8.add(node.name)
        placement.int8_nodes.append(node.name)
        for index, tensor in enumerate(node.inputs[:2]):
            if tensor is None or not tensor.name:
                continue
            if _is_constant(tensor):
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
        pad = _producer(tensor) if tensor is not None else None
        if pad is None or pad.op != "Pad" or pad.attrs.get("mode", "constant") not in ("constant", b"constant"):
            continue
        value = pad.inputs[2] if len(pad.inputs) > 2 and pad.inputs[2] is not None and pad.inputs[2].name else None
        if value is not None and (not _is_constant(value) or np.any(value.values != 0)):
            continue
        if _is_constant(pad.inputs[0]):
            continue
        consumers = placement.activations.pop(name)
        placement.activations.setdefault(pad.inputs[0].name, []).append(pad.name)
        placement.moved_before_pad[name] = pad.inputs[0].name
        del consumers
    # Residual Add: quantize the skip input so the Add fuses into the Conv on the other branch.
    for node in graph.nodes:
        if node.op != "Add" or len(node.inputs) != 2 or any(_is_constant(t) for t in node.inputs):
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
        if node.op == "Add" and len(node.inputs) == 2 and not any(_is_constant(t) for t in node.inputs):
            if any(_conv_behind(t, all_int8) for t in node.inputs):
                names.extend(t.name for t in node.inputs if t.name not in names)
    return names


def _qdq_pair(graph: Any, source: Any, scale: np.ndarray, axis: int | None, base: str) -> Any:
    import onnx_graphsurgeon as gs

    zero = np.zeros(scale.shape, dtype=np.int8)
    scale_const = gs.Constant(f"{base}_scale", np.asarray(scale, dtype=np.float32))
    zero_const = gs.Constant(f"{base}_zero_point", zero)
    attrs = {"axis": int(axis)} if axis is not None else {}
    quantized = gs.Variable(f"{base}_QuantizeLinear_Output", dtype=np.int8, shape=source.shape)
    dequantized = gs.Variable(f"{base}_DequantizeLinear_Output", dtype=np.float32, shape=source.shape)
    graph.nodes.append(gs.Node("QuantizeLinear", f"{base}_QuantizeLinear", attrs, [source, scale_const, zero_const], [quantized]))
    graph.nodes.append(gs.Node("DequantizeLinear", f"{base}_DequantizeLinear", attrs, [quantized, scale_const, zero_const], [dequantized]))
    return dequantized


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


@dataclass
class QdqModel:
    """A Q/DQ model and how it was made."""

    proto: Any = field(repr=False)
    placement: QdqPlacement
    plan: PrecisionPlan
    scales: dict[str, float]  # activation tensor -> scale
    fp16_nodes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def save(self, path: Any) -> Any:
        import onnx

        from workbench._io import atomic_path

        with atomic_path(path) as tmp:
            onnx.save(self.proto, str(tmp))
        return path

    def counts(self) -> dict[str, int]:
        ops: dict[str, int] = {}
        for node in self.proto.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        return ops

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.plan.to_json(), "placement": self.placement.to_json(), "scales": self.scales,
                "fp16_nodes": self.fp16_nodes, "notes": self.notes}


def insert_qdq(proto: Any, amax: Mapping[str, float], plan: PrecisionPlan | None = None, *,
               quantize_attention: bool = False, prepared: bool = False) -> QdqModel:
    """Return a new model with Q/DQ pairs per the TensorRT rules; ``amax`` maps activation tensors to ranges.

    Weights get per-channel scales from their own values (float W -> Q -> DQ, quantized by TensorRT at build).
    FP16 entries of the plan are realised afterwards with :func:`workbench.autocast.apply_precision_plan`.
    ``prepared=True`` says ``proto`` already went through :func:`prepare_model` (it is not modified either way).
    """
    import onnx_graphsurgeon as gs

    plan = plan or PrecisionPlan(default="int8")
    base = proto if prepared else prepare_model(proto)
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in base.graph.node):
        raise WorkbenchError("the model already has Q/DQ nodes.", expected="an FP32 model (calibrate before quantizing, not after)")
    graph = gs.import_onnx(base)
    graph.toposort()
    placement = plan_placement(graph, plan, quantize_attention=quantize_attention)
    missing = [name for name in placement.activations if name not in amax]
    if missing:
        raise WorkbenchError(f"no calibrated range for {len(missing)} tensor(s) that need a scale, e.g. {missing[:3]}.",
                             expected="ranges from the same model (re-run calibration or use its cache)")
    unified = shared_amax(placement, amax)
    tensors = graph.tensors()
    nodes_by_name = {n.name: n for n in graph.nodes}
    scales: dict[str, float] = {}
    for name, consumers in placement.activations.items():
        scale = scale_from_amax(unified[name])
        scales[name] = float(scale)
        dq = _qdq_pair(graph, tensors[name], scale, None, name)
        for consumer in set(consumers):
            node = nodes_by_name[consumer]
            node.inputs = [dq if (t is not None and t.name == name) else t for t in node.inputs]
    for name, quant in placement.weights.items():
        weight = tensors[name]
        from workbench.calib.methods import per_channel_amax

        scale = scale_from_amax(per_channel_amax(weight.values, quant.axis))
        dq = _qdq_pair(graph, weight, scale, quant.axis, name)
        for consumer in set(quant.consumers):
            node = nodes_by_name[consumer]
            node.inputs = [dq if (t is not None and t.name == name) else t for t in node.inputs]
    graph.cleanup().toposort()
    import onnx_graphsurgeon

    out = onnx_graphsurgeon.export_onnx(graph)
    out.ir_version = base.ir_version
    del out.opset_import[:]
    out.opset_import.extend(base.opset_import)
    result = QdqModel(out, placement, plan, scales)
    fp16 = [name for name, p in plan.overrides.items() if p == "fp16"] + ([] if plan.default != "fp16" else ["*"])
    if fp16:
        result = _apply_fp16(result)
    return result


def _apply_fp16(result: QdqModel) -> QdqModel:
    """Cast the plan's FP16 nodes with the fusion engineer's AutoCast pass (one cast inserter in the project)."""
    import tempfile
    from pathlib import Path

    import onnx

    from workbench.autocast import apply_precision_plan
    from workbench.model import load_onnx

    # apply_precision_plan refuses 'int8' entries, which Q/DQ already realised: hand it only the FP16 part.
    fp16_plan = PrecisionPlan(default="fp16" if result.plan.default == "fp16" else "fp32",
                              overrides={k: v for k, v in result.plan.overrides.items() if v == "fp16"})
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "qdq.onnx"
        onnx.save(result.proto, str(path))
        casted = apply_precision_plan(load_onnx(path, check=False), fp16_plan)
    result.proto = casted.proto
    result.fp16_nodes = list(casted.fp16_nodes)
    if casted.kept_fp32:
        result.notes.append(f"{len(casted.kept_fp32)} node(s) planned FP16 stayed FP32 (AutoCast rules): "
                            + ", ".join(f"{k} ({v})" for k, v in list(casted.kept_fp32.items())[:5]))
    return result
