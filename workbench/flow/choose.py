"""Choosing among built engines: every precision's engine with its task metric and speed, and the rule that picks one."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from workbench.artifact import Artifact
from workbench.flow.quickstart import QuickstartSession, run_stage
from workbench.flow.rule import COST_ORDER, DEFAULT_MAX_DROP

COMPARED_PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class EngineCandidate(Artifact):
    """One built engine with its accuracy (and 95 % interval) and speed, for an accuracy-vs-speed table."""

    precision: str
    variant: str  # the task-metric variant of the engine (int8 -> int8-all or int8-mixed)
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


def compare_precisions(
    session: QuickstartSession,
    precisions: Iterable[str] = COMPARED_PRECISIONS,
    progress: Callable[[str, int, int, str], object] | None = None,
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
        if (
            progress is not None
            and progress(precision, index, len(precisions), f"{precision}: build and time") is False
        ):
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
                how=trial.timing.reason if trial.timing else trial.stage("timing").summary,
                n_samples=row.n_samples if row else 0,
                metric_low=estimate.low if estimate else math.nan,
                metric_high=estimate.high if estimate else math.nan,
                interval_method=estimate.method if estimate else "",
                verdict=choice.level,
                verdict_reason=choice.reason,
            )
        )
    return candidates


def recommend(
    candidates: Iterable[EngineCandidate], max_metric_drop: float = DEFAULT_MAX_DROP
) -> EngineCandidate | None:
    """The rule of :mod:`workbench.flow.rule` over built engines: the one expected to cost least on TensorRT
    (INT8 < mixed INT8 < FP16 < FP32) whose task metric is at most ``max_metric_drop`` worse than FP32's.

    CPU timings do not rank TensorRT engines, so speed measured here does not decide."""

    def acceptable(candidate: EngineCandidate) -> bool:
        if candidate.delta_vs_fp32 is None or math.isnan(candidate.delta_vs_fp32):
            return False
        loss = -candidate.delta_vs_fp32 if candidate.higher_is_better else candidate.delta_vs_fp32
        return loss <= max_metric_drop + 1e-12

    fine = [c for c in candidates if acceptable(c) and c.variant in COST_ORDER]
    return min(fine, key=lambda c: COST_ORDER.index(c.variant), default=None)
