"""Choosing among built engines: every precision's engine with its task metric and speed, and the rule that picks one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from workbench.artifact import Artifact
from workbench.flow.quickstart import PRECISION_CHOICES, VARIANT_OF_PRECISION, QuickstartSession, run_stage


@dataclass(frozen=True)
class EngineCandidate(Artifact):
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


def compare_precisions(
    session: QuickstartSession, precisions: Iterable[str] = PRECISION_CHOICES
) -> list[EngineCandidate]:
    """Build (if needed) and time the engine of every precision; metrics come from the metrics stage.

    The session's own run is left as it was: each precision is tried on a copy of the record.
    """
    if not session.run.stages:
        session.run_all()
    workspace = session.prepare()
    base = session.run
    candidates: list[EngineCandidate] = []
    for precision in precisions:
        trial = replace(base, config=replace(base.config, precision=precision))
        for name in ("select", "timing"):
            trial = run_stage(trial, name, workspace)
        if trial.selection is None:
            continue
        engine = trial.selection.engine
        row = trial.metrics.row(VARIANT_OF_PRECISION[precision]) if trial.metrics else None
        timed = trial.timing.chosen if trial.timing else None
        candidates.append(
            EngineCandidate(
                precision=precision,
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
            )
        )
    return candidates


def recommend(candidates: Iterable[EngineCandidate], max_metric_drop: float = 0.005) -> EngineCandidate | None:
    """The fastest candidate whose task metric is at most ``max_metric_drop`` worse than FP32's."""

    def acceptable(candidate: EngineCandidate) -> bool:
        if candidate.delta_vs_fp32 is None:
            return False
        if candidate.higher_is_better:
            return candidate.delta_vs_fp32 >= -max_metric_drop
        return candidate.delta_vs_fp32 <= max_metric_drop

    fine = [c for c in candidates if acceptable(c) and c.throughput_per_s is not None]
    return max(fine, key=lambda c: c.throughput_per_s or 0.0, default=None)
