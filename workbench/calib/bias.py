"""Bias correction: fold the mean output shift INT8 introduces back into the bias of Conv / Gemm / MatMul outputs.

Quantization noise is not zero-mean per channel (weight rounding is fixed, clipping is one-sided), so an INT8 layer's
output drifts from the FP32 one by a per-channel mean. Measured on calibration data (FP32 model and Q/DQ model run
side by side, ORT with optimizations off), that mean is added to the layer's bias: the Conv/Gemm bias input (created
when absent) or, for a MatMul, the constant of the bias Add that follows it. Nodes are corrected one at a time in
topological order, each measured with every node above it already corrected (empirical bias correction, as in
AIMET): correcting all at once double-counts the shift a layer inherits from above and, measured on ocr-cls,
made the model worse. One ORT session per corrected node. The bias stays in float: TensorRT adds it in the
kernel's epilogue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.artifact import Artifact
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import onnx

CORRECTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass(frozen=True)
class BiasCorrection(Artifact):
    """The corrected Q/DQ model and, per corrected node, the RMS of the shift folded into its bias."""

    corrected: dict[str, float]
    skipped: dict[str, str]  # node -> why it was not corrected
    num_samples: int
    proto: Any = field(default=None, repr=False, compare=False, metadata={"json": False})


def _consumers(proto: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    result: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            result.setdefault(name, []).append(node)
    return result


def _bias_target(
    node: onnx.NodeProto,
    proto: onnx.ModelProto,
    inits: Mapping[str, onnx.TensorProto],
    consumers: Mapping[str, list[onnx.NodeProto]],
) -> tuple:
    """(kind, initializer name or None, channel axis of the output) for one node, or (None, reason, 0)."""
    from onnx import numpy_helper

    if node.op_type in ("Conv", "ConvTranspose"):
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if bias is not None and bias not in inits:
            return None, "bias is not a constant", 0
        return "input", bias, 1
    if node.op_type == "Gemm":
        bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if bias is not None and (bias not in inits or numpy_helper.to_array(inits[bias]).ndim > 1):
            return None, "bias is not a constant vector", 0
        return "input", bias, -1
    # MatMul: the bias Add right after it
    users = consumers.get(node.output[0], [])
    if len(users) == 1 and users[0].op_type == "Add":
        other = [name for name in users[0].input if name != node.output[0]]
        if len(other) == 1 and other[0] in inits and numpy_helper.to_array(inits[other[0]]).ndim == 1:
            return "add", other[0], -1
    return None, "no constant bias to fold into", 0


def _run(proto: onnx.ModelProto, outputs: list[str], feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    from workbench.ort import cpu_session

    session = cpu_session(proto, extra_outputs=outputs, what="a model for bias correction")
    return [dict(zip(outputs, session.run(outputs, feed))) for feed in feeds]


def _channel_mean(values: np.ndarray, axis: int) -> np.ndarray:
    axis = axis % values.ndim
    reduce = tuple(i for i in range(values.ndim) if i != axis)
    return values.astype(np.float64).mean(axis=reduce)


def bias_correct(
    fp32_proto: Any,
    qdq_proto: Any,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    nodes: Iterable[str] | None = None,
) -> BiasCorrection:
    """Correct the biases of the quantized Conv/Gemm/MatMul nodes of ``qdq_proto`` (made from ``fp32_proto``).

    ``nodes`` limits the correction (default: every such node that reads a DequantizeLinear output).
    """
    import onnx
    from onnx import numpy_helper

    feeds = list(feeds)
    if not feeds:
        raise WorkbenchError("no data for bias correction.", expected="calibration batches")
    proto = onnx.ModelProto()
    proto.CopyFrom(getattr(qdq_proto, "proto", qdq_proto))
    fp32_proto = getattr(fp32_proto, "proto", fp32_proto)
    dq_outputs = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    fp32_outputs = {o for n in fp32_proto.graph.node for o in n.output}
    wanted = set(nodes) if nodes is not None else None
    targets = [
        n
        for n in proto.graph.node
        if n.op_type in CORRECTED_OPS
        and any(i in dq_outputs for i in n.input)
        and n.output[0] in fp32_outputs
        and (wanted is None or n.name in wanted)
    ]
    inits = {i.name: i for i in proto.graph.initializer}
    consumers = _consumers(proto)
    skipped: dict[str, str] = {}
    plan: list[tuple[Any, str, str | None, int]] = []
    for node in targets:
        kind, bias, axis = _bias_target(node, proto, inits, consumers)
        if kind is None:
            skipped[node.name] = str(bias)
            continue
        plan.append((node, kind, bias, axis))
    # every corrected node gets its own bias initializer (biases can be shared, e.g. one zero constant)
    owned: list[tuple[Any, str, int]] = []
    for node, kind, bias, axis in plan:
        own = f"{node.name}_bias_corrected"
        if bias is not None:
            values = numpy_helper.to_array(inits[bias]).astype(np.float32)
        else:
            values = None  # sized from the first measured shift
        if kind == "input":
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = own
        else:
            users = consumers[node.output[0]]
            users[0].input[list(users[0].input).index(bias)] = own
        if values is not None:
            proto.graph.initializer.append(numpy_helper.from_array(values, own))
        owned.append((node, own, axis))
    # measure where the bias lands: the Conv/Gemm output, or the output of the MatMul's bias Add
    measured = {
        node.name: (consumers[node.output[0]][0].output[0] if kind == "add" else node.output[0])
        for node, kind, _, _ in plan
    }
    outputs = [measured[node.name] for node, _, _ in owned]
    reference = _run(fp32_proto, outputs, feeds) if outputs else []
    have = {i.name for i in proto.graph.initializer}
    for node, own, axis in owned:  # nodes that had no bias: a zero bias of the output's channel count
        if own not in have:
            channels = reference[0][measured[node.name]].shape[axis]
            proto.graph.initializer.append(numpy_helper.from_array(np.zeros(channels, np.float32), own))
    inits = {i.name: i for i in proto.graph.initializer}
    shifts: dict[str, np.ndarray] = {}
    # sequential in topological order: each node's shift is measured with every node above it already corrected
    for node, own, axis in owned if outputs else []:
        name = measured[node.name]
        test = _run(proto, [name], feeds)
        delta = np.mean([_channel_mean(r[name] - t[name], axis) for r, t in zip(reference, test)], axis=0)
        tensor = inits[own]
        values = numpy_helper.to_array(tensor).astype(np.float64)
        if values.shape != delta.shape:
            skipped[node.name] = f"bias shape {values.shape} does not match the channel count {delta.shape}"
            continue
        shifts[node.name] = delta
        tensor.CopyFrom(numpy_helper.from_array((values + delta).astype(np.float32), own))
    corrected = {
        name: float(np.sqrt(np.mean(np.square(shift)))) for name, shift in shifts.items() if name not in skipped
    }
    samples = sum(int(next(iter(f.values())).shape[0]) for f in feeds)
    return BiasCorrection(corrected, skipped, samples, proto=proto)
