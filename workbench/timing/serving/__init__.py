"""Serving on one device: an engine manager for several models (lanes, dynamic batching into buckets, admission
control, stream priorities, statistics), hot reload under load, saturation and p99-budget (SLA) searches, and
per-layer GPU time for the PyTorch executor.

Works with every timing executor: ONNX Runtime on CPU threads, PyTorch CUDA graphs, TensorRT where it runs. Nothing
here imports torch, cuda or plotly at import time.
"""

from workbench.timing.serving.config import ServeConfig
from workbench.timing.serving.manager import EngineManager
from workbench.timing.serving.result import (
    LoadProbe,
    ModelStats,
    ReloadReport,
    Response,
    SaturationResult,
    SlaSearchResult,
)
from workbench.timing.serving.search import saturation_search, sla_search
from workbench.timing.serving.server import ModelServer, compare_outputs

__all__ = [
    "EngineManager",
    "LoadProbe",
    "ModelServer",
    "ModelStats",
    "ReloadReport",
    "Response",
    "SaturationResult",
    "ServeConfig",
    "SlaSearchResult",
    "compare_outputs",
    "saturation_search",
    "sla_search",
]
