"""Stage 0: load an ONNX file into an :class:`OnnxModel` with every input problem turned into a WorkbenchError."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench._io import sha256_file
from workbench.artifact import NOT_SERIALIZED, Artifact
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from collections.abc import Iterable

    import onnx

# Protobuf refuses to serialize a single message over 2 GiB; larger models must keep weights as external data.
PROTOBUF_LIMIT_BYTES = 2 * 1024**3

_ONNX_DTYPE_NAMES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
}


def shape_template(dims: Iterable[object]) -> str:
    """A shape as ``--shape``/``--shapes`` write it, ``N`` where a size is symbolic or unknown: ``Nx3xNxN``."""
    return "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in dims)


@dataclass(frozen=True)
class TensorSpec(Artifact):
    """Name, element type and shape of a graph input or output. Symbolic dimensions are strings, unknown ones None."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(dim, int) or dim < 0 for dim in self.shape)


@dataclass(frozen=True)
class OnnxModel(Artifact):
    """A loaded, checked ONNX model and the facts every later stage needs about it.

    Its JSON names the file and its sha256; :meth:`from_json` loads the file again and refuses one that changed.
    """

    path: Path
    sha256: str
    # onnx.ModelProto, typed loosely so this module imports without onnx stubs; the file is its serialized form
    proto: Any = field(repr=False, metadata=NOT_SERIALIZED, compare=False)
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    opset: int = 0
    producer: str = ""

    @classmethod
    def from_json(cls, data: object) -> OnnxModel:
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            raise WorkbenchError("ONNX model JSON has no 'path'.", expected="the JSON of an OnnxModel")
        model = load_onnx(data["path"])
        if data.get("sha256") and data["sha256"] != model.sha256:
            raise WorkbenchError(
                f"{model.path}: the file changed since it was recorded (sha256 {model.sha256[:12]}…, recorded "
                f"{str(data['sha256'])[:12]}…).",
                expected="the ONNX file the record was made from",
            )
        return model

    @property
    def node_count(self) -> int:
        return len(self.proto.graph.node)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.proto.graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def tensor_specs(
    value_infos: Iterable[onnx.ValueInfoProto], initializer_names: set[str] | None = None
) -> tuple[TensorSpec, ...]:
    specs = []
    skip = initializer_names or set()
    for info in value_infos:
        if info.name in skip:
            continue
        tensor_type = info.type.tensor_type
        dims: list[int | str | None] = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        specs.append(
            TensorSpec(info.name, _ONNX_DTYPE_NAMES.get(tensor_type.elem_type, str(tensor_type.elem_type)), tuple(dims))
        )
    return tuple(specs)


def load_onnx(path: str | os.PathLike[str], *, check: bool = True) -> OnnxModel:
    """Load and validate an ONNX file.

    Raises WorkbenchError naming the file when it is missing, not a file, not ONNX, truncated, or fails the
    ONNX checker. Models with external data load their weights from next to the file.
    """
    import onnx

    path = Path(path)
    try:
        exists = path.exists()
    except OSError as error:  # a file name too long for the filesystem, a path through a file
        raise WorkbenchError(
            f"{str(path)[:80]}…: cannot be looked up ({error.strerror}).", expected="a path to an existing .onnx file"
        ) from None
    if not exists:
        raise WorkbenchError(f"{path}: no such file.", expected="a path to an existing .onnx file")
    if path.is_dir():
        raise WorkbenchError(f"{path}: is a directory, not an ONNX file.", expected="a path to a .onnx file")
    if not path.is_file():
        from workbench._io import special_file_kind

        raise WorkbenchError(
            f"{path}: is {special_file_kind(path) or 'not a regular file'}, not an ONNX file.",
            expected="a path to a regular .onnx file",
        )
    if path.stat().st_size == 0:
        raise WorkbenchError(f"{path}: the file is empty.", expected="a serialized ONNX ModelProto")
    try:
        proto = onnx.load(str(path), load_external_data=True)
    except FileNotFoundError as error:
        raise WorkbenchError(
            f"{path}: the model refers to external weight data that is missing ({error.filename or error}).",
            expected="the .data file(s) written with the model, in the same folder",
        ) from error
    except Exception as error:  # protobuf raises DecodeError / RuntimeWarning subclasses depending on version
        raise WorkbenchError(
            f"{path}: not a readable ONNX model ({type(error).__name__}: {error}). The file may be truncated or not ONNX.",
            expected="a complete serialized ONNX ModelProto",
        ) from error
    if not proto.graph.node and not proto.graph.output:
        # protobuf happily parses many random byte strings into an empty message
        raise WorkbenchError(
            f"{path}: parsed as protobuf but holds no graph (no nodes, no outputs); it is not an ONNX model or is truncated.",
            expected="an ONNX ModelProto with a graph",
        )
    if check:
        _check(proto, path)
    _check_interface(proto, path)
    initializer_names = {init.name for init in proto.graph.initializer}
    opset = next((imp.version for imp in proto.opset_import if imp.domain in ("", "ai.onnx")), 0)
    return OnnxModel(
        path=path,
        sha256=sha256_file(path),
        proto=proto,
        inputs=tensor_specs(proto.graph.input, initializer_names),
        outputs=tensor_specs(proto.graph.output),
        opset=int(opset),
        producer=f"{proto.producer_name} {proto.producer_version}".strip(),
    )


def _check_interface(proto: onnx.ModelProto, path: Path) -> None:
    """What the ONNX checker lets through but no stage can use: an opset newer than ONNX defines, no outputs,
    graph inputs of undefined element type or with a fixed dimension of 0 (negative ones mean dynamic, as in
    :attr:`TensorSpec.is_dynamic`)."""
    import onnx

    newest = onnx.defs.onnx_opset_version()
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > newest:
            raise WorkbenchError(
                f"{path}: imports opset {imp.version} of the default ONNX domain; the newest opset this onnx "
                f"{onnx.__version__} knows is {newest}, so no operator of the model can be checked or run.",
                expected=f"an opset between 7 and {newest}",
            )
    if not proto.graph.output:
        raise WorkbenchError(f"{path}: the graph has no outputs.", expected="a model with at least one graph output")
    initializer_names = {init.name for init in proto.graph.initializer}
    for info in proto.graph.input:
        if info.name in initializer_names or not info.type.HasField("tensor_type"):
            continue
        tensor_type = info.type.tensor_type
        if tensor_type.elem_type == 0:
            raise WorkbenchError(
                f"{path}: graph input {info.name!r} has no element type (UNDEFINED).",
                expected="a numeric element type such as float32",
            )
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value == 0:
                raise WorkbenchError(
                    f"{path}: graph input {info.name!r} has a fixed dimension of 0 at axis {axis}; "
                    "such an input holds no data, so no check, calibration or timing can use it.",
                    expected="fixed dimensions >= 1, or a symbolic name for a dynamic dimension",
                )


def _check(proto: onnx.ModelProto, path: Path) -> None:
    import onnx

    try:
        if proto.ByteSize() < PROTOBUF_LIMIT_BYTES:
            onnx.checker.check_model(proto)
        else:
            onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else "validation failed"
        raise WorkbenchError(
            f"{path}: the ONNX checker rejected the model: {first_line}", expected="a valid ONNX model"
        ) from error
