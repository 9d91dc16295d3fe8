"""Range methods computed from a :class:`TensorHistogram` on demand (no data is re-read), and weight scales.

All methods return ``amax``; the int8 scale is ``amax / 127`` (symmetric, zero point 0, TensorRT's convention).
Algorithms follow NVIDIA's pytorch-quantization (``calib/histogram.py``), the public reference for TensorRT's
EntropyCalibrator2: percentile on the |x| CDF, KL divergence over 128 levels, and MSE over bin centres.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from workbench.calib.histogram import NUM_BINS, TensorHistogram
from workbench.errors import WorkbenchError

Method = Literal["max", "percentile", "entropy", "mse"]
METHODS: tuple[Method, ...] = ("max", "percentile", "entropy", "mse")
RoundingError = Literal["exact", "expected"]  # how mse_errors prices an in-range value (see there)
INT8_MAX = 127
ENTROPY_LEVELS = 128  # symmetric int8: sign bit + 7 magnitude bits
DEFAULT_PERCENTILE = 99.99
# Entropy (KL) calibration assumes most of the mass sits near zero. On a one-sided distribution with nothing near
# zero (values in [0.5, 1]) the KL search stops at its first candidate and clips everything: 99.7 % of the values on
# data in [0.1, 1], 99.9 % on one tensor of ocr-cls. The guard looks at a range only when it clips more than
# MAX_CLIPPED_FRACTION of the calibration values (measured 2026-12-05 on the zoo models with full calibration sets:
# entropy clips at most 0.8 % on digits-cnn, efficientnet-lite0 and minilm, 4.8 % on ocr-det, but up to 99.9 % on
# ocr-cls and 7.7 % on ocr-rec), and replaces it only when its mean squared quantization error over the histogram is
# more than FALLBACK_ERROR_RATIO times that of the mse range, which then is used: heavy clipping that KL chose for a
# reason and that costs little error stays.
MAX_CLIPPED_FRACTION = 0.05
FALLBACK_ERROR_RATIO = 2.0  # 3 dB of quantization SQNR
GUARDED_METHODS = ("entropy",)  # mse minimises that error itself; max never clips; percentile clips what it is told
# A tensor that is zero in every calibration batch (a dead ReLU) has no range; any positive scale represents its
# zeros exactly, and TensorRT and our cache need a positive one.
DEAD_TENSOR_AMAX = 1.0


def amax_max(hist: TensorHistogram) -> float:
    """Largest |x| seen (exact, from the running min/max rather than a bin edge)."""
    return hist.amax


def check_percentile(percentile: float) -> float:
    """``percentile`` when the percentile method can use it (0 < p <= 100), else a WorkbenchError."""
    if not (isinstance(percentile, (int, float)) and 0.0 < percentile <= 100.0):
        raise WorkbenchError(f"percentile {percentile} is out of range.", expected="a number in (0, 100], e.g. 99.99")
    return float(percentile)


def amax_percentile(hist: TensorHistogram, percentile: float = DEFAULT_PERCENTILE) -> float:
    """Upper edge of the bin where the |x| CDF first reaches ``percentile`` (in percent), capped at the true max."""
    check_percentile(percentile)
    counts = hist.total_counts
    total = counts.sum()
    if total == 0 or hist.width == 0.0:
        return hist.amax
    cdf = np.cumsum(counts) / total
    index = int(np.searchsorted(cdf, percentile / 100.0 - 1e-12))
    index = min(index, NUM_BINS - 1)
    return float(min((index + 1) * hist.width, hist.amax))


def _used_bins(hist: TensorHistogram) -> np.ndarray:
    counts = hist.total_counts.astype(np.float64)
    last = int(np.flatnonzero(counts)[-1]) + 1 if counts.any() else 0
    return counts[:last]


def entropy_divergences(hist: TensorHistogram, *, levels: int = ENTROPY_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """KL divergence D(P || Q) for every candidate threshold bin count ``i`` in [levels, used bins].

    Returns ``(candidates, divergences)``. For candidate ``i``: P = bins[:i] with all mass of bins[i:] added to
    P[i-1]; Q = bins[:i] merged into ``levels`` groups (bin j -> group floor(j*levels/i)), each group's count spread
    evenly over its non-empty bins, empty bins staying empty. As in pytorch-quantization, bin 0 is replaced by bin 1
    so that the spike of exact zeros after ReLU does not dominate the divergence.

    Closed form over prefix sums instead of materialising P and Q per candidate: with B the total count, S_k / N_k
    a group's count / non-empty bins and Q_i = sum(bins[:i]),
    D_i = sum_j p_j log p_j - sum_k (sum of p over group k) log(S_k / (N_k Q_i)); O(levels) per candidate, about 15x
    faster than the direct form. ``tests/test_calib_core.py`` checks it against a plain loop.
    """
    bins = _used_bins(hist)
    if bins.size <= levels:
        return np.array([bins.size], dtype=np.int64), np.zeros(1)
    bins = bins.copy()
    bins[0] = bins[1]
    n = bins.size
    nonzero = bins > 0
    cum = np.concatenate([[0.0], np.cumsum(bins)])
    cum_nonzero = np.concatenate([[0], np.cumsum(nonzero)])
    cum_blogb = np.concatenate([[0.0], np.cumsum(np.where(nonzero, bins * np.log(np.where(nonzero, bins, 1.0)), 0.0))])
    total = cum[n]
    candidates = np.arange(levels, n + 1, dtype=np.int64)
    k = np.arange(levels + 1, dtype=np.int64)
    starts = (k[None, :] * candidates[:, None] + levels - 1) // levels  # group k = bins [starts_k, starts_k+1)
    group_sum = cum[starts[:, 1:]] - cum[starts[:, :-1]]
    group_nonzero = (cum_nonzero[starts[:, 1:]] - cum_nonzero[starts[:, :-1]]).astype(np.float64)
    q_total = cum[candidates]
    tail = total - q_total
    last = bins[candidates - 1]
    p_last = (last + tail) / total
    # sum_j p log p: every bin below i-1 as is, the last bin carrying the tail
    head = (cum_blogb[candidates - 1] - np.log(total) * cum[candidates - 1]) / total
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy_p = head + np.where(p_last > 0, p_last * np.log(p_last), 0.0)
        weight = group_sum / total
        weight[:, -1] += np.where(last > 0, tail / total, 0.0)
        log_q = np.log(group_sum / (group_nonzero * q_total[:, None]))
        cross = np.where(group_sum > 0, weight * log_q, 0.0).sum(axis=1)
    divergences = entropy_p - cross
    divergences[(last == 0) & (tail > 0)] = np.inf  # the tail lands on an empty bin that Q keeps at zero
    return candidates, divergences


def amax_entropy(hist: TensorHistogram, *, levels: int = ENTROPY_LEVELS) -> float:
    """TensorRT-style entropy calibration: the threshold minimising KL(P||Q); the last minimum wins on ties."""
    if hist.width == 0.0:
        return hist.amax
    candidates, divergences = entropy_divergences(hist, levels=levels)
    best = int(len(divergences) - 1 - np.argmin(divergences[::-1]))
    return float(min(candidates[best] * hist.width, hist.amax))


def mse_errors(
    hist: TensorHistogram,
    *,
    start_bin: int = 8,
    samples_per_bin: int = 4,
    chunk: int = 64,
    candidate_bins: np.ndarray | None = None,
    grid: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    rounding: RoundingError = "exact",
) -> tuple[np.ndarray, np.ndarray]:
    """Mean squared fake-quantization error of the histogram for candidate amax values (bin edges).

    Each bin's mass is spread over ``samples_per_bin`` evenly spaced points inside the bin rather than put on its
    centre: when one outlier stretches the range, the data sit in a few wide bins and centre-only estimates (as in
    pytorch-quantization) mistake the bin grid for the quantization grid. ``candidate_bins`` (upper-edge indices)
    defaults to every edge from ``start_bin``. ``grid(points, amax)`` fake-quantizes points [candidates, n] for
    amax [candidates, 1]; the default is the symmetric int8 grid (FP8 passes its own, :mod:`workbench.calib.fp8`).
    ``rounding="expected"`` (int8 grid only): each value inside the range costs the rounding error it has on average
    over the grid's phase, min(x^2, step^2 / 12) (values under half a step round to zero, which is on every grid),
    and clipped values their exact error (:func:`_expected_int8_errors`).
    """
    if rounding not in ("exact", "expected"):
        raise WorkbenchError(f"rounding error {rounding!r} is not a choice.", expected="'exact' or 'expected'")
    if rounding == "expected" and grid is not None:
        raise WorkbenchError("the expected rounding error is the uniform int8 grid's.", expected="grid=None")
    counts = _used_bins(hist)
    offsets = (np.arange(samples_per_bin, dtype=np.float64) + 0.5) / samples_per_bin
    points = ((np.arange(counts.size, dtype=np.float64)[:, None] + offsets[None, :]) * hist.width).ravel()
    weights = np.repeat(counts / samples_per_bin, samples_per_bin)
    keep = weights > 0
    points, weights = points[keep], weights[keep]
    if candidate_bins is None:
        first = min(start_bin, max(counts.size - 1, 1))
        candidate_bins = np.arange(first, counts.size + 1)
    candidate_amax = np.asarray(candidate_bins, dtype=np.float64) * hist.width
    errors = np.empty(candidate_amax.size, dtype=np.float64)
    total = weights.sum()
    for start in range(0, candidate_amax.size, chunk):
        amax = candidate_amax[start : start + chunk, None]
        if rounding == "expected":
            squared = _expected_int8_errors(points[None, :], amax)
        else:
            squared = ((grid or _int8_grid)(points[None, :], amax) - points[None, :]) ** 2
        errors[start : start + chunk] = (squared @ weights) / total
    return candidate_amax, errors


def _expected_int8_errors(points: np.ndarray, amax: np.ndarray) -> np.ndarray:
    """Squared int8 quantization error of each |x| in ``points`` [1, n] for each ``amax`` [candidates, 1], with the
    rounding error of an in-range value taken over the grid's phase (``step^2 / 12``) instead of at this grid.

    Why: the exact error of a value that many samples share (a text line's background after a convolution: one bin
    holding 6 % of ocr-rec's ``batch_norm_2.tmp_2``) swings between 0 and step^2 / 4 as amax moves by a fraction of
    a step, so the exact minimum is wherever the grid happens to land on that value. Which amax that is changes
    with the calibration set (ocr-rec's range was 16.94 from 64 lines and 15.0 from 128; all-INT8 exact match on
    1,000 lines 0.972 and 0.954, FP32 0.979) and does not carry to other inputs; with the expected error the two sets
    give 15.97 and 15.61 (2026-12-06, ``bench/calibrate.py --mse-rounding``). Values under half a step round to zero
    exactly, so they keep their own error."""
    step = amax / INT8_MAX
    inside = np.minimum(points**2, step**2 / 12.0)
    return np.where(points > amax, (points - amax) ** 2, inside)


def _int8_grid(points: np.ndarray, amax: np.ndarray) -> np.ndarray:
    scale = amax / INT8_MAX
    return np.clip(np.rint(points / scale), -INT8_MAX, INT8_MAX) * scale


def amax_mse(
    hist: TensorHistogram,
    *,
    start_bin: int = 8,
    coarse: int = 256,
    grid: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    rounding: RoundingError | None = None,
) -> float:
    """Candidate amax (a bin edge) with the smallest mean squared fake-quantization error.

    Coarse-to-fine: about ``coarse`` evenly spaced edges first, then every edge within one coarse step of the best
    (the error curve is smooth at that scale); ~7x fewer evaluations than trying all 2048 edges. ``grid``: as in
    :func:`mse_errors` (int8 by default). ``rounding``: as in :func:`mse_errors`; by default ``"expected"`` on the
    int8 grid (the range no longer hangs on where the grid lands on one frequent value) and ``"exact"`` on a grid
    passed in (FP8's steps grow with the value, so its rounding error is its own).
    """
    rounding = rounding or ("expected" if grid is None else "exact")
    if hist.width == 0.0 or hist.count == 0:
        return hist.amax
    used = _used_bins(hist).size
    first = min(start_bin, max(used - 1, 1))
    step = max(1, -(-(used - first) // coarse))
    edges = np.unique(np.concatenate([np.arange(first, used + 1, step), [used]]))
    candidates, errors = mse_errors(hist, candidate_bins=edges, grid=grid, rounding=rounding)
    best = int(round(candidates[int(np.argmin(errors))] / hist.width))
    if step > 1:
        fine = np.arange(max(first, best - step), min(used, best + step) + 1)
        candidates, errors = mse_errors(hist, candidate_bins=fine, grid=grid, rounding=rounding)
    return float(min(candidates[int(np.argmin(errors))], hist.amax))


def compute_amax(hist: TensorHistogram, method: Method, *, percentile: float = DEFAULT_PERCENTILE) -> float:
    """Dispatch to one method by name."""
    functions: dict[str, Callable[[TensorHistogram], float]] = {
        "max": amax_max,
        "percentile": lambda h: amax_percentile(h, percentile),
        "entropy": amax_entropy,
        "mse": amax_mse,
    }
    if method not in functions:
        raise WorkbenchError(f"unknown calibration method {method!r}.", expected=" / ".join(METHODS))
    return functions[method](hist)


def clipped_fraction(hist: TensorHistogram, amax: float) -> float:
    """Share of the histogram's values whose |x| lies wholly above ``amax`` (bins starting at or past it)."""
    counts = hist.total_counts
    total = int(counts.sum())
    if total == 0 or hist.width == 0.0 or amax >= hist.amax:
        return 0.0
    first_clipped = int(np.ceil(amax / hist.width - 1e-9))
    return float(counts[first_clipped:].sum() / total) if first_clipped < NUM_BINS else 0.0


@dataclass(frozen=True)
class RangeChoice:
    """The amax used for one tensor, the share of its calibration values it clips, and why it is not the method's
    own choice when it is not (``note`` empty otherwise)."""

    amax: float
    clipped: float
    note: str = ""


def quantization_errors(hist: TensorHistogram, amax_values: list[float]) -> np.ndarray:
    """Mean squared fake-quantization error of the histogram's data for each amax (any values, not only edges)."""
    if hist.width == 0.0:
        return np.zeros(len(amax_values))
    bins = np.asarray(amax_values, dtype=np.float64) / hist.width
    return mse_errors(hist, candidate_bins=bins)[1]


def guarded_amax(hist: TensorHistogram, method: Method, *, percentile: float = DEFAULT_PERCENTILE) -> RangeChoice:
    """``compute_amax`` checked against the data: a dead tensor gets a valid amax, and an entropy range that clips
    more than ``MAX_CLIPPED_FRACTION`` of the values with more than ``FALLBACK_ERROR_RATIO`` times the quantization
    error of the mse range is replaced by the mse range."""
    if hist.amax == 0.0 or not np.isfinite(hist.amax):
        seen = "no finite value" if hist.count == 0 else f"zero in all {hist.count} values"
        return RangeChoice(
            DEAD_TENSOR_AMAX,
            0.0,
            f"{seen} over the calibration set (a dead tensor): amax {DEAD_TENSOR_AMAX} stands in, "
            "any positive scale represents zero exactly",
        )
    amax = compute_amax(hist, method, percentile=percentile)
    clipped = clipped_fraction(hist, amax)
    if method in GUARDED_METHODS and clipped > MAX_CLIPPED_FRACTION:
        fallback = amax_mse(hist)
        chosen_error, fallback_error = quantization_errors(hist, [amax, fallback])
        if chosen_error > FALLBACK_ERROR_RATIO * fallback_error:
            ratio_db = 10.0 * np.log10(chosen_error / fallback_error) if fallback_error > 0 else float("inf")
            return RangeChoice(
                fallback,
                clipped_fraction(hist, fallback),
                f"{method} chose amax {amax:.4g}, which clips {clipped:.1%} of the calibration values "
                f"(data in [{hist.minimum:.4g}, {hist.maximum:.4g}]); the mse range {fallback:.4g} is used instead "
                f"({ratio_db:.1f} dB less quantization error)",
            )
    return RangeChoice(amax, clipped)


def per_channel_amax(weight: np.ndarray, axis: int) -> np.ndarray:
    """Max |w| per output channel along ``axis`` (0 for Conv and Gemm with transB, 1 for ConvTranspose and MatMul)."""
    weight = np.asarray(weight, dtype=np.float32)
    if weight.ndim == 0:
        return np.abs(weight).reshape(1)
    axis = axis % weight.ndim
    reduce_axes = tuple(a for a in range(weight.ndim) if a != axis)
    return np.abs(weight).max(axis=reduce_axes) if reduce_axes else np.abs(weight)


def positive_scale(scale: np.ndarray) -> np.ndarray:
    """``scale`` raised to float32's smallest normal number where it fell below (TensorRT's parser refuses a zero
    scale, and ONNX Runtime divides by it): an amax of ~1e-40, measured on a randomly initialised Hugging Face
    MobileViT, divided by 127 underflowed to a scale of 0. Values that small quantize to 0 either way."""
    return np.maximum(scale, np.finfo(np.float32).tiny).astype(np.float32)


def scale_from_amax(amax: np.ndarray | float) -> np.ndarray:
    """Symmetric int8 scale, strictly positive as TensorRT requires (an all-zero tensor gets scale 1/127)."""
    amax_array = np.asarray(amax, dtype=np.float32)
    safe = np.where(amax_array > 0, amax_array, np.float32(1.0))
    return positive_scale(safe / np.float32(INT8_MAX))


def fake_quantize(values: np.ndarray, scale: np.ndarray | float, axis: int | None = None) -> np.ndarray:
    """Quantize then dequantize like TensorRT / ONNX QuantizeLinear: round half to even, clamp to [-128, 127]."""
    values = np.asarray(values, dtype=np.float32)
    scale_array = np.asarray(scale, dtype=np.float32)
    if axis is not None and scale_array.ndim == 1 and values.ndim > 1:
        shape = [1] * values.ndim
        shape[axis % values.ndim] = scale_array.size
        scale_array = scale_array.reshape(shape)
    return (np.clip(np.rint(values / scale_array), -128, 127) * scale_array).astype(np.float32)
