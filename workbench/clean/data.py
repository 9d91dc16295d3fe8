"""The user's own input batches for the equivalence checks (``workbench clean MODEL --data DIR``).

Same format and loader as ``workbench calibrate``: a folder of ``.npz`` files, one batch each keyed by input name
(``calibration/README.md``), or ``zoo`` for a zoo model's calibration split. Also accepted here: a single ``.npz``
file, and ``.npy`` files (a folder or one file) for a model with one input. Each batch is validated against the
model's inputs by the checker (names, dtypes, ranks, fixed dimensions).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.calib.data import read_npz_batch, resolve_source
from workbench.errors import WorkbenchError
from workbench.model import TensorSpec

if TYPE_CHECKING:
    from workbench.zoo.base import ZooEntry

# the user's check inputs: a folder or file of batches, "zoo" (a zoo model's calibration split), or the feeds
CheckData = str | os.PathLike[str] | Sequence[Mapping[str, np.ndarray]]

DEFAULT_CHECK_BATCHES = 4


def _npy_batches(files: list[Path], inputs: Sequence[TensorSpec], limit: int) -> list[dict[str, np.ndarray]]:
    if len(inputs) != 1:
        raise WorkbenchError(
            f"{files[0]}: .npy batches hold one array, but the model has {len(inputs)} inputs "
            f"{[spec.name for spec in inputs]}.",
            expected=".npz batches keyed by input name",
        )
    from workbench._arrays import read_npy

    return [{inputs[0].name: read_npy(path)} for path in files[:limit]]


def _refuse_degenerate(feeds: list[dict[str, np.ndarray]], label: str) -> list[dict[str, np.ndarray]]:
    """Batches that cannot show a difference are refused: empty ones, and float inputs with no finite value."""
    for index, feed in enumerate(feeds):
        for name, array in feed.items():
            array = np.asarray(array)
            if array.size == 0:
                raise WorkbenchError(
                    f"--data {label}: batch {index} input {name!r} holds no sample (shape {array.shape}).",
                    expected="batches with at least one sample",
                )
            if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).any():
                raise WorkbenchError(
                    f"--data {label}: batch {index} input {name!r} is entirely NaN/Inf: outputs could not be compared.",
                    expected="finite input values",
                )
    return feeds


def load_check_batches(
    data: CheckData, inputs: Sequence[TensorSpec], limit: int = DEFAULT_CHECK_BATCHES, entry: ZooEntry | None = None
) -> tuple[list[dict[str, np.ndarray]], str]:
    """Up to ``limit`` batches from ``data`` (folder, file, ``"zoo"``, or a list of feeds) and a label for them."""
    if limit is None or int(limit) < 1:
        raise WorkbenchError(f"--check-batches {limit} compares on no batch.", expected="a positive number of batches")
    limit = int(limit)
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        feeds = [dict(feed) for feed in list(data)[:limit] if isinstance(feed, Mapping)]
        if len(feeds) != min(limit, len(data)):
            raise WorkbenchError("check data holds something other than feeds.", expected="dicts {input_name: array}")
        return _refuse_degenerate(feeds, "data"), "data"
    text = str(data)
    if text != "zoo":
        path = Path(text)
        if not path.exists():
            raise WorkbenchError(f"--data {text}: no such file or folder.", expected="a folder of .npz/.npy batches")
        if not path.is_dir() and not path.is_file():
            from workbench._io import special_file_kind

            raise WorkbenchError(
                f"--data {text}: is {special_file_kind(path) or 'not a regular file'}.",
                expected="a folder of .npz/.npy batches, or one such file",
            )
        if path.is_file():
            if path.suffix == ".npz":
                return _refuse_degenerate([read_npz_batch(path)], str(path)), str(path)
            if path.suffix == ".npy":
                return _refuse_degenerate(_npy_batches([path], inputs, limit), str(path)), str(path)
            raise WorkbenchError(f"--data {path}: not an .npz or .npy file.", expected=".npz or .npy batches")
        npy = sorted(p for p in path.iterdir() if p.suffix == ".npy")
        if npy and not any(p.suffix == ".npz" for p in path.iterdir()):
            return _refuse_degenerate(_npy_batches(npy, inputs, limit), str(path)), str(path)

    source = resolve_source(data, entry=entry)
    feeds = list(source.batches(limit=limit))
    if not feeds:
        raise WorkbenchError(f"--data {text}: holds no batch.", expected="at least one .npz batch")
    return _refuse_degenerate(feeds, text), source.name
