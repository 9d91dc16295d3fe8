"""A read-only lint of Q/DQ (QuantizeLinear/DequantizeLinear) placement against TensorRT's explicit-quantization rules."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from workbench.clean.graph_utils import constant_values, import_graph
from workbench.clean.report import Finding
from workbench.errors import WorkbenchError
from workbench.model.graph import producer

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from workbench.model import OnnxModel

# TensorRT quantizes to signed INT8, FP8 (E4M3) and INT4; it has no unsigned 8-bit or 16-bit quantized types.
_SUPPORTED_QUANT_TYPES = ("int8", "float8_e4m3fn", "int4")


def _as_graph(model_or_graph: onnx.ModelProto | gs.Graph | OnnxModel | str | os.PathLike[str]) -> gs.Graph:
    import onnx
    import onnx_graphsurgeon as gs

    if isinstance(model_or_graph, gs.Graph):
        return model_or_graph
    if isinstance(model_or_graph, onnx.ModelProto):
        return import_graph(model_or_graph)
    if hasattr(model_or_graph, "proto"):  # workbench.model.OnnxModel
        return import_graph(model_or_graph.proto)
    if isinstance(model_or_graph, (str, os.PathLike)):
        from workbench.model import load_onnx

        return import_graph(load_onnx(model_or_graph).proto)
    raise WorkbenchError(
        f"lint_qdq got a {type(model_or_graph).__name__}.",
        expected="an onnx.ModelProto, an onnx_graphsurgeon Graph, an OnnxModel or a path to an .onnx file",
    )


def _quant_type(node: gs.Node) -> str | None:
    """Element type of the quantized side: the zero point's dtype, or output_dtype, or uint8 (ONNX default)."""
    import onnx

    if len(node.inputs) > 2 and not node.inputs[2].is_empty():
        dtype = node.inputs[2].dtype
        if dtype is None:
            return None
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(dtype) if isinstance(dtype, int) else dtype).name
        except TypeError:
            return str(dtype)
    if "output_dtype" in node.attrs and node.attrs["output_dtype"]:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["output_dtype"]))).name
    return "uint8" if node.op == "QuantizeLinear" else None


def lint_qdq(model_or_graph: onnx.ModelProto | gs.Graph | OnnxModel | str | os.PathLike[str]) -> list[Finding]:
    """Check every Q/DQ node against TensorRT's rules and return what breaks them; nothing is changed.

    Rules: ``qdq-scale-not-constant``, ``qdq-scale-not-positive``, ``qdq-zero-point-nonzero``,
    ``qdq-unsupported-type`` (errors: TensorRT rejects the network); ``qdq-per-channel-axis`` (error: the weight
    scale axis of a Conv must be its output-channel axis); ``q-without-dq`` (a Q whose output feeds something
    other than a DQ); ``qdq-scale-mismatch`` (a Q->DQ pair with different scales); ``qdq-blocks-pad-fusion``
    (Q/DQ between Pad and Conv stops TensorRT merging the Pad into the Conv, NVIDIA/TensorRT#2592).
    """
    graph = _as_graph(model_or_graph)
    findings: list[Finding] = []
    for node in graph.nodes:
        if node.op not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        name = node.name or node.outputs[0].name
        scale = node.inputs[1] if len(node.inputs) > 1 else None
        scale_values = constant_values(scale) if scale is not None else None
        if scale_values is None:
            findings.append(
                Finding(
                    "qdq-scale-not-constant",
                    name,
                    f"{node.op} scale must be a constant (initializer) for TensorRT",
                    "error",
                )
            )
        elif not np.all(np.isfinite(scale_values)) or np.any(scale_values <= 0):
            findings.append(Finding("qdq-scale-not-positive", name, f"{node.op} scale must be finite and > 0", "error"))
        if len(node.inputs) > 2 and not node.inputs[2].is_empty():
            zero_point = constant_values(node.inputs[2])
            if zero_point is None or np.any(zero_point.astype(np.float64) != 0):
                findings.append(
                    Finding(
                        "qdq-zero-point-nonzero",
                        name,
                        f"{node.op} zero point must be a constant 0 (TensorRT quantizes symmetrically)",
                        "error",
                    )
                )
        quant_type = _quant_type(node)
        if quant_type is not None and quant_type not in _SUPPORTED_QUANT_TYPES:
            findings.append(
                Finding(
                    "qdq-unsupported-type",
                    name,
                    f"{node.op} quantizes to {quant_type}; TensorRT supports {', '.join(_SUPPORTED_QUANT_TYPES)}",
                    "error",
                )
            )
        if node.op == "DequantizeLinear" and scale_values is not None and scale_values.size > 1:
            data = constant_values(node.inputs[0])
            axis = int(node.attrs.get("axis", 1))
            for consumer in node.outputs[0].outputs:
                if (
                    consumer.op in ("Conv", "ConvTranspose")
                    and len(consumer.inputs) > 1
                    and consumer.inputs[1] is node.outputs[0]
                ):
                    wanted = 0 if consumer.op == "Conv" else 1
                    rank = data.ndim if data is not None else None
                    actual = axis + rank if (rank is not None and axis < 0) else axis
                    if actual != wanted:
                        findings.append(
                            Finding(
                                "qdq-per-channel-axis",
                                name,
                                f"per-channel weight scale on axis {axis}; {consumer.op} weights need axis {wanted}",
                                "error",
                            )
                        )
                    elif data is not None and data.shape[wanted] != scale_values.size:
                        findings.append(
                            Finding(
                                "qdq-per-channel-axis",
                                name,
                                f"{scale_values.size} scales for {data.shape[wanted]} output channels",
                                "error",
                            )
                        )
        if node.op == "QuantizeLinear":
            out = node.outputs[0]
            others = [c for c in out.outputs if c.op != "DequantizeLinear"]
            if others:
                findings.append(
                    Finding(
                        "q-without-dq",
                        name,
                        f"quantized output feeds {', '.join(sorted({c.op for c in others}))} directly; TensorRT expects Q followed by DQ",
                    )
                )
            for dq in out.outputs:
                if dq.op != "DequantizeLinear" or scale_values is None:
                    continue
                dq_scale = constant_values(dq.inputs[1]) if len(dq.inputs) > 1 else None
                if dq_scale is not None and (
                    dq_scale.shape != scale_values.shape or not np.array_equal(dq_scale, scale_values)
                ):
                    findings.append(
                        Finding(
                            "qdq-scale-mismatch",
                            dq.name or dq.outputs[0].name,
                            "Q and DQ of one pair use different scales",
                        )
                    )
                padded = producer(node.inputs[0])
                if (
                    padded is not None
                    and padded.op == "Pad"
                    and any(c.op in ("Conv", "ConvTranspose") for c in dq.outputs[0].outputs)
                ):
                    findings.append(
                        Finding(
                            "qdq-blocks-pad-fusion",
                            name,
                            "Q/DQ between Pad and Conv blocks TensorRT's Pad+Conv fusion; quantize before the Pad instead",
                        )
                    )
    return findings


def count_qdq(model: onnx.ModelProto) -> int:
    return sum(1 for node in model.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear"))


__all__ = ["lint_qdq", "count_qdq"]
