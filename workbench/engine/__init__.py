"""Stage 3: ONNX (+ precision plan) -> a TensorRT engine (:class:`EngineArtifact`) with its layer map.

:mod:`.backend` holds every TensorRT call (TensorRT 10/11 or TensorRT-RTX), :mod:`.build` builds, :mod:`.records`
reads layer records (RTX verbose log, TensorRT <= 10 / 11 inspector JSON, our ``.layers.json``), :mod:`.layermap`
links engine layers to ONNX nodes, :mod:`.doctor` says what this machine can do.
"""

from workbench.engine.backend import Backend, GpuInfo, detect_gpu, engine_runnable, get_backend
from workbench.engine.build import (
    BuildOptions,
    EngineArtifact,
    engine_for_model,
    engine_from_onnx,
    layers_path_for,
    parse_shapes_arg,
    profiles_for,
)
from workbench.engine.layermap import FusionDiff, FusionStats, LayerEntry, LayerMap, NodeEntry, QdqPair, diff_layer_maps
from workbench.engine.records import (
    EngineLayers,
    LayerRecord,
    TensorRecord,
    parse_rtx_layers_message,
    read_inspector_json,
    read_layers,
)

__all__ = [
    "Backend",
    "BuildOptions",
    "EngineArtifact",
    "EngineLayers",
    "FusionDiff",
    "FusionStats",
    "GpuInfo",
    "LayerEntry",
    "LayerMap",
    "LayerRecord",
    "NodeEntry",
    "QdqPair",
    "TensorRecord",
    "detect_gpu",
    "diff_layer_maps",
    "engine_for_model",
    "engine_from_onnx",
    "engine_runnable",
    "get_backend",
    "layers_path_for",
    "parse_rtx_layers_message",
    "parse_shapes_arg",
    "profiles_for",
    "read_inspector_json",
    "read_layers",
]
