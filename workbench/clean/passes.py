"""The named cleaning passes and their registry.

A pass is a function ``run(graph, context)`` over an onnx-graphsurgeon graph. It changes the graph in place
(returning None) or returns a new graph. The pipeline proves each pass harmless afterwards (see checks.py), so
a pass only has to be *intended* to preserve outputs; ``tolerance`` says how exactly:
"exact" (structural rewrites), "numeric" (folding and fusion: rtol 1e-4 / atol 1e-5), "report" (never changes
the graph). Users add their own with :func:`register_pass`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from workbench.clean.graph_utils import (
    RANDOM_OPS,
    all_subgraphs,
    apply_inferred_shapes,
    bypass_node,
    constant_values,
    dtype_name,
    is_static,
    light_export,
    node_subgraphs,
    np_dtype,
    prune_dead_nodes,
    redirect_consumers,
    tensor_shape,
    toposort,
)
from workbench.clean.report import Finding
from workbench.errors import WorkbenchError
from workbench.model.graph import QDQ_OPS, is_constant, producer

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from workbench.clean.graph_utils import LightExporter

DEFAULT_FOLD_SIZE_THRESHOLD = 16 * 1024 * 1024  # bytes; larger folded tensors would bloat the model (onnxslim #190)
MAX_FOLD_ROUNDS = 10

DimSpec = int | str | None  # int: pin the dimension; str: keep it symbolic under this name; None: leave it


@dataclass
class PassContext:
    """What passes may read (options) and write (findings) besides the graph."""

    template: onnx.ModelProto  # the model the graph came from (metadata, opset imports) for re-export
    input_shapes: dict[str, list[DimSpec]] = field(default_factory=dict)
    fold_size_threshold: int | None = DEFAULT_FOLD_SIZE_THRESHOLD
    findings: list[Finding] = field(default_factory=list)
    shapes_fresh: bool = False  # the graph came from a model that just went through shape inference
    root: gs.Graph | None = None  # the top-level gs graph while a pass runs on one of its subgraphs (None: at the top)
    exporter: LightExporter | None = (
        None  # the run's LightExporter (reuses unchanged nodes' protos); None: a one-off export
    )


PassFunction = Callable[["gs.Graph", PassContext], "gs.Graph | None"]


@dataclass(frozen=True)
class CleanPass:
    """A named graph rewrite and how closely its outputs must match the original's."""

    name: str
    run: PassFunction
    tolerance: str = "exact"  # "exact" | "numeric" | "report"
    description: str = ""
    min_opset: int = 0  # below this default-domain opset the pass is skipped (reported unchanged)
    recurse: bool = True  # also run it on every If/Loop/Scan body (outer-scope tensors are never removed/renamed)

    def __post_init__(self) -> None:
        if self.tolerance not in ("exact", "numeric", "report"):
            raise WorkbenchError(
                f"pass {self.name!r}: unknown tolerance {self.tolerance!r}.", expected="'exact', 'numeric' or 'report'"
            )


_REGISTRY: dict[str, CleanPass] = {}


def register_pass(clean_pass: CleanPass, *, replace: bool = False) -> CleanPass:
    """Make ``clean_pass`` selectable by name (``clean_model(passes=[..., name])``)."""
    if clean_pass.name in _REGISTRY and not replace:
        raise WorkbenchError(
            f"a cleaning pass named {clean_pass.name!r} is already registered.",
            expected="a new name, or replace=True to override it",
        )
    _REGISTRY[clean_pass.name] = clean_pass
    return clean_pass


def get_pass(name: str) -> CleanPass:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise WorkbenchError(
            f"unknown cleaning pass {name!r}.", expected=f"one of {', '.join(available_passes())}"
        ) from None


def available_passes() -> list[str]:
    return list(_REGISTRY)


def cleaning_pass(
    name: str, tolerance: str = "exact", description: str = "", min_opset: int = 0, recurse: bool = True
) -> Callable[[PassFunction], PassFunction]:
    """Decorator that registers a built-in pass."""

    def wrap(function: PassFunction) -> PassFunction:
        register_pass(
            CleanPass(
                name,
                function,
                tolerance,
                description or " ".join((function.__doc__ or "").split()),
                min_opset,
                recurse,
            )
        )
        return function

    return wrap


def refresh_shapes(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Give ``graph``'s tensors the shapes and dtypes of ONNX shape inference (data propagation on), in place."""
    import onnx

    if context.shapes_fresh:
        return graph
    root = context.root if context.root is not None else graph  # a subgraph is inferred within its whole model
    if context.exporter is not None:
        model, _, _ = context.exporter.export(root, context.template)
    else:
        model, _ = light_export(root, context.template)
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # a model ONNX cannot infer still cleans, with fewer shape facts
        return graph
    apply_inferred_shapes(root, model)
    context.shapes_fresh = True
    return graph


# ---------------------------------------------------------------------------------------------- input shapes


@cleaning_pass("override_input_shapes", "exact", recurse=False)
def override_input_shapes(graph: gs.Graph, context: PassContext) -> None:
    """Pin dynamic input dimensions, or give them the symbolic names of the TensorRT optimization profile."""
    by_name = {tensor.name: tensor for tensor in graph.inputs}
    for name, dims in context.input_shapes.items():
        tensor = by_name.get(name)
        if tensor is None:
            raise WorkbenchError(
                f"input-shape override names {name!r}, which is not a graph input.",
                expected=f"one of {sorted(by_name)}",
            )
        old = list(tensor.shape or [])
        if len(dims) != len(old):
            raise WorkbenchError(
                f"input-shape override for {name!r} has {len(dims)} dimensions but the input has rank {len(old)}.",
                expected=f"{len(old)} entries (int to pin, name to keep symbolic, None to keep)",
            )
        new = []
        for old_dim, spec in zip(old, dims):
            if spec is None:
                new.append(old_dim)
            elif isinstance(old_dim, int) and old_dim >= 0 and spec != old_dim:
                raise WorkbenchError(
                    f"input {name!r}: dimension {old_dim} is fixed and cannot become {spec!r}.",
                    expected="overrides only on dynamic dimensions",
                )
            else:
                new.append(spec)
        tensor.shape = new


# ---------------------------------------------------------------------------------------------- constants


@cleaning_pass("constants_to_initializers", "exact")
def constants_to_initializers(graph: gs.Graph, context: PassContext) -> None:
    """Turn Constant nodes into initializers and drop initializers from the graph inputs."""
    import onnx_graphsurgeon as gs

    for node in list(graph.nodes):
        if node.op != "Constant" or len(node.outputs) != 1 or len(node.attrs) != 1:
            continue
        out = node.outputs[0]
        if out in graph.outputs:
            continue  # a graph output must stay produced by a node
        attr_name, value = next(iter(node.attrs.items()))
        if attr_name == "value" and isinstance(value, gs.Constant):
            array = value.values
        elif attr_name == "value_float":
            array = np.array(value, dtype=np.float32)
        elif attr_name == "value_floats":
            array = np.array(value, dtype=np.float32)
        elif attr_name == "value_int":
            array = np.array(value, dtype=np.int64)
        elif attr_name == "value_ints":
            array = np.array(value, dtype=np.int64)
        else:
            continue  # sparse and string constants stay nodes
        out.to_constant(np.asarray(array))
        out.inputs.clear()
        node.outputs.clear()
    prune_dead_nodes(graph)
    graph.inputs = [tensor for tensor in graph.inputs if not is_constant(tensor)]


@cleaning_pass("cleanup_toposort", "exact", recurse=False)
def cleanup_toposort(graph: gs.Graph, context: PassContext) -> None:
    """Remove nodes and tensors nothing depends on; sort nodes topologically (subgraphs included)."""
    for sub in [graph, *all_subgraphs(graph)]:
        prune_dead_nodes(sub)
    toposort(graph.cleanup(remove_unused_graph_inputs=False))


# ---------------------------------------------------------------------------------------------- folding


def _fold_shape_nodes(graph: gs.Graph) -> int:
    """Replace Shape/Size of a statically shaped tensor by a constant (graphsurgeon's own shape folding also
    elides shape casts unsafely, e.g. ``int(float(x) * 0.5)`` becomes ``x * 0``, so it stays off)."""
    folded = 0
    for node in graph.nodes:
        if node.op not in ("Shape", "Size") or not node.outputs or node.outputs[0] in graph.outputs:
            continue
        shape = tensor_shape(node.inputs[0])
        if not is_static(shape):
            continue
        if node.op == "Size":
            value = np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
        else:
            rank = len(shape)
            start = int(node.attrs.get("start", 0))
            end = node.attrs.get("end")
            start = max(0, start + rank if start < 0 else start)
            stop = rank if end is None else int(end) + (rank if int(end) < 0 else 0)
            value = np.array(shape[start : max(start, min(stop, rank))], dtype=np.int64)
        out = node.outputs[0]
        out.to_constant(value)
        out.inputs.clear()
        folded += 1
    return folded


_SHAPE_VALUE_OPS = frozenset(
    {"Shape", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Cast", "Reshape", "Add", "Sub", "Mul", "Div"}
)


def _fold_known_shape_values(graph: gs.Graph) -> int:
    """Replace small shape computations whose values are all known (static dims of partly dynamic tensors,
    e.g. the head size in attention with a dynamic batch) by constants."""
    memo: dict[int, list[_Element] | None] = {}
    folded = 0
    for node in graph.nodes:
        if node.op not in _SHAPE_VALUE_OPS or len(node.outputs) != 1 or node.outputs[0] in graph.outputs:
            continue
        out = node.outputs[0]
        dtype, shape = np_dtype(out), tensor_shape(out)
        if dtype is None or dtype.kind not in "iuf" or shape is None or len(shape) > 1 or not is_static(shape):
            continue
        elements = _shape_elements(out, memo)
        if not elements or not all(isinstance(e, int) for e in elements) or len(elements) != (shape[0] if shape else 1):
            continue
        values = np.array(elements, dtype=dtype).reshape(shape)
        out.to_constant(values)
        out.inputs.clear()
        folded += 1
    return folded


def _exclude_from_folding(node: gs.Node) -> bool:
    return node.op in RANDOM_OPS or node.op in QDQ_OPS or _output_over_memory_budget(node)


def _output_over_memory_budget(node: gs.Node) -> bool:
    """A node whose known output size exceeds the memory budget (ConstantOfShape of 16 GiB feeding a ReduceMax):
    folding would have ONNX Runtime allocate it, even when only the small result downstream is kept."""
    from workbench._arrays import memory_budget

    for out in node.outputs:
        shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
        if shape is None or dtype is None or not is_static(shape):
            continue
        size = math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
        if size > 64 * 1024 * 1024 and size > memory_budget():  # /proc/meminfo read only for large tensors
            return True
    return False


def _has_foldable_node(graph: gs.Graph) -> bool:
    return any(
        node.outputs
        and not _exclude_from_folding(node)
        and not node_subgraphs(node)
        and all(inp.is_empty() or is_constant(inp) for inp in node.inputs)
        for node in graph.nodes
    )


@cleaning_pass("fold_constants", "numeric")
def fold_constants(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Fold constant subgraphs and static shapes to a fixed point (recursive partitioning, size threshold,
    never random ops or Q/DQ)."""
    from onnx_graphsurgeon.logger import G_LOGGER

    old_severity = G_LOGGER.severity
    G_LOGGER.severity = G_LOGGER.CRITICAL  # folding failures inside partitions are expected and handled
    try:
        for _ in range(MAX_FOLD_ROUNDS):
            graph = refresh_shapes(graph, context)
            before = len(graph.nodes)
            _fold_shape_nodes(graph)
            _fold_known_shape_values(graph)
            toposort(graph)
            fold_options = dict(
                fold_shapes=False,
                size_threshold=context.fold_size_threshold,
                should_exclude_node=_exclude_from_folding,
                recurse_subgraphs=False,  # the pipeline runs this pass on every subgraph itself
                flatten_subgraphs=False,  # constant-condition If: the inline_constant_if pass (keeps shapes)
            )
            if not _has_foldable_node(graph):
                break  # nothing whose inputs are all constant: skip graphsurgeon's copy, export and ORT session
            try:
                # one ONNX Runtime session for everything foldable: fast when nothing fails
                graph.fold_constants(partitioning=None, error_ok=False, **fold_options)
            except Exception:
                # something in the constant subgraph cannot run: partition recursively around it
                graph.fold_constants(partitioning="recursive", error_ok=True, **fold_options)
            prune_dead_nodes(graph)
            graph.cleanup(remove_unused_graph_inputs=False, recurse_subgraphs=False)
            if context.root is None:
                context.shapes_fresh = False
            # inside a subgraph the shapes inferred for the whole model stay: folding keeps every value (and its
            # shape) as it was, and re-inferring the whole model per body and round costs seconds on Silero VAD
            if len(graph.nodes) == before:
                break
    finally:
        G_LOGGER.severity = old_severity
    return graph


# ---------------------------------------------------------------------------------------------- If inlining


def _inline_if(graph: gs.Graph, node: gs.Node) -> bool:
    """Replace ``node`` (an If whose condition is a constant) by the nodes of the branch it always takes."""
    import onnx_graphsurgeon as gs

    cond = constant_values(node.inputs[0])
    if cond is None or cond.size != 1:
        return False
    branch = node.attrs.get("then_branch" if bool(cond.reshape(-1)[0]) else "else_branch")
    if not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
        return False
    branch_nodes = {id(n) for n in branch.nodes}
    readers = branch_nodes | {id(n) for sub in all_subgraphs(branch) for n in sub.nodes}  # nested bodies read too
    added: list[gs.Node] = []
    rebound: set[int] = set()
    for if_out, branch_out in zip(node.outputs, branch.outputs):
        # the If output keeps its name, and gets the branch output's type and shape when it had none
        if if_out.dtype is None and branch_out.dtype is not None:
            if_out.dtype = branch_out.dtype
        if not if_out.shape and branch_out.shape:
            if_out.shape = list(branch_out.shape)
        source = producer(branch_out)
        if source is not None and id(source) in branch_nodes and id(branch_out) not in rebound:
            rebound.add(id(branch_out))
            redirect_consumers(branch_out, if_out, within=readers)
            source.outputs[source.outputs.index(branch_out)] = if_out
        else:  # an outer tensor, a constant, or a tensor the branch returns twice: copy it
            added.append(
                gs.Node("Identity", name=f"{node.name or if_out.name}_inlined", inputs=[branch_out], outputs=[])
            )
            added[-1].outputs.append(if_out)
    # a branch-local name that the enclosing graph already uses would break SSA once inlined: rename it
    taken = set(graph.tensors())
    for tensor in (t for n in branch.nodes for t in n.outputs if not t.is_empty()):
        if tensor.name in taken and not any(tensor is out for out in node.outputs):
            tensor.name = f"{tensor.name}__{node.name or 'if'}_inlined"
    position = next(i for i, candidate in enumerate(graph.nodes) if candidate is node)
    node.inputs.clear()
    node.outputs.clear()
    graph.nodes[position : position + 1] = list(branch.nodes) + added
    return True


@cleaning_pass("inline_constant_if", "exact")
def inline_constant_if(graph: gs.Graph, context: PassContext) -> None:
    """Replace an If whose condition is a constant (often after folding) by the nodes of the branch it takes;
    the If's output names, types and shapes are kept."""
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node.op == "If" and node.inputs and is_constant(node.inputs[0]) and _inline_if(graph, node):
                changed = True


# ---------------------------------------------------------------------------------------------- shape casts

_INT_TYPES = ("int64", "int32")
_FLOAT_TYPES = ("float32", "float16", "float64", "bfloat16")
_SHAPE_SOURCES = ("Shape", "Size")
_SHAPE_PASSTHROUGH = frozenset(
    {
        "Gather",
        "Slice",
        "Concat",
        "Unsqueeze",
        "Squeeze",
        "Reshape",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Max",
        "Min",
        "Cast",
        "Identity",
        "Neg",
        "Abs",
        "Floor",
        "Ceil",
        "ReduceProd",
        "ReduceMax",
        "ReduceMin",
        "Range",
        "Expand",
        "Where",
        "Equal",
        "Greater",
        "Less",
        "Not",
        "ConstantOfShape",
        "Mod",
        "Clip",
    }
)
_ELIDABLE_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Concat")


class _ShapeTracker:
    """Answers "is this tensor computed only from shapes and constants?" (memoized; such values are small
    integers, so an int -> float -> int round trip is exact and can be elided)."""

    def __init__(self) -> None:
        self._memo: dict[int, bool] = {}

    def __call__(self, tensor: gs.Tensor, depth: int = 0) -> bool:
        key = id(tensor)
        if key in self._memo:
            return self._memo[key]
        if is_constant(tensor):
            result = True
        else:
            node = producer(tensor)
            if node is None or depth > 64:
                result = False
            elif node.op in _SHAPE_SOURCES:
                result = True
            elif node.op in _SHAPE_PASSTHROUGH:
                result = all(self(inp, depth + 1) for inp in node.inputs if not inp.is_empty())
            else:
                result = False
        self._memo[key] = result
        return result


def _cast_target(node: gs.Node) -> str | None:
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"]))).name
    except Exception:
        return None


@cleaning_pass("shape_cast_elision", "exact")
def shape_cast_elision(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Remove int->float->int Cast round trips on shape tensors (TensorRT needs shape tensors to be integer)."""
    graph = refresh_shapes(graph, context)
    shape_derived = _ShapeTracker()

    def int_source(tensor: gs.Tensor) -> gs.Tensor | None:
        """The integer tensor behind ``Cast(int -> float)``, if it is shape-derived."""
        cast = producer(tensor)
        if cast is None or cast.op != "Cast" or _cast_target(cast) not in ("float32", "float64"):
            return None  # float16 is not exact for shape values above 2048
        source = cast.inputs[0]
        dtype = np_dtype(source)
        if dtype is None or dtype.name not in _INT_TYPES or not shape_derived(source):
            return None
        return source

    for node in list(graph.nodes):
        if not node.inputs or not node.outputs:
            continue  # disconnected by an earlier rewrite in this loop
        # Pattern 1: Cast(int->float) -> Cast(float->same int)
        if node.op == "Cast" and _cast_target(node) in _INT_TYPES:
            source = int_source(node.inputs[0])
            if source is not None and dtype_name(source) == _cast_target(node):
                bypass_node(graph, node)
            continue
        # Pattern 2: Cast(int->float) -> arithmetic with integral float constants -> Cast(float->same int)
        if node.op not in _ELIDABLE_OPS or len(node.outputs) != 1:
            continue
        out = node.outputs[0]
        if out in graph.outputs or len(out.outputs) != 1 or out.outputs[0].op != "Cast":
            continue
        out_cast = out.outputs[0]
        target = _cast_target(out_cast)
        if target not in _INT_TYPES:
            continue
        replacements: list[gs.Tensor | np.ndarray] = []  # an int source, or a constant made integer
        for inp in node.inputs:
            if is_constant(inp):
                values = np.asarray(inp.values)
                if (
                    values.dtype.kind != "f"
                    or not np.all(np.isfinite(values))
                    or not np.all(values == np.round(values))
                ):
                    break  # a fractional constant: float arithmetic differs from integer arithmetic
                if values.size and np.max(np.abs(values)) >= 2**24:
                    break
                replacements.append(values.astype(target))
                continue
            source = int_source(inp)
            if source is None or dtype_name(source) != target:
                break
            replacements.append(source)
        else:
            import onnx_graphsurgeon as gs

            if not any(not isinstance(item, np.ndarray) for item in replacements):
                continue  # all-constant: folding's job
            for index, item in enumerate(replacements):
                if isinstance(item, np.ndarray):
                    item = gs.Constant(f"{node.name or out.name}_int_{index}", item)
                node.inputs[index] = item
            final = out_cast.outputs[0]
            out_cast.outputs.clear()
            out_cast.inputs.clear()
            node.outputs[0] = final
    # Anything left that still computes shapes in float is worth flagging: TensorRT rejects float shape tensors.
    for node in graph.nodes:
        if node.op == "Cast" and _cast_target(node) in _FLOAT_TYPES:
            source = node.inputs[0]
            dtype = np_dtype(source)
            if dtype is not None and dtype.name in _INT_TYPES and not is_constant(source) and shape_derived(source):
                context.findings.append(
                    Finding(
                        "float-shape-tensor",
                        node.name,
                        "a shape-derived integer tensor is cast to float; TensorRT may reject float shape tensors",
                    )
                )
    return graph


# ---------------------------------------------------------------------------------------------- Reshape shapes

# int (known value), ("dim", tensor id, axis) (a copy of a dimension), ("sym", name) or None (computed)
_Element = int | tuple[str, int, int] | tuple[str, str] | None


def _shape_elements(tensor: gs.Tensor, memo: dict[int, list[_Element] | None], depth: int = 0) -> list[_Element] | None:
    """What each element of a small 1-D integer tensor is: a known int, a copy of some tensor's dimension, or
    something computed (None). Returns None when even the length is unknown."""
    key = id(tensor)
    if key in memo:
        return memo[key]
    memo[key] = None  # guards against cycles in malformed graphs
    result: list[_Element] | None = None
    values = constant_values(tensor)
    if values is not None:
        if values.ndim <= 1 and values.dtype.kind in "iu" and values.size <= 16:
            result = [int(v) for v in values.reshape(-1)]
    else:
        node = producer(tensor)
        if node is not None and depth < 32:
            result = _shape_elements_from_node(node, tensor, memo, depth)
        if result is None:
            shape = tensor_shape(tensor)
            if shape is not None and len(shape) <= 1 and is_static(shape) and (shape[0] if shape else 1) <= 16:
                result = [None] * (shape[0] if shape else 1)
    memo[key] = result
    return result


def _dim_element(dim: int | str | None, source: gs.Tensor, axis: int) -> _Element:
    if isinstance(dim, (int, np.integer)) and dim >= 0:
        return int(dim)
    if isinstance(dim, str) and dim not in ("", "?"):
        return ("sym", dim)  # ONNX: one dim_param name is one value throughout the graph
    return ("dim", id(source), axis)


def _shape_elements_from_node(
    node: gs.Node, tensor: gs.Tensor, memo: dict[int, list[_Element] | None], depth: int
) -> list[_Element] | None:
    op = node.op
    if op == "Shape":
        source = node.inputs[0]
        shape = tensor_shape(source)
        if shape is None:
            return None
        rank = len(shape)
        start = int(node.attrs.get("start", 0))
        end = node.attrs.get("end")
        start = max(0, start + rank if start < 0 else start)
        stop = rank if end is None else max(0, int(end) + (rank if int(end) < 0 else 0))
        return [_dim_element(shape[axis], source, axis) for axis in range(start, min(stop, rank))]
    if op in ("Cast", "Identity", "Unsqueeze", "Squeeze") or (
        op == "Reshape" and len(tensor_shape(tensor) or (0, 0)) <= 1
    ):
        if op == "Cast" and _cast_target(node) not in _INT_TYPES + _FLOAT_TYPES:
            return None
        return _shape_elements(node.inputs[0], memo, depth + 1)
    if op in ("Add", "Sub", "Mul", "Div") and len(node.inputs) == 2:
        left, right = (_shape_elements(inp, memo, depth + 1) for inp in node.inputs)
        if left is None or right is None or (len(left) != len(right) and 1 not in (len(left), len(right))):
            return None
        size = max(len(left), len(right))
        left, right = (side * size if len(side) == 1 else side for side in (left, right))
        result: list[_Element] = []
        for a, b in zip(left, right):
            if not (isinstance(a, int) and isinstance(b, int)):
                result.append(None)
            elif op == "Div":
                # only exact quotients: the same in integer and float arithmetic
                result.append(a // b if b != 0 and a % b == 0 else None)
            else:
                result.append(a + b if op == "Add" else a - b if op == "Sub" else a * b)
        return result
    if op == "Concat" and int(node.attrs.get("axis", 0)) in (0, -1):
        parts = [_shape_elements(inp, memo, depth + 1) for inp in node.inputs]
        return (
            None
            if any(part is None for part in parts)
            else [element for part in parts if part is not None for element in part]
        )
    if op == "Gather" and int(node.attrs.get("axis", 0)) == 0:
        data = _shape_elements(node.inputs[0], memo, depth + 1)
        indices = constant_values(node.inputs[1])
        if data is None or indices is None or indices.ndim > 1:
            return None
        try:
            return [data[int(i)] for i in indices.reshape(-1)]
        except IndexError:
            return None
    if op == "Slice":
        data = _shape_elements(node.inputs[0], memo, depth + 1)
        bounds = [
            _constant_list(node.inputs[i]) if len(node.inputs) > i and not node.inputs[i].is_empty() else None
            for i in (1, 2, 3, 4)
        ]
        starts, ends, axes, steps = bounds
        if (
            data is None
            or starts is None
            or ends is None
            or len(starts) != 1
            or (axes not in (None, [0], [-1]))
            or (steps not in (None, [1]))
        ):
            return None
        return data[slice(starts[0], max(min(ends[0], 1 << 30), -(1 << 30)))]
    return None


@cleaning_pass("simplify_reshape", "exact")
def simplify_reshape(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Turn computed Reshape shapes into constants using 0 (copy a dimension) and -1 (infer one), e.g.
    ``x.view(x.size(0), -1)`` becomes Reshape(x, [0, -1]): the shape subgraph disappears even with a dynamic batch."""
    import onnx_graphsurgeon as gs

    graph = refresh_shapes(graph, context)
    memo: dict[int, list[_Element] | None] = {}
    for node in graph.nodes:
        if (
            node.op != "Reshape"
            or len(node.inputs) < 2
            or is_constant(node.inputs[1])
            or int(node.attrs.get("allowzero", 0))
        ):
            continue
        data = node.inputs[0]
        elements = _shape_elements(node.inputs[1], memo)
        if elements is None:
            continue
        data_shape = tensor_shape(data) or ()
        target: list[int | None] = []
        for position, element in enumerate(elements):
            if isinstance(element, int):
                target.append(element)
            elif element is not None and (
                (element[0] == "dim" and element[1] == id(data) and element[2] == position)
                or (element[0] == "sym" and position < len(data_shape) and data_shape[position] == element[1])
            ):
                target.append(0)  # the data's own dimension at the same place: copy it
            else:
                target.append(None)
        if target.count(None) + target.count(-1) > 1:
            continue  # two unknown dimensions cannot both be -1
        shape = np.array([-1 if value is None else value for value in target], dtype=np.int64)
        node.inputs[1] = gs.Constant(f"{node.name or node.outputs[0].name}_shape", shape)
    return graph


# ---------------------------------------------------------------------------------------------- no-ops


def _constant_list(tensor: gs.Tensor) -> list[int] | None:
    values = constant_values(tensor) if tensor is not None and not tensor.is_empty() else None
    return None if values is None else [int(v) for v in values.reshape(-1)]


def _same_static_shape(a: gs.Tensor, b: gs.Tensor) -> bool:
    shape_a, shape_b = tensor_shape(a), tensor_shape(b)
    return is_static(shape_a) and is_static(shape_b) and tuple(shape_a) == tuple(shape_b)


def _is_noop(node: gs.Node, graph: gs.Graph) -> bool:
    op = node.op
    if op == "Identity":
        return True
    if op == "Dropout":
        if len(node.outputs) > 1 and (node.outputs[1].outputs or node.outputs[1] in graph.outputs):
            return False  # the mask is used
        training = node.inputs[2] if len(node.inputs) > 2 else None
        if training is not None and not training.is_empty():
            values = constant_values(training)
            return values is not None and not bool(values.reshape(-1)[0])
        return True
    if op == "Cast":
        source_dtype = np_dtype(node.inputs[0])
        return source_dtype is not None and source_dtype.name == _cast_target(node)
    if op == "Transpose":
        perm = node.attrs.get("perm")
        if perm is None:
            shape = tensor_shape(node.inputs[0])
            return shape is not None and len(shape) <= 1
        return list(perm) == list(range(len(perm)))
    if op == "Reshape":
        return _same_static_shape(node.inputs[0], node.outputs[0]) or _identity_reshape(node)
    if op in ("Expand", "Squeeze", "Unsqueeze", "Flatten"):
        return op == "Expand" and _same_static_shape(node.inputs[0], node.outputs[0])
    if op == "Slice":
        if _whole_range_slice(node):
            return True
        if not _same_static_shape(node.inputs[0], node.outputs[0]):
            return False
        if len(node.inputs) > 4 and not node.inputs[4].is_empty():
            steps = _constant_list(node.inputs[4])
            return steps is not None and all(step == 1 for step in steps)
        return True  # no steps input: steps are 1, and an unchanged extent means the whole range
    if op == "Pad":
        pads = _constant_list(node.inputs[1]) if len(node.inputs) > 1 else list(node.attrs.get("pads", []) or [])
        return pads is not None and all(pad == 0 for pad in pads)
    if op == "Concat":
        return len([inp for inp in node.inputs if not inp.is_empty()]) == 1
    return False


_WHOLE_RANGE = 2**31 - 1  # an end at or past this keeps everything (PyTorch writes INT64_MAX, some INT32_MAX)


def _whole_range_slice(node: gs.Node) -> bool:
    """A Slice (opset >= 10) from 0 to the end with step 1 on every axis it names: ``x[:, :]`` in PyTorch."""
    if len(node.inputs) < 3:
        return False
    starts, ends = _constant_list(node.inputs[1]), _constant_list(node.inputs[2])
    steps = _constant_list(node.inputs[4]) if len(node.inputs) > 4 and not node.inputs[4].is_empty() else None
    if starts is None or ends is None or len(starts) != len(ends) or not starts:
        return False
    if len(node.inputs) > 4 and not node.inputs[4].is_empty() and (steps is None or any(v != 1 for v in steps)):
        return False
    axes = _constant_list(node.inputs[3]) if len(node.inputs) > 3 and not node.inputs[3].is_empty() else None
    if len(node.inputs) > 3 and not node.inputs[3].is_empty() and axes is None:
        return False
    shape = tensor_shape(node.inputs[0])
    for position, (start, end) in enumerate(zip(starts, ends)):
        if start != 0:
            return False
        if end >= _WHOLE_RANGE:
            continue
        axis = axes[position] if axes is not None else position
        if shape is None or not -len(shape) <= axis < len(shape):
            return False
        dim = shape[axis]
        if not (isinstance(dim, (int, np.integer)) and 0 <= dim <= end):
            return False
    return True


def _identity_reshape(node: gs.Node) -> bool:
    """Reshape to a constant shape that repeats the input's own: every entry is 0 (copy, allowzero off) or the
    input's static dimension, with at most one -1 standing for the only dimension not pinned otherwise."""
    if len(node.inputs) < 2 or int(node.attrs.get("allowzero", 0)):
        return False
    target, shape = _constant_list(node.inputs[1]), tensor_shape(node.inputs[0])
    if target is None or shape is None or len(target) != len(shape):
        return False
    unknown = 0
    for value, dim in zip(target, shape):
        if value == 0:
            continue
        if value == -1:
            unknown += 1
            continue
        if not (isinstance(dim, (int, np.integer)) and dim == value):
            return False
    return unknown <= 1


@cleaning_pass("remove_noops", "exact")
def remove_noops(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Remove Identity, inference Dropout, same-type Cast, whole-range Slice and identity
    Transpose/Reshape/Expand/Slice/Pad/Concat; drop all-zero initial states of RNN/GRU/LSTM (the default)."""
    graph = refresh_shapes(graph, context)
    for node in list(graph.nodes):
        if node.outputs and _is_noop(node, graph):
            bypass_node(graph, node)
        elif node.op in _RNN_STATE_INPUTS:
            _drop_zero_states(node)
    return graph


_RNN_STATE_INPUTS = {"RNN": (5,), "GRU": (5,), "LSTM": (5, 6)}  # initial_h (and initial_c): zero when absent


def _is_zero_tensor(tensor: gs.Tensor, depth: int = 0) -> bool:
    """All zeros whatever its shape: a zero constant, ConstantOfShape of zero, or Expand/Cast/Identity of one."""
    values = constant_values(tensor)
    if values is not None:
        return values.dtype.kind in "fiub" and not np.any(values)
    node = producer(tensor)
    if node is None or depth > 8:
        return False
    if node.op == "ConstantOfShape":
        value = node.attrs.get("value")
        array = None if value is None else np.asarray(getattr(value, "values", value))
        return array is None or not np.any(array)
    if node.op in ("Expand", "Cast", "Identity") and node.inputs:
        return _is_zero_tensor(node.inputs[0], depth + 1)
    return False


def _drop_zero_states(node: gs.Node) -> None:
    import onnx_graphsurgeon as gs

    for index in _RNN_STATE_INPUTS[node.op]:
        if len(node.inputs) > index and not node.inputs[index].is_empty() and _is_zero_tensor(node.inputs[index]):
            node.inputs[index] = gs.Variable.empty()
    while node.inputs and node.inputs[-1].is_empty():
        node.inputs.pop()


def _merge_pair(
    graph: gs.Graph, first: gs.Node, second: gs.Node, op: str, inputs: list[gs.Tensor], attrs: dict[str, object]
) -> None:
    """Replace first -> second by one node writing second's output."""
    import onnx_graphsurgeon as gs

    out = second.outputs[0]
    for node in (first, second):
        node.outputs.clear()
        node.inputs.clear()
    graph.nodes.append(gs.Node(op, name=second.name or out.name, attrs=attrs, inputs=inputs, outputs=[out]))


def _unsqueeze_axes(node: gs.Node, opset: int) -> list[int] | None:
    if opset < 13:
        return [int(a) for a in node.attrs.get("axes", [])] or None
    return _constant_list(node.inputs[1]) if len(node.inputs) > 1 else None


_MERGEABLE = ("Transpose", "Unsqueeze", "Reshape", "Slice")


def _slice_params(node: gs.Node, rank: int) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """(starts, ends, axes normalized to >= 0, steps) of a Slice whose parameters are all constants."""
    if len(node.inputs) < 3:
        return None
    starts, ends = _constant_list(node.inputs[1]), _constant_list(node.inputs[2])
    has = [len(node.inputs) > i and not node.inputs[i].is_empty() for i in (3, 4)]
    axes = _constant_list(node.inputs[3]) if has[0] else list(range(len(starts or [])))
    steps = _constant_list(node.inputs[4]) if has[1] else [1] * len(starts or [])
    if starts is None or ends is None or axes is None or steps is None:
        return None
    if not len(starts) == len(ends) == len(axes) == len(steps) or any(not -rank <= a < rank for a in axes):
        return None
    return starts, ends, [a % rank for a in axes], steps


def _merged_slice_inputs(first: gs.Node, second: gs.Node, source: gs.Tensor) -> list[gs.Tensor] | None:
    """Inputs of one Slice doing ``first`` then ``second`` when they cut different axes (constants only)."""
    import onnx_graphsurgeon as gs

    shape = tensor_shape(source)
    if shape is None:
        return None
    a, b = _slice_params(first, len(shape)), _slice_params(second, len(shape))
    if a is None or b is None or set(a[2]) & set(b[2]) or len(set(a[2])) != len(a[2]) or len(set(b[2])) != len(b[2]):
        return None
    name = second.name or second.outputs[0].name
    arrays = [np.array(x + y, dtype=np.int64) for x, y in zip(a, b)]
    return [source] + [
        gs.Constant(f"{name}_{part}", array) for part, array in zip(("starts", "ends", "axes", "steps"), arrays)
    ]


@cleaning_pass("merge_consecutive", "exact")
def merge_consecutive(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Merge Transpose->Transpose (dropping pairs that cancel), Unsqueeze->Unsqueeze, Reshape->Reshape and
    Slice->Slice on different axes."""
    import onnx_graphsurgeon as gs

    graph = refresh_shapes(graph, context)
    opset = int(graph.opset)
    changed = True
    while changed:
        changed = False
        for second in list(graph.nodes):
            if not second.inputs or not second.outputs or second.op not in _MERGEABLE:
                continue
            link = second.inputs[0]
            first = producer(link)
            if (
                first is None
                or first.op != second.op
                or link in graph.outputs
                or len(link.outputs) != 1
                or len(first.outputs) != 1
            ):
                continue
            source = first.inputs[0]
            if second.op == "Slice":
                merged = _merged_slice_inputs(first, second, source)
                if merged is None:
                    continue
                _merge_pair(graph, first, second, "Slice", merged, {})
            elif second.op == "Transpose":
                p1, p2 = first.attrs.get("perm"), second.attrs.get("perm")
                if p1 is None or p2 is None or len(p1) != len(p2):
                    continue
                perm = [int(p1[i]) for i in p2]
                if perm == list(range(len(perm))):
                    bypass_node(graph, second)
                    bypass_node(graph, first)
                else:
                    _merge_pair(graph, first, second, "Transpose", [source], {"perm": perm})
            elif second.op == "Unsqueeze":
                a1, a2 = _unsqueeze_axes(first, opset), _unsqueeze_axes(second, opset)
                shape = tensor_shape(source)
                if a1 is None or a2 is None or shape is None:
                    continue
                rank = len(shape) + len(a1) + len(a2)
                mid_rank = len(shape) + len(a1)
                second_axes = sorted(a % rank for a in a2)
                others = [i for i in range(rank) if i not in second_axes]
                axes = sorted(second_axes + [others[a % mid_rank] for a in a1])
                if opset < 13:
                    _merge_pair(graph, first, second, "Unsqueeze", [source], {"axes": axes})
                else:
                    _merge_pair(
                        graph,
                        first,
                        second,
                        "Unsqueeze",
                        [
                            source,
                            gs.Constant(f"{second.name or second.outputs[0].name}_axes", np.array(axes, np.int64)),
                        ],
                        {},
                    )
            else:  # Reshape -> Reshape: the first shape only matters through the second's zeros (copy dims)
                if int(first.attrs.get("allowzero", 0)) or int(second.attrs.get("allowzero", 0)):
                    continue
                target = _constant_list(second.inputs[1])
                shape_op = producer(second.inputs[1])
                if target is not None and 0 in target:
                    continue
                if target is None and (shape_op is None or shape_op.op != "Shape"):
                    continue  # a computed shape might hold zeros that copy the intermediate's dimensions
                second.inputs[0] = source
                first.outputs.clear()
                first.inputs.clear()
            changed = True
    return graph


# ---------------------------------------------------------------------------------------------- CSE


def _attr_key(value: object) -> Hashable:
    import onnx_graphsurgeon as gs

    if isinstance(value, gs.Constant):
        value = value.values
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_attr_key(item) for item in value)
    if isinstance(value, (gs.Graph, gs.Node.AttributeRef)):
        raise TypeError("not hashable for CSE")
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


CSE_CONSTANT_LIMIT = 4096  # bytes; small constants (shapes, axes, scalars) are deduplicated by value


@cleaning_pass("cse", "exact")
def common_subexpression_elimination(graph: gs.Graph, context: PassContext) -> None:
    """Merge constants equal in value (dtype, shape, bytes) and then identical nodes (never random ops, never
    nodes writing graph outputs)."""
    import hashlib

    protected = {id(t) for t in graph.outputs} | {id(t) for t in graph.inputs}
    # in a subgraph only its own nodes are rewired: an outer constant keeps its outer readers
    within = {id(node) for node in graph.nodes} if context.root is not None else None
    # value CSE: constants of equal dtype, shape and bytes become one, so nodes differing only in weight names
    # merge below. Candidates are grouped by dtype, shape and a strided sample of their values; only constants
    # sharing all three are compared in full (large ones by SHA-256)
    groups: dict[tuple[str, tuple[int | str | None, ...] | None], list[gs.Tensor]] = {}
    for tensor in list(graph.tensors().values()):
        if is_constant(tensor) and id(tensor) not in protected:
            groups.setdefault((str(np_dtype(tensor)), tensor_shape(tensor)), []).append(tensor)
    for members in groups.values():
        if len(members) < 2:
            continue
        sampled: dict[bytes, list[gs.Tensor]] = {}
        for tensor in members:
            flat = np.asarray(tensor.values).reshape(-1)
            sampled.setdefault(flat[:: max(1, flat.size // 64)][:65].tobytes(), []).append(tensor)
        for candidates in sampled.values():
            if len(candidates) < 2:
                continue
            canonical: dict[bytes, gs.Tensor] = {}
            for tensor in candidates:
                data = np.ascontiguousarray(tensor.values).tobytes()
                key = data if len(data) <= CSE_CONSTANT_LIMIT else hashlib.sha256(data).digest()
                keep = canonical.setdefault(key, tensor)
                if keep is not tensor:
                    redirect_consumers(tensor, keep, within)

    seen: dict[Hashable, gs.Node] = {}
    for node in graph.nodes:
        if node.op in RANDOM_OPS or not node.outputs or any(id(out) in protected for out in node.outputs):
            continue
        try:
            node_key = (
                node.op,
                node.domain,
                tuple(id(inp) for inp in node.inputs),
                tuple(sorted((name, _attr_key(value)) for name, value in node.attrs.items())),
                len(node.outputs),
            )
        except TypeError:
            continue
        first = seen.setdefault(node_key, node)
        if first is node:
            continue
        for dup_out, keep_out in zip(node.outputs, first.outputs):
            redirect_consumers(dup_out, keep_out)
        node.outputs.clear()
        node.inputs.clear()


# ---------------------------------------------------------------------------------------------- Conv + BN


def _per_channel(values: np.ndarray, channels: int, out_rank: int | None) -> np.ndarray | None:
    """``values`` as one number per output channel, if it broadcasts against [N, C, ...] only along C."""
    if values.size == 1:
        return np.full(channels, values.reshape(-1)[0], dtype=np.float64)
    if out_rank is None or values.ndim > out_rank or values.size != channels:
        return None
    shape = (1,) * (out_rank - values.ndim) + tuple(values.shape)
    if len(shape) < 2 or shape[1] != channels or any(dim != 1 for index, dim in enumerate(shape) if index != 1):
        return None
    return values.reshape(-1).astype(np.float64)


def _batchnorm_affine(node: gs.Node, graph: gs.Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel, float64, of a BatchNormalization in inference mode with constant parameters
    (None when it trains, its mean/var outputs are read, or a parameter is not a constant of one size)."""
    if (
        len(node.inputs) != 5
        or node.attrs.get("training_mode", 0)
        or any(extra.outputs or extra in graph.outputs for extra in node.outputs[1:])
    ):
        return None
    params = [constant_values(tensor) for tensor in node.inputs[1:]]
    if any(p is None or p.dtype.kind != "f" for p in params):
        return None
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)
    if not gamma.size == beta.size == mean.size == var.size:
        return None
    scale = gamma / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
    return scale, beta - mean * scale


def _fold_into_conv(graph: gs.Graph, conv: gs.Node, follower: gs.Node) -> bool:
    """Fold ``follower`` (BatchNormalization, or Mul/Add by a per-channel constant) into ``conv``'s weights."""
    import onnx_graphsurgeon as gs

    link = conv.outputs[0]
    weight = constant_values(conv.inputs[1])
    has_bias = len(conv.inputs) > 2 and not conv.inputs[2].is_empty()
    bias = constant_values(conv.inputs[2]) if has_bias else None
    if weight is None or weight.dtype.kind != "f" or (has_bias and bias is None):
        return False
    transposed = conv.op == "ConvTranspose"
    if transposed and int(conv.attrs.get("group", 1)) != 1:
        return False
    channels = weight.shape[1] if transposed else weight.shape[0]
    out_rank = weight.ndim
    if follower.op == "BatchNormalization":
        affine = _batchnorm_affine(follower, graph)
        if affine is None or affine[0].size != channels:
            return False
        scale, shift = affine
    else:
        other = _other_input(follower, link)
        values = constant_values(other) if other is not None else None
        if values is None or values.dtype != weight.dtype:
            return False
        per_channel = _per_channel(values, channels, out_rank)
        if per_channel is None:
            return False
        scale, shift = (per_channel, np.zeros(channels)) if follower.op == "Mul" else (np.ones(channels), per_channel)
    axis_shape = [1] * weight.ndim
    axis_shape[1 if transposed else 0] = channels
    new_weight = (weight.astype(np.float64) * scale.reshape(axis_shape)).astype(weight.dtype)
    old_bias = bias.astype(np.float64).reshape(-1) if bias is not None else np.zeros(channels)
    new_bias = (old_bias * scale + shift).astype(weight.dtype)
    name = conv.name or link.name
    conv.inputs[1] = gs.Constant(f"{name}_w_{follower.op.lower()}_{id(follower) % 100000}", new_weight)
    bias_tensor = gs.Constant(f"{name}_b_{follower.op.lower()}_{id(follower) % 100000}", new_bias)
    if len(conv.inputs) > 2:
        conv.inputs[2] = bias_tensor
    else:
        conv.inputs.append(bias_tensor)
    final = follower.outputs[0]
    follower.outputs.clear()
    follower.inputs.clear()
    conv.outputs[0] = final
    return True


@cleaning_pass("fuse_conv_affine", "numeric")
def fuse_conv_affine(graph: gs.Graph, context: PassContext) -> None:
    """Fold BatchNormalization and per-channel Mul/Add after a Conv into its weights and bias (neutral for
    TensorRT, which fuses these itself; fewer nodes to read)."""
    changed = True
    while changed:
        changed = False
        for conv in list(graph.nodes):
            if conv.op not in ("Conv", "ConvTranspose") or len(conv.outputs) != 1 or len(conv.inputs) < 2:
                continue
            link = conv.outputs[0]
            if link in graph.outputs or len(link.outputs) != 1:
                continue
            follower = link.outputs[0]
            if follower.op in ("BatchNormalization", "Mul", "Add") and _fold_into_conv(graph, conv, follower):
                changed = True


# ---------------------------------------------------------------------------------------------- affine → next Conv

_FORWARD_AFFINE_OPS = ("BatchNormalization", "Mul", "Add", "Sub", "Div")


def _input_affine(node: gs.Node, graph: gs.Graph) -> tuple[gs.Tensor, np.ndarray, np.ndarray, bool] | None:
    """(x, scale, shift, per channel) when ``node`` computes ``x * scale + shift`` with constants
    (BatchNormalization in inference mode, or Mul/Add/Sub/Div by a constant); scale and shift are float64 arrays:
    one value per channel of axis 1 (per channel True: BatchNormalization), else as the constant broadcasts, not
    yet checked against the consumers' channel count."""
    if node.op == "BatchNormalization":
        affine = _batchnorm_affine(node, graph)
        return None if affine is None else (node.inputs[0], *affine, True)
    if len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    first, second = node.inputs
    constant_first = is_constant(first) and not is_constant(second)
    if constant_first and node.op not in ("Mul", "Add"):
        return None  # c - x and c / x are not affine in x with these shapes of constant
    x, other = (second, first) if constant_first else (first, second)
    values = constant_values(other)
    if values is None or values.dtype.kind != "f" or is_constant(x):
        return None
    values = values.astype(np.float64)
    ones, zeros = np.ones_like(values), np.zeros_like(values)
    if node.op == "Mul":
        return x, values, zeros, False
    if node.op == "Div":
        return (x, 1.0 / values, zeros, False) if np.all(values != 0) else None
    return x, ones, values if node.op == "Add" else -values, False


def _channel_vector(values: np.ndarray, channels: int, rank: int, per_channel: bool) -> np.ndarray | None:
    """``values`` as one number per input channel if, broadcast against a [N, C, ...] tensor of ``rank``, it
    varies only along C (or not at all); ``per_channel``: ``values`` holds one number per channel already."""
    if per_channel:
        return values.astype(np.float64) if values.shape == (channels,) else None
    if values.size == 1 and values.ndim <= rank:
        return np.full(channels, values.reshape(-1)[0], dtype=np.float64)
    if values.ndim == 1 and values.size == channels and rank == 2:
        return values.astype(np.float64)  # only [N, C] aligns a 1-D vector with C
    shape = (1,) * (rank - values.ndim) + tuple(values.shape) if values.ndim <= rank else None
    if shape is None or len(shape) < 2 or shape[1] != channels or any(d != 1 for i, d in enumerate(shape) if i != 1):
        return None
    return values.reshape(-1).astype(np.float64)


def _conv_pads_input(conv: gs.Node) -> bool:
    """True when ``conv`` reads zeros outside its input (explicit or automatic padding)."""
    auto_pad = conv.attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return True
    return auto_pad == "NOTSET" and any(int(p) != 0 for p in conv.attrs.get("pads", []))


def _forward_fold_plan(
    affine: gs.Node, graph: gs.Graph
) -> tuple[gs.Tensor, list[tuple[gs.Node, np.ndarray, np.ndarray]]] | None:
    """(x, [(conv, new weight, new bias)]) when every reader of ``affine``'s output is a Conv that can take the
    affine into its weights exactly: the per-channel scale into the weights, the shift into the bias, which is
    exact when the Conv reads no padding (every tap sees a real shifted value) or when the shift is zero (a
    padded zero stays zero after scaling)."""
    found = _input_affine(affine, graph)
    if found is None:
        return None
    x, scale, shift, per_channel = found
    y = affine.outputs[0]
    if y in graph.outputs or not y.outputs:
        return None
    plans: list[tuple[gs.Node, np.ndarray, np.ndarray]] = []
    for conv in y.outputs:
        if conv.op != "Conv" or len(conv.inputs) < 2 or conv.inputs[0] is not y or y in conv.inputs[1:]:
            return None
        weight = constant_values(conv.inputs[1])
        has_bias = len(conv.inputs) > 2 and not conv.inputs[2].is_empty()
        bias = constant_values(conv.inputs[2]) if has_bias else None
        if weight is None or weight.dtype.kind != "f" or weight.ndim < 3 or (has_bias and bias is None):
            return None
        group = int(conv.attrs.get("group", 1))
        out_channels, group_channels = weight.shape[0], weight.shape[1]
        channels = group_channels * group
        if group < 1 or out_channels % group:
            return None
        per_scale = _channel_vector(scale, channels, weight.ndim, per_channel)
        per_shift = _channel_vector(shift, channels, weight.ndim, per_channel)
        if per_scale is None or per_shift is None:
            return None
        if _conv_pads_input(conv) and np.any(per_shift != 0):
            return None  # the padded border would read 0 where the original read the shift
        # input channel read by weight[o, c]: group (o // outputs per group) * channels per group + c
        index = (np.arange(out_channels) // (out_channels // group))[:, None] * group_channels
        index = index + np.arange(group_channels)[None, :]
        taps = (1,) * (weight.ndim - 2)
        wide = weight.astype(np.float64)
        new_weight = wide * per_scale[index].reshape(out_channels, group_channels, *taps)
        old_bias = np.zeros(out_channels) if bias is None else bias.astype(np.float64).reshape(-1)
        spatial = tuple(range(2, weight.ndim))
        new_bias = old_bias + (wide.sum(axis=spatial) * per_shift[index]).sum(axis=1)
        plans.append((conv, new_weight.astype(weight.dtype), new_bias.astype(weight.dtype)))
    x_shape = tensor_shape(x)
    rank = plans[0][1].ndim
    channels = plans[0][1].shape[1] * int(plans[0][0].attrs.get("group", 1))
    if x_shape is None or len(x_shape) != rank or x_shape[1] != channels:
        return None  # x must already be [N, C, ...]: a broadcast that widens it cannot move into the Conv
    if len({plan[1].shape[1] * int(plan[0].attrs.get("group", 1)) for plan in plans}) != 1:
        return None
    return x, plans


@cleaning_pass("fuse_affine_into_next_conv", "numeric")
def fuse_affine_into_next_conv(graph: gs.Graph, context: PassContext) -> None:
    """Fold a per-channel affine (BatchNormalization, or Mul/Add/Sub/Div by a per-channel constant) whose only
    readers are Convs forward into their weights and biases (a BatchNormalization after a Concat has no Conv
    before it to fold into); only where exact: no padding, or no shift."""
    import onnx_graphsurgeon as gs

    affines = [
        found
        for node in graph.nodes
        if node.op in _FORWARD_AFFINE_OPS
        and node.outputs
        and node.outputs[0].outputs
        and all(reader.op == "Conv" for reader in node.outputs[0].outputs)
        and (found := _input_affine(node, graph)) is not None
    ]
    if not affines:
        return
    if any(tensor_shape(x) is None for x, *_ in affines):
        refresh_shapes(graph, context)  # the affine's input must be [N, C, ...] already
    names = set(graph.tensors())
    changed = True
    while changed:
        changed = False
        for affine in list(graph.nodes):
            if affine.op not in _FORWARD_AFFINE_OPS or not affine.outputs:
                continue
            plan = _forward_fold_plan(affine, graph)
            if plan is None:
                continue
            x, convs = plan
            for conv, weight, bias in convs:
                base = conv.name or conv.outputs[0].name
                weight_name = _unique_name(f"{base}_w_fwd_{affine.op.lower()}", names)
                bias_name = _unique_name(f"{base}_b_fwd_{affine.op.lower()}", names)
                conv.inputs[0] = x
                conv.inputs[1] = gs.Constant(weight_name, weight)
                if len(conv.inputs) > 2:
                    conv.inputs[2] = gs.Constant(bias_name, bias)
                else:
                    conv.inputs.append(gs.Constant(bias_name, bias))
            affine.outputs.clear()
            affine.inputs.clear()
            changed = True


def _unique_name(base: str, taken: set[str]) -> str:
    name, index = base, 1
    while name in taken:
        name, index = f"{base}_{index}", index + 1
    taken.add(name)
    return name


@cleaning_pass("fuse_pad_conv", "numeric")
def fuse_pad_conv(graph: gs.Graph, context: PassContext) -> None:
    """Fold a zero constant-mode Pad on spatial dimensions into the following Conv's pads (neutral for
    TensorRT, which merges Pad into Conv itself unless something sits between them)."""
    for pad in list(graph.nodes):
        if pad.op != "Pad" or not pad.outputs or pad.attrs.get("mode", "constant") not in ("constant", b"constant"):
            continue
        link = pad.outputs[0]
        if link in graph.outputs or len(link.outputs) != 1:
            continue
        conv = link.outputs[0]
        if (
            conv.op != "Conv"
            or conv.inputs[0] is not link
            or conv.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET")
        ):
            continue
        if len(pad.inputs) > 3 and not pad.inputs[3].is_empty():
            continue  # explicit axes (opset 18): rare, left alone
        pads = _constant_list(pad.inputs[1]) if len(pad.inputs) > 1 else [int(v) for v in pad.attrs.get("pads", [])]
        value = pad.inputs[2] if len(pad.inputs) > 2 and not pad.inputs[2].is_empty() else None
        if value is not None and _scalar(value) != 0.0:
            continue
        if "value" in pad.attrs and float(pad.attrs["value"]) != 0.0:
            continue
        if not pads or len(pads) % 2:
            continue
        rank = len(pads) // 2
        begins, ends = pads[:rank], pads[rank:]
        if any(begins[:2]) or any(ends[:2]) or any(p < 0 for p in pads):
            continue
        spatial = rank - 2
        old = [int(v) for v in conv.attrs.get("pads", [0] * (2 * spatial))]
        conv.attrs["pads"] = [old[i] + begins[2 + i] for i in range(spatial)] + [
            old[spatial + i] + ends[2 + i] for i in range(spatial)
        ]
        conv.inputs[0] = pad.inputs[0]
        pad.outputs.clear()
        pad.inputs.clear()


# ---------------------------------------------------------------------------------------------- MatMul + Add → Gemm


def _gemm_bias(matmul: gs.Node, add: gs.Node) -> gs.Tensor | None:
    """The Add's constant bias when ``Gemm(A, B, bias)`` computes ``MatMul(A, B) + bias``: A and B of rank 2, a
    float bias of A's type and rank <= 2 that broadcasts to [M, N] without widening it."""
    bias = _other_input(add, matmul.outputs[0])
    values = constant_values(bias) if bias is not None else None
    a_shape, b_shape = tensor_shape(matmul.inputs[0]), tensor_shape(matmul.inputs[1])
    if bias is None or values is None or values.dtype.kind != "f" or values.ndim > 2:
        return None
    if a_shape is None or b_shape is None or len(a_shape) != 2 or len(b_shape) != 2:
        return None
    if np_dtype(matmul.inputs[0]) != values.dtype or np_dtype(matmul.inputs[1]) != values.dtype:
        return None
    rows, columns = (1,) * (2 - values.ndim) + tuple(values.shape)
    fits_rows = rows == 1 or rows == a_shape[0]
    fits_columns = columns == 1 or columns == b_shape[1]
    return bias if fits_rows and fits_columns else None


def _has_small_constant_bias(add: gs.Node, product: gs.Tensor) -> bool:
    other = _other_input(add, product)
    return other is not None and is_constant(other) and len(other.shape or ()) <= 2


@cleaning_pass("fuse_matmul_add_gemm", "numeric", min_opset=11)
def fuse_matmul_add_gemm(graph: gs.Graph, context: PassContext) -> None:
    """Replace MatMul of two rank-2 tensors followed by Add of a constant bias by one Gemm (what onnxsim does; neutral
    for TensorRT, which maps both to the same layers)."""
    import onnx_graphsurgeon as gs

    pairs = [
        (node, node.outputs[0].outputs[0])
        for node in graph.nodes
        if node.op == "MatMul"
        and len(node.inputs) == 2
        and len(node.outputs) == 1
        and _only_consumer(node.outputs[0], graph, "Add") is not None
    ]
    pairs = [(matmul, add) for matmul, add in pairs if _has_small_constant_bias(add, matmul.outputs[0])]
    if not pairs:
        return
    if any(tensor_shape(tensor) is None for matmul, _ in pairs for tensor in matmul.inputs):
        refresh_shapes(graph, context)  # ranks of A and B
    for matmul, add in pairs:
        bias = _gemm_bias(matmul, add)
        if bias is None or len(add.inputs) != 2:
            continue
        out = add.outputs[0]
        a, b = matmul.inputs
        for node in (matmul, add):
            node.outputs.clear()
            node.inputs.clear()
        graph.nodes.append(gs.Node("Gemm", name=f"{matmul.name or out.name}_gemm", inputs=[a, b, bias], outputs=[out]))


# ---------------------------------------------------------------------------------------------- LayerNorm / GELU


def _other_input(node: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    others = [inp for inp in node.inputs if inp is not tensor]
    return others[0] if len(others) == 1 else None


def _only_consumer(tensor: gs.Tensor, graph: gs.Graph, op: str | tuple[str, ...]) -> gs.Node | None:
    ops = (op,) if isinstance(op, str) else op
    if tensor in graph.outputs or len(tensor.outputs) != 1 or tensor.outputs[0].op not in ops:
        return None
    return tensor.outputs[0]


def _scalar(tensor: gs.Tensor) -> float | None:
    values = constant_values(tensor)
    if values is None or values.size != 1:
        return None
    return float(values.reshape(-1)[0])


def _reduce_axes(node: gs.Node) -> list[int] | None:
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    if len(node.inputs) > 1 and not node.inputs[1].is_empty():
        return _constant_list(node.inputs[1])
    return None


@cleaning_pass("fuse_layernorm", "numeric", min_opset=17)
def fuse_layernorm(graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Replace a written-out LayerNorm (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) by
    LayerNormalization (opset >= 17): TensorRT warns that the written-out form overflows in FP16."""
    import onnx_graphsurgeon as gs

    graph = refresh_shapes(graph, context)
    for mean_node in list(graph.nodes):
        if mean_node.op != "ReduceMean" or not mean_node.outputs or int(mean_node.attrs.get("keepdims", 1)) != 1:
            continue
        x = mean_node.inputs[0]
        axes = _reduce_axes(mean_node)
        if axes != [-1]:
            shape = tensor_shape(x)
            if axes is None or shape is None or len(axes) != 1 or axes[0] != len(shape) - 1:
                continue
        mean = mean_node.outputs[0]
        sub = _only_consumer(mean, graph, "Sub")
        if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mean:
            continue
        centered = sub.outputs[0]
        if centered in graph.outputs or len(centered.outputs) != 2:
            continue
        square = next((n for n in centered.outputs if n.op in ("Pow", "Mul")), None)
        divide = next((n for n in centered.outputs if n.op == "Div"), None)
        if square is None or divide is None or divide.inputs[0] is not centered:
            continue
        if square.op == "Pow" and (_scalar(square.inputs[1]) != 2.0 or square.inputs[0] is not centered):
            continue
        if square.op == "Mul" and not (square.inputs[0] is centered and square.inputs[1] is centered):
            continue
        var_node = _only_consumer(square.outputs[0], graph, "ReduceMean")
        if var_node is None or _reduce_axes(var_node) != axes or int(var_node.attrs.get("keepdims", 1)) != 1:
            continue
        add_eps = _only_consumer(var_node.outputs[0], graph, "Add")
        if add_eps is None:
            continue
        epsilon = _scalar(_other_input(add_eps, var_node.outputs[0]))
        sqrt = _only_consumer(add_eps.outputs[0], graph, "Sqrt")
        if (
            epsilon is None
            or sqrt is None
            or divide.inputs[1] is not sqrt.outputs[0]
            or len(sqrt.outputs[0].outputs) != 1
        ):
            continue
        dtype = np_dtype(x)
        x_shape = tensor_shape(x)
        channels = x_shape[-1] if x_shape else None
        if dtype is None or dtype.kind != "f":
            continue
        out = divide.outputs[0]
        removed = [mean_node, sub, square, var_node, add_eps, sqrt, divide]
        gamma = beta = None
        scale_node = _only_consumer(out, graph, "Mul")
        if scale_node is not None:
            values = constant_values(_other_input(scale_node, out))
            if values is not None and values.ndim <= 1 and values.size > 0:
                gamma, out = values, scale_node.outputs[0]
                removed.append(scale_node)
                shift_node = _only_consumer(out, graph, "Add")
                if shift_node is not None:
                    values = constant_values(_other_input(shift_node, out))
                    if values is not None and values.ndim <= 1 and values.size > 0:
                        beta, out = values, shift_node.outputs[0]
                        removed.append(shift_node)
        sizes = {v.size for v in (gamma, beta) if v is not None and v.size > 1}
        if isinstance(channels, int) and channels > 0:
            sizes.add(channels)
        if len(sizes) != 1:
            continue  # the normalized size is unknown or inconsistent
        size = sizes.pop()
        gamma = np.broadcast_to(gamma if gamma is not None else np.ones(1), (size,)).astype(dtype)
        beta = np.broadcast_to(beta if beta is not None else np.zeros(1), (size,)).astype(dtype)
        name = mean_node.name or mean.name
        for node in removed:
            node.outputs.clear()
            node.inputs.clear()
        graph.nodes.append(
            gs.Node(
                "LayerNormalization",
                name=f"{name}_layernorm",
                attrs={"axis": -1, "epsilon": float(epsilon)},
                inputs=[
                    x,
                    gs.Constant(f"{name}_ln_scale", np.ascontiguousarray(gamma)),
                    gs.Constant(f"{name}_ln_bias", np.ascontiguousarray(beta)),
                ],
                outputs=[out],
            )
        )
    return graph


@cleaning_pass("fuse_gelu", "numeric", min_opset=20)
def fuse_gelu(graph: gs.Graph, context: PassContext) -> None:
    """Replace x * 0.5 * (1 + erf(x / sqrt(2))) by Gelu (opset >= 20)."""
    import onnx_graphsurgeon as gs

    for erf in list(graph.nodes):
        if erf.op != "Erf" or not erf.inputs or not erf.outputs:
            continue
        scaled = erf.inputs[0]
        scale_node = producer(scaled)
        if (
            scale_node is None
            or scale_node.op not in ("Div", "Mul")
            or len(scaled.outputs) != 1
            or scaled in graph.outputs
        ):
            continue
        x = scale_node.inputs[0]
        factor = _scalar(scale_node.inputs[1])
        expected = math.sqrt(2.0) if scale_node.op == "Div" else 1 / math.sqrt(2.0)
        if factor is None or abs(factor - expected) > 1e-4:
            continue
        add = _only_consumer(erf.outputs[0], graph, "Add")
        if add is None or _scalar(_other_input(add, erf.outputs[0])) != 1.0:
            continue
        mul1 = _only_consumer(add.outputs[0], graph, "Mul")
        if mul1 is None:
            continue
        other = _other_input(mul1, add.outputs[0])
        removed = [scale_node, erf, add, mul1]
        if other is x:
            # x * (1 + erf) then * 0.5
            mul2 = _only_consumer(mul1.outputs[0], graph, "Mul")
            if mul2 is None or _scalar(_other_input(mul2, mul1.outputs[0])) != 0.5:
                continue
            removed.append(mul2)
            out = mul2.outputs[0]
        else:
            # (x * 0.5) * (1 + erf)
            half = producer(other) if other is not None else None
            if (
                other is None
                or half is None
                or half.op != "Mul"
                or len(other.outputs) != 1
                or x not in half.inputs
                or _scalar(_other_input(half, x)) != 0.5
            ):
                continue
            removed.append(half)
            out = mul1.outputs[0]
        for node in removed:
            node.outputs.clear()
            node.inputs.clear()
        graph.nodes.append(
            gs.Node(
                "Gelu", name=f"{erf.name or out.name}_gelu", attrs={"approximate": "none"}, inputs=[x], outputs=[out]
            )
        )


# ---------------------------------------------------------------------------------------------- Q/DQ lint


@cleaning_pass("qdq_lint", "report", recurse=False)
def qdq_lint_pass(graph: gs.Graph, context: PassContext) -> None:
    """Report Q/DQ placements that break TensorRT's rules; never changes the graph."""
    from workbench.clean.qdq_lint import lint_qdq

    context.findings.extend(lint_qdq(graph))


DEFAULT_PASSES: tuple[str, ...] = (
    "override_input_shapes",
    "constants_to_initializers",
    "cleanup_toposort",
    "fold_constants",
    "inline_constant_if",
    "shape_cast_elision",
    "simplify_reshape",
    "remove_noops",
    "merge_consecutive",
    "cse",
    "fuse_conv_affine",
    "fuse_affine_into_next_conv",
    "fuse_pad_conv",
    "fuse_matmul_add_gemm",
    "fuse_layernorm",
    "fuse_gelu",
    "qdq_lint",
)
