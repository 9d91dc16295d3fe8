"""Stage 2: the precision plan (per-node FP32/FP16/INT8) and how a plan becomes an ONNX graph TensorRT 11 builds
strongly typed: FP16 by AutoCast-style casts (:mod:`.autocast`), INT8 by Q/DQ pairs placed by TensorRT's rules
(:mod:`.qdq_rules`; the scales come from calibration, :mod:`workbench.calib`)."""

from workbench.precision.autocast import AutocastResult, apply_precision_plan
from workbench.precision.plan import PRECISIONS, Precision, PrecisionPlan
from workbench.precision.qdq_rules import QUANTIZABLE_OPS, QdqPlacement, WeightQuant, plan_placement, prepare_model
from workbench.precision.variant import (
    CALIBRATION_METHODS,
    COST_ORDER,
    PRECISION_CHOICES,
    VARIANTS,
    CalibrationMethod,
    PrecisionChoice,
    Variant,
    VariantInfo,
    parse_calibration_method,
    parse_precision_choice,
    parse_variant,
    variants_for,
)

__all__ = [
    "CALIBRATION_METHODS",
    "COST_ORDER",
    "PRECISION_CHOICES",
    "VARIANTS",
    "CalibrationMethod",
    "PrecisionChoice",
    "Variant",
    "VariantInfo",
    "parse_calibration_method",
    "parse_precision_choice",
    "parse_variant",
    "variants_for",
    "PRECISIONS",
    "QUANTIZABLE_OPS",
    "AutocastResult",
    "Precision",
    "PrecisionPlan",
    "QdqPlacement",
    "WeightQuant",
    "apply_precision_plan",
    "plan_placement",
    "prepare_model",
]
