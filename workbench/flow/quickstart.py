"""The quickstart journey over typed stage artifacts, one stage at a time.

clean -> build FP32 -> fusion view -> calibrate -> per-layer diff -> fall back worst layers -> build mixed engine
-> task metrics -> choose the engine -> time the pipeline -> export.

A :class:`QuickstartRun` is a frozen record: the config, one :class:`StageResult` (status, seconds, summary) per
stage, and one typed artifact per stage (``run.cleaning``, ``run.fp32_engine``, ``run.calibration`` ...). Each stage
is a plain function ``(run, workspace) -> artifact`` listed in :data:`STAGES` with the config fields it reads and the
stages it needs; :class:`QuickstartSession` re-runs only the stages a changed setting affects (the notebook panel
drives it). A stage whose input failed is "skipped"; a stage that raises a :class:`WorkbenchError` is "failed" and its
artifact is cleared, so nothing stale is shown next to a failure.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workbench._io import write_bytes_atomic
from workbench.artifact import NOT_SERIALIZED, Artifact
from workbench.calib.diff import LayerDiff
from workbench.calib.qdq import QdqModel
from workbench.calib.search import search_mixed_precision
from workbench.calib.session import CalibrationSession, Float16Model, worst_first_fallback
from workbench.calib.stats import CalibrationRanges
from workbench.clean import CleanOptions, CleanResult, clean_model
from workbench.engine import BuildOptions, EngineArtifact, FusionStats, detect_gpu, engine_from_onnx, engine_runnable
from workbench.engine.backend import get_backend
from workbench.errors import WorkbenchError
from workbench.export import Bundle, export_bundle
from workbench.flow.mixed import MixedSearch, mixed_search
from workbench.flow.rule import DEFAULT_MAX_DROP, Choice, choose
from workbench.flow.uncertainty import Estimate, estimate
from workbench.model import OnnxModel, load_onnx
from workbench.precision import PrecisionPlan, apply_precision_plan
from workbench.precision.qdq_rules import QUANTIZABLE_OPS
from workbench.precision.variant import (
    VARIANTS,
    CalibrationMethod,
    PrecisionChoice,
    Variant,
    parse_calibration_method,
    parse_precision_choice,
    parse_variant,
)
from workbench.timing import TimingResult, interactive_config, run_sweep, sweep_plan
from workbench.timing.executors import OrtCpuExecutor
from workbench.timing.limits import check_journey_batch, check_streams
from workbench.timing.trt_executor import TrtExecutor
from workbench.zoo import DEFAULT_MODEL, ZooEntry, get_entry

STATUSES = ("done", "skipped", "failed")


class StageOff(WorkbenchError):
    """Raised by a stage that the session's settings turn off: the stage is shown as skipped, not as failed."""


class StageNotApplicable(WorkbenchError):
    """Raised by a stage that cannot apply to this model (e.g. INT8 with nothing to quantize): shown as skipped with
    the reason, not as failed; the stages that need it are skipped too."""


CALIBRATION_BATCH = 8
METRIC_HOW = (
    "ONNX Runtime CPU with graph optimizations off: Q/DQ as simulated quantization, the project's numeric "
    "reference; TensorRT engine outputs need a GPU"
)

# (stage, index, total, message) before each stage; returning False cancels the stages not yet run
ProgressFn = Callable[[str, int, int, str], object]
ResultFn = Callable[["StageResult", int, int], None]  # (result, index, total) after each stage


@dataclass(frozen=True)
class QuickstartConfig(Artifact):
    """Every setting the panel's widgets control, with built-in defaults that run in well under a minute on CPU."""

    model: str = DEFAULT_MODEL
    precision: PrecisionChoice = "auto"
    calibration_method: CalibrationMethod = "entropy"
    streams: int = 2
    batch: int = 8
    calibration_samples: int = 128  # rounded up to whole batches of CALIBRATION_BATCH
    diff_samples: int = 32
    evaluation_samples: int = 450  # capped by the model's evaluation split (ocr-cls 400, digits-cnn 450)
    fallback_layers: int = 2
    # task evaluations the accuracy-target mixed-precision search may use (target: FP32 minus max_metric_drop);
    # 0 turns the search off. The default models meet the target within 1-2 evaluations (a few seconds).
    search_budget: int = 8
    max_metric_drop: float = DEFAULT_MAX_DROP  # the task-metric loss vs FP32 an engine may have and still be chosen
    timing_window_s: float = 0.25
    sweep: bool = True  # also time streams=1 and batch=1 so the diagnosis can say whether streams/batching help
    out_dir: str = "out"
    # your own ONNX file only: a folder of .npz batches keyed by input name (first half calibrates, second evaluates);
    # empty = seeded random inputs
    data: str = ""
    export: bool = True  # the export stage writes a bundle (a new folder under <out_dir>/export each run)

    def __post_init__(self) -> None:
        self._check_types()
        parse_precision_choice(self.precision)
        parse_calibration_method(self.calibration_method)
        check_streams(self.streams)
        check_journey_batch(self.batch)
        for name in ("calibration_samples", "diff_samples", "evaluation_samples"):
            if int(getattr(self, name)) < 1:
                raise WorkbenchError(f"{name}={getattr(self, name)} must be at least 1.")
        if not 0 <= int(self.search_budget) <= 64:
            raise WorkbenchError(f"search_budget={self.search_budget} is out of range.", expected="0 (off) ..64")
        if not 0 <= int(self.fallback_layers) <= 64:
            raise WorkbenchError(f"fallback_layers={self.fallback_layers} is out of range.", expected="0..64")
        if not (isinstance(self.max_metric_drop, (int, float)) and 0 <= self.max_metric_drop <= 1):
            raise WorkbenchError(f"max_metric_drop={self.max_metric_drop} is out of range.", expected="0..1")
        if not (isinstance(self.timing_window_s, (int, float)) and math.isfinite(self.timing_window_s)) or not (
            self.timing_window_s > 0
        ):
            raise WorkbenchError(f"timing_window_s={self.timing_window_s} must be a positive number of seconds.")

    def _check_types(self) -> None:
        """A setting of the wrong type ('2' for streams, 2.5 samples, 'no' for a switch) is refused, not coerced."""
        import numbers

        for name, kind in (
            ("streams", int),
            ("batch", int),
            ("calibration_samples", int),
            ("diff_samples", int),
            ("evaluation_samples", int),
            ("fallback_layers", int),
            ("search_budget", int),
            ("max_metric_drop", float),
            ("timing_window_s", float),
            ("sweep", bool),
            ("export", bool),
            ("model", str),
        ):
            value = getattr(self, name)
            if kind is bool:
                ok = isinstance(value, bool)
            elif kind is int:
                ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            elif kind is float:
                ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
            else:
                ok = isinstance(value, str) and bool(value)
            if not ok:
                article = {int: "an integer", float: "a number", bool: "True or False", str: "a non-empty string"}
                raise WorkbenchError(
                    f"{name}={value!r} ({type(value).__name__}) is not {article[kind]}.",
                    expected=f"{name} as {article[kind]}",
                )
        if not isinstance(self.data, str):
            raise WorkbenchError(
                f"data={self.data!r} ({type(self.data).__name__}) is not a folder path string.",
                expected='data as a string: a folder of .npz batches, or "" for seeded random inputs',
            )
        if not isinstance(self.out_dir, (str, os.PathLike)) or not str(self.out_dir):
            raise WorkbenchError(
                f"out_dir={self.out_dir!r} is not a folder path.", expected="out_dir as a string or pathlib.Path"
            )

    def validated(self, **changes: Any) -> QuickstartConfig:
        """This config with ``changes``; an unknown setting or a value out of range raises (nothing is clamped)."""
        unknown = set(changes) - set(QuickstartConfig.__dataclass_fields__)
        if unknown:
            raise WorkbenchError(
                f"unknown quickstart setting(s) {sorted(unknown)}.",
                expected=", ".join(QuickstartConfig.__dataclass_fields__),
            )
        return replace(self, **changes)


@dataclass(frozen=True)
class StageResult(Artifact):
    name: str
    title: str
    status: str  # one of STATUSES
    seconds: float = 0.0
    summary: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "done"


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
    quantized: QdqModel | None = field(default=None, metadata=NOT_SERIALIZED, repr=False)


@dataclass(frozen=True)
class LayerDiffStage(Artifact):
    """The per-layer diff of the all-INT8 model against FP32 and the INT8 nodes ranked worst first."""

    diff: LayerDiff
    int8_nodes_worst_first: tuple[str, ...]
    path: Path


@dataclass(frozen=True)
class Fallback(Artifact):
    """The mixed plan (worst INT8 nodes back in FP32) and its Q/DQ model."""

    plan: PrecisionPlan
    onnx_path: Path
    qdq_pairs_all_int8: int
    qdq_pairs_mixed: int
    quantized: QdqModel | None = field(default=None, metadata=NOT_SERIALIZED, repr=False)


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

    def row(self, variant: Variant) -> MetricRow | None:
        return next((row for row in self.rows if row.variant == variant), None)

    @property
    def metric(self) -> str:
        return self.rows[0].metric if self.rows else "metric"


@dataclass(frozen=True)
class Selection(Artifact):
    """The engine chosen for timing and export, the ONNX it was built from (what the metric measured), and why."""

    precision: PrecisionChoice  # as asked for (auto / fp32 / fp16 / int8)
    engine: EngineArtifact
    onnx_path: Path
    variant: Variant  # the task-metric variant of that engine
    choice: Choice


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
    fp32_engine: EngineArtifact | None = None
    fusion: FusionStats | None = None
    calibration: Calibration | None = None
    layer_diff: LayerDiffStage | None = None
    fallback: Fallback | None = None
    mixed_engine: EngineArtifact | None = None
    metrics: Metrics | None = None
    mixed_search: MixedSearch | None = None
    selection: Selection | None = None
    timing: Timing | None = None
    bundle: Bundle | None = None

    def stage(self, name: str) -> StageResult:
        if name not in self.stages:
            return StageResult(name, STAGE_BY_NAME[name].title, "skipped", summary="not run yet")
        return self.stages[name]

    @property
    def chosen_variant(self) -> Variant | None:
        """The task-metric variant of the chosen engine (None until the select stage ran)."""
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


# --- the workspace: the zoo entry, output paths, and caches kept between re-runs (not part of the record) ---------


def quickstart_entry(model: str, data: str = "") -> ZooEntry:
    """The entry the quickstart runs on: a zoo model by name, or an ONNX file (a path) as an
    :class:`~workbench.zoo.onnx_file.OnnxFileEntry`: seeded random inputs, or the ``.npz`` batches in ``data``;
    metric = output cosine vs its FP32."""
    if model.endswith(".onnx") or "/" in model or os.sep in model or Path(model).is_file():
        from workbench.zoo.onnx_file import OnnxFileEntry

        return OnnxFileEntry(model, data=data or None)
    if data:
        raise WorkbenchError(
            f"data={data!r} was given for the zoo model {model!r}, which brings its own data set.",
            expected="data only with your own ONNX file (a path), or no data for a zoo model",
        )
    return get_entry(model)


class Workspace:
    """What the stages share besides the run record: the zoo entry, output paths and reusable state."""

    def __init__(self, config: QuickstartConfig) -> None:
        self.entry: ZooEntry = quickstart_entry(config.model, config.data)
        self.model_name = config.model
        self.data = config.data
        self.file_stem = self.entry.name  # names the output files (an ONNX path's stem, or the zoo name)
        self.out = Path(config.out_dir)
        from workbench._io import validate_outputs

        # before any stage runs: a file, FIFO or read-only folder given as out_dir is a message, not an OSError later
        validate_outputs({"out_dir": self.out}, directories=("out_dir",), overwrite=True, is_ours=lambda path: True)
        self._calibration: tuple[tuple[str, int], CalibrationSession] | None = None
        self._fp16: dict[str, Any] = {}
        self._int8_all: EngineArtifact | None = None

    def path(self, suffix: str) -> Path:
        return self.out / f"{self.file_stem}.{suffix}"

    def build_options(self, **overrides: Any) -> BuildOptions:
        return BuildOptions(shapes=dict(self.entry.input_profiles()), progress=False, **overrides)

    def source_model(self, run: QuickstartRun) -> OnnxModel:
        """The cleaned model, or the zoo model as shipped when the cleaning stage did not run."""
        return run.model_for_build or self.entry.load()

    def calibration_session(self, run: QuickstartRun) -> CalibrationSession:
        """One session per (model, calibration samples): its statistics are reused across range methods."""
        model = self.source_model(run)
        key = (model.sha256, run.config.calibration_samples)
        if self._calibration is None or self._calibration[0] != key:
            session = CalibrationSession(
                model, entry=self.entry, max_batches=_batches(run.config.calibration_samples), progress=False
            )
            self._calibration = (key, session)
        return self._calibration[1]

    def fp16_onnx(self, run: QuickstartRun) -> Path:
        """The model with FP16 compute (AutoCast rules), as the FP16 engine is built from it."""
        model = self.source_model(run)
        path = self.path("fp16.onnx")
        if self._fp16.get("onnx_source") != model.sha256 or not path.is_file():
            apply_precision_plan(model, PrecisionPlan(default="fp16")).save(path)
            self._fp16["onnx_source"] = model.sha256
        return path

    def int8_all_engine(self, run: QuickstartRun) -> EngineArtifact:
        """The engine of the all-INT8 Q/DQ model (built on first use, kept while the calibration is the same)."""
        calibration = _result_of(run.calibration, "calibrate")
        model = load_onnx(calibration.onnx_path)
        engine = self._int8_all
        if engine is None or engine.onnx_sha256 != model.sha256:
            engine = engine_from_onnx(model, self.path("int8-all.engine"), self.build_options(precision="int8"))
            self._int8_all = engine
        return engine

    def fp16_engine(self, run: QuickstartRun) -> EngineArtifact:
        model = self.source_model(run)
        engine = self._fp16.get("engine")
        if engine is None or engine.onnx_sha256 != model.sha256:
            engine = engine_from_onnx(model, self.path("fp16.engine"), self.build_options(precision="fp16"))
            self._fp16["engine"] = engine
        return engine


def _batches(samples: int) -> int:
    """Calibration sources count batches; the config counts samples."""
    return max(1, -(-int(samples) // CALIBRATION_BATCH))


def _result_of(value: Any, stage: str) -> Any:
    """The artifact of an earlier stage; the runner's REQUIRES check makes a missing one a bug, said plainly."""
    if value is None:
        raise WorkbenchError(f"the {stage} stage has no result to build on.", expected=f"stage {stage} done first")
    return value


# --- the stages: (run, workspace) -> that stage's artifact -------------------------------------------------------


def stage_clean(run: QuickstartRun, ws: Workspace) -> Cleaning:
    profile = {name: list(rng) for name, rng in ws.entry.input_profiles().items()}
    result = clean_model(ws.entry.onnx_path(), CleanOptions(profile=profile))
    path = ws.path("clean.onnx")
    write_bytes_atomic(path, result.model.SerializeToString())
    return Cleaning(result, load_onnx(path))


def stage_build_fp32(run: QuickstartRun, ws: Workspace) -> EngineArtifact:
    return engine_from_onnx(ws.source_model(run), ws.path("fp32.engine"), ws.build_options())


def stage_fusion(run: QuickstartRun, ws: Workspace) -> FusionStats:
    return _result_of(run.fp32_engine, "build_fp32").layer_map.stats()


def stage_calibrate(run: QuickstartRun, ws: Workspace) -> Calibration:
    cfg = run.config
    source = ws.source_model(run).proto.graph
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
    ranges = session.ranges(cfg.calibration_method)
    statistics = session.statistics()
    cache, onnx_path = ws.path("calib.json"), ws.path("int8-all.onnx")
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
        quantized=quantized,
    )


def stage_layer_diff(run: QuickstartRun, ws: Workspace) -> LayerDiffStage:
    calibration = _result_of(run.calibration, "calibrate")
    session = ws.calibration_session(run)
    diff = session.diff(calibration.quantized, max_batches=_batches(run.config.diff_samples))
    path = ws.path("layer-diff.json")
    diff.save(path)
    return LayerDiffStage(diff, tuple(session.rank_int8_nodes(diff)), path)


def stage_fallback(run: QuickstartRun, ws: Workspace) -> Fallback:
    calibration = _result_of(run.calibration, "calibrate")
    worst = _result_of(run.layer_diff, "layer_diff").int8_nodes_worst_first
    if len(worst) < 2:
        raise StageNotApplicable(
            f"the all-INT8 model has {len(worst)} INT8 node(s): keeping the worst in FP32 would leave no INT8 to mix"
        )
    nodes = worst_first_fallback(worst, run.config.fallback_layers)
    session = ws.calibration_session(run)
    plan = replace(
        session.fallback_plan(nodes, "fp32"), note=f"worst {len(nodes)} INT8 layer(s) of the per-layer diff kept FP32"
    )
    quantized = session.quantize(calibration.ranges, plan)
    path = ws.path("int8-mixed.onnx")
    quantized.save(path)
    return Fallback(plan, path, calibration.qdq_pairs, quantized.counts().get("QuantizeLinear", 0), quantized)


def stage_build_mixed(run: QuickstartRun, ws: Workspace) -> EngineArtifact:
    fallback = _result_of(run.fallback, "fallback")
    return engine_from_onnx(
        load_onnx(fallback.onnx_path), ws.path("int8-mixed.engine"), ws.build_options(precision="int8")
    )


def stage_metrics(run: QuickstartRun, ws: Workspace) -> Metrics:
    variants: list[tuple[Variant, Path]] = [(Variant.FP32, ws.source_model(run).path)]
    not_measured: dict[Variant, str] = {}
    try:
        variants.append((Variant.FP16, ws.fp16_onnx(run)))
    except WorkbenchError as error:
        not_measured[Variant.FP16] = str(error)
    if run.calibration is not None:
        variants.append((Variant.INT8_ALL, run.calibration.onnx_path))
    if run.fallback is not None:
        variants.append((Variant.INT8_MIXED, run.fallback.onnx_path))
    measured = []
    for variant, path in variants:
        try:
            measured.append((variant, path, ws.entry.evaluate_onnx(path, limit=run.config.evaluation_samples)))
        except WorkbenchError as error:
            not_measured[variant] = str(error)
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
        return Metrics(rows, not_measured, how=f"{METRIC_HOW}; {ws.entry.inputs_note}{notes}")
    return Metrics(rows, not_measured)


def stage_search(run: QuickstartRun, ws: Workspace) -> MixedSearch:
    """The accuracy-target search (most INT8 whose metric is within ``max_metric_drop`` of FP32) from this run's
    calibration ranges, every plan's engine built for its structure; the JSON goes to ``<model>.mixed.json``."""
    cfg = run.config
    if cfg.search_budget == 0:
        raise StageOff("the mixed-precision search is off (search_budget=0)", expected="search_budget 1..64 to run it")
    calibration = _result_of(run.calibration, "calibrate")
    result = search_mixed_precision(
        ws.calibration_session(run),
        ranges=calibration.ranges,
        target_drop=cfg.max_metric_drop,
        budget=cfg.search_budget,
        limit=cfg.evaluation_samples,
    )
    path = ws.path("mixed.json")
    result.save(path)
    return mixed_search(result, path)


def stage_select(run: QuickstartRun, ws: Workspace) -> Selection:
    """The engine of the requested precision ("auto": the rule's pick), with the verdict on its task metric."""
    available = (
        [Variant.FP32, Variant.FP16]
        + ([Variant.INT8_ALL] if run.calibration else [])
        + ([Variant.INT8_MIXED] if run.mixed_engine else [])
    )
    if run.config.precision == "int8" and not {Variant.INT8_ALL, Variant.INT8_MIXED} & set(available):
        raise WorkbenchError(
            "the INT8 engine was not built (see the calibration stages above).",
            expected="precision fp32, fp16 or auto until calibration works",
        )
    rows = run.metrics.rows if run.metrics else ()
    choice = choose(rows, run.config.precision, run.config.max_metric_drop, available=available)
    variant = choice.variant
    if variant is Variant.FP32:
        engine = _result_of(run.fp32_engine, "build_fp32")
        return Selection(run.config.precision, engine, ws.source_model(run).path, variant, choice)
    if variant is Variant.FP16:
        onnx_path = ws.fp16_onnx(run)
        return Selection(run.config.precision, ws.fp16_engine(run), onnx_path, variant, choice)
    if variant is Variant.INT8_ALL:
        calibration = _result_of(run.calibration, "calibrate")
        return Selection(run.config.precision, ws.int8_all_engine(run), calibration.onnx_path, variant, choice)
    fallback = _result_of(run.fallback, "fallback")
    return Selection(
        run.config.precision, _result_of(run.mixed_engine, "build_mixed"), fallback.onnx_path, variant, choice
    )


def _executor_for(selection: Selection, ws: Workspace) -> tuple[Any, str]:
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
    executor, reason = _executor_for(_result_of(run.selection, "select"), ws)
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


def new_export_dir(run: QuickstartRun, root: Path, variant: Variant | str | None = None) -> Path:
    """A folder no export has used: ``<root>/<model>-<variant>-<UTC time>`` (``-2``, ``-3`` ... within one second);
    ``variant`` defaults to the chosen engine's."""
    variant = variant or _result_of(run.selection, "select").variant
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = Path(run.config.model).stem if run.config.model.endswith(".onnx") else run.config.model
    base = root / f"{name.replace(os.sep, '_')}-{variant}-{stamp}"
    path, suffix = base, 2
    while path.exists():
        path, suffix = base.with_name(f"{base.name}-{suffix}"), suffix + 1
    return path


def export_selection(run: QuickstartRun, output_dir: str | Path | None = None, *, overwrite: bool = False) -> Bundle:
    """Export the chosen engine with its accuracy and timing: into ``output_dir``, or a new folder under the run's
    ``<out_dir>/export`` (so exports never replace each other); an existing ``output_dir`` needs ``overwrite``."""
    selection = _result_of(run.selection, "select")
    int8 = VARIANTS[selection.variant].quantized and run.calibration is not None
    mixed = VARIANTS[selection.variant].mixed and run.fallback is not None
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
        }
        accuracy.pop("scores", None)
    return export_bundle(
        selection.engine,
        target,
        overwrite=overwrite,
        plan=run.fallback.plan if mixed and run.fallback else None,
        calibration_cache=run.calibration.cache_path if int8 and run.calibration else None,
        accuracy=accuracy,
        timing=timing.chosen.to_json() | {"how": timing.reason} if timing else None,
    )


def stage_export(run: QuickstartRun, ws: Workspace) -> Bundle:
    if not run.config.export:
        raise StageOff("export is off for this session (export=False): export from the panel's button")
    return export_selection(run)


# --- what each stage reports in one line ----------------------------------------------------------------------------


def _summary_clean(cleaning: Cleaning, run: QuickstartRun) -> str:
    result = cleaning.result
    accepted = [p.name for p in result.passes if p.changed]
    return (
        f"{result.nodes_before} ONNX nodes (raw graph) -> {result.nodes_after} (cleaned graph), {len(accepted)} pass(es) changed "
        f"the graph, {len(result.rolled_back)} rolled back"
    )


def _summary_engine(artifact: EngineArtifact, run: QuickstartRun) -> str:
    by_precision = ", ".join(f"{k} {v}" for k, v in sorted(artifact.summary()["by_precision"].items()))
    return (
        f"{artifact.onnx_node_count} ONNX nodes of {Path(artifact.onnx_path).name} (the graph built) -> "
        f"{artifact.layer_count} engine layers ({by_precision}) in "
        f"{artifact.build_seconds:.1f} s ({artifact.backend} {artifact.backend_version})"
    )


def _summary_fusion(stats: FusionStats, run: QuickstartRun) -> str:
    fused = sum(count for size, count in stats.group_sizes.items() if size > 1)
    return (
        f"{stats.engine_layers} engine layers; {fused} of them fuse 2+ ONNX nodes; {stats.folded_nodes} of "
        f"{stats.onnx_nodes} ONNX nodes map to no layer (folded or metadata-less)"
    )


def _summary_calibrate(calibration: Calibration, run: QuickstartRun) -> str:
    text = (
        f"{calibration.method} ranges for {len(calibration.ranges.amax)} tensors from {calibration.samples} samples; "
        f"{calibration.qdq_pairs} Q/DQ pairs inserted"
    )
    notes = calibration.ranges.range_notes
    if notes:  # ranges the guard changed (dead tensors, a method's range that clipped most of the data)
        first, note = next(iter(notes.items()))
        text += f"; {len(notes)} range(s) not the method's own choice, e.g. {first!r}: {note}"
    return text


def _summary_layer_diff(stage: LayerDiffStage, run: QuickstartRun) -> str:
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


def _summary_fallback(fallback: Fallback, run: QuickstartRun) -> str:
    nodes = [name for name, precision in fallback.plan.overrides.items() if precision == "fp32"]
    return (
        f"{len(nodes)} layer(s) back to FP32: {', '.join(nodes) or 'none'}; Q/DQ pairs "
        f"{fallback.qdq_pairs_all_int8} -> {fallback.qdq_pairs_mixed}"
    )


def _summary_metrics(metrics: Metrics, run: QuickstartRun) -> str:
    text = "; ".join(f"{row.variant} {row.value:.4f}" for row in metrics.rows)
    return f"{metrics.metric} (ONNX Runtime CPU): {text}"


def _summary_search(search: MixedSearch, run: QuickstartRun) -> str:
    result = search.result
    chosen = search.intervals[result.chosen.index]
    return (
        f"{result.metric_name} {chosen.text()} with INT8 {result.int8_math_nodes}/{result.math_nodes} math nodes "
        f"(target {result.target:.4f}: {'met' if result.met else 'NOT met'}); {result.evaluations_used} plan(s) "
        f"evaluated, {len(search.front)} on the Pareto front; stopped: {result.stop_reason}"
    )


def _summary_select(selection: Selection, run: QuickstartRun) -> str:
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
    return text + ("" if choice.ok else f". WARNING: {choice.reason}")


def _summary_timing(timing: Timing, run: QuickstartRun) -> str:
    chosen = timing.chosen
    return (
        f"{chosen.executor} executor, {chosen.streams} stream(s) x batch {chosen.batch}: "
        f"{chosen.throughput_per_s:.0f} samples/s, p50 {chosen.latency_ms.get('p50', math.nan):.2f} ms. {timing.reason}"
    )


def _summary_export(bundle: Bundle, run: QuickstartRun) -> str:
    files = sorted(str(p.relative_to(bundle.path)) for p in bundle.path.rglob("*") if p.is_file())
    return f"{run.config.precision} engine bundle in {bundle.path}: {', '.join(files)}"


@dataclass(frozen=True)
class Stage:
    """One step of the journey: what it is called, which settings it reads, what it needs, what it makes."""

    name: str
    title: str
    reads: tuple[str, ...]  # config fields the stage reads directly
    requires: tuple[str, ...]  # stages that must be done first
    field: str  # the QuickstartRun field its artifact goes to
    run: Callable[[QuickstartRun, Workspace], Any]
    summary: Callable[[Any, QuickstartRun], str]  # (its artifact, the run including it) -> one line


STAGES: tuple[Stage, ...] = (
    Stage("clean", "Clean the ONNX graph", ("model",), (), "cleaning", stage_clean, _summary_clean),
    Stage("build_fp32", "Build the FP32 engine", (), (), "fp32_engine", stage_build_fp32, _summary_engine),
    Stage("fusion", "Fusion view", (), ("build_fp32",), "fusion", stage_fusion, _summary_fusion),
    Stage(
        "calibrate",
        "Calibrate INT8 ranges",
        ("calibration_method", "calibration_samples"),
        (),
        "calibration",
        stage_calibrate,
        _summary_calibrate,
    ),
    Stage(
        "layer_diff",
        "Per-layer INT8 diff",
        ("diff_samples",),
        ("calibrate",),
        "layer_diff",
        stage_layer_diff,
        _summary_layer_diff,
    ),
    Stage(
        "fallback",
        "Fall back the worst layers to FP32",
        ("fallback_layers",),
        ("layer_diff",),
        "fallback",
        stage_fallback,
        _summary_fallback,
    ),
    Stage(
        "build_mixed",
        "Build the mixed-precision engine",
        (),
        ("fallback",),
        "mixed_engine",
        stage_build_mixed,
        _summary_engine,
    ),
    Stage(
        "metrics", "Task metric per precision", ("evaluation_samples",), (), "metrics", stage_metrics, _summary_metrics
    ),
    Stage(
        "search",
        "Mixed-precision search (accuracy target)",
        ("search_budget", "max_metric_drop", "evaluation_samples"),
        ("calibrate",),
        "mixed_search",
        stage_search,
        _summary_search,
    ),
    Stage(
        "select",
        "Choose the engine",
        ("precision", "max_metric_drop"),
        ("build_fp32",),
        "selection",
        stage_select,
        _summary_select,
    ),
    Stage(
        "timing",
        "Time the pipeline",
        ("streams", "batch", "timing_window_s", "sweep"),
        ("select",),
        "timing",
        stage_timing,
        _summary_timing,
    ),
    Stage("export", "Export the chosen engine", ("export",), ("select",), "bundle", stage_export, _summary_export),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}


def run_stage(run: QuickstartRun, name: str, ws: Workspace) -> QuickstartRun:
    """Run one stage and return the new record: its artifact set (or cleared on failure) and its StageResult."""
    stage = STAGE_BY_NAME[name]
    missing = [dep for dep in stage.requires if not run.stage(dep).ok]
    artifact = None
    if missing and all(run.stage(dep).summary.startswith("not applicable") for dep in missing):
        # a stage built on one that does not apply to this model does not apply either: say so, not "did not complete"
        result = StageResult(
            name,
            stage.title,
            "skipped",
            summary=f"not applicable: needs stage {', '.join(missing)}, which does not apply",
        )
    elif missing:
        result = StageResult(
            name, stage.title, "skipped", summary=f"needs stage {', '.join(missing)}, which did not complete"
        )
    else:
        started = time.perf_counter()
        try:
            artifact = stage.run(run, ws)
        except StageOff as off:
            result = StageResult(name, stage.title, "skipped", 0.0, f"off: {off}")
        except StageNotApplicable as reason:
            result = StageResult(name, stage.title, "skipped", 0.0, f"not applicable: {reason}")
        except WorkbenchError as error:
            result = StageResult(name, stage.title, "failed", time.perf_counter() - started, str(error))
        else:
            seconds = time.perf_counter() - started
            with_artifact = replace(run, **{stage.field: artifact})
            text = stage.summary(artifact, with_artifact)
            result = StageResult(name, stage.title, "done", seconds, text)
    return replace(run, **{stage.field: artifact, "stages": {**run.stages, name: result}})


def cancel_stages(run: QuickstartRun, names: Iterable[str]) -> QuickstartRun:
    """Mark ``names`` skipped ("cancelled") and clear their artifacts: a cancelled run shows no stale result."""
    fields: dict[str, Any] = {}
    stages = dict(run.stages)
    for name in names:
        stage = STAGE_BY_NAME[name]
        fields[stage.field] = None
        stages[name] = StageResult(name, stage.title, "skipped", summary="cancelled before this stage ran")
    return replace(run, stages=stages, **fields)


def _environment() -> Environment:
    backend = get_backend()
    gpu = detect_gpu()
    return Environment(
        backend.name,
        backend.version,
        gpu.name if gpu.present else None,
        tuple(gpu.compute_capability) if gpu.compute_capability else None,
    )


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
        self.workspace: Workspace | None = None

    def prepare(self) -> Workspace:
        """The workspace of the current model and output folder (a new model or folder starts a new record)."""
        return self._prepare()

    def _prepare(self) -> Workspace:
        if (
            self.workspace is None
            or self.workspace.model_name != self.config.model
            or self.workspace.data != self.config.data  # other samples: new calibration, metrics, everything
            or (self.workspace.out != Path(self.config.out_dir))
        ):
            self.workspace = Workspace(self.config)
            self.run = QuickstartRun(self.config)
        if self.run.environment is None:
            self.run = replace(self.run, environment=_environment())
        return self.workspace

    def run_all(self) -> QuickstartRun:
        return self.run_from(STAGE_NAMES[0])

    def run_from(self, first: str) -> QuickstartRun:
        ws = self._prepare()
        names = STAGE_NAMES[STAGE_NAMES.index(first) :]
        for index, name in enumerate(names):
            if self.progress and self.progress(name, index, len(names), STAGE_BY_NAME[name].title) is False:
                self.run = cancel_stages(self.run, names[index:])  # nothing from the old settings stays
                return self.run
            self.run = run_stage(self.run, name, ws)
            if self.on_result:
                self.on_result(self.run.stages[name], index, len(names))
        if self.progress:
            self.progress("done", len(names), len(names), "finished")
        return self.run

    def run_stages(self, names: Iterable[str]) -> QuickstartRun:
        """Run the named stages (in journey order) on the current record, e.g. select + timing for another precision."""
        ws = self._prepare()
        for name in (n for n in STAGE_NAMES if n in set(names)):
            self.run = run_stage(self.run, name, ws)
        return self.run

    def update(self, **changes: Any) -> QuickstartRun:
        """Apply new settings and re-run from the first stage that reads any of them."""
        new = self.config.validated(**changes)
        changed = {key for key, value in changes.items() if getattr(self.config, key) != value}
        self.config = new
        self.run = replace(self.run, config=new)
        if not changed:
            return self.run
        if WHOLE_RUN_SETTINGS & changed or not self.run.stages:
            return self.run_from(STAGE_NAMES[0])
        return self.run_from(first_affected_stage(changed))


# settings every stage depends on (a new workspace): no stage lists them among what it reads
WHOLE_RUN_SETTINGS = frozenset({"model", "data", "out_dir"})


def first_affected_stage(changed: Iterable[str]) -> str:
    changed = set(changed)
    if changed & WHOLE_RUN_SETTINGS:
        return STAGE_NAMES[0]
    for stage in STAGES:
        if changed & set(stage.reads):
            return stage.name
    return STAGE_NAMES[-1]


def run_quickstart(
    config: QuickstartConfig | None = None, progress: ProgressFn | None = None, on_result: ResultFn | None = None
) -> QuickstartRun:
    """Run the whole journey headless and return its results."""
    return QuickstartSession(config, progress, on_result).run_all()
