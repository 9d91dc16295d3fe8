"""FP8 (E4M3FN) quantization: its grid, scales, fake quantization and ranges, next to INT8's.

E4M3FN (ONNX ``FLOAT8E4M3FN``, TensorRT ``FP8``): 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities,
largest finite value 448, smallest subnormal 2^-9. TensorRT's FP8 Q/DQ is symmetric with zero point 0 and scale
``amax / 448``; QuantizeLinear rounds ``x / scale`` to the nearest representable value (ties to even) and saturates
at ±448 (``saturate=1``, the ONNX default). Values are cast with ``ml_dtypes`` (the package ONNX itself uses for its
8-bit float types), so the arithmetic here is the one ONNX Runtime runs; ``tests/test_fp8.py`` checks both against an
independent bit-level reference.

Ranges: activations per tensor, weights per output channel, as for INT8. ``max`` and ``percentile`` do not depend on
the grid; ``mse`` searches the amax whose fake quantization **on the FP8 grid** has the least squared error (its
error curve differs from INT8's: FP8's relative step is constant, so clipping costs more and rounding less).
``entropy`` (KL over 128 uniform levels) is INT8's own and is not offered for FP8.

Weight scales (:func:`fp8_weight_scales`): per output channel, the scale within one binade above ``amax / 448`` with
the least E4M3 rounding error (E4M3's relative grid makes ``amax / 448`` no better than any other point of that
binade; on EfficientNet-Lite0's depthwise filters the search gains 3 to 9 dB of weight SQNR and lifts all-FP8 top-1
agreement on 256 images from 0.7109 to 0.7773). What FP8 places where (attention MatMuls, the stem kept FP16) is in
:mod:`workbench.precision.qdq_rules`.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from workbench.calib.histogram import TensorHistogram
from workbench.calib.methods import (
    DEFAULT_PERCENTILE,
    INT8_MAX,
    amax_mse,
    compute_amax,
    fake_quantize,
    positive_scale,
    scale_from_amax,
)
from workbench.calib.stats import CalibrationRanges, CalibrationStatistics
from workbench.errors import WorkbenchError

E4M3_MAX = 448.0
# QuantizeLinear/DequantizeLinear take FLOAT8E4M3FN from opset 19 on (ONNX Runtime 1.32 CPU runs 19 and 21)
FP8_MIN_OPSET = 19
FP8_MIN_IR_VERSION = 9

QuantFormat = Literal["int8", "fp8"]
QUANT_FORMATS: tuple[QuantFormat, ...] = ("int8", "fp8")
FORMAT_MAX: dict[QuantFormat, float] = {"int8": float(INT8_MAX), "fp8": E4M3_MAX}
FP8_METHODS = ("max", "percentile", "mse")
DEFAULT_FP8_METHOD = "mse"


def check_format(value: object, where: str = "quantization format") -> QuantFormat:
    if value not in QUANT_FORMATS:
        raise WorkbenchError(f"{where} {value!r} is not a quantized format.", expected=" / ".join(QUANT_FORMATS))
    return value  # type: ignore[return-value]  # checked against the literal's values just above


def round_to_e4m3(values: np.ndarray) -> np.ndarray:
    """``values`` (float32) rounded onto the E4M3FN grid: nearest, ties to even, saturating at ±448; NaN stays NaN."""
    import ml_dtypes

    clipped = np.clip(np.asarray(values, dtype=np.float32), -E4M3_MAX, E4M3_MAX)
    return clipped.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def fp8_scale_from_amax(amax: np.ndarray | float) -> np.ndarray:
    """FP8 scale ``amax / 448``, strictly positive as TensorRT requires (an all-zero tensor gets 1/448)."""
    amax_array = np.asarray(amax, dtype=np.float32)
    safe = np.where(amax_array > 0, amax_array, np.float32(1.0))
    return positive_scale(safe / np.float32(E4M3_MAX))


def scale_for(amax: np.ndarray | float, fmt: QuantFormat) -> np.ndarray:
    """The Q/DQ scale of ``amax`` in ``fmt``."""
    return fp8_scale_from_amax(amax) if check_format(fmt) == "fp8" else scale_from_amax(amax)


def _broadcast_scale(values: np.ndarray, scale: np.ndarray | float, axis: int | None) -> np.ndarray:
    scale_array = np.asarray(scale, dtype=np.float32)
    if axis is not None and scale_array.ndim == 1 and values.ndim > 1:
        shape = [1] * values.ndim
        shape[axis % values.ndim] = scale_array.size
        scale_array = scale_array.reshape(shape)
    return scale_array


def fake_quantize_fp8(values: np.ndarray, scale: np.ndarray | float, axis: int | None = None) -> np.ndarray:
    """Quantize to E4M3FN and back, as QuantizeLinear (saturate) then DequantizeLinear do: ``q(x / s) * s``."""
    values = np.asarray(values, dtype=np.float32)
    scale_array = _broadcast_scale(values, scale, axis)
    return (round_to_e4m3(values / scale_array) * scale_array).astype(np.float32)


def fake_quantize_as(
    values: np.ndarray, scale: np.ndarray | float, fmt: QuantFormat, axis: int | None = None
) -> np.ndarray:
    """Fake quantization in ``fmt`` (int8: round half to even, clamp to [-128, 127]; fp8: E4M3FN)."""
    if check_format(fmt) == "fp8":
        return fake_quantize_fp8(values, scale, axis)
    return fake_quantize(values, scale, axis)


def _fp8_grid(points: np.ndarray, amax: np.ndarray) -> np.ndarray:
    scale = amax / E4M3_MAX
    return round_to_e4m3((points / scale).astype(np.float32)).astype(np.float64) * scale


def amax_mse_fp8(hist: TensorHistogram) -> float:
    """The amax with the least mean squared error of fake quantization on the FP8 grid (coarse-to-fine search)."""
    return amax_mse(hist, grid=_fp8_grid)


def amax_for(
    hist: TensorHistogram, method: str, fmt: QuantFormat = "int8", *, percentile: float = DEFAULT_PERCENTILE
) -> float:
    """One tensor's amax by ``method`` for ``fmt`` (FP8: max, percentile or MSE over the FP8 grid)."""
    if check_format(fmt) == "int8":
        return compute_amax(hist, method, percentile=percentile)  # type: ignore[arg-type]  # checked there
    if method not in FP8_METHODS:
        raise WorkbenchError(
            f"range method {method!r} is not offered for FP8 (entropy is INT8's KL over 128 uniform levels).",
            expected=" / ".join(FP8_METHODS),
        )
    if method == "mse":
        return amax_mse_fp8(hist)
    return compute_amax(hist, method, percentile=percentile)  # type: ignore[arg-type]  # max / percentile


def fp8_method_for(method: str) -> str:
    """The FP8 range method used when INT8 ranges were asked for with ``method`` (entropy has no FP8 form: MSE)."""
    return method if method in FP8_METHODS else DEFAULT_FP8_METHOD


def fp8_ranges(
    statistics: CalibrationStatistics, method: str = DEFAULT_FP8_METHOD, *, percentile: float = DEFAULT_PERCENTILE
) -> CalibrationRanges:
    """Per-tensor amax for FP8 Q/DQ from the statistics already gathered (no data is re-read)."""
    amax = {name: amax_for(hist, method, "fp8", percentile=percentile) for name, hist in statistics.histograms.items()}
    return CalibrationRanges(
        amax=amax,
        method=f"{method}-fp8",
        percentile=percentile if method == "percentile" else None,
        model_sha256=statistics.model_sha256,
        data_digest=statistics.data_digest,
        histogram_digests={name: hist.digest() for name, hist in statistics.histograms.items()},
        random_data=statistics.random_data,
        warnings=tuple(statistics.warnings),
        statistics=statistics,
    )


def fp8_ranges_like(ranges: CalibrationRanges) -> CalibrationRanges:
    """The FP8 counterpart of INT8 ``ranges``: same method on the FP8 grid (entropy becomes MSE); ranges without
    statistics (a TensorRT cache) are used as they are."""
    if ranges.method.endswith("-fp8") or ranges.statistics is None:
        return ranges
    return fp8_ranges(
        ranges.statistics, fp8_method_for(ranges.method), percentile=ranges.percentile or DEFAULT_PERCENTILE
    )


# Weight scales: E4M3's grid is the same in every binade, so moving the scale within one binade (a factor in [1, 2))
# changes only where each weight falls between two grid points, and no weight is clipped. With few weights per
# channel (a 3x3 depthwise filter has 9) that choice matters: the best of these factors has a much smaller error than
# amax / 448. Slight clipping (factors just below 1) is tried too.
WEIGHT_SCALE_FACTORS = 2.0 ** (np.arange(-4, 64) / 64.0)  # about 1 % apart, from 0.957 to 1.98 times amax / 448


def fp8_weight_scales(weight: np.ndarray, axis: int, *, method: str = "mse") -> np.ndarray:
    """Per-channel FP8 scales of ``weight`` along ``axis``: ``amax / 448`` (``method="max"``) or, by default, the
    scale with the least squared error of E4M3 fake quantization per channel among :data:`WEIGHT_SCALE_FACTORS`."""
    from workbench.calib.methods import per_channel_amax

    amax = per_channel_amax(weight, axis)
    base = fp8_scale_from_amax(amax)
    if method == "max":
        return base
    if method != "mse":
        raise WorkbenchError(f"FP8 weight scale method {method!r} is unknown.", expected="mse or max")
    values = np.asarray(weight, dtype=np.float32)
    if values.ndim == 0:
        return base
    rows = np.moveaxis(values, axis % values.ndim, 0).reshape(values.shape[axis % values.ndim], -1)
    best_error = np.full(rows.shape[0], np.inf)
    best = base.copy()
    for factor in WEIGHT_SCALE_FACTORS:
        scale = (base * np.float32(factor)).astype(np.float32)
        error = np.square(round_to_e4m3(rows / scale[:, None]) * scale[:, None] - rows).sum(axis=1, dtype=np.float64)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best = np.where(better, scale, best)
    return np.where(amax > 0, best, base).astype(np.float32)
