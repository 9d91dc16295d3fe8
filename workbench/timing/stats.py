"""Statistics over measured spans: percentiles with bootstrap intervals, unions of spans, stability, Little's law.

Pure numpy, no GPU: every number the pipeline reports is computed here from recorded timestamps, so the tests can
feed synthetic span sets with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from workbench.artifact import Artifact

DEFAULT_QUANTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0)
# A percentile is only trusted when at least this many samples lie at or beyond it (p99 needs 500 samples).
MIN_TAIL_SAMPLES = 5


def min_samples_for(percentile: float, tail_samples: int = MIN_TAIL_SAMPLES) -> int:
    """Fewest samples for which ``tail_samples`` observations fall at or above ``percentile``."""
    tail_fraction = max(1.0 - percentile / 100.0, 1e-9)
    return int(math.ceil(tail_samples / tail_fraction - 1e-9))


@dataclass(frozen=True)
class PercentileEstimate(Artifact):
    percentile: float
    value: float
    ci_low: float
    ci_high: float
    n_samples: int
    reliable: bool  # False when fewer than min_samples_for(percentile) samples were available


def percentiles(values: Sequence[float] | np.ndarray, qs: Sequence[float] = DEFAULT_QUANTILES) -> dict[float, float]:
    """Linear-interpolated percentiles (numpy's default); NaN for an empty input."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {float(q): float("nan") for q in qs}
    out = np.percentile(data, list(qs))
    return {float(q): float(v) for q, v in zip(qs, out)}


def bootstrap_percentiles(
    values: Sequence[float] | np.ndarray,
    qs: Sequence[float] = DEFAULT_QUANTILES,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    max_points: int = 20000,
) -> dict[float, PercentileEstimate]:
    """Percentiles with percentile-bootstrap confidence intervals and the minimum-sample guard.

    Resampling is vectorised; beyond ``max_points`` samples a fixed random subset of that size is resampled (the
    interval then is slightly conservative), which keeps a 1000-resample bootstrap under ~0.5 s.
    """
    data = np.asarray(values, dtype=np.float64)
    n = int(data.size)
    point = percentiles(data, qs)
    if n == 0:
        return {float(q): PercentileEstimate(float(q), math.nan, math.nan, math.nan, 0, False) for q in qs}
    rng = np.random.default_rng(seed)
    sample = data if n <= max_points else rng.choice(data, size=max_points, replace=False)
    m = sample.size
    idx = rng.integers(0, m, size=(n_resamples, m))
    boot = np.percentile(sample[idx], list(qs), axis=1)  # shape (len(qs), n_resamples)
    alpha = (1.0 - confidence) / 2.0
    result: dict[float, PercentileEstimate] = {}
    for row, q in zip(boot, qs):
        low, high = np.quantile(row, [alpha, 1.0 - alpha])
        result[float(q)] = PercentileEstimate(
            percentile=float(q),
            value=point[float(q)],
            ci_low=float(low),
            ci_high=float(high),
            n_samples=n,
            reliable=n >= min_samples_for(float(q)),
        )
    return result


def merge_spans(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of half-open intervals [start, end) as sorted, disjoint intervals. Empty or inverted spans drop out."""
    ordered = sorted((float(s), float(e)) for s, e in spans if e > s)
    merged: list[tuple[float, float]] = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def union_length(spans: Iterable[tuple[float, float]]) -> float:
    return float(sum(e - s for s, e in merge_spans(spans)))


def clip_spans(spans: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]


def busy_fraction(compute_spans: Iterable[tuple[float, float]], wall_start: float, wall_end: float) -> float:
    """Union of compute spans inside [wall_start, wall_end] divided by the wall time (0..1)."""
    wall = wall_end - wall_start
    if wall <= 0:
        return math.nan
    return union_length(clip_spans(compute_spans, wall_start, wall_end)) / wall


def overlap_concurrency(spans: Iterable[tuple[float, float]]) -> float:
    """Sum of span lengths over the length of their union: 1.0 means no overlap, 2.0 two at a time on average."""
    items = [(float(s), float(e)) for s, e in spans if e > s]
    union = union_length(items)
    return math.nan if union == 0 else sum(e - s for s, e in items) / union


def time_average_in_flight(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Mean number of intervals open at a time over [lo, hi] (integral of the count, clipped, over the length)."""
    if hi <= lo:
        return math.nan
    return sum(e - s for s, e in clip_spans(intervals, lo, hi)) / (hi - lo)


@dataclass(frozen=True)
class LittleCheck(Artifact):
    """Little's law: throughput x mean latency should equal the mean number of requests in flight."""

    throughput_per_ms: float
    mean_latency_ms: float
    predicted_in_flight: float
    measured_in_flight: float
    relative_error: float
    ok: bool
    configured_in_flight: int | None = None  # closed loop: requests the dispatcher keeps outstanding


def littles_law_check(
    intervals: Sequence[tuple[float, float]], lo: float, hi: float, tolerance: float = 0.10
) -> LittleCheck:
    """Check L = lambda * W over the window [lo, hi].

    ``intervals`` are (arrival, completion) per request. lambda counts completions inside the window, W is the mean
    latency of those requests, L is integrated directly from the intervals clipped to the window.
    """
    done = [(a, c) for a, c in intervals if lo <= c <= hi]
    width = hi - lo
    lam = len(done) / width if width > 0 else math.nan
    mean_latency = float(np.mean([c - a for a, c in done])) if done else math.nan
    predicted = lam * mean_latency
    measured = time_average_in_flight(intervals, lo, hi)
    rel = abs(predicted - measured) / measured if measured and not math.isnan(measured) else math.nan
    return LittleCheck(lam, mean_latency, predicted, measured, rel, bool(rel <= tolerance))


def window_throughputs(completion_times: Sequence[float], start: float, window: float, n_windows: int) -> list[float]:
    """Completions per unit time in consecutive windows [start + i*window, start + (i+1)*window)."""
    times = np.asarray(completion_times, dtype=np.float64)
    edges = start + window * np.arange(n_windows + 1)
    counts, _ = np.histogram(times, bins=edges)
    return [float(c) / window for c in counts]


THROUGHPUT_BLOCKS = 20  # sub-windows of the measured span whose sample counts the throughput bootstrap resamples
THROUGHPUT_CI_HOW = (
    f"bootstrap 95% interval: 1,000 resamples of the samples completed in {THROUGHPUT_BLOCKS} equal sub-windows of "
    "the measured span"
)


def throughput_interval(
    completion_times: Sequence[float] | np.ndarray,
    start: float,
    stop: float,
    *,
    blocks: int = THROUGHPUT_BLOCKS,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """A bootstrap interval of throughput (completions per unit time over [start, stop)), by batch means.

    The span is cut into ``blocks`` equal sub-windows; the completions counted in each are resampled with replacement
    and the interval is the percentile interval of their mean over one sub-window's length. Sub-windows rather than
    single completions: completions of one run are not independent (a slow batch delays the next), whole sub-windows
    nearly are. NaNs when the span is empty or holds no completion.
    """
    width = stop - start
    times = np.asarray(completion_times, dtype=np.float64)
    if not width > 0 or blocks < 2 or times.size == 0:
        return (math.nan, math.nan)
    counts, _ = np.histogram(times, bins=start + width / blocks * np.arange(blocks + 1))
    if counts.sum() == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = counts[rng.integers(0, blocks, size=(n_resamples, blocks))].mean(axis=1) / (width / blocks)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return (float(low), float(high))


def is_stable(values: Sequence[float], last: int = 3, tolerance: float = 0.10) -> bool:
    """True when the last ``last`` values all lie within +-tolerance of their mean (perf_analyzer's rule)."""
    if len(values) < last:
        return False
    tail = np.asarray(values[-last:], dtype=np.float64)
    mean = float(tail.mean())
    if mean <= 0:
        return False
    return bool(np.all(np.abs(tail - mean) <= tolerance * mean))


def summarize(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {"mean": math.nan, "median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "mean": float(data.mean()),
        "median": float(np.median(data)),
        "min": float(data.min()),
        "max": float(data.max()),
        "n": int(data.size),
    }
