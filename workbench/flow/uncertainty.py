"""How sure a measured task metric is: 95 % intervals for one metric and for the difference of two.

An accuracy-like metric (each sample right or wrong) gets a Wilson score interval, which stays inside [0, 1] and
behaves at 0 or n successes where the normal approximation does not. Any other per-sample mean (e.g. cosine
similarity) gets a percentile bootstrap. Two variants evaluated on the same samples are compared *paired*, on the
per-sample differences, which resolves far smaller differences than two separate intervals: the 95 % normal interval
of their mean (:func:`workbench.calib.paired.paired_interval`), the very interval the accuracy-target search and the
engine rule decide "within the drop" on, so the "vs FP32" a table shows and the verdict beside it cannot disagree.
Bootstraps use a fixed seed, so a report shows the same interval every time it is rendered.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from workbench.artifact import Artifact

Z95 = 1.959963984540054  # two-sided 95 %
PAIRED_CONFIDENCE = 0.95  # the level of every interval shown: Wilson, bootstrap and paired
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20240601


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n``."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def _bootstrap_means(values: np.ndarray) -> np.ndarray:
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))
    return values[picks].mean(axis=1)


def bootstrap_interval(values: Sequence[float] | npt.NDArray[np.float64]) -> tuple[float, float]:
    """Percentile-bootstrap 95 % interval of the mean of ``values``."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return (math.nan, math.nan)
    if np.all(data == data[0]):
        return (float(data[0]), float(data[0]))
    means = _bootstrap_means(data)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def is_binary(scores: Sequence[float]) -> bool:
    return len(scores) > 0 and all(s in (0.0, 1.0) for s in scores)


@dataclass(frozen=True)
class Estimate(Artifact):
    """A measured metric with its sample count and 95 % interval (``method`` says how; "" when there is none)."""

    value: float
    n: int
    low: float = math.nan
    high: float = math.nan
    method: str = ""

    @property
    def has_interval(self) -> bool:
        return bool(self.method) and not math.isnan(self.low)

    def text(self, digits: int = 4) -> str:
        """``0.9925 [0.9781, 0.9975] (n=400)``, or ``0.9925 (n=400, no interval)``."""
        if not self.has_interval:
            return f"{self.value:.{digits}f} (n={self.n}, no interval)"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] (n={self.n})"


def estimate(value: float, n: int, scores: Sequence[float] = ()) -> Estimate:
    """The interval of a metric: Wilson for right/wrong scores, bootstrap for other per-sample means."""
    if scores and len(scores) == n:
        if is_binary(scores):
            low, high = wilson_interval(sum(scores), n)
            return Estimate(value, n, low, high, "Wilson 95%")
        low, high = bootstrap_interval(scores)
        return Estimate(value, n, low, high, "bootstrap 95%")
    return Estimate(value, n)


@dataclass(frozen=True)
class Difference(Artifact):
    """``value(b) - value(a)`` on the same samples, with its paired 95 % interval when scores allow."""

    delta: float
    low: float = math.nan
    high: float = math.nan
    n: int = 0
    method: str = ""

    @property
    def has_interval(self) -> bool:
        return bool(self.method) and not math.isnan(self.low)

    @property
    def within_noise(self) -> bool:
        """The interval contains 0: these samples cannot tell the two apart."""
        return self.has_interval and self.low <= 0.0 <= self.high

    def text(self, digits: int = 4) -> str:
        if not self.has_interval:
            return f"{self.delta:+.{digits}f} (no interval)"
        return f"{self.delta:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


PAIRED_METHOD = "paired normal 95%"


def paired_difference(
    a_value: float, a_scores: Sequence[float], b_value: float, b_scores: Sequence[float]
) -> Difference:
    """b - a, with the paired 95 % interval of the mean per-sample difference when both have scores for the same
    (at least two) samples: the interval the search and the engine rule decide on (:mod:`workbench.calib.paired`)."""
    from workbench.calib.paired import paired_interval

    delta = float(b_value) - float(a_value)
    if not a_scores or len(a_scores) != len(b_scores):
        return Difference(delta)
    mean, half = paired_interval(b_scores, a_scores, PAIRED_CONFIDENCE)
    if math.isnan(half):
        return Difference(delta)
    return Difference(delta, mean - half, mean + half, len(a_scores), PAIRED_METHOD)


class Scored(Protocol):
    """A measured metric: its value, sample count and per-sample scores (a zoo MetricResult, a metric row)."""

    @property
    def value(self) -> float: ...
    @property
    def n_samples(self) -> int: ...
    @property
    def scores(self) -> Sequence[float]: ...


@dataclass(frozen=True)
class VersusReference(Artifact):
    """A measured metric with its 95 % interval and, unless it is the reference, its paired difference to it."""

    estimate: Estimate
    difference: Difference | None = None  # None: this is the reference

    def difference_text(self) -> str:
        """``-0.0312 [-0.0625, +0.0000] within noise``, or ``reference``."""
        if self.difference is None:
            return "reference"
        return self.difference.text() + (" within noise" if self.difference.within_noise else "")


def versus_reference(results: Sequence[Scored]) -> tuple[VersusReference, ...]:
    """Each result's estimate, and its paired difference to the first (the reference, e.g. FP32)."""
    if not results:
        return ()
    reference = results[0]
    return tuple(
        VersusReference(
            estimate(result.value, result.n_samples, result.scores),
            None if index == 0 else paired_difference(reference.value, reference.scores, result.value, result.scores),
        )
        for index, result in enumerate(results)
    )
