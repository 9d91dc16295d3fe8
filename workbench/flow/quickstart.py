"""The quickstart journey as plain functions over the other modules, one stage at a time.

clean -> build FP32 -> fusion view -> calibrate -> per-layer diff -> fall back worst layers -> build mixed engine
-> task metrics -> choose precision -> time the pipeline -> export.

Each stage returns a :class:`StageResult` (status, seconds, a one-line summary, JSON data) and keeps its real objects
(CleanResult, EngineArtifact, LayerDiff, TimingResult...) in :attr:`QuickstartRun.objects` for figures and reports.
A stage whose module is missing from this build says so ("unavailable") instead of pretending; a stage whose input
failed is "skipped". :class:`QuickstartSession` re-runs only the stages a changed setting affects, which is what the
notebook panel's widgets call.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.zoo import DEFAULT_MODEL

DEFAULT_QUICKSTART_MODEL = DEFAULT_MODEL  # one default for the main job and the zoo (reasons in workbench.zoo)
PRECISION_CHOICES = ("fp32", "fp16", "int8")  # int8 = the calibrated engine with its worst layers back in FP32
CALIBRATION_METHODS = ("entropy", "percentile", "mse", "max")
STATUSES = ("done", "unavailable", "skipped", "failed")
CALIBRATION_BATCH = 8

# (stage name, title, config fields the stage reads directly); order is execution order.
STAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("clean", "Clean the ONNX graph", ("model",)),
    ("build_fp32", "Build the FP32 engine", ()),
    ("fusion", "Fusion view", ()),
    ("calibrate", "Calibrate INT8 ranges", ("calibration_method", "calibration_samples")),
    ("layer_diff", "Per-layer INT8 diff", ("diff_samples",)),
    ("fallback", "Fall back the worst layers to FP32", ("fallback_layers",)),
    ("build_mixed", "Build the mixed-precision engine", ()),
    ("metrics", "Task metric per precision", ("evaluation_samples",)),
    ("select", "Choose the engine", ("precision",)),
    ("timing", "Time the pipeline", ("streams", "batch", "timing_window_s", "sweep")),
    ("export", "Export the chosen engine", ()),
)
STAGE_NAMES = tuple(name for name, _, _ in STAGES)
STAGE_TITLES = {name: title for name, title, _ in STAGES}

ProgressFn = Callable[[str, int, int, str], object]  # (stage, index, total, message) before each stage
ResultFn = Callable[["StageResult", int, int], None]  # (result, index, total) after each stage


class StageUnavailable(Exception):
    """A stage's implementation is not part of this build (the module or function it needs is missing)."""


@dataclass
class QuickstartConfig:
    """Every setting the panel's widgets control, with built-in defaults that run in well under a minute on CPU."""

    model: str = DEFAULT_QUICKSTART_MODEL
    precision: str = "int8"
    calibration_method: str = "entropy"
    streams: int = 2
    batch: int = 8
    calibration_samples: int = 128  # rounded up to whole batches of CALIBRATION_BATCH
    diff_samples: int = 32
    evaluation_samples: int = 450  # capped by the model's evaluation split (ocr-cls 400, digits-cnn 450)
    fallback_layers: int = 2
    timing_window_s: float = 0.25
    sweep: bool = True  # also time streams=1 and batch=1 so the diagnosis can say whether streams/batching help
    out_dir: str = "out"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.precision not in PRECISION_CHOICES:
            raise WorkbenchError(
                f"precision {self.precision!r} is not offered.", expected=" / ".join(PRECISION_CHOICES)
            )
        if self.calibration_method not in CALIBRATION_METHODS:
            raise WorkbenchError(
                f"calibration method {self.calibration_method!r} is unknown.", expected=" / ".join(CALIBRATION_METHODS)
            )
        if not 1 <= int(self.streams) <= 16:
            raise WorkbenchError(f"streams={self.streams} is out of range.", expected="1..16")
        if not 1 <= int(self.batch) <= 64:
            raise WorkbenchError(f"batch={self.batch} is out of range.", expected="1..64")
        for name in ("calibration_samples", "diff_samples", "evaluation_samples"):
            if int(getattr(self, name)) < 1:
                raise WorkbenchError(f"{name}={getattr(self, name)} must be at least 1.")
        if not 0 <= int(self.fallback_layers) <= 64:
            raise WorkbenchError(f"fallback_layers={self.fallback_layers} is out of range.", expected="0..64")
        if not self.timing_window_s > 0:
            raise WorkbenchError(f"timing_window_s={self.timing_window_s} must be positive.")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StageResult:
    name: str
    title: str
    status: str  # one of STATUSES
    seconds: float = 0.0
    summary: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "done"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "summary": self.summary,
            "data": self.data,
        }


@dataclass
class MetricRow:
    """The task metric of one precision variant, measured with ONNX Runtime CPU (optimizations off)."""

    variant: str  # fp32 / fp16 / int8-all / int8-mixed
    onnx_path: str
    metric: str
    value: float
    n_samples: int
    higher_is_better: bool
    delta_vs_fp32: float = 0.0
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QuickstartRun:
    """The state of one journey: config, one result per stage, and the stages' real objects."""

    config: QuickstartConfig
    stages: dict[str, StageResult] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    def stage(self, name: str) -> StageResult:
        if name not in self.stages:
            return StageResult(name, STAGE_TITLES.get(name, name), "skipped", summary="not run yet")
        return self.stages[name]

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config.to_json(),
            "environment": self.environment,
            "stages": [self.stages[name].to_json() for name in STAGE_NAMES if name in self.stages],
        }


# --- helpers ---------------------------------------------------------------------------------------------------


def _need(module: str, attribute: str | None = None) -> Any:
    """Import ``module`` (and get ``attribute``) or raise StageUnavailable naming exactly what is missing."""
    try:
        loaded = importlib.import_module(module)
    except ImportError as error:
        raise StageUnavailable(
            f"not available in this build: needs {module}" + (f".{attribute}" if attribute else "") + f" ({error})"
        ) from error
    if attribute is None:
        return loaded
    if not hasattr(loaded, attribute):
        raise StageUnavailable(f"not available in this build: {module} has no {attribute}")
    return getattr(loaded, attribute)


def _variant_paths(run: QuickstartRun) -> dict[str, Path]:
    out = Path(run.config.out_dir)
    name = run.config.model
    return {
        "clean": out / f"{name}.clean.onnx",
        "fp32_engine": out / f"{name}.fp32.engine",
        "fp16_engine": out / f"{name}.fp16.engine",
        "fp16_onnx": out / f"{name}.fp16.onnx",
        "int8_all_onnx": out / f"{name}.int8-all.onnx",
        "mixed_onnx": out / f"{name}.int8-mixed.onnx",
        "mixed_engine": out / f"{name}.int8-mixed.engine",
        "calib_cache": out / f"{name}.calib.json",
        "diff": out / f"{name}.layer-diff.json",
        "export": out / "export",
    }


def _batches(samples: int) -> int:
    """Calibration sources count batches; the config counts samples."""
    return max(1, -(-int(samples) // CALIBRATION_BATCH))


def _build_options(run: QuickstartRun, **overrides: Any) -> Any:
    from workbench.engine.build import BuildOptions

    return BuildOptions(shapes=dict(run.objects["entry"].input_profiles()), progress=False, **overrides)


# --- the stages ------------------------------------------------------------------------------------------------


def stage_clean(run: QuickstartRun) -> StageResult:
    from workbench._io import write_bytes_atomic
    from workbench.model import load_onnx

    entry = run.objects["entry"]
    clean_model = _need("workbench.clean", "clean_model")
    CleanOptions = _need("workbench.clean", "CleanOptions")
    profile = {name: list(rng) for name, rng in entry.input_profiles().items()}
    result = clean_model(entry.onnx_path(), CleanOptions(profile=profile))
    path = _variant_paths(run)["clean"]
    write_bytes_atomic(path, result.model.SerializeToString())
    run.objects["clean_result"] = result
    run.objects["clean_model"] = load_onnx(path)
    accepted = [p.name for p in result.passes if p.changed]
    return StageResult(
        "clean",
        "",
        "done",
        summary=(
            f"{result.nodes_before} -> {result.nodes_after} ONNX nodes, {len(accepted)} pass(es) changed the graph, "
            f"{len(result.rolled_back)} rolled back"
        ),
        data={"onnx": str(path), **{k: v for k, v in result.to_json().items() if k != "passes"}},
    )


def _model_for_build(run: QuickstartRun) -> Any:
    """The cleaned model, or the zoo model as shipped when the cleaning stage did not run."""
    return run.objects.get("clean_model") or run.objects["entry"].load()


def stage_build_fp32(run: QuickstartRun) -> StageResult:
    from workbench.engine.build import engine_from_onnx

    artifact = engine_from_onnx(_model_for_build(run), _variant_paths(run)["fp32_engine"], _build_options(run))
    run.objects["fp32_artifact"] = artifact
    summary = artifact.summary()
    return StageResult(
        "build_fp32",
        "",
        "done",
        summary=(
            f"{artifact.onnx_node_count} ONNX nodes -> {summary['layers']} engine layers in {artifact.build_seconds:.1f} s "
            f"({artifact.backend} {artifact.backend_version})"
        ),
        data=artifact.to_json(),
    )


def fusion_rows(artifact: Any) -> list[dict[str, Any]]:
    """One row per engine layer: its type, precision and the ONNX nodes fused into it (from the build's records)."""
    return [
        {
            "layer": layer.name,
            "type": layer.layer_type,
            "precision": layer.precision,
            "onnx_nodes": list(layer.onnx_nodes),
        }
        for layer in artifact.engine_layers.layers
    ]


def stage_fusion(run: QuickstartRun) -> StageResult:
    artifact = run.objects["fp32_artifact"]
    rows = fusion_rows(artifact)
    fused = [row for row in rows if len(row["onnx_nodes"]) > 1]
    absorbed = {node for row in rows for node in row["onnx_nodes"]}
    onnx_names = [node.name for node in _model_for_build(run).proto.graph.node]
    not_in_engine = [name for name in onnx_names if name not in absorbed]
    run.objects["fusion_rows"] = rows
    data: dict[str, Any] = {
        "layers": len(rows),
        "fused_layers": len(fused),
        "onnx_nodes": len(onnx_names),
        "onnx_nodes_without_layer": len(not_in_engine),
        "rows": rows,
    }
    try:
        LayerMap = _need("workbench.engine.layermap", "LayerMap")
        run.objects["fp32_layermap"] = LayerMap.from_engine_layers(
            artifact.engine_layers, onnx_proto=_model_for_build(run).proto, label=artifact.engine_path.stem
        )
    except StageUnavailable as missing:
        data["side_by_side"] = str(missing)
    return StageResult(
        "fusion",
        "",
        "done",
        summary=(
            f"{len(rows)} engine layers; {len(fused)} of them fuse 2+ ONNX nodes; {len(not_in_engine)} of "
            f"{len(onnx_names)} ONNX nodes map to no layer (folded or metadata-less)"
        ),
        data=data,
    )


def _calibration_session(run: QuickstartRun) -> Any:
    """One CalibrationSession per (model, calibration samples): its statistics are reused across range methods."""
    CalibrationSession = _need("workbench.calib.session", "CalibrationSession")
    model = _model_for_build(run)
    key = (model.sha256, run.config.calibration_samples)
    if run.objects.get("calib_session_key") != key:
        run.objects["calib_session"] = CalibrationSession(
            model, entry=run.objects["entry"], max_batches=_batches(run.config.calibration_samples), progress=False
        )
        run.objects["calib_session_key"] = key
    return run.objects["calib_session"]


def stage_calibrate(run: QuickstartRun) -> StageResult:
    cfg = run.config
    session = _calibration_session(run)
    ranges = session.ranges(cfg.calibration_method)
    statistics = session.statistics()
    paths = _variant_paths(run)
    ranges.save(paths["calib_cache"])
    quantized = session.quantize(ranges)
    quantized.save(paths["int8_all_onnx"])
    run.objects["calib_ranges"], run.objects["qdq_all"] = ranges, quantized
    counts = quantized.counts()
    return StageResult(
        "calibrate",
        "",
        "done",
        summary=(
            f"{cfg.calibration_method} ranges for {len(ranges.amax)} tensors from {statistics.num_samples} samples; "
            f"{counts.get('QuantizeLinear', 0)} Q/DQ pairs inserted"
        ),
        data={
            "method": cfg.calibration_method,
            "tensors": len(ranges.amax),
            "samples": statistics.num_samples,
            "statistics_seconds": round(statistics.seconds, 3),
            "cache": str(paths["calib_cache"]),
            "onnx": str(paths["int8_all_onnx"]),
            "warnings": list(ranges.warnings),
        },
    )


def stage_layer_diff(run: QuickstartRun) -> StageResult:
    session = _calibration_session(run)
    diff = session.diff(run.objects["qdq_all"], max_batches=_batches(run.config.diff_samples))
    diff.save(_variant_paths(run)["diff"])
    run.objects["layer_diff"] = diff
    ranked = session.rank_int8_nodes(diff)
    run.objects["int8_ranking"] = ranked
    worst = diff.ranking(1)
    summary = f"{len(diff.tensors)} tensors compared on {diff.num_samples} samples"
    if worst:
        summary += (
            f"; most INT8 noise added at {worst[0].node} (accumulated SQNR {worst[0].sqnr_db_accumulated:.1f} dB, "
            f"{worst[0].drop_db:.1f} dB drop)"
        )
    if ranked:
        summary += f"; INT8 nodes worst first: {', '.join(ranked[:3])}"
    return StageResult(
        "layer_diff",
        "",
        "done",
        summary=summary,
        data=diff.to_json() | {"tensors": len(diff.tensors), "int8_nodes_worst_first": ranked},
    )


def stage_fallback(run: QuickstartRun) -> StageResult:
    session = _calibration_session(run)
    nodes = run.objects["int8_ranking"][: run.config.fallback_layers]
    plan = session.fallback_plan(nodes, "fp32")
    plan.note = f"worst {len(nodes)} INT8 layer(s) of the per-layer diff kept FP32"
    quantized = session.quantize(run.objects["calib_ranges"], plan)
    path = _variant_paths(run)["mixed_onnx"]
    quantized.save(path)
    run.objects["mixed_plan"], run.objects["qdq_mixed"] = plan, quantized
    before = run.objects["qdq_all"].counts().get("QuantizeLinear", 0)
    after = quantized.counts().get("QuantizeLinear", 0)
    return StageResult(
        "fallback",
        "",
        "done",
        summary=(f"{len(nodes)} layer(s) back to FP32: {', '.join(nodes) or 'none'}; Q/DQ pairs {before} -> {after}"),
        data={"plan": plan.to_json(), "onnx": str(path), "qdq_pairs_all_int8": before, "qdq_pairs_mixed": after},
    )


def stage_build_mixed(run: QuickstartRun) -> StageResult:
    from workbench.engine.build import engine_from_onnx
    from workbench.model import load_onnx

    paths = _variant_paths(run)
    artifact = engine_from_onnx(
        load_onnx(paths["mixed_onnx"]), paths["mixed_engine"], _build_options(run, precision="int8")
    )
    run.objects["mixed_artifact"] = artifact
    summary = artifact.summary()
    by_precision = ", ".join(f"{k} {v}" for k, v in sorted(summary["by_precision"].items()))
    return StageResult(
        "build_mixed",
        "",
        "done",
        summary=(f"{summary['layers']} engine layers ({by_precision}) in {artifact.build_seconds:.1f} s"),
        data=artifact.to_json(),
    )


def stage_metrics(run: QuickstartRun) -> StageResult:
    entry = run.objects["entry"]
    paths = _variant_paths(run)
    limit = run.config.evaluation_samples
    variants: list[tuple[str, Path]] = [("fp32", Path(_model_for_build(run).path))]
    notes: dict[str, str] = {}
    try:
        paths["fp16_onnx"].parent.mkdir(parents=True, exist_ok=True)
        _fp16_onnx(run)
        variants.append(("fp16", paths["fp16_onnx"]))
    except WorkbenchError as error:
        notes["fp16"] = str(error)
    if "qdq_all" in run.objects:
        variants.append(("int8-all", paths["int8_all_onnx"]))
    if "qdq_mixed" in run.objects:
        variants.append(("int8-mixed", paths["mixed_onnx"]))
    rows: list[MetricRow] = []
    for variant, path in variants:
        try:
            result = entry.evaluate_onnx(path, limit=limit)
        except WorkbenchError as error:
            notes[variant] = str(error)
            continue
        rows.append(
            MetricRow(variant, str(path), result.name, float(result.value), result.n_samples, result.higher_is_better)
        )
    if rows and rows[0].variant == "fp32":
        for row in rows:
            row.delta_vs_fp32 = row.value - rows[0].value
    for row in rows:
        row.note = notes.get(row.variant, "")
    run.objects["metrics"] = rows
    text = "; ".join(f"{row.variant} {row.value:.4f}" for row in rows)
    return StageResult(
        "metrics",
        "",
        "done",
        summary=f"{rows[0].metric if rows else 'metric'} (ONNX Runtime CPU): {text}",
        data={
            "rows": [row.to_json() for row in rows],
            "not_measured": notes,
            "how": "ONNX Runtime CPU with graph optimizations off: Q/DQ as simulated quantization, "
            "the project's numeric reference; TensorRT engine outputs need a GPU",
        },
    )


def _fp16_onnx(run: QuickstartRun) -> Path:
    """The model with FP16 compute (AutoCast rules), as the FP16 engine is built from it."""
    from workbench.precision import PrecisionPlan
    from workbench.precision.autocast import apply_precision_plan

    path = _variant_paths(run)["fp16_onnx"]
    model = _model_for_build(run)
    if run.objects.get("fp16_source") != model.sha256 or not path.is_file():
        apply_precision_plan(model, PrecisionPlan(default="fp16")).save(path)
        run.objects["fp16_source"] = model.sha256
    return path


def stage_select(run: QuickstartRun) -> StageResult:
    from workbench.engine.build import engine_from_onnx

    paths = _variant_paths(run)
    precision = run.config.precision
    if precision == "fp32":
        artifact, onnx_path = run.objects["fp32_artifact"], Path(_model_for_build(run).path)
    elif precision == "fp16":
        onnx_path = _fp16_onnx(run)
        artifact = run.objects.get("fp16_artifact")
        if artifact is None or artifact.onnx_sha256 != _model_for_build(run).sha256:
            artifact = engine_from_onnx(
                _model_for_build(run), paths["fp16_engine"], _build_options(run, precision="fp16")
            )
            run.objects["fp16_artifact"] = artifact
    else:
        if "mixed_artifact" not in run.objects:
            raise WorkbenchError(
                "the INT8 engine was not built (see the calibration stages above).",
                expected="precision fp32 or fp16 until calibration works",
            )
        artifact, onnx_path = run.objects["mixed_artifact"], paths["mixed_onnx"]
    run.objects["chosen_artifact"], run.objects["chosen_onnx"] = artifact, onnx_path
    wanted = {"fp32": "fp32", "fp16": "fp16", "int8": "int8-mixed"}[precision]
    metric = next((row for row in run.objects.get("metrics", []) if row.variant == wanted), None)
    text = f"{precision} engine {artifact.engine_path} ({artifact.layer_count} layers, {artifact.engine_bytes / 1e6:.2f} MB)"
    if metric is not None:
        text += f"; {metric.metric} {metric.value:.4f} ({metric.delta_vs_fp32:+.4f} vs FP32)"
    return StageResult(
        "select",
        "",
        "done",
        summary=text,
        data={"precision": precision, "engine": str(artifact.engine_path), "onnx": str(onnx_path)},
    )


def timing_plan(config: QuickstartConfig) -> list[tuple[int, int]]:
    """(streams, batch) configurations to time: the chosen one first, then streams=1 and batch=1 for comparison."""
    chosen = (int(config.streams), int(config.batch))
    plan = [chosen]
    if config.sweep:
        for candidate in ((1, chosen[1]), (chosen[0], 1), (1, 1)):
            if candidate not in plan:
                plan.append(candidate)
    return plan


def _executor_for(run: QuickstartRun) -> tuple[Any, str]:
    """A GPU executor for the chosen engine when this machine can run it, else ONNX Runtime CPU, and why."""
    from workbench.engine.backend import detect_gpu, engine_runnable, get_backend

    gpu = detect_gpu()
    onnx_path = run.objects["chosen_onnx"]
    if gpu.present:
        can_run, why = engine_runnable(get_backend(), gpu)
        if can_run:
            try:
                make = _need("workbench.timing.trt_executor", "TrtExecutor")
                return make(run.objects["chosen_artifact"].engine_path), f"TensorRT GPU executor on {gpu.name}"
            except (StageUnavailable, WorkbenchError) as missing:
                why = str(missing)
        reason = f"GPU {gpu.name} present but the engine cannot run on it ({why}); timing the ONNX model on CPU instead"
    else:
        reason = "no NVIDIA GPU here: timing the chosen ONNX variant with ONNX Runtime CPU (not TensorRT numbers)"
    from workbench.timing.executors import OrtCpuExecutor

    # the zoo's optimization-profile shapes pin dims the ONNX leaves symbolic (e.g. OCR's image height and width)
    shapes = {name: tuple(opt) for name, (_low, opt, _high) in run.objects["entry"].input_profiles().items()}
    return OrtCpuExecutor(onnx_path, shapes=shapes), reason


def stage_timing(run: QuickstartRun) -> StageResult:
    from workbench.timing import RunConfig, run_pipeline

    cfg = run.config
    executor, reason = _executor_for(run)
    results = []
    try:
        for streams, batch in timing_plan(cfg):
            config = RunConfig(
                streams=streams,
                batch=batch,
                warmup_s=min(0.2, cfg.timing_window_s),
                window_s=cfg.timing_window_s,
                min_windows=3,
                max_windows=4,
            )
            results.append(run_pipeline(executor, config, model=cfg.model))
    finally:
        executor.close()
    run.objects["timing_results"] = results
    chosen = results[0]
    return StageResult(
        "timing",
        "",
        "done",
        summary=(
            f"{chosen.executor} executor, {chosen.streams} stream(s) x batch {chosen.batch}: "
            f"{chosen.throughput_per_s:.0f} samples/s, p50 {chosen.latency_ms.get('p50', math.nan):.2f} ms. {reason}"
        ),
        data={
            "executor": chosen.executor,
            "executor_label": chosen.executor_label,
            "reason": reason,
            "results": [r.to_json() for r in results],
        },
    )


def stage_export(run: QuickstartRun) -> StageResult:
    export_bundle = _need("workbench.export", "export_bundle")
    artifact = run.objects["chosen_artifact"]
    paths = _variant_paths(run)
    precision = run.config.precision
    wanted = {"fp32": "fp32", "fp16": "fp16", "int8": "int8-mixed"}[precision]
    metric = next((row for row in run.objects.get("metrics", []) if row.variant == wanted), None)
    timing = run.objects.get("timing_results") or []
    bundle = export_bundle(
        artifact,
        paths["export"],
        overwrite=True,
        plan=run.objects.get("mixed_plan") if precision == "int8" else None,
        calibration_cache=paths["calib_cache"] if precision == "int8" and paths["calib_cache"].is_file() else None,
        accuracy=metric.to_json() | {"how": "ONNX Runtime CPU, optimizations off"} if metric else None,
        timing=timing[0].to_json() | {"how": run.stage("timing").data.get("reason", "")} if timing else None,
    )
    run.objects["export_bundle"] = bundle
    files = sorted(str(p.relative_to(bundle.path)) for p in bundle.path.rglob("*") if p.is_file())
    return StageResult(
        "export",
        "",
        "done",
        summary=f"{precision} engine bundle in {bundle.path}: {', '.join(files)}",
        data={"bundle": str(bundle.path), "files": files, "manifest_keys": sorted(bundle.manifest)},
    )


STAGE_FUNCTIONS: dict[str, Callable[[QuickstartRun], StageResult]] = {
    "clean": stage_clean,
    "build_fp32": stage_build_fp32,
    "fusion": stage_fusion,
    "calibrate": stage_calibrate,
    "layer_diff": stage_layer_diff,
    "fallback": stage_fallback,
    "build_mixed": stage_build_mixed,
    "metrics": stage_metrics,
    "select": stage_select,
    "timing": stage_timing,
    "export": stage_export,
}
# A stage runs only when these earlier stages are done (clean is optional: the shipped model is built instead).
REQUIRES: dict[str, tuple[str, ...]] = {
    "build_fp32": (),
    "fusion": ("build_fp32",),
    "calibrate": (),
    "layer_diff": ("calibrate",),
    "fallback": ("layer_diff",),
    "build_mixed": ("fallback",),
    "metrics": (),
    "select": ("build_fp32",),
    "timing": ("select",),
    "export": ("select",),
}


def run_stage(run: QuickstartRun, name: str) -> StageResult:
    """Run one stage, turning a missing module into 'unavailable' and a WorkbenchError into 'failed'."""
    title = STAGE_TITLES[name]
    missing = [dep for dep in REQUIRES.get(name, ()) if not run.stage(dep).ok]
    if missing:
        result = StageResult(
            name, title, "skipped", summary=f"needs stage {', '.join(missing)}, which did not complete"
        )
    else:
        started = time.perf_counter()
        try:
            result = STAGE_FUNCTIONS[name](run)
        except StageUnavailable as error:
            result = StageResult(name, title, "unavailable", summary=str(error))
        except WorkbenchError as error:
            result = StageResult(name, title, "failed", summary=str(error))
        result.title = title
        result.seconds = time.perf_counter() - started
    run.stages[name] = result
    return result


def _environment() -> dict[str, Any]:
    from workbench.engine.backend import detect_gpu, get_backend

    backend = get_backend()
    gpu = detect_gpu()
    return {
        "backend": backend.name,
        "backend_version": backend.version,
        "gpu": gpu.name if gpu.present else None,
        "gpu_compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
    }


class QuickstartSession:
    """Holds a run and re-runs only what a changed setting affects (the notebook panel drives this)."""

    def __init__(
        self,
        config: QuickstartConfig | None = None,
        progress: ProgressFn | None = None,
        on_result: ResultFn | None = None,
    ) -> None:
        self.config = config or QuickstartConfig()
        self.progress = progress
        self.on_result = on_result
        self.run = QuickstartRun(self.config)

    def _prepare(self) -> None:
        from workbench.zoo import get_entry

        entry = get_entry(self.config.model)
        if self.run.objects.get("entry") is not entry:
            self.run.objects.clear()
            self.run.stages.clear()
            self.run.objects["entry"] = entry
        if not self.run.environment:
            self.run.environment = _environment()

    def run_all(self) -> QuickstartRun:
        return self.run_from(STAGE_NAMES[0])

    def run_from(self, first: str) -> QuickstartRun:
        self._prepare()
        names = STAGE_NAMES[STAGE_NAMES.index(first) :]
        for index, name in enumerate(names):
            if self.progress:
                self.progress(name, index, len(names), STAGE_TITLES[name])
            result = run_stage(self.run, name)
            if self.on_result:
                self.on_result(result, index, len(names))
        if self.progress:
            self.progress("done", len(names), len(names), "finished")
        return self.run

    def update(self, **changes: Any) -> QuickstartRun:
        """Apply new settings and re-run from the first stage that reads any of them."""
        unknown = set(changes) - set(QuickstartConfig.__dataclass_fields__)
        if unknown:
            raise WorkbenchError(
                f"unknown quickstart setting(s) {sorted(unknown)}.",
                expected=", ".join(QuickstartConfig.__dataclass_fields__),
            )
        new = replace(self.config, **changes)  # validates
        changed = {key for key, value in changes.items() if getattr(self.config, key) != value}
        self.config = self.run.config = new
        if not changed:
            return self.run
        if "out_dir" in changed or "model" in changed or not self.run.stages:
            return self.run_from(STAGE_NAMES[0])
        return self.run_from(first_affected_stage(changed))


def first_affected_stage(changed: Iterable[str]) -> str:
    changed = set(changed)
    for name, _, fields in STAGES:
        if changed & set(fields):
            return name
    return STAGE_NAMES[-1]


def run_quickstart(
    config: QuickstartConfig | None = None, progress: ProgressFn | None = None, on_result: ResultFn | None = None
) -> QuickstartRun:
    """Run the whole journey headless and return its results."""
    return QuickstartSession(config, progress, on_result).run_all()


# --- choosing among built engines (the export notebook) ---------------------------------------------------------


@dataclass
class EngineCandidate:
    """One built engine with its accuracy and speed, for an accuracy-vs-speed table."""

    precision: str
    engine_path: str
    engine_mb: float
    layers: int
    metric_name: str
    metric: float | None
    delta_vs_fp32: float | None
    higher_is_better: bool
    throughput_per_s: float | None
    p50_ms: float | None
    how: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def compare_precisions(
    session: QuickstartSession, precisions: Iterable[str] = PRECISION_CHOICES
) -> list[EngineCandidate]:
    """Build (if needed) and time the engine of every precision; metrics come from the metrics stage."""
    if not session.run.stages:
        session.run_all()
    run = session.run
    wanted = {"fp32": "fp32", "fp16": "fp16", "int8": "int8-mixed"}
    metrics = {row.variant: row for row in run.objects.get("metrics") or []}
    candidates: list[EngineCandidate] = []
    original = session.config.precision
    try:
        for precision in precisions:
            session.config = run.config = replace(session.config, precision=precision)
            for name in ("select", "timing"):
                run_stage(run, name)
            if not run.stage("select").ok:
                continue
            artifact = run.objects["chosen_artifact"]
            timing = run.objects.get("timing_results") if run.stage("timing").ok else None
            row = metrics.get(wanted[precision])
            candidates.append(
                EngineCandidate(
                    precision=precision,
                    engine_path=str(artifact.engine_path),
                    engine_mb=artifact.engine_bytes / 1e6,
                    layers=artifact.layer_count,
                    metric_name=row.metric if row else "",
                    metric=row.value if row else None,
                    delta_vs_fp32=row.delta_vs_fp32 if row else None,
                    higher_is_better=row.higher_is_better if row else True,
                    throughput_per_s=timing[0].throughput_per_s if timing else None,
                    p50_ms=timing[0].latency_ms.get("p50") if timing else None,
                    how=run.stage("timing").data.get("reason", run.stage("timing").summary),
                )
            )
    finally:
        session.config = run.config = replace(session.config, precision=original)
    return candidates


def recommend(candidates: Iterable[EngineCandidate], max_metric_drop: float = 0.005) -> EngineCandidate | None:
    """The fastest candidate whose task metric is at most ``max_metric_drop`` worse than FP32's."""

    def acceptable(c: EngineCandidate) -> bool:
        if c.delta_vs_fp32 is None:
            return False
        return (c.delta_vs_fp32 >= -max_metric_drop) if c.higher_is_better else (c.delta_vs_fp32 <= max_metric_drop)

    fine = [c for c in candidates if acceptable(c) and c.throughput_per_s is not None]
    return max(fine, key=lambda c: c.throughput_per_s or 0.0, default=None)
