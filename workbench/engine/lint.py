"""Engine linter: TREx's lint ideas on the layer records and layer map we have (no GPU, no profile needed).

Each finding names the engine layer, the ONNX nodes it executes, and a fix to try. Kinds:

* ``standalone-qdq``: a Quantize/Dequantize that did not fuse into an INT8 convolution/GEMM (its own kernel);
* ``type-reformat``: a layer TensorRT inserted that converts the data type (a Cast/Reformat between precisions);
* ``fp32-in-reduced``: a convolution/GEMM layer left in FP32 inside an FP16 or INT8 engine;
* ``unfused-elementwise``: an elementwise layer fed directly by another elementwise layer (a chain not fused);
* ``shape-copy``: shape arithmetic or copies that run as their own layers;
* ``precision-mismatch``: an ONNX node the engine runs at another precision than requested (the build's
  :class:`~workbench.engine.precision_check.PrecisionCheck`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.artifact import Artifact

if TYPE_CHECKING:
    import onnx
from workbench.engine.layermap import MATH_LAYER_TYPES, LayerMap
from workbench.engine.precision_check import PrecisionCheck
from workbench.engine.records import EngineLayers

ELEMENTWISE_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Clip", "LeakyRelu", "Pow",
     "Sqrt", "Exp", "Erf", "Neg", "Abs", "Max", "Min", "PRelu", "Elu", "Selu", "Softplus"}
)  # fmt: skip
SHAPE_LAYER_TYPES = frozenset({"shape_call", "shape", "copy", "slice", "gather", "concatenation", "shuffle"})
SEVERITY_RANK = {"warning": 2, "info": 1}


@dataclass(frozen=True)
class Finding(Artifact):
    kind: str
    severity: str  # "warning" | "info"
    layer: str
    onnx_nodes: tuple[str, ...]
    message: str
    fix: str


@dataclass(frozen=True)
class LintReport(Artifact):
    label: str
    findings: tuple[Finding, ...]

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for finding in self.findings:
            out[finding.kind] = out.get(finding.kind, 0) + 1
        return out

    def by_layer(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for finding in self.findings:
            out.setdefault(finding.layer, []).append(finding)
        return out

    def rows(self) -> list[dict[str, str]]:
        return [
            {
                "kind": f.kind,
                "severity": f.severity,
                "layer": f.layer,
                "ONNX nodes": ", ".join(f.onnx_nodes) or "-",
                "finding": f.message,
                "fix": f.fix,
            }
            for f in self.findings
        ]


def _dominant_precision(layer_map: LayerMap) -> str:
    counts: dict[str, int] = {}
    for layer in layer_map.layers:
        if layer.layer_type.lower() in MATH_LAYER_TYPES:
            key = "int8" if layer.is_int8_kernel else "fp8" if layer.is_fp8_kernel else layer.precision
            counts[key] = counts.get(key, 0) + 1
    if counts.get("int8"):
        return "int8"
    if counts.get("fp8"):
        return "fp8"
    if counts.get("fp16"):
        return "fp16"
    return "fp32"


def reduced_input_nodes(onnx_proto: onnx.ModelProto) -> dict[str, bool]:
    """ONNX node -> whether the built graph feeds it reduced-precision data: an input from a DequantizeLinear (INT8
    Q/DQ) or a Cast to FLOAT16/BFLOAT16 (AutoCast), or FP16 weights."""
    from workbench.model.graph import onnx_node_name

    graph = onnx_proto.graph
    half = {10, 16}  # TensorProto.FLOAT16, BFLOAT16
    reduced_tensors = {init.name for init in graph.initializer if init.data_type in half}
    for node in graph.node:
        if node.op_type == "DequantizeLinear" or (
            node.op_type == "Cast" and any(a.name == "to" and a.i in half for a in node.attribute)
        ):
            reduced_tensors.update(node.output)
    return {onnx_node_name(node): any(t in reduced_tensors for t in node.input) for node in graph.node}


def _why_fp32(nodes: tuple[str, ...], reduced: dict[str, bool] | None) -> tuple[str, str]:
    if reduced is None:
        return (
            "kept FP32 by the precision plan (an AutoCast rule or a fallback), or TensorRT found no faster "
            "reduced-precision kernel (the built ONNX is not known here, so which one is not said)",
            "if the plan keeps it, check its accuracy cost with `workbench diff`; otherwise try it in FP16.",
        )
    if not any(reduced.get(n, False) for n in nodes):
        return (
            "the precision plan keeps it FP32 (the built graph gives its nodes no Q/DQ or FP16 input: a fallback or an "
            "AutoCast rule)",
            "if `workbench diff` shows this layer is not sensitive, let the plan quantize it (remove the override "
            "or fallback) and rebuild.",
        )
    return (
        "its inputs are reduced precision in the built graph, yet TensorRT chose an FP32 kernel (no faster "
        "reduced-precision kernel for this shape, or a fusion that needs FP32)",
        "check the tensor shapes (channels a multiple of 8/16 for tensor cores) and the layers fused with it; a "
        "different fusion (`workbench clean`) may allow a reduced-precision kernel.",
    )


def lint(
    layer_map: LayerMap,
    engine_layers: EngineLayers | None = None,
    onnx_proto: onnx.ModelProto | None = None,
    precision_check: PrecisionCheck | None = None,
) -> LintReport:
    """Findings on one build (``engine_layers`` adds the tensor-level checks: type-converting reformats, chains;
    ``onnx_proto``, the built ONNX, says why a layer stayed FP32; ``precision_check``, the build's requested vs
    actual precision, lists every node that runs wider or otherwise than asked)."""
    reduced = reduced_input_nodes(onnx_proto) if onnx_proto is not None else None
    findings: list[Finding] = [
        Finding(
            "precision-mismatch",
            "warning",
            mismatch.layer,
            (mismatch.node,),
            f"{mismatch.op} {mismatch.node} was requested in {mismatch.requested.upper()} but runs in "
            f"{mismatch.actual.upper()}: {mismatch.reason}.",
            "change the plan for this node (or its Q/DQ), or accept it; `workbench build --strict-precision` fails "
            "on any such node.",
        )
        for mismatch in (precision_check.mismatches if precision_check is not None else ())
    ]
    op_type = {node.name: node.op_type for node in layer_map.nodes}
    layers = {layer.name: layer for layer in layer_map.layers}
    for pair in layer_map.qdq_audit():
        if pair.status != "standalone":
            continue
        for name in pair.layers:
            layer = layers[name]
            if layer.is_quantized_kernel:
                continue
            findings.append(
                Finding(
                    "standalone-qdq",
                    "warning",
                    name,
                    layer.onnx_nodes,
                    f"Q/DQ pair {pair.quantize} -> {pair.dequantize} on {pair.kind} tensor {pair.tensor!r} runs as its "
                    f"own {layer.layer_type} kernel instead of fusing into an INT8/FP8 convolution/GEMM.",
                    "move the Q/DQ pair onto the input of a Conv/Gemm/MatMul (placement rule in "
                    "workbench/precision/qdq_rules.py), or drop it (keep this tensor in FP16/FP32).",
                )
            )
    engine_precision = _dominant_precision(layer_map)
    records = {record.name: record for record in engine_layers.layers} if engine_layers else {}
    for layer in layer_map.layers:
        record = records.get(layer.name)
        kind = layer.layer_type.lower()
        if record is not None and layer.inserted and record.inputs and record.outputs:
            before = {t.precision for t in record.inputs if t.datatype}
            after = {t.precision for t in record.outputs if t.datatype}
            if before and after and before != after:
                findings.append(
                    Finding(
                        "type-reformat",
                        "warning",
                        layer.name,
                        (),
                        f"TensorRT inserted a {layer.layer_type} layer converting {'/'.join(sorted(before))} to "
                        f"{'/'.join(sorted(after))}.",
                        "keep neighbouring layers in one precision (extend the FP16/INT8 region over the boundary, "
                        "or fall the neighbour back too) so no conversion is needed.",
                    )
                )
        if engine_precision != "fp32" and kind in MATH_LAYER_TYPES and layer.precision == "fp32":
            why, fix = _why_fp32(layer.onnx_nodes, reduced)
            findings.append(
                Finding(
                    "fp32-in-reduced",
                    "warning" if engine_precision == "fp16" else "info",
                    layer.name,
                    layer.onnx_nodes,
                    f"{layer.layer_type} layer runs in FP32 inside an {engine_precision.upper()} engine: {why}.",
                    fix,
                )
            )
        if kind in SHAPE_LAYER_TYPES or kind.startswith("shape"):
            findings.append(
                Finding(
                    "shape-copy",
                    "info",
                    layer.name,
                    layer.onnx_nodes,
                    f"{layer.layer_type} layer: shape arithmetic or a copy that runs as its own layer.",
                    "fold constant shapes with `workbench clean` (constant folding, reshape chains), or give static "
                    "input shapes.",
                )
            )
    if records:
        producer = {t.name: name for name, record in records.items() for t in record.outputs}

        def elementwise(name: str) -> bool:
            nodes = layers[name].onnx_nodes if name in layers else ()
            return bool(nodes) and all(op_type.get(n, "") in ELEMENTWISE_OPS for n in nodes)

        for layer in layer_map.layers:
            if not elementwise(layer.name):
                continue
            record = records[layer.name]
            feeders = {producer[t.name] for t in record.inputs if t.name in producer}
            chained = sorted(f for f in feeders if f != layer.name and elementwise(f))
            if chained:
                findings.append(
                    Finding(
                        "unfused-elementwise",
                        "info",
                        layer.name,
                        layer.onnx_nodes,
                        f"elementwise layer fed directly by elementwise layer {chained[0]}: the chain was not fused.",
                        "look for a Cast, Reshape or second consumer between them (`workbench clean` removes "
                        "redundant casts/reshapes); a tensor read by two consumers cannot be fused away.",
                    )
                )
    findings.sort(key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), layers[f.layer].index if f.layer in layers else 0))
    return LintReport(layer_map.label, tuple(findings))
