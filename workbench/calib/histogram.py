"""Streaming |x| histograms that merge exactly and do not depend on batch order.

Each tensor keeps at most ``NUM_BINS`` integer counts over [0, NUM_BINS * width). The bin width is always a power of
two, so the grids nest: when a batch exceeds the current range, the width doubles (adjacent pairs of counts are
summed, which is exact because every coarse edge is also a fine edge) instead of re-binning with interpolation.
The histogram after any sequence of batches therefore equals the histogram of all the data binned once at the final
width, so it is independent of batch order and of batch size, and memory is constant per tensor.

Why not TensorRT's "append bins of the same width" scheme: there the width is fixed by the *first* batch, so the
result depends on batch order, and the bin count (memory) grows without bound when a later batch has a larger range.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError

NUM_BINS = 2048


def _width_for(amax: float) -> float:
    """Smallest power of two ``w`` with ``amax < NUM_BINS * w`` (so amax itself falls inside the last bin)."""
    if amax <= 0.0:
        return 0.0
    exponent = math.floor(math.log2(amax / NUM_BINS)) + 1
    width = math.ldexp(1.0, exponent)
    while amax >= NUM_BINS * width:  # guard against log2 rounding at exact powers of two
        width *= 2.0
    while width > math.ldexp(1.0, -1074) and amax < NUM_BINS * width / 2.0:
        width /= 2.0
    return width


def _coarsen(counts: np.ndarray, factor: int) -> np.ndarray:
    """Sum groups of ``factor`` adjacent bins (factor is a power of two); exact for integer counts."""
    if factor == 1:
        return counts
    padded = np.zeros(NUM_BINS * factor, dtype=counts.dtype)
    padded[: counts.size] = counts
    merged = padded.reshape(NUM_BINS, factor).sum(axis=1)
    return merged


@dataclass
class TensorHistogram:
    """Histogram of |x| for one tensor plus signed min/max and the element count.

    Mutable on purpose: an accumulator that ``add`` grows batch by batch (merging re-bins in place); its JSON is
    the sparse form a calibration cache stores.
    """

    name: str
    width: float = 0.0  # 0 until a non-zero value has been seen
    counts: np.ndarray = field(default_factory=lambda: np.zeros(NUM_BINS, dtype=np.int64))
    zero_count: int = 0  # elements seen while width == 0 (all exactly zero); folded into bin 0 later
    minimum: float = math.inf
    maximum: float = -math.inf
    count: int = 0
    nonfinite: int = 0

    @property
    def amax(self) -> float:
        """Largest |x| seen (exact, not a bin edge)."""
        if self.count == 0:
            return 0.0
        return float(max(abs(self.minimum), abs(self.maximum)))

    @property
    def total_counts(self) -> np.ndarray:
        counts = self.counts.copy()
        counts[0] += self.zero_count
        return counts

    @property
    def edges(self) -> np.ndarray:
        """Upper edge of each bin: ``edges[i] = (i + 1) * width``."""
        return (np.arange(NUM_BINS, dtype=np.float64) + 1.0) * self.width

    def _regrid(self, width: float) -> None:
        if width <= self.width:
            return
        if self.width == 0.0:
            self.counts = np.zeros(NUM_BINS, dtype=np.int64)
        else:
            factor = int(round(width / self.width))
            self.counts = _coarsen(self.counts, factor)
        self.width = width

    def add(self, values: np.ndarray) -> None:
        """Fold one batch of values into the histogram."""
        flat = np.asarray(values)
        if flat.dtype.kind not in "fiu":
            raise WorkbenchError(
                f"tensor {self.name!r} has dtype {flat.dtype}; only numeric tensors get histograms.",
                expected="a float tensor",
            )
        flat = flat.astype(np.float32, copy=False).ravel()
        if flat.size == 0:
            return
        finite = np.isfinite(flat)
        if not finite.all():
            self.nonfinite += int((~finite).sum())
            flat = flat[finite]
            if flat.size == 0:
                return
        low, high = float(flat.min()), float(flat.max())
        self.minimum = min(self.minimum, low)
        self.maximum = max(self.maximum, high)
        self.count += int(flat.size)
        batch_amax = max(abs(low), abs(high))
        if batch_amax == 0.0 and self.width == 0.0:
            self.zero_count += int(flat.size)
            return
        self._regrid(max(self.width, _width_for(batch_amax)))
        # Multiplying by 1/width (a power of two) is exact in float, so the bin index is exact.
        if self.width >= 2.0**-100:
            index = np.abs(flat)
            np.multiply(index, np.float32(1.0 / self.width), out=index)
        else:  # 1/width would overflow float32
            index = np.abs(flat.astype(np.float64)) * (1.0 / self.width)
        bins = index.astype(np.int64)
        np.minimum(bins, NUM_BINS - 1, out=bins)
        self.counts += np.bincount(bins, minlength=NUM_BINS)

    def merge(self, other: TensorHistogram) -> None:
        """Add another histogram of the same tensor (e.g. from a parallel worker). Exact."""
        width = max(self.width, other.width)
        self._regrid(width)
        theirs = other.counts
        if other.width and other.width < width:
            theirs = _coarsen(theirs, int(round(width / other.width)))
        if other.width:
            self.counts = self.counts + theirs
        self.zero_count += other.zero_count
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        self.count += other.count
        self.nonfinite += other.nonfinite

    def digest(self) -> str:
        """Short content hash of the histogram (width, counts, min/max): equal digests mean equal statistics."""
        h = hashlib.sha256()
        h.update(np.float64(self.width).tobytes())
        h.update(self.total_counts.astype("<i8").tobytes())
        h.update(np.array([self.minimum, self.maximum], dtype="<f8").tobytes())
        h.update(np.int64(self.count).tobytes())
        return h.hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        nonzero = np.flatnonzero(self.total_counts)
        return {
            "name": self.name,
            "width": self.width,
            "min": self.minimum if self.count else None,
            "max": self.maximum if self.count else None,
            "count": self.count,
            "nonfinite": self.nonfinite,
            # sparse form keeps cache files small: most bins past the data are empty
            "bins": nonzero.tolist(),
            "counts": self.total_counts[nonzero].tolist(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TensorHistogram:
        hist = cls(str(data["name"]))
        hist.width = float(data["width"])
        counts = np.zeros(NUM_BINS, dtype=np.int64)
        counts[np.asarray(data["bins"], dtype=np.int64)] = np.asarray(data["counts"], dtype=np.int64)
        if hist.width == 0.0:
            hist.zero_count = int(counts.sum())
        else:
            hist.counts = counts
        hist.minimum = math.inf if data.get("min") is None else float(data["min"])
        hist.maximum = -math.inf if data.get("max") is None else float(data["max"])
        hist.count = int(data["count"])
        hist.nonfinite = int(data.get("nonfinite", 0))
        return hist
