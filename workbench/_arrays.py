"""Readers for the user's arrays and images that check sizes before allocating anything, and exact dtype casts.

``numpy.load`` trusts a file's header: an ``.npz`` member declaring a 4 TiB array is allocated (or fails with a
MemoryError), a corrupt deflate stream escapes as ``zlib.error``, a sparse 8 GB ``.npy`` is read whole, and a
big-endian array comes back big-endian (ONNX Runtime then reads its raw bytes as little-endian numbers). Here every
header is read first, its declared size compared with the bytes actually stored and with a memory budget, and only
then are the bytes read and the array turned to native byte order. Images are measured from their header (PIL
decodes lazily) before any pixel is decoded. Every failure is a :class:`WorkbenchError` naming the file.
"""

from __future__ import annotations

import io
import math
import os
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from PIL.Image import Image as PilImage

# The most one array may take, whatever the machine: calibration and check batches are a few MB to a few hundred MB.
MAX_ARRAY_BYTES = 4 * 1024**3
MAX_NPZ_MEMBERS = 4096
MAX_HEADER_BYTES = 10_000  # numpy's own default cap on a header's length
# Calibration images are photos or crops; 40 megapixels (a 7,300 x 5,500 photo) is far above anything a model's
# preprocessing keeps, and decoding it takes ~120 MB as RGB. PIL's own limit (89 MP) only warns below 179 MP.
MAX_IMAGE_PIXELS = 40_000_000
NPZ_EXPECTED = "a numpy .npz written by numpy.savez, one array per model input"
NPY_EXPECTED = "a numpy .npy file written by numpy.save"


def available_memory() -> int | None:
    """Bytes of memory the kernel says are available now (``MemAvailable``), or None where that is unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget() -> int:
    """The most one allocation of user-controlled size may take: ``MAX_ARRAY_BYTES`` or half the available memory,
    whichever is smaller (the rest is left for the model, ONNX Runtime and the other arrays of the batch)."""
    available = available_memory()
    return MAX_ARRAY_BYTES if available is None else min(MAX_ARRAY_BYTES, available // 2)


def format_bytes(count: int) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def check_allocation(
    nbytes: int,
    what: str,
    *,
    expected: str,
    budget: int | None = None,
    hint: str | None = "split the data into smaller batches",
) -> None:
    """Refuse before allocating ``nbytes`` for ``what`` when it exceeds the memory budget."""
    limit = memory_budget() if budget is None else budget
    if nbytes > limit:
        raise WorkbenchError(
            f"{what} would take {format_bytes(nbytes)}, above the {format_bytes(limit)} this machine can give one "
            "array now.",
            expected=expected,
            hint=hint,
        )


def to_native(array: np.ndarray) -> np.ndarray:
    """The same values in native byte order (``>f4`` -> ``<f4`` on x86); native arrays are returned as they are."""
    if array.dtype.byteorder not in ("=", "|") and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _read_header(handle: IO[bytes], where: str, expected: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from a .npy header, checked: no objects, no negative dimension."""
    fmt = np.lib.format
    version = fmt.read_magic(handle)
    if version == (1, 0):
        shape, fortran, dtype = fmt.read_array_header_1_0(handle, max_header_size=MAX_HEADER_BYTES)
    elif version == (2, 0):
        shape, fortran, dtype = fmt.read_array_header_2_0(handle, max_header_size=MAX_HEADER_BYTES)
    else:
        raise WorkbenchError(f"{where}: .npy format version {version} is not supported.", expected=expected)
    if dtype.hasobject or dtype.kind == "V":
        raise WorkbenchError(f"{where}: holds {dtype} (Python objects or records).", expected=expected)
    if any(not isinstance(dim, int) or dim < 0 for dim in shape):
        raise WorkbenchError(f"{where}: the header declares shape {shape}.", expected=expected)
    return tuple(shape), bool(fortran), dtype


def _array_from_stream(
    handle: IO[bytes], stored: int, where: str, expected: str, budget: int
) -> tuple[np.ndarray, int]:
    """One array from a .npy stream holding ``stored`` bytes in all; the declared size is checked against both the
    bytes stored and the budget before the data are read. Returns the array and its size in bytes."""
    shape, fortran, dtype = _read_header(handle, where, expected)
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for any declared shape
    data_bytes = stored - handle.tell()
    if nbytes != data_bytes:
        raise WorkbenchError(
            f"{where}: the header declares {shape} {dtype} ({format_bytes(nbytes)}) but "
            f"{format_bytes(max(data_bytes, 0))} of data are stored (truncated or not written by numpy).",
            expected=expected,
        )
    check_allocation(nbytes, f"{where}: array {shape} {dtype}", expected=expected, budget=budget)
    if isinstance(handle, io.BufferedReader):  # a file on disk: one read into an uninitialised array
        flat = np.fromfile(handle, dtype=dtype, count=math.prod(shape))
        if flat.nbytes != nbytes:
            raise WorkbenchError(f"{where}: the data end after {flat.nbytes} of {nbytes} bytes.", expected=expected)
        array = flat.reshape(shape, order="F" if fortran else "C")
        return (array if dtype.isnative or dtype.byteorder == "|" else to_native(array)), nbytes
    buffer = bytearray(nbytes)
    view = memoryview(buffer)
    filled = 0
    while filled < nbytes:
        count = handle.readinto(view[filled:])  # type: ignore[attr-defined]
        if not count:
            raise WorkbenchError(f"{where}: the data end after {filled} of {nbytes} bytes.", expected=expected)
        filled += count
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    if not dtype.isnative and dtype.byteorder != "|":
        array = array.byteswap().view(dtype.newbyteorder("="))
    return array, nbytes


def _refusal(where: str, error: BaseException, expected: str, noun: str) -> WorkbenchError:
    reason = str(error) or type(error).__name__
    return WorkbenchError(f"{where}: not a readable {noun} ({type(error).__name__}: {reason}).", expected=expected)


# What zipfile, zlib and numpy's header parser raise on damaged input (RuntimeError: an encrypted member;
# NotImplementedError: a compression method Python lacks; struct.error: a short zip header; ValueError: also a
# header whose shape numpy cannot represent).
_READ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    RuntimeError,
    NotImplementedError,
    struct.error,
    OverflowError,
    SyntaxError,  # numpy parses the header's dict with ast; damage can make it invalid Python
    tokenize.TokenError,
    UnicodeDecodeError,
    KeyError,
)


def read_npz(path: str | os.PathLike[str], *, expected: str = NPZ_EXPECTED) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` keyed by name (``np.savez`` keys), in native byte order, sizes checked first."""
    from workbench._io import refuse_special_file

    path = Path(path)
    refuse_special_file(path, expected=expected)
    where = str(path)
    budget = memory_budget()
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if len(members) > MAX_NPZ_MEMBERS:
                raise WorkbenchError(f"{where}: holds {len(members)} members.", expected=expected)
            declared = sum(info.file_size for info in members)
            check_allocation(declared, f"{where}: its arrays together", expected=expected, budget=budget)
            for info in members:
                label = f"{where}: member {info.filename!r}"
                if info.is_dir():
                    continue
                if not info.filename.endswith(".npy"):
                    raise WorkbenchError(f"{label} is not a .npy array.", expected=expected)
                key = info.filename[: -len(".npy")]
                if key in arrays:
                    raise WorkbenchError(f"{where}: array {key!r} is stored twice.", expected=expected)
                with archive.open(info) as handle:
                    array, size = _array_from_stream(handle, info.file_size, label, expected, budget)
                    handle.read(1)  # reaching the end makes zipfile check the member's CRC
                budget -= size
                arrays[key] = array
    except WorkbenchError:
        raise
    except _READ_ERRORS as error:
        raise _refusal(where, error, expected, ".npz file") from error
    return arrays


def read_npy(path: str | os.PathLike[str], *, expected: str = NPY_EXPECTED) -> np.ndarray:
    """One ``.npy`` array in native byte order; the header's size is checked against the file and the budget."""
    from workbench._io import refuse_special_file

    path = Path(path)
    refuse_special_file(path, expected=expected)
    try:
        with open(path, "rb") as handle:
            array, _ = _array_from_stream(
                handle, os.fstat(handle.fileno()).st_size, str(path), expected, memory_budget()
            )
    except WorkbenchError:
        raise
    except _READ_ERRORS as error:
        raise _refusal(str(path), error, expected, ".npy array") from error
    return array


def cast_exactly(array: np.ndarray, dtype: np.dtype | str, what: str) -> np.ndarray:
    """``array`` as ``dtype`` when every value survives the cast; a narrowing cast that would wrap integers
    (int64 above 2**31 into int32) or overflow floats (1e300 into float32 -> inf) is refused."""
    want = np.dtype(dtype)
    array = to_native(np.asarray(array))
    if array.dtype == want:
        return array
    if np.can_cast(array.dtype, want, casting="safe") or array.size == 0:
        return array.astype(want)
    if want.kind in "iu" and array.dtype.kind in "biu":
        info = np.iinfo(want)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise WorkbenchError(
                f"{what}: values span [{low}, {high}], outside {want}'s [{info.min}, {info.max}].",
                expected=f"values that fit in {want}",
            )
        return array.astype(want)
    if want.kind == "f" and array.dtype.kind in "fiu":
        finite_before = np.isfinite(array) if array.dtype.kind == "f" else np.ones(array.shape, dtype=bool)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = array.astype(want)
        overflowed = finite_before & ~np.isfinite(cast)
        if overflowed.any():
            worst = float(np.abs(array[overflowed].astype(np.float64)).max())
            raise WorkbenchError(
                f"{what}: {int(overflowed.sum())} value(s) (up to {worst:.3g}) overflow {want} (largest "
                f"{float(np.finfo(want).max):.3g}) and would become inf.",
                expected=f"values that fit in {want}",
            )
        return cast
    return array.astype(want)


def image_size(path: str | os.PathLike[str], *, max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """Width and height from an image's header (no pixel decoded); refuses an unreadable image or one above
    ``max_pixels`` before anything is allocated for it."""
    import warnings

    from PIL import Image

    from workbench._io import refuse_special_file

    expected = f"an image file (.png, .jpg, ...) of at most {max_pixels:,} pixels"
    refuse_special_file(path, expected=expected)
    pil_limit = Image.MAX_IMAGE_PIXELS
    try:
        # PIL's own bomb check runs on open; ours (tighter, with the size in the message) runs on the header below
        Image.MAX_IMAGE_PIXELS = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                width, height = image.size
    except (*_READ_ERRORS, Image.UnidentifiedImageError) as error:
        raise _refusal(str(path), error, expected, "image") from error
    finally:
        Image.MAX_IMAGE_PIXELS = pil_limit
    if width * height > max_pixels:
        raise WorkbenchError(
            f"{path}: {width} x {height} = {width * height:,} pixels, above the {max_pixels:,}-pixel limit for an "
            "input image.",
            expected=expected,
            hint="resize the image first",
        )
    return width, height


def open_image(path: str | os.PathLike[str], mode: str, *, max_pixels: int = MAX_IMAGE_PIXELS) -> PilImage:
    """A decoded PIL image in ``mode`` ("L", "RGB"), its size checked from the header before decoding."""
    from PIL import Image

    image_size(path, max_pixels=max_pixels)
    try:
        with Image.open(path) as image:
            return image.convert(mode)
    except (*_READ_ERRORS, Image.UnidentifiedImageError, Image.DecompressionBombError) as error:
        raise _refusal(str(path), error, f"an image file PIL can decode as {mode}", "image") from error


def native_feed(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A feed with every array in native byte order (what ONNX Runtime reads)."""
    return {name: to_native(np.asarray(array)) for name, array in feed.items()}
