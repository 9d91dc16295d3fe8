"""FP16 the AutoCast way: realise a :class:`PrecisionPlan` by rewriting the ONNX graph with Casts.

TensorRT 11 (and TensorRT-RTX) build *strongly typed* networks: there is no FP16 builder flag, the precision of
every layer is the type of its tensors in the ONNX. So an FP16 plan becomes an ONNX where planned nodes compute in
float16, with a ``Cast`` wherever a float32 tensor meets a float16 node (and back). The input model is never
modified; the rewrite works on a copy.

Rules that keep a node planned for FP16 in FP32 (each reported with its reason in :attr:`AutocastResult.kept_fp32`):

* ``sensitive-op``: reductions and transcendental ops whose FP16 range or accumulation loses accuracy:
  normalizations (LayerNormalization, GroupNormalization, InstanceNormalization), ReduceMean/ReduceSum/
  ReduceSumSquare/ReduceL2/ReduceLogSumExp/ReduceProd, Pow, Sqrt, Softmax, LogSoftmax, Exp, Log.
* ``large-initializer``: the node reads a constant with a finite value above 65504 (FP16's largest), which
  would become infinity.
* ``shape-tensor``: the node only feeds shape arithmetic (Reshape/Expand/Tile/Slice/Resize size inputs, ...).
  Shape values must stay exact.
* ``typed-by-attribute``: the node declares its output type itself (Cast, Constant, ConstantOfShape, Random*),
  or is a Q/DQ node, whose scale type the calibration owns.
* ``control-flow``: If/Loop/Scan bodies are not rewritten.
* ``read-by-subgraph``: an If/Loop/Scan body reads the node's output by name from the outer scope, so its type
  must stay what the body was written for.
* ``no-float-io``: the node has no float32 inputs or outputs, so there is nothing to cast.
* ``unknown-dtype``: shape inference could not tell an input's element type.

Resize/Upsample coordinates (roi, scales) always stay FP32: only their data input is cast.
INT8 and FP8 in a plan are realised by Q/DQ nodes (calibration); a plan asking for int8 on a graph with no Q/DQ
nodes, or for fp8 on a graph with no FLOAT8E4M3FN Q/DQ nodes, is refused with a WorkbenchError.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

from workbench.artifact import NOT_SERIALIZED, Artifact, JsonObject
from workbench.errors import WorkbenchError
from workbench.model import OnnxModel, has_qdq, onnx_node_name
from workbench.model.graph import subgraph_reads
from workbench.precision.plan import PrecisionPlan

FP16_MAX = 65504.0

SENSITIVE_OPS = frozenset(
    {
        "LayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "ReduceMean",
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL2",
        "ReduceLogSumExp",
        "ReduceProd",
        "Pow",
        "Sqrt",
        "Softmax",
        "LogSoftmax",
        "Exp",
        "Log",
    }
)
TYPED_BY_ATTRIBUTE_OPS = frozenset(
    {
        "Cast",
        "CastLike",
        "Constant",
        "ConstantOfShape",
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "EyeLike",
        "QuantizeLinear",
        "DequantizeLinear",
    }
)
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
# Inputs that carry shapes, sizes or coordinates, never data: (op_type -> input indices).
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "Range": (0, 1, 2),
    "TopK": (1,),
    "Pad": (1, 3),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "OneHot": (1,),
    "ReduceMean": (1,),
    "ReduceSum": (1,),
    "Split": (1,),
}

_FLOAT = 1  # onnx.TensorProto.FLOAT
_FLOAT16 = 10  # onnx.TensorProto.FLOAT16


@dataclass(frozen=True)
class AutocastResult(Artifact):
    """The rewritten model and what happened to every node."""

    plan: PrecisionPlan
    fp16_nodes: tuple[str, ...]
    kept_fp32: dict[str, str]  # node name -> rule that kept it FP32 although the plan asked for FP16
    casts_added: int
    initializers_converted: int
    # the rewritten onnx.ModelProto, a new object (the input model is untouched); saved with save(), not in JSON
    proto: Any = field(default=None, repr=False, compare=False, metadata=NOT_SERIALIZED)

    @property
    def kept_fp32_by_rule(self) -> dict[str, int]:
        """Rule -> how many nodes it kept FP32."""
        return dict(Counter(self.kept_fp32.values()))

    def save(self, path: str | Path) -> OnnxModel:
        """Write the rewritten model atomically and load it back as an :class:`OnnxModel`."""
        import onnx

        from workbench._io import atomic_path
        from workbench.model import load_onnx

        path = Path(path)
        with atomic_path(path) as tmp:
            onnx.save(self.proto, str(tmp))
        return load_onnx(path)

    def to_json(self) -> JsonObject:
        # the per-rule counts, for a reader of the JSON alone; from_json ignores the key
        return super().to_json() | {"kept_fp32_by_rule": self.kept_fp32_by_rule}


def _shape_only_nodes(graph: onnx.GraphProto) -> set[int]:
    """Indices of nodes whose outputs reach only shape inputs (the shape-arithmetic subgraph)."""
    consumers: dict[str, list[tuple[int, int]]] = {}
    for index, node in enumerate(graph.node):
        for slot, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((index, slot))
    graph_outputs = {output.name for output in graph.output}
    shape_only: set[int] = set()
    # walk backwards so a node's consumers are classified before it
    for index in range(len(graph.node) - 1, -1, -1):
        node = graph.node[index]
        uses = [use for output in node.output for use in consumers.get(output, [])]
        if not uses or any(output in graph_outputs for output in node.output):
            continue
        if all(
            slot in SHAPE_INPUTS.get(graph.node[consumer].op_type, ()) or consumer in shape_only
            for consumer, slot in uses
        ):
            shape_only.add(index)
    return shape_only


@dataclass(frozen=True)
class _TensorTypes:
    """Element types of the graph's tensors, and its constants (initializers and Constant-node values)."""

    dtype: dict[str, int]
    initializers: dict[str, onnx.TensorProto]
    constants: dict[str, onnx.TensorProto]  # outputs of Constant nodes: converted like initializers, without a Cast

    def constant(self, name: str) -> onnx.TensorProto | None:
        return self.initializers.get(name, self.constants.get(name))


def _check_plan(model: OnnxModel, plan: PrecisionPlan) -> None:
    from workbench.precision.qdq_rules import qdq_formats

    source = model.proto
    wants_int8 = plan.default == "int8" or any(p == "int8" for p in plan.overrides.values())
    if wants_int8 and not has_qdq(source):
        raise WorkbenchError(
            f"{model.path}: the precision plan asks for int8 but the graph has no QuantizeLinear/DequantizeLinear nodes.",
            expected="a Q/DQ model from the calibration stage for int8 nodes, or fp16/fp32 in the plan",
            hint="run calibration first (it inserts Q/DQ pairs), or change the plan's int8 entries.",
        )
    wants_fp8 = plan.default == "fp8" or any(p == "fp8" for p in plan.overrides.values())
    if wants_fp8 and "fp8" not in qdq_formats(source):
        raise WorkbenchError(
            f"{model.path}: the precision plan asks for fp8 but the graph has no FLOAT8E4M3FN Q/DQ nodes.",
            expected="an FP8 Q/DQ model from `workbench calibrate MODEL --format fp8`, or int8/fp16/fp32 in the plan",
            hint="calibrate with --format fp8 first (it inserts FP8 Q/DQ pairs).",
        )
    known = {onnx_node_name(node) for node in source.graph.node}
    unknown = sorted(set(plan.overrides) - known)
    if unknown:
        raise WorkbenchError(
            f"{model.path}: the precision plan names {len(unknown)} node(s) the graph does not have, e.g. {unknown[:3]}.",
            expected="override keys that are ONNX node names of this model",
        )


def _tensor_types(proto: onnx.ModelProto) -> _TensorTypes:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # inference is best effort; unknown dtypes keep nodes FP32 below
        inferred = proto
    dtype: dict[str, int] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        if info.type.HasField("tensor_type"):
            dtype[info.name] = info.type.tensor_type.elem_type
    initializers = {init.name: init for init in proto.graph.initializer}
    for name, init in initializers.items():
        dtype[name] = init.data_type
    constants: dict[str, onnx.TensorProto] = {}
    for node in proto.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    dtype[node.output[0]] = attribute.t.data_type
                    constants[node.output[0]] = attribute.t
    return _TensorTypes(dtype, initializers, constants)


def _keep_fp32_reason(node: onnx.NodeProto, shape_only: bool, types: _TensorTypes) -> str:
    """The rule (module docstring) that keeps a node planned for FP16 in FP32, or "" to convert it."""
    import numpy as np
    from onnx import numpy_helper

    dtype = types.dtype
    data_inputs = [
        name for slot, name in enumerate(node.input) if name and slot not in SHAPE_INPUTS.get(node.op_type, ())
    ]
    if node.op_type in SENSITIVE_OPS:
        return "sensitive-op"
    if node.op_type in TYPED_BY_ATTRIBUTE_OPS:
        return "typed-by-attribute"
    if node.op_type in CONTROL_FLOW_OPS or node.domain not in ("", "ai.onnx"):
        return "control-flow"
    if shape_only:
        return "shape-tensor"
    if any(name not in dtype for name in data_inputs) or any(o and o not in dtype for o in node.output):
        return "unknown-dtype"
    if not any(dtype[name] == _FLOAT for name in data_inputs) and not any(dtype.get(o) == _FLOAT for o in node.output):
        return "no-float-io"
    for name in data_inputs:
        init = types.constant(name)
        if init is not None and dtype[name] == _FLOAT:
            values = numpy_helper.to_array(init)
            finite = values[np.isfinite(values)]
            if finite.size and float(np.abs(finite).max()) > FP16_MAX:
                return "large-initializer"
    return ""


def _choose_fp16_nodes(
    graph: onnx.GraphProto, plan: PrecisionPlan, types: _TensorTypes
) -> tuple[set[int], list[str], dict[str, str]]:
    """(indices of the nodes to convert, their names, node -> rule for those the plan wanted FP16 but stay FP32)."""
    shape_only = _shape_only_nodes(graph)
    read_by_bodies = subgraph_reads(graph.node)
    fp16_set: set[int] = set()
    fp16_names: list[str] = []
    kept: dict[str, str] = {}
    for index, node in enumerate(graph.node):
        name = onnx_node_name(node)
        if plan.precision_of(name) != "fp16":
            continue
        reason = _keep_fp32_reason(node, index in shape_only, types)
        if not reason and any(output in read_by_bodies for output in node.output):
            reason = "read-by-subgraph"
        if reason:
            kept[name] = reason
        else:
            fp16_set.add(index)
            fp16_names.append(name)
    return fp16_set, fp16_names, kept


class _CastInserter:
    """Rewrites the graph in place so the chosen nodes compute in float16: a Cast (or an FP16 copy of a constant)
    wherever a tensor's type differs from what its consumer now computes in. Mutable: it builds one rewrite."""

    def __init__(self, graph: onnx.GraphProto, fp16_set: set[int], types: _TensorTypes) -> None:
        self.graph = graph
        self.fp16_set = fp16_set
        self.types = types
        self.dtype = dict(types.dtype)  # the original element types (FP16 outputs are added as FP32-originals)
        self.current: dict[str, int] = dict(types.dtype)  # element type of each tensor after the rewrite
        self.cast_cache: dict[tuple[str, int], str] = {}
        self.new_nodes: list[onnx.NodeProto] = []
        self.new_initializers: list[onnx.TensorProto] = []
        self.casts_added = 0
        self.initializers_converted = 0

    def as_type(self, name: str, to: int) -> str:
        """The name of ``name`` converted to element type ``to`` (made once, reused by every consumer)."""
        import numpy as np
        from onnx import helper, numpy_helper

        key = (name, to)
        if key in self.cast_cache:
            return self.cast_cache[key]
        cast_name = f"{name}__{'fp16' if to == _FLOAT16 else 'fp32'}"
        init = self.types.constant(name)
        if init is not None and to == _FLOAT16:
            array = numpy_helper.to_array(init).astype(np.float16)
            self.new_initializers.append(numpy_helper.from_array(array, cast_name))
            self.initializers_converted += 1
        else:
            self.new_nodes.append(helper.make_node("Cast", [name], [cast_name], name=f"autocast/{cast_name}", to=to))
            self.casts_added += 1
        self.current[cast_name] = to
        self.cast_cache[key] = cast_name
        return cast_name

    def rename_fp16_graph_outputs(self) -> dict[str, str]:
        """float32 graph outputs produced by FP16 nodes: the node writes "<name>__fp16", a Cast restores "<name>"."""
        graph_output_names = {output.name for output in self.graph.output}
        renamed: dict[str, str] = {}
        for index in self.fp16_set:
            node = self.graph.node[index]
            for slot, name in enumerate(node.output):
                if name in graph_output_names and self.dtype.get(name) == _FLOAT:
                    renamed[name] = f"{name}__fp16"
                    node.output[slot] = renamed[name]
        return renamed

    def rewrite(self) -> None:
        from onnx import helper

        graph = self.graph
        renamed_outputs = self.rename_fp16_graph_outputs()
        original_of = {renamed: original for original, renamed in renamed_outputs.items()}
        # an FP16 consumer of such an output reads the FP16 tensor itself (no second "<name>__fp16" Cast)
        for original, renamed in renamed_outputs.items():
            self.cast_cache[(original, _FLOAT16)] = renamed
        for index, node in enumerate(graph.node):
            in_fp16 = index in self.fp16_set
            for slot, name in enumerate(node.input):
                if not name or slot in SHAPE_INPUTS.get(node.op_type, ()):
                    continue
                if in_fp16 and self.current.get(name) == _FLOAT:
                    node.input[slot] = self.as_type(name, _FLOAT16)
                elif not in_fp16 and self.current.get(name) == _FLOAT16 and self.dtype.get(name) == _FLOAT:
                    node.input[slot] = self.as_type(name, _FLOAT)
            if in_fp16:
                for output in node.output:
                    if self.dtype.get(original_of.get(output, output)) == _FLOAT:
                        self.current[output] = _FLOAT16
                        self.dtype.setdefault(output, _FLOAT)
            self.new_nodes.append(node)
            # the FP32 graph output is restored right after its producer, so FP32 consumers of it stay in order
            for output in node.output:
                if output in original_of:
                    original = original_of[output]
                    self.new_nodes.append(
                        helper.make_node("Cast", [output], [original], name=f"autocast/{original}__out", to=_FLOAT)
                    )
                    self.casts_added += 1
        self._replace_graph_contents()

    def _replace_graph_contents(self) -> None:
        graph = self.graph
        # drop what the conversion left unused (FP32 originals of converted constants)
        used = {name for node in self.new_nodes for name in node.input} | {output.name for output in graph.output}
        used |= subgraph_reads(graph.node)  # If/Loop/Scan bodies read weights of the outer scope by name
        nodes = [node for node in self.new_nodes if node.op_type != "Constant" or any(o in used for o in node.output)]
        initializers = [init for init in graph.initializer if init.name in used] + self.new_initializers
        del graph.node[:]
        graph.node.extend(nodes)
        del graph.initializer[:]
        graph.initializer.extend(initializers)
        # stale value_info would contradict the new types; TensorRT and ORT re-infer them
        del graph.value_info[:]


def apply_precision_plan(model: OnnxModel, plan: PrecisionPlan) -> AutocastResult:
    """A copy of ``model`` in which every node the plan puts at FP16 computes in float16 (rules above)."""
    _check_plan(model, plan)
    proto = copy.deepcopy(model.proto)
    types = _tensor_types(proto)
    fp16_set, fp16_names, kept = _choose_fp16_nodes(proto.graph, plan, types)
    inserter = _CastInserter(proto.graph, fp16_set, types)
    inserter.rewrite()
    return AutocastResult(
        plan, tuple(fp16_names), kept, inserter.casts_added, inserter.initializers_converted, proto=proto
    )
