"""The zoo's building blocks: the cache folder, the MetricResult record and the ZooEntry base class.

A zoo entry is a real pretrained model plus a deterministic, labelled (or self-referenced) data set:

* ``onnx_path()`` materializes the model into ``cache_dir()/<name>/`` once (atomic writes) and returns the path;
* ``calibration_batches()`` and ``evaluation_batches()`` yield feeds built by the model's own preprocessing from two
  disjoint, seeded sample streams;
* ``evaluate(predict)`` scores any ``predict(feed) -> {output_name: array}`` (ONNX Runtime, a TensorRT engine, a
  quantized ONNX...) with the entry's task metric.

Nothing here imports torch; entries exported from PyTorch weights import it inside their ``_materialize``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from workbench._io import atomic_path, make_folder, sha256_file, write_bytes_atomic, write_json_atomic
from workbench.errors import WorkbenchError

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import torch
    from numpy.typing import ArrayLike

    from workbench.artifact import JsonObject
    from workbench.model import OnnxModel

Feed = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]
# one sample's label (a class id, a text line, a page's boxes; None when scored against the FP32 model) and a
# model's per-sample prediction (a class id, decoded text, boxes, an embedding)
Label = int | str | np.ndarray | None
Prediction = int | str | np.ndarray
PredictFn = Callable[[Feed], Outputs]
Profile = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]

DEFAULT_CACHE = Path("~/.cache/trt-workbench")
SPLITS = ("calibration", "evaluation")
# Seeds of the two sample streams. Every sample is generated from (split seed, index), so the sets are
# reproducible one sample at a time and the calibration stream never repeats an evaluation sample.
SPLIT_SEEDS = {"calibration": 1_000_003, "evaluation": 2_000_003}
DEV_EXTRA_HINT = "install the dev extra: pip install -e '.[dev]'"


def cache_dir() -> Path:
    """Root of the zoo cache: ``$WORKBENCH_CACHE`` if set, else ``~/.cache/trt-workbench``."""
    folder = Path(os.environ.get("WORKBENCH_CACHE") or DEFAULT_CACHE).expanduser()
    if folder.exists() and not folder.is_dir():
        raise WorkbenchError(
            f"the zoo cache {folder} (WORKBENCH_CACHE) is a file, not a folder.",
            expected="WORKBENCH_CACHE naming a folder (created if missing), or unset for ~/.cache/trt-workbench",
        )
    return folder


@dataclass
class MetricResult:
    """One task metric measured on (a prefix of) an entry's evaluation set."""

    name: str
    value: float
    higher_is_better: bool
    n_samples: int
    details: dict[str, Any] = field(default_factory=dict)
    # one score per evaluated sample (1/0 for right/wrong, or the sample's cosine), in evaluation order, for
    # confidence intervals and paired comparisons; empty where the metric is not a mean over samples
    scores: list[float] = field(default_factory=list, repr=False)

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "value": float(self.value),
            "higher_is_better": self.higher_is_better,
            "n_samples": int(self.n_samples),
            "details": _jsonable(self.details),
        }

    def __str__(self) -> str:
        return f"{self.name} = {self.value:.4f} on {self.n_samples} samples"


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def export_to_onnx(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_axes: dict[str, dict[int, str]],
    producer: str,
) -> onnx.ModelProto:
    """Export a PyTorch module with the legacy (TorchScript) exporter at opset 17, weights inside the file.

    The legacy exporter is the one that keeps a dynamic batch for these models (see research notes); the result is
    checked with onnx.checker before it is returned.
    """
    import io

    import onnx
    import torch

    buffer = io.BytesIO()
    torch.onnx.export(
        module,
        args,
        buffer,  # type: ignore[arg-type]  # a file-like object works; the stubs only name paths
        dynamo=False,
        opset_version=17,
        input_names=list(input_names),
        output_names=list(output_names),
        dynamic_axes=dynamic_axes,
    )
    proto = onnx.load_from_string(buffer.getvalue())
    proto.producer_name = producer
    onnx.checker.check_model(proto)
    return proto


def make_ort_predict(path: str | os.PathLike[str], *, disable_optimizations: bool = True) -> PredictFn:
    """A ``predict(feed) -> {output: array}`` running the ONNX file with ONNX Runtime on CPU.

    ``disable_optimizations=True`` (ORT_DISABLE_ALL) is the project's numeric reference: Q/DQ nodes then run as
    deterministic simulated quantization instead of CPU-dependent integer kernels.
    """
    from workbench.ort import cpu_predict

    return cpu_predict(Path(path), optimized=not disable_optimizations, what=str(path))


# the FP32 reference's batch: predictions are cached per sample, computed in these blocks as a whole pass does
_REFERENCE_BATCH = 8


class ZooEntry(ABC):
    """A built-in model with its data, preprocessing and task metric. Subclasses fill in the class attributes."""

    name: ClassVar[str]
    description: ClassVar[str]
    task: ClassVar[str]
    metric_name: ClassVar[str]
    higher_is_better: ClassVar[bool] = True
    requires_torch: ClassVar[bool] = False
    source: ClassVar[str]
    license: ClassVar[str]
    # Bump when the materialized file or the reference data would change, so stale caches are rebuilt.
    recipe_version: ClassVar[int] = 1
    split_sizes: ClassVar[dict[str, int]]
    profiles: ClassVar[dict[str, Profile]]
    # the model output the metric reads (the only output is used when a rewrite renamed it)
    metric_output: ClassVar[str]
    # the most samples one run may take: None for a batch axis, 1 for a graph that hard-codes a batch of 1 (every feed
    # then holds one sample, whatever batch size the caller asks for)
    max_batch: ClassVar[int | None] = None
    # metrics of a model (by its bytes) may be kept in the cache folder (:meth:`stored_metric`): the data are seeded
    metric_cache: ClassVar[bool] = True
    # every sample is made from (split seed, index): the evaluation split can grow (:meth:`with_evaluation_size`)
    generated_data: ClassVar[bool] = False

    # ----------------------------------------------------------------------------------------- model
    @property
    def cache_folder(self) -> Path:
        return cache_dir() / "zoo" / self.name

    @property
    def _cached_onnx(self) -> Path:
        return self.cache_folder / f"{self.name}.onnx"

    @property
    def _manifest_path(self) -> Path:
        return self.cache_folder / "manifest.json"

    def is_cached(self) -> bool:
        if not self._cached_onnx.is_file() or not self._manifest_path.is_file():
            return False
        try:
            manifest = json.loads(self._manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return False
        return (
            manifest.get("recipe_version") == self.recipe_version
            and manifest.get("source_fingerprint", "") == self._source_fingerprint()
        )

    def _source_fingerprint(self) -> str:
        """Identifies the upstream file or package the cached copy was made from; a change re-materializes."""
        return ""

    def onnx_path(self) -> Path:
        """Materialize the model into the cache (once) and return the path of the ready-to-build ONNX file."""
        if self.is_cached():
            return self._cached_onnx
        if self.requires_torch and not torch_available():
            raise WorkbenchError(
                f"zoo model {self.name!r} is exported from PyTorch weights on first use, but torch is not installed.",
                hint=DEV_EXTRA_HINT,
            )
        started = time.perf_counter()
        make_folder(self.cache_folder, what="the zoo cache folder (WORKBENCH_CACHE)")
        with atomic_path(self._cached_onnx) as tmp:
            notes = self._materialize(tmp) or {}
        manifest = {
            "name": self.name,
            "recipe_version": self.recipe_version,
            "source": self.source,
            "license": self.license,
            "source_fingerprint": self._source_fingerprint(),
            "sha256": sha256_file(self._cached_onnx),
            "materialize_seconds": round(time.perf_counter() - started, 3),
            "notes": notes,
        }
        write_json_atomic(self._manifest_path, manifest)
        return self._cached_onnx

    def manifest(self) -> JsonObject:
        """The record written at materialization (source, sha256, seconds taken, fixes applied)."""
        self.onnx_path()
        return json.loads(self._manifest_path.read_text(encoding="utf-8"))

    @abstractmethod
    def _materialize(self, target: Path) -> JsonObject | None:
        """Write the ready-to-build ONNX file to ``target`` (a temp path renamed on success); return notes."""

    def load(self) -> OnnxModel:
        from workbench.model import load_onnx

        return load_onnx(self.onnx_path())

    def input_profiles(self) -> dict[str, Profile]:
        """TensorRT optimization profile per input: (min, opt, max) shapes; opt matches the zoo's batches of 8."""
        return {name: (tuple(lo), tuple(opt), tuple(hi)) for name, (lo, opt, hi) in self.profiles.items()}

    # ------------------------------------------------------------------------------------------ data
    def with_evaluation_size(self, samples: int) -> ZooEntry:
        """A fresh entry of this model scored on ``samples`` evaluation samples (the first ones are the zoo's own, as
        samples are made per index): a comparison that ties on the default split can then tell variants apart."""
        if not self.generated_data:
            raise WorkbenchError(
                f"{self.name}'s evaluation set is fixed ({self.split_sizes['evaluation']} samples); it cannot grow.",
                expected="a zoo model whose samples are generated per index (ocr-cls, ocr-rec, ocr-det, "
                "efficientnet-lite0)",
            )
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise WorkbenchError(f"evaluation size {samples!r} is not a sample count.", expected="an integer >= 1")
        entry = type(self)()  # not the shared instance: its cached crops and metrics belong to the default split
        entry.split_sizes = {**self.split_sizes, "evaluation": samples}  # type: ignore[misc]
        return entry

    def split_size(self, split: str) -> int:
        _check_split(split)
        return self.split_sizes[split]

    @abstractmethod
    def _sample(self, split: str, index: int) -> tuple[Feed, Label]:
        """One preprocessed sample (arrays without the batch axis) and its label (None when self-referenced)."""

    def _batches(
        self, split: str, limit: int | None, batch_size: int, start: int = 0
    ) -> Iterator[tuple[Feed, list[Label], list[int]]]:
        _check_split(split)
        if batch_size < 1:
            raise WorkbenchError(f"batch_size={batch_size} is not a positive number.", expected="batch_size >= 1")
        if limit is not None and limit < 1:
            raise WorkbenchError(
                f"limit={limit} is not a positive number.", expected="limit >= 1 or None for the whole set"
            )
        total = self.split_sizes[split] if limit is None else min(limit, self.split_sizes[split])
        batch_size = min(batch_size, self.max_batch or batch_size)
        for first in range(start, total, batch_size):
            indices = list(range(first, min(first + batch_size, total)))
            samples = [self._sample(split, index) for index in indices]
            feed = {name: np.stack([sample[0][name] for sample in samples]) for name in samples[0][0]}
            yield feed, [sample[1] for sample in samples], indices

    def calibration_batches(self, limit: int | None = None, batch_size: int = 8) -> Iterator[Feed]:
        """Feeds for INT8 calibration. ``limit`` caps the number of samples (not batches)."""
        for feed, _, _ in self._batches("calibration", limit, batch_size):
            yield feed

    def evaluation_batches(
        self, limit: int | None = None, batch_size: int = 8
    ) -> Iterator[tuple[Feed, np.ndarray | list[Label] | None]]:
        """(feed, labels) pairs of the evaluation set; labels is None for entries scored against the FP32 model.

        ``limit`` caps the number of samples (not batches).
        """
        for feed, labels, _ in self._batches("evaluation", limit, batch_size):
            yield feed, self._collate_labels(labels)

    def write_calibration_images(self, folder: str | os.PathLike[str], limit: int | None = None) -> list[Path]:
        """Write the calibration samples as PNG files before preprocessing (the image form of a calibration folder).

        Only entries whose input is an image have this form (``raw_image``); ``preprocess_images`` on the written
        files gives back exactly the arrays of ``calibration_batches``.
        """
        import cv2

        raw_image = getattr(self, "raw_image", None)
        if raw_image is None:
            raise WorkbenchError(
                f"zoo model {self.name!r} takes no images.",
                expected="its .npz batches instead (workbench zoo calib-data NAME FOLDER)",
            )
        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise WorkbenchError(f"{folder}: exists and is not a folder.", expected="a folder for calibration images")
        total = self.split_sizes["calibration"] if limit is None else min(limit, self.split_sizes["calibration"])
        written = []
        for index in range(total):
            ok, encoded = cv2.imencode(".png", raw_image("calibration", index))
            if not ok:
                raise WorkbenchError(f"{self.name}: could not encode calibration image {index} as PNG.")
            written.append(write_bytes_atomic(folder / f"{self.name}_{index:05d}.png", encoded.tobytes()))
        return written

    def _collate_labels(self, labels: list[Label]) -> np.ndarray | list[Label] | None:
        if all(label is None for label in labels):
            return None
        if all(isinstance(label, (int, np.integer)) for label in labels):
            return np.asarray(labels, dtype=np.int64)
        return labels

    # ---------------------------------------------------------------------------------------- metric
    def evaluate(
        self,
        predict: PredictFn,
        limit: int | None = None,
        batch_size: int = 8,
        *,
        earlier: tuple[list[Prediction], list[Label], list[int]] | None = None,
    ) -> MetricResult:
        """Score ``predict`` on the first ``limit`` evaluation samples (all when None) with the task metric.

        ``earlier``: (predictions, labels, indices) this same model already gave for the first samples (whole
        batches); only the samples after them are run, and the metric covers all of them."""
        return self.evaluate_kept(predict, limit, batch_size, earlier=earlier)[0]

    def evaluate_kept(
        self,
        predict: PredictFn,
        limit: int | None = None,
        batch_size: int = 8,
        *,
        earlier: tuple[list[Prediction], list[Label], list[int]] | None = None,
    ) -> tuple[MetricResult, tuple[list[Prediction], list[Label], list[int]]]:
        """:meth:`evaluate`, and the (predictions, labels, indices) it scored: passed back as ``earlier``, a later
        evaluation of the same model on the same, fewer or more samples runs only what they do not cover in whole
        batches: the very samples of the earlier run are read, not run; otherwise a batch of them that a fresh run
        would cut differently (the partial last one, or the one the new limit cuts) runs again, so every sample is
        scored in the batch a fresh run of this limit gives it."""
        predictions: list[Prediction] = list(earlier[0]) if earlier else []
        labels: list[Label] = list(earlier[1]) if earlier else []
        indices: list[int] = list(earlier[2]) if earlier else []
        if indices != list(range(len(indices))):
            raise WorkbenchError(
                f"{self.name}: earlier results cover samples {indices[:3]}... ({len(indices)}).",
                expected="the first samples 0..n-1",
            )
        total = self.split_sizes["evaluation"] if limit is None else min(limit, self.split_sizes["evaluation"])
        batch = max(1, min(batch_size, self.max_batch or batch_size))
        # the same samples as before: all read; else whole batches only, the rest run as a fresh run batches them
        keep = total if total == len(indices) else min(total, len(indices)) // batch * batch
        del predictions[keep:], labels[keep:], indices[keep:]
        for feed, batch_labels, batch_indices in self._batches("evaluation", limit, batch_size, start=len(indices)):
            outputs = predict(feed)
            if not isinstance(outputs, dict) or not outputs:
                raise WorkbenchError(
                    f"{self.name}: predict() returned {type(outputs).__name__}, not a dict of output arrays.",
                    expected="predict(feed) -> {output_name: np.ndarray}",
                )
            reduced = self._reduce(outputs, feed)
            if len(reduced) != len(batch_indices):
                raise WorkbenchError(
                    f"{self.name}: predict() returned {len(reduced)} results for a batch of {len(batch_indices)}.",
                    expected="outputs with the batch size of the feed on axis 0",
                )
            predictions.extend(reduced)
            labels.extend(batch_labels)
            indices.extend(batch_indices)
        return self._metric(predictions, labels, indices), (predictions, labels, indices)

    def evaluate_onnx(
        self, path: str | os.PathLike[str], *, disable_optimizations: bool = True, limit: int | None = None
    ) -> MetricResult:
        """The task metric of an ONNX file (this model, or a cleaned / quantized variant) run by ONNX Runtime CPU."""
        return self.evaluate(make_ort_predict(path, disable_optimizations=disable_optimizations), limit=limit)

    def _output(self, outputs: Outputs, preferred: str) -> np.ndarray:
        """The output the metric reads: ``preferred`` by name, else the only output (renamed by a rewrite)."""
        if preferred in outputs:
            return np.asarray(outputs[preferred])
        if len(outputs) == 1:
            return np.asarray(next(iter(outputs.values())))
        raise WorkbenchError(
            f"{self.name}: predict() returned outputs {sorted(outputs)}, none named {preferred!r}.",
            expected=f"an output named {preferred!r} or exactly one output",
        )

    @abstractmethod
    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        """Per-sample prediction (class id, decoded text, boxes, embedding) from one batch of raw outputs."""

    @abstractmethod
    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        """Combine per-sample predictions with labels into the task metric."""

    # ------------------------------------------------------------------------------------- reference
    def _reference(self, indices: Sequence[int] | None = None) -> list[Prediction | None]:
        """Per-sample predictions of the FP32 model (ORT, optimizations off) on the evaluation set, indexed by sample,
        computed for ``indices`` (all when None) and cached: a metric on the first 64 of 1,000 crops does not pay for
        the other 936 (samples not asked for yet are None).

        Computed in the blocks of 8 consecutive samples a whole pass uses, so each prediction is the very one a
        whole pass gives (a kernel may sum in another order for another batch); later calls add what they lack."""
        model_path = self.onnx_path()
        digest = json.loads(self._manifest_path.read_text(encoding="utf-8"))["sha256"][:16]
        from workbench.ort import intra_op_threads

        size = self.split_sizes["evaluation"]
        batch_size = min(_REFERENCE_BATCH, self.max_batch or _REFERENCE_BATCH)
        # a partial cache has its own name (older code reads the whole-pass name only, and would take the rows not
        # computed yet for predictions); the thread count is in it, so rows added later are made the same way
        whole = self.cache_folder / f"reference-{digest}-v{self.recipe_version}-n{size}.npz"
        cache = whole.with_name(f"{whole.stem}-t{intra_op_threads()}-blocks{batch_size}.npz")
        memo = self.__dict__.get("_reference_memo")
        if memo is None or memo[0] != cache:  # a search scores every plan, batch by batch, against it
            predictions: list[Prediction | None] = [None] * size
            for path in (whole, cache):  # a whole pass an older version cached, then the rows cached since
                if not path.is_file():
                    continue
                from workbench._arrays import read_npz

                stored = read_npz(path, expected="a reference cache written by the zoo (delete it to recompute)")
                rows = stored.get("predictions")
                known = stored.get("known", np.ones(size, dtype=bool))
                if rows is None or len(rows) != size or known.shape != (size,) or known.dtype != bool:
                    continue  # not this split's: recomputed
                for index in np.flatnonzero(known):
                    predictions[int(index)] = rows[index]
            memo = (cache, predictions)
            self.__dict__["_reference_memo"] = memo
        predictions = memo[1]
        wanted = range(size) if indices is None else indices
        blocks = sorted({(int(i) // batch_size) * batch_size for i in wanted if predictions[int(i)] is None})
        if not blocks:
            return predictions
        predict = make_ort_predict(model_path, disable_optimizations=True)
        for first in blocks:
            for feed, _, block in self._batches("evaluation", min(first + batch_size, size), batch_size, first):
                for index, prediction in zip(block, self._reduce(predict(feed), feed)):
                    predictions[index] = prediction
        template = next(p for p in predictions if p is not None)
        known = np.asarray([p is not None for p in predictions])
        rows = np.stack([p if p is not None else np.zeros_like(template) for p in predictions])
        with atomic_path(cache) as tmp:
            with open(tmp, "wb") as handle:
                np.savez(handle, predictions=rows, known=known)
        return predictions

    def stored_metric(self, model_sha256: str, limit: int | None, compute: Callable[[], MetricResult]) -> MetricResult:
        """The task metric of the model with this sha256 on the first ``limit`` evaluation samples, read from the
        cache folder when an earlier run stored it, else ``compute()``-d and stored (with its per-sample scores).

        A search starts from the FP32 model's metric, a full pass over the evaluation set (20 s for 1,000
        EfficientNet crops on 2 cores) that gives the same numbers every time: the data here are generated from
        seeds, and the key holds the model's bytes, the recipe and the split's size. Entries whose data can change
        under the same name (an ONNX file's data folder) set ``metric_cache = False``."""
        if not self.metric_cache:
            return compute()
        size = self.split_sizes["evaluation"]
        key = f"{model_sha256[:32]}-v{self.recipe_version}-n{size}-limit{limit if limit is not None else size}"
        path = self.cache_folder / "metrics" / f"{key}.json"
        if path.is_file():
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
                return MetricResult(
                    name=str(stored["name"]),
                    value=float(stored["value"]),
                    higher_is_better=bool(stored["higher_is_better"]),
                    n_samples=int(stored["n_samples"]),
                    details=dict(stored["details"]),
                    scores=[float(x) for x in stored["scores"]],
                )
            except (OSError, ValueError, KeyError, TypeError):  # damaged: measured again and rewritten
                pass
        result = compute()
        try:
            make_folder(path.parent, what="the zoo cache folder (WORKBENCH_CACHE)")
            write_json_atomic(path, {**result.to_json(), "scores": [float(x) for x in result.scores]})
        except (OSError, WorkbenchError):  # a read-only cache: the metric is still right, only not kept
            pass
        return result

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "task": self.task,
            "metric": self.metric_name,
            "higher_is_better": self.higher_is_better,
            "requires_torch": self.requires_torch,
            "metric_output": self.metric_output,
            "source": self.source,
            "license": self.license,
            "cached": self.is_cached(),
            "calibration_samples": self.split_sizes["calibration"],
            "evaluation_samples": self.split_sizes["evaluation"],
        }

    def __repr__(self) -> str:
        return f"<ZooEntry {self.name}: {self.task}, metric {self.metric_name}>"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise WorkbenchError(f"unknown data split {split!r}.", expected=" or ".join(SPLITS))


def _flat_rows(array: np.ndarray) -> np.ndarray:
    """[N, ...] -> [N, K]: one row per sample, whatever trailing axes a rewritten model keeps."""
    return array.reshape(array.shape[0], -1) if array.ndim else array.reshape(1, -1)


def cosine_scores(predicted: ArrayLike | Sequence[Prediction], reference: ArrayLike) -> np.ndarray:
    """Per-sample cosine similarity of ``predicted`` rows to ``reference`` rows ([N, ...], flattened per sample); two
    all-zero rows agree (cosine 1), one all-zero row against a non-zero one scores 0."""
    predicted = _flat_rows(np.asarray(predicted, dtype=np.float64))
    reference = _flat_rows(np.asarray(reference, dtype=np.float64))
    norms = np.linalg.norm(predicted, axis=1) * np.linalg.norm(reference, axis=1)
    both_zero = (np.linalg.norm(predicted, axis=1) == 0) & (np.linalg.norm(reference, axis=1) == 0)
    return np.where(both_zero, 1.0, (predicted * reference).sum(axis=1) / np.maximum(norms, 1e-12))


def top1_agreement_scores(predicted: ArrayLike, reference: ArrayLike) -> np.ndarray:
    """Per-sample 1/0: does the class with the largest score ([N, C] rows) match the reference's?"""
    predicted = _flat_rows(np.asarray(predicted))
    reference = _flat_rows(np.asarray(reference))
    return (predicted.argmax(axis=1) == reference.argmax(axis=1)).astype(np.float64)


def agreement_kind(per_sample_shape: tuple[int, ...]) -> str:
    """How an output is compared with its FP32 reference: class scores ([N, C], C > 1) by top-1 agreement, anything
    else (feature maps, boxes, embeddings, one value per sample) by cosine."""
    return "top1_agreement" if len(per_sample_shape) == 1 and per_sample_shape[0] > 1 else "cosine"


def cosine_metric(
    name: str, predicted: ArrayLike | Sequence[Prediction], reference: ArrayLike, **details: object
) -> MetricResult:
    """Mean per-sample cosine similarity of ``predicted`` rows to ``reference`` rows (metrics scored against FP32)."""
    cosine = cosine_scores(predicted, reference)
    empty = not len(cosine)
    return MetricResult(
        name=name,
        value=float("nan") if empty else float(cosine.mean()),
        higher_is_better=True,
        n_samples=int(len(cosine)),
        scores=[float(c) for c in cosine],
        details={
            "min_cosine": float("nan") if empty else float(cosine.min()),
            "p05_cosine": float("nan") if empty else float(np.percentile(cosine, 5)),
            **details,
        },
    )


def worst_output_metric(
    name: str, predicted: dict[str, np.ndarray], reference: dict[str, np.ndarray], **details: object
) -> MetricResult:
    """Agreement with the FP32 reference judged per output and reported for the WORST output: each output ([N, ...]
    arrays keyed by output name, same keys in both) scores per sample by :func:`agreement_kind`; the value and the
    per-sample scores are the worst output's, every output's mean is in ``details["outputs"]``.

    Outputs are never joined into one vector: a large feature map beside small logits would hide the logits' damage.
    """
    if not predicted or set(predicted) != set(reference):
        raise WorkbenchError(
            f"outputs {sorted(predicted)} do not match the reference outputs {sorted(reference)}.",
            expected="the same outputs as the FP32 model",
        )
    per_output: dict[str, dict[str, Any]] = {}
    scores: dict[str, np.ndarray] = {}
    for output, expected in reference.items():
        kind = agreement_kind(tuple(np.shape(expected)[1:]))
        got = predicted[output]
        scores[output] = (top1_agreement_scores if kind == "top1_agreement" else cosine_scores)(got, expected)
        per_output[output] = {"kind": kind, "value": float(scores[output].mean()) if len(scores[output]) else math.nan}
    worst = min(per_output, key=lambda output: per_output[output]["value"])
    return MetricResult(
        name=name,
        value=per_output[worst]["value"],
        higher_is_better=True,
        n_samples=int(len(scores[worst])),
        scores=[float(score) for score in scores[worst]],
        details={"worst_output": worst, "outputs": per_output, **details},
    )


def sample_rng(split: str, index: int, salt: int = 0) -> np.random.Generator:
    """The random generator of one sample: a pure function of (split, index, salt)."""
    return np.random.default_rng([SPLIT_SEEDS[split], int(index), int(salt)])
