"""Graph cleaning for TensorRT: named onnx-graphsurgeon passes, each checked for equivalence and reported.

from workbench.clean import clean_model, CleanOptions
result = clean_model("model.onnx", CleanOptions(passes=["fold_constants", "remove_noops"]))
result.model          # cleaned onnx.ModelProto
result.to_json()      # per-pass node counts, op-count deltas, bytes, seconds, max abs diff, status
"""

from workbench.clean.passes import (
    DEFAULT_PASSES,
    CleanPass,
    PassContext,
    available_passes,
    get_pass,
    register_pass,
)
from workbench.clean.pipeline import CleanOptions, clean_file, clean_model
from workbench.clean.qdq_lint import lint_qdq
from workbench.clean.report import CleanResult, Finding, PassReport

__all__ = [
    "DEFAULT_PASSES",
    "CleanOptions",
    "CleanPass",
    "CleanResult",
    "Finding",
    "PassContext",
    "PassReport",
    "available_passes",
    "clean_file",
    "clean_model",
    "get_pass",
    "lint_qdq",
    "register_pass",
]
