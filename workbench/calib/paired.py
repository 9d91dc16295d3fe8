"""Paired comparisons of two variants scored on the same samples: the normal interval of the mean per-sample
difference and an exact sign test on the samples that differ. The confidence-bounded search (a plan against FP32),
its early stops (a trial against the current plan, grid alignment against none) and weight rounding ``auto`` (GPTQ
against nearest) all decide with these."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Scores = Sequence[float] | np.ndarray  # per-sample scores, as a metric gives them or as an array

# a target is met at the worst end of the plan's paired interval at this level, not by a point estimate that a few
# samples, or another CPU's float rounding, could move (None: the point estimate decides). The accuracy-target search
# and the quickstart's engine rule both decide at it, so the engine the journey picks is the one its search calls met.
DEFAULT_CONFIDENCE = 0.95


def paired_half_width(scores: Scores, reference_scores: Scores, confidence: float, samples: int | None = None) -> float:
    """Half the two-sided ``confidence`` interval (normal approximation) of the mean per-sample difference between
    ``scores`` and ``reference_scores`` (e.g. a plan's and FP32's) on the same samples, for ``samples`` of them
    (default: as many as were scored; a screen's spread projected onto the whole set); nan when the scores are
    missing or not on the same samples."""
    from statistics import NormalDist

    plan = np.asarray(scores, dtype=np.float64)
    reference = np.asarray(reference_scores[: plan.size], dtype=np.float64)
    if plan.size < 2 or reference.size != plan.size:
        return math.nan
    spread = float((plan - reference).std(ddof=1))
    return NormalDist().inv_cdf(0.5 + confidence / 2) * spread / math.sqrt(samples or plan.size)


def paired_interval(scores: Scores, reference_scores: Scores, confidence: float) -> tuple[float, float]:
    """(mean per-sample difference ``scores - reference_scores``, :func:`paired_half_width` at ``confidence``) on the
    same samples: the interval the search's target and the quickstart's engine rule both decide on; (nan, nan) when
    the scores are missing or not on the same samples."""
    half = paired_half_width(scores, reference_scores, confidence)
    if math.isnan(half):
        return math.nan, math.nan
    plan = np.asarray(scores, dtype=np.float64)
    return float(np.mean(plan - np.asarray(reference_scores[: plan.size], dtype=np.float64))), half


def paired_bound(scores: Scores, fp32_scores: Scores, fp32_metric: float, confidence: float, higher: bool) -> float:
    """The worst end of a plan's metric at ``confidence``: FP32's metric plus the mean per-sample difference to FP32,
    less (plus, for lower-is-better) :func:`paired_half_width`. Paired, so samples both get wrong cost nothing; nan
    when the per-sample scores are missing or not on the same samples."""
    mean, half = paired_interval(scores, fp32_scores, confidence)
    return float(fp32_metric + mean - half if higher else fp32_metric + mean + half)


def gained_and_lost(
    scores: Sequence[float], reference_scores: Sequence[float], *, higher_is_better: bool
) -> tuple[int, int]:
    """How many samples ``scores`` are better and worse on than ``reference_scores`` (same samples; ties left out)."""
    gain = np.asarray(scores, dtype=np.float64) - np.asarray(reference_scores, dtype=np.float64)
    gain = gain if higher_is_better else -gain
    return int((gain > 0).sum()), int((gain < 0).sum())


def sign_test_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the chance of a split at least this uneven between ``wins`` and ``losses`` when
    either side is equally likely (ties left out)."""
    total = wins + losses
    if total == 0:
        return 1.0
    tail = sum(math.comb(total, k) for k in range(min(wins, losses) + 1))
    return min(1.0, 2.0 * tail / 2.0**total)
