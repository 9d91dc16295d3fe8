"""INT8 calibration with explicit Q/DQ (TensorRT 11 has no calibrators) and per-layer accuracy diffs against FP32.

Pipeline: a data source (:mod:`.data`) -> one streaming statistics pass into order-independent |x| histograms
(:mod:`.histogram`, :mod:`.stats`) -> ranges by max / percentile / entropy / MSE on demand (:mod:`.methods`) ->
Q/DQ insertion where :mod:`workbench.precision.qdq_rules` places it (:mod:`.qdq`) -> per-layer diff
(:mod:`.diff`) -> fallback of the worst layers and an automatic search for a target task metric (:mod:`.session`).
Nothing here imports TensorRT, plotly or ipywidgets.
"""

from workbench.calib.data import (
    CalibrationSource,
    FolderSource,
    IterableSource,
    RandomSource,
    ZooSource,
    resolve_source,
)
from workbench.calib.diff import LayerDiff, TensorDiff, diff_models
from workbench.calib.histogram import NUM_BINS, TensorHistogram
from workbench.calib.methods import METHODS, compute_amax, per_channel_amax
from workbench.calib.qdq import QdqModel, insert_qdq
from workbench.calib.session import CalibrationSession, FallbackSearchResult
from workbench.calib.stats import CalibrationRanges, CalibrationStatistics, collect_statistics, load_tensorrt_cache

__all__ = [
    "CalibrationRanges",
    "CalibrationSession",
    "CalibrationSource",
    "CalibrationStatistics",
    "FallbackSearchResult",
    "FolderSource",
    "IterableSource",
    "LayerDiff",
    "METHODS",
    "NUM_BINS",
    "QdqModel",
    "RandomSource",
    "TensorDiff",
    "TensorHistogram",
    "ZooSource",
    "collect_statistics",
    "compute_amax",
    "diff_models",
    "insert_qdq",
    "load_tensorrt_cache",
    "per_channel_amax",
    "resolve_source",
]
