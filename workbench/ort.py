"""ONNX Runtime on CPU, the project's numeric reference, in one place.

With graph optimizations off (``ORT_DISABLE_ALL``, the default here) ONNX Runtime runs Q/DQ models as
deterministic simulated quantization in float, matching TensorRT's round-half-even and clamp; with optimizations
on it switches to integer kernels whose accuracy depends on the CPU. ``ORT_ENABLE_BASIC`` with the Q/DQ fusions off
(``session.disable_quant_qdq``) was measured for the precision search (2026-12-05, EfficientNet-Lite0 INT8 Q/DQ,
16 crops): 20 % less CPU time, but its constant folding of the weights' DequantizeLinear changes logits by up to
1.9e-6, so it is not the reference and stays off. Every numeric comparison in the workbench
(cleaning checks, calibration statistics, per-layer diffs, task metrics) builds its session here.

What it does fold, itself, is exact: :func:`fold_constant_qdq` computes each weight's Q/DQ chain once, with ONNX
Runtime's own kernels, instead of on every run; with weight prepacking off the GEMMs then take the same path as
before, so every output is bit-identical (the 1.9e-6 above came from MatMul prepacking its now-constant weights).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

from workbench.errors import WorkbenchError

Feed = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]
PredictFn = Callable[[Feed], Outputs]

if TYPE_CHECKING:
    import onnx
    import onnxruntime

# ONNX Runtime's thread pools, pinned here for every session that computes a number (metrics, statistics, diffs):
# its default follows the machine's core count, and a kernel that splits a reduction over threads may round
# differently with another split, so the same command on another machine could give another metric. Two intra-op
# threads (the dev machine's cores), one inter-op thread (sequential execution). WORKBENCH_ORT_THREADS overrides
# the intra-op count (e.g. on a many-core machine, accepting that the last bits may then differ).
DEFAULT_INTRA_OP_THREADS = 2
INTER_OP_THREADS = 1


def intra_op_threads() -> int:
    """The intra-op thread count every session here uses: ``WORKBENCH_ORT_THREADS`` or :data:`DEFAULT_INTRA_OP_THREADS`."""
    value = os.environ.get("WORKBENCH_ORT_THREADS", "").strip()
    if not value:
        return DEFAULT_INTRA_OP_THREADS
    if not value.isdigit() or int(value) < 1:
        raise WorkbenchError(
            f"WORKBENCH_ORT_THREADS={value!r} is not a thread count.", expected="a whole number >= 1, or unset (2)"
        )
    return int(value)


def intra_op_spinning() -> bool:
    """Whether waiting intra-op threads spin (ONNX Runtime's default) or sleep: ``WORKBENCH_ORT_SPIN=0`` lets them
    sleep, for a machine whose cores other busy processes share (the same results either way)."""
    value = os.environ.get("WORKBENCH_ORT_SPIN", "").strip()
    if value not in ("", "0", "1"):
        raise WorkbenchError(
            f"WORKBENCH_ORT_SPIN={value!r} is not a switch.", expected="0 (waiting threads sleep), 1, or unset (spin)"
        )
    return value != "0"


def thread_settings() -> dict[str, int]:
    """What a result's record says about ONNX Runtime's threads (bench results, search reports)."""
    return {"intra_op_threads": intra_op_threads(), "inter_op_threads": INTER_OP_THREADS}


# what ONNX Runtime can load: a ModelProto, its serialized bytes, or a path to a file
ModelSource = Union["onnx.ModelProto", bytes, str, os.PathLike[str]]


def cpu_session(
    model: ModelSource,
    *,
    extra_outputs: Iterable[str] = (),
    optimized: bool = False,
    what: str = "the model",
    external_initializers: Mapping[str, np.ndarray] | None = None,
    quiet: bool = False,
    fold_weights: bool = True,
) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` on CPU for a ModelProto, its serialized bytes or a file path.

    ``extra_outputs`` exposes intermediate tensors as graph outputs (on a copy; the caller's model is untouched).
    ``external_initializers``: arrays for the top-level initializers the model declares as external data (they
    are read from memory, never from a file), so a model with large weights need not be serialized with them.
    A model ONNX Runtime cannot load raises WorkbenchError naming ``what``. ``quiet``: a probe expected to fail may
    (a batch the graph hard-codes): ONNX Runtime's own error log stays silent, the exception still says why.
    ``fold_weights`` (optimizations off): the weights' Q/DQ chains computed once (:func:`fold_constant_qdq`; a
    ModelProto, its bytes or a self-contained file), every output bit-identical; False runs the graph as written.
    """
    import onnxruntime as ort

    source: onnx.ModelProto | bytes | str
    extra = [name for name in extra_outputs]
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        from workbench._io import refuse_special_file

        refuse_special_file(path, expected="a path to a regular .onnx file")
        if not path.is_file():
            raise WorkbenchError(f"{path}: no such ONNX file.", expected="a path to an existing .onnx file")
        source = str(path)
        if extra:
            import onnx

            source = onnx.load(str(path))
    else:
        source = model
    folded = None
    if fold_weights and not optimized and not external_initializers:
        folded = _folded(source, extra)
        source = folded if folded is not None else source
    refuse_oversized_constants(source, what)
    if extra:
        source = _with_outputs(source, extra)
    if not isinstance(source, (str, bytes)):
        source = source.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 4 if quiet else 3
    options.intra_op_num_threads = intra_op_threads()
    options.inter_op_num_threads = INTER_OP_THREADS
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if not intra_op_spinning():  # spinning threads take the cores of other busy processes (same results)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if folded is not None:  # a GEMM would prepack its now-constant weights and sum in another order (last bits differ)
        options.add_session_config_entry("session.disable_prepacking", "1")
    if external_initializers:
        # ONNX Runtime drops an initializer nothing reads before it takes the external arrays, then refuses an
        # array for it ("Failed to find existing initializer"): a weight left over from training is not an error
        read = _names_read(source)
        names = [name for name in external_initializers if name in read]
        values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(external_initializers[n])) for n in names]
        options.add_external_initializers(names, values)
    try:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        if external_initializers:
            session.workbench_external_values = values  # ORT reads these buffers: keep them alive with it
        return session
    except Exception as error:  # onnxruntime raises its own exception classes (Fail, InvalidGraph, ...)
        if "is not a registered function/op" in str(error):
            raise WorkbenchError(
                f"ONNX Runtime cannot load {what}: it has no kernel for a custom op ({error}).",
                expected="a model of standard ONNX ops, or the op's custom-op library registered with ONNX Runtime",
                hint="every check and INT8 step here runs the model in ONNX Runtime; replace the op with standard "
                "ONNX ops (or a function), or export the model without it",
            ) from error
        raise WorkbenchError(f"ONNX Runtime cannot load {what} ({error}).", expected="a valid ONNX model") from error


def _names_read(model: onnx.ModelProto | bytes | str) -> set[str]:
    """Every tensor name a node of ``model`` (or of its If/Loop/Scan bodies) reads, and its graph outputs."""
    import onnx

    from workbench.model.graph import subgraph_reads

    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = onnx.load(model, load_external_data=False)
    names = {name for node in proto.graph.node for name in node.input if name}
    names |= {output.name for output in proto.graph.output} | subgraph_reads(proto.graph.node)
    return names


def _all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every stored tensor of ``graph`` and its bodies: initializers and tensor attributes (a Constant's value)."""
    from workbench.model.graph import subgraph_bodies

    for current in [graph, *subgraph_bodies(graph.node)]:
        yield from current.initializer
        for node in current.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors


# a file is read whole to look for Q/DQ: above this its weights are folded by nobody (ONNX Runtime runs it as written)
_FOLD_MAX_FILE_BYTES = 1 << 30


def _folded(source: onnx.ModelProto | bytes | str, keep: Iterable[str]) -> onnx.ModelProto | None:
    """:func:`fold_constant_qdq` of a ModelProto, its bytes or a self-contained file; None when nothing folds, or
    the model cannot be read here (ONNX Runtime, loading it as written, then says what is wrong with it)."""
    import onnx

    try:
        if isinstance(source, str):
            if os.path.getsize(source) > _FOLD_MAX_FILE_BYTES:
                return None
            data = Path(source).read_bytes()
            if b"DequantizeLinear" not in data:
                return None
            source = onnx.load_from_string(data)  # external data stays unread: fold_constant_qdq refuses it
        return fold_constant_qdq(source, keep)
    except Exception:  # noqa: BLE001  (an optimization only: whatever stops it, the model runs as written)
        return None


_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# ops whose ONNX Runtime CPU kernels prepack a constant input (and then sum in another order): with the folded weights
# prepacking must be off, which would move these ops' results wherever they read a weight left as it was (a GEMM
# kept in FP32 by a mixed plan), so such a model is not folded. Conv does not prepack (its outputs are bit-equal with
# prepacking on and off, measured on ocr-cls); Gemm does (EfficientNet-Lite0's classifier).
_PREPACKING_OPS = frozenset(
    {
        "MatMul",
        "Gemm",
        "ConvTranspose",
        "LSTM",
        "GRU",
        "RNN",
        "Attention",
        "QAttention",
        "FusedGemm",
        "FusedMatMul",
        "QGemm",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "MatMulNBits",
        "DynamicQuantizeMatMul",
        "DynamicQuantizeLSTM",
    }
)


def fold_constant_qdq(model: onnx.ModelProto | bytes, keep: Iterable[str] = ()) -> onnx.ModelProto | None:
    """``model`` with each Q/DQ chain on constants (a weight's QuantizeLinear -> DequantizeLinear, or the
    DequantizeLinear of a stored integer weight) replaced by its float output, computed once by ONNX Runtime's own
    kernels; None when it has none (or it is not a model this can parse).

    With optimizations off ONNX Runtime re-quantizes every weight on every run, which dominates a transformer's
    evaluation (MiniLM INT8: 5.8 s of 1.3 s FP32 work on 128 sentences; folded 1.3 s, the same metric bit for bit).
    Written here because no library folds only these: ONNX Runtime's constant folding skips DequantizeLinear on
    purpose, and onnx-graphsurgeon's ``fold_constants`` folds every constant subgraph. Tensors in ``keep`` (extra
    outputs asked for), graph outputs, and Q outputs read by anything but a folded DequantizeLinear stay computed; a
    model where a GEMM reads a weight left in float (see :data:`_PREPACKING_OPS`) is not folded.
    """
    import onnx
    from onnx import helper, numpy_helper

    from workbench.model.graph import subgraph_bodies, subgraph_reads

    if isinstance(model, bytes):
        if b"DequantizeLinear" not in model:
            return None
        try:
            model = onnx.load_from_string(model)
        except Exception:  # noqa: BLE001  (ONNX Runtime reports an unparsable model itself)
            return None
    graph = model.graph
    if not any(node.op_type == "DequantizeLinear" for node in graph.node):
        return None
    if any(tensor.data_location == onnx.TensorProto.EXTERNAL for tensor in _all_tensors(graph)):
        return None  # its bytes live in other files, found relative to the model's folder: run as written
    if any(node.op_type in _PREPACKING_OPS for body in subgraph_bodies(graph.node) for node in body.node):
        return None  # a GEMM inside an If/Loop/Scan body may prepack what it reads: prepacking stays on
    inputs = {value.name for value in graph.input}  # an initializer that is also an input can be fed: not constant
    stored = {init.name: init for init in graph.initializer if init.name not in inputs}
    # what ONNX Runtime also holds as constants (and may prepack): Constant nodes' outputs, sparse initializers
    other_constants = {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    other_constants |= {sparse.values.name for sparse in graph.sparse_initializer}
    pinned = set(keep) | {value.name for value in graph.output}
    read_by_bodies = subgraph_reads(graph.node)
    folded: list[onnx.NodeProto] = []
    while True:  # a fixed point: dropping a Q (its output needed as it is) un-folds the DequantizeLinear after it
        constant = set(stored)
        folded = []
        for node in graph.node:
            if (
                node.op_type in _QDQ_OPS
                and node.domain in ("", "ai.onnx")
                and all(not name or name in constant for name in node.input)
                and not any(name in pinned for name in node.output)
            ):
                folded.append(node)
                constant.update(node.output)
        folded_ids = {id(node) for node in folded}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        blocked = {
            output
            for node in folded
            if node.op_type == "QuantizeLinear"
            for output in node.output
            if output in read_by_bodies
            or any(id(r) not in folded_ids or r.op_type != "DequantizeLinear" for r in readers.get(output, []))
        }
        if not blocked:
            break
        pinned |= blocked
    needed = [
        output
        for node in folded
        if node.op_type == "DequantizeLinear"
        for output in node.output
        if output in read_by_bodies or any(id(r) not in folded_ids for r in readers.get(output, []))
    ]
    if not needed:
        return None
    if any(
        node.op_type in _PREPACKING_OPS and any(name in stored or name in other_constants for name in node.input)
        for node in graph.node
        if id(node) not in folded_ids
    ):
        return None  # prepacking must stay on for that weight, and off for the folded ones: run as written
    read_by_folded = {name for node in folded for name in node.input if name}
    scale_of = {node.output[0]: stored.get(node.input[1]) for node in folded if node.op_type == "DequantizeLinear"}
    outputs = [
        helper.make_tensor_value_info(name, scale_of[name].data_type if scale_of.get(name) else 1, None)
        for name in needed
    ]
    weights = helper.make_graph(
        folded, "weights", [], outputs, [init for name, init in stored.items() if name in read_by_folded]
    )
    weights_model = helper.make_model(weights, opset_imports=list(model.opset_import))
    weights_model.ir_version = model.ir_version
    try:  # an output type declared wrong here (a scale that is itself folded) fails the run: nothing is folded
        values = session_predict(cpu_session(weights_model, fold_weights=False, what="the weights' Q/DQ"))({})
    except WorkbenchError:
        return None
    kept_nodes = [node for node in graph.node if id(node) not in folded_ids]
    still_read = {name for node in kept_nodes for name in node.input} | read_by_bodies | pinned
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(kept_nodes)
    del out.graph.initializer[:]
    out.graph.initializer.extend(
        [init for init in graph.initializer if init.name in still_read or init.name in inputs]
        + [numpy_helper.from_array(np.asarray(values[name]), name) for name in needed]
    )
    return out


_SHAPE_INPUT = {"ConstantOfShape": 0, "Expand": 1}  # op -> the input holding the output's shape
MAX_SHAPE_VALUES = 64


def _small_int_constants(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """Integer initializers and Constant outputs of at most MAX_SHAPE_VALUES values (shapes, repeats)."""
    from onnx import TensorProto, numpy_helper

    values: dict[str, list[int]] = {}
    tensors = [(init.name, init) for init in graph.initializer]
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            tensors += [(node.output[0], attr.t) for attr in node.attribute if attr.name == "value"]
    for name, tensor in tensors:
        count = math.prod(tensor.dims)
        if tensor.data_type in (TensorProto.INT64, TensorProto.INT32) and count <= MAX_SHAPE_VALUES:
            if tensor.data_location == TensorProto.EXTERNAL:
                continue
            values[name] = [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]
    return values


def refuse_oversized_constants(model: ModelSource, what: str) -> None:
    """Refuse, before ONNX Runtime allocates it, a tensor that a node builds from constant sizes alone
    (ConstantOfShape, Expand, Tile) when it would not fit the memory budget: ORT would allocate it on the
    first run (16 GiB for ConstantOfShape([4, 1024, 1024, 1024])) or fail deep inside its arena."""
    import onnx
    from onnx import helper

    from workbench._arrays import check_allocation

    try:
        if isinstance(model, (str, os.PathLike)):
            proto = onnx.load(os.fspath(model), load_external_data=False)
        elif isinstance(model, bytes):
            proto = onnx.load_from_string(model)
        else:
            proto = model
    except Exception:  # noqa: BLE001 - ONNX Runtime reports an unreadable model itself, in its own words
        return
    graph = proto.graph
    constants = _small_int_constants(graph)
    dims_of = {init.name: list(init.dims) for init in graph.initializer}
    dtype_of = {init.name: init.data_type for init in graph.initializer}
    for node in graph.node:
        dims: list[int] | None = None
        elem = 1  # bytes per element when the dtype is unknown: a lower bound
        if node.op_type in _SHAPE_INPUT and len(node.input) > _SHAPE_INPUT[node.op_type]:
            dims = constants.get(node.input[_SHAPE_INPUT[node.op_type]])
            if node.op_type == "ConstantOfShape":
                value = next((attr.t for attr in node.attribute if attr.name == "value"), None)
                elem = helper.tensor_dtype_to_np_dtype(value.data_type).itemsize if value is not None else 4
            elif node.input[0] in dtype_of:
                elem = helper.tensor_dtype_to_np_dtype(dtype_of[node.input[0]]).itemsize
        elif node.op_type == "Tile" and len(node.input) > 1 and node.input[0] in dims_of:
            repeats = constants.get(node.input[1])
            if repeats is not None and len(repeats) == len(dims_of[node.input[0]]):
                dims = [a * b for a, b in zip(dims_of[node.input[0]], repeats)]
                elem = helper.tensor_dtype_to_np_dtype(dtype_of[node.input[0]]).itemsize
        if dims is None or any(d < 0 for d in dims):
            continue
        check_allocation(
            math.prod(dims) * elem,
            f"{what}: node {node.name or node.output[0]!r} ({node.op_type}) makes a {dims} tensor from constant "
            "sizes; it",
            expected="a model whose constant-sized tensors fit in memory",
            hint="check the exported sizes (a baked batch or sequence size multiplied in); ONNX Runtime would "
            "allocate this tensor whole",
        )


def _with_outputs(model: onnx.ModelProto | bytes | str, names: list[str]) -> onnx.ModelProto:
    import onnx

    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    elif isinstance(model, str):
        model = onnx.load(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {output.name for output in copy.graph.output}
    for name in names:
        if name not in existing:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
    return copy


def session_predict(session: onnxruntime.InferenceSession, *, what: str = "the model") -> PredictFn:
    """``predict(feed) -> {output name: array}`` over a session; a feed missing an input is a WorkbenchError."""
    output_names = [output.name for output in session.get_outputs()]
    input_names = [inp.name for inp in session.get_inputs()]

    def predict(feed: Feed) -> Outputs:
        missing = [name for name in input_names if name not in feed]
        if missing:
            raise WorkbenchError(f"{what}: the feed lacks model input(s) {missing}.", expected=f"inputs {input_names}")
        inputs = {name: feed[name] for name in input_names}
        try:
            return dict(zip(output_names, session.run(output_names, inputs)))
        except Exception as error:  # ORT's Fail / InvalidArgument / RuntimeException (plain Exception subclasses)
            if type(error).__module__.split(".")[0] != "onnxruntime":
                raise
            raise run_failed(what, inputs, error) from error

    return predict


def run_failed(what: str, feed: Feed, error: BaseException) -> WorkbenchError:
    """An ONNX Runtime run that failed, as one WorkbenchError naming the feed's shapes (a shape baked into a
    Reshape by the exporter fails only for other input shapes)."""
    shapes = ", ".join(f"{name}{list(getattr(value, 'shape', ()))}" for name, value in feed.items())
    message = re.sub(r"\s+", " ", str(error)).strip()
    baked = "Reshape" in message or "reshape" in message
    return WorkbenchError(
        f"ONNX Runtime failed running {what} on inputs {shapes}: {message[:600]}",
        expected="inputs of shapes the model can take",
        hint=(
            "the exporter probably baked an input's size (e.g. the sequence length) into a Reshape: re-export with "
            "dynamic axes, or give the shape it was exported for"
            if baked
            else None
        ),
    )


def cpu_predict(model: ModelSource, *, optimized: bool = False, what: str = "the model") -> PredictFn:
    """``predict(feed)`` for a ModelProto, bytes or path, with ONNX Runtime CPU (optimizations off by default)."""
    return session_predict(cpu_session(model, optimized=optimized, what=what), what=what)
