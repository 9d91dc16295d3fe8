"""INT8 calibration with explicit Q/DQ (TensorRT 11 has no calibrators) and per-layer accuracy diffs against FP32.

Pipeline: a data source (:mod:`.data`) -> one streaming statistics pass into order-independent |x| histograms
(:mod:`.histogram`, :mod:`.stats`) -> ranges by max / percentile / entropy / MSE on demand (:mod:`.methods`) ->
Q/DQ insertion where :mod:`workbench.precision.qdq_rules` places it (:mod:`.qdq`) -> per-layer diff
(:mod:`.diff`, with the first tensor below an SQNR threshold) -> fallback of the worst layers (:mod:`.session`) and
the accuracy-target mixed-precision search over engine fusion groups (:mod:`.search`, :mod:`.groups`) with each
plan's engine structure from a TensorRT-RTX CPU build (:mod:`.cost`); per-tensor range-method choice
(:mod:`.choose`) and bias correction (:mod:`.bias`) improve INT8 before any fallback.
Nothing here imports TensorRT, plotly or ipywidgets.
"""

from workbench.calib.bias import BiasCorrection, bias_correct
from workbench.calib.choose import MethodChoice, choose_methods
from workbench.calib.cost import EngineCost, build_plan_engine
from workbench.calib.data import (
    CalibrationSource,
    FolderSource,
    IterableSource,
    RandomSource,
    ZooSource,
    resolve_source,
)
from workbench.calib.diff import Divergence, LayerDiff, TensorDiff, diff_models, first_divergence
from workbench.calib.groups import PrecisionGroup, block_groups, fusion_groups
from workbench.calib.histogram import NUM_BINS, TensorHistogram
from workbench.calib.methods import METHODS, compute_amax, per_channel_amax
from workbench.calib.qdq import QdqModel, insert_qdq
from workbench.calib.search import MixedPrecisionResult, pareto_front, search_mixed_precision
from workbench.calib.session import CalibrationSession
from workbench.calib.stats import CalibrationRanges, CalibrationStatistics, collect_statistics, load_tensorrt_cache

__all__ = [
    "BiasCorrection",
    "Divergence",
    "EngineCost",
    "MethodChoice",
    "MixedPrecisionResult",
    "pareto_front",
    "PrecisionGroup",
    "bias_correct",
    "block_groups",
    "build_plan_engine",
    "choose_methods",
    "first_divergence",
    "fusion_groups",
    "search_mixed_precision",
    "CalibrationRanges",
    "CalibrationSession",
    "CalibrationSource",
    "CalibrationStatistics",
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
