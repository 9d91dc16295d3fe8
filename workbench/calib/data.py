"""Calibration data sources: a ``calibration/`` folder, a Python iterable, a zoo entry, or (only when asked) random data.

Every source yields feeds ``{input_name: np.ndarray}`` one batch at a time; nothing holds the whole set in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from workbench._arrays import to_native
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.model import OnnxModel, TensorSpec
    from workbench.zoo.base import ZooEntry

Feed = dict[str, np.ndarray]
RANDOM_DATA_WARNING = (
    "calibration used RANDOM data: the ranges describe noise, not your inputs, so INT8 accuracy "
    "measured with them means little. Pass real data (--data DIR or --data zoo)."
)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


@runtime_checkable
class CalibrationSource(Protocol):
    """Anything that yields calibration feeds. ``is_random`` marks synthetic data (reports then carry a warning)."""

    name: str
    is_random: bool

    def batches(self, limit: int | None = None) -> Iterator[Feed]: ...

    def __len__(self) -> int: ...


def feed_digest(feed: Feed) -> str:
    """Content hash of one feed (names, dtypes, shapes, bytes)."""
    digest = hashlib.sha256()
    for name in sorted(feed):
        array = np.ascontiguousarray(feed[name])
        digest.update(name.encode())
        digest.update(str(array.dtype).encode())
        digest.update(str(array.shape).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def combine_digests(digests: Iterable[str]) -> str:
    """Order-independent digest of a data set (sorted per-batch digests), matching order-independent statistics."""
    digest = hashlib.sha256()
    for item in sorted(digests):
        digest.update(item.encode())
    return digest.hexdigest()[:16]


@dataclass
class IterableSource:
    """Wraps a re-iterable collection (list of feeds) or a zero-argument factory returning an iterator of feeds."""

    data: Sequence[Feed] | Callable[[], Iterable[Feed]]
    name: str = "iterable"
    is_random: bool = False

    def batches(self, limit: int | None = None) -> Iterator[Feed]:
        iterable = self.data() if callable(self.data) else self.data
        for index, feed in enumerate(iterable):
            if limit is not None and index >= limit:
                return
            if not isinstance(feed, dict):
                raise WorkbenchError(
                    f"calibration batch {index} is a {type(feed).__name__}.",
                    expected="a dict {input_name: numpy array}",
                )
            yield {str(k): to_native(np.asarray(v)) for k, v in feed.items()}

    def __len__(self) -> int:
        return len(self.data) if not callable(self.data) else 0


@dataclass
class FolderSource:
    """``.npz`` files (each one batch keyed by input name), read in sorted order; or images given a ``preprocess``.

    ``preprocess(list_of_paths) -> feed`` turns a group of ``batch_size`` image files into one feed (the zoo entry's
    own preprocessing).
    """

    folder: Path
    preprocess: Callable[[list[Path]], Feed] | None = None
    batch_size: int = 8
    name: str = ""
    is_random: bool = False
    files: list[Path] = field(default_factory=list, init=False)
    kind: str = field(default="npz", init=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if not self.folder.is_dir():
            raise WorkbenchError(
                f"{self.folder}: not a folder.", expected="a calibration folder with .npz batches or images"
            )
        self.name = self.name or str(self.folder)
        # calibration/README.md layout: <model>/batches/*.npz or <model>/images/*.png under the model folder
        if not any(p.is_file() for p in self.folder.iterdir()):
            for sub in ("batches", "images"):
                if (self.folder / sub).is_dir() and any((self.folder / sub).iterdir()):
                    self.folder = self.folder / sub
                    break
        self.files = sorted(p for p in self.folder.iterdir() if p.suffix == ".npz")
        if not self.files:
            images = sorted(p for p in self.folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not images:
                raise WorkbenchError(
                    f"{self.folder}: holds no .npz batches and no images.",
                    expected="files like batch_000.npz keyed by input name, or .png/.jpg images",
                )
            if self.preprocess is None:
                raise WorkbenchError(
                    f"{self.folder}: holds images but no preprocessing was given.",
                    expected="a zoo model name (its preprocessing is used) or .npz batches",
                    hint="calibrate a zoo model (workbench calibrate digits-cnn --data DIR) or save .npz batches",
                )
            self.files = images
            self.kind = "images"
        from workbench._io import refuse_special_file

        for path in self.files:  # a FIFO named batch_1.npz would block the first read forever
            refuse_special_file(path, expected="calibration batches that are regular .npz or image files")

    def batches(self, limit: int | None = None) -> Iterator[Feed]:
        if self.kind == "images":
            groups = [self.files[i : i + self.batch_size] for i in range(0, len(self.files), self.batch_size)]
            for index, group in enumerate(groups):
                if limit is not None and index >= limit:
                    return
                yield self.preprocess(group)  # type: ignore[misc]
            return
        for index, path in enumerate(self.files):
            if limit is not None and index >= limit:
                return
            yield read_npz_batch(path)

    def __len__(self) -> int:
        if self.kind == "images":
            return (len(self.files) + self.batch_size - 1) // self.batch_size
        return len(self.files)


@dataclass
class ZooSource:
    """The zoo entry's own calibration split (disjoint from its evaluation split)."""

    entry: ZooEntry
    name: str = ""
    is_random: bool = False

    def __post_init__(self) -> None:
        self.name = self.name or f"zoo:{self.entry.name}"

    batch_size: int = 8

    def batches(self, limit: int | None = None) -> Iterator[Feed]:
        # the zoo's limit counts samples; ours counts batches
        samples = None if limit is None else limit * self.batch_size
        yield from self.entry.calibration_batches(limit=samples, batch_size=self.batch_size)

    def __len__(self) -> int:
        sizes = getattr(self.entry, "split_sizes", {}) or {}
        return -(-int(sizes.get("calibration", 0)) // self.batch_size)


@dataclass
class RandomSource:
    """Uniform random feeds shaped like the model inputs (dynamic dims -> ``dynamic_dim``). Only when asked for."""

    input_specs: Sequence[TensorSpec]
    num_batches: int = 4
    batch_size: int = 4
    dynamic_dim: int = 32
    seed: int = 0
    name: str = "random"
    is_random: bool = True

    def batches(self, limit: int | None = None) -> Iterator[Feed]:
        rng = np.random.default_rng(self.seed)
        count = self.num_batches if limit is None else min(limit, self.num_batches)
        for _ in range(count):
            feed: Feed = {}
            for spec in self.input_specs:
                shape = [d if isinstance(d, int) and d > 0 else self.dynamic_dim for d in spec.shape]
                if shape and not (isinstance(spec.shape[0], int) and spec.shape[0] > 0):
                    shape[0] = self.batch_size
                if spec.dtype.startswith("float"):
                    feed[spec.name] = rng.uniform(-1.0, 1.0, size=shape).astype(spec.dtype)
                else:
                    feed[spec.name] = rng.integers(0, 2, size=shape).astype(spec.dtype)
            yield feed

    def __len__(self) -> int:
        return self.num_batches


def read_npz_batch(path: Path) -> Feed:
    """One ``.npz`` batch keyed by input name (no pickles; sizes checked before reading, native byte order)."""
    from workbench._arrays import read_npz

    return read_npz(path, expected="numpy .npz keyed by input name")


def resolve_source(
    data: Any, *, model: OnnxModel | None = None, entry: ZooEntry | None = None, batch_size: int = 8
) -> CalibrationSource:
    """Turn a ``--data`` value or Python object into a source.

    ``"zoo"`` -> the zoo entry's calibration split; ``"random"`` -> random data (warned about everywhere);
    a folder path -> :class:`FolderSource` (images use the zoo entry's preprocessing when one is known);
    a list / callable of feeds -> :class:`IterableSource`; an object already satisfying the protocol is returned.
    """
    if isinstance(data, CalibrationSource) and not isinstance(data, (str, Path)):
        return data
    if isinstance(data, (str, Path)):
        text = str(data)
        if text == "zoo":
            if entry is None:
                raise WorkbenchError(
                    "--data zoo needs a zoo model.", expected="a zoo model name as the model argument, or --data DIR"
                )
            return ZooSource(entry)
        if text == "random":
            if model is None:
                raise WorkbenchError("--data random needs the model's input shapes.", expected="an ONNX model")
            return RandomSource(model.inputs)
        preprocess = _image_loader(entry) if entry is not None else None
        return FolderSource(Path(text), preprocess=preprocess, batch_size=batch_size)
    if isinstance(data, (list, tuple)) or callable(data):
        return IterableSource(data)
    raise WorkbenchError(
        f"cannot use a {type(data).__name__} as calibration data.",
        expected="'zoo', 'random', a folder path, a list of feeds, or a CalibrationSource",
    )


def _image_loader(entry: ZooEntry) -> Callable[[list[Path]], Feed] | None:
    """The zoo entry's own preprocessing over a group of image files (paths are handed over as they are)."""
    preprocess = getattr(entry, "preprocess_images", None)
    if preprocess is None:
        return None

    def load(paths: list[Path]) -> Feed:
        try:
            return preprocess([str(p) for p in paths])
        except NotImplementedError as error:
            raise WorkbenchError(
                f"zoo model {entry.name!r} has no image preprocessing.", expected=".npz batches"
            ) from error

    return load
