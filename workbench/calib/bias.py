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


def _dequantized_sources(proto: onnx.ModelProto) -> dict[str, str]:
    """DequantizeLinear output -> the float tensor its QuantizeLinear reads (an activation or a weight)."""
    quantize_inputs = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "QuantizeLinear"}
    return {
        n.output[0]: quantize_inputs[n.input[0]]
        for n in proto.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in quantize_inputs
    }


def bias_correct_local(
    qdq_proto: Any,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    nodes: Iterable[str] | None = None,
    passes: int = 2,
) -> BiasCorrection:
    """Bias correction of every quantized Conv/Gemm/MatMul at once, from each layer's *own* mean output error.

    Each quantized node gets a float twin in a measuring copy of the model: same inputs before their Q/DQ pairs
    (float activation, float weight), same original bias. The per-channel mean of ``twin - quantized`` on the
    calibration data is the shift this layer's quantization adds; it is folded into the layer's bias. Because each
    shift is local (measured on the quantized model's own input), correcting all layers together does not count an
    upstream layer's shift twice, unlike all-at-once correction against the FP32 model. Each further pass measures
    what remains with the corrections in place (the inputs changed), so ``passes`` runs of the model replace the one
    ORT session per node of :func:`bias_correct`.
    """
    import onnx
    from onnx import numpy_helper

    feeds = list(feeds)
    if not feeds:
        raise WorkbenchError("no data for bias correction.", expected="calibration batches")
    if passes < 1:
        raise WorkbenchError(f"passes={passes} cannot correct anything.", expected="passes >= 1")
    proto = onnx.ModelProto()
    proto.CopyFrom(getattr(qdq_proto, "proto", qdq_proto))
    sources = _dequantized_sources(proto)
    wanted = set(nodes) if nodes is not None else None
    targets = [
        n
        for n in proto.graph.node
        if n.op_type in CORRECTED_OPS
        and any(i in sources for i in n.input[:2])
        and (wanted is None or n.name in wanted)
    ]
    inits = {i.name: i for i in proto.graph.initializer}
    consumers = _consumers(proto)
    skipped: dict[str, str] = {}
    twins: list[onnx.NodeProto] = []
    plan: list[tuple[onnx.NodeProto, str, str | None, int, str]] = []  # node, kind, bias, axis, twin output
    for node in targets:
        kind, bias, axis = _bias_target(node, proto, inits, consumers)
        if kind is None:
            skipped[node.name] = str(bias)
            continue
        twin = onnx.NodeProto()
        twin.CopyFrom(node)
        twin.name = f"{node.name}_float_twin"
        for index, name in enumerate(twin.input[:2]):
            twin.input[index] = sources.get(name, name)
        del twin.output[:]
        twin.output.append(f"{node.output[0]}_float_twin")
        twins.append(twin)
        plan.append((node, kind, bias, axis, twin.output[0]))
    original = {
        node.name: (numpy_helper.to_array(inits[bias]).astype(np.float64) if bias is not None else None)
        for node, _, bias, _, _ in plan
    }
    owned = {node.name: f"{node.name}_bias_corrected" for node, *_ in plan}
    outputs = [name for node, _, _, _, twin in plan for name in (node.output[0], twin)]
    corrections: dict[str, np.ndarray] = {}
    for step in range(passes if plan else 0):
        if step == 1:  # from the second pass on, every corrected node reads its own bias initializer
            _point_to_own_biases(plan, consumers, owned)
        if step >= 1:
            _set_biases(proto, plan, original, corrections, owned)
        measuring = onnx.ModelProto()
        measuring.CopyFrom(proto)
        measuring.graph.node.extend(twins)
        results = _run(measuring, outputs, feeds)
        for node, kind, _, axis, twin_output in plan:
            delta = np.mean([_channel_mean(r[twin_output] - r[node.output[0]], axis) for r in results], axis=0)
            # a Conv/Gemm output already holds the correction in its bias; a MatMul output is before the bias Add
            previous = corrections.get(node.name, 0.0) if kind == "input" else 0.0
            corrections[node.name] = previous + delta
    if passes == 1 and plan:
        _point_to_own_biases(plan, consumers, owned)
    _set_biases(proto, plan, original, corrections, owned, skipped)
    corrected = {
        node.name: float(np.sqrt(np.mean(np.square(corrections[node.name]))))
        for node, *_ in plan
        if node.name in corrections and node.name not in skipped
    }
    samples = sum(int(next(iter(f.values())).shape[0]) for f in feeds)
    return BiasCorrection(corrected, skipped, samples, proto=proto)


def _point_to_own_biases(
    plan: list[tuple[onnx.NodeProto, str, str | None, int, str]],
    consumers: Mapping[str, list[onnx.NodeProto]],
    owned: Mapping[str, str],
) -> None:
    """Each corrected node (or its MatMul's bias Add) reads its own bias initializer (biases can be shared)."""
    for node, kind, bias, _, _ in plan:
        if kind == "input":
            while len(node.input) < 3:
                node.input.append("")
            node.input[2] = owned[node.name]
        else:
            users = consumers[node.output[0]]
            users[0].input[list(users[0].input).index(bias)] = owned[node.name]  # type: ignore[arg-type]


def _set_biases(
    proto: onnx.ModelProto,
    plan: list[tuple[onnx.NodeProto, str, str | None, int, str]],
    original: Mapping[str, np.ndarray | None],
    corrections: Mapping[str, np.ndarray],
    owned: Mapping[str, str],
    skipped: dict[str, str] | None = None,
) -> None:
    """Write each corrected node's own bias initializer: its original bias (zeros when it had none) + correction."""
    from onnx import numpy_helper

    present = {i.name: index for index, i in enumerate(proto.graph.initializer)}
    for node, _, _, _, _ in plan:
        correction = corrections.get(node.name)
        base = original[node.name]
        if base is None and correction is None:
            continue  # a bias-less node before its first measurement: its own zero bias comes with the correction
        values = (np.zeros_like(correction) if base is None else base) + (0.0 if correction is None else correction)
        if base is not None and correction is not None and base.shape != np.shape(correction):
            if skipped is not None:
                skipped[node.name] = f"bias shape {base.shape} does not match the channel count {np.shape(correction)}"
            values = base
        tensor = numpy_helper.from_array(np.asarray(values, dtype=np.float32), owned[node.name])
        if tensor.name in present:
            proto.graph.initializer[present[tensor.name]].CopyFrom(tensor)
        else:
            present[tensor.name] = len(proto.graph.initializer)
            proto.graph.initializer.append(tensor)
