"""The precision variants of one model, typed: the only place that knows what a variant's name means.

A *variant* is one engine the journey can build for a model: FP32 (the reference), FP16 (casts in the graph),
all-INT8 (Q/DQ on every quantizable node) or mixed INT8 (the accuracy-target search's plan, some nodes kept wider).
Widgets' options, CLI choices, config validation, palette lookups, the choice rule and the export read
:data:`VARIANTS`; no module parses a variant's name. Adding a format (the FP8 issue adds ``fp8-all``) means one
member of :class:`Variant`, one :class:`VariantInfo` row here, and the code that really differs (ranges, Q/DQ dtype).

Also here: the precisions a user can *ask* for (:data:`PrecisionChoice`, ``auto`` lets the rule pick) and the
calibration range methods (:data:`CalibrationMethod`), each with its validating parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from workbench.errors import WorkbenchError


class Variant(str, Enum):
    """One engine variant of a model; the value is its stable name in files, JSON and file names."""

    FP32 = "fp32"
    FP16 = "fp16"
    INT8_ALL = "int8-all"
    INT8_MIXED = "int8-mixed"
    FP8_ALL = "fp8-all"

    def __str__(self) -> str:  # f"{variant}" and file names read "int8-all", not "Variant.INT8_ALL"
        return self.value

    @property
    def info(self) -> VariantInfo:
        return VARIANTS[self]


# what each variant's compute runs at: the key of its colour in workbench.viz.palette and of a plan's default
ComputePrecision = Literal["fp32", "fp16", "int8", "fp8"]


@dataclass(frozen=True)
class VariantInfo:
    """What the rest of the code needs to know about a variant, so that none of it parses the name."""

    variant: Variant
    label: str  # shown to users: tables, legends, widget options
    precision: ComputePrecision  # the precision of its quantizable math (palette colour, plan default)
    quantized: bool  # built from a calibrated Q/DQ model (needs ranges, ships a calibration cache)
    mixed: bool  # some nodes kept wider than ``precision`` by a plan (ships the plan)
    cost_rank: int  # expected TensorRT cost, cheapest first (the choice rule's order)
    choice: PrecisionChoice  # the precision a user asks for to get this variant


VARIANTS: dict[Variant, VariantInfo] = {
    info.variant: info
    for info in (
        VariantInfo(Variant.INT8_ALL, "INT8 (all)", "int8", quantized=True, mixed=False, cost_rank=0, choice="int8"),
        VariantInfo(Variant.INT8_MIXED, "INT8 (mixed)", "int8", quantized=True, mixed=True, cost_rank=1, choice="int8"),
        # FP8 Q/DQ (E4M3) on every Conv/Gemm/MatMul: 8-bit math like INT8, runs only on compute capability 8.9+
        VariantInfo(Variant.FP8_ALL, "FP8 (all)", "fp8", quantized=True, mixed=False, cost_rank=2, choice="fp8"),
        VariantInfo(Variant.FP16, "FP16", "fp16", quantized=False, mixed=False, cost_rank=3, choice="fp16"),
        VariantInfo(Variant.FP32, "FP32", "fp32", quantized=False, mixed=False, cost_rank=4, choice="fp32"),
    )
}

# cheapest first: the order in which TensorRT engines of these variants are expected to cost time
COST_ORDER: tuple[Variant, ...] = tuple(sorted(VARIANTS, key=lambda v: VARIANTS[v].cost_rank))

# --- what a user asks for -------------------------------------------------------------------------------------------

PrecisionChoice = Literal["auto", "fp32", "fp16", "int8", "fp8"]
# "fp8" builds the FP8 engine only when asked for (its own stage): FP8 runs on compute capability 8.9+ only, so the
# rule ("auto") never picks it for a GPU that may not run it
PRECISION_CHOICES: tuple[PrecisionChoice, ...] = ("auto", "fp32", "fp16", "int8", "fp8")
PRECISION_CHOICE_LABELS: dict[PrecisionChoice, str] = {
    "auto": "auto (the rule picks)",
    "fp32": "FP32",
    "fp16": "FP16",
    "int8": "INT8",
    "fp8": "FP8 (GPUs of compute capability 8.9+)",
}

CalibrationMethod = Literal["entropy", "percentile", "mse", "max"]
CALIBRATION_METHODS: tuple[CalibrationMethod, ...] = ("entropy", "percentile", "mse", "max")
CALIBRATION_METHOD_LABELS: dict[CalibrationMethod, str] = {
    "entropy": "entropy (KL)",
    "percentile": "percentile 99.99",
    "mse": "MSE",
    "max": "max",
}


def variants_for(choice: PrecisionChoice) -> tuple[Variant, ...]:
    """The variants a requested precision may be served by, cheapest first (``auto``: all of them)."""
    return tuple(v for v in COST_ORDER if choice == "auto" or VARIANTS[v].choice == choice)


def parse_variant(value: object, where: str = "variant") -> Variant:
    """``value`` as a :class:`Variant`; anything else is a :class:`WorkbenchError` naming the known ones."""
    if isinstance(value, Variant):
        return value
    try:
        return Variant(str(value))
    except ValueError:
        raise WorkbenchError(
            f"{where} {value!r} is not a known precision variant.", expected=" / ".join(v.value for v in Variant)
        ) from None


def parse_precision_choice(value: object, where: str = "precision") -> PrecisionChoice:
    if value not in PRECISION_CHOICES:
        raise WorkbenchError(f"{where} {value!r} is not offered.", expected=" / ".join(PRECISION_CHOICES))
    return value  # type: ignore[return-value]  # checked against the literal's values just above


def parse_calibration_method(value: object, where: str = "calibration method") -> CalibrationMethod:
    if value not in CALIBRATION_METHODS:
        raise WorkbenchError(f"{where} {value!r} is unknown.", expected=" / ".join(CALIBRATION_METHODS))
    return value  # type: ignore[return-value]  # checked against the literal's values just above
