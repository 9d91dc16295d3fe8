"""Engine layer records: what TensorRT built, layer by layer.

This module reads the per-layer records a build produces. On a CPU-only machine the only source is
TensorRT-RTX's verbose build log (one ``Layers:`` message; see ../shared/environment.md). Readers for the
TensorRT <=10 and 11 inspector JSON formats, and the full layer map, build on the same dataclasses.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

# Separators TensorRT has used between the ONNX nodes fused into one layer: \x1f (10/11), \x1e (8.6).
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]\x1e\x1f]*)\]")

_DATATYPE_PRECISION = {
    "float": "fp32", "fp32": "fp32", "half": "fp16", "fp16": "fp16", "bfloat16": "bf16", "bf16": "bf16",
    "int8": "int8", "fp8": "fp8", "int4": "int4", "fp4": "fp4", "int32": "int32", "int64": "int64", "bool": "bool",
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

    @property
    def onnx_nodes(self) -> tuple[str, ...]:
        return onnx_nodes_from_metadata(self.metadata)

    @property
    def precision(self) -> str:
        """The lowest floating/int8 precision among the layer's inputs, constants and outputs ("fp32" if none)."""
        found = {t.precision for t in (*self.inputs, *self.constants, *self.outputs)}
        for precision in _PRECISION_RANK:
            if precision in found:
                return precision
        return "fp32" if not found else sorted(found)[0]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
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

    def to_json(self) -> dict[str, Any]:
        return {
            "source_format": self.source_format,
            "layers": [layer.to_json() for layer in self.layers],
            "io_tensors": [asdict(io) for io in self.io_tensors],
        }


def onnx_nodes_from_metadata(metadata: str) -> tuple[str, ...]:
    """ONNX node names in a layer's Metadata, in order, without the ``| function stack`` suffixes."""
    names = []
    for match in _ONNX_LAYER.finditer(metadata or ""):
        name = match.group(1).split(" | ")[0].strip()
        if name and name not in names:
            names.append(name)
    return tuple(names)


# --- TensorRT-RTX verbose build log -------------------------------------------------------------------------

_RTX_LAYER_LINE = re.compile(
    r"^Name: (?P<name>.*?), LayerType: (?P<type>.*?), Inputs: \[(?P<inputs>.*?)\], Constants: \[(?P<constants>.*?)\], "
    r"Outputs: \[(?P<outputs>.*?)\], TacticName: (?P<tactic>.*?), StreamId: (?P<stream>-?\d+), Metadata: (?P<meta>.*)$"
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


# --- the .layers.json document written next to every engine --------------------------------------------------

def layers_document(engine_layers: EngineLayers, onnx_graph_nodes: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The ``.layers.json`` content: engine layers with their ONNX nodes, and ONNX nodes with their engine layers.

    ``onnx_graph_nodes`` is (name, op_type) for each node of the ONNX graph that was built, in graph order.
    """
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
    }


def summarize(engine_layers: EngineLayers) -> dict[str, Any]:
    """Counts for a one-screen summary: layers by type and by precision."""
    by_type: dict[str, int] = {}
    by_precision: dict[str, int] = {}
    for layer in engine_layers.layers:
        by_type[layer.layer_type] = by_type.get(layer.layer_type, 0) + 1
        by_precision[layer.precision] = by_precision.get(layer.precision, 0) + 1
    return {"layers": len(engine_layers.layers), "by_type": by_type, "by_precision": by_precision}
