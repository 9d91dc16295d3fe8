"""Memory guards: estimate the bytes a tensor, batch or feed needs from its shape, and refuse what cannot fit
*before* allocating it (a ``--batch 100000`` or a 2**40 dimension is a WorkbenchError, not an OOM kill)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, SupportsInt

import numpy as np

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from workbench.model.onnx_model import OnnxModel

INT64_MAX = 2**63 - 1
# a single dimension above this is not a real tensor on any machine this tool targets
MAX_DIM = 2**31 - 1
# share of the available memory one allocation may take
DEFAULT_FRACTION = 0.5


def available_memory_bytes() -> int:
    """Memory the process can still use: MemAvailable (Linux), else free physical pages; cgroup limits respected."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = 8 * 1024**3
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(limit_file, encoding="ascii").read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < available:
            available = int(text)
    return int(available)


def check_shape(shape: Sequence[SupportsInt], *, what: str) -> tuple[int, ...]:
    """A concrete shape of non-negative dims each below ``MAX_DIM``; anything else is a WorkbenchError."""
    dims = []
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise WorkbenchError(f"{what}: dimension {dim!r} of shape {tuple(shape)} is not an integer.")
        if dim < 0 or dim > MAX_DIM:
            raise WorkbenchError(
                f"{what}: dimension {int(dim)} of shape {tuple(int(d) for d in shape)} is out of range.",
                expected=f"dimensions in 0..{MAX_DIM}",
            )
        dims.append(int(dim))
    return tuple(dims)


def tensor_bytes(shape: Sequence[SupportsInt], dtype: DTypeLike, *, what: str = "tensor") -> int:
    """Exact byte size of a dense tensor (Python integers: no int64 overflow)."""
    dims = check_shape(shape, what=what)
    count = 1
    for dim in dims:
        count *= dim
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = 8
    if itemsize == 0:  # strings / objects
        raise WorkbenchError(
            f"{what}: dtype {dtype} has no fixed size (string or object tensor).",
            expected="numeric model inputs (float, integer or bool)",
        )
    return count * itemsize


def format_bytes(value: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value} B"
        value /= 1024  # type: ignore[assignment]
    return f"{value} B"  # pragma: no cover


def ensure_fits(nbytes: int, *, what: str, fraction: float = DEFAULT_FRACTION, hint: str | None = None) -> None:
    """Refuse an allocation of ``nbytes`` above ``fraction`` of the available memory."""
    budget = int(available_memory_bytes() * fraction)
    if nbytes > budget:
        raise WorkbenchError(
            f"{what} needs {format_bytes(nbytes)}, more than this machine can hold "
            f"({format_bytes(budget)} = {fraction:.0%} of the available memory).",
            expected="a smaller batch or shape",
            hint=hint,
        )


def feed_bytes(shapes: Mapping[str, Sequence[SupportsInt]], dtypes: Mapping[str, DTypeLike], *, what: str) -> int:
    """Bytes of a feed (one array per input name)."""
    return sum(
        tensor_bytes(shape, dtypes.get(name, np.float32), what=f"{what} {name!r}") for name, shape in shapes.items()
    )


def ensure_feed_fits(
    shapes: Mapping[str, Sequence[SupportsInt]],
    dtypes: Mapping[str, DTypeLike],
    *,
    what: str,
    copies: int = 1,
    fraction: float = DEFAULT_FRACTION,
    hint: str | None = None,
) -> int:
    """Refuse a feed (times ``copies`` buffers) that would not fit; returns its bytes."""
    nbytes = feed_bytes(shapes, dtypes, what=what)
    ensure_fits(nbytes * max(1, copies), what=what, fraction=fraction, hint=hint)
    return nbytes


def refuse_string_inputs(inputs: Iterable[object], *, what: str) -> None:
    """Refuse models with string-typed inputs (we cannot make or feed such data); ``inputs`` have .name/.dtype."""
    for spec in inputs:
        dtype = getattr(spec, "dtype", None)
        try:
            kind = np.dtype(dtype).kind
        except TypeError:
            kind = "O"
        if kind in ("U", "S", "O") or str(dtype) in ("string", "str", "object"):
            raise WorkbenchError(
                f"{what}: input {getattr(spec, 'name', '?')!r} is string-typed ({dtype}); the workbench feeds only "
                "numeric tensors.",
                expected="model inputs of float, integer or bool type (tokenize strings before the model)",
            )


def per_sample_activation_bytes(
    onnx_path: str | os.PathLike[str], sample_shapes: Mapping[str, Sequence[int]] | None = None
) -> int:
    """Bytes of every tensor one sample produces through the model (inputs, intermediates, outputs), from ONNX
    shape inference with the batch dimension set to 1. An upper-side estimate: runtimes reuse some buffers.

    ``sample_shapes`` gives full shapes (batch included) for inputs with symbolic dims. Returns 0 when shape
    inference cannot say (the caller then guards inputs only).
    """
    import onnx
    from onnx import shape_inference

    try:
        proto = onnx.load(str(onnx_path), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable model is reported by the loader the command uses
        return 0
    initializers = {init.name for init in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        override = (sample_shapes or {}).get(value.name)
        for index, dim in enumerate(dims):
            if index == 0:
                dim.ClearField("dim_param")
                dim.dim_value = 1
            elif override is not None and index < len(override):
                dim.ClearField("dim_param")
                dim.dim_value = int(override[index])
    try:
        inferred = shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is a best-effort estimate
        return 0
    total = 0
    seen: set[str] = set()
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if value.name in seen or value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        seen.add(value.name)
        tensor_type = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in tensor_type.shape.dim]
        try:
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).itemsize
        except Exception:  # noqa: BLE001
            itemsize = 4
        size = itemsize
        for dim in dims:
            size *= max(int(dim), 1)
        total += size
    return total


def guard_model_inputs(model: OnnxModel, *, what: str, batch: int = 1, copies: int = 1) -> int:
    """Refuse a model whose inputs cannot be fed here: string-typed inputs, or static dimensions so large that one
    batch (symbolic dims taken as 1, the batch dim as ``batch``) would not fit in memory. Returns the feed's bytes."""
    refuse_string_inputs(model.inputs, what=what)
    total = 0
    for spec in model.inputs:
        dims = []
        for index, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim > 0:
                dims.append(dim if index or dim != 1 else max(dim, 1))
            else:
                dims.append(batch if index == 0 else 1)
        dtype = "float32" if spec.dtype in ("bfloat16",) else spec.dtype
        try:
            np.dtype(dtype)
        except TypeError:
            dtype = "float32"
        total += tensor_bytes(dims, dtype, what=f"{what}: input {spec.name!r}")
    ensure_fits(total * max(copies, 1), what=f"{what}: one batch of the model's inputs", hint="check the input shapes")
    return total
