"""The ``calibration/`` folder's batch format: one ``.npz`` file per batch, one array per model input name.

See ``calibration/README.md``. Files are written atomically and read back in name order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from workbench._io import atomic_path
from workbench.errors import WorkbenchError


def write_npz_batches(
    batches: Iterable[dict[str, np.ndarray]], folder: str | os.PathLike[str], prefix: str = "batch"
) -> list[Path]:
    """Write each feed as ``FOLDER/<prefix>_00000.npz`` (uncompressed, arrays keyed by input name)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise WorkbenchError(f"{folder}: exists and is not a folder.", expected="a folder for .npz calibration batches")
    written = []
    for number, feed in enumerate(batches):
        target = folder / f"{prefix}_{number:05d}.npz"
        with atomic_path(target) as tmp:
            with open(tmp, "wb") as handle:
                np.savez(handle, **{name: np.asarray(value) for name, value in feed.items()})  # type: ignore[arg-type]
        written.append(target)
    return written


def read_npz_batches(
    folder: str | os.PathLike[str], input_names: Iterable[str] | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Yield the feeds stored in ``FOLDER/*.npz`` in file-name order, checking the keys when ``input_names`` is given."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkbenchError(f"{folder}: no such folder.", expected="a folder of .npz calibration batches")
    files = sorted(folder.glob("*.npz"))
    if not files:
        from collections import Counter

        others = Counter(path.suffix.lower() or "(no suffix)" for path in folder.iterdir() if path.is_file())
        held = ", ".join(f"{count} {suffix}" for suffix, count in others.most_common(4))
        raise WorkbenchError(
            f"{folder}: holds no .npz files" + (f" (it holds {held} file(s))." if held else "."),
            expected="one .npz file per batch, arrays keyed by model input name",
        )
    expected = set(input_names) if input_names is not None else None
    from workbench._arrays import read_npz

    for path in files:
        feed = read_npz(path, expected="an .npz written by numpy.savez")
        if expected is not None and set(feed) != expected:
            raise WorkbenchError(
                f"{path}: holds arrays {sorted(feed)}.", expected=f"exactly the model inputs {sorted(expected)}"
            )
        yield feed
