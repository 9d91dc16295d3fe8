"""Per-layer accuracy diff of a Q/DQ model against its FP32 original, streamed over samples.

For every float tensor both models compute (matched by name: the Q/DQ rewrite keeps producer names and only
rewires consumers), the diff accumulates running sums per batch and drops the values, so memory is one batch:

* *accumulated*: the FP32 model's tensor against the quantized model's tensor (error carried from all layers above);
* *local*: for tensors that get a Q/DQ pair, the FP32 tensor against its own fake-quantized self (this layer's own
  rounding + clipping), with the fraction of values clipped; weights likewise, per channel.

SQNR (dB) = 10 log10(sum x^2 / sum (x - x_hat)^2). The culprit is where accumulated SQNR drops in topological
order; a quantized input's cause is "clipping" (range too tight) or "outliers" (range inflated, values crushed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from workbench._io import write_json_atomic
from workbench.artifact import Artifact, to_jsonable
from workbench.calib.data import RANDOM_DATA_WARNING, CalibrationSource
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import onnx
    import onnxruntime

    from workbench.artifact import JsonObject
    from workbench.calib.qdq import QdqModel
    from workbench.engine.layermap import LayerMap
    from workbench.model import OnnxModel

SQNR_CAP_DB = 100.0  # identical tensors have infinite SQNR; cap so drops stay finite and JSON stays valid
CLIPPING_FRACTION = 1e-3
IDEAL_RMSE_OVER_SCALE = 1.0 / math.sqrt(12.0)  # uniform rounding noise
OUTLIER_SQNR_DB = 20.0
# Pure data movement: the output holds the input's values rearranged, so its SQNR repeats its input's. Skipped unless
# ``all_tensors=True``; exposing every such tensor as an ORT output costs time and memory for no new information.
DATA_MOVEMENT_OPS = frozenset(
    {
        "Reshape",
        "Transpose",
        "Squeeze",
        "Unsqueeze",
        "Flatten",
        "Identity",
        "Cast",
        "Expand",
        "Tile",
        "Gather",
        "Slice",
        "Split",
        "DepthToSpace",
        "SpaceToDepth",
    }
)
SKIP_OPS = frozenset(
    {
        "Shape",
        "Constant",
        "ConstantOfShape",
        "Size",
        "NonZero",
        "QuantizeLinear",
        "DequantizeLinear",
        "Range",
        "ArgMax",
        "ArgMin",
        "TopK",
        "Equal",
        "Less",
        "Greater",
        "Not",
        "And",
        "Or",
    }
)


def sqnr_db(signal_power: float, noise_power: float) -> float:
    if noise_power <= 0.0:
        return SQNR_CAP_DB
    if signal_power <= 0.0:
        return -SQNR_CAP_DB
    return float(min(SQNR_CAP_DB, 10.0 * math.log10(signal_power / noise_power)))


@dataclass(frozen=True)
class TensorDiff(Artifact):
    """One tensor's diff row."""

    name: str
    node: str  # producing node (for weights and graph inputs: the consuming quantized node)
    op: str
    index: int  # topological position of ``node``
    kind: str  # "activation" | "weight" | "input"
    quantized: bool
    sqnr_db_local: float | None = None
    sqnr_db_accumulated: float | None = None
    cosine: float | None = None
    max_abs_err: float | None = None
    clipped_fraction: float | None = None
    scale: float | None = None
    drop_db: float | None = None
    noise_added: float | None = None  # relative noise power this tensor adds over its worst input (10^(-SQNR/10) units)
    cause: str | None = None
    format: str | None = None  # "int8" or "fp8" for quantized tensors


@dataclass(frozen=True)
class LayerDiff(Artifact):
    """The per-tensor rows in topological order, the ranking of added noise, and the task metric when labelled."""

    tensors: tuple[TensorDiff, ...]
    num_batches: int
    num_samples: int
    seconds: float
    task_metric: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()

    def ranking(self, n: int | None = None) -> list[TensorDiff]:
        """Activation rows that add the most relative noise power (largest ``noise_added`` first).

        Ranked by added noise, not by the raw dB drop: 100 -> 43 dB is harmless, 25 -> 10 dB is not.
        """
        rows = [t for t in self.tensors if t.noise_added is not None and t.kind == "activation"]
        rows.sort(key=lambda t: -(t.noise_added or 0.0))
        return rows[:n] if n is not None else rows

    def row(self, name: str) -> TensorDiff:
        for row in self.tensors:
            if row.name == name:
                return row
        raise WorkbenchError(f"tensor {name!r} is not in the diff.", expected="a tensor name from diff.tensors")

    def to_json(self) -> JsonObject:
        # the ten worst rows, for a reader of the JSON alone; from_json ignores the key
        ranking = [
            {
                "name": t.name,
                "node": t.node,
                "op": t.op,
                "drop_db": t.drop_db,
                "noise_added": t.noise_added,
                "sqnr_db_accumulated": t.sqnr_db_accumulated,
            }
            for t in self.ranking(10)
        ]
        return super().to_json() | {"ranking": to_jsonable(ranking)}

    def save(self, path: str | Path) -> Path:
        return write_json_atomic(path, self.to_json())


@dataclass
class _Running:
    """Running sums of one tensor over the batches seen so far (mutable: an accumulator, never returned)."""

    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    other: float = 0.0
    max_abs: float = 0.0
    local_noise: float = 0.0
    local_signal: float = 0.0
    local_count: int = 0
    clipped: int = 0
    count: int = 0

    def add_pair(self, reference: np.ndarray, test: np.ndarray) -> None:
        # float32 BLAS dots: ~10x faster than float64 here and accurate to ~1e-4 relative, far below a 0.01 dB change
        ref = reference.astype(np.float32, copy=False).ravel()
        out = test.astype(np.float32, copy=False).ravel()
        if ref.shape != out.shape:
            return
        err = ref - out
        with np.errstate(over="ignore", invalid="ignore"):  # handled just below
            sums = (np.dot(ref, ref), np.dot(err, err), np.dot(ref, out), np.dot(out, out))
        if not all(np.isfinite(v) for v in sums):
            # huge (e.g. additive attention masks near float32 max) or infinite values: exact sums in float64 over
            # the elements finite in both models
            finite = np.isfinite(ref) & np.isfinite(out)
            ref, out = ref[finite].astype(np.float64), out[finite].astype(np.float64)
            err = ref - out
            sums = (np.dot(ref, ref), np.dot(err, err), np.dot(ref, out), np.dot(out, out))
        self.signal += float(sums[0])
        self.noise += float(sums[1])
        self.dot += float(sums[2])
        self.other += float(sums[3])
        if err.size:
            self.max_abs = max(self.max_abs, float(np.abs(err).max()))
        self.count += ref.size

    def add_local(self, reference: np.ndarray, scale: float, fmt: str = "int8") -> None:
        ref = reference.astype(np.float32, copy=False).ravel()
        if fmt == "fp8":
            from workbench.calib.fp8 import E4M3_MAX, round_to_e4m3

            ratio = ref / np.float32(scale)
            self.clipped += int((np.abs(ratio) > E4M3_MAX).sum())
            err = ref - round_to_e4m3(ratio) * np.float32(scale)
        else:
            q = np.rint(ref / np.float32(scale))
            self.clipped += int(((q > 127) | (q < -128)).sum())
            err = ref - np.clip(q, -128, 127) * np.float32(scale)
        with np.errstate(over="ignore", invalid="ignore"):  # handled just below
            noise, signal = np.dot(err, err), np.dot(ref, ref)
        if not (np.isfinite(noise) and np.isfinite(signal)):
            finite = np.isfinite(ref) & np.isfinite(err)
            noise = np.dot(err[finite].astype(np.float64), err[finite].astype(np.float64))
            signal = np.dot(ref[finite].astype(np.float64), ref[finite].astype(np.float64))
        self.local_noise += float(noise)
        self.local_signal += float(signal)
        self.local_count += ref.size


def _float_tensor_names(
    proto: onnx.ModelProto, all_tensors: bool = False, always: set[str] | None = None
) -> tuple[list[str], dict[str, tuple[str, str, int]]]:
    """Float node outputs in topological order with (node name, op, index); ``always`` ones even after data movement."""
    always = always or set()
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # shape inference is best effort; unknown types are checked at run time
        inferred = proto
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(inferred.graph.input)
    }
    names: list[str] = []
    owners: dict[str, tuple[str, str, int]] = {}
    for index, node in enumerate(proto.graph.node):
        if node.op_type in SKIP_OPS:
            continue
        if not all_tensors and node.op_type in DATA_MOVEMENT_OPS and not always.intersection(node.output):
            continue
        for output in node.output:
            if output and types.get(output, 1) in (1, 10, 11):  # float, float16, double (or unknown)
                names.append(output)
                owners[output] = (node.name, node.op_type, index)
    return names, owners


def _quantized_inputs(
    quant_proto: onnx.ModelProto,
) -> tuple[dict[str, float], dict[str, tuple[np.ndarray, np.ndarray, int]], dict[str, str], dict[str, str]]:
    """Activation scales and weight (values, scales, axis) from the Q nodes, each one's first quantized consumer and
    its format ("int8" or "fp8", from the zero point's type; a tensor quantized in both formats keeps the first)."""
    from onnx import TensorProto, numpy_helper

    inits = {i.name: i for i in quant_proto.graph.initializer}
    activation_scales: dict[str, float] = {}
    weights: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
    consumer: dict[str, str] = {}
    formats: dict[str, str] = {}
    by_input: dict[str, list[onnx.NodeProto]] = {}
    cast_input = {n.output[0]: n.input[0] for n in quant_proto.graph.node if n.op_type == "Cast" and n.input}
    for node in quant_proto.graph.node:
        for name in node.input:
            by_input.setdefault(name, []).append(node)
    for node in quant_proto.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[1] not in inits:
            continue
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        source = node.input[0]
        while source in cast_input:  # FP16 plans: the Q reads a Cast of the tensor back to FP32; measure the tensor
            source = cast_input[source]
        if source in formats:
            continue
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        formats[source] = "fp8" if zero is not None and zero.data_type == TensorProto.FLOAT8E4M3FN else "int8"
        dq_nodes = [n for n in by_input.get(node.output[0], []) if n.op_type == "DequantizeLinear"]
        users = [u.name for dq in dq_nodes for u in by_input.get(dq.output[0], [])]
        consumer[source] = users[0] if users else node.name
        if source in inits:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            weights[source] = (numpy_helper.to_array(inits[source]).astype(np.float32), scale, axis)
        elif scale.size == 1:
            activation_scales[source] = float(scale.reshape(()))
    return activation_scales, weights, consumer, formats


def _session(proto: onnx.ModelProto, outputs: list[str]) -> onnxruntime.InferenceSession:
    from workbench.ort import cpu_session

    # optimizations off: Q/DQ runs as simulated quantization, the reference
    return cpu_session(proto, extra_outputs=outputs, what="a model for the per-layer diff")


@dataclass(frozen=True)
class _Compared:
    """Which tensors the diff compares and what it knows about their quantization."""

    compared: list[str]  # float tensors both models compute, in the FP32 model's topological order
    local_only: list[str]  # graph inputs that get a Q/DQ pair (only their local error exists)
    owners: dict[str, tuple[str, str, int]]  # tensor -> (producing node, op, topological index)
    activation_scales: dict[str, float]
    weights: dict[str, tuple[np.ndarray, np.ndarray, int]]  # weight -> (values, per-channel scales, axis)
    consumer: dict[str, str]  # quantized tensor -> its first quantized consumer
    formats: dict[str, str]  # quantized tensor -> "int8" or "fp8"

    @property
    def fp32_names(self) -> list[str]:
        return self.compared + self.local_only


def _pair_protos(
    fp32: OnnxModel | onnx.ModelProto, quantized: QdqModel | onnx.ModelProto, prepared: bool
) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    from workbench.precision.qdq_rules import prepare_model

    fp32_proto = cast("onnx.ModelProto", getattr(fp32, "proto", fp32))
    if not prepared:  # the Q/DQ model was made from the prepared model; compare like with like
        fp32_proto = prepare_model(fp32_proto)
    quant_proto = cast("onnx.ModelProto", getattr(quantized, "proto", quantized))
    if not any(n.op_type == "QuantizeLinear" for n in quant_proto.graph.node):
        raise WorkbenchError(
            "the second model has no QuantizeLinear nodes.", expected="a Q/DQ model made from the FP32 model"
        )
    return fp32_proto, quant_proto


def _tensors_to_compare(fp32_proto: onnx.ModelProto, quant_proto: onnx.ModelProto, all_tensors: bool) -> _Compared:
    activation_scales, weights, consumer, formats = _quantized_inputs(quant_proto)
    names, owners = _float_tensor_names(fp32_proto, all_tensors, always=set(activation_scales))
    quant_outputs = {o for n in quant_proto.graph.node for o in n.output}
    compared = [n for n in names if n in quant_outputs]
    if not compared:
        raise WorkbenchError(
            "no tensor names are shared by the two models.", expected="a Q/DQ model made from this FP32 model"
        )
    graph_inputs = {i.name for i in fp32_proto.graph.input}
    local_only = [n for n in activation_scales if n not in owners and n in graph_inputs]
    return _Compared(compared, local_only, owners, activation_scales, weights, consumer, formats)


def _accumulate(
    ref_session: onnxruntime.InferenceSession,
    quant_session: onnxruntime.InferenceSession,
    tensors: _Compared,
    source: CalibrationSource,
    limit: int | None,
    micro_batch: int | None,
    memory_budget_mb: float,
    progress: bool,
) -> tuple[dict[str, _Running], int, int]:
    """Run both models batch by batch (``micro_batch`` samples at a time) and sum each tensor's errors.

    Returns the running sums per tensor, the number of batches and of samples seen.
    """
    from tqdm.auto import tqdm

    from workbench.calib.stats import check_feed

    fp32_names, compared = tensors.fp32_names, tensors.compared
    input_names = [i.name for i in ref_session.get_inputs()]
    if any(not i.shape or isinstance(i.shape[0], int) for i in ref_session.get_inputs()):
        micro_batch = None  # a fixed batch dimension cannot be split
    running = {name: _Running() for name in fp32_names}
    batches = samples = 0
    iterator = tqdm(
        source.batches(limit),
        total=(len(source) or None) if limit is None else None,
        desc="per-layer diff",
        unit="batch",
        disable=not progress,
        leave=False,
    )
    for feed in iterator:
        feed = check_feed(feed, input_names, batches)
        pending = _split(feed, 1 if micro_batch == 0 else micro_batch)
        while pending:
            part = pending.pop(0)
            try:
                reference = dict(zip(fp32_names, ref_session.run(fp32_names, part)))
                test = dict(zip(compared, quant_session.run(compared, part)))
            except Exception as error:  # ORT's Fail / InvalidArgument: feeds of the wrong shape or dtype
                raise WorkbenchError(
                    f"diff batch {batches}: ONNX Runtime failed ({' '.join(str(error).split())}).",
                    expected="feeds matching the model's input shapes and dtypes",
                ) from error
            if micro_batch == 0:  # first sample measured: size the micro-batches to the memory budget
                per_sample = sum(v.nbytes for v in reference.values()) + sum(v.nbytes for v in test.values())
                micro_batch = max(1, int(memory_budget_mb * 2**20 // max(per_sample, 1)))
                rest = {k: np.concatenate([p[k] for p in pending]) for k in part} if pending else None
                pending = _split(rest, micro_batch) if rest is not None else []
            for name in compared:
                running[name].add_pair(reference[name], test[name])
                del test[name]  # free as we go: peak memory stays near one micro-batch of both models
            for name, scale in tensors.activation_scales.items():
                fmt = tensors.formats.get(name, "int8")
                if name in reference:
                    running[name].add_local(reference[name], scale, fmt)
                elif name in part:
                    running[name].add_local(np.asarray(part[name], dtype=np.float32), scale, fmt)
            del reference, test
        batches += 1
        first = next(iter(feed.values()))
        samples += int(first.shape[0]) if first.ndim else 1
    if batches == 0:
        raise WorkbenchError(f"diff data {source.name!r} yielded no batches.", expected="at least one batch")
    return running, batches, samples


def _tensor_row(
    name: str, node: str, op: str, index: int, kind: str, running: _Running, scale: float | None, fmt: str = "int8"
) -> TensorDiff:
    """A row from the running sums: accumulated error for activations, local error for quantized tensors."""
    values: dict[str, Any] = {}
    if kind == "activation" and running.count:
        denominator = math.sqrt(running.signal * running.other)
        values.update(
            sqnr_db_accumulated=sqnr_db(running.signal, running.noise),
            cosine=float(running.dot / denominator) if denominator > 0 else (1.0 if running.noise == 0 else 0.0),
            max_abs_err=running.max_abs,
        )
    if scale is not None:
        count = max(running.local_count, 1)
        local_db = sqnr_db(running.local_signal, running.local_noise)
        clipped = running.clipped / count
        values.update(
            scale=scale,
            format=fmt,
            sqnr_db_local=local_db,
            clipped_fraction=clipped,
            # FP8's rounding noise scales with |x|, not with the scale: only clipping and outliers tell it
            cause=_cause(
                local_db, clipped, 0.0 if fmt == "fp8" or scale <= 0 else math.sqrt(running.local_noise / count) / scale
            ),
        )
    return TensorDiff(name, node, op, index, kind, scale is not None, **values)


def _with_drops(rows: list[TensorDiff], fp32_proto: onnx.ModelProto) -> list[TensorDiff]:
    """Each activation's accumulated SQNR drop: its inputs' worst accumulated SQNR minus its own, and the relative
    noise power that adds. Inputs made by skipped data-movement nodes (Reshape, Transpose, ...) stand for the
    tensor they rearrange."""
    by_name = {row.name: row for row in rows}
    fp32_nodes = {n.name: n for n in fp32_proto.graph.node}
    alias: dict[str, str] = {}
    for proto_node in fp32_proto.graph.node:
        if proto_node.op_type in DATA_MOVEMENT_OPS and proto_node.input:
            for output in proto_node.output:
                if output not in by_name:
                    alias[output] = alias.get(proto_node.input[0], proto_node.input[0])
    result = []
    for row in rows:
        if row.kind != "activation" or row.sqnr_db_accumulated is None:
            result.append(row)
            continue
        producer = fp32_nodes.get(row.node)
        inputs = [alias.get(i, i) for i in (producer.input if producer is not None else [])]
        upstream = [
            float(by_name[i].sqnr_db_accumulated or 0.0)
            for i in inputs
            if i in by_name and by_name[i].sqnr_db_accumulated is not None
        ]
        before = min(upstream) if upstream else SQNR_CAP_DB
        accumulated = float(row.sqnr_db_accumulated)
        noise_added = float(10.0 ** (-accumulated / 10.0) - 10.0 ** (-before / 10.0))
        result.append(replace(row, drop_db=before - accumulated, noise_added=noise_added))
    return result


def _weight_rows(tensors: _Compared, quant_proto: onnx.ModelProto) -> list[TensorDiff]:
    """Each quantized weight's own per-channel rounding error (no data needed)."""
    from workbench.calib.fp8 import fake_quantize_as

    node_index = {n.name: i for i, n in enumerate(quant_proto.graph.node)}
    rows = []
    for name, (values, weight_scale, axis) in tensors.weights.items():
        fmt: Literal["int8", "fp8"] = "fp8" if tensors.formats.get(name) == "fp8" else "int8"
        quantized_values = fake_quantize_as(values, weight_scale, fmt, axis)
        err = (values - quantized_values).astype(np.float64).ravel()
        signal = float(values.astype(np.float64).ravel() @ values.astype(np.float64).ravel())
        consumer = tensors.consumer.get(name, "")
        rows.append(
            TensorDiff(
                name,
                consumer,
                "weight",
                node_index.get(consumer, -1),
                "weight",
                True,
                sqnr_db_local=sqnr_db(signal, float(err @ err)),
                clipped_fraction=0.0,
                max_abs_err=float(np.abs(err).max()) if err.size else 0.0,
                format=fmt,
            )
        )
    return rows


def diff_models(
    fp32: OnnxModel | onnx.ModelProto,
    quantized: QdqModel | onnx.ModelProto,
    source: CalibrationSource | Iterable[dict[str, np.ndarray]],
    *,
    limit: int | None = None,
    progress: bool = True,
    all_tensors: bool = False,
    micro_batch: int | None = 0,
    memory_budget_mb: float = 192.0,
    prepared: bool = False,
) -> LayerDiff:
    """Compare ``quantized`` (a Q/DQ model made from ``fp32``) against ``fp32`` tensor by tensor over ``source``.

    Every float tensor computed by a non-data-movement node is compared (``all_tensors=True``: every one).
    Each batch is run ``micro_batch`` samples at a time: both models' intermediate tensors are alive at once, so
    this bounds peak memory (running sums make the result identical to whole-batch runs). ``micro_batch=0`` sizes
    it from the first sample so that both models' exposed tensors fit ``memory_budget_mb``; ``None`` = whole batches.
    """
    from workbench.calib.data import IterableSource

    start = time.perf_counter()
    fp32_proto, quant_proto = _pair_protos(fp32, quantized, prepared)
    tensors = _tensors_to_compare(fp32_proto, quant_proto, all_tensors)
    if not isinstance(source, CalibrationSource):
        source = IterableSource(list(source))
    running, batches, samples = _accumulate(
        _session(fp32_proto, tensors.fp32_names),
        _session(quant_proto, tensors.compared),
        tensors,
        source,
        limit,
        micro_batch,
        memory_budget_mb,
        progress,
    )
    scales, formats = tensors.activation_scales, tensors.formats
    rows = [
        _tensor_row(
            name,
            tensors.consumer.get(name, ""),
            "input",
            -1,
            "input",
            running[name],
            scales[name],
            formats.get(name, "int8"),
        )
        for name in tensors.local_only
    ]
    for name in tensors.compared:
        node, op, index = tensors.owners[name]
        rows.append(
            _tensor_row(name, node, op, index, "activation", running[name], scales.get(name), formats.get(name, "int8"))
        )
    rows = _with_drops(rows, fp32_proto) + _weight_rows(tensors, quant_proto)
    notes = (RANDOM_DATA_WARNING,) if getattr(source, "is_random", False) else ()
    return LayerDiff(tuple(rows), batches, samples, time.perf_counter() - start, warnings=notes)


def _split(feed: dict[str, np.ndarray], size: int | None) -> list[dict[str, np.ndarray]]:
    """Split a feed along the batch axis into pieces of ``size`` samples (whole feed if inputs disagree on it)."""
    sizes = {np.asarray(v).shape[0] if np.asarray(v).ndim else None for v in feed.values()}
    if not size or len(sizes) != 1 or None in sizes:
        return [feed]
    total = int(sizes.pop() or 0)
    return [{k: np.asarray(v)[i : i + size] for k, v in feed.items()} for i in range(0, total, size)]


def _cause(local_db: float, clipped_fraction: float, rmse_over_scale: float) -> str:
    """TFLite-debugger style: clipping (error above uniform rounding noise) vs outliers (few clipped, low SQNR)."""
    if clipped_fraction >= CLIPPING_FRACTION or rmse_over_scale > 1.5 * IDEAL_RMSE_OVER_SCALE:
        return "range too tight (clipping)"
    if local_db < OUTLIER_SQNR_DB:
        return "range inflated by outliers"
    return "ok"


@dataclass(frozen=True)
class Divergence(Artifact):
    """The first tensor (topological order) whose accumulated SQNR falls below a threshold, and what computes it.

    ``onnx_nodes``: the producing node and the ONNX nodes TensorRT fused with it; ``engine_layers``: the layers of a
    real build of the quantized model that execute the producing node (empty when no engine was built).
    """

    threshold_db: float
    tensor: str
    node: str
    op: str
    index: int
    sqnr_db_accumulated: float
    sqnr_db_before: float  # the worst accumulated SQNR among its inputs
    onnx_nodes: tuple[str, ...]
    engine_layers: tuple[str, ...] = ()
    engine_layer_types: tuple[str, ...] = ()
    engine_layer_precisions: tuple[str, ...] = ()


def first_divergence(diff: LayerDiff, threshold_db: float, layer_map: LayerMap | None = None) -> Divergence | None:
    """The first activation in topological order whose accumulated SQNR is below ``threshold_db`` (None if none)."""
    if not math.isfinite(threshold_db):
        raise WorkbenchError(f"threshold {threshold_db} dB is not a finite number.", expected="e.g. --threshold 20")
    rows = sorted(
        (r for r in diff.tensors if r.kind == "activation" and r.sqnr_db_accumulated is not None),
        key=lambda r: r.index,
    )
    row = next((r for r in rows if float(r.sqnr_db_accumulated or 0.0) < threshold_db), None)
    if row is None:
        return None
    before = float(row.sqnr_db_accumulated or 0.0) + float(row.drop_db or 0.0)
    layers: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    precisions: tuple[str, ...] = ()
    nodes: tuple[str, ...] = (row.node,)
    if layer_map is not None:
        entries = [layer for layer in layer_map.layers if row.node in layer.onnx_nodes]
        layers = tuple(layer.name for layer in entries)
        types = tuple(layer.layer_type for layer in entries)
        precisions = tuple(layer.precision for layer in entries)
        ops = {n.name: n.op_type for n in layer_map.nodes}
        fused = [
            n
            for layer in entries
            for n in layer.onnx_nodes
            if ops.get(n) not in ("QuantizeLinear", "DequantizeLinear") and not n.endswith(("Linear", "_cast"))
        ]
        nodes = tuple(dict.fromkeys([row.node, *fused]))
    return Divergence(
        threshold_db=float(threshold_db),
        tensor=row.name,
        node=row.node,
        op=row.op,
        index=row.index,
        sqnr_db_accumulated=float(row.sqnr_db_accumulated or 0.0),
        sqnr_db_before=before,
        onnx_nodes=nodes,
        engine_layers=layers,
        engine_layer_types=types,
        engine_layer_precisions=precisions,
    )
