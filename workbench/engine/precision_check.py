"""Requested vs actual precision: did the engine run each ONNX node at the precision the build asked for?

TensorRT users keep meeting engines that silently run wider than asked (a W4A16 build running FP32, ``fp16=True``
giving 0 % Half). Every build here compares, node by node, the **requested** precision with the **actual** precision
of the engine layer that runs it (from the builder's own layer records), and lists each mismatch with its reason
where one is known.

Requested (from the graph that was built and the plan):

* a Conv / ConvTranspose / Gemm / MatMul reading DequantizeLinear outputs requests their format (INT8 or FP8, from
  the zero point's type); a plan override names a node's precision explicitly; otherwise the plan's default when it is
  FP16 or FP32 (a blanket INT8/FP8 default covers only the nodes calibration quantized);
* any other compute node requests FP16 when the plan puts it in FP16 (AutoCast's casts), and is not checked otherwise.

Actual: for a math node, the convolution / GEMM layer that computes it (INT8 or FP8 when that kernel reads 8-bit data,
else the layer's precision); a math node asked in 8 bits that no such layer computes ran inside a generated kernel, in
the widest arithmetic type that kernel reads unless it reads the asked format; and a math node that reads a float weight
directly (no DequantizeLinear in front of it) computes in that float type whatever its layer reads or writes around it:
a strongly typed build never quantizes a weight itself. For other nodes, the layers that hold them (a node fused into
a narrower kernel is not a mismatch). Folded nodes are not checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench.artifact import Artifact

if TYPE_CHECKING:
    import onnx
from workbench.engine.layermap import BOOKKEEPING_OPS, MATH_LAYER_TYPES, LayerEntry, LayerMap
from workbench.precision import PrecisionPlan

MATH_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
QUANTIZED = frozenset({"int8", "fp8"})
# ONNX element types of a DequantizeLinear's zero point -> the format it dequantizes
_ZERO_POINT_FORMAT = {3: "int8", 2: "uint8", 17: "fp8", 19: "fp8-e5m2", 22: "int4", 21: "uint4"}


@dataclass(frozen=True)
class PrecisionMismatch(Artifact):
    """One node that the engine runs at another precision than requested, and why (when known)."""

    node: str
    op: str
    requested: str
    actual: str
    layer: str  # the engine layer that runs it
    layer_type: str
    reason: str


@dataclass(frozen=True)
class PrecisionCheck(Artifact):
    """Every node compared and the mismatches found (an empty tuple: the engine runs what was asked)."""

    checked: int
    requested: dict[str, int]  # precision -> nodes that requested it
    mismatches: tuple[PrecisionMismatch, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        asked = ", ".join(f"{k} {v}" for k, v in sorted(self.requested.items()))
        return f"requested vs actual precision: {self.checked} node(s) checked ({asked}); " + (
            "all run as requested" if self.ok else f"{len(self.mismatches)} mismatch(es)"
        )

    def lines(self, limit: int = 10) -> list[str]:
        return [
            f"{m.node} ({m.op}): requested {m.requested}, runs {m.actual} in {m.layer or 'no layer'}"
            f"{f' ({m.layer_type})' if m.layer_type else ''}: {m.reason}"
            for m in self.mismatches[:limit]
        ]

    # JSON in: Artifact.from_json checks every field against its type (a damaged record is a WorkbenchError)


def _graph_formats(proto: onnx.ModelProto) -> dict[str, str]:
    """ONNX node -> the reduced format its inputs arrive in: a DequantizeLinear's format, or fp16 from a Cast."""
    types = {init.name: init.data_type for init in proto.graph.initializer}
    produced: dict[str, str] = {}
    for node in proto.graph.node:
        if node.op_type == "DequantizeLinear" and node.output:
            zero = node.input[2] if len(node.input) > 2 and node.input[2] else ""
            produced[node.output[0]] = _ZERO_POINT_FORMAT.get(types.get(zero, 2), "uint8") if zero else "uint8"
        elif node.op_type == "Cast" and node.output:
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            if to == 10:  # FLOAT16
                produced[node.output[0]] = "fp16"
    formats: dict[str, str] = {}
    for node in proto.graph.node:
        found = [produced[name] for name in node.input if name in produced]
        quantized = [f for f in found if f in QUANTIZED]
        if quantized:
            formats[node.name] = quantized[0]
        elif found:
            formats[node.name] = found[0]
    return formats


def _actual(layers: list[LayerEntry], math: bool, want: str = "") -> tuple[str, LayerEntry | None]:
    """The precision a node runs at and the layer that decides it."""
    if math:
        kernel = next((layer for layer in layers if layer.layer_type.lower() in MATH_LAYER_TYPES), None)
        if kernel is not None:
            return ("int8" if kernel.is_int8_kernel else "fp8" if kernel.is_fp8_kernel else kernel.precision), kernel
        if want in QUANTIZED:
            # computed inside a generated (pointwise / reduction) kernel: a layer's own precision is its narrowest
            # tensor, so a kernel that multiplies in float and quantizes its output for the next node reads "int8";
            # what it computes in is what it reads
            arithmetic = {layer.name: [t for t in layer.input_datatypes if t in _ARITHMETIC] for layer in layers}
            holders = [layer for layer in layers if arithmetic[layer.name]]
            narrow = next((layer for layer in holders if want in arithmetic[layer.name]), None)
            if narrow is not None:
                return want, narrow
            if holders:
                widest = max(holders, key=lambda layer: max(_rank(t) for t in arithmetic[layer.name]))
                return max(arithmetic[widest.name], key=_rank), widest
    typed = [layer for layer in layers if layer.precision != "none"]
    if not typed:
        return "none", layers[0] if layers else None
    return typed[0].precision, typed[0]


_FLOAT_TYPES = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp32"}  # ONNX FLOAT, FLOAT16, BFLOAT16, DOUBLE (runs FP32)
_ARITHMETIC = frozenset({"int4", "fp4", "int8", "fp8", "fp16", "bf16", "fp32"})  # not shapes, indices or masks


def _rank(precision: str) -> int:
    return {"int4": 0, "fp4": 0, "int8": 1, "fp8": 1, "fp16": 2, "bf16": 2, "fp32": 3}.get(precision, 3)


def check_precision(
    layer_map: LayerMap,
    built_proto: onnx.ModelProto,
    plan: PrecisionPlan,
    *,
    backend: str = "TensorRT",
    kept_fp32: Callable[[], Mapping[str, str]] | None = None,
) -> PrecisionCheck:
    """Compare each node's requested precision (``plan`` over the ``built_proto`` graph) with the engine's.

    ``kept_fp32``: called only when an FP16 request runs FP32, for AutoCast's reasons (node -> rule)."""
    ops = {node.name: node.op_type for node in built_proto.graph.node}
    constants = {init.name for init in built_proto.graph.initializer}
    float_constants = {  # initializers a node reads as they are stored (a quantized weight is read through its DQ)
        init.name: _FLOAT_TYPES[init.data_type]
        for init in built_proto.graph.initializer
        if init.data_type in _FLOAT_TYPES
    }
    inputs_of = {node.name: list(node.input) for node in built_proto.graph.node}
    graph_format = _graph_formats(built_proto)
    by_name = {layer.name: layer for layer in layer_map.layers}
    requested: dict[str, str] = {}
    for node in layer_map.nodes:
        op = ops.get(node.name, node.op_type)
        if op in BOOKKEEPING_OPS or op == "Constant":
            continue
        explicit = plan.overrides.get(node.name)
        fmt = graph_format.get(node.name)
        if op in MATH_OPS:
            want = explicit or (fmt if fmt in QUANTIZED else None)
            want = want or (plan.default if plan.default in ("fp16", "fp32") else None)
        else:
            want = "fp16" if (explicit or plan.default) == "fp16" else None
        if want is not None:
            requested[node.name] = want
    kept: Mapping[str, str] | None = None
    mismatches: list[PrecisionMismatch] = []
    checked = 0
    for node in layer_map.nodes:
        want = requested.get(node.name)
        if want is None or node.folded:
            continue
        op = ops.get(node.name, node.op_type)
        layers = [by_name[name] for name in node.engine_layers if name in by_name]
        actual, layer = _actual(layers, op in MATH_OPS, want)
        if actual == "none":
            continue
        operands = inputs_of.get(node.name, [])[:2]
        float_weights = [name for name in operands if name in float_constants]
        if want in QUANTIZED and op in MATH_OPS and float_weights and actual in QUANTIZED:
            # a strongly typed build never quantizes a weight itself: a product with a float weight is float math,
            # whatever 8-bit data the kernel reads or writes around it (TensorRT-RTX: a "CastMulFc" layer that casts
            # its INT8 input to float, or a generated kernel whose output is quantized for the next node)
            actual = float_constants[float_weights[0]]
        checked += 1
        if op in MATH_OPS:
            if actual == want:
                continue
        elif _rank(actual) <= _rank(want):  # fused into a kernel at least as narrow as asked
            continue
        fmt = graph_format.get(node.name)
        if want in QUANTIZED:
            two_activations = op == "MatMul" and not constants.intersection(operands)
            if fmt in QUANTIZED and fmt != want:
                reason = f"its inputs are quantized to {fmt} in the built graph, not {want}"
            elif fmt != want and two_activations:
                reason = "attention core (MatMul of two activations): the Q/DQ rules leave it out (calibrate --quantize-attention puts it in)"
            elif fmt != want:
                reason = f"the built graph has no {want.upper()} Q/DQ on its inputs (calibration left it out, or the plan kept it wider)"
            elif float_weights:
                reason = (
                    f"its constant operand {float_weights[0]!r} has no Q/DQ: {backend} computes it in "
                    f"{actual.upper()} with only its other input dequantized"
                )
            else:
                kind = layer.layer_type if layer is not None else "no"
                reason = (
                    f"no {want.upper()} kernel for this {op} in {backend}: it ran as a {kind} layer in {actual.upper()} "
                    "(its Q/DQ pair dequantizes in front of it)"
                )
        elif want == "fp16" and actual == "fp32":
            if kept is None:
                kept = dict(kept_fp32()) if kept_fp32 is not None else {}
            if node.name in kept:
                reason = f"AutoCast kept it FP32 ({kept[node.name]})"
            elif fmt != "fp16" and op in MATH_OPS:
                reason = "the built graph feeds it FP32 (no Cast to FP16 on its inputs)"
            else:
                others = [n for n in (layer.onnx_nodes if layer else ()) if n != node.name and n not in requested]
                reason = (
                    f"fused into {layer.name if layer else 'a layer'} with node(s) kept FP32 ({', '.join(others[:3])})"
                    if others
                    else f"{backend} chose an FP32 kernel (no FP16 kernel for this op and shape, or a fusion forced it)"
                )
        else:
            reason = f"fused into a {actual.upper()} layer" if layer is not None else "unknown"
        mismatches.append(
            PrecisionMismatch(
                node=node.name,
                op=op,
                requested=want,
                actual=actual,
                layer=layer.name if layer is not None else "",
                layer_type=layer.layer_type if layer is not None else "",
                reason=reason,
            )
        )
    counts: dict[str, int] = {}
    for want in requested.values():
        counts[want] = counts.get(want, 0) + 1
    return PrecisionCheck(checked=checked, requested=counts, mismatches=tuple(mismatches))
