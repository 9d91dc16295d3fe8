"""An ONNX file of your own as a quickstart entry: seeded random inputs and a metric against the FP32 model itself.

A file carries no data and no task metric, so the journey gets what it can measure honestly:

* calibration and evaluation sets are seeded random inputs (floats ~ N(0, 1), integer and bool inputs in {0, 1},
  like the cleaner's probes), two disjoint streams; the ranges they give describe noise, not real inputs, and the
  description says so;
* the metric is the mean cosine similarity between a variant's outputs and the FP32 model's on the evaluation set
  (1.0 for FP32 by definition), every output with the batch axis joined per sample: it measures how far FP16 / INT8
  move the outputs, not task accuracy;
* a dynamic batch axis gets the profile 1 / 8 / 64 (the quickstart's batches); any other symbolic dimension is fixed
  to :data:`FIXED_DIM` and named in :attr:`OnnxFileEntry.notes`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.zoo.base import Feed, MetricResult, Outputs, Profile, ZooEntry, sample_rng

FIXED_DIM = 16
RANDOM_INPUTS_NOTE = (
    "your ONNX file has no data set: calibration and evaluation use seeded RANDOM inputs, and the metric is the "
    "cosine of each variant's outputs vs the FP32 model's (how far FP16/INT8 move the outputs, not task accuracy)"
)
BATCH_PROFILE = (1, 8, 64)


class OnnxFileEntry(ZooEntry):
    """A quickstart entry for one ONNX file (random inputs, output agreement with FP32)."""

    task = "your ONNX file"
    metric_name = "output_cosine_vs_fp32"
    higher_is_better = True
    source = "a local ONNX file"
    license = "unknown"
    metric_output = ""

    def __init__(self, path: str | Path) -> None:
        from onnx import TensorProto, helper

        from workbench.model import load_onnx

        self.path = Path(path)
        model = load_onnx(self.path)
        # the zoo declares these per class (ClassVar); an ONNX file sets them per instance
        self.name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.path.stem) or "model"  # type: ignore[misc]
        what = "your file: random inputs, metric = output cosine vs its FP32 outputs"
        self.description = f"{self.path.name} ({what})"  # type: ignore[misc]
        self.split_sizes = {"calibration": 256, "evaluation": 256}  # type: ignore[misc]
        initializers = {init.name for init in model.proto.graph.initializer}
        self.inputs: dict[str, tuple[np.dtype, list[int | str]]] = {}
        profiles: dict[str, Profile] = {}
        self.notes: list[str] = []
        for value in model.proto.graph.input:
            if value.name in initializers:
                continue
            tensor = value.type.tensor_type
            if tensor.elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
                raise WorkbenchError(
                    f"{self.path}: input {value.name!r} is not a numeric tensor.", expected="numeric tensor inputs"
                )
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
            dims: list[int | str] = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim
            ]
            if not dims or isinstance(dims[0], int):
                raise WorkbenchError(
                    f"{self.path}: input {value.name!r} has no dynamic batch axis (shape {dims}).",
                    expected="inputs whose first axis is a symbolic batch dimension, as the quickstart batches samples",
                )
            low, opt, high = ([size] for size in BATCH_PROFILE)
            for axis, dim in enumerate(dims[1:], start=1):
                if isinstance(dim, str):
                    self.notes.append(f"input {value.name!r} axis {axis} ({dim}) fixed to {FIXED_DIM}")
                    dim = FIXED_DIM
                for shape in (low, opt, high):
                    shape.append(int(dim))
            profiles[value.name] = (tuple(low), tuple(opt), tuple(high))
            self.inputs[value.name] = (dtype, dims)
        self.profiles = profiles  # type: ignore[misc]
        self._reference_cache: dict[int, np.ndarray] = {}

    # the file is used where it is: nothing to materialize or cache
    def is_cached(self) -> bool:
        return True

    def onnx_path(self) -> Path:
        return self.path

    def _materialize(self, target: Path) -> None:  # pragma: no cover - never called (onnx_path is the file)
        raise NotImplementedError

    def manifest(self) -> dict[str, Any]:
        return {"name": self.name, "source": str(self.path), "notes": list(self.notes)}

    def _sample(self, split: str, index: int) -> tuple[Feed, Any]:
        rng = sample_rng(split, index, salt=7)
        feed: Feed = {}
        for name, (dtype, _dims) in self.inputs.items():
            shape = self.profiles[name][1][1:]
            if dtype.kind == "f":
                feed[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind == "b":
                feed[name] = rng.integers(0, 2, shape).astype(bool)
            else:
                feed[name] = rng.integers(0, 2, shape).astype(dtype)
        return feed, None

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Any]:
        batch = len(next(iter(feed.values())))
        arrays = [np.asarray(a) for a in outputs.values()]
        per_sample = [a.reshape(batch, -1).astype(np.float64) for a in arrays if a.ndim and a.shape[0] == batch]
        if not per_sample:
            raise WorkbenchError(
                f"{self.path}: no output has the batch axis, so there is nothing per sample to compare.",
                expected="at least one output whose first axis is the batch",
            )
        return list(np.concatenate(per_sample, axis=1))

    def _reference(self) -> list[Any]:
        from workbench.zoo.base import make_ort_predict

        if not self._reference_cache:
            predict = make_ort_predict(self.path, disable_optimizations=True)
            predictions: list[Any] = []
            for feed, _, _ in self._batches("evaluation", None, 8):
                predictions.extend(self._reduce(predict(feed), feed))
            self._reference_cache[0] = np.stack(predictions)
        return list(self._reference_cache[0])

    def _metric(self, predictions: list[Any], labels: list[Any], indices: list[int]) -> MetricResult:
        reference = np.asarray(self._reference(), dtype=np.float64)[indices]
        predicted = np.asarray(predictions, dtype=np.float64)
        both_zero = (np.linalg.norm(predicted, axis=1) == 0) & (np.linalg.norm(reference, axis=1) == 0)
        cosine = (predicted * reference).sum(axis=1) / np.maximum(
            np.linalg.norm(predicted, axis=1) * np.linalg.norm(reference, axis=1), 1e-12
        )
        cosine = np.where(both_zero, 1.0, cosine)
        return MetricResult(
            name=self.metric_name,
            value=float(cosine.mean()) if len(cosine) else float("nan"),
            higher_is_better=True,
            n_samples=int(len(cosine)),
            scores=[float(c) for c in cosine],
            details={
                "inputs": "seeded random (not real data)",
                "min_cosine": float(cosine.min()) if len(cosine) else None,
            },
        )
