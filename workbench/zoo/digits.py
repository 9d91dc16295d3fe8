"""``digits-cnn``: a small CNN we train ourselves on scikit-learn's 8x8 digits, upsampled to 32x32.

The trained ONNX is committed (``assets/digits_cnn.onnx``); ``scripts/train_digits_cnn.py`` regenerates it. The
450-image held-out test split (stratified, seed 0) is the evaluation set and is never used for training;
calibration samples come from the training split.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError
from workbench.zoo.base import Feed, Label, MetricResult, Outputs, Prediction, ZooEntry, _flat_rows

ASSETS = Path(__file__).resolve().parent / "assets"
DIGITS_ONNX = ASSETS / "digits_cnn.onnx"
# Torch logits of the test split, written by the training script: the committed ONNX is checked against them.
DIGITS_REFERENCE = ASSETS / "digits_cnn_reference.npz"
IMAGE_SIZE = 32
TEST_SIZE = 450
SPLIT_SEED = 0
INPUT_NAME = "image"
OUTPUT_NAME = "logits"


@functools.lru_cache(maxsize=1)
def digits_dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(images [1797,1,32,32] float32 in [-1,1], labels [1797], train indices, test indices). Deterministic."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = preprocess_digits(digits.images)
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=TEST_SIZE, random_state=SPLIT_SEED, stratify=labels
    )
    return images, labels, np.sort(train_idx), np.sort(test_idx)


def preprocess_digits(images: np.ndarray) -> np.ndarray:
    """8x8 digit images with values 0..16 (sklearn) -> [N,1,32,32] float32 in [-1, 1] (bilinear 4x upsampling)."""
    from scipy.ndimage import zoom

    images = np.asarray(images, dtype=np.float32)
    if images.ndim == 2:
        images = images[None]
    if images.ndim != 3 or images.shape[1:] != (8, 8):
        raise WorkbenchError(
            f"digit images of shape {images.shape} cannot be preprocessed.",
            expected="[N, 8, 8] arrays with values 0..16",
        )
    scaled = zoom(images / 16.0, (1, IMAGE_SIZE / 8, IMAGE_SIZE / 8), order=1, mode="nearest", grid_mode=True)
    return ((np.clip(scaled, 0.0, 1.0) - 0.5) / 0.5).astype(np.float32)[:, None]


class DigitsCnnEntry(ZooEntry):
    name = "digits-cnn"
    description = "5-conv CNN trained by scripts/train_digits_cnn.py on scikit-learn digits (32x32 grayscale)"
    task = "image classification (10 digits)"
    metric_name = "top1_accuracy"
    source = "trained by trt-workbench (scripts/train_digits_cnn.py) on sklearn.datasets.load_digits"
    license = "Apache-2.0 (model), BSD-3-Clause (data)"
    split_sizes = {"calibration": 512, "evaluation": TEST_SIZE}
    profiles = {
        INPUT_NAME: ((1, 1, IMAGE_SIZE, IMAGE_SIZE), (8, 1, IMAGE_SIZE, IMAGE_SIZE), (64, 1, IMAGE_SIZE, IMAGE_SIZE))
    }
    metric_output = OUTPUT_NAME

    def _materialize(self, target: Path) -> JsonObject:
        if not DIGITS_ONNX.is_file():
            raise WorkbenchError(
                f"{DIGITS_ONNX}: the committed digits model is missing.",
                hint="regenerate it with: python scripts/train_digits_cnn.py",
            )
        shutil.copyfile(DIGITS_ONNX, target)
        return {"copied_from": str(DIGITS_ONNX)}

    def _source_fingerprint(self) -> str:
        from workbench._io import sha256_file

        return sha256_file(DIGITS_ONNX) if DIGITS_ONNX.is_file() else "missing"

    def _sample(self, split: str, index: int) -> tuple[Feed, Label]:
        images, labels, train_idx, test_idx = digits_dataset()
        if split == "evaluation":
            row = test_idx[index]
        else:
            # a fixed shuffle of the training split, so a calibration prefix covers every class
            row = train_idx[np.random.default_rng(SPLIT_SEED).permutation(len(train_idx))[index]]
        return {INPUT_NAME: images[row]}, int(labels[row])

    def preprocess_images(self, images: Sequence[str | Path | np.ndarray] | np.ndarray) -> Feed:
        """Digit images -> the model feed.

        Accepts 8x8 arrays on sklearn's 0..16 scale, or image files / uint8 grayscale arrays of any size with
        bright ink on a dark background (as sklearn's digits are), resized to 32x32.
        """
        if isinstance(images, np.ndarray) and images.ndim in (2, 3) and images.shape[-2:] == (8, 8):
            return {INPUT_NAME: preprocess_digits(images)}
        return {INPUT_NAME: np.stack([_digit_from_image(image) for image in images])}

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        return list(_flat_rows(self._output(outputs, self.metric_output)).argmax(axis=1))

    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        return classification_metric(self.metric_name, predictions, labels)


def _digit_from_image(image: str | Path | np.ndarray) -> np.ndarray:
    from PIL import Image

    if isinstance(image, (str, Path)):
        from workbench._arrays import open_image

        loaded = open_image(image, "L")  # size checked from the header before decoding
    else:
        array = np.asarray(image)
        if array.shape == (8, 8):
            return preprocess_digits(array)[0]
        if array.ndim == 3:
            array = array.mean(axis=2)
        if array.ndim != 2:
            raise WorkbenchError(
                f"a digit image of shape {array.shape} cannot be preprocessed.", expected="a 2-D grayscale image"
            )
        loaded = Image.fromarray(np.clip(array, 0, 255).astype(np.uint8))
    resized = np.asarray(loaded.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
    return ((resized - 0.5) / 0.5).astype(np.float32)[None]


def classification_metric(name: str, predictions: Sequence[Prediction], labels: Sequence[Label]) -> MetricResult:
    predicted = np.asarray(predictions, dtype=np.int64)
    truth = np.asarray(labels, dtype=np.int64)
    correct = predicted == truth
    wrong = np.flatnonzero(~correct)
    return MetricResult(
        name=name,
        value=float(correct.mean()) if len(correct) else float("nan"),
        higher_is_better=True,
        n_samples=int(len(correct)),
        scores=[float(c) for c in correct],
        details={
            "correct": int(correct.sum()),
            "first_errors": [[int(i), int(truth[i]), int(predicted[i])] for i in wrong[:10]],
        },
    )
