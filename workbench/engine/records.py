"""Engine layer records: what TensorRT built, layer by layer, from every format TensorRT writes them in.

One set of dataclasses, four readers (``read_layers`` picks by content):

* TensorRT-RTX verbose build log: the builder's ``Layers:`` message (the only source on a CPU-only machine);
* TensorRT <= 10 engine-inspector JSON: ``{"Layers": [...], "Bindings": [...]}`` with ``"Format/Datatype"``;
* TensorRT 11 engine-inspector JSON: ``{"Layers": [...], "I/O Tensors": [...]}`` with split ``Format`` /
  ``Datatype`` and a ``Constants`` list per layer;
* the workbench's own ``.layers.json`` document written next to every engine.

A layer's ``Metadata`` lists the ONNX nodes it came from, ``[ONNX Layer: name | function stack]`` entries
joined by ``\x1f`` (TensorRT 10/11, RTX), ``\x1e`` (8.6) or nothing; all three forms are read.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from workbench.errors import WorkbenchError
from workbench.model.graph import onnx_node_list, qdq_edges

if TYPE_CHECKING:
    import onnx

    from workbench.artifact import JsonObject

# Separators TensorRT has used between the ONNX nodes fused into one layer: \x1f (10/11), \x1e (8.6).
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]\x1e\x1f]*)\]")

_DATATYPE_PRECISION = {
    "float": "fp32",
    "fp32": "fp32",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "int8": "int8",
    "fp8": "fp8",
    "int4": "int4",
    "fp4": "fp4",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
    "uint8": "uint8",
}
# Order used to label a layer by its "most reduced" arithmetic precision.
_PRECISION_RANK = ("int4", "fp4", "int8", "fp8", "fp16", "bf16", "fp32")


@dataclass(frozen=True)
class TensorRecord:
    name: str
    dimensions: tuple[int, ...] = ()
    datatype: str = ""
    format: str = ""

    @property
    def precision(self) -> str:
        return _DATATYPE_PRECISION.get(self.datatype.strip().lower(), self.datatype.strip().lower())


@dataclass
class LayerRecord:
    """One engine layer as the builder reports it."""

    name: str
    layer_type: str
    inputs: list[TensorRecord] = field(default_factory=list)
    outputs: list[TensorRecord] = field(default_factory=list)
    constants: list[TensorRecord] = field(default_factory=list)
    tactic: str = ""
    stream_id: int = 0
    metadata: str = ""
    origin: str = ""  # TensorRT <= 10 "Origin" (e.g. REFORMAT, QDQ); empty elsewhere
    explicit_onnx_nodes: tuple[str, ...] | None = None  # when read from a .layers.json document

    @property
    def onnx_nodes(self) -> tuple[str, ...]:
        if self.explicit_onnx_nodes is not None:
            return self.explicit_onnx_nodes
        return onnx_nodes_from_metadata(self.metadata)

    @property
    def precision(self) -> str:
        """The lowest floating/int8 precision among the layer's inputs, constants and outputs.

        "none" for layers without typed tensors (stream signal/wait, shape calls), as in :mod:`workbench.engine.layermap`."""
        found = {t.precision for t in (*self.inputs, *self.constants, *self.outputs) if t.datatype}
        for precision in _PRECISION_RANK:
            if precision in found:
                return precision
        return "none" if not found else sorted(found)[0]

    def to_json(self) -> JsonObject:
        data = asdict(self)
        data.pop("explicit_onnx_nodes")
        data["onnx_nodes"] = list(self.onnx_nodes)
        data["precision"] = self.precision
        return data


@dataclass(frozen=True)
class IOTensorRecord:
    name: str
    io_mode: str
    datatype: str
    dimensions: tuple[int, ...]
    profiles: tuple[dict[str, Any], ...] = ()


@dataclass
class EngineLayers:
    """All layer records of one engine plus its I/O tensors, with the format they were read from."""

    layers: list[LayerRecord]
    io_tensors: list[IOTensorRecord]
    source_format: str

    def to_json(self) -> JsonObject:
        return {
            "source_format": self.source_format,
            "layers": [layer.to_json() for layer in self.layers],
            "io_tensors": [asdict(io) for io in self.io_tensors],
        }


def onnx_nodes_from_metadata(metadata: str) -> tuple[str, ...]:
    """ONNX node names in a layer's Metadata, in order, without the ``| function stack`` suffixes.

    Reads ``[ONNX Layer: a]\x1f[ONNX Layer: b]``, the 8.6 ``\x1e`` form and the unseparated
    ``[ONNX Layer: a][ONNX Layer: b]`` form. Metadata without ``[ONNX Layer: ...]`` entries but with separators
    is read as bare node names.
    """
    names: list[str] = []
    text = metadata or ""
    matches = list(_ONNX_LAYER.finditer(text))
    if matches:
        raw = [match.group(1) for match in matches]
    else:
        raw = [part for part in re.split(r"[\x1e\x1f]", text) if part.strip()] if re.search(r"[\x1e\x1f]", text) else []
    for entry in raw:
        name = entry.split(" | ")[0].strip()
        if name and name not in names:
            names.append(name)
    return tuple(names)


# --- TensorRT-RTX verbose build log -------------------------------------------------------------------------

_RTX_LAYER_LINE = re.compile(
    r"^Name: (?P<name>.*?), LayerType: (?P<type>.*?), Inputs: \[(?P<inputs>.*?)\], Constants: \[(?P<constants>.*?)\], "
    r"Outputs: \[(?P<outputs>.*?)\], TacticName: (?P<tactic>.*?), StreamId: (?P<stream>-?\d+)"
    # multi-stream engines add fields such as "EventId: 13" on their signal/wait layers
    r"(?P<extra>(?:, [A-Za-z]+: [^,\[]*?)*), Metadata: (?P<meta>.*)$"
)
_RTX_TENSOR = re.compile(
    r"Name: (?P<name>.*?), Dimensions: \[(?P<dims>[^\]]*)\],.*?Datatype: (?P<dtype>[^,]*), Format: (?P<format>.*?)\s*$"
)
_RTX_IO = re.compile(
    r"^\s*Name: (?P<name>.*?), IOMode: (?P<mode>\w+), DataType: (?P<dtype>\w+), Dimensions: \[(?P<dims>[^\]]*)\]"
    r".*?ProfileInfo: \[(?P<profiles>.*)\]\s*$"
)
_PROFILE = re.compile(r"MinShape: \[(?P<min>[^\]]*)\], OptShape: \[(?P<opt>[^\]]*)\], MaxShape: \[(?P<max>[^\]]*)\]")


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part.strip().lstrip("-").isdigit())


def _rtx_tensors(text: str) -> list[TensorRecord]:
    records = []
    # tensors are "{ Name: ..., ... }" items separated by "}, {"
    for chunk in re.split(r"\}\s*,\s*\{", text.strip().strip("{}").strip()):
        chunk = chunk.strip().strip("{}").strip()
        if not chunk:
            continue
        match = _RTX_TENSOR.match(chunk)
        if match:
            records.append(TensorRecord(match["name"], _dims(match["dims"]), match["dtype"].strip(), match["format"]))
        else:
            name = chunk.split(",", 1)[0].removeprefix("Name:").strip()
            records.append(TensorRecord(name))
    return records


def find_rtx_layers_message(messages: Iterable[str]) -> str | None:
    """The builder's ``Layers:`` message among logged messages (None if the build was not verbose enough)."""
    for message in messages:
        if message.startswith("Layers:"):
            return message
    return None


def parse_rtx_layers_message(text: str) -> EngineLayers:
    """Parse the ``Layers:`` message a TensorRT-RTX DETAILED verbose build logs into records."""
    text = text.replace("\r\n", "\n")
    if not text.startswith("Layers:"):
        raise WorkbenchError(
            "not a TensorRT-RTX layer listing: the text does not start with 'Layers:'.",
            expected="the builder's 'Layers:' message (ProfilingVerbosity.DETAILED, VERBOSE logger)",
        )
    body, _, rest = text.partition("\n\nI/O Tensors:")
    layers = []
    for line in body.removeprefix("Layers:").split("\n"):
        if not line.startswith("Name: "):
            continue
        match = _RTX_LAYER_LINE.match(line)
        if not match:
            layers.append(LayerRecord(name=line[6:].split(",", 1)[0], layer_type="unparsed", metadata=line))
            continue
        layers.append(
            LayerRecord(
                name=match["name"],
                layer_type=match["type"],
                inputs=_rtx_tensors(match["inputs"]),
                constants=_rtx_tensors(match["constants"]),
                outputs=_rtx_tensors(match["outputs"]),
                tactic=match["tactic"].strip(),
                stream_id=int(match["stream"]),
                metadata=match["meta"],
            )
        )
    io_tensors = []
    io_text = rest.partition("\n\nEngine Metadata:")[0]
    for line in io_text.split("\n"):
        match = _RTX_IO.match(line)
        if not match:
            continue
        profiles = tuple(
            {"min": list(_dims(p["min"])), "opt": list(_dims(p["opt"])), "max": list(_dims(p["max"]))}
            for p in _PROFILE.finditer(match["profiles"])
        )
        io_tensors.append(IOTensorRecord(match["name"], match["mode"], match["dtype"], _dims(match["dims"]), profiles))
    return EngineLayers(layers=layers, io_tensors=io_tensors, source_format="tensorrt-rtx-verbose-log")


# --- TensorRT engine-inspector JSON (<= 10 and 11) ---------------------------------------------------------------

# Words inside a TensorRT <= 10 "Format/Datatype" string (e.g. "Channel major FP16 format where channel % 8 == 0")
_FORMAT_DATATYPE_WORDS = (
    ("fp32", "Float"),
    ("float", "Float"),
    ("fp16", "Half"),
    ("half", "Half"),
    ("bf16", "BFloat16"),
    ("int8", "Int8"),
    ("fp8", "FP8"),
    ("int32", "Int32"),
    ("int64", "Int64"),
    ("bool", "Bool"),
    ("uint8", "UInt8"),
    ("int4", "Int4"),
    ("fp4", "FP4"),
)
_PROFILE_SUFFIX = re.compile(r" \[profile (\d+)\]$")


def datatype_from_format_string(text: str) -> str:
    """The datatype named inside a TensorRT <= 10 ``Format/Datatype`` string ("" if none is named)."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    for word, datatype in _FORMAT_DATATYPE_WORDS:
        if word in words:
            return datatype
    return ""


def _json_tensor(item: Mapping[str, Any]) -> TensorRecord:
    dims = item.get("Dimensions", [])
    dims = tuple(int(d) for d in dims) if isinstance(dims, list) else _dims(str(dims).strip("[]"))
    if "Format/Datatype" in item:  # TensorRT <= 10
        combined = str(item["Format/Datatype"])
        return TensorRecord(str(item.get("Name", "")), dims, datatype_from_format_string(combined), combined)
    return TensorRecord(
        str(item.get("Name", "")),
        dims,
        str(item.get("Datatype", item.get("DataType", ""))),
        str(item.get("Format", "")),
    )


def read_inspector_json(data: Any, *, profile: int = 0) -> EngineLayers:
    """Records from engine-inspector JSON: TensorRT <= 10 (``Bindings``) or 11 (``I/O Tensors``).

    Engines with several optimization profiles repeat each layer as ``name [profile N]``; only ``profile`` is
    kept. A bare list of layer records (some tools write only ``Layers``) is accepted too. A field of an unexpected
    type is a WorkbenchError naming the error, never a raw TypeError/KeyError.
    """
    try:
        return _read_inspector_json(data, profile=profile)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as error:
        raise WorkbenchError(
            f"engine-inspector JSON has a field of an unexpected type or value ({type(error).__name__}: {error}).",
            expected="the JSON that IEngineInspector / trtexec --exportLayerInfo writes",
        ) from None


def _read_inspector_json(data: Any, *, profile: int = 0) -> EngineLayers:
    if isinstance(data, list):
        data = {"Layers": data}
    if not isinstance(data, Mapping) or "Layers" not in data:
        raise WorkbenchError(
            "engine-inspector JSON has no 'Layers' key.",
            expected='{"Layers": [...], "Bindings": [...]} (TensorRT <= 10) or {"Layers": [...], "I/O Tensors": [...]} (11)',
        )
    raw_layers = data["Layers"]
    if raw_layers and all(isinstance(item, str) for item in raw_layers):
        raise WorkbenchError(
            "the engine-inspector JSON lists layer names only, no per-layer records.",
            expected="an engine built with ProfilingVerbosity.DETAILED (trtexec --profilingVerbosity=detailed)",
            hint="rebuild with detailed profiling verbosity; names alone carry no precision or ONNX mapping.",
        )
    if "I/O Tensors" in data:
        source_format = "tensorrt-11-inspector-json"
    elif "Bindings" in data:
        source_format = "tensorrt-10-inspector-json"
    else:
        source_format = "tensorrt-inspector-json"
    layers: list[LayerRecord] = []
    for position, item in enumerate(raw_layers):
        if not isinstance(item, Mapping) or "Name" not in item:
            raise WorkbenchError(
                f"engine-inspector JSON layer #{position} is not a record with a 'Name'.",
                expected="objects with Name, LayerType, Inputs, Outputs, Metadata",
            )
        name = str(item["Name"])
        suffix = _PROFILE_SUFFIX.search(name)
        if suffix:
            if int(suffix.group(1)) != profile:
                continue
            name = name[: suffix.start()]
        layer_type = str(item.get("LayerType", item.get("ParameterType", "")))
        layers.append(
            LayerRecord(
                name=name,
                layer_type=layer_type,
                inputs=[_json_tensor(t) for t in item.get("Inputs", []) or []],
                outputs=[_json_tensor(t) for t in item.get("Outputs", []) or []],
                constants=[_json_tensor(t) for t in item.get("Constants", []) or []],
                tactic=str(item.get("TacticName", "") or item.get("TacticValue", "") or ""),
                stream_id=int(item.get("StreamId", 0) or 0),
                metadata=str(item.get("Metadata", "") or ""),
                origin=str(item.get("Origin", "") or ""),
            )
        )
    io_tensors: list[IOTensorRecord] = []
    for item in data.get("I/O Tensors", []) or []:
        profiles = tuple(
            {"min": list(p["MinShape"]), "opt": list(p["OptShape"]), "max": list(p["MaxShape"])}
            for p in item.get("ProfileInfo", []) or []
            if "MinShape" in p
        )
        io_tensors.append(
            IOTensorRecord(
                str(item.get("Name", "")),
                str(item.get("IOMode", "")),
                str(item.get("DataType", item.get("Datatype", ""))),
                tuple(int(d) for d in item.get("Dimensions", [])),
                profiles,
            )
        )
    if not io_tensors and "Bindings" in data:
        # TensorRT <= 10 lists binding names only; their types come from the layers that read or write them
        bound = {t.name: t for layer in layers for t in (*layer.inputs, *layer.outputs)}
        consumed = {t.name for layer in layers for t in layer.inputs}
        produced = {t.name for layer in layers for t in layer.outputs}
        for name in data["Bindings"]:
            record = bound.get(name, TensorRecord(name))
            mode = "Input" if name in consumed and name not in produced else "Output"
            io_tensors.append(IOTensorRecord(name, mode, record.datatype, record.dimensions))
    return EngineLayers(layers=layers, io_tensors=io_tensors, source_format=source_format)


# --- the .layers.json document written next to every engine --------------------------------------------------


def layers_document(engine_layers: EngineLayers, onnx_graph_nodes: Iterable[tuple[str, str]] | Any) -> dict[str, Any]:
    """The ``.layers.json`` content: engine layers with their ONNX nodes, and ONNX nodes with their engine layers.

    ``onnx_graph_nodes`` is the ONNX ModelProto that was built (preferred: unnamed nodes then get the names
    TensorRT's parser gives them, and Q/DQ pairs are recorded for the Q/DQ audit), or (name, op_type) for each
    node of that graph, in graph order.
    """
    edges: list[list[Any]] = []
    if hasattr(onnx_graph_nodes, "graph"):
        proto = cast("onnx.ModelProto", onnx_graph_nodes)
        edges = [list(edge) for edge in qdq_edges(proto)]
        onnx_graph_nodes = onnx_node_list(proto)
    by_node: dict[str, list[str]] = {}
    for layer in engine_layers.layers:
        for node in layer.onnx_nodes:
            by_node.setdefault(node, []).append(layer.name)
    return {
        "source_format": engine_layers.source_format,
        "engine_layers": [
            {
                "name": layer.name,
                "type": layer.layer_type,
                "precision": layer.precision,
                "onnx_nodes": list(layer.onnx_nodes),
                "tactic": layer.tactic,
                "stream_id": layer.stream_id,
                "origin": layer.origin,
                "inputs": [asdict(t) for t in layer.inputs],
                "outputs": [asdict(t) for t in layer.outputs],
                "constants": [asdict(t) for t in layer.constants],
            }
            for layer in engine_layers.layers
        ],
        "onnx_nodes": [
            {"name": name, "op_type": op_type, "engine_layers": by_node.get(name, [])}
            for name, op_type in onnx_graph_nodes
        ],
        "io_tensors": [asdict(io) for io in engine_layers.io_tensors],
        "qdq_edges": edges,
    }


def summarize(engine_layers: EngineLayers) -> dict[str, Any]:
    """Counts for a one-screen summary: layers by type and by precision."""
    by_type: dict[str, int] = {}
    by_precision: dict[str, int] = {}
    for layer in engine_layers.layers:
        by_type[layer.layer_type] = by_type.get(layer.layer_type, 0) + 1
        by_precision[layer.precision] = by_precision.get(layer.precision, 0) + 1
    return {"layers": len(engine_layers.layers), "by_type": by_type, "by_precision": by_precision}


def engine_layers_from_document(document: Mapping[str, Any]) -> EngineLayers:
    """Rebuild :class:`EngineLayers` from a ``.layers.json`` document (:func:`layers_document`)."""
    if not isinstance(document, Mapping) or "engine_layers" not in document:
        raise WorkbenchError(
            "not a workbench .layers.json document: no 'engine_layers' key.",
            expected="the MODEL.layers.json written by `workbench build`",
        )

    def tensors(items: Any) -> list[TensorRecord]:
        return [
            TensorRecord(
                str(t.get("name", "")),
                tuple(t.get("dimensions", ())),
                str(t.get("datatype", "")),
                str(t.get("format", "")),
            )
            for t in items or []
        ]

    layers = []
    for item in document["engine_layers"]:
        layers.append(
            LayerRecord(
                name=str(item["name"]),
                layer_type=str(item.get("type", "")),
                inputs=tensors(item.get("inputs")),
                outputs=tensors(item.get("outputs")),
                constants=tensors(item.get("constants")),
                tactic=str(item.get("tactic", "")),
                stream_id=int(item.get("stream_id", 0) or 0),
                metadata=str(item.get("metadata", "")),
                origin=str(item.get("origin", "")),
                explicit_onnx_nodes=tuple(item.get("onnx_nodes", ())),
            )
        )
    io_tensors = [
        IOTensorRecord(
            str(io["name"]),
            str(io.get("io_mode", "")),
            str(io.get("datatype", "")),
            tuple(io.get("dimensions", ())),
            tuple(io.get("profiles", ())),
        )
        for io in document.get("io_tensors", []) or []
    ]
    return EngineLayers(layers=layers, io_tensors=io_tensors, source_format=str(document.get("source_format", "")))


def read_layers(source: str | os.PathLike[str] | Mapping[str, Any] | list[Any]) -> EngineLayers:
    """Layer records from any supported source, detected by content.

    ``source`` is a path (RTX ``Layers:`` message, a workbench ``.build.log``, inspector JSON of TensorRT <= 10
    or 11, or a ``.layers.json``), or already-parsed JSON.
    """
    if isinstance(source, (Mapping, list)):
        return _read_parsed(source, "the given JSON")
    if not isinstance(source, (str, os.PathLike)):
        raise WorkbenchError(
            f"layer records given as a JSON {type(source).__name__}.",
            expected="a .layers.json / inspector JSON object or list, or a path",
        )
    path = Path(source)
    from workbench._io import refuse_special_file

    refuse_special_file(path, expected="a .layers.json, engine-inspector JSON or TensorRT-RTX verbose build log")
    if not path.is_file():
        raise WorkbenchError(
            f"{path}: no such layer-records file.",
            expected="a .layers.json, engine-inspector JSON or TensorRT-RTX verbose build log",
        )
    text = path.read_text(encoding="utf-8", errors="replace")
    stripped = text.lstrip()
    if stripped.startswith("Layers:"):
        return parse_rtx_layers_message(stripped)
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(text)
        except RecursionError:
            raise WorkbenchError(f"{path}: JSON nested too deeply.", expected="a layer-records JSON file") from None
        except json.JSONDecodeError as error:
            # "[VERBOSE] ..." lines of a build log also start with "["
            if stripped.startswith("{") or _layers_message_in_log(text) is None:
                raise WorkbenchError(
                    f"{path}: looks like JSON but does not parse ({error}).",
                    expected="a complete .layers.json or engine-inspector JSON file",
                ) from error
        else:
            return _read_parsed(data, str(path))
    message = _layers_message_in_log(text)
    if message is None:
        raise WorkbenchError(
            f"{path}: holds no layer records (no 'Layers:' message, not JSON).",
            expected="a .layers.json, engine-inspector JSON, or a verbose build log from a DETAILED-verbosity build",
        )
    return parse_rtx_layers_message(message)


def _read_parsed(data: Any, where: str) -> EngineLayers:
    if isinstance(data, Mapping) and "engine_layers" in data:
        return engine_layers_from_document(validate_layers_document(dict(data), where))
    try:
        return read_inspector_json(data)
    except WorkbenchError as error:
        raise WorkbenchError(f"{where}: {error.problem}", expected=error.expected, hint=error.hint) from error


def _layers_message_in_log(text: str) -> str | None:
    """The ``Layers:`` message inside a build log written one ``[SEVERITY] message`` per entry."""
    match = re.search(r"^(?:\[[A-Z_]+\] )?(Layers:\n.*?)(?=^\[[A-Z_]+\] |\Z)", text, re.S | re.M)
    return match.group(1).rstrip("\n") if match else None


def read_layers_document(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ``.layers.json`` document written by ``workbench build``, read and checked for its required parts."""
    path = Path(path)
    from workbench._io import refuse_special_file

    refuse_special_file(path, expected="the .layers.json that `workbench build` writes next to the engine")
    if not path.is_file():
        raise WorkbenchError(
            f"{path}: the engine's layer records are missing.",
            expected="the .layers.json that `workbench build` writes next to the engine",
            hint="pass --layers",
        )
    from workbench._io import read_json

    document = read_json(path, what="a .layers.json document")
    return validate_layers_document(document, str(path))


# --- schema of the .layers.json document ---------------------------------------------------------------------


def _schema_error(where: str, field: str, value: object, expected: str) -> WorkbenchError:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return WorkbenchError(f"{where}: field {field} is {text}.", expected=expected)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_str_list(where: str, field: str, value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _schema_error(where, field, value, "a list of strings")


def _check_dims(where: str, field: str, value: object) -> None:
    if not isinstance(value, list) or not all(_is_int(d) and -1 <= d <= 2**63 - 1 for d in value):
        raise _schema_error(where, field, value, "a list of integers (-1 for dynamic)")


def _check_tensor_list(where: str, field: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise _schema_error(where, field, value, "a list of tensor records")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise _schema_error(where, f"{field}[{index}]", item, "an object with name, dimensions, datatype")
        for key in ("name", "datatype", "format"):
            if key in item and not isinstance(item[key], str):
                raise _schema_error(where, f"{field}[{index}].{key}", item[key], "a string")
        if "dimensions" in item:
            _check_dims(where, f"{field}[{index}].dimensions", item["dimensions"])


def _named_objects(
    where: str, name: str, items: list[object], string_keys: tuple[str, ...]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field path, item) for a list of objects that each have a string 'name' and optional string ``string_keys``."""
    for index, item in enumerate(items):
        field = f"{name}[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise _schema_error(where, field, item, "an object with a string 'name'")
        for key in string_keys:
            if key in item and not isinstance(item[key], str):
                raise _schema_error(where, f"{field}.{key}", item[key], "a string")
        yield field, item


def validate_layers_document(document: Any, where: str = ".layers.json") -> dict[str, Any]:
    """Check every field of a ``.layers.json`` document (types, required keys, ranges); a WorkbenchError names
    the first bad field, its value and what was expected. Returns the document."""
    if not isinstance(document, dict):
        raise WorkbenchError(
            f"{where}: is a JSON {type(document).__name__}, not an object.",
            expected="the MODEL.layers.json written by `workbench build`",
        )
    layers = document.get("engine_layers")
    if not isinstance(layers, list):
        raise WorkbenchError(
            f"{where}: not a workbench .layers.json document (no 'engine_layers' list).",
            expected="the MODEL.layers.json written by `workbench build`",
        )
    if "source_format" in document and not isinstance(document["source_format"], str):
        raise _schema_error(where, "source_format", document["source_format"], "a string")
    for index, item in enumerate(layers):
        field = f"engine_layers[{index}]"
        if not isinstance(item, dict):
            raise _schema_error(where, field, item, "an object per engine layer")
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise _schema_error(where, f"{field}.name", item.get("name"), "a non-empty string")
        for key in ("type", "precision", "tactic", "origin", "metadata"):
            if key in item and not isinstance(item[key], str):
                raise _schema_error(where, f"{field}.{key}", item[key], "a string")
        if "stream_id" in item and item["stream_id"] is not None:
            if not _is_int(item["stream_id"]) or not 0 <= item["stream_id"] < 2**31:
                raise _schema_error(where, f"{field}.stream_id", item["stream_id"], "a non-negative integer")
        if "onnx_nodes" in item:
            _check_str_list(where, f"{field}.onnx_nodes", item["onnx_nodes"])
        for key in ("inputs", "outputs", "constants"):
            _check_tensor_list(where, f"{field}.{key}", item.get(key))
    nodes = document.get("onnx_nodes", [])
    if not isinstance(nodes, list):
        raise _schema_error(where, "onnx_nodes", nodes, "a list of {name, op_type, engine_layers}")
    for field, node in _named_objects(where, "onnx_nodes", nodes, ("op_type",)):
        if "engine_layers" in node:
            _check_str_list(where, f"{field}.engine_layers", node["engine_layers"])
    ios = document.get("io_tensors", [])
    if ios is not None:
        if not isinstance(ios, list):
            raise _schema_error(where, "io_tensors", ios, "a list of I/O tensor records")
        for field, io in _named_objects(where, "io_tensors", ios, ("io_mode", "datatype")):
            if "dimensions" in io:
                _check_dims(where, f"{field}.dimensions", io["dimensions"])
            if "profiles" in io and not isinstance(io["profiles"], list):
                raise _schema_error(where, f"{field}.profiles", io["profiles"], "a list")
    edges = document.get("qdq_edges", [])
    if not isinstance(edges, list) or not all(
        isinstance(edge, list) and len(edge) == 4 and all(isinstance(part, (str, bool)) for part in edge)
        for edge in edges
    ):
        raise _schema_error(where, "qdq_edges", edges, "a list of [quantize, dequantize, tensor, is_weight]")
    build = document.get("build")
    if build is not None:
        _validate_build_section(build, where)
    return document


def _validate_build_section(build: object, where: str) -> None:
    if not isinstance(build, dict):
        raise _schema_error(where, "build", build, "an object")
    for key in ("backend", "backend_version", "onnx", "onnx_sha256", "built_onnx_sha256", "precision"):
        if key in build and not isinstance(build[key], str):
            raise _schema_error(where, f"build.{key}", build[key], "a string")
    sha = build.get("engine_sha256")
    if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise _schema_error(where, "build.engine_sha256", sha, "64 lowercase hex digits")
    for key in ("engine_bytes",):
        if key in build and (not _is_int(build[key]) or build[key] < 0):
            raise _schema_error(where, f"build.{key}", build[key], "a non-negative integer")
    if "build_seconds" in build:
        value = build["build_seconds"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise _schema_error(where, "build.build_seconds", value, "a non-negative number")
    for key in ("compute_capabilities", "target_compute_capabilities", "warnings"):
        if key in build:
            _check_str_list(where, f"build.{key}", build[key])
    if "options" in build and not isinstance(build["options"], dict):
        raise _schema_error(where, "build.options", build["options"], "an object")
    profiles = build.get("profiles")
    if profiles is not None:
        if not isinstance(profiles, dict):
            raise _schema_error(where, "build.profiles", profiles, "{input: [min, opt, max]}")
        for name, levels in profiles.items():
            if (
                not isinstance(levels, list)
                or len(levels) != 3
                or not all(isinstance(s, list) and all(_is_int(d) and 0 < d < 2**31 for d in s) for s in levels)
            ):
                raise _schema_error(
                    where, f"build.profiles[{name!r}]", levels, "[min, opt, max] shapes of positive integers"
                )
