"""The typed record of one journey: a :class:`StageResult` per stage and one artifact per stage.

A stage's outcome is a :class:`StageStatus` with a separate ``reason`` (never a prefix of the summary text); every
engine the journey builds is one :class:`VariantBuild` (its ONNX, engine, plan and calibration cache), made only by a
build stage; :class:`Selection` points at one of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import TypeVar

from workbench.artifact import NOT_SERIALIZED, Artifact
from workbench.calib.diff import LayerDiff
from workbench.calib.qdq import QdqModel
from workbench.calib.rounding import WeightRounding
from workbench.calib.rounding_choice import RoundingChoice
from workbench.calib.stats import CalibrationRanges
from workbench.clean import CleanResult
from workbench.engine import EngineArtifact, FusionStats
from workbench.errors import WorkbenchError
from workbench.export import Bundle
from workbench.flow.config import QuickstartConfig
from workbench.flow.mixed import MixedSearch
from workbench.flow.rule import Choice
from workbench.flow.uncertainty import Estimate, estimate
from workbench.model import OnnxModel
from workbench.precision import PrecisionPlan
from workbench.precision.variant import PrecisionChoice, Variant, parse_variant
from workbench.timing import TimingResult

METRIC_HOW = (
    "ONNX Runtime CPU with graph optimizations off: Q/DQ as simulated quantization, the project's numeric "
    "reference; TensorRT engine outputs need a GPU"
)


class StageStatus(str, Enum):
    """How a stage ended. Only ``done`` has an artifact; every other status comes with a reason."""

    DONE = "done"
    FAILED = "failed"  # it raised a WorkbenchError (the reason is the message)
    OFF = "off"  # a setting turns it off (e.g. search_budget=0)
    NOT_APPLICABLE = "not_applicable"  # it cannot apply to this model (e.g. INT8 with nothing to quantize)
    BLOCKED = "blocked"  # it may not run: a stage it needs did not complete, or the verdict forbids it
    CANCELLED = "cancelled"  # the user cancelled it, before or while it ran (results cleared)
    PENDING = "pending"  # not run yet

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")


@dataclass(frozen=True)
class StageResult(Artifact):
    name: str
    title: str
    status: StageStatus
    seconds: float = 0.0
    summary: str = ""  # the one-line result of a done stage
    reason: str = ""  # why a stage is not done (and, for a blocked one, what to do instead)

    @property
    def ok(self) -> bool:
        return self.status is StageStatus.DONE

    @property
    def text(self) -> str:
        """The summary of a done stage, else its reason."""
        return self.summary if self.ok else self.reason


@dataclass(frozen=True)
class Environment(Artifact):
    backend: str
    backend_version: str
    gpu: str | None
    gpu_compute_capability: tuple[int, ...] | None


# --- one artifact per stage (the typed record the report and the panels read) -------------------------------------


@dataclass(frozen=True)
class Cleaning(Artifact):
    """The cleaning stage: what every pass did, and the cleaned model on disk."""

    result: CleanResult
    model: OnnxModel


@dataclass(frozen=True)
class Calibration(Artifact):
    """INT8 ranges, the all-INT8 Q/DQ model built from them, and where both were written."""

    method: str
    ranges: CalibrationRanges
    samples: int
    statistics_seconds: float
    cache_path: Path
    onnx_path: Path
    qdq_pairs: int
    weight_rounding: WeightRounding = (
        "nearest"  # nearest or gptq: the better task metric of the two (calibrate's default rule)
    )
    weight_rounding_note: str = ""  # what was measured to choose it
    grid_alignment: bool = False  # INT8 inputs on their pixel grid, non-negative activations shifted (calib.align)
    grid_alignment_note: str = ""  # what was measured to choose it (calibrate's default rule, with the rounding)
    quantized: QdqModel | None = field(default=None, metadata=NOT_SERIALIZED, repr=False)
    # what the rounding choice scored (its predictions on the evaluation samples): the search starts from that model
    rounding_choice: RoundingChoice | None = field(default=None, metadata=NOT_SERIALIZED, repr=False)


@dataclass(frozen=True)
class LayerDiffStage(Artifact):
    """The per-layer diff of the all-INT8 model against FP32 and the INT8 nodes ranked worst first."""

    diff: LayerDiff
    int8_nodes_worst_first: tuple[str, ...]
    path: Path


@dataclass(frozen=True)
class VariantBuild(Artifact):
    """One precision variant as built: the ONNX its metric is measured on, its engine, and what ships with it."""

    variant: Variant
    onnx_path: Path
    engine: EngineArtifact
    plan: PrecisionPlan | None = None  # the mixed plan (which nodes stay wider); None when every node is the same
    plan_path: Path | None = None  # the plan as JSON (for `workbench export --plan`)
    calibration_cache: Path | None = None  # the INT8 ranges of a quantized variant
    source: str = ""  # where it comes from, in words (e.g. "the mixed-precision search's plan 3")


@dataclass(frozen=True)
class MetricRow(Artifact):
    """The task metric of one precision variant, measured with ONNX Runtime CPU (optimizations off)."""

    variant: Variant
    onnx_path: str
    metric: str
    value: float
    n_samples: int
    higher_is_better: bool
    delta_vs_fp32: float = 0.0
    scores: tuple[float, ...] = field(default=(), repr=False)  # per sample, evaluation order (for intervals)

    def __post_init__(self) -> None:
        object.__setattr__(self, "variant", parse_variant(self.variant, "metric row variant"))

    @property
    def estimate(self) -> Estimate:
        """The value with its sample count and 95 % interval (Wilson for right/wrong scores, else bootstrap)."""
        return estimate(self.value, self.n_samples, self.scores)


@dataclass(frozen=True)
class Metrics(Artifact):
    rows: tuple[MetricRow, ...]
    not_measured: dict[Variant, str]  # why a variant has no row
    how: str = METRIC_HOW
    # variants whose metric the calibrate stage measured on the same file and samples in this run (not run again)
    from_calibration: tuple[Variant, ...] = ()

    def row(self, variant: Variant) -> MetricRow | None:
        return next((row for row in self.rows if row.variant is variant), None)

    @property
    def metric(self) -> str:
        return self.rows[0].metric if self.rows else "metric"


@dataclass(frozen=True)
class Selection(Artifact):
    """The built variant chosen for timing and export, and why (the rule's verdict)."""

    precision: PrecisionChoice  # as asked for (auto / fp32 / fp16 / int8)
    build: VariantBuild
    choice: Choice

    @property
    def variant(self) -> Variant:
        return self.build.variant

    @property
    def engine(self) -> EngineArtifact:
        return self.build.engine

    @property
    def onnx_path(self) -> Path:
        return self.build.onnx_path


@dataclass(frozen=True)
class Timing(Artifact):
    """Timing results (the chosen configuration first) and which executor ran them, and why that one."""

    results: tuple[TimingResult, ...]
    reason: str
    fixed_batch: int | None = None  # the model's graph hard-codes this batch: timed with streams, not batching

    @property
    def chosen(self) -> TimingResult:
        return self.results[0]

    def find(self, streams: int, batch: int) -> TimingResult | None:
        return next((r for r in self.results if r.streams == streams and r.batch == batch), None)


@dataclass(frozen=True)
class QuickstartRun(Artifact):
    """One journey: its config and environment, a result per stage, and each stage's typed artifact."""

    config: QuickstartConfig
    environment: Environment | None = None
    stages: dict[str, StageResult] = field(default_factory=dict)
    cleaning: Cleaning | None = None
    fp32_build: VariantBuild | None = None
    fusion: FusionStats | None = None
    fp16_build: VariantBuild | None = None
    calibration: Calibration | None = None
    int8_all_build: VariantBuild | None = None
    fp8_all_build: VariantBuild | None = None
    layer_diff: LayerDiffStage | None = None
    mixed_search: MixedSearch | None = None
    mixed_build: VariantBuild | None = None
    metrics: Metrics | None = None
    selection: Selection | None = None
    timing: Timing | None = None
    bundle: Bundle | None = None

    def stage(self, name: str) -> StageResult:
        if name not in self.stages:
            return StageResult(name, name.replace("_", " "), StageStatus.PENDING, reason="not run yet")
        return self.stages[name]

    @property
    def builds(self) -> dict[Variant, VariantBuild]:
        """Every variant a build stage built, keyed by variant."""
        found = (getattr(self, item.name) for item in fields(self))
        return {build.variant: build for build in found if isinstance(build, VariantBuild)}

    @property
    def search_pick(self) -> Variant | None:
        """The variant that is the mixed-precision search's pick: the mixed engine, or the all-INT8 one when the pick
        keeps no node wider (None when the search did not run)."""
        if self.mixed_search is None:
            return None
        return Variant.INT8_MIXED if self.mixed_search.result.chosen.fallback_nodes else Variant.INT8_ALL

    @property
    def fp32_engine(self) -> EngineArtifact | None:
        return self.fp32_build.engine if self.fp32_build else None

    @property
    def mixed_engine(self) -> EngineArtifact | None:
        return self.mixed_build.engine if self.mixed_build else None

    @property
    def chosen_variant(self) -> Variant | None:
        """The variant of the chosen engine (None until the select stage ran)."""
        return self.selection.variant if self.selection else None

    @property
    def chosen_metric(self) -> MetricRow | None:
        if self.metrics is None or self.selection is None:
            return None
        return self.metrics.row(self.selection.variant)

    @property
    def model_for_build(self) -> OnnxModel | None:
        """The cleaned model, or None when cleaning did not run (the shipped model is built then)."""
        return self.cleaning.model if self.cleaning else None


T = TypeVar("T")


def require(value: T | None, stage: str) -> T:
    """The artifact of an earlier stage; the runner's ``requires`` check makes a missing one a bug, said plainly."""
    if value is None:
        raise WorkbenchError(f"the {stage} stage has no result to build on.", expected=f"stage {stage} done first")
    return value
