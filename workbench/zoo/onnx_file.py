"""An ONNX file of your own as a quickstart entry: seeded random inputs and a metric against the FP32 model itself.

A file carries no data and no task metric, so the journey gets what it can measure honestly:

* calibration and evaluation sets are seeded random inputs (floats ~ N(0, 1), integer and bool inputs in {0, 1},
  like the cleaner's probes), two disjoint streams; the ranges they give describe noise, not real inputs, and the
  description says so;
* the metric: with a ``labels`` array in every ``.npz`` batch (the reserved key: one integer class per sample), top-1
  accuracy of the model's [N, C] output; without labels, agreement with the FP32 model's outputs on the evaluation set
  judged on the WORST output (top-1 agreement for [N, C] class scores, mean per-sample cosine for any other output;
  1.0 for FP32 by definition): it measures how far FP16 / INT8 move the outputs, not task accuracy. Outputs are never
  joined into one vector, where a large feature map would hide the damage done to small logits;
* a dynamic batch axis gets the profile 1 / 8 / 64 (the quickstart's batches); any other symbolic dimension is fixed
  to :data:`FIXED_DIM` and named in :attr:`OnnxFileEntry.notes`;
* a model exported with a fixed batch of 1 (``torch.onnx.export`` without ``dynamic_axes``) gets a copy whose first
  axis is symbolic, used only once ONNX Runtime has shown that it gives, at batch 3, the outputs the file gives one
  sample at a time. A graph that hard-codes its batch (e.g. a Reshape to [1, ...], common in detectors) fails that
  check and runs the whole journey at batch 1 instead (:attr:`OnnxFileEntry.max_batch`): calibration and evaluation
  feed one sample per run, the engine's profile is batch 1 and timing uses streams instead of batching; the notes say
  so and why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.zoo.base import Feed, MetricResult, Outputs, Profile, ZooEntry, sample_rng, worst_output_metric

FIXED_DIM = 16
LABELS_KEY = "labels"  # the reserved .npz key: one integer class per sample (unless a model input has that name)
AGREEMENT_METRIC = "worst_output_agreement_vs_fp32"
ACCURACY_METRIC = "top1_accuracy"
AGREEMENT_HOW = (
    "the metric is each variant's agreement with the FP32 model's outputs, judged on the WORST output (top-1 "
    "agreement for [N, C] class scores, cosine otherwise): how far FP16/INT8 move the outputs, not task accuracy"
)
RANDOM_INPUTS_NOTE = (
    f"your ONNX file has no data set: calibration and evaluation use seeded RANDOM inputs, and {AGREEMENT_HOW}"
)
BATCH_PROFILE = (1, 8, 64)
FIXED_BATCH_NOTE = (
    "the journey runs at batch 1: calibration and evaluation feed one sample per run, the engine's profile is batch 1, "
    "and timing uses streams instead of batching"
)
BATCH_DIM = "workbench_batch"  # the symbolic first axis given to a fixed-batch-1 file (a name no export uses)


class OnnxFileEntry(ZooEntry):
    """A quickstart entry for one ONNX file (random inputs, output agreement with FP32)."""

    task = "your ONNX file"
    metric_name = AGREEMENT_METRIC
    higher_is_better = True
    source = "a local ONNX file"
    license = "unknown"
    metric_output = ""
    metric_cache = False  # a data folder's batches can change under the same file: metrics are measured each time

    def __init__(self, path: str | Path, data: str | Path | None = None) -> None:
        from onnx import TensorProto, helper

        from workbench.model import load_onnx

        self.path = Path(path)
        self.source_path = self.path
        model = load_onnx(self.path)
        self.notes: list[str] = []
        self.max_batch: int | None = None  # type: ignore[misc]
        try:
            batch_copy = _symbolic_batch_copy(self.path, model.proto, self.notes)
        except HardCodedBatch as fixed:
            batch_copy = None
            self.max_batch = 1  # type: ignore[misc]
            self.notes.append(f"{fixed}; {FIXED_BATCH_NOTE}")
        if batch_copy is not None:
            self.path = batch_copy
            model = load_onnx(self.path)
        # the zoo declares these per class (ClassVar); an ONNX file sets them per instance (named after the user's
        # file, not the cached batch copy)
        self.name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.source_path.stem) or "model"  # type: ignore[misc]
        self.data = Path(data) if data else None
        self.output_ranks = {
            value.name: len(value.type.tensor_type.shape.dim) if value.type.tensor_type.HasField("shape") else None
            for value in model.proto.graph.output
        }
        self.split_sizes = {"calibration": 256, "evaluation": 256}  # type: ignore[misc]
        initializers = {init.name for init in model.proto.graph.initializer}
        self.inputs: dict[str, tuple[np.dtype, list[int | str]]] = {}
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
            if not dims or (isinstance(dims[0], int) and not (self.max_batch == 1 and dims[0] == 1)):
                raise WorkbenchError(
                    f"{self.path}: input {value.name!r} has no dynamic batch axis (shape {dims}).",
                    expected="inputs whose first axis is a symbolic batch dimension, as the quickstart batches samples",
                )
            self.inputs[value.name] = (dtype, dims)
        self._reference_cache: dict[int, dict[str, np.ndarray]] = {}  # evaluation index -> FP32 outputs
        self._samples: list[dict[str, np.ndarray]] = []
        self._labels: list[int] = []
        self.label_output = ""  # the [N, C] output scored against the labels, when the data carries labels
        self.inputs_note = RANDOM_INPUTS_NOTE
        if self.data is not None:
            self._load_samples(self.data)  # symbolic dimensions take the data's sizes
            sample_shapes = {name: self._samples[0][name].shape for name in self.inputs}
        else:
            size = _runnable_size(self.path, self.inputs, self.notes)
            sample_shapes = {}
            for name, (_dtype, dims) in self.inputs.items():
                for axis, dim in enumerate(dims[1:], start=1):
                    if isinstance(dim, str):
                        self.notes.append(f"input {name!r} axis {axis} ({dim}) fixed to {size}")
                sample_shapes[name] = tuple(dim if isinstance(dim, int) else size for dim in dims[1:])
        batch_sizes = BATCH_PROFILE if self.max_batch is None else (self.max_batch,) * len(BATCH_PROFILE)
        self.profiles: dict[str, Profile] = {  # type: ignore[misc]
            name: tuple((size, *shape) for size in batch_sizes)  # type: ignore[misc]
            for name, shape in sample_shapes.items()
        }
        if self._labels:
            self.label_output = self._classification_output()
            self.metric_name = ACCURACY_METRIC  # type: ignore[misc]
        inputs_from = f"samples from {self.data}" if self.data is not None else "random inputs"
        metric = (
            f"top-1 accuracy of {self.label_output!r} vs the labels"
            if self._labels
            else "worst-output agreement vs FP32"
        )
        self.description = f"{self.source_path.name} (your file: {inputs_from}, metric = {metric})"  # type: ignore[misc]

    def _classification_output(self) -> str:
        """The output the labels score: the model's only [N, C] output (the first one, named in the notes, if more)."""
        ranked = [name for name, rank in self.output_ranks.items() if rank == 2]
        if not ranked:
            raise WorkbenchError(
                f"{self.data}: the batches carry {LABELS_KEY!r} but no output of {self.source_path.name} is [N, C] "
                f"class scores (output ranks {self.output_ranks}).",
                expected=f"a classifier with an [N, C] output, or .npz batches without {LABELS_KEY!r} (the metric is "
                "then agreement with the FP32 outputs)",
            )
        if len(ranked) > 1:
            self.notes.append(f"labels score the first [N, C] output {ranked[0]!r} (of {ranked})")
        return ranked[0]

    def _load_samples(self, folder: Path) -> None:
        """Per-sample feeds from a folder of ``.npz`` batches keyed by input name: the first half calibrates, the
        second half is the evaluation set (disjoint, so ranges are not judged on the samples they were fitted to)."""
        from workbench.zoo.data import read_npz_batches

        samples: list[dict[str, np.ndarray]] = []
        labels: list[int] = []
        labelled: set[bool] = set()
        reserved = {LABELS_KEY} - set(self.inputs)  # a model input called "labels" is an input, not the labels
        # read_npz_batches refuses a missing or empty folder, special files and unreadable or pickled .npz
        # the reader first: it refuses a folder without .npz files (zip stops at its first empty argument)
        for feed, path in zip(read_npz_batches(folder), sorted(folder.glob("*.npz"))):
            missing = sorted(set(self.inputs) - set(feed))
            extra = sorted(set(feed) - set(self.inputs) - reserved)
            if missing or extra:
                raise WorkbenchError(
                    f"{path}: keys {sorted(feed)} do not match the model's inputs {sorted(self.inputs)}"
                    + (f" (missing {missing})" if missing else "")
                    + (f" (not inputs: {extra})" if extra else "")
                    + ".",
                    expected="one array per model input, keyed by input name, batch on the first axis",
                )
            sizes = {name: feed[name].shape[0] if feed[name].ndim else None for name in self.inputs}
            if len(set(sizes.values())) != 1 or None in sizes.values():
                raise WorkbenchError(
                    f"{path}: the arrays do not share one batch axis (first axes {sizes}).",
                    expected="arrays whose first axis is the same number of samples",
                )
            for name, (dtype, dims) in self.inputs.items():
                array = feed[name]
                same_kind = (array.dtype.kind in "biu") if dtype.kind in "biu" else array.dtype.kind == dtype.kind
                if not same_kind:
                    raise WorkbenchError(
                        f"{path}: input {name!r} is {array.dtype}, the model takes {dtype}.",
                        expected=f"{dtype} arrays (or the same kind: float for float, integer for integer)",
                    )
                if array.dtype.kind == "f" and not np.isfinite(array).all():
                    raise WorkbenchError(
                        f"{path}: input {name!r} holds NaN or infinite values.", expected="finite input samples"
                    )
                if array.ndim != len(dims) or any(
                    isinstance(dim, int) and dim != size for dim, size in zip(dims[1:], array.shape[1:])
                ):
                    raise WorkbenchError(
                        f"{path}: input {name!r} has shape {array.shape}, the model takes {dims}.",
                        expected="the model's shape with the batch first",
                    )
            batch = int(next(iter(sizes.values())) or 0)  # one shared, non-None first axis (checked above)
            labelled.add(LABELS_KEY in reserved and LABELS_KEY in feed)
            if len(labelled) > 1:
                raise WorkbenchError(
                    f"{path}: some batches carry {LABELS_KEY!r} and others do not.",
                    expected=f"{LABELS_KEY!r} in every .npz batch (one integer class per sample) or in none",
                )
            if LABELS_KEY in reserved and LABELS_KEY in feed:
                labels.extend(_checked_labels(path, feed[LABELS_KEY], batch))
            samples.extend(
                {name: feed[name][i].astype(self.inputs[name][0]) for name in self.inputs} for i in range(batch)
            )
        if len(samples) < 2:
            raise WorkbenchError(
                f"{folder}: {len(samples)} sample(s); half calibrate and half evaluate.",
                expected="at least 2 samples (hundreds for meaningful ranges and metrics)",
            )
        shapes = {name: {sample[name].shape for sample in samples} for name in self.inputs}
        ragged = {name: sorted(found) for name, found in shapes.items() if len(found) > 1}
        if ragged:
            raise WorkbenchError(
                f"{folder}: samples of different shapes {ragged}.", expected="one shape per input across all batches"
            )
        self._samples = samples
        self._labels = labels
        calibration = (len(samples) + 1) // 2
        self.split_sizes = {"calibration": calibration, "evaluation": len(samples) - calibration}  # type: ignore[misc]
        how = "the metric is top-1 accuracy against the batches' labels" if labels else AGREEMENT_HOW
        self.inputs_note = (
            f"calibration on the first {calibration} of {len(samples)} samples from {folder}, evaluation on the other "
            f"{len(samples) - calibration}; {how}"
        )

    # the file is used where it is: nothing to materialize or cache
    def is_cached(self) -> bool:
        return True

    def onnx_path(self) -> Path:
        return self.path

    def _materialize(self, target: Path) -> dict[str, Any]:
        """The model this entry runs (the file, or its proven batch copy) as one self-contained ONNX file."""
        from workbench.model import load_onnx

        target.write_bytes(load_onnx(self.path).proto.SerializeToString())  # external weights read in, written inline
        return {"source": str(self.source_path), "notes": list(self.notes)}

    def manifest(self) -> dict[str, Any]:
        data = {"data": str(self.data)} if self.data is not None else {}
        return {"name": self.name, "source": str(self.source_path), "notes": list(self.notes), **data}

    def _sample(self, split: str, index: int) -> tuple[Feed, Any]:
        if self._samples:
            offset = 0 if split == "calibration" else self.split_sizes["calibration"]
            label = self._labels[offset + index] if self._labels else None
            return dict(self._samples[offset + index]), label
        shapes = {name: (dtype, self.profiles[name][1][1:]) for name, (dtype, _dims) in self.inputs.items()}
        return _random_feed(shapes, sample_rng(split, index, salt=7)), None

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Any]:
        """Per sample, every output that has the batch axis ({output name: that sample's array}), never joined."""
        batch = len(next(iter(feed.values())))
        arrays = {name: np.asarray(array) for name, array in outputs.items()}
        if self.max_batch == 1:  # one sample per run: every output is that sample's (with or without a leading 1)
            return [{name: array[0] if array.ndim and array.shape[0] == 1 else array for name, array in arrays.items()}]
        batched = {name: array for name, array in arrays.items() if array.ndim and array.shape[0] == batch}
        if not batched:
            raise WorkbenchError(
                f"{self.path}: no output has the batch axis, so there is nothing per sample to compare.",
                expected="at least one output whose first axis is the batch",
            )
        return [{name: array[index] for name, array in batched.items()} for index in range(batch)]

    def _reference(self) -> list[Any]:
        return self._reference_of(list(range(self.split_sizes["evaluation"])))

    def _reference_of(self, indices: list[int]) -> list[dict[str, np.ndarray]]:
        """The FP32 model's outputs for these evaluation samples, computed once each and only when asked for (a
        detector at batch 1 takes seconds per sample: the whole set would be paid for a 16-sample evaluation)."""
        from workbench.zoo.base import make_ort_predict

        missing = [index for index in indices if index not in self._reference_cache]
        if missing:
            predict = make_ort_predict(self.path, disable_optimizations=True)
            step = self.max_batch or 8
            for start in range(0, len(missing), step):
                chunk = missing[start : start + step]
                samples = [self._sample("evaluation", index)[0] for index in chunk]
                feed = {name: np.stack([sample[name] for sample in samples]) for name in samples[0]}
                self._reference_cache.update(zip(chunk, self._reduce(predict(feed), feed)))
        return [self._reference_cache[index] for index in indices]

    def _metric(self, predictions: list[Any], labels: list[Any], indices: list[int]) -> MetricResult:
        inputs = f"samples from {self.data}" if self.data is not None else "seeded random (not real data)"
        if self._labels:
            return self._accuracy(predictions, labels, inputs)
        reference = self._reference_of(indices)
        expected = {name: np.stack([sample[name] for sample in reference]) for name in reference[0]}
        got = _by_output(predictions, list(expected), self.path)
        return worst_output_metric(self.metric_name, got, expected, inputs=inputs)

    def _accuracy(self, predictions: list[Any], labels: list[Any], inputs: str) -> MetricResult:
        from workbench.zoo.digits import classification_metric

        scores = _by_output(predictions, [self.label_output], self.path, single=True)[self.label_output]
        scores = scores.reshape(len(scores), -1)
        classes = scores.shape[1]
        too_large = sorted({int(label) for label in labels if label >= classes})
        if too_large:
            raise WorkbenchError(
                f"{self.data}: labels {too_large[:5]} are not classes of output {self.label_output!r} "
                f"({classes} classes).",
                expected=f"integer labels 0..{classes - 1}",
            )
        result = classification_metric(self.metric_name, list(scores.argmax(axis=1)), labels)
        result.details |= {"output": self.label_output, "inputs": inputs}
        return result


def _by_output(predictions: list[Any], names: list[str], path: Path, *, single: bool = False) -> dict[str, np.ndarray]:
    """The per-sample dicts of :meth:`OnnxFileEntry._reduce` stacked per output, keyed by ``names``. A rewritten model
    (Q/DQ, FP16) keeps the output names; when it does not, outputs are matched by position (or the only output)."""
    found = list(predictions[0])
    if set(names) <= set(found):
        keys = dict(zip(names, names))
    elif len(found) == len(names) and not single:
        keys = dict(zip(names, found))
    elif single and len(found) == 1:
        keys = {names[0]: found[0]}
    else:
        raise WorkbenchError(
            f"{path}: the evaluated model gave outputs {found}, the FP32 model {names}.",
            expected="the FP32 model's outputs (same names, or the same number in the same order)",
        )
    return {name: np.stack([sample[key] for sample in predictions]) for name, key in keys.items()}


def _checked_labels(path: Path, labels: np.ndarray, batch: int) -> list[int]:
    """The labels of one batch: integers >= 0, one per sample."""
    if labels.dtype.kind not in "iu" or labels.shape != (batch,):
        raise WorkbenchError(
            f"{path}: {LABELS_KEY!r} is {labels.dtype} of shape {labels.shape}, the batch holds {batch} samples.",
            expected=f"{LABELS_KEY!r}: one integer class per sample, shape ({batch},)",
        )
    if (labels < 0).any():
        raise WorkbenchError(f"{path}: {LABELS_KEY!r} holds negative classes.", expected="class indices >= 0")
    return [int(label) for label in labels]


# sizes tried for the symbolic dimensions other than the batch when a file has no data: the first that runs
SYMBOLIC_SIZES = (FIXED_DIM, 64, 256, 1024, 4096, 16384)
MAX_PROBE_ELEMENTS = 1 << 24  # per input and sample: a size past this is not tried (two symbolic image sides)


def _runnable_size(path: Path, inputs: dict[str, tuple[np.dtype, list[int | str]]], notes: list[str]) -> int:
    """The first of :data:`SYMBOLIC_SIZES` at which ONNX Runtime runs the model on one random sample with every
    symbolic non-batch dimension set to it; 16 with a note when none does. 16 suits images and tokens, but a
    waveform model's feature extractor needs more samples than its kernels span (a Hugging Face wav2vec2: every
    stage failed at 16, with four different messages)."""
    if not any(isinstance(dim, str) for _dtype, dims in inputs.values() for dim in dims[1:]):
        return FIXED_DIM
    from workbench.ort import cpu_predict

    try:
        predict = cpu_predict(path, what=str(path))
    except WorkbenchError:  # ONNX Runtime cannot load it (a custom op): the stages say so, with the report
        return FIXED_DIM
    failures: list[str] = []
    for size in SYMBOLIC_SIZES:
        shapes = {
            name: (1, *(d if isinstance(d, int) else size for d in dims[1:])) for name, (_, dims) in inputs.items()
        }
        if failures and any(int(np.prod(shape)) > MAX_PROBE_ELEMENTS for shape in shapes.values()):
            break
        feed = _random_feed(
            {name: (dtype, shapes[name]) for name, (dtype, _) in inputs.items()}, np.random.default_rng(0)
        )
        try:
            predict(feed)
        except Exception as error:  # ONNX Runtime raises its own classes; a WorkbenchError from predict names them
            failures.append(f"{size}: {_ort_reason(error)}")
            continue
        if failures:
            notes.append(
                f"symbolic dimensions set to {size}: ONNX Runtime did not run the model at "
                f"{', '.join(f.split(':')[0] for f in failures)} ({failures[0].split(': ', 1)[1]})"
            )
        return size
    # the stages then fail with ONNX Runtime's reason and the report shows what ran (a size baked into a Reshape)
    notes.append(
        f"ONNX Runtime runs the model with its symbolic dimensions at none of "
        f"{', '.join(f.split(':')[0] for f in failures)} on random inputs (at {failures[0]}); they stay "
        f"{FIXED_DIM}: samples of your own (--data DIR) set them"
    )
    return FIXED_DIM


def _random_feed(
    inputs: dict[str, tuple[np.dtype, tuple[int, ...]]], rng: np.random.Generator
) -> dict[str, np.ndarray]:
    feed = {}
    for name, (dtype, shape) in inputs.items():
        if dtype.kind == "f":
            feed[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feed[name] = rng.integers(0, 2, shape).astype(dtype)
    return feed


class HardCodedBatch(Exception):
    """The graph runs one sample at a time only (its batch of 1 is hard-coded inside); the message says why."""


def _symbolic_batch_copy(path: Path, proto: Any, notes: list[str]) -> Path | None:
    """A cached copy of a fixed-batch-1 model with a symbolic first axis, proven with ONNX Runtime; None when the
    model needs none. Raises :class:`HardCodedBatch` when the graph itself fixes the batch at 1 (the journey then runs
    at batch 1), WorkbenchError when the inputs cannot be batched at all."""
    import hashlib

    import onnx
    from onnx import TensorProto, helper

    from workbench._io import write_bytes_atomic
    from workbench.ort import cpu_predict, cpu_session, session_predict
    from workbench.zoo.base import cache_dir

    graph = proto.graph
    weights = {initializer.name for initializer in graph.initializer}
    inputs = [value for value in graph.input if value.name not in weights]

    def first_dim(value: Any) -> Any:
        dims = value.type.tensor_type.shape.dim
        if not len(dims):
            return None
        return dims[0].dim_value if dims[0].HasField("dim_value") else (dims[0].dim_param or "?")

    static = [value for value in inputs if isinstance(first_dim(value), int)]
    if not static:
        return None
    shapes = {value.name: [first_dim(value)] for value in static}

    def refuse(why: str) -> WorkbenchError:
        return WorkbenchError(
            f"{path}: input(s) {sorted(shapes)} have no dynamic batch axis (first axes {sorted(shapes.items())}); "
            f"{why}",
            expected="inputs whose first axis is a symbolic batch dimension (torch.onnx.export(..., dynamic_axes="
            "{name: {0: 'batch'}})), or a batch-1 model whose graph does not hard-code the batch",
        )

    if any(value.type.tensor_type.elem_type in (TensorProto.STRING, TensorProto.UNDEFINED) for value in inputs):
        return None  # the entry refuses non-numeric inputs with its own message
    batched = sorted(value.name for value in inputs if isinstance(first_dim(value), str))
    if batched:  # the others are batched: these are not batch axes (e.g. a broadcast parameter)
        raise refuse(
            f"the other input(s) {batched} are batched, so these are no batch axes; inputs that take no batch (a "
            "parameter fed at run time) are not supported by the quickstart: make them initializers, or give them "
            "the batch axis."
        )
    if any(first_dim(value) != 1 for value in static) or any(first_dim(value) is None for value in inputs):
        raise refuse("only a fixed batch of 1 on every input can be made symbolic here.")
    from workbench.model.onnx_model import PROTOBUF_LIMIT_BYTES

    what_fixed = f"input(s) {sorted(shapes)} of {path.name} take a fixed batch of 1 that the graph hard-codes"

    if proto.ByteSize() >= PROTOBUF_LIMIT_BYTES:  # the copy and its proof hold the whole model in one message
        raise HardCodedBatch(f"{what_fixed}: with its weights it is over 2 GiB, too large for a rewritten copy")
    digest = hashlib.sha256(proto.SerializeToString()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem) or "model"
    target = cache_dir() / "onnx-files" / f"{stem}-{digest}-batch.onnx"
    if target.is_file():
        notes.append(f"first axis of {sorted(shapes)} made symbolic (a fixed batch of 1 in the file; copy {target})")
        return target
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(proto)
    del rewritten.graph.value_info[:]  # shapes inferred for batch 1 would contradict a batch of 3
    batch_outputs = []
    for value in [*rewritten.graph.input, *rewritten.graph.output]:
        if value.name in weights or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1:
            dims[0].dim_param = BATCH_DIM
            if any(value is output for output in rewritten.graph.output):
                batch_outputs.append(value.name)
    if not batch_outputs:
        raise HardCodedBatch(f"{what_fixed}: no output has a first axis of 1 that could follow a batch axis")
    feeds_spec = {
        value.name: (
            np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)),
            tuple(d.dim_value if d.HasField("dim_value") else FIXED_DIM for d in value.type.tensor_type.shape.dim),
        )
        for value in inputs
    }
    rng = np.random.default_rng(2026)
    samples = [_random_feed(feeds_spec, rng) for _ in range(3)]
    try:  # the batch of 3 first: a graph that hard-codes its batch fails here, before the slower one-by-one runs
        probe = cpu_session(rewritten.SerializeToString(), optimized=False, what=str(path), quiet=True)
        at_batch_3 = session_predict(probe, what=str(path))(
            {name: np.concatenate([feed[name] for feed in samples]) for name in feeds_spec}
        )
    except WorkbenchError as error:
        raise HardCodedBatch(f"{what_fixed}: ONNX Runtime could not run it with a batch of 3 ({error})") from None
    except Exception as error:  # ORT's own errors: the graph hard-codes its batch somewhere
        reason = _ort_reason(error)
        raise HardCodedBatch(f"{what_fixed}: ONNX Runtime could not run it with a batch of 3 ({reason})") from None
    for name in batch_outputs:
        shape = np.shape(at_batch_3[name])
        if not shape or shape[0] != len(samples):
            raise HardCodedBatch(f"{what_fixed}: at a batch of 3 output {name!r} has shape {shape}")
    single = cpu_predict(path, optimized=False, what=str(path))
    one_by_one = [single(feed) for feed in samples]
    worst = 0.0
    for name in batch_outputs:
        expected = np.concatenate([np.asarray(outputs[name]) for outputs in one_by_one])
        got = np.asarray(at_batch_3[name])
        if got.shape != expected.shape:
            raise HardCodedBatch(
                f"{what_fixed}: at a batch of 3 output {name!r} has shape {got.shape}, not {expected.shape}"
            )
        if not np.allclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True):
            raise HardCodedBatch(f"{what_fixed}: at a batch of 3 output {name!r} differs from one sample at a time")
        if got.dtype.kind == "f" and got.size:
            worst = max(worst, float(np.nanmax(np.abs(got.astype(np.float64) - expected.astype(np.float64)))))
    write_bytes_atomic(target, rewritten.SerializeToString())
    notes.append(
        f"first axis of {sorted(shapes)} made symbolic (a fixed batch of 1 in the file): ONNX Runtime gave the same "
        f"outputs at batch 3 as one sample at a time (3 random samples, max abs diff {worst:.2g}); copy {target}"
    )
    return target


def _ort_reason(error: Exception) -> str:
    """The useful part of an ONNX Runtime error: the node's status message without the source-file prefix."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    text = text.split("Status Message:", 1)[-1]
    text = text.split(" was false. ", 1)[-1]
    return text.strip()[:300]
