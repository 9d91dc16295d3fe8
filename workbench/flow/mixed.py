"""The mixed-precision search in the journey: every evaluated plan with its 95 % interval, and the Pareto front the
export panel picks from.

:func:`workbench.calib.search.search_mixed_precision` measures the plans; this module adds what the report and the
panels show but must not compute themselves: an interval per plan (Wilson or bootstrap, :mod:`.uncertainty`) and one
:class:`PlanCandidate` per plan on the front (task metric better, INT8 share higher, engine layers + reformats fewer),
labelled with metric, interval, samples, INT8 share and engine structure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from workbench.artifact import Artifact
from workbench.calib.cost import COST_LABEL
from workbench.calib.search import EvaluatedPlan, MixedPrecisionResult
from workbench.flow.uncertainty import Estimate, estimate

SEARCH_HOW = (
    "each plan's task metric by ONNX Runtime CPU with graph optimizations off (Q/DQ as simulated quantization) on "
    "the evaluation samples"
)


@dataclass(frozen=True)
class PlanCandidate(Artifact):
    """One plan of the Pareto front, as the export panel lists it: metric with interval, INT8 share, engine cost."""

    index: int  # the plan's index in ``MixedPrecisionResult.evaluated``
    metric_name: str
    metric: float
    n_samples: int
    metric_low: float
    metric_high: float
    interval_method: str
    delta_vs_fp32: float
    higher_is_better: bool
    meets_target: bool
    chosen_by_search: bool
    int8_share: float
    int8_math_nodes: int
    math_nodes: int
    fallback_nodes: int
    fallback: str
    engine_layers: int | None
    engine_bytes: int | None
    qdq_kernels: int | None
    reformat_layers: int | None
    cost_label: str = COST_LABEL

    @property
    def estimate(self) -> Estimate:
        return Estimate(self.metric, self.n_samples, self.metric_low, self.metric_high, self.interval_method)

    @property
    def label(self) -> str:
        """``plan 3 (search's pick): top1 0.9950 [0.9814, 0.9991] (n=400) · INT8 52/53 (98%) · 122 layers, 1.23 MB``."""
        star = " (search's pick)" if self.chosen_by_search else ""
        target = "" if self.meets_target else " · misses target"
        engine = (
            f" · {self.engine_layers} layers, {self.engine_bytes / 1e6:.2f} MB"
            if self.engine_layers is not None and self.engine_bytes is not None
            else " · engine not built"
        )
        return (
            f"plan {self.index}{star}: {self.metric_name} {self.estimate.text()} · INT8 "
            f"{self.int8_math_nodes}/{self.math_nodes} ({self.int8_share:.0%}){engine}{target}"
        )


@dataclass(frozen=True)
class MixedSearch(Artifact):
    """The quickstart's search stage: the search result, an interval per evaluated plan and the front's candidates."""

    result: MixedPrecisionResult
    intervals: tuple[Estimate, ...]  # one per ``result.evaluated``, same order
    front: tuple[PlanCandidate, ...]
    path: Path | None = None  # where the result's JSON was written
    how: str = SEARCH_HOW

    @property
    def chosen(self) -> PlanCandidate | None:
        """The search's pick among the front's candidates; None when another evaluated plan dominates it (a
        stepped-back revert can measure the same metric and INT8 share with a smaller engine)."""
        return next((c for c in self.front if c.chosen_by_search), None)

    def candidate(self, index: int) -> PlanCandidate:
        found = next((c for c in self.front if c.index == index), None)
        if found is None:
            from workbench.errors import WorkbenchError

            raise WorkbenchError(
                f"plan {index} is not on the Pareto front of this search.",
                expected="one of plans " + ", ".join(str(c.index) for c in self.front),
            )
        return found


def _candidate(result: MixedPrecisionResult, plan: EvaluatedPlan, interval: Estimate) -> PlanCandidate:
    cost = plan.cost
    return PlanCandidate(
        index=plan.index,
        metric_name=result.metric_name,
        metric=plan.metric,
        n_samples=interval.n,
        metric_low=interval.low,
        metric_high=interval.high,
        interval_method=interval.method,
        delta_vs_fp32=plan.metric - result.fp32_metric,
        higher_is_better=result.higher_is_better,
        meets_target=plan.meets_target,
        chosen_by_search=plan.chosen,
        int8_share=plan.int8_share,
        int8_math_nodes=plan.int8_math_nodes,
        math_nodes=plan.math_nodes,
        fallback_nodes=len(plan.fallback_nodes),
        fallback=result.fallback,
        engine_layers=cost.engine_layers if cost else None,
        engine_bytes=cost.engine_bytes if cost else None,
        qdq_kernels=cost.qdq_kernels if cost else None,
        reformat_layers=cost.reformat_layers if cost else None,
        cost_label=cost.label if cost else COST_LABEL,
    )


def plan_intervals(result: MixedPrecisionResult) -> tuple[Estimate, ...]:
    """The 95 % interval of every evaluated plan's metric (Wilson for right/wrong scores, else bootstrap)."""
    return tuple(
        estimate(p.metric, p.n_samples or result.evaluation_samples, p.scores)
        if not math.isnan(p.metric)
        else Estimate(p.metric, p.n_samples)
        for p in result.evaluated
    )


def plan_candidates(
    result: MixedPrecisionResult, intervals: tuple[Estimate, ...] | None = None
) -> tuple[PlanCandidate, ...]:
    """The front's plans (``result.front``), best metric first, each with its interval."""
    intervals = intervals or plan_intervals(result)
    candidates = [_candidate(result, p, intervals[p.index]) for p in result.front]
    sign = -1.0 if result.higher_is_better else 1.0
    return tuple(sorted(candidates, key=lambda c: (sign * c.metric, -c.int8_share, c.index)))


def mixed_search(result: MixedPrecisionResult, path: Path | None = None) -> MixedSearch:
    """The search stage's artifact: intervals for every plan and the front's candidates."""
    intervals = plan_intervals(result)
    return MixedSearch(result, intervals, plan_candidates(result, intervals), path)
