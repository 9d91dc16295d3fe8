"""The journey's stages, in order, each a function ``(run, workspace) -> artifact`` beside its one-line summary.

clean -> build FP32 -> fusion view -> build FP16 -> calibrate -> build all-INT8 -> per-layer diff -> mixed-precision
search -> build the search's pick (mixed INT8) -> task metric per built variant -> choose among the built variants ->
time the chosen engine -> export it.

Only build stages make engines (one :class:`~workbench.flow.artifacts.VariantBuild` each); ``select`` picks among
them by the rule of :mod:`workbench.flow.rule`; ``export`` ships the picked build as it is. A stage that raises
:class:`StageOff`, :class:`StageNotApplicable` or :class:`StageBlocked` ends with that status and the message as its
reason; any other :class:`WorkbenchError` fails it and clears its artifact, so nothing stale is shown next to a
failure. A stage whose requirement did not complete is not run (blocked, or off / not applicable like it).
"""

from __future__ import annotations

import math
import os
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from workbench._io import write_bytes_atomic, write_json_atomic
from workbench.calib.quantization_choice import choose_rounding_and_alignment
from workbench.calib.rounding_choice import choose_weight_rounding
from workbench.calib.search import search_mixed_precision
from workbench.calib.session import AlreadyQuantized, Float16Model, refuse_quantized
from workbench.clean import CleanOptions, clean_model
from workbench.engine import EngineArtifact, FusionStats, detect_gpu, engine_from_onnx, engine_runnable
from workbench.engine.backend import get_backend
from workbench.errors import WorkbenchError
from workbench.export import Bundle, export_bundle
from workbench.flow.artifacts import (
    METRIC_HOW,
    Calibration,
    Cleaning,
    LayerDiffStage,
    MetricRow,
    Metrics,
    QuickstartRun,
    Selection,
    StageResult,
    StageStatus,
    Timing,
    VariantBuild,
    require,
)
from workbench.flow.config import QuickstartConfig, calibration_batches
from workbench.flow.mixed import MixedSearch, mixed_search
from workbench.flow.rule import choose
from workbench.flow.workspace import Workspace
from workbench.log import get_logger
from workbench.model import OnnxModel, load_onnx
from workbench.precision.qdq_rules import QUANTIZABLE_OPS
from workbench.precision.variant import VARIANTS, Variant, variants_for
from workbench.progress import Cancelled
from workbench.timing import interactive_config, run_sweep, sweep_plan
from workbench.timing.executors import OrtCpuExecutor
from workbench.timing.trt_executor import TrtExecutor

LOG = get_logger(__name__)

T = TypeVar("T")


class StageOff(WorkbenchError):
    """Raised by a stage that the session's settings turn off (status ``off``, not a failure)."""


class StageNotApplicable(WorkbenchError):
    """Raised by a stage that cannot apply to this model (e.g. INT8 with nothing to quantize): status
    ``not_applicable`` with the reason; the stages that need it do not apply either."""


class StageBlocked(WorkbenchError):
    """Raised by a stage that may not run as things stand (e.g. exporting an engine whose verdict is bad): status
    ``blocked``; the message says why and how to go ahead anyway."""


@dataclass(frozen=True)
class Stage(Generic[T]):
    """One step of the journey: what it is called, which settings it reads, what it needs, what it makes."""

    name: str
    title: str
    reads: tuple[str, ...]  # config fields the stage reads directly
    requires: tuple[str, ...]  # stages that must be done first
    field: str  # the QuickstartRun field its artifact goes to
    run: Callable[[QuickstartRun, Workspace], T]
    summary: Callable[[T, QuickstartRun], str]  # (its artifact, the run including it) -> one line
    builds: Variant | None = None  # the variant a build stage makes (its artifact is that VariantBuild)
    # whether a change from one config to another changes what this stage does; None: any setting it reads changed
    affected_by: Callable[[QuickstartConfig, QuickstartConfig], bool] | None = None

    def is_affected(self, old: QuickstartConfig, new: QuickstartConfig) -> bool:
        """Whether going from ``old`` to ``new`` settings makes this stage's result stale."""
        if not any(getattr(old, name) != getattr(new, name) for name in self.reads):
            return False
        return self.affected_by is None or self.affected_by(old, new)


# --- clean ------------------------------------------------------------------------------------------------------


def stage_clean(run: QuickstartRun, ws: Workspace) -> Cleaning:
    profile = {name: list(rng) for name, rng in ws.entry.input_profiles().items()}
    result = clean_model(ws.entry.onnx_path(), CleanOptions(profile=profile))
    path = ws.path("clean.onnx")
    write_bytes_atomic(path, result.model.SerializeToString())
    return Cleaning(result, load_onnx(path))


def summary_clean(cleaning: Cleaning, run: QuickstartRun) -> str:
    result = cleaning.result
    accepted = [p.name for p in result.passes if p.changed]
    return (
        f"{result.nodes_before} ONNX nodes (raw graph) -> {result.nodes_after} (cleaned graph), {len(accepted)} "
        f"pass(es) changed the graph, {len(result.rolled_back)} rolled back"
    )


# --- builds: one VariantBuild per variant, nowhere else ---------------------------------------------------------


def _engine(ws: Workspace, variant: Variant, model: OnnxModel) -> EngineArtifact:
    return engine_from_onnx(model, ws.path(f"{variant}.engine"), ws.build_options(VARIANTS[variant].precision))


def summary_build(build: VariantBuild, run: QuickstartRun) -> str:
    engine = build.engine
    by_precision = ", ".join(f"{k} {v}" for k, v in sorted(engine.summary()["by_precision"].items()))
    return (
        f"{VARIANTS[build.variant].label}: {engine.onnx_node_count} ONNX nodes of {Path(engine.onnx_path).name} -> "
        f"{engine.layer_count} engine layers ({by_precision}) in {engine.build_seconds:.1f} s "
        f"({engine.backend} {engine.backend_version})" + (f"; {build.source}" if build.source else "")
    )


def stage_build_fp32(run: QuickstartRun, ws: Workspace) -> VariantBuild:
    model = ws.source_model(run)
    return VariantBuild(Variant.FP32, model.path, _engine(ws, Variant.FP32, model))


def stage_fusion(run: QuickstartRun, ws: Workspace) -> FusionStats:
    return require(run.fp32_build, "build_fp32").engine.layer_map.stats()


def summary_fusion(stats: FusionStats, run: QuickstartRun) -> str:
    fused = sum(count for size, count in stats.group_sizes.items() if size > 1)
    return (
        f"{stats.engine_layers} engine layers; {fused} of them fuse 2+ ONNX nodes; {stats.folded_nodes} of "
        f"{stats.onnx_nodes} ONNX nodes map to no layer (folded or metadata-less)"
    )


def stage_build_fp16(run: QuickstartRun, ws: Workspace) -> VariantBuild:
    """The FP16 engine; its metric is measured on the AutoCast FP16 model (the same rules the builder applies)."""
    try:
        onnx_path = ws.fp16_onnx(run)
    except WorkbenchError as error:
        raise StageNotApplicable(f"no FP16 model of this graph: {error}") from error
    return VariantBuild(Variant.FP16, onnx_path, _engine(ws, Variant.FP16, ws.source_model(run)))


# --- INT8: calibrate, build all-INT8, diff, search, build the search's pick ----------------------------------


def stage_calibrate(run: QuickstartRun, ws: Workspace) -> Calibration:
    cfg = run.config
    source = ws.source_model(run).proto.graph
    try:
        refuse_quantized(ws.source_model(run))  # before "nothing to quantize": a QLinearConv is no Conv
    except AlreadyQuantized as error:
        raise StageNotApplicable(
            f"{error} Its own quantization is built as it is in the FP32 and FP16 engines (their layer counts say "
            "which run in 8 bits), and those are compared instead"
        ) from error
    if not any(node.op_type in QUANTIZABLE_OPS for node in source.node):
        ops = sorted({node.op_type for node in source.node})
        raise StageNotApplicable(
            f"nothing to quantize: INT8 applies to {', '.join(QUANTIZABLE_OPS)} nodes and this model has none "
            f"(its ops: {', '.join(ops[:12])}); the FP32 and FP16 engines are compared instead"
        )
    try:
        session = ws.calibration_session(run)
    except Float16Model as error:
        raise StageNotApplicable(f"{error} The FP32 and FP16 engines are compared instead") from error
    session.events = ws.progress  # the stage's steps (statistics, GPTQ, each evaluation) as the stage's detail
    try:
        ranges = session.ranges(cfg.calibration_method)
        statistics = session.statistics()
        # `calibrate`'s default for a model with a task metric: the weight rounding (nearest or GPTQ, whichever
        # scores better) and the grid alignment chosen together, on the evaluation samples; every later stage
        # (search, FP8, export) quantizes with what they leave on the shared session (a re-run's session may still
        # be aligned from the last run: the choice sets both)
        plan = session.default_plan()
        rounding, alignment = choose_rounding_and_alignment(session, ranges, plan, cfg.evaluation_samples)
    finally:
        session.events = None  # later stages' evaluations report as their own steps (the search's "evaluation")
    cache, onnx_path = ws.path("calib.json"), ws.path(f"{Variant.INT8_ALL}.onnx")
    ranges.save(cache)
    quantized = session.quantize(ranges)
    quantized.save(onnx_path)
    return Calibration(
        method=cfg.calibration_method,
        ranges=ranges,
        samples=statistics.num_samples,
        statistics_seconds=statistics.seconds,
        cache_path=cache,
        onnx_path=onnx_path,
        qdq_pairs=quantized.counts().get("QuantizeLinear", 0),
        weight_rounding=rounding.choice,
        weight_rounding_note=rounding.note,
        grid_alignment=alignment.choice,
        grid_alignment_note=alignment.note,
        quantized=quantized,
        rounding_choice=rounding.without_model(),
    )


def summary_calibrate(calibration: Calibration, run: QuickstartRun) -> str:
    text = (
        f"{calibration.method} ranges for {len(calibration.ranges.amax)} tensors from {calibration.samples} samples; "
        f"{calibration.qdq_pairs} Q/DQ pairs inserted; {calibration.weight_rounding_note}"
    )
    if calibration.grid_alignment_note:
        text += f"; {calibration.grid_alignment_note}"
    notes = calibration.ranges.range_notes
    if notes:  # ranges the guard changed (dead tensors, a method's range that clipped most of the data)
        first, note = next(iter(notes.items()))
        text += f"; {len(notes)} range(s) not the method's own choice, e.g. {first!r}: {note}"
    return text


def stage_build_int8_all(run: QuickstartRun, ws: Workspace) -> VariantBuild:
    calibration = require(run.calibration, "calibrate")
    return VariantBuild(
        Variant.INT8_ALL,
        calibration.onnx_path,
        _engine(ws, Variant.INT8_ALL, load_onnx(calibration.onnx_path)),
        calibration_cache=calibration.cache_path,
        source=f"every quantizable node INT8 ({calibration.method} ranges, weights "
        f"{'GPTQ' if calibration.weight_rounding == 'gptq' else 'nearest'}"
        f"{', grids aligned' if calibration.grid_alignment else ''})",
    )


def stage_build_fp8_all(run: QuickstartRun, ws: Workspace) -> VariantBuild:
    """FP8 (E4M3) Q/DQ on every quantizable node, from the same statistics, built for FP8-capable targets. Only
    when FP8 is asked for: FP8 engines run on compute capability 8.9+ only."""
    if run.config.precision != "fp8":
        raise StageOff("FP8 was not asked for (precision fp8 builds it; it runs on GPUs of compute capability 8.9+)")
    calibration = require(run.calibration, "calibrate")
    session = ws.calibration_session(run)
    plan = session.default_plan("fp8")
    # chosen for this plan as `calibrate --format fp8` does; the session keeps the INT8 plan's choice for later stages
    try:
        rounding = choose_weight_rounding(session, calibration.ranges, plan, run.config.evaluation_samples)
        quantized = session.quantize(calibration.ranges, plan)
    finally:
        session.weight_rounding = calibration.weight_rounding
    onnx_path = ws.path(f"{Variant.FP8_ALL}.onnx")
    quantized.save(onnx_path)
    return VariantBuild(
        Variant.FP8_ALL,
        onnx_path,
        _engine(ws, Variant.FP8_ALL, load_onnx(onnx_path, check=False)),
        calibration_cache=calibration.cache_path,
        source=f"every quantizable node FP8 ({session.fp8_ranges(calibration.ranges).method} ranges, weights "
        f"{'GPTQ' if rounding.choice == 'gptq' else 'nearest'})",
    )


def stage_layer_diff(run: QuickstartRun, ws: Workspace) -> LayerDiffStage:
    calibration = require(run.calibration, "calibrate")
    session = ws.calibration_session(run)
    diff = session.diff(calibration.quantized, max_batches=calibration_batches(run.config.diff_samples))
    path = ws.path("layer-diff.json")
    diff.save(path)
    return LayerDiffStage(diff, tuple(session.rank_int8_nodes(diff)), path)


def summary_layer_diff(stage: LayerDiffStage, run: QuickstartRun) -> str:
    diff = stage.diff
    text = f"{len(diff.tensors)} tensors compared on {diff.num_samples} samples"
    worst = diff.ranking(1)
    if worst:
        text += (
            f"; most INT8 noise added at {worst[0].node} (accumulated SQNR {worst[0].sqnr_db_accumulated:.1f} dB, "
            f"{worst[0].drop_db:.1f} dB drop)"
        )
    if stage.int8_nodes_worst_first:
        text += f"; INT8 nodes worst first: {', '.join(stage.int8_nodes_worst_first[:3])}"
    return text


def stage_search(run: QuickstartRun, ws: Workspace) -> MixedSearch:
    """The accuracy-target search (most INT8 whose metric is within ``max_metric_drop`` of FP32) from this run's
    calibration ranges, every plan's engine built for its structure; the JSON goes to ``<model>.mixed.json``. Its
    pick is what the build_mixed stage builds: the journey's one mixed-precision mechanism."""
    cfg = run.config
    if cfg.search_budget == 0:
        raise StageOff(
            "the mixed-precision search is off (search_budget=0), so there is no mixed engine",
            expected="search_budget 1..64 to run it",
        )
    calibration = require(run.calibration, "calibrate")
    result = search_mixed_precision(
        ws.calibration_session(run),
        ranges=calibration.ranges,
        target_drop=cfg.max_metric_drop,
        budget=cfg.search_budget,
        limit=cfg.evaluation_samples,
        confidence=cfg.decision_confidence,  # the rule of the select stage decides at the same level
        progress=ws.progress,  # ProgressEvent(task="evaluation", index of budget): the panel shows "evaluation 3 of 8"
        scored_start=calibration.rounding_choice,  # the all-INT8 model calibrate scored: not run again
    )
    path = ws.path("mixed.json")
    result.save(path)
    return mixed_search(result, path)


def summary_search(search: MixedSearch, run: QuickstartRun) -> str:
    result = search.result
    chosen = search.intervals[result.chosen.index]
    return (
        f"pick: plan {result.chosen.index}, {result.metric_name} {chosen.text()} with INT8 {result.int8_math_nodes}/"
        f"{result.math_nodes} math nodes (target {result.target:.4f}: {result.target_verdict}); "
        f"{result.evaluations_used} plan(s) evaluated, {len(search.front)} on the Pareto front; stopped: "
        f"{result.stop_reason}"
    )


def stage_build_mixed(run: QuickstartRun, ws: Workspace) -> VariantBuild:
    """The engine of the search's pick, with its plan and calibration cache."""
    search = require(run.mixed_search, "search")
    calibration = require(run.calibration, "calibrate")
    result = search.result
    pick = result.chosen
    if run.search_pick is not Variant.INT8_MIXED:
        # met: nothing needs to stay wider; not met: no wider plan the search scored did better, so it has no mixed
        # engine to offer (saying "no node needs to stay wider" of a missed target would tell the user it was fine)
        answer = (
            "the all-INT8 engine is the mixed-precision answer, no node needs to stay wider"
            if result.met
            else "the target is NOT met and no plan with nodes kept wider scored higher, so there is no mixed engine "
            "to build (a larger search budget, demo --search-budget, may find one)"
        )
        raise StageNotApplicable(
            f"the search's pick is the all-INT8 plan ({result.metric_name} {pick.metric:.4f}; stopped: "
            f"{result.stop_reason}): {answer}"
        )
    if pick.int8_math_nodes == 0:
        raise StageNotApplicable(
            f"the search's pick (plan {pick.index}) keeps no math node INT8: it is the {result.fallback} model, whose "
            "engine the other build stages make"
        )
    plan = result.plan_of(pick.index)
    quantized = ws.calibration_session(run).quantize(calibration.ranges, plan)
    onnx_path, plan_path = ws.path(f"{Variant.INT8_MIXED}.onnx"), ws.path(f"{Variant.INT8_MIXED}.plan.json")
    quantized.save(onnx_path)
    write_json_atomic(plan_path, plan.to_json())
    return VariantBuild(
        Variant.INT8_MIXED,
        onnx_path,
        _engine(ws, Variant.INT8_MIXED, load_onnx(onnx_path)),
        plan=plan,
        plan_path=plan_path,
        calibration_cache=calibration.cache_path,
        source=(
            f"the mixed-precision search's pick, plan {pick.index}: {len(pick.fallback_nodes)} node(s) to "
            f"{result.fallback}, INT8 {pick.int8_math_nodes}/{pick.math_nodes} math nodes"
        ),
    )


# --- measure, choose, time, export ---------------------------------------------------------------------------


def _why_not_built(run: QuickstartRun, variant: Variant) -> str:
    stage = BUILD_STAGE.get(variant)
    return run.stage(stage).text if stage else "the journey has no build stage for it"


def stage_metrics(run: QuickstartRun, ws: Workspace) -> Metrics:
    """The task metric of FP32 (the reference: the source model) and of every other built variant's ONNX."""
    builds = run.builds
    variants: list[tuple[Variant, Path]] = [(Variant.FP32, ws.source_model(run).path)] + [
        (variant, builds[variant].onnx_path) for variant in Variant if variant in builds and variant is not Variant.FP32
    ]
    not_measured: dict[Variant, str] = {
        variant: f"not built: {_why_not_built(run, variant)}"
        for variant in BUILD_STAGE
        if variant not in builds and variant is not Variant.FP32
    }
    measured = []
    taken: list[Variant] = []  # scored by the calibrate stage on these very bytes and samples
    for variant, path in variants:
        try:
            result, reused = ws.metric_of(run, path)
        except WorkbenchError as error:
            not_measured[variant] = str(error)
            continue
        measured.append((variant, path, result))
        if reused:
            taken.append(variant)
    reference = next((result.value for variant, _, result in measured if variant is Variant.FP32), None)
    rows = tuple(
        MetricRow(
            variant,
            str(path),
            result.name,
            float(result.value),
            result.n_samples,
            result.higher_is_better,
            float(result.value) - reference if reference is not None else math.nan,
            tuple(float(score) for score in result.scores),
        )
        for variant, path, result in measured
    )
    from workbench.zoo.onnx_file import OnnxFileEntry

    if isinstance(ws.entry, OnnxFileEntry):
        notes = "".join(f"; {note}" for note in ws.entry.notes)
        return Metrics(rows, not_measured, f"{METRIC_HOW}; {ws.entry.inputs_note}{notes}", tuple(taken))
    return Metrics(rows, not_measured, from_calibration=tuple(taken))


def summary_metrics(metrics: Metrics, run: QuickstartRun) -> str:
    text = "; ".join(f"{row.variant} {row.value:.4f}" for row in metrics.rows)
    taken = ", ".join(str(variant) for variant in metrics.from_calibration)
    reused = f" ({taken}: scored by the calibrate stage on the same samples, not run again)" if taken else ""
    return f"{metrics.metric} (ONNX Runtime CPU): {text}{reused}"


def stage_select(run: QuickstartRun, ws: Workspace) -> Selection:
    """The built variant of the requested precision ("auto": the rule's pick), with the verdict on its metric.
    Builds nothing: a variant no build stage built cannot be chosen."""
    cfg = run.config
    builds = run.builds
    if not set(variants_for(cfg.precision)) & set(builds):
        raise WorkbenchError(
            f"no {cfg.precision} engine was built (see the build stages above).",
            expected="another precision, or auto",
        )
    rows = run.metrics.rows if run.metrics else ()
    choice = choose(
        rows, cfg.precision, cfg.max_metric_drop, available=tuple(builds), confidence=cfg.decision_confidence
    )
    if choice.variant not in builds:
        raise WorkbenchError(
            f"the rule picks {choice.variant}, which was not built: {_why_not_built(run, choice.variant)}",
            expected="every build stage done",
        )
    return Selection(cfg.precision, builds[choice.variant], choice)


def summary_select(selection: Selection, run: QuickstartRun) -> str:
    engine = selection.engine
    asked = f" (asked: {selection.precision})" if selection.precision != selection.variant else ""
    text = (
        f"{selection.variant} engine{asked} {engine.engine_path} ({engine.layer_count} layers, "
        f"{engine.engine_bytes / 1e6:.2f} MB)"
    )
    metric = run.chosen_metric
    if metric is not None:
        text += f"; {metric.metric} {metric.estimate.text()} ({metric.delta_vs_fp32:+.4f} vs FP32)"
    choice = selection.choice
    return text + ("" if choice.ok else f". WARNING ({choice.level}): {choice.reason}")


def _executor_for(selection: Selection, ws: Workspace) -> tuple[TrtExecutor | OrtCpuExecutor, str]:
    """A GPU executor for the chosen engine when this machine can run it, else ONNX Runtime CPU, and why."""
    gpu = detect_gpu()
    if gpu.present:
        can_run, why = engine_runnable(get_backend(selection.engine.backend), gpu)
        if can_run:
            return TrtExecutor(selection.engine.engine_path), f"TensorRT GPU executor on {gpu.name}"
        reason = f"GPU {gpu.name} present but the engine cannot run on it ({why}); timing the ONNX model on CPU instead"
    else:
        reason = "no NVIDIA GPU here: timing the chosen ONNX variant with ONNX Runtime CPU (not TensorRT numbers)"
    # the zoo's optimization-profile shapes pin dims the ONNX leaves symbolic (e.g. OCR's image height and width)
    shapes = {name: tuple(opt) for name, (_low, opt, _high) in ws.entry.input_profiles().items()}
    return OrtCpuExecutor(selection.onnx_path, shapes=shapes), reason


def stage_timing(run: QuickstartRun, ws: Workspace) -> Timing:
    cfg = run.config
    executor, reason = _executor_for(require(run.selection, "select"), ws)
    batch = min(cfg.batch, ws.entry.max_batch or cfg.batch)
    if batch != cfg.batch:  # a graph that hard-codes batch 1: the streams carry the concurrency
        reason += (
            f"; batch {batch}, not {cfg.batch}: the model's graph hard-codes its batch, so streams do the batching"
        )
    try:
        sweep = run_sweep(
            executor,
            sweep_plan(cfg.streams, batch, include_baselines=cfg.sweep),
            interactive_config(cfg.timing_window_s),
            model=cfg.model,
        )
    finally:
        executor.close()
    return Timing(sweep.results, reason, fixed_batch=ws.entry.max_batch)


def summary_timing(timing: Timing, run: QuickstartRun) -> str:
    chosen = timing.chosen
    return (
        f"{chosen.executor} executor, {chosen.streams} stream(s) x batch {chosen.batch}: "
        f"{chosen.throughput_per_s:.0f} samples/s, p50 {chosen.latency_ms.get('p50', math.nan):.2f} ms. {timing.reason}"
    )


def new_export_dir(run: QuickstartRun, root: Path, label: str | None = None) -> Path:
    """A folder no export has used: ``<root>/<model>-<label>-<UTC time>`` (``-2``, ``-3`` ... within one second);
    ``label`` defaults to the chosen engine's variant."""
    label = label or str(require(run.selection, "select").variant)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = Path(run.config.model).stem if run.config.model.endswith(".onnx") else run.config.model
    base = root / f"{name.replace(os.sep, '_')}-{label}-{stamp}"
    path, suffix = base, 2
    while path.exists():
        path, suffix = base.with_name(f"{base.name}-{suffix}"), suffix + 1
    return path


def export_command(build: VariantBuild, output_dir: Path) -> str:
    """The ``workbench export`` command that ships ``build`` as it is (engine, plan and calibration cache)."""
    words = ["workbench", "export", str(build.engine.engine_path), "-o", str(output_dir)]
    if build.plan_path is not None:
        words += ["--plan", str(build.plan_path)]
    if build.calibration_cache is not None:
        words += ["--calibration-cache", str(build.calibration_cache)]
    return shlex.join(words)


def export_selection(run: QuickstartRun, output_dir: str | Path | None = None, *, overwrite: bool = False) -> Bundle:
    """Export the chosen build (its engine, plan and calibration cache) with its accuracy and timing: into
    ``output_dir``, or a new folder under the run's ``<out_dir>/export`` (so exports never replace each other); an
    existing ``output_dir`` needs ``overwrite``."""
    selection = require(run.selection, "select")
    build = selection.build
    metric = run.chosen_metric
    timing = run.timing
    target = Path(output_dir) if output_dir else new_export_dir(run, Path(run.config.out_dir) / "export")
    accuracy = None
    if metric is not None:
        estimate = metric.estimate
        accuracy = metric.to_json() | {
            "how": "ONNX Runtime CPU, optimizations off",
            "interval_95": [estimate.low, estimate.high] if estimate.has_interval else None,
            "interval_method": estimate.method,
            "choice": selection.choice.reason,
            "choice_level": selection.choice.level,
            "source": build.source,
        }
        accuracy.pop("scores", None)
    return export_bundle(
        build.engine,
        target,
        overwrite=overwrite,
        plan=build.plan,
        calibration_cache=build.calibration_cache,
        accuracy=accuracy,
        timing=timing.chosen.to_json() | {"how": timing.reason} if timing else None,
    )


def stage_export(run: QuickstartRun, ws: Workspace) -> Bundle:
    cfg = run.config
    if not cfg.export:
        raise StageOff("export is off for this session (export=False): export from the panel's button")
    selection = require(run.selection, "select")
    if selection.choice.level == "bad" and not cfg.export_bad:
        command = export_command(selection.build, new_export_dir(run, Path(cfg.out_dir) / "export"))
        raise StageBlocked(
            f"the {selection.variant} engine's verdict is bad ({selection.choice.reason}), so it is not exported. "
            f"To export it anyway: run again with export_bad=True (workbench demo --export-anyway), or export this "
            f"engine as built: {command}"
        )
    return export_selection(run)


def summary_export(bundle: Bundle, run: QuickstartRun) -> str:
    files = sorted(str(p.relative_to(bundle.path)) for p in bundle.path.rglob("*") if p.is_file())
    variant = run.chosen_variant
    return f"{variant} engine bundle in {bundle.path}: {', '.join(files)}"


# --- the journey ---------------------------------------------------------------------------------------------------

STAGES: tuple[Stage[Any], ...] = (
    Stage("clean", "Clean the ONNX graph", ("model",), (), "cleaning", stage_clean, summary_clean),
    Stage("build_fp32", "Build the FP32 engine", (), (), "fp32_build", stage_build_fp32, summary_build, Variant.FP32),
    Stage("fusion", "Fusion view", (), ("build_fp32",), "fusion", stage_fusion, summary_fusion),
    Stage("build_fp16", "Build the FP16 engine", (), (), "fp16_build", stage_build_fp16, summary_build, Variant.FP16),
    Stage(
        "calibrate",
        "Calibrate INT8 ranges",
        # evaluation_samples: the weight rounding is chosen on them
        ("calibration_method", "calibration_samples", "evaluation_samples"),
        (),
        "calibration",
        stage_calibrate,
        summary_calibrate,
    ),
    Stage(
        "build_int8_all",
        "Build the all-INT8 engine",
        (),
        ("calibrate",),
        "int8_all_build",
        stage_build_int8_all,
        summary_build,
        Variant.INT8_ALL,
    ),
    Stage(
        "layer_diff",
        "Per-layer INT8 diff",
        ("diff_samples",),
        ("calibrate",),
        "layer_diff",
        stage_layer_diff,
        summary_layer_diff,
    ),
    Stage(
        "search",
        "Mixed-precision search (accuracy target)",
        ("search_budget", "max_metric_drop", "evaluation_samples", "confidence"),
        ("calibrate",),
        "mixed_search",
        stage_search,
        summary_search,
    ),
    Stage(
        "build_mixed",
        "Build the search's mixed engine",
        (),
        ("search",),
        "mixed_build",
        stage_build_mixed,
        summary_build,
        Variant.INT8_MIXED,
    ),
    Stage(
        "build_fp8_all",
        "Build the all-FP8 engine (precision fp8)",
        ("precision",),
        ("calibrate",),
        "fp8_all_build",
        stage_build_fp8_all,
        summary_build,
        Variant.FP8_ALL,
        # it reads the precision only to know whether FP8 is asked for: fp32 -> fp16 leaves it (and the metrics) be
        affected_by=lambda old, new: (old.precision == "fp8") != (new.precision == "fp8"),
    ),
    Stage("metrics", "Task metric per variant", ("evaluation_samples",), (), "metrics", stage_metrics, summary_metrics),
    Stage(
        "select",
        "Choose the engine",
        ("precision", "max_metric_drop", "confidence"),
        ("build_fp32",),
        "selection",
        stage_select,
        summary_select,
    ),
    Stage(
        "timing",
        "Time the pipeline",
        ("streams", "batch", "timing_window_s", "sweep"),
        ("select",),
        "timing",
        stage_timing,
        summary_timing,
    ),
    Stage(
        "export",
        "Export the chosen engine",
        ("export", "export_bad"),
        ("select",),
        "bundle",
        stage_export,
        summary_export,
    ),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}
BUILD_STAGE = {stage.builds: stage.name for stage in STAGES if stage.builds is not None}  # variant -> its build stage

_RAISED_STATUS: tuple[tuple[type[WorkbenchError], StageStatus], ...] = (
    (Cancelled, StageStatus.CANCELLED),  # the session's callback asked to stop while the stage ran
    (StageOff, StageStatus.OFF),
    (StageNotApplicable, StageStatus.NOT_APPLICABLE),
    (StageBlocked, StageStatus.BLOCKED),
)


def _not_run(stage: Stage[Any], missing: list[StageResult]) -> StageResult:
    """The result of a stage whose requirements did not complete: as they are when all are off / not applicable
    (a stage built on one that does not apply does not apply either), else blocked."""
    names = ", ".join(result.name for result in missing)
    statuses = {result.status for result in missing}
    if statuses == {StageStatus.NOT_APPLICABLE}:
        return StageResult(
            stage.name, stage.title, StageStatus.NOT_APPLICABLE, reason=f"needs stage {names}, which does not apply"
        )
    if statuses <= {StageStatus.OFF, StageStatus.NOT_APPLICABLE}:
        return StageResult(stage.name, stage.title, StageStatus.OFF, reason=f"needs stage {names}, which is off")
    return StageResult(
        stage.name, stage.title, StageStatus.BLOCKED, reason=f"needs stage {names}, which did not complete"
    )


def run_stage(run: QuickstartRun, name: str, ws: Workspace) -> QuickstartRun:
    """Run one stage and return the new record: its artifact set (or cleared when not done) and its StageResult."""
    stage = STAGE_BY_NAME[name]
    missing = [run.stage(dep) for dep in stage.requires if not run.stage(dep).ok]
    artifact = None
    if missing:
        result = _not_run(stage, missing)
    else:
        started = time.perf_counter()
        try:
            artifact = stage.run(run, ws)
        except WorkbenchError as error:
            status = next((s for kind, s in _RAISED_STATUS if isinstance(error, kind)), StageStatus.FAILED)
            seconds = time.perf_counter() - started if status is StageStatus.FAILED else 0.0
            result = StageResult(name, stage.title, status, seconds, reason=str(error))
        else:
            seconds = time.perf_counter() - started
            text = stage.summary(artifact, _with_fields(run, {stage.field: artifact}))
            result = StageResult(name, stage.title, StageStatus.DONE, seconds, text)
    LOG.info("stage %s: %s in %.1f s (%s)", name, result.status.value, result.seconds, result.text)
    return _with_fields(run, {stage.field: artifact, "stages": {**run.stages, name: result}})


def _with_fields(run: QuickstartRun, fields: dict[str, Any]) -> QuickstartRun:
    """``run`` with the named fields replaced (a stage's artifact goes to the field its Stage names)."""
    return replace(run, **fields)


def cancel_stages(run: QuickstartRun, names: Iterable[str]) -> QuickstartRun:
    """Mark ``names`` cancelled and clear their artifacts: a cancelled run shows no stale result."""
    fields: dict[str, Any] = {}
    stages = dict(run.stages)
    for name in names:
        stage = STAGE_BY_NAME[name]
        fields[stage.field] = None
        stages[name] = StageResult(name, stage.title, StageStatus.CANCELLED, reason="cancelled before this stage ran")
    return _with_fields(run, fields | {"stages": stages})
