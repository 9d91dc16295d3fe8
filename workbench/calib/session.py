"""A calibration session: statistics once, then ranges, Q/DQ models, diffs, task metrics and fallback on demand.

The CLI, the notebook panel and the benchmark all drive this one object, so a fallback or a method switch reuses the
statistics already gathered (no data is re-read) and only regenerates the Q/DQ model and re-evaluates.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from workbench.calib.data import CalibrationSource, resolve_source
from workbench.calib.diff import LayerDiff, diff_models
from workbench.calib.methods import DEFAULT_PERCENTILE, Method
from workbench.calib.qdq import QdqModel, insert_qdq
from workbench.calib.rounding import WeightRounding, check_weight_rounding
from workbench.calib.stats import CalibrationRanges, CalibrationStatistics, collect_statistics
from workbench.errors import WorkbenchError
from workbench.precision import Precision, PrecisionPlan
from workbench.precision.qdq_rules import QUANTIZABLE_OPS
from workbench.progress import ProgressEvent, ProgressFn, report_or_stop

QUANTIZED_KEPT = 4  # quantized models a session keeps (CalibrationSession.quantize)
QUANTIZED_KEPT_BYTES = 512 << 20  # and their ModelProtos' bytes together at most
ALIGN_BATCHES = 4  # calibration batches whose inputs give the input grids (an 8-bit image shows all its levels)

if TYPE_CHECKING:
    import onnx

    from workbench.calib.rounding import LayerInput, LayerRounding
    from workbench.model import OnnxModel
    from workbench.precision.qdq_rules import QdqPlacement
    from workbench.precision.recipe import QuantizationRecipe
    from workbench.zoo.base import MetricResult, ZooEntry


def ort_predict(proto: onnx.ModelProto) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """``predict(feed)`` for an in-memory model with ORT CPU, optimizations off (simulated Q/DQ, the reference)."""
    from workbench.ort import cpu_predict

    return cpu_predict(proto, what="the rewritten model")


class Float16Model(WorkbenchError):
    """The model computes in float16: there is no FP32 graph to insert Q/DQ into."""


class AlreadyQuantized(WorkbenchError):
    """The model carries its own Q/DQ nodes: calibration starts from the FP32 model they were put into."""


def refuse_quantized(model: OnnxModel) -> None:
    """Ranges measured on a Q/DQ model describe its dequantized values, and a second Q/DQ pair on a quantized
    tensor is refused by TensorRT's placement rules: calibrating it again is not what anyone means."""
    from workbench.model.graph import ORT_QUANTIZED_OPS, QDQ_OPS
    from workbench.precision.qdq_rules import QUANTIZABLE_OPS

    graph = model.proto.graph
    integer_ops = sorted({node.op_type for node in graph.node if node.op_type in ORT_QUANTIZED_OPS})
    if integer_ops:
        raise AlreadyQuantized(
            f"{model.path or 'the model'} is already quantized, in ONNX Runtime's operator format "
            f"({', '.join(integer_ops[:5])}).",
            expected="the FP32 model it was quantized from (calibrate before quantizing, not after)",
            hint="TensorRT has no kernels for ONNX Runtime's integer ops: `workbench calibrate` the FP32 model to get "
            "the Q/DQ model TensorRT builds in INT8",
        )
    pairs = sum(node.op_type in QDQ_OPS for node in graph.node)
    if not pairs:
        return
    dequantized = {node.output[0] for node in graph.node if node.op_type == "DequantizeLinear" and node.output}
    quantized = [n for n in graph.node if n.op_type in QUANTIZABLE_OPS and dequantized.intersection(n.input)]
    raise AlreadyQuantized(
        f"{model.path or 'the model'} is already quantized: {pairs} Q/DQ node(s), {len(quantized)} of its "
        f"{sum(n.op_type in QUANTIZABLE_OPS for n in graph.node)} Conv/Gemm/MatMul node(s) read dequantized inputs.",
        expected="the FP32 model the Q/DQ nodes were put into (calibrate before quantizing, not after)",
        hint="a quantized model builds as it is: its Q/DQ pairs decide which nodes run in 8 bits",
    )


def _refuse_float16(model: OnnxModel) -> None:
    """INT8 and FP8 calibration start from the FP32 model: Q/DQ of float16 tensors (opset < 19) is invalid ONNX, and
    ranges from float16 activations describe the FP16 model, not the one the Q/DQ pairs replace."""
    from onnx import TensorProto

    from workbench.precision.qdq_rules import stored_weight_casts

    graph = model.proto.graph
    casts = stored_weight_casts(graph)  # weights kept in FP16 and computed in FP32: prepare_model folds them
    stored = {node.input[0] for node in casts}
    cast_ids = {id(node) for node in casts}
    read_otherwise = {name for node in graph.node if id(node) not in cast_ids for name in node.input}
    half = [v.name for v in graph.input if v.type.tensor_type.elem_type == TensorProto.FLOAT16]
    half += [
        init.name
        for init in graph.initializer
        if init.data_type == TensorProto.FLOAT16 and (init.name not in stored or init.name in read_otherwise)
    ]
    if half:
        raise Float16Model(
            f"{model.path or 'the model'} computes in float16 (e.g. {', '.join(repr(n) for n in half[:3])}): INT8 "
            "and FP8 calibration insert Q/DQ into an FP32 model.",
            expected="the FP32 model (the FP16 engine is made from it with `workbench build --precision fp16`)",
        )


def relative_output_noise(
    proto: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]], references: Sequence[dict[str, np.ndarray]]
) -> float:
    """The model's float-output error energy against ``references`` (the FP32 outputs on ``feeds``), over theirs."""
    predict = ort_predict(proto)
    signal = noise = 0.0
    for feed, reference in zip(feeds, references, strict=True):
        outputs = predict(feed)
        for name, expected in reference.items():
            if expected.dtype.kind != "f" or name not in outputs:
                continue
            ref = expected.astype(np.float64).ravel()
            err = ref - np.asarray(outputs[name], dtype=np.float64).ravel()
            signal += float(ref @ ref)
            noise += float(err @ err)
    return noise / signal if signal > 0 else 0.0


def quantization_recipe(quantized: QdqModel, ranges_method: str) -> QuantizationRecipe:
    """What turned the FP32 model and its ranges into ``quantized`` (:mod:`workbench.precision.recipe`)."""
    from workbench.precision.recipe import QuantizationRecipe

    alignment = quantized.alignment if quantized.alignment is not None and quantized.alignment.rewritten else None
    # GPTQ ran on every weight it had inputs for, but ships its rounding only where it gained (else nearest)
    kept = sum(1 for layer in quantized.weight_rounding if layer.gptq_db > layer.nearest_db)
    return QuantizationRecipe(
        ranges_method=ranges_method,
        weight_rounding="gptq" if kept else "nearest",
        gptq_weights=kept,
        grid_alignment=alignment is not None,
        aligned_inputs=len(alignment.input_grids) if alignment else 0,
        shifted_tensors=len(alignment.shifted) if alignment else 0,
        border_maps=len(alignment.border_maps) if alignment else 0,
        regridded_weights=len(alignment.requantized_weights) if alignment else 0,
        int8_nodes=len(quantized.placement.int8_nodes),
        fp8_nodes=len(quantized.placement.fp8_nodes),
    )


def _with_own_proto(quantized: QdqModel) -> QdqModel:
    """``quantized`` with a copy of its ModelProto: a caller editing its model leaves the kept one as it was."""
    import onnx

    proto = onnx.ModelProto()
    proto.CopyFrom(quantized.proto)
    return replace(quantized, proto=proto)


def worst_first_fallback(ranked: Sequence[str], n: int) -> list[str]:
    """The first ``n`` of ``ranked`` (fallback candidates, worst first), but never all of them: at least one stays
    INT8, since a "mixed" plan without INT8 would be the FP32 model under another name."""
    return list(ranked[: max(0, min(int(n), len(ranked) - 1))])


class CalibrationSession:
    """Calibrate one FP32 model. ``entry`` (a zoo entry) adds its data and its task metric."""

    def __init__(
        self,
        model: OnnxModel | str | Path,
        *,
        data: Any = None,
        entry: ZooEntry | None = None,
        max_batches: int | None = None,
        progress: bool = True,
        optimized_statistics: bool = False,
        quantize_attention: bool = False,
        weight_rounding: WeightRounding = "nearest",
        align_grids: bool = False,
    ) -> None:
        from workbench.model import OnnxModel, load_onnx

        if isinstance(model, (str, Path)):
            model = load_onnx(model)
        if not isinstance(model, OnnxModel):
            raise WorkbenchError(
                f"a calibration session needs an OnnxModel or a path, not a {type(model).__name__}.",
                expected="workbench.model.load_onnx(path) or a path",
            )
        refuse_quantized(model)
        _refuse_float16(model)
        self.model = model
        self.entry = entry
        if data is None:
            if entry is None:
                raise WorkbenchError(
                    "no calibration data given.",
                    expected="data= a folder, a list of feeds, 'zoo' or 'random'",
                    hint="random data is used only when asked for explicitly (data='random')",
                )
            data = "zoo"
        self.source: CalibrationSource = resolve_source(data, model=model, entry=entry)
        self.max_batches = max_batches
        self.progress = progress
        # where a caller hears what a long step does now (ProgressEvent(task="calibration"): statistics and GPTQ
        # batches, GPTQ's weights, task-metric evaluations); the quickstart's calibrate stage sets it while it runs
        self.events: ProgressFn | None = None
        self.optimized_statistics = optimized_statistics
        # also quantize the attention core (MatMuls of two activations), which TensorRT's rules leave out by default
        self.quantize_attention = quantize_attention
        self.weight_rounding = check_weight_rounding(weight_rounding)
        # put INT8 inputs on their pixel grid and shift non-negative activations (workbench.calib.align)
        self.align_grids = bool(align_grids)
        self._grid_samples: dict[str, np.ndarray] | None = None
        # GPTQ's layer inputs and the roundings made from them, per number of calibration batches (max_batches)
        self._layer_inputs: dict[int | None, dict[str, LayerInput]] = {}
        self._rounding_caches: dict[int | None, dict[tuple[str, str, bytes], tuple[np.ndarray, LayerRounding]]] = {}
        self._statistics: dict[int | None, CalibrationStatistics] = {}
        self._metric_cache: dict[str, MetricResult] = {}
        self._prepared_proto: onnx.ModelProto | None = None
        self._prepared_fp8_proto: onnx.ModelProto | None = None
        self._fp8_ranges: dict[tuple[str, float | None, int], CalibrationRanges] = {}
        self._int8_nodes: dict[str, QdqPlacement] = {}
        self._quantized: OrderedDict[str, QdqModel] = OrderedDict()  # the last quantizations (see quantize)
        self.last_sensitivity: dict[str, float] = {}

    @property
    def prepared(self) -> onnx.ModelProto:
        """The model after :func:`prepare_model` (weights as initializers, opset >= 13, named nodes), made once."""
        if self._prepared_proto is None:
            from workbench.precision.qdq_rules import prepare_model

            self._prepared_proto = prepare_model(self.model.proto)
        return self._prepared_proto

    @property
    def prepared_fp8(self) -> onnx.ModelProto:
        """The prepared model at opset >= 19 (FP8 Q/DQ), same nodes and names as :attr:`prepared`, made once."""
        from workbench.precision.qdq_rules import FP8_MIN_OPSET, model_opset, prepare_model

        if self._prepared_fp8_proto is None:
            prepared = self.prepared
            self._prepared_fp8_proto = (
                prepared if model_opset(prepared) >= FP8_MIN_OPSET else prepare_model(prepared, FP8_MIN_OPSET)
            )
        return self._prepared_fp8_proto

    def fp8_ranges(self, ranges: CalibrationRanges) -> CalibrationRanges:
        """The FP8 ranges matching INT8 ``ranges`` (same method on the FP8 grid; entropy becomes MSE), cached."""
        from workbench.calib.fp8 import fp8_ranges_like

        key = (ranges.method, ranges.percentile, id(ranges.statistics))
        if key not in self._fp8_ranges:
            self._fp8_ranges[key] = fp8_ranges_like(ranges)
        return self._fp8_ranges[key]

    def say(self, message: str, done: int = 0, total: int | None = None, *, step: str = "") -> None:
        """Tell :attr:`events` (if set) what runs now: ``done`` of ``total`` steps when counted; ``step`` names the
        kind of step (statistics, gptq_inputs, gptq_rounding, evaluation), the same for each of its events. When it asks to stop,
        :class:`~workbench.progress.Cancelled` is raised here: the step's cache entry is never written, so nothing
        half-computed is kept."""
        report_or_stop(self.events, ProgressEvent("calibration", message, done, total, name=step))

    # ------------------------------------------------------------------ statistics and ranges
    def statistics(self, max_batches: int | None = -1) -> CalibrationStatistics:  # type: ignore[assignment]
        """Histograms from one streaming pass (cached per number of batches)."""
        limit = self.max_batches if max_batches == -1 else max_batches
        if limit not in self._statistics:
            tensors = None
            if self.quantize_attention:
                from workbench.precision.qdq_rules import activation_tensors

                tensors = list(activation_tensors(self.prepared))
                names = {n.name: n for n in self.prepared.graph.node}
                for node in self.attention_matmuls():
                    tensors.extend(t for t in names[node].input[:2] if t not in tensors)
            self._statistics[limit] = collect_statistics(
                self.model,
                self.source,
                tensors,
                limit=limit,
                progress=self.progress,
                optimized=self.optimized_statistics,
                on_batch=lambda done, total: self.say(
                    "activation statistics, batch by batch", done, total, step="statistics"
                ),
            )
        return self._statistics[limit]

    def use_statistics(self, statistics: CalibrationStatistics, max_batches: int | None = -1) -> None:
        """Adopt statistics loaded from a cache (must be for this model)."""
        if statistics.model_sha256 and statistics.model_sha256 != self.model.sha256:
            raise WorkbenchError(
                "the cached statistics belong to a different model.", expected=f"model sha256 {self.model.sha256[:12]}…"
            )
        self._statistics[self.max_batches if max_batches == -1 else max_batches] = statistics

    def ranges(
        self, method: Method = "mse", *, percentile: float = DEFAULT_PERCENTILE, max_batches: int | None = -1
    ) -> CalibrationRanges:  # type: ignore[assignment]
        return self.statistics(max_batches).ranges(method, percentile=percentile)

    # ------------------------------------------------------------------ Q/DQ model
    def attention_matmuls(self) -> list[str]:
        """MatMul nodes whose two inputs are both activations (the attention core)."""
        constants = {i.name for i in self.prepared.graph.initializer}
        return [
            n.name
            for n in self.prepared.graph.node
            if n.op_type == "MatMul" and len(n.input) >= 2 and not constants.intersection(n.input[:2])
        ]

    def default_plan(self, fmt: str = "int8") -> PrecisionPlan:
        """Everything INT8 (``fmt="fp8"``: FP8 but the stem, kept FP16) that can be (with ``quantize_attention``, the
        attention MatMuls too)."""
        from workbench.calib.fp8 import check_format

        fmt = check_format(fmt)
        overrides: dict[str, Precision] = (
            dict.fromkeys(self.attention_matmuls(), fmt) if self.quantize_attention else {}
        )
        if fmt == "fp8":  # the stem stays FP16 (qdq_rules.fp8_stem_layers says why; at most 5 % of the layers)
            from workbench.precision.qdq_rules import fp8_stem_layers

            overrides.update(dict.fromkeys(fp8_stem_layers(self.prepared, prepared=True), "fp16"))
        return PrecisionPlan(default=fmt, overrides=overrides)

    def quantize(self, ranges: CalibrationRanges | None = None, plan: PrecisionPlan | None = None) -> QdqModel:
        """The Q/DQ model of ``plan``; its FP8 nodes read ranges of the same method on the FP8 grid.

        The last :data:`QUANTIZED_KEPT` models (:data:`QUANTIZED_KEPT_BYTES` together at most) are kept by everything
        they are made from (ranges, plan, weight rounding, grid alignment, calibration batches): the choices and the
        search quantize the same plan several times (EfficientNet-Lite0: ~0.5 s each). Each call returns its own copy
        of the ModelProto."""
        import json

        ranges = ranges or self.ranges()
        plan = plan or self.default_plan()
        wants_fp8 = plan.default == "fp8" or "fp8" in plan.overrides.values()
        key = json.dumps(
            [
                sorted(ranges.amax.items()),
                sorted(self.fp8_ranges(ranges).amax.items()) if wants_fp8 else None,  # from the histograms too
                ranges.method,
                ranges.percentile,
                plan.to_json(),
                self.weight_rounding,
                self.align_grids,
                self.max_batches,
                self.quantize_attention,
            ],
            sort_keys=True,
        )
        if key in self._quantized:
            self._quantized.move_to_end(key)
            return _with_own_proto(self._quantized[key])
        quantized = self._quantize(ranges, plan)
        self._quantized[key] = quantized
        sizes = {name: kept.proto.ByteSize() for name, kept in self._quantized.items()}
        # a few models, within a memory budget: a large model is quantized again rather than held several times
        while self._quantized and (
            len(self._quantized) > QUANTIZED_KEPT or sum(sizes[name] for name in self._quantized) > QUANTIZED_KEPT_BYTES
        ):
            self._quantized.popitem(last=False)
        return quantized if key not in self._quantized else _with_own_proto(quantized)

    def _quantize(self, ranges: CalibrationRanges, plan: PrecisionPlan) -> QdqModel:
        wants_fp8 = plan.default == "fp8" or "fp8" in plan.overrides.values()
        quantized = insert_qdq(
            self.prepared_fp8 if wants_fp8 else self.prepared,
            ranges.amax,
            plan,
            prepared=True,
            quantize_attention=self.quantize_attention,
            fp8_amax=self.fp8_ranges(ranges).amax if wants_fp8 else None,
            weight_inputs=self.layer_inputs() if self.weight_rounding == "gptq" else None,
            rounding_cache=self._rounding_caches.setdefault(self.max_batches, {}),
            progress=self.events,
        )
        if self.align_grids:
            quantized = self._aligned(quantized)
        if self.entry is not None:  # the profile it was calibrated for travels with it: `build` needs no --shapes
            from workbench.model.profile import write_profile_metadata

            write_profile_metadata(quantized.proto, self.entry.input_profiles(), f"calibrated with {self.entry.name}")
        if self.weight_rounding == "gptq" and not quantized.weight_rounding and quantized.placement.weights:
            quantized = replace(
                quantized,
                notes=(
                    *quantized.notes,
                    "GPTQ weight rounding was asked for but no layer could take it (it needs at least two "
                    "calibration batches, one to fit and one to check on): weights rounded to nearest",
                ),
            )
        from workbench.precision.recipe import write_recipe

        # what was done with the ranges travels with the model: `build` and `export` report it
        method = self.fp8_ranges(ranges).method if quantized.placement.uses_fp8 else ranges.method  # as calibrate says
        write_recipe(quantized.proto, quantization_recipe(quantized, method))
        return quantized

    def _aligned(self, quantized: QdqModel) -> QdqModel:
        """``quantized`` with grid alignment (:func:`workbench.calib.align.align_qdq`) on the calibration inputs."""
        from workbench.calib.align import align_qdq

        if self._grid_samples is None:  # the first batches' inputs: the grids, and one sample for the shapes
            batches = list(self.source.batches(ALIGN_BATCHES))
            self._grid_samples = (
                {name: np.concatenate([np.asarray(batch[name]) for batch in batches]) for name in batches[0]}
                if batches
                else {}
            )
        proto, alignment = align_qdq(quantized.proto, self._grid_samples)
        if not alignment.rewritten:
            reasons = "; ".join(f"{tensor}: {why}" for tensor, why in list(alignment.skipped.items())[:3])
            note = "grid alignment: no tensor qualified" + (f" ({reasons})" if reasons else "")
            return replace(quantized, alignment=alignment, notes=(*quantized.notes, note))
        scales = dict(quantized.scales)
        for tensor in alignment.shifted:
            scales[tensor] = scales.get(tensor, 0.0) / 2.0
        for tensor in alignment.input_grids:
            scales[tensor] = 1.0
        note = (
            f"grid alignment: {len(alignment.input_grids)} input(s) on their pixel grid (scale 1), "
            f"{len(alignment.shifted)} non-negative activation(s) shifted by half their range (half the INT8 step), "
            f"{len(alignment.border_maps)} Conv border map(s)"
        )
        return replace(quantized, proto=proto, scales=scales, alignment=alignment, notes=(*quantized.notes, note))

    def layer_inputs(self) -> dict[str, LayerInput]:
        """The input Hessian of every weighted layer on the first ``max_batches`` calibration batches (GPTQ
        rounding), one ORT pass, cached per number of batches."""
        if self.max_batches not in self._layer_inputs:
            from tqdm.auto import tqdm

            from workbench.calib.rounding import layer_inputs

            weights = {q.tensor for q in self.placement(PrecisionPlan(default="int8")).weights.values()}
            total = len(self.source) or None
            batches = tqdm(
                self.source.batches(self.max_batches),
                total=total if self.max_batches is None or total is None else min(total, self.max_batches),
                desc="GPTQ layer inputs",
                unit="batch",
                disable=not self.progress,
                leave=False,
            )

            def counted() -> Iterator[Any]:
                for done, batch in enumerate(batches):
                    self.say("GPTQ layer inputs, batch by batch", done, batches.total, step="gptq_inputs")
                    yield batch

            self._layer_inputs[self.max_batches] = layer_inputs(
                self.prepared, counted(), weights, what="the FP32 model for GPTQ"
            )
        return self._layer_inputs[self.max_batches]

    def placement(self, plan: PrecisionPlan | None = None) -> QdqPlacement:
        """The Q/DQ placement a plan gives on this model (cached per plan)."""
        import json

        import onnx_graphsurgeon as gs

        from workbench.precision.qdq_rules import plan_placement

        plan = plan or self.default_plan()
        key = json.dumps(plan.to_json(), sort_keys=True)
        if key not in self._int8_nodes:
            graph = gs.import_onnx(self.prepared)
            graph.toposort()
            self._int8_nodes[key] = plan_placement(graph, plan, quantize_attention=self.quantize_attention)
        return self._int8_nodes[key]

    def int8_nodes(self, plan: PrecisionPlan | None = None) -> list[str]:
        """Quantizable nodes that the plan (default: everything INT8) would quantize to INT8, in topological order."""
        return list(self.placement(plan).int8_nodes)

    def quantized_nodes(self, plan: PrecisionPlan | None = None) -> list[str]:
        """Quantizable nodes that the plan would quantize to INT8 or FP8, in topological order."""
        return list(self.placement(plan).quantized_nodes)

    def quantizable_nodes(self) -> list[tuple[str, str]]:
        """(node name, op) of every Conv/ConvTranspose/Gemm/MatMul, for per-layer precision widgets."""
        return [(n.name, n.op_type) for n in self.prepared.graph.node if n.op_type in QUANTIZABLE_OPS]

    # ------------------------------------------------------------------ diff and metric
    def diff(
        self,
        quantized: QdqModel | onnx.ModelProto,
        data: Any = None,
        *,
        max_batches: int | None = 4,
        with_metric: bool = False,
        metric_limit: int | None = None,
    ) -> LayerDiff:
        """Per-layer diff on ``data`` (default: the calibration source's first ``max_batches`` batches); with
        ``with_metric``, the task metric on the first ``metric_limit`` evaluation samples (all when None)."""
        source = self.source if data is None else resolve_source(data, model=self.model, entry=self.entry)
        result = diff_models(
            self.prepared,
            quantized.proto if isinstance(quantized, QdqModel) else quantized,
            source,
            limit=max_batches,
            progress=self.progress,
            prepared=True,
        )
        if with_metric and self.entry is not None:
            result = replace(result, task_metric=self.evaluate(quantized, limit=metric_limit).to_json())
        return result

    def evaluate(self, model: QdqModel | onnx.ModelProto | None = None, *, limit: int | None = None) -> MetricResult:
        """The zoo task metric (a ``MetricResult``) of the FP32 model (``None``) or a rewritten one."""
        entry = self._metric_entry()
        proto = cast("onnx.ModelProto", self.model.proto if model is None else getattr(model, "proto", model))
        serialized = proto.SerializeToString(deterministic=True)
        key = f"{hash(serialized)}:{limit}"
        if key not in self._metric_cache:
            what = f"task metric of the {'FP32' if model is None else 'quantized'} model"
            if model is None:  # the FP32 model's metric is the same every time: kept in the zoo cache folder
                import hashlib

                self._metric_cache[key] = entry.stored_metric(
                    hashlib.sha256(serialized).hexdigest(),
                    limit,
                    lambda: entry.evaluate(self._watched(ort_predict(proto), what, limit), limit=limit),
                )
            else:
                self._metric_cache[key] = entry.evaluate(self._watched(ort_predict(proto), what, limit), limit=limit)
        return self._metric_cache[key]

    def scored_already(self, model: onnx.ModelProto, *, limit: int | None = None) -> MetricResult | None:
        """The metric :meth:`evaluate` or :meth:`evaluate_kept` already has for these exact bytes on the first
        ``limit`` samples (None when it has none): the same model, samples and ONNX Runtime settings give the same
        result, so a later stage need not run them again."""
        return self._metric_cache.get(f"{hash(model.SerializeToString(deterministic=True))}:{limit}")

    def evaluate_kept(
        self, model: QdqModel | onnx.ModelProto, *, limit: int | None = None, earlier: Any = None
    ) -> tuple[MetricResult, Any]:
        """:meth:`evaluate` of a rewritten model, and the predictions it scored (``ZooEntry.evaluate_kept``): passed
        back as ``earlier``, a later call on more samples runs only the new ones. The result is kept as
        :meth:`evaluate` keeps it, so asking for the same metric again costs nothing."""
        proto = cast("onnx.ModelProto", getattr(model, "proto", model))
        predict = self._watched(ort_predict(proto), "task metric of the quantized model", limit, resumed=bool(earlier))
        result, kept = self._metric_entry().evaluate_kept(predict, limit, earlier=earlier)
        self._metric_cache[f"{hash(proto.SerializeToString(deterministic=True))}:{limit}"] = result
        return result, kept

    def _samples(self, limit: int | None) -> int | None:
        """How many evaluation samples an evaluation on the first ``limit`` (None: all) scores (None: not known)."""
        available = self.entry.split_size("evaluation") if self.entry is not None else None
        return available if limit is None else (limit if available is None else min(limit, available))

    def _watched(
        self,
        predict: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
        what: str,
        limit: int | None,
        *,
        resumed: bool = False,
    ) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        """``predict`` that tells :attr:`events` the samples done before each batch (an evaluation of a ViT-B/16
        takes two minutes: a stop asked for during it is taken at the next batch). ``resumed``: earlier predictions
        cover the first samples, so only the samples run in this call are counted, of an unknown total."""
        if self.events is None:
            return predict
        total = None if resumed else self._samples(limit)
        message = f"{what} on {total} evaluation samples" if total else what
        done = 0

        def counted(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            nonlocal done
            self.say(message, done, total, step="evaluation")
            outputs = predict(feed)
            first = next(iter(feed.values()), None)
            done += int(first.shape[0]) if first is not None and np.ndim(first) else 1
            return outputs

        return counted

    def _metric_entry(self) -> ZooEntry:
        """The entry whose task metric :meth:`evaluate` scores; refused when the session has none."""
        if self.entry is None:
            raise WorkbenchError(
                "no task metric: the session was not made from a zoo model.",
                expected="CalibrationSession(..., entry=get_entry(name))",
            )
        return self.entry

    # ------------------------------------------------------------------ fallback
    def rank_int8_nodes(self, diff: LayerDiff, plan: PrecisionPlan | None = None) -> list[str]:
        """Fallback candidates, worst first (by :meth:`score_int8_nodes`)."""
        scores = self.score_int8_nodes(diff, plan)
        return sorted(scores, key=lambda n: -scores[n])

    def score_int8_nodes(self, diff: LayerDiff, plan: PrecisionPlan | None = None) -> dict[str, float]:
        """Damage score of every fallback candidate: INT8 nodes and residual Adds whose skip input is quantized.

        A node's score is the relative noise power its own quantization causes: the local noise (10^(-SQNR/10)) of
        each quantized input it reads (activations and weights), plus the noise added at its output over its
        inputs (capped at 0 dB). Local terms keep the ranking meaningful when accumulated SQNR is ruined upstream.
        """
        placement = self.placement(plan)
        quantized = placement.quantized_nodes
        candidates = quantized + [n for n in placement.residual_skips if n not in quantized]
        outputs = {n.name: list(n.output) for n in self.prepared.graph.node}
        by_tensor = {row.name: row for row in diff.tensors}
        reads: dict[str, list[str]] = {}
        for tensor, consumers in placement.activations.items():
            for consumer in consumers:
                reads.setdefault(consumer, []).append(tensor)
        for weight in placement.weights.values():
            for consumer in weight.consumers:
                reads.setdefault(consumer, []).append(weight.tensor)
        # a Conv behind a zero Pad reads the Pad's quantized input (the Q/DQ was moved before the Pad)
        inputs_of = {n.name: list(n.input) for n in self.prepared.graph.node}
        for node in candidates:
            for name in inputs_of.get(node, []):
                if name in placement.moved_before_pad:
                    reads.setdefault(node, []).append(placement.moved_before_pad[name])
        scores = {}
        for node in candidates:
            local = sum(
                10.0 ** (-(by_tensor[t].sqnr_db_local or 0.0) / 10.0)
                for t in reads.get(node, [])
                if t in by_tensor and by_tensor[t].sqnr_db_local is not None
            )
            added = [
                by_tensor[t].noise_added or 0.0
                for t in outputs.get(node, [])
                if t in by_tensor and by_tensor[t].noise_added is not None
            ]
            # added noise is capped at 1 (0 dB): past that the signal is gone upstream and the term only says so
            scores[node] = local + min(1.0, max(0.0, max(added, default=0.0)))
        return scores

    def rank_by_sensitivity(
        self, quantized: QdqModel, *, max_batches: int = 1, plan: PrecisionPlan | None = None
    ) -> list[str]:
        """Fallback candidates ranked leave-one-out: the model-output noise removed by putting each one alone back in FP32.

        For every candidate (INT8 node, or residual Add with a quantized skip), a copy of the Q/DQ model has that
        node read its inputs straight from the FP32 tensors (its Q/DQ bypassed); the model outputs on a few batches
        are compared with FP32. Costs one ORT session per candidate, no re-calibration; it sees interactions the
        per-layer diff cannot (e.g. a layer whose error the network later amplifies).
        """
        import onnx

        placement = quantized.placement
        quantized_nodes = placement.quantized_nodes
        candidates = quantized_nodes + [n for n in placement.residual_skips if n not in quantized_nodes]
        feeds = list(self.source.batches(max_batches))
        if not feeds:
            raise WorkbenchError("no data for the sensitivity ranking.", expected="a calibration source with batches")
        reference_predict = ort_predict(self.prepared)
        references = [reference_predict(feed) for feed in feeds]

        def output_noise(proto: onnx.ModelProto) -> float:
            return relative_output_noise(proto, feeds, references)

        proto = quantized.proto
        q_source = {n.output[0]: n.input[0] for n in proto.graph.node if n.op_type == "QuantizeLinear"}
        dq_source = {
            n.output[0]: q_source[n.input[0]]
            for n in proto.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in q_source
        }
        pad_of = {
            n.output[0]: n.name
            for n in proto.graph.node
            if n.op_type == "Pad" and n.output and n.output[0] in placement.moved_before_pad
        }
        base = output_noise(proto)
        scores: dict[str, float] = {}
        for candidate in candidates:
            variant = onnx.ModelProto()
            variant.CopyFrom(proto)
            bypass = {candidate}
            for node in variant.graph.node:  # a Conv behind a zero Pad: its Q/DQ sits on the Pad's input
                if node.name == candidate:
                    bypass.update(pad_of[name] for name in node.input if name in pad_of)
            for node in variant.graph.node:
                if node.name in bypass:
                    for index, name in enumerate(node.input):
                        if name in dq_source:
                            node.input[index] = dq_source[name]
            scores[candidate] = base - output_noise(variant)
        self.last_sensitivity = scores
        return sorted(candidates, key=lambda n: -scores[n])

    def fallback_plan(
        self, nodes: Iterable[str], precision: Precision = "fp32", base: PrecisionPlan | None = None
    ) -> PrecisionPlan:
        if precision in ("int8", "fp8"):
            raise WorkbenchError(f"fallback precision cannot be {precision}.", expected="fp16 or fp32")
        base = base or self.default_plan()
        return base.with_overrides({node: precision for node in nodes})

    def worst_int8_nodes(self, diff: LayerDiff, n: int, plan: PrecisionPlan | None = None) -> list[str]:
        """The ``n`` worst nodes the plan still runs in INT8 (by the per-layer diff), at least one left INT8
        (:func:`worst_first_fallback`): what "fall back the worst N" moves out of INT8."""
        plan = plan or self.default_plan()
        ranked = [node for node in self.rank_int8_nodes(diff, plan) if plan.precision_of(node) == "int8"]
        return worst_first_fallback(ranked, n)

    def check_fallback_count(self, n: int, plan: PrecisionPlan | None = None) -> int:
        """``n`` when "fall back the worst N" can take that many of the plan's INT8 nodes (one must stay INT8);
        otherwise a WorkbenchError saying the range."""
        limit = len(self.int8_nodes(plan)) - 1
        if not 1 <= int(n) <= limit:
            raise WorkbenchError(
                f"N={n} is out of range.",
                expected=f"1..{limit} (the INT8 layers of this model but one)"
                if limit >= 1
                else "an INT8 layer to fall back",
            )
        return int(n)

    def fall_back_worst(
        self,
        n: int,
        *,
        ranges: CalibrationRanges | None = None,
        precision: Precision = "fp32",
        diff: LayerDiff | None = None,
        plan: PrecisionPlan | None = None,
    ) -> tuple[PrecisionPlan, QdqModel]:
        """Move the ``n`` worst INT8 nodes (by the per-layer diff, :meth:`worst_int8_nodes`) to ``precision`` and
        regenerate the Q/DQ model."""
        ranges = ranges or self.ranges()
        if diff is None:
            diff = self.diff(self.quantize(ranges, plan))
        new_plan = self.fallback_plan(self.worst_int8_nodes(diff, n, plan), precision, plan)
        return new_plan, self.quantize(ranges, new_plan)

    def output_tensors(self, nodes: Iterable[str]) -> list[str]:
        """The output tensors of ``nodes`` (what the SQNR chart marks for a node)."""
        outputs = {n.name: list(n.output) for n in self.prepared.graph.node}
        return [tensor for node in nodes for tensor in outputs.get(node, [])]

    def input_tensors(self, node: str) -> list[str]:
        """The input tensors of ``node``."""
        return next((list(n.input) for n in self.prepared.graph.node if n.name == node), [])
