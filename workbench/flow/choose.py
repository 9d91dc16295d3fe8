"""Choosing among built engines: every precision's engine with its task metric and speed, and the rule that picks one."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from workbench.artifact import Artifact
from workbench.engine import engine_from_onnx
from workbench.errors import WorkbenchError
from workbench.export import Bundle, export_bundle
from workbench.flow.mixed import SEARCH_HOW, PlanCandidate
from workbench.flow.rule import DEFAULT_MAX_DROP, loss_of, within_drop
from workbench.flow.session import QuickstartSession
from workbench.flow.stages import new_export_dir, run_stage
from workbench.precision.variant import VARIANTS, PrecisionChoice, Variant
from workbench.progress import ProgressEvent, ProgressFn, report

COMPARED_PRECISIONS: tuple[PrecisionChoice, ...] = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class EngineCandidate(Artifact):
    """One built engine with its accuracy (and 95 % interval) and speed, for an accuracy-vs-speed table."""

    precision: PrecisionChoice
    variant: Variant  # the task-metric variant of the engine (int8 -> int8-all or int8-mixed)
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
    n_samples: int = 0
    metric_low: float = math.nan
    metric_high: float = math.nan
    interval_method: str = ""
    verdict: str = ""  # the rule's verdict on this engine (ok / warning / bad) ...
    verdict_reason: str = ""  # ... and why
    # the worst end of the loss vs FP32 at the rule's confidence (nan: none, the point estimate decides) and that level
    loss_bound: float = math.nan
    confidence: float | None = None


def compare_precisions(
    session: QuickstartSession,
    precisions: Iterable[PrecisionChoice] = COMPARED_PRECISIONS,
    progress: ProgressFn | None = None,
) -> list[EngineCandidate]:
    """Build (if needed) and time the engine of every precision; metrics come from the metrics stage.

    The session's own run is left as it was: each precision is tried on a copy of the record.
    """
    if not session.run.stages:
        session.run_all()
    workspace = session.prepare()
    base = session.run
    candidates: list[EngineCandidate] = []
    precisions = tuple(precisions)
    for index, precision in enumerate(precisions):
        if not report(progress, ProgressEvent("precision", f"{precision}: build and time", index, len(precisions))):
            break
        trial = replace(base, config=replace(base.config, precision=precision))
        for name in ("select", "timing"):
            trial = run_stage(trial, name, workspace)
        if trial.selection is None:
            continue
        engine = trial.selection.engine
        row = trial.chosen_metric
        estimate = row.estimate if row else None
        timed = trial.timing.chosen if trial.timing else None
        choice = trial.selection.choice
        judged = next((j for j in choice.judgements if j.variant is trial.selection.variant), None)
        decided = judged is not None and judged.confidence is not None
        candidates.append(
            EngineCandidate(
                precision=precision,
                variant=trial.selection.variant,
                engine_path=str(engine.engine_path),
                engine_mb=engine.engine_bytes / 1e6,
                layers=engine.layer_count,
                metric_name=row.metric if row else "",
                metric=row.value if row else None,
                delta_vs_fp32=row.delta_vs_fp32 if row else None,
                higher_is_better=row.higher_is_better if row else True,
                throughput_per_s=timed.throughput_per_s if timed else None,
                p50_ms=timed.latency_ms.get("p50") if timed else None,
                how=trial.timing.reason if trial.timing else trial.stage("timing").text,
                n_samples=row.n_samples if row else 0,
                metric_low=estimate.low if estimate else math.nan,
                metric_high=estimate.high if estimate else math.nan,
                interval_method=estimate.method if estimate else "",
                verdict=choice.level,
                verdict_reason=choice.reason,
                loss_bound=judged.loss_high if decided and judged else math.nan,
                confidence=judged.confidence if decided and judged else None,
            )
        )
    return candidates


def recommend(
    candidates: Iterable[EngineCandidate], max_metric_drop: float = DEFAULT_MAX_DROP
) -> EngineCandidate | None:
    """The rule of :mod:`workbench.flow.rule` over built engines: the one expected to cost least on TensorRT
    (INT8 < mixed INT8 < FP16 < FP32) whose task metric is at most ``max_metric_drop`` worse than FP32's, at the
    confidence the rule decided at (the worst end of the loss's paired interval, ``loss_bound``, within the drop too).

    CPU timings do not rank TensorRT engines, so speed measured here does not decide."""

    def acceptable(candidate: EngineCandidate) -> bool:
        if candidate.delta_vs_fp32 is None or math.isnan(candidate.delta_vs_fp32):
            return False
        point = within_drop(loss_of(candidate.delta_vs_fp32, candidate.higher_is_better), max_metric_drop)
        return point and (math.isnan(candidate.loss_bound) or within_drop(candidate.loss_bound, max_metric_drop))

    fine = [c for c in candidates if acceptable(c)]
    return min(fine, key=lambda c: VARIANTS[c.variant].cost_rank, default=None)


def front_candidates(session: QuickstartSession) -> tuple[PlanCandidate, ...]:
    """The Pareto front of the session's mixed-precision search (run first if it has not run), best metric first."""
    if not session.run.stages:
        session.run_all()
    elif session.run.mixed_search is None and not session.run.stage("search").ok:
        session.run_stages(["calibrate", "search"] if not session.run.stage("calibrate").ok else ["search"])
    search = session.run.mixed_search
    if search is None:
        raise WorkbenchError(
            f"the mixed-precision search did not run: {session.run.stage('search').text}",
            expected="a zoo model with a task metric, calibration done and search_budget >= 1",
        )
    return search.front


def export_plan(
    session: QuickstartSession, index: int, output_dir: str | Path | None = None, *, overwrite: bool = False
) -> Bundle:
    """Build the engine of plan ``index`` of the search's Pareto front and export it: into ``output_dir``, or a new
    folder ``<out_dir>/export/<model>-plan<index>-<UTC time>``. The bundle records the plan, the calibration cache
    and the plan's task metric with its 95 % interval and sample count (no timing: nothing was timed for it)."""
    front_candidates(session)
    run, workspace = session.run, session.prepare()
    search = run.mixed_search
    calibration = run.calibration
    if search is None or calibration is None:
        raise WorkbenchError("no mixed-precision search to export from.", expected="the search stage done first")
    candidate = search.candidate(index)  # only plans on the front are offered
    plan = search.result.plan_of(index)
    quantized = workspace.calibration_session(run).quantize(calibration.ranges, plan)
    onnx_path = workspace.path(f"plan{index}.onnx")
    quantized.save(onnx_path)
    from workbench.model import load_onnx

    engine = engine_from_onnx(
        load_onnx(onnx_path), workspace.path(f"plan{index}.engine"), workspace.build_options("int8")
    )
    estimate = candidate.estimate
    accuracy = {
        "variant": f"search-plan{index}",
        "metric": candidate.metric_name,
        "value": candidate.metric,
        "n_samples": candidate.n_samples,
        "higher_is_better": candidate.higher_is_better,
        "delta_vs_fp32": candidate.delta_vs_fp32,
        "interval_95": [estimate.low, estimate.high] if estimate.has_interval else None,
        "interval_method": estimate.method,
        "how": SEARCH_HOW,
        "choice": (
            f"plan {index} of the mixed-precision search's Pareto front, picked by the user: INT8 "
            f"{candidate.int8_math_nodes}/{candidate.math_nodes} math nodes; target "
            f"{search.result.target:.4f} {'met' if candidate.meets_target else 'NOT met'}"
        ),
        "choice_level": "ok" if candidate.meets_target else "warning",
    }
    target = (
        Path(output_dir) if output_dir else new_export_dir(run, Path(run.config.out_dir) / "export", f"plan{index}")
    )
    return export_bundle(
        engine, target, overwrite=overwrite, plan=plan, calibration_cache=calibration.cache_path, accuracy=accuracy
    )
