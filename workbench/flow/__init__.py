"""The quickstart journey: every stage in order over typed artifacts, re-running only what a changed setting affects."""

from workbench.flow.choose import EngineCandidate, compare_precisions, export_plan, front_candidates, recommend
from workbench.flow.mixed import MixedSearch, PlanCandidate, mixed_search
from workbench.flow.quickstart import (
    STAGE_NAMES,
    STAGES,
    Calibration,
    Cleaning,
    Fallback,
    LayerDiffStage,
    MetricRow,
    Metrics,
    QuickstartConfig,
    QuickstartRun,
    QuickstartSession,
    Selection,
    StageResult,
    Timing,
    export_selection,
    run_quickstart,
)
from workbench.flow.rule import Choice, choose
from workbench.precision.variant import PRECISION_CHOICES

__all__ = [
    "PRECISION_CHOICES",
    "STAGES",
    "STAGE_NAMES",
    "Calibration",
    "Choice",
    "Cleaning",
    "EngineCandidate",
    "MixedSearch",
    "PlanCandidate",
    "Fallback",
    "LayerDiffStage",
    "MetricRow",
    "Metrics",
    "QuickstartConfig",
    "QuickstartRun",
    "QuickstartSession",
    "Selection",
    "StageResult",
    "Timing",
    "choose",
    "compare_precisions",
    "recommend",
    "export_plan",
    "export_selection",
    "front_candidates",
    "mixed_search",
    "run_quickstart",
]
