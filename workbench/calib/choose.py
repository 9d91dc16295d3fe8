"""Per-tensor range-method choice: for every tensor, the method (max / percentile / entropy / MSE) whose amax gives
the smallest local error on that tensor's calibration histogram.

The local error is the mean squared fake-quantization error (rounding plus clipping) of the tensor's own values,
estimated from its |x| histogram exactly as :func:`workbench.calib.methods.mse_errors` does. Since each tensor takes
the argmin over the methods, the chosen ranges are never worse than the best single method on this error, tensor by
tensor and summed (a test checks it on real models). Whether that helps the *task* metric is measured separately in
``bench/calibrate.py``: the local error is a proxy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.artifact import Artifact
from workbench.calib.histogram import TensorHistogram
from workbench.calib.methods import DEFAULT_PERCENTILE, METHODS, compute_amax, mse_errors
from workbench.calib.stats import CalibrationRanges, CalibrationStatistics
from workbench.errors import WorkbenchError


@dataclass(frozen=True)
class TensorChoice(Artifact):
    """One tensor's choice: the method, its amax, and every method's local error (mean squared, data units)."""

    name: str
    method: str
    amax: float
    local_error: float
    errors: dict[str, float] = field(default_factory=dict)
    amax_by_method: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodChoice(Artifact):
    """Per-tensor choices, how often each method won, and the summed local error per single method and chosen."""

    choices: tuple[TensorChoice, ...]
    wins: dict[str, int]
    total_error: float
    total_error_by_method: dict[str, float]
    ranges: CalibrationRanges | None = field(default=None, repr=False, metadata={"json": False})


def local_error(hist: TensorHistogram, amax: float) -> float:
    """Mean squared fake-quantization error of the histogram's values at ``amax`` (rounding and clipping)."""
    if hist.count == 0 or hist.width == 0.0:
        return 0.0
    if not amax > 0.0:
        raise WorkbenchError(f"amax {amax} is not positive.", expected="a positive range")
    _, errors = mse_errors(hist, candidate_bins=np.asarray([amax / hist.width], dtype=np.float64))
    return float(errors[0])


def choose_methods(
    statistics: CalibrationStatistics,
    methods: tuple[str, ...] = METHODS,
    *,
    percentile: float = DEFAULT_PERCENTILE,
) -> MethodChoice:
    """Pick, per tensor, the method with the smallest local error; return the choices and the combined ranges."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise WorkbenchError(f"unknown range method(s) {unknown or methods}.", expected=" / ".join(METHODS))
    choices = []
    totals = dict.fromkeys(methods, 0.0)
    for name, hist in statistics.histograms.items():
        amax = {m: compute_amax(hist, m, percentile=percentile) for m in methods}  # type: ignore[arg-type]
        errors = {m: local_error(hist, a) if a > 0 else 0.0 for m, a in amax.items()}
        for m, e in errors.items():
            totals[m] += e
        best = min(methods, key=lambda m: (errors[m], methods.index(m)))
        choices.append(TensorChoice(name, best, float(amax[best]), errors[best], errors, amax))
    wins = {m: sum(c.method == m for c in choices) for m in methods}
    ranges = statistics.ranges(
        methods[0],  # type: ignore[arg-type]  # methods are checked against METHODS above
        percentile=percentile,
        overrides={c.name: c.amax for c in choices},
    )
    from dataclasses import replace

    ranges = replace(ranges, method="per-tensor", percentile=percentile if "percentile" in methods else None)
    return MethodChoice(tuple(choices), wins, float(sum(c.local_error for c in choices)), totals, ranges)
