"""Weight rounding by GPTQ: quantized weights chosen for the layer's output on calibration data, not one by one.

Nearest rounding makes each weight's own error small; the layer's output error is the sum of those errors weighted
by the inputs they multiply. GPTQ (Frantar et al., ICLR 2023, "OPTQ") rounds the input channels of a weight one at a
time and moves each rounding error onto the channels not yet rounded, through the inverse of the layer's input
second-moment matrix ``H = X^T X`` (the Optimal Brain Surgeon update), so the output ``W X`` moves as little as
possible. The scale and the grid stay those of nearest rounding (per output channel, INT8 or E4M3), so the result is a
plain Q/DQ model: its float weights sit exactly on their grid and TensorRT quantizes them without change.

Measured 2026-12-05 (``bench/calibrate.py --fp8-quality --gptq``, 64 calibration samples): EfficientNet-Lite0's
all-INT8 top-1 agreement with FP32 on 1,000 crops 0.907 -> 0.946, all-FP8 0.844 -> 0.880; MiniLM a little better;
ocr-rec **worse** (exact match 0.983 -> 0.890, though every layer's held-out output error falls). So it is asked for
(``--weight-rounding gptq``) or chosen on the task metric (``auto``, :mod:`workbench.calib.rounding_choice`), never
assumed.

Written here, not taken from a library: GPTQ's public implementations (AutoGPTQ, ModelOpt, NNCF's weight compression)
are PyTorch/OpenVINO code for LLM linear layers at 2-4 bits; ours are ONNX Convs (grouped and depthwise included),
Gemms and MatMuls at 8 bits on ONNX Runtime activations, a few dozen lines of numpy over the reference algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from workbench.calib.fp8 import QuantFormat, fake_quantize_as
from workbench.calib.paired import gained_and_lost, paired_half_width, sign_test_p
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import onnx

# GPTQ's damping: a fraction of the mean diagonal added to H so that it can be inverted (the reference's percdamp)
DAMPING = 0.01
# im2col chunks are built in float32 up to this many values (the early layers' windows would not fit at once)
CHUNK_VALUES = 16_000_000
ROUNDABLE_OPS = ("Conv", "Gemm", "MatMul")
# GPTQ's rounding is kept when it lowers the held-out output error by at least this much (else nearest)
MIN_GAIN_DB = 0.5
MAX_HESSIAN_BYTES = 2 * 2**30  # all layers' Hessians held at once while the calibration data stream through
BLOCK = 128  # columns rounded one by one before their errors are moved onto the rest at once
WeightRounding = Literal["nearest", "gptq"]
InputNoise = tuple[str, float]  # how a layer's input is quantized: ("int8" or "fp8", its per-tensor scale)
WEIGHT_ROUNDINGS: tuple[WeightRounding, ...] = ("nearest", "gptq")
# what a user may ask for: a rounding, or auto (measured per plan: workbench.calib.rounding_choice)
WeightRoundingChoice = Literal["auto", "nearest", "gptq"]
WEIGHT_ROUNDING_CHOICES: tuple[WeightRoundingChoice, ...] = ("auto", "nearest", "gptq")
WEIGHT_ROUNDING_LABELS: dict[WeightRoundingChoice, str] = {
    "auto": "auto (measured)",
    "nearest": "nearest",
    "gptq": "GPTQ",
}
# GPTQ is kept by weight rounding auto only when its paired task-metric gain's interval at this level is above zero
ROUNDING_CONFIDENCE = 0.95


def check_weight_rounding(value: object) -> WeightRounding:
    if value not in WEIGHT_ROUNDINGS:
        raise WorkbenchError(f"weight rounding {value!r} is not known.", expected=" or ".join(WEIGHT_ROUNDINGS))
    return value  # type: ignore[return-value]  # checked against the literal's values just above


@dataclass(frozen=True)
class LayerInput:
    """How a weight meets its input: ``groups`` Hessians of ``columns`` x ``columns`` (one for a Gemm/MatMul or a
    plain Conv, one per group for a grouped or depthwise Conv), summed over calibration samples."""

    weight: str
    op: str
    hessian: np.ndarray  # (groups, columns, columns), float64, from the even calibration batches: GPTQ fits on it
    check: np.ndarray  # the same from the odd batches: held out, to judge the rounding on data it was not fitted to
    rows: int  # calibration rows (samples x output positions) behind ``hessian``
    check_rows: int  # and behind ``check``


@dataclass(frozen=True)
class LayerRounding:
    """One weight's output error (SQNR in dB on the held-out calibration batches) with nearest rounding and with the
    rounding shipped (GPTQ's when it gained at least :data:`MIN_GAIN_DB` there, else nearest: equal numbers)."""

    weight: str
    fmt: str
    nearest_db: float
    gptq_db: float

    def to_json(self) -> dict[str, object]:
        return {"weight": self.weight, "format": self.fmt, "nearest_db": self.nearest_db, "gptq_db": self.gptq_db}


def _attributes(node: object) -> dict[str, object]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}  # type: ignore[attr-defined]


def _conv_windows(x: np.ndarray, attrs: Mapping[str, object], kernel: tuple[int, ...]) -> np.ndarray:
    """(N, C, *spatial) -> a view (N, C, *out_spatial, *kernel) of the padded input's sliding windows."""
    spatial = len(kernel)
    pads = list(attrs.get("pads", [0] * (2 * spatial)))  # type: ignore[call-overload]
    strides = list(attrs.get("strides", [1] * spatial))  # type: ignore[call-overload]
    dilations = list(attrs.get("dilations", [1] * spatial))  # type: ignore[call-overload]
    padded = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + spatial]) for i in range(spatial)])
    extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    axes = tuple(range(2, 2 + spatial))
    windows = np.lib.stride_tricks.sliding_window_view(padded, extent, axis=axes)
    index = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
    index += tuple(slice(None, None, d) for d in dilations)
    return windows[index]


def _conv_hessian(x: np.ndarray, attrs: Mapping[str, object], weight_shape: tuple[int, ...]) -> np.ndarray:
    groups = int(attrs.get("group", 1))  # type: ignore[call-overload]
    kernel = tuple(int(k) for k in weight_shape[2:])
    windows = _conv_windows(x, attrs, kernel)  # N, C, *out, *k
    n, channels = windows.shape[:2]
    spatial = len(kernel)
    per_group = channels // groups
    columns = per_group * int(np.prod(kernel))
    # columns = (C/g, *k) in the weight's own order; the samples (N x out positions) last, so the copy reads rows of
    # the input that are contiguous (4.5x faster on EfficientNet-Lite0's first depthwise conv than samples first,
    # where each sample's k x k taps were gathered a few floats at a time; the same sums, bit for bit)
    grouped = windows.reshape(n, groups, per_group, *windows.shape[2:])
    order = (1, 2, *range(3 + spatial, 3 + 2 * spatial), 0, *range(3, 3 + spatial))
    hessian = np.zeros((groups, columns, columns))
    rows_per_group = int(np.prod(windows.shape[2 : 2 + spatial])) * n
    group_chunk = max(1, CHUNK_VALUES // max(1, rows_per_group * columns))
    for start in range(0, groups, group_chunk):
        part = grouped[:, start : start + group_chunk].transpose(order)
        cols = np.ascontiguousarray(part, dtype=np.float32).reshape(part.shape[0], columns, -1)
        hessian[start : start + group_chunk] += np.matmul(cols, cols.transpose(0, 2, 1)).astype(np.float64)
    return hessian


def _matmul_rows(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).reshape(-1, x.shape[-1])


def _hessian_bytes(node: object, shape: tuple[int, ...]) -> int:
    """Both halves' Hessians of one layer in float64: groups x columns^2 x 8 bytes x 2."""
    if getattr(node, "op_type", "") == "Conv":
        groups = int(_attributes(node).get("group", 1))  # type: ignore[call-overload]
        columns = int(np.prod(shape[1:]))
    else:
        groups, columns = 1, int(shape[0])  # MatMul (K, N); a Gemm reads K of either layout: the larger bound
        columns = max(columns, int(shape[-1]))
    return groups * columns * columns * 16


Reader = tuple[str, "onnx.NodeProto", tuple[int, ...]]  # (weight, the node that reads it, the weight's shape)


def _within_memory(readers: list[Reader]) -> list[Reader]:
    """The layers whose Hessians fit :data:`MAX_HESSIAN_BYTES` together, in graph order; the rest keep nearest
    rounding, with a warning (a transformer's 4096-wide layers take 268 MB each)."""
    import warnings

    kept, total = [], 0
    for reader in readers:
        size = _hessian_bytes(reader[1], reader[2])
        if total + size <= MAX_HESSIAN_BYTES:
            kept.append(reader)
            total += size
    if len(kept) < len(readers):
        warnings.warn(
            f"GPTQ: {len(readers) - len(kept)} of {len(readers)} weighted layers keep nearest rounding: their input "
            f"Hessians would take more than {MAX_HESSIAN_BYTES / 2**30:.0f} GiB with the others.",
            stacklevel=3,
        )
    return kept


def layer_inputs(
    proto: object, feeds: Iterable[Mapping[str, np.ndarray]], weights: Iterable[str], *, what: str = "the model"
) -> dict[str, LayerInput]:
    """The input Hessian of every Conv/Gemm/MatMul that reads one of ``weights`` (initializer names) as its weight,
    from one ONNX Runtime pass of the FP32 ``proto`` over ``feeds``. Layers it cannot describe (a Gemm with
    ``transA``, a Conv with ``auto_pad``, an N-d MatMul weight) are left out: they keep nearest rounding."""

    from workbench.ort import cpu_session

    model: onnx.ModelProto = proto  # type: ignore[assignment]
    initializers = {i.name: i for i in model.graph.initializer}
    wanted = set(weights)
    readers: list[Reader] = []
    for node in model.graph.node:
        if node.op_type not in ROUNDABLE_OPS or len(node.input) < 2 or node.input[1] not in wanted:
            continue
        attrs = _attributes(node)
        shape = tuple(int(d) for d in initializers[node.input[1]].dims)
        if node.op_type == "Conv" and attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        if node.op_type == "Gemm" and int(attrs.get("transA", 0)):  # type: ignore[call-overload]
            continue
        if node.op_type in ("Gemm", "MatMul") and len(shape) != 2:
            continue
        readers.append((node.input[1], node, shape))
    readers = _within_memory(readers)
    if not readers:
        return {}
    names = list(dict.fromkeys(node.input[0] for _, node, _ in readers))
    session = cpu_session(model, extra_outputs=names, what=what)
    outputs = [o.name for o in session.get_outputs()]
    sums: dict[tuple[str, int], np.ndarray] = {}
    rows: dict[tuple[str, int], int] = {}
    for number, feed in enumerate(feeds):
        values = dict(zip(outputs, session.run(outputs, dict(feed))))
        for weight, node, shape in readers:
            x = values[node.input[0]]
            if node.op_type == "Conv":
                hessian = _conv_hessian(np.asarray(x, dtype=np.float32), _attributes(node), shape)
                count = int(np.prod(x.shape)) // x.shape[1] if x.ndim > 2 else x.shape[0]
            else:
                flat = _matmul_rows(x)
                hessian = (flat.T @ flat).astype(np.float64)[None]
                count = flat.shape[0]
            key = (weight, number % 2)
            sums[key] = sums[key] + hessian if key in sums else hessian
            rows[key] = rows.get(key, 0) + count
    ops = {weight: node.op_type for weight, node, _ in readers}
    return {
        w: LayerInput(w, ops[w], sums[(w, 0)], sums[(w, 1)], rows[(w, 0)], rows[(w, 1)])
        for w, half in sums
        if half == 0 and (w, 1) in sums  # one batch: nothing to hold out, no evidence GPTQ helps; nearest stays
    }


def _rows_view(weight: np.ndarray, op: str, axis: int, groups: int) -> np.ndarray:
    """The weight as (groups, rows per group, columns): rows are output channels, columns the inputs they read."""
    if op == "Conv":
        return weight.reshape(groups, weight.shape[0] // groups, -1)
    rows = np.moveaxis(weight, axis, 0)  # Gemm (N, K) with transB, MatMul/Gemm (K, N) -> (N, K)
    return rows.reshape(1, rows.shape[0], -1)


def _from_rows(rows: np.ndarray, op: str, axis: int, shape: tuple[int, ...]) -> np.ndarray:
    if op == "Conv":
        return rows.reshape(shape)
    moved = list(shape)
    moved.insert(0, moved.pop(axis))
    return np.moveaxis(rows.reshape(moved), 0, axis)


def _output_sqnr(weight: np.ndarray, quantized: np.ndarray, hessian: np.ndarray) -> float:
    """10 log10(|W X|^2 / |(W - Q) X|^2) over the calibration inputs, from H = X^T X per group."""
    error = weight - quantized
    signal = float((np.matmul(weight, hessian) * weight).sum())
    noise = float((np.matmul(error, hessian) * error).sum())
    return float(10 * np.log10(max(signal, 1e-30) / max(noise, 1e-30)))


def _with_input_noise(hessian: np.ndarray, rows: int, noise: InputNoise | None) -> np.ndarray:
    """``H + E[e^T e]`` for inputs that reach the layer quantized, ``X + e``: white rounding noise of variance
    ``step^2 / 12`` per value for INT8 (``rows`` values per column), ``x^2 * 2^-8 / 3`` for E4M3 (3 mantissa bits: a
    relative error uniform in +-2^-4)."""
    if noise is None:
        return hessian
    fmt, scale = noise
    index = np.arange(hessian.shape[1])
    noisy = hessian.copy()
    if fmt == "fp8":
        noisy[:, index, index] *= 1.0 + 2.0**-8 / 3.0
    else:
        noisy[:, index, index] += rows * scale * scale / 12.0
    return noisy


def _inverse_factor(damped: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor of each group's inverse damped Hessian; the identity for a group whose damped
    Hessian is not positive definite, which rounds that group to nearest (no error is moved between its columns).

    Measured: a randomly initialised MobileNetV2 exported from Hugging Face feeds its depthwise convolutions inputs of
    ~1e-21, whose products (~1e-42) fall below float32's normal range where the Hessian is summed; what is left of 2
    of 336 channels has a negative eigenvalue that damping by 1 % of the mean diagonal does not cover, and the whole
    calibration crashed."""
    try:
        return np.linalg.cholesky(np.linalg.inv(damped)).transpose(0, 2, 1)
    except np.linalg.LinAlgError:
        pass
    factor = np.broadcast_to(np.eye(damped.shape[1]), damped.shape).copy()
    for group, hessian in enumerate(damped):
        try:
            factor[group] = np.linalg.cholesky(np.linalg.inv(hessian)).T
        except np.linalg.LinAlgError:
            continue
    return factor


def gptq_round(
    weight: np.ndarray,
    scale: np.ndarray,
    axis: int,
    fmt: QuantFormat,
    layer: LayerInput,
    input_noise: InputNoise | None = None,
) -> tuple[np.ndarray, LayerRounding]:
    """``weight`` rounded by GPTQ onto the grid of ``scale`` (per output channel along ``axis``) in ``fmt``.

    Returns float32 values on the grid (fake-quantizing them again gives them back) and the layer's output SQNR
    with nearest rounding and with GPTQ. Columns whose input was zero on every calibration sample keep nearest
    rounding (their H row is zero: no error is moved onto or off them).

    ``input_noise``: the (format, scale) the layer's input is quantized with. GPTQ fitted to float inputs moves
    weight error into the directions the calibration inputs do not span; quantized inputs carry noise in every
    direction, which that error then amplifies (ocr-rec: logit error halved on float inputs, yet top-1 0.983 ->
    0.893 once the activations are quantized too). With the noise's covariance added to H the rounding minimises the
    error on the inputs the layer really gets."""
    weight = np.asarray(weight, dtype=np.float64)
    hessian = _with_input_noise(layer.hessian, layer.rows, input_noise)
    check = _with_input_noise(layer.check, layer.check_rows, input_noise)
    groups = hessian.shape[0]
    rows = _rows_view(weight, layer.op, axis, groups)  # (g, r, c)
    if rows.shape[2] != hessian.shape[1]:
        raise WorkbenchError(
            f"weight {layer.weight!r} has {rows.shape[2]} inputs per output channel but its Hessian "
            f"{hessian.shape[1]}.",
            expected="the Hessian of the layer that reads this weight (layer_inputs on the same model)",
        )
    row_scale = np.asarray(scale, dtype=np.float64).reshape(groups, rows.shape[1], 1)
    damped = hessian.copy()
    diagonal = np.diagonal(damped, axis1=1, axis2=2).copy()
    dead = diagonal <= 0
    mean_diagonal = np.where(dead, 0.0, diagonal).sum(axis=1) / np.maximum((~dead).sum(axis=1), 1)
    index = np.arange(damped.shape[1])
    damped[:, index, index] = np.where(dead, 1.0, diagonal) + DAMPING * mean_diagonal[:, None]
    # upper Cholesky factor of H^-1: row i holds the update of the not-yet-rounded columns after column i
    inverse_factor = _inverse_factor(damped)
    working = rows.copy()
    quantized = np.empty_like(rows)

    def quantize(column: np.ndarray) -> np.ndarray:
        return fake_quantize_as(column.astype(np.float32), row_scale.astype(np.float32), fmt).astype(np.float64)

    columns = rows.shape[2]
    for start in range(0, columns, BLOCK):  # GPTQ's lazy batches: errors reach later blocks in one matmul
        end = min(start + BLOCK, columns)
        errors = np.empty_like(working[:, :, start:end])
        for i in range(start, end):
            column = working[:, :, i : i + 1]
            q = quantize(column)
            quantized[:, :, i : i + 1] = q
            error = (column - q) / inverse_factor[:, i, i][:, None, None]
            errors[:, :, i - start : i - start + 1] = error
            working[:, :, i + 1 : end] -= error * inverse_factor[:, i : i + 1, i + 1 : end]
        if end < columns:
            working[:, :, end:] -= np.matmul(errors, inverse_factor[:, start:end, end:])
    nearest = quantize(rows)
    report = LayerRounding(
        weight=layer.weight,
        fmt=fmt,
        nearest_db=_output_sqnr(rows, nearest, check),
        gptq_db=_output_sqnr(rows, quantized, check),
    )
    # judged on the held-out batches: with few rows per column GPTQ fits the calibration data and loses elsewhere
    # (ocr-rec, 64 samples: +6.8 dB on the data it was fitted to, top-1 0.9833 -> 0.8300)
    if report.gptq_db < report.nearest_db + MIN_GAIN_DB:
        quantized = nearest
        report = LayerRounding(layer.weight, fmt, report.nearest_db, report.nearest_db)
    return _from_rows(quantized, layer.op, axis, tuple(weight.shape)).astype(np.float32), report


def gptq_gains(nearest_scores: Iterable[float], gptq_scores: Iterable[float], *, higher_is_better: bool) -> bool:
    """Whether GPTQ's per-sample task scores beat nearest rounding's on the same samples clearly: the paired gain's
    two-sided :data:`ROUNDING_CONFIDENCE` interval lies above zero (:func:`rounding_gain`) *and* an exact sign test
    on the samples that differ agrees (:func:`workbench.calib.paired.sign_test_p`; the normal interval alone passes 4
    samples gained of 4 that differ, or 2 of 2 with no spread). A tie, or a gain of a few samples that float
    differences between CPUs could flip, keeps nearest: the same command writes the same model on another machine,
    and nearest needs no extra pass and cannot fit the calibration data."""
    nearest, gptq = list(nearest_scores), list(gptq_scores)
    if not rounding_gain(nearest, gptq, higher_is_better=higher_is_better)[1] > 0:
        return False
    wins, losses = gained_and_lost(gptq, nearest, higher_is_better=higher_is_better)
    return sign_test_p(wins, losses) < 1.0 - ROUNDING_CONFIDENCE


def rounding_gain(
    nearest_scores: Iterable[float], gptq_scores: Iterable[float], *, higher_is_better: bool
) -> tuple[float, float, float]:
    """GPTQ's mean per-sample gain over nearest rounding and its paired :data:`ROUNDING_CONFIDENCE` interval (normal
    approximation, :func:`workbench.calib.paired.paired_half_width`): (mean, low, high); nan when the scores are
    missing or not on the same samples."""
    nearest, gptq = list(nearest_scores), list(gptq_scores)
    half = paired_half_width(gptq, nearest, ROUNDING_CONFIDENCE) if len(nearest) == len(gptq) else math.nan
    if math.isnan(half):
        return math.nan, math.nan, math.nan
    mean = float(np.mean(np.asarray(gptq, dtype=np.float64) - np.asarray(nearest, dtype=np.float64)))
    mean = mean if higher_is_better else -mean
    return mean, mean - half, mean + half
