"""One streaming statistics pass (FP32 model under ONNX Runtime) and the ranges / cache computed from it.

Only the tensors that will need a scale are exposed as extra graph outputs; each batch's values are folded into
per-tensor histograms and dropped, so memory does not grow with the number of batches.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench._arrays import to_native
from workbench._io import write_json_atomic
from workbench.artifact import Artifact
from workbench.calib.data import RANDOM_DATA_WARNING, CalibrationSource, combine_digests, feed_digest
from workbench.calib.histogram import TensorHistogram
from workbench.calib.methods import DEFAULT_PERCENTILE, METHODS, Method, compute_amax, guarded_amax
from workbench.errors import WorkbenchError

CACHE_FORMAT = "trt-workbench-calibration-cache/1"


def _model_sha256(proto: Any) -> str:
    import hashlib

    return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()


@dataclass(frozen=True)
class CalibrationStatistics(Artifact):
    """Histograms of every tensor that needs a scale, and where they came from. Methods run on these on demand."""

    histograms: dict[str, TensorHistogram]
    model_sha256: str
    data_digest: str
    data_name: str
    num_batches: int
    num_samples: int
    seconds: float
    random_data: bool = False
    warnings: tuple[str, ...] = ()

    def ranges(
        self,
        method: Method = "mse",
        *,
        percentile: float = DEFAULT_PERCENTILE,
        overrides: Mapping[str, float] | None = None,
    ) -> CalibrationRanges:
        """Per-tensor amax by one method (no data is re-read); ``overrides`` pins chosen tensors' amax.

        Each range is checked against its histogram (:func:`~workbench.calib.methods.guarded_amax`): dead tensors get
        a valid amax and a range that clips most of the data falls back; both are named in ``range_notes`` and
        summed up in ``warnings``.
        """
        choices = {name: guarded_amax(hist, method, percentile=percentile) for name, hist in self.histograms.items()}
        amax = {name: choice.amax for name, choice in choices.items()}
        clipped = {name: choice.clipped for name, choice in choices.items()}
        notes = {name: choice.note for name, choice in choices.items() if choice.note}
        if overrides:
            amax.update({k: float(v) for k, v in overrides.items()})
            for name in overrides:
                notes.pop(name, None)
                clipped.pop(name, None)
        return CalibrationRanges(
            amax=amax,
            range_notes=notes,
            clipped=clipped,
            method=method,
            percentile=percentile if method == "percentile" else None,
            model_sha256=self.model_sha256,
            data_digest=self.data_digest,
            histogram_digests={name: hist.digest() for name, hist in self.histograms.items()},
            random_data=self.random_data,
            warnings=tuple(self.warnings) + range_warnings(notes),
            statistics=self,
        )

    def all_methods(self, name: str, *, percentile: float = DEFAULT_PERCENTILE) -> dict[str, float]:
        """Every method's amax for one tensor (for the histogram figure)."""
        hist = self.histograms[name]
        return {method: compute_amax(hist, method, percentile=percentile) for method in METHODS}


@dataclass(frozen=True)
class CalibrationRanges(Artifact):
    """Per-tensor amax (scale = amax/127) for one method: what a calibration cache holds.

    ``to_json``/``from_json`` are the calibration cache's file format (per-tensor amax, scale and histogram digest,
    every field checked on reading), so they are written out here rather than derived from the fields.
    """

    amax: dict[str, float]
    method: str
    percentile: float | None = None
    model_sha256: str = ""
    data_digest: str = ""
    histogram_digests: dict[str, str] = field(default_factory=dict)
    random_data: bool = False
    warnings: tuple[str, ...] = ()
    statistics: CalibrationStatistics | None = field(default=None, repr=False)
    source: str = "workbench"
    # tensor -> why its amax is not the method's own choice (dead tensor, range that clipped most of the data)
    range_notes: dict[str, str] = field(default_factory=dict)
    # tensor -> share of its calibration values above its amax (tensors with histograms only)
    clipped: dict[str, float] = field(default_factory=dict)

    def scale(self, name: str) -> float:
        return float(self.amax[name]) / 127.0

    def to_json(self, *, include_histograms: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "format": CACHE_FORMAT,
            "source": self.source,
            "method": self.method,
            "percentile": self.percentile,
            "model_sha256": self.model_sha256,
            "data_digest": self.data_digest,
            "random_data": self.random_data,
            "warnings": list(self.warnings),
            "tensors": {
                name: {
                    "amax": float(value),
                    "scale": float(value) / 127.0,
                    "histogram_digest": self.histogram_digests.get(name),
                    **({"clipped_fraction": self.clipped[name]} if name in self.clipped else {}),
                    **({"note": self.range_notes[name]} if name in self.range_notes else {}),
                }
                for name, value in self.amax.items()
            },
        }
        if include_histograms and self.statistics is not None:
            # with the histograms a reloaded cache can switch method without new data
            data["statistics"] = self.statistics.to_json()
        return data

    def save(self, path: str | Path, *, include_histograms: bool = True) -> Path:
        return write_json_atomic(path, self.to_json(include_histograms=include_histograms))

    @classmethod
    def load(cls, path: str | Path, *, model_sha256: str | None = None) -> CalibrationRanges:
        """Load a JSON cache; a TensorRT <= 10 text cache is recognised and converted too.

        With ``model_sha256`` given, a cache made for a different model is refused (ranges would be mismatched).
        """
        path = Path(path)
        from workbench._io import refuse_special_file

        refuse_special_file(path, expected="a *.calib.json file or a TensorRT calibration cache")
        if not path.is_file():
            raise WorkbenchError(
                f"{path}: no such calibration cache.", expected="a *.calib.json file or a TensorRT calibration cache"
            )
        from workbench._io import MAX_JSON_BYTES

        if path.stat().st_size > MAX_JSON_BYTES:
            raise WorkbenchError(
                f"{path}: {path.stat().st_size} bytes is above the {MAX_JSON_BYTES}-byte limit for a calibration cache.",
                expected="a calibration cache written by `workbench calibrate` or TensorRT",
            )
        raw = path.read_bytes()
        if raw.startswith(b"TRT-"):
            return load_tensorrt_cache(path)
        from workbench._io import loads_json

        data = loads_json(
            raw,
            where=f"{path} (neither a JSON calibration cache nor a TensorRT text cache)",
            what=f"JSON with format {CACHE_FORMAT!r}, or a 'TRT-...' header",
        )
        if model_sha256 and isinstance(data, dict) and data.get("model_sha256") not in (None, "", model_sha256):
            raise WorkbenchError(
                f"{path}: the cache was made for a different model (sha256 {str(data['model_sha256'])[:12]}…).",
                expected=f"a cache for model sha256 {model_sha256[:12]}…",
                hint="re-calibrate, or drop --cache",
            )
        return cls.from_json(data, where=str(path))

    @classmethod
    def from_json(cls, data: Any, *, where: str = "calibration cache") -> CalibrationRanges:
        """Read what :meth:`to_json` wrote, checking every field: a bad cache is named, never half-used."""

        def bad(what: str, expected: str) -> WorkbenchError:
            return WorkbenchError(f"{where}: {what}.", expected=expected, hint="re-calibrate to write a fresh cache")

        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise bad("not a workbench calibration cache", f"a JSON object with format {CACHE_FORMAT!r}")
        tensors = data.get("tensors")
        if not isinstance(tensors, dict):
            raise bad("'tensors' is missing or not an object", "'tensors': {name: {'amax': positive number}}")
        amax: dict[str, float] = {}
        digests: dict[str, str] = {}
        notes: dict[str, str] = {}
        clipped: dict[str, float] = {}
        for name, entry in tensors.items():
            value = entry.get("amax") if isinstance(entry, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise bad(f"tensor {name!r} has amax {value!r}", "a finite positive number for every tensor's amax")
            amax[str(name)] = float(value)
            if isinstance(entry.get("histogram_digest"), str):
                digests[str(name)] = entry["histogram_digest"]
            note, share = entry.get("note"), entry.get("clipped_fraction")
            if note is not None:
                if not isinstance(note, str):
                    raise bad(f"tensor {name!r} has note {note!r}", "a string")
                notes[str(name)] = note
            if share is not None:
                if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
                    raise bad(f"tensor {name!r} has clipped_fraction {share!r}", "a number in [0, 1]")
                clipped[str(name)] = float(share)
        percentile = data.get("percentile")
        if percentile is not None and (
            isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not 0 < percentile <= 100
        ):
            raise bad(f"percentile {percentile!r}", "null or a number in (0, 100]")
        warnings = data.get("warnings", [])
        if not isinstance(warnings, list) or not all(isinstance(item, str) for item in warnings):
            raise bad("'warnings' is not a list of strings", "a list of strings")
        for key in ("method", "model_sha256", "data_digest", "source"):
            if key in data and not isinstance(data[key], str):
                raise bad(f"{key!r} is {data[key]!r}", "a string")
        try:
            statistics = CalibrationStatistics.from_json(data["statistics"]) if data.get("statistics") else None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, WorkbenchError) as error:
            raise bad(
                f"its histograms cannot be read ({error})", "the 'statistics' section that to_json writes"
            ) from error
        return cls(
            amax=amax,
            method=str(data.get("method", "")),
            percentile=None if percentile is None else float(percentile),
            model_sha256=str(data.get("model_sha256", "")),
            data_digest=str(data.get("data_digest", "")),
            histogram_digests=digests,
            random_data=bool(data.get("random_data", False)),
            warnings=tuple(warnings),
            statistics=statistics,
            source=str(data.get("source", "workbench")),
            range_notes=notes,
            clipped=clipped,
        )


def range_warnings(notes: Mapping[str, str], *, shown: int = 3) -> tuple[str, ...]:
    """One warning per range the guard changed (the first ``shown``), then a count of the rest."""
    items = list(notes.items())
    lines = tuple(f"tensor {name!r}: {note}." for name, note in items[:shown])
    if len(items) > shown:
        lines += (f"{len(items) - shown} more tensor range(s) were changed by the same checks (see range_notes).",)
    return lines


def load_tensorrt_cache(path: str | Path) -> CalibrationRanges:
    """Read a TensorRT <= 10 implicit-INT8 text cache (``TRT-<ver>-<Calibrator>`` then ``name: hex-float32``).

    Each value is the big-endian IEEE float32 *scale*; amax = scale * 127. Users migrating from implicit INT8 keep
    their ranges this way.
    """
    import struct

    path = Path(path)
    lines = path.read_text(encoding="ascii", errors="replace").splitlines()
    if not lines or not lines[0].startswith("TRT-"):
        raise WorkbenchError(
            f"{path}: not a TensorRT calibration cache.", expected="a first line like 'TRT-8601-EntropyCalibration2'"
        )
    header = lines[0].strip()
    amax: dict[str, float] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(":")
        if not sep:
            raise WorkbenchError(f"{path}:{number}: malformed line {line!r}.", expected="'tensor_name: 3c010a14'")
        try:
            scale = struct.unpack(">f", bytes.fromhex(value.strip().rjust(8, "0")))[0]
        except (ValueError, struct.error) as error:
            raise WorkbenchError(
                f"{path}:{number}: {value.strip()!r} is not a hex float32.", expected="8 hex digits"
            ) from error
        if not math.isfinite(scale) or scale <= 0:
            raise WorkbenchError(
                f"{path}:{number}: scale {scale} for {name.strip()!r} is not a finite positive number.",
                expected="a positive float32 scale",
            )
        if not name.strip():
            raise WorkbenchError(f"{path}:{number}: a range with no tensor name.", expected="'tensor_name: 3c010a14'")
        amax[name.strip()] = float(scale) * 127.0
    if not amax:
        raise WorkbenchError(
            f"{path}: holds no tensor ranges.", expected="lines 'tensor_name: 3c010a14' after the header"
        )
    method = header.split("-", 2)[-1] if header.count("-") >= 2 else header
    return CalibrationRanges(amax=amax, method=f"tensorrt:{method}", source=f"tensorrt-cache:{header}")


def _session(proto: Any, outputs: Iterable[str], *, optimized: bool) -> Any:
    from workbench.ort import cpu_session

    return cpu_session(proto, extra_outputs=outputs, optimized=optimized, what="the FP32 model for calibration")


def check_feed(feed: Mapping[str, np.ndarray], input_names: list[str], batch_index: int) -> dict[str, np.ndarray]:
    missing = [n for n in input_names if n not in feed]
    if missing:
        raise WorkbenchError(
            f"calibration batch {batch_index} lacks model input(s) {missing} (it has {sorted(feed)}).",
            expected=f"feeds keyed by {input_names}",
        )
    checked = {n: to_native(np.asarray(feed[n])) for n in input_names}  # ORT reads raw bytes as native order
    for name, array in checked.items():
        if array.dtype.kind not in "biuf":
            raise WorkbenchError(
                f"calibration batch {batch_index}: input {name!r} has dtype {array.dtype}.",
                expected="numeric arrays (float, integer or bool)",
            )
        if array.size == 0 or (array.ndim and array.shape[0] == 0):
            raise WorkbenchError(
                f"calibration batch {batch_index}: input {name!r} has no samples (shape {array.shape}).",
                expected="at least one sample per batch",
            )
        if array.dtype.kind == "f" and not np.isfinite(array).any():
            raise WorkbenchError(
                f"calibration batch {batch_index}: input {name!r} is entirely NaN/Inf.",
                expected="finite calibration data",
            )
    return checked


def collect_statistics(
    model: Any,
    source: CalibrationSource,
    tensors: list[str] | None = None,
    *,
    limit: int | None = None,
    progress: bool = True,
    optimized: bool = False,
    on_batch: Callable[[int, int | None], None] | None = None,
) -> CalibrationStatistics:
    """Run the FP32 model once over the source, folding the needed tensors into histograms.

    ``tensors`` defaults to every tensor the Q/DQ placement could quantize (all quantizable nodes INT8), so any later
    fallback plan finds its ranges here. ``optimized`` runs ORT with graph optimizations (faster; tiny FP32
    differences); the default matches the project's numeric reference (optimizations off). ``on_batch(done,
    total)`` hears each batch folded in (``total`` None when the source does not know its length).
    """
    from tqdm.auto import tqdm

    from workbench.precision.qdq_rules import activation_tensors, prepare_model

    start = time.perf_counter()
    proto = getattr(model, "proto", model)  # an OnnxModel or a bare ModelProto
    model_sha = getattr(model, "sha256", None) or _model_sha256(proto)
    prepared = prepare_model(proto)
    names = list(tensors) if tensors is not None else activation_tensors(prepared)
    session = _session(prepared, names, optimized=optimized)
    input_names = [i.name for i in session.get_inputs()]
    if not input_names:
        raise no_graph_inputs("the model")
    histograms = {name: TensorHistogram(name) for name in names}
    digests: list[str] = []
    batches = samples = 0
    input_peak: dict[str, float] = {}
    input_span: dict[str, tuple[float, float]] = {}
    total = len(source) or None
    if total is not None and limit is not None:
        total = min(total, limit)
    iterator = tqdm(
        source.batches(limit),
        total=total,
        desc="calibration statistics",
        unit="batch",
        disable=not progress,
        leave=False,
    )
    for feed in iterator:
        feed = check_feed(feed, input_names, batches)
        for name, array in feed.items():
            if array.dtype.kind == "f":  # integer inputs (token ids, masks) may legitimately be all zero
                finite = array[np.isfinite(array)]
                peak = float(np.abs(finite).max()) if finite.size else 0.0
                input_peak[name] = max(input_peak.get(name, 0.0), peak)
                if finite.size:
                    low, high = input_span.get(name, (math.inf, -math.inf))
                    input_span[name] = (min(low, float(finite.min())), max(high, float(finite.max())))
        digests.append(feed_digest(feed))
        try:
            values = session.run(names, feed)
        except Exception as error:  # ORT's Fail / InvalidArgument
            raise WorkbenchError(
                f"calibration batch {batches}: ONNX Runtime failed ({error}).",
                expected="feeds matching the model's input shapes and dtypes",
            ) from error
        for name, value in zip(names, values):
            histograms[name].add(value)
        del values
        batches += 1
        first = next(iter(feed.values()))
        samples += int(first.shape[0]) if first.ndim else 1
        if on_batch is not None:
            on_batch(batches, total)
    if batches == 0:
        raise WorkbenchError(f"calibration data {source.name!r} yielded no batches.", expected="at least one batch")
    zero = [name for name, peak in input_peak.items() if peak == 0.0]
    if zero:
        raise WorkbenchError(
            f"calibration data {source.name!r}: float input(s) {zero} are zero in every batch; ranges from them "
            "would be meaningless.",
            expected="representative (non-constant) calibration data",
        )
    notes = []
    if source.is_random:
        notes.append(RANDOM_DATA_WARNING)
        warnings.warn(RANDOM_DATA_WARNING, stacklevel=2)
    if samples < 16:
        notes.append(f"only {samples} calibration sample(s): ranges may not cover real inputs.")
    constant = [name for name, (low, high) in input_span.items() if low == high]
    if constant:
        note = f"float input(s) {constant} are constant over the whole calibration set: not representative data."
        notes.append(note)
        warnings.warn(note, stacklevel=2)
    flat = [n for n, h in histograms.items() if h.count and h.minimum == h.maximum]
    if flat:
        notes.append(
            f"{len(flat)} tensor(s) are constant over the calibration set (ranges of zero width), e.g. {flat[:3]}."
        )
    bad = [n for n, h in histograms.items() if h.nonfinite]
    if bad:
        notes.append(f"{len(bad)} tensor(s) had NaN/Inf values (ignored in the histograms), e.g. {bad[:3]}.")
    return CalibrationStatistics(
        histograms=histograms,
        model_sha256=model_sha,
        data_digest=combine_digests(digests),
        data_name=source.name,
        num_batches=batches,
        num_samples=samples,
        seconds=time.perf_counter() - start,
        random_data=source.is_random,
        warnings=tuple(notes),
    )


def no_graph_inputs(what: str) -> WorkbenchError:
    """The error for a model calibration cannot apply to because it has no inputs."""
    return WorkbenchError(
        f"{what} has no graph inputs: its outputs are constants, so calibration data cannot change any range.",
        expected="a model with at least one input",
    )
