"""Every setting of the quickstart journey, validated: one constant per limit, read by the config, widgets and CLI."""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, replace
from typing import TypeAlias

from workbench.artifact import Artifact
from workbench.calib.paired import DEFAULT_CONFIDENCE
from workbench.errors import WorkbenchError
from workbench.flow.rule import DEFAULT_MAX_DROP, check_confidence
from workbench.precision.variant import (
    CalibrationMethod,
    PrecisionChoice,
    parse_calibration_method,
    parse_precision_choice,
)
from workbench.timing.limits import check_journey_batch, check_streams
from workbench.zoo import DEFAULT_MODEL

# limits and defaults of the journey's own settings (streams and batch: workbench.timing.limits)
SEARCH_BUDGET_RANGE = (0, 64)  # task evaluations of the accuracy-target search; 0 turns it off
DEFAULT_SEARCH_BUDGET = 8  # the default models meet the target within 1-2 evaluations (a few seconds)
MAX_DROP_RANGE = (0.0, 1.0)  # the task-metric loss vs FP32 an engine may have and still be chosen
MIN_SAMPLES = 1
CALIBRATION_BATCH = 8  # calibration and diff sources count batches of this many samples; the config counts samples

SettingValue: TypeAlias = str | int | float | bool | os.PathLike[str]


@dataclass(frozen=True)
class QuickstartConfig(Artifact):
    """Every setting the panel's widgets control, with built-in defaults that run in well under a minute on CPU."""

    model: str = DEFAULT_MODEL
    precision: PrecisionChoice = "auto"
    # mse: entropy (TensorRT's old default) gives ocr-rec 0.0000 exact match and EfficientNet-Lite0 0.869 against
    # mse's 0.9533 and 0.9070 (bench/calibrate.py --loss-sources, bench/results/calibrate_loss_sources_2026-12-05.md)
    calibration_method: CalibrationMethod = "mse"
    streams: int = 2
    batch: int = 8
    calibration_samples: int = 128  # rounded up to whole batches of CALIBRATION_BATCH
    diff_samples: int = 32
    evaluation_samples: int = 450  # capped by the model's evaluation split (ocr-cls 400, digits-cnn 450)
    # task evaluations the accuracy-target mixed-precision search may use (target: FP32 minus max_metric_drop); the
    # search's pick is the mixed engine; 0 turns the search off (and with it the mixed engine)
    search_budget: int = DEFAULT_SEARCH_BUDGET
    max_metric_drop: float = DEFAULT_MAX_DROP  # the task-metric loss vs FP32 an engine may have and still be chosen
    # the level at which the search calls its target met and the engine rule calls a loss within max_metric_drop: the
    # worst end of the paired interval against FP32, one criterion for both so the journey exports what its search
    # calls met; 0: the point estimate decides both
    confidence: float = DEFAULT_CONFIDENCE
    timing_window_s: float = 0.25
    sweep: bool = True  # also time streams=1 and batch=1 so the diagnosis can say whether streams/batching help
    out_dir: str = "out"
    # your own ONNX file only: a folder of .npz batches keyed by input name (first half calibrates, second evaluates);
    # empty = seeded random inputs
    data: str = ""
    export: bool = True  # the export stage writes a bundle (a new folder under <out_dir>/export each run)
    export_bad: bool = False  # export the chosen engine even when its verdict is "bad" (default: the stage blocks)

    def __post_init__(self) -> None:
        self._check_types()
        parse_precision_choice(self.precision)
        parse_calibration_method(self.calibration_method)
        check_streams(self.streams)
        check_journey_batch(self.batch)
        for name in ("calibration_samples", "diff_samples", "evaluation_samples"):
            if int(getattr(self, name)) < MIN_SAMPLES:
                raise WorkbenchError(f"{name}={getattr(self, name)} must be at least {MIN_SAMPLES}.")
        low, high = SEARCH_BUDGET_RANGE
        if not low <= int(self.search_budget) <= high:
            raise WorkbenchError(
                f"search_budget={self.search_budget} is out of range.", expected=f"{low} (off) ..{high}"
            )
        low_drop, high_drop = MAX_DROP_RANGE
        if not low_drop <= self.max_metric_drop <= high_drop:
            raise WorkbenchError(
                f"max_metric_drop={self.max_metric_drop} is out of range.", expected=f"{low_drop:g}..{high_drop:g}"
            )
        if self.confidence != 0:
            check_confidence(self.confidence)
        if not math.isfinite(self.timing_window_s) or not self.timing_window_s > 0:
            raise WorkbenchError(f"timing_window_s={self.timing_window_s} must be a positive number of seconds.")

    def _check_types(self) -> None:
        """A setting of the wrong type ('2' for streams, 2.5 samples, 'no' for a switch) is refused, not coerced."""
        for name, kind in (
            ("streams", int),
            ("batch", int),
            ("calibration_samples", int),
            ("diff_samples", int),
            ("evaluation_samples", int),
            ("search_budget", int),
            ("max_metric_drop", float),
            ("confidence", float),
            ("timing_window_s", float),
            ("sweep", bool),
            ("export", bool),
            ("export_bad", bool),
            ("model", str),
        ):
            value = getattr(self, name)
            if kind is bool:
                ok = isinstance(value, bool)
            elif kind is int:
                ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            elif kind is float:
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
            else:
                ok = isinstance(value, str) and bool(value)
            if not ok:
                article = {int: "an integer", float: "a number", bool: "True or False", str: "a non-empty string"}
                raise WorkbenchError(
                    f"{name}={value!r} ({type(value).__name__}) is not {article[kind]}.",
                    expected=f"{name} as {article[kind]}",
                )
        if not isinstance(self.data, str):
            raise WorkbenchError(
                f"data={self.data!r} ({type(self.data).__name__}) is not a folder path string.",
                expected='data as a string: a folder of .npz batches, or "" for seeded random inputs',
            )
        if not isinstance(self.out_dir, (str, os.PathLike)) or not str(self.out_dir):
            raise WorkbenchError(
                f"out_dir={self.out_dir!r} is not a folder path.", expected="out_dir as a string or pathlib.Path"
            )

    @property
    def decision_confidence(self) -> float | None:
        """``confidence`` as the search and the rule take it: None (the point estimate) for 0."""
        return float(self.confidence) if self.confidence else None

    def validated(self, **changes: SettingValue) -> QuickstartConfig:
        """This config with ``changes``; an unknown setting or a value out of range raises (nothing is clamped)."""
        unknown = set(changes) - set(QuickstartConfig.__dataclass_fields__)
        if unknown:
            raise WorkbenchError(
                f"unknown quickstart setting(s) {sorted(unknown)}.",
                expected=", ".join(QuickstartConfig.__dataclass_fields__),
            )
        return replace(self, **changes)  # type: ignore[arg-type]  # each value is checked by __post_init__


def calibration_batches(samples: int) -> int:
    """Calibration sources count batches; the config counts samples."""
    return max(1, -(-int(samples) // CALIBRATION_BATCH))
