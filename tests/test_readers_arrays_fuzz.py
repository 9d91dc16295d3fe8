"""Property tests for the size-checked readers of workbench/_arrays.py (issue 23): any array numpy writes reads back
equal and in native byte order; any damage to an .npz, .npy or image file is either read or refused with a
WorkbenchError (never zlib.error, MemoryError, DecompressionBombError, ...); a header's declared size is refused
before it is allocated; casts keep every value or refuse.
"""

from __future__ import annotations

import io
import math
import struct
import zipfile
import zlib
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench._arrays import cast_exactly, image_size, open_image, read_npy, read_npz
from workbench.errors import WorkbenchError

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
DTYPES = st.sampled_from(["<f4", ">f4", "<f8", ">f8", "<i8", ">i8", "<i4", ">u2", "|u1", "|b1", "<f2", ">c8"])
ARRAYS = DTYPES.flatmap(lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype.newbyteorder("=") == b.dtype and np.array_equal(a, b, equal_nan=True)


@FUZZ
@given(arrays=st.lists(ARRAYS, min_size=1, max_size=3), compressed=st.booleans(), fortran=st.booleans())
def test_npz_round_trip_in_native_order(
    tmp_path: Path, arrays: list[np.ndarray], compressed: bool, fortran: bool
) -> None:
    feed = {f"a{index}": (np.asfortranarray(a) if fortran else a) for index, a in enumerate(arrays)}
    path = tmp_path / "batch.npz"
    (np.savez_compressed if compressed else np.savez)(path, **feed)
    loaded = read_npz(path)
    assert sorted(loaded) == sorted(feed)
    for name, array in feed.items():
        assert _same(array, loaded[name]), (array, loaded[name])
        assert loaded[name].dtype.isnative or loaded[name].dtype.byteorder == "|"


@FUZZ
@given(array=ARRAYS)
def test_npy_round_trip_in_native_order(tmp_path: Path, array: np.ndarray) -> None:
    path = tmp_path / "batch.npy"
    np.save(path, array)
    loaded = read_npy(path)
    assert _same(array, loaded)


def _damage(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    damaged = bytearray(data)
    for position, value in edits:
        damaged[position % len(damaged)] = value
    return bytes(damaged[: cut % (len(damaged) + 1)] if cut is not None else damaged)


EDITS = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6)
CUT = st.none() | st.integers(0, 10**6)


@FUZZ
@given(edits=EDITS, cut=CUT, compressed=st.booleans())
def test_damaged_npz_is_read_or_refused(
    tmp_path: Path, edits: list[tuple[int, int]], cut: int | None, compressed: bool
) -> None:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, x=np.arange(600, dtype=np.float32).reshape(150, 4))
    path = tmp_path / "batch.npz"
    path.write_bytes(_damage(buffer.getvalue(), edits, cut))
    try:
        loaded = read_npz(path)
    except WorkbenchError as error:
        assert str(path) in str(error)
        return
    assert all(isinstance(value, np.ndarray) for value in loaded.values())


@FUZZ
@given(edits=EDITS, cut=CUT)
def test_damaged_npy_is_read_or_refused(tmp_path: Path, edits: list[tuple[int, int]], cut: int | None) -> None:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(60, dtype=">f8").reshape(15, 4))
    path = tmp_path / "batch.npy"
    path.write_bytes(_damage(buffer.getvalue(), edits, cut))
    try:
        read_npy(path)
    except WorkbenchError as error:
        assert str(path) in str(error)


@FUZZ
@given(shape=st.lists(st.integers(0, 2**40), min_size=1, max_size=4), stored=st.integers(0, 256))
def test_declared_size_is_checked_before_allocation(tmp_path: Path, shape: list[int], stored: int) -> None:
    """A header may declare any shape: the array is read only when the bytes stored match it exactly."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": tuple(shape)})
    path = tmp_path / "batch.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + b"\x00" * stored)
    declared = math.prod(shape) * 4
    representable = math.prod(d for d in shape if d) * 4 < 2**63  # numpy refuses larger shapes even when empty
    if declared == stored and representable:
        assert read_npz(path)["x"].shape == tuple(shape)
    else:
        with pytest.raises(WorkbenchError):
            read_npz(path)


def _png(width: int, height: int, rows: int) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    pixels = zlib.compress((b"\x00" + b"\x7f" * width) * rows if rows else b"")  # rows=0: header only
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


@FUZZ
@given(width=st.integers(1, 2**31 - 1), height=st.integers(1, 2**31 - 1), limit=st.integers(1, 10**8))
def test_image_size_is_refused_from_the_header(tmp_path: Path, width: int, height: int, limit: int) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(_png(width, height, rows=0))
    if width * height > limit:
        with pytest.raises(WorkbenchError, match="pixels"):
            image_size(path, max_pixels=limit)
    else:
        assert image_size(path, max_pixels=limit) == (width, height)


@FUZZ
@given(edits=EDITS, cut=CUT, mode=st.sampled_from(["L", "RGB"]))
def test_damaged_image_is_read_or_refused(
    tmp_path: Path, edits: list[tuple[int, int]], cut: int | None, mode: str
) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(_damage(_png(24, 16, rows=16), edits, cut))
    try:
        image = open_image(path, mode, max_pixels=100_000)
    except WorkbenchError as error:
        assert str(path) in str(error)
        return
    assert image.mode == mode and image.size[0] * image.size[1] <= 100_000


@FUZZ
@given(values=hnp.arrays(np.int64, st.integers(1, 20), elements=st.integers(-(2**63), 2**63 - 1)))
def test_integer_narrowing_keeps_every_value_or_refuses(values: np.ndarray) -> None:
    try:
        cast = cast_exactly(values, np.int32, "x")
    except WorkbenchError as error:
        assert "outside int32" in str(error)
        assert values.min() < -(2**31) or values.max() >= 2**31
        return
    assert cast.dtype == np.int32 and np.array_equal(cast.astype(np.int64), values)


@FUZZ
@given(values=hnp.arrays(np.float64, st.integers(1, 20), elements=st.floats(allow_nan=True, allow_infinity=True)))
def test_float_narrowing_makes_no_new_inf_or_refuses(values: np.ndarray) -> None:
    try:
        cast = cast_exactly(values, np.float32, "x")
    except WorkbenchError as error:
        assert "overflow float32" in str(error)
        assert (np.abs(values[np.isfinite(values)]) > np.finfo(np.float32).max).any()
        return
    assert cast.dtype == np.float32
    assert np.array_equal(np.isfinite(cast), np.isfinite(values))
