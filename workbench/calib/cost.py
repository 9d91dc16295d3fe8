"""What a precision plan costs the engine: build its Q/DQ model with TensorRT-RTX and count what the builder made.

TensorRT-RTX builds on a machine without a GPU (CPU-only ahead-of-time build, about a second for the zoo models), so
every plan a search evaluates can be built. The figures are the engine's **structure**, not its speed: engine layers,
INT8 / FP16 / FP32 layers, standalone quantize/dequantize kernels (a Q/DQ that did not fuse into a convolution or
GEMM), reformat layers (type or layout conversions TensorRT inserted) and serialized bytes. Where an engine can run
(full TensorRT on a GPU) latency is the figure to use instead; nothing here measures it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.artifact import Artifact
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from workbench.engine.layermap import LayerEntry, LayerMap
    from workbench.model.profile import ShapeRange

COST_LABEL = "engine structure from a TensorRT-RTX CPU build (not speed)"
QDQ_NODE_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass(frozen=True)
class EngineCost(Artifact):
    """Structure of one plan's engine (TensorRT-RTX CPU build). ``label`` says plainly that this is not speed."""

    engine_layers: int
    int8_layers: int
    fp16_layers: int
    fp32_layers: int
    other_layers: int  # layers in none of INT8, FP8, FP16, FP32 (shape calls, int32 bookkeeping)
    qdq_kernels: int  # layers made only of Q/DQ nodes, or quantize kernels (Round+Cast) with no math
    reformat_layers: int
    math_layers: int
    int8_math_layers: int
    engine_bytes: int
    build_seconds: float
    backend: str
    label: str = COST_LABEL
    fp8_layers: int = 0
    fp8_math_layers: int = 0

    @property
    def score(self) -> float:
        """One number for a Pareto axis: engine layers plus reformats counted twice (each is an extra pass)."""
        return float(self.engine_layers + self.reformat_layers)


def _is_qdq_kernel(layer: LayerEntry, ops: dict[str, str]) -> bool:
    """A standalone quantize/dequantize kernel: only Q/DQ nodes, or a Myelin kernel that only rounds and casts."""
    if layer.onnx_nodes and all(ops.get(n) in QDQ_NODE_OPS for n in layer.onnx_nodes):
        return True
    tokens = set(layer.op_tokens)
    return (
        layer.layer_type.lower() != "correlation" and bool(tokens) and tokens <= {"Mul", "Min", "Max", "Roun", "Cast"}
    )


def cost_of_layer_map(layer_map: LayerMap, engine_bytes: int, build_seconds: float, backend: str) -> EngineCost:
    """Count the structure of a built engine from its layer map."""
    from workbench.engine.layermap import MATH_LAYER_TYPES

    ops = {n.name: n.op_type for n in layer_map.nodes}
    precisions = [layer.precision.lower() for layer in layer_map.layers]
    math = [layer for layer in layer_map.layers if layer.layer_type.lower() in MATH_LAYER_TYPES]
    return EngineCost(
        engine_layers=len(layer_map.layers),
        int8_layers=sum(p == "int8" for p in precisions),
        fp16_layers=sum(p in ("half", "fp16") for p in precisions),
        fp32_layers=sum(p in ("float", "fp32") for p in precisions),
        other_layers=sum(p not in ("int8", "fp8", "half", "fp16", "float", "fp32") for p in precisions),
        qdq_kernels=sum(_is_qdq_kernel(layer, ops) for layer in layer_map.layers),
        reformat_layers=sum("reformat" in layer.layer_type.lower() for layer in layer_map.layers),
        math_layers=len(math),
        int8_math_layers=sum(layer.is_int8_kernel for layer in math),
        engine_bytes=int(engine_bytes),
        build_seconds=float(build_seconds),
        backend=backend,
        fp8_layers=sum(p == "fp8" for p in precisions),
        fp8_math_layers=sum(layer.is_fp8_kernel for layer in math),
    )


def build_plan_engine(
    proto: Any,
    workdir: str | Path | None = None,
    *,
    name: str = "plan",
    shapes: Mapping[str, ShapeRange] | None = None,
) -> tuple[EngineCost, LayerMap]:
    """Build ``proto`` (a Q/DQ and/or FP16-cast model) with the installed TensorRT backend; return (cost, layer map).

    ``shapes``: (min, opt, max) per dynamic input, e.g. a zoo entry's ``input_profiles()``."""
    import onnx

    from workbench.engine.build import BuildOptions, engine_from_onnx
    from workbench.model import load_onnx

    proto = getattr(proto, "proto", proto)
    if proto is None or not hasattr(proto, "graph"):
        raise WorkbenchError("nothing to build.", expected="an ONNX ModelProto or a QdqModel")
    with tempfile.TemporaryDirectory(prefix="workbench-cost-", dir=workdir) as folder:
        onnx_path = Path(folder) / f"{name}.onnx"
        onnx.save(proto, str(onnx_path))
        artifact = engine_from_onnx(
            load_onnx(onnx_path, check=False),
            Path(folder) / f"{name}.engine",
            BuildOptions(shapes=dict(shapes or {}), progress=False),
        )
    cost = cost_of_layer_map(artifact.layer_map, artifact.engine_bytes, artifact.build_seconds, artifact.backend)
    return cost, artifact.layer_map
