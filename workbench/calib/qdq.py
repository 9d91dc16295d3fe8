"""The onnx-graphsurgeon rewrite that puts Q/DQ pairs where :mod:`workbench.precision.qdq_rules` says, with
calibrated scales (activations per tensor, weights per channel), in INT8 or FP8 (E4M3FN) as the plan asks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.artifact import NOT_SERIALIZED, Artifact
from workbench.calib.align import GridAlignment
from workbench.calib.fp8 import FP8_MIN_IR_VERSION, QuantFormat, fp8_weight_scales, scale_for
from workbench.calib.methods import per_channel_amax
from workbench.calib.rounding import InputNoise, LayerInput, LayerRounding, gptq_round
from workbench.errors import WorkbenchError
from workbench.model import QDQ_OPS, load_onnx
from workbench.precision.autocast import apply_precision_plan
from workbench.precision.plan import PrecisionPlan
from workbench.precision.qdq_rules import (
    FP8_MIN_OPSET,
    QdqPlacement,
    model_opset,
    plan_placement,
    prepare_model,
    shared_amax,
)
from workbench.progress import ProgressEvent, ProgressFn, report_or_stop

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs


def _zero_point(name: str, shape: tuple[int, ...], fmt: QuantFormat) -> gs.Constant:
    """The zero point constant: its element type is what makes a QuantizeLinear INT8 or FP8."""
    import onnx_graphsurgeon as gs
    from onnx import TensorProto, helper
    from onnx_graphsurgeon.ir.tensor import LazyValues

    if fmt == "fp8":  # numpy has no float8 dtype graphsurgeon can export: hand it the ONNX tensor itself
        from workbench.model.graph import quiet_graphsurgeon

        size = int(np.prod(shape)) if shape else 1
        tensor = helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, list(shape), [0.0] * size)
        with quiet_graphsurgeon():
            return gs.Constant(name, LazyValues(tensor))
    return gs.Constant(name, np.zeros(shape, dtype=np.int8))


def _qdq_pair(
    graph: gs.Graph, source: gs.Tensor, scale: np.ndarray, axis: int | None, base: str, fmt: QuantFormat = "int8"
) -> gs.Variable:
    import onnx_graphsurgeon as gs
    from onnx import TensorProto

    scale_const = gs.Constant(f"{base}_scale", np.asarray(scale, dtype=np.float32))
    zero_const = _zero_point(f"{base}_zero_point", tuple(np.shape(scale)), fmt)
    attrs = {"axis": int(axis)} if axis is not None else {}
    quantized_type = TensorProto.FLOAT8E4M3FN if fmt == "fp8" else np.int8
    quantized = gs.Variable(f"{base}_QuantizeLinear_Output", dtype=quantized_type, shape=source.shape)
    dequantized = gs.Variable(f"{base}_DequantizeLinear_Output", dtype=np.float32, shape=source.shape)
    graph.nodes.append(
        gs.Node("QuantizeLinear", f"{base}_QuantizeLinear", attrs, [source, scale_const, zero_const], [quantized])
    )
    graph.nodes.append(
        gs.Node(
            "DequantizeLinear", f"{base}_DequantizeLinear", attrs, [quantized, scale_const, zero_const], [dequantized]
        )
    )
    return dequantized


@dataclass(frozen=True)
class QdqModel(Artifact):
    """A Q/DQ model and how it was made (the JSON holds how; the model itself is saved with :meth:`save`)."""

    placement: QdqPlacement
    plan: PrecisionPlan
    scales: dict[str, float]  # activation tensor -> scale (a tensor read in FP8 too: "NAME|fp8" -> its FP8 scale)
    fp16_nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    weight_rounding: tuple[LayerRounding, ...] = ()  # one entry per weight rounded by GPTQ (none: nearest)
    alignment: GridAlignment | None = None  # what grid alignment rewrote (workbench.calib.align), when asked for
    proto: Any = field(default=None, repr=False, compare=False, metadata=NOT_SERIALIZED)  # the onnx.ModelProto

    def save(self, path: Any) -> Any:
        import onnx

        from workbench._io import atomic_path

        with atomic_path(path) as tmp:
            onnx.save(self.proto, str(tmp))
        return path

    def counts(self) -> dict[str, int]:
        ops: dict[str, int] = {}
        for node in self.proto.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        return ops


def insert_qdq(
    proto: onnx.ModelProto,
    amax: Mapping[str, float],
    plan: PrecisionPlan | None = None,
    *,
    quantize_attention: bool = False,
    prepared: bool = False,
    fp8_amax: Mapping[str, float] | None = None,
    fp8_weight_method: str = "mse",
    weight_inputs: Mapping[str, LayerInput] | None = None,
    rounding_cache: dict[tuple[str, str, bytes], tuple[np.ndarray, LayerRounding]] | None = None,
    progress: ProgressFn | None = None,
) -> QdqModel:
    """Return a new model with Q/DQ pairs per the TensorRT rules; ``amax`` maps activation tensors to ranges.

    Weights get per-channel scales from their own values (float W -> Q -> DQ, quantized by TensorRT at build).
    FP16 entries of the plan are realised afterwards with :func:`workbench.precision.autocast.apply_precision_plan`.
    ``prepared=True`` says ``proto`` already went through :func:`prepare_model` (it is not modified either way).
    ``fp8_amax``: the ranges of tensors read by the plan's FP8 nodes (FP8's own MSE differs from INT8's); ``amax``
    where absent. A plan with FP8 nodes gives a model at opset >= 19 (the model is upgraded when it is older).
    ``fp8_weight_method``: FP8 weight scales per channel, ``mse`` (the least E4M3 rounding error, the default) or
    ``max`` (amax / 448).
    ``weight_inputs``: the input Hessians of the weights' layers (:func:`workbench.calib.rounding.layer_inputs` on
    the same prepared model); those weights are rounded by GPTQ instead of to nearest, on the same scales.
    ``rounding_cache`` keeps those roundings across calls (a search quantizes many plans of one model).
    ``progress`` hears each weight GPTQ rounds (ProgressEvent(task="calibration"); seconds each on a large layer);
    when it asks to stop, :class:`~workbench.progress.Cancelled` is raised and no model is returned.
    """
    import onnx_graphsurgeon as gs

    plan = plan or PrecisionPlan(default="int8")
    base = proto if prepared else prepare_model(proto)
    wants_fp8 = plan.default == "fp8" or "fp8" in plan.overrides.values()
    if wants_fp8 and model_opset(base) < FP8_MIN_OPSET:
        base = prepare_model(base, FP8_MIN_OPSET)
    if any(n.op_type in QDQ_OPS for n in base.graph.node):
        raise WorkbenchError(
            "the model already has Q/DQ nodes.", expected="an FP32 model (calibrate before quantizing, not after)"
        )
    unknown = sorted(set(plan.overrides) - {node.name for node in base.graph.node})
    if unknown:  # checked here, on the model given, so the message does not name a temporary file
        raise WorkbenchError(
            f"the precision plan names {len(unknown)} node(s) the model does not have, e.g. {unknown[:3]}.",
            expected="override keys that are ONNX node names of this model",
        )
    graph = gs.import_onnx(base)
    graph.toposort()
    placement = plan_placement(graph, plan, quantize_attention=quantize_attention)
    missing = [name for name in placement.activations if name not in amax]
    if missing:
        raise WorkbenchError(
            f"no calibrated range for {len(missing)} tensor(s) that need a scale, e.g. {missing[:3]}.",
            expected="ranges from the same model (re-run calibration or use its cache)",
        )
    unified: dict[str, dict[str, float]] = {"int8": shared_amax(placement, amax)}
    if placement.uses_fp8:
        unified["fp8"] = shared_amax(placement, {**amax, **(fp8_amax or {})})
    tensors = graph.tensors()
    nodes_by_name = {n.name: n for n in graph.nodes}
    scales: dict[str, float] = {}
    roundings: list[LayerRounding] = []
    for name, consumers in placement.activations.items():
        by_format: dict[str, list[str]] = {}
        for consumer in dict.fromkeys(consumers):
            by_format.setdefault(placement.format_of(consumer), []).append(consumer)
        for fmt, readers in by_format.items():
            # one pair per format; the tensor's name alone for its first (usually only) format
            key = name if fmt == next(iter(by_format)) else f"{name}|{fmt}"
            base_name = key.replace("|", "_")
            scale = scale_for(unified[fmt][name], fmt)  # type: ignore[arg-type]  # formats come from the plan check
            scales[key] = float(scale)
            dq = _qdq_pair(graph, tensors[name], scale, None, base_name, fmt)  # type: ignore[arg-type]
            for consumer in readers:
                node = nodes_by_name[consumer]
                node.inputs = [dq if (t is not None and t.name == name) else t for t in node.inputs]
    gptq_weights = [k for k, q in placement.weights.items() if "|axis" not in k and q.tensor in (weight_inputs or {})]
    for key, quant in placement.weights.items():
        weight = tensors[quant.tensor]
        fmt = quant.format
        if fmt == "fp8":
            scale = fp8_weight_scales(weight.values, quant.axis, method=fp8_weight_method)
        else:
            scale = scale_for(per_channel_amax(weight.values, quant.axis), "int8")
        source: gs.Tensor = weight
        # GPTQ's layer inputs describe a weight read as the right operand; the same tensor read as a left one is not
        layer = None if "|axis" in key else (weight_inputs or {}).get(quant.tensor)
        if layer is not None:
            done = len(roundings)
            say = ProgressEvent(
                "calibration", f"GPTQ rounding of {quant.tensor}", done, len(gptq_weights), name="gptq_rounding"
            )
            report_or_stop(progress, say)
            noise = _input_noise(nodes_by_name[quant.consumers[0]])
            rounded, report = _gptq_cached(weight.values, scale, quant.axis, fmt, layer, noise, rounding_cache)
            source = gs.Constant(f"{key.replace('|', '_')}_gptq", rounded)
            roundings.append(report)
        dq = _qdq_pair(graph, source, scale, quant.axis, key.replace("|", "_"), fmt)  # type: ignore[arg-type]
        for consumer in set(quant.consumers):
            node = nodes_by_name[consumer]
            node.inputs = [dq if (t is not None and t.name == quant.tensor) else t for t in node.inputs]
    graph.cleanup().toposort()
    import onnx_graphsurgeon

    out = onnx_graphsurgeon.export_onnx(graph)
    out.ir_version = max(base.ir_version, FP8_MIN_IR_VERSION) if placement.uses_fp8 else base.ir_version
    del out.opset_import[:]
    out.opset_import.extend(base.opset_import)
    result = QdqModel(placement, plan, scales, proto=out, weight_rounding=tuple(roundings))
    if roundings:
        gains = [r.gptq_db - r.nearest_db for r in roundings if r.gptq_db > r.nearest_db]
        note = (
            f"GPTQ weight rounding kept on {len(gains)} of {len(roundings)} weight(s) (layer output SQNR on held-out "
            f"calibration batches +{float(np.median(gains)):.1f} dB median, +{min(gains):.1f} to +{max(gains):.1f}); "
            "the others stay rounded to nearest (GPTQ did not gain there)"
            if gains
            else f"GPTQ weight rounding gained nothing on held-out calibration batches: all {len(roundings)} "
            "weight(s) rounded to nearest"
        )
        result = replace(result, notes=(note,))
    fp16 = [name for name, p in plan.overrides.items() if p == "fp16"] + ([] if plan.default != "fp16" else ["*"])
    if fp16:
        result = _apply_fp16(result)
    return result


def _input_noise(node: gs.Node) -> InputNoise | None:
    """The (format, scale) of the Q/DQ pair on ``node``'s data input, None when that input stays float."""
    data = node.inputs[0] if node.inputs else None
    if data is not None and data.inputs and data.inputs[0].op == "Pad":  # Q/DQ moved before a Pad (qdq_rules)
        data = data.inputs[0].inputs[0]
    if data is None or not data.inputs or data.inputs[0].op != "DequantizeLinear":
        return None
    quantize = data.inputs[0].inputs[0].inputs[0] if data.inputs[0].inputs[0].inputs else None
    if quantize is None or quantize.op != "QuantizeLinear":
        return None
    zero_point = quantize.inputs[2] if len(quantize.inputs) > 2 else None
    fmt = "int8" if zero_point is None or getattr(zero_point, "dtype", None) == np.int8 else "fp8"
    scale_values = np.asarray(quantize.inputs[1].values, dtype=np.float64)
    return (fmt, float(scale_values.reshape(-1)[0])) if scale_values.size == 1 else None


def _gptq_cached(
    values: np.ndarray,
    scale: np.ndarray,
    axis: int,
    fmt: str,
    layer: LayerInput,
    noise: InputNoise | None,
    cache: dict[tuple[str, str, bytes], tuple[np.ndarray, LayerRounding]] | None,
) -> tuple[np.ndarray, LayerRounding]:
    key = (layer.weight, fmt, np.asarray(scale, dtype=np.float32).tobytes() + repr(noise).encode())
    if cache is not None and key in cache:
        return cache[key]
    found = gptq_round(values, scale, axis, fmt, layer, noise)  # type: ignore[arg-type]  # formats: the plan check
    if cache is not None:
        cache[key] = found
    return found


def _apply_fp16(result: QdqModel) -> QdqModel:
    """Cast the plan's FP16 nodes with the fusion engineer's AutoCast pass (one cast inserter in the project)."""
    import tempfile
    from pathlib import Path

    import onnx

    # apply_precision_plan refuses 'int8' entries, which Q/DQ already realised: hand it only the FP16 part.
    fp16_plan = PrecisionPlan(
        default="fp16" if result.plan.default == "fp16" else "fp32",
        overrides={k: v for k, v in result.plan.overrides.items() if v == "fp16"},
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "qdq.onnx"
        onnx.save(result.proto, str(path))
        casted = apply_precision_plan(load_onnx(path, check=False), fp16_plan)
    notes = result.notes
    if casted.kept_fp32:
        notes += (
            f"{len(casted.kept_fp32)} node(s) planned FP16 stayed FP32 (AutoCast rules): "
            + ", ".join(f"{k} ({v})" for k, v in list(casted.kept_fp32.items())[:5]),
        )
    return replace(result, proto=casted.proto, fp16_nodes=tuple(casted.fp16_nodes), notes=notes)


def bypass_qdq_pairs(proto: onnx.ModelProto, keep: Callable[[str, bool], bool]) -> onnx.ModelProto:
    """A copy of a Q/DQ model where only the pairs ``keep(tensor, is_weight)`` accepts are left; the others are
    bypassed, so that part computes in float (where a model's quantization loss comes from)."""
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    bypass: dict[str, str] = {}
    dropped = []
    for node in graph.node:
        quantize = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if quantize is None or quantize.op_type != "QuantizeLinear":
            continue
        if not keep(quantize.input[0], quantize.input[0] in initializers):
            bypass[node.output[0]] = quantize.input[0]
            dropped += [node, quantize]
    for node in graph.node:
        for index, name in enumerate(node.input):
            node.input[index] = bypass.get(name, name)
    for node in dropped:
        graph.node.remove(node)
    return model
