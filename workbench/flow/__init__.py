"""The quickstart journey: every stage in order over typed artifacts, re-running only what a changed setting affects.

``config`` (the settings), ``artifacts`` (the typed record), ``workspace`` (entry, paths, caches), ``stages`` (each
stage beside its summary), ``session`` (re-runs what a change affects); ``rule`` chooses, ``mixed`` and ``choose``
serve the export panel.
"""

from workbench.flow.artifacts import (
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
from workbench.flow.choose import EngineCandidate, compare_precisions, export_plan, front_candidates, recommend
from workbench.flow.config import QuickstartConfig
from workbench.flow.mixed import MixedSearch, PlanCandidate, mixed_search
from workbench.flow.rule import Choice, choose
from workbench.flow.session import QuickstartSession, UpdatePlan, run_quickstart
from workbench.flow.stages import STAGE_BY_NAME, STAGE_NAMES, STAGES, export_command, export_selection, run_stage
from workbench.flow.workspace import quickstart_entry
from workbench.precision.variant import PRECISION_CHOICES

__all__ = [
    "PRECISION_CHOICES",
    "STAGES",
    "STAGE_BY_NAME",
    "STAGE_NAMES",
    "Calibration",
    "Choice",
    "Cleaning",
    "EngineCandidate",
    "LayerDiffStage",
    "MetricRow",
    "Metrics",
    "MixedSearch",
    "PlanCandidate",
    "QuickstartConfig",
    "QuickstartRun",
    "QuickstartSession",
    "Selection",
    "StageResult",
    "StageStatus",
    "Timing",
    "UpdatePlan",
    "VariantBuild",
    "choose",
    "compare_precisions",
    "export_command",
    "export_plan",
    "export_selection",
    "front_candidates",
    "mixed_search",
    "quickstart_entry",
    "recommend",
    "require",
    "run_quickstart",
    "run_stage",
]
