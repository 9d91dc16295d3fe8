"""Accuracy-target mixed precision: the most INT8 that keeps the task metric within an allowed drop.

NNCF's accuracy-control loop, over groups that follow the engine's fusions (:mod:`.groups`):

1. evaluate the all-INT8 plan on the task metric; stop if it meets the target (with ``confidence``: at the low end
   of its interval paired with FP32); if not, first try every residual Add's skip input out of 8 bits (the math ops
   stay 8-bit: TensorRT-RTX fuses the Add into the Conv's epilogue either way);
2. rank the INT8 groups by the damage of the *current* plan attributed to them, summed over the group: by the
   per-layer diff (``ranking="diff"``, :meth:`~workbench.calib.session.CalibrationSession.score_int8_nodes`) or by
   leave-one-out output noise (``ranking="sensitivity"``, one ORT session per candidate, no task evaluation);
3. revert the worst group to the fallback precision (FP16 by default) and evaluate;
4. if the metric improved, keep the revert and re-rank with the reverted plan (step 2); if it did not, step back
   (undo the revert, never try that group again) and try the next group of the same ranking;
5. stop when the target is met, the evaluation budget is spent, or no group is left.

A search over formats (``formats=("int8", "fp8", "fp16")``) gives every group a ladder: a group that hurts in INT8
is tried in FP8 first (8-bit math on compute capability 8.9+, with a finer grid near zero), and in FP16 only when FP8
did not improve the metric; a group kept in FP8 may later step on to FP16. ``formats[0]`` is the start (INT8 or FP8).

Every evaluated plan is kept (metric, INT8 share and, optionally, the engine structure from a TensorRT-RTX CPU
build, :mod:`.cost`) for the Pareto view. The FP32 reference costs one more task evaluation, counted separately.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from workbench.artifact import Artifact
from workbench.calib.cost import EngineCost, build_plan_engine
from workbench.calib.groups import PrecisionGroup, block_groups, fusion_groups
from workbench.calib.paired import DEFAULT_CONFIDENCE, paired_bound, paired_half_width
from workbench.errors import WorkbenchError
from workbench.precision import Precision, PrecisionPlan
from workbench.precision.qdq_rules import QUANTIZABLE_OPS, fp8_stem_layers
from workbench.progress import ProgressEvent, ProgressFn, report_or_stop

if TYPE_CHECKING:
    import os
    from pathlib import Path

    from workbench.calib.rounding_choice import RoundingChoice
    from workbench.calib.session import CalibrationSession
    from workbench.calib.stats import CalibrationRanges
    from workbench.zoo.base import MetricResult

DEFAULT_BUDGET = 30
# the CLI's screening samples: at 0.95 agreement 256 samples give a paired comparison of two plans that decides
# a 2-point difference, and a 1,000-sample set costs 4x as much per trial
DEFAULT_SCREEN = 256
# the first trial of a ladder with both 8-bit formats (after SKIP_GROUP's and STEM_GROUP's)
MIX_GROUP = "8-bit mix (per-layer diff)"
# the first trial of a search that misses: every residual Add's skip input out of 8 bits, every math op kept in 8
SKIP_GROUP = "residual skips (math ops stay 8-bit)"
# the next trial when the start plan still misses: the stem (the leading convolutions that TensorRT's FP8 rules flag:
# few channels per group or more than 32 taps, qdq_rules.fp8_stem_layers) out of 8 bits. EfficientNet-Lite0, GPTQ weights,
# 2026-12-05: all-INT8 0.944 on 1,000 crops; its two stem convs in FP16, 0.971 (95 % paired low end 0.961)
STEM_GROUP = "stem (leading convs of few channels per group)"
EARLY_STOP_CONFIDENCE = 0.99  # two-sided: a trial is stopped only when its paired interval lies below zero


def resolve_confidence(given: float | str | None) -> float | None:
    """A ``--confidence`` value (``workbench._args.level_or_off``) as the search takes it: ``off`` is None (the point
    estimate decides), nothing given is :data:`DEFAULT_CONFIDENCE`."""
    if given == "off":
        return None
    return DEFAULT_CONFIDENCE if given is None else float(given)


@dataclass(frozen=True)
class Revert(Artifact):
    """One revert the search tried: the group, the metric before and after, and whether it was kept."""

    step: int
    group: str
    nodes: tuple[str, ...]
    score: float  # the group's damage score in the ranking that chose it
    metric_before: float
    metric_after: float
    kept: bool
    evaluations_used: int  # task evaluations of quantized plans so far (this one included)
    seconds: float  # wall time since the search began
    format: str = ""  # the format the group was tried in (the fallback precision when the search has no ladder)


@dataclass(frozen=True)
class EvaluatedPlan(Artifact):
    """A plan the search evaluated: which nodes fell back, the task metric, the INT8 share and the engine cost."""

    index: int
    fallback_nodes: tuple[str, ...]
    metric: float
    meets_target: bool
    int8_math_nodes: int
    math_nodes: int
    int8_share: float
    cost: EngineCost | None = None
    chosen: bool = False
    n_samples: int = 0  # evaluation samples behind ``metric``
    scores: tuple[float, ...] = field(default=(), repr=False)  # per sample, evaluation order (for intervals)
    # the plan's per-node precisions (overrides of the search's base plan) and math nodes per precision
    overrides: dict[str, str] = field(default_factory=dict)
    format_counts: dict[str, int] = field(default_factory=dict)
    eight_bit_share: float = 0.0  # math nodes in INT8 or FP8
    stopped_early: bool = False  # its evaluation ended early: the paired interval showed it cannot improve


@dataclass(frozen=True)
class MixedPrecisionResult(Artifact):
    """The outcome of an accuracy-target search: final plan, every revert, evaluations used and wall time."""

    model: str
    metric_name: str
    higher_is_better: bool
    fp32_metric: float
    int8_metric: float
    target: float
    target_drop: float | None
    fallback: str
    met: bool
    metric: float
    plan: PrecisionPlan
    fallback_nodes: tuple[str, ...]
    int8_math_nodes: int
    math_nodes: int
    int8_share: float
    evaluations_used: int  # task evaluations of quantized plans (the FP32 reference is one more)
    budget: int
    seconds: float
    evaluation_samples: int
    granularity: str
    ranking: str
    groups: tuple[PrecisionGroup, ...]
    reverts: tuple[Revert, ...]
    evaluated: tuple[EvaluatedPlan, ...]
    stop_reason: str
    cost_label: str = ""
    notes: tuple[str, ...] = ()
    ops_by_type: dict[str, list[int]] = field(default_factory=dict)  # op -> [INT8 (8-bit with formats), total]
    formats: tuple[str, ...] = ()  # the ladder of a search over formats (empty: INT8 then ``fallback``)
    screening_samples: int = 0  # trials were scored on this many first samples, the chosen plan on all (0: all)
    start_label: str = ""  # the plan the search started from ("all-INT8", or the per-layer diff's 8-bit mix)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # wall seconds per part of the search
    phase_cpu_seconds: dict[str, float] = field(default_factory=dict)  # CPU seconds (all threads) per part
    cpu_seconds: float = 0.0  # CPU seconds of the whole search (all threads of this process)
    weight_rounding: str = "nearest"  # how the plans' weights were rounded (nearest or GPTQ)
    align_grids: bool = False  # the plans' INT8 inputs on their pixel grid, non-negative activations shifted
    # with a confidence (e.g. 0.95) the target is met only when the plan's metric stays within it at the low end
    # (high end for lower-is-better) of that two-sided interval, paired per sample with FP32; 0: the point estimate
    confidence: float = 0.0
    metric_bound: float = math.nan  # that end of the chosen plan's interval (nan without a confidence)

    @property
    def chosen(self) -> EvaluatedPlan:
        return next(p for p in self.evaluated if p.chosen)

    @property
    def front(self) -> tuple[EvaluatedPlan, ...]:
        """The evaluated plans on the Pareto front (:func:`pareto_front`), in evaluation order."""
        keep = set(pareto_front(self.evaluated, self.higher_is_better))
        return tuple(p for p in self.evaluated if p.index in keep)

    def plan_of(self, index: int) -> PrecisionPlan:
        """The precision plan of evaluated plan ``index``: its fallback nodes at the fallback precision."""
        if not 0 <= index < len(self.evaluated):
            raise WorkbenchError(
                f"plan {index} was not evaluated by this search.", expected=f"0..{len(self.evaluated) - 1}"
            )
        plan = self.evaluated[index]
        if plan.overrides:
            return PrecisionPlan(
                self.plan.default,
                cast(dict[str, Precision], dict(plan.overrides)),
                note=f"mixed-precision search plan {index} ({len(plan.fallback_nodes)} node(s) changed format)",
            )
        chosen = set(self.fallback_nodes)
        base = {node: precision for node, precision in self.plan.overrides.items() if node not in chosen}
        return PrecisionPlan(
            self.plan.default,
            base | dict.fromkeys(plan.fallback_nodes, cast(Precision, self.fallback)),
            note=f"mixed-precision search plan {index} ({len(plan.fallback_nodes)} node(s) to {self.fallback})",
        )

    @property
    def target_verdict(self) -> str:
        """ "met" or "NOT met", with how: at a confidence level (the interval's end) or by the point estimate."""
        how = (
            f"at {self.confidence:.0%} confidence, interval end {self.metric_bound:.4f}"
            if self.confidence and not math.isnan(self.metric_bound)
            else "point estimate"
        )
        return f"{'met' if self.met else 'NOT met'} ({how})"

    def summary(self) -> str:
        share = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in self.ops_by_type.items())
        start = self.start_label or "all-" + (self.formats or ("int8",))[0].upper()
        kept = [r for r in self.reverts if r.kept]
        moved = (
            ", ".join(f"{sum(r.format == f for r in kept)} to {f}" for f in self.formats[1:]) + " group change(s)"
            if self.formats
            else f"{len(kept)} group(s) to {self.fallback}"
        )
        counts = self.chosen.format_counts if self.formats else {}
        return (
            f"{self.metric_name} {self.metric:.4f}{' (GPTQ weights)' if self.weight_rounding == 'gptq' else ''} "
            f"(FP32 {self.fp32_metric:.4f}, {start} {self.int8_metric:.4f}, "
            f"target {self.target:.4f}"
            + (
                f" at {self.confidence:.0%} confidence, interval end {self.metric_bound:.4f}"
                if self.confidence and not math.isnan(self.metric_bound)
                else ""
            )
            + f": {'met' if self.met else 'NOT met'}); "
            f"{'8-bit' if self.formats else 'INT8'} {share}"
            + (" (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + ")" if counts else "")
            + f"; {moved}; {self.evaluations_used} task "
            f"evaluations (+1 FP32) in {self.seconds:.1f} s; stopped: {self.stop_reason}"
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        from workbench._io import write_json_atomic

        return write_json_atomic(path, self.to_json())


def pareto_front(plans: Any, higher_is_better: bool = True) -> tuple[int, ...]:
    """Indices of the plans no other plan dominates on task metric (better), INT8 share (higher) and, when every
    plan has an engine cost, engine layers + reformats (fewer; structure from a CPU build, not speed).

    A plan is dominated when another is at least as good on every objective and strictly better on one; plans
    with equal objectives all stay."""
    plans = list(plans)
    with_cost = bool(plans) and all(p.cost is not None for p in plans)

    def objectives(plan: Any) -> tuple[float, ...]:
        metric = plan.metric if higher_is_better else -plan.metric
        values = (metric, max(plan.int8_share, getattr(plan, "eight_bit_share", 0.0)))
        return values + ((-plan.cost.score,) if with_cost else ())

    points = [objectives(p) for p in plans]
    front = []
    for plan, mine in zip(plans, points):
        dominated = any(
            all(o >= m for o, m in zip(other, mine)) and any(o > m for o, m in zip(other, mine)) for other in points
        )
        if not dominated:
            front.append(plan.index)
    return tuple(front)


def _math_ops(session: CalibrationSession) -> dict[str, str]:
    return {name: op for name, op in session.quantizable_nodes() if op in QUANTIZABLE_OPS}


def search_mixed_precision(
    session: Any,
    *,
    target_drop: float | None = None,
    target: float | None = None,
    fallback: Precision = "fp16",
    budget: int = DEFAULT_BUDGET,
    ranges: CalibrationRanges | None = None,
    limit: int | None = None,
    granularity: str = "fusion",
    build_costs: bool = True,
    diff_batches: int = 1,
    ranking: str = "diff",
    base_plan: PrecisionPlan | None = None,
    progress: ProgressFn | None = None,
    formats: Sequence[str] | None = None,
    prefix_cache: bool = True,
    early_stop: bool = True,
    keep_8bit: Sequence[str] = (),
    screen: int | None = None,
    reach_check: bool = True,
    weight_rounding: str | None = None,
    align_grids: bool | str | None = None,
    confidence: float | None = DEFAULT_CONFIDENCE,
    scored_start: RoundingChoice | None = None,
) -> MixedPrecisionResult:
    """Search the plan with the most INT8 groups whose task metric meets ``target`` (or FP32 minus ``target_drop``,
    0.01 when neither is given).

    ``limit`` caps the evaluation samples; ``budget`` caps task evaluations of quantized plans; ``granularity``
    is "fusion" (groups from the all-INT8 engine's layer map) or "block" (fusion groups merged by name scope).
    ``formats``: the ladder a group climbs when it hurts, e.g. ``("int8", "fp8", "fp16")`` (default: INT8 then
    ``fallback``); the first is where every group starts. ``prefix_cache``: evaluate each plan from the activations
    of the current plan up to the first group it changes (:class:`~workbench.calib.prefix.PrefixCache`; same metric).
    ``early_stop`` (with the prefix cache): a trial's evaluation ends once the paired 99 % interval of its per-sample
    difference to the current plan lies below zero (it cannot improve the metric, so it would be stepped back).
    ``keep_8bit``: op types (e.g. ``("Conv",)``) whose nodes stay in 8 bits: their groups climb only the ladder's
    8-bit rungs, and past them only the group's other nodes (a fused residual Add) move to a wider format.
    ``screen``: score the trials on the first ``screen`` evaluation samples only and confirm the plan that meets the
    target there on the whole set (``limit``); when the whole set misses, the search goes on with the screening
    target raised by the gap it saw. The result's metric is the whole set's. ``reach_check`` (with ``keep_8bit``):
    score the widest plan the rules allow first and stop when even its 99 % interval falls short of the target.
    ``weight_rounding``: ``"auto"`` scores the start plan with nearest and with GPTQ weight rounding on the
    screening samples and searches with GPTQ only when its paired gain is clear
    (:func:`workbench.calib.rounding_choice.choose_weight_rounding`); the session keeps that choice, so the plan it quantizes afterwards is the one the
    search scored. ``None``, ``"nearest"`` or ``"gptq"``: that rounding (None: the session's own).
    ``align_grids``: every plan quantized with grid alignment (:mod:`workbench.calib.align`) or without; ``"auto"``
    scores the start plan both ways on the screening samples and keeps the better
    (:func:`workbench.calib.alignment_choice.choose_grid_alignment`); None: the session's own setting. The session
    keeps the choice. Both ``"auto"``: chosen together
    (:func:`workbench.calib.quantization_choice.choose_rounding_and_alignment`), and the start plan, the very model
    the choice scored, is not run again on the samples it ran.
    ``confidence`` (default 0.95): the whole set meets the target only when the plan's metric does at the low end
    (high end for lower-is-better) of its two-sided interval at that level, paired per sample with FP32
    (:func:`paired_bound`); a screened plan is confirmed on the whole set only when its screening score clears the
    target by the half-width that interval would have there. None: the point estimate decides.
    ``scored_start``: a rounding choice already made on this session (the quickstart's calibrate stage); when it
    scored the very model the search starts from (compared by :func:`~workbench.calib.rounding_choice.model_digest`),
    its predictions are the start plan's and those samples are not run again.

    A search whose start plan misses first tries every residual Add's skip input out of 8 bits (one trial, the
    math ops stay in their 8-bit format): quantizing the skip saves no engine layer in a TensorRT-RTX build
    (EfficientNet-Lite0: 102 layers, all INT8, either way) yet adds noise to the residual stream of every block.
    If it still misses, the next trial takes the stem (:data:`STEM_GROUP`: the leading convolutions of few channels
    per group, at most 5 % of the Conv/GEMM layers) out of 8 bits, unless ``keep_8bit`` keeps Convs in 8 bits.
    """
    ladder = tuple(formats) if formats else ("int8", fallback)
    if (
        len(ladder) < 2
        or ladder[0] not in ("int8", "fp8")
        or len(set(ladder)) != len(ladder)
        or any(f not in ("int8", "fp8", "fp16", "fp32") for f in ladder)
    ):
        raise WorkbenchError(
            f"formats {','.join(ladder)} are not a ladder to search.",
            expected="distinct formats starting with int8 or fp8, e.g. int8,fp8,fp16",
        )
    if formats:
        fallback = cast(Precision, ladder[-1]) if ladder[-1] in ("fp16", "fp32") else fallback
    if session.entry is None:
        raise WorkbenchError("the mixed-precision search needs a task metric.", expected="a zoo model (its metric)")
    if fallback not in ("fp16", "fp32"):
        raise WorkbenchError(f"fallback precision {fallback!r} is not allowed.", expected="fp16 or fp32")
    if granularity not in ("fusion", "block"):
        raise WorkbenchError(f"unknown group granularity {granularity!r}.", expected="fusion or block")
    if ranking not in ("diff", "sensitivity"):
        raise WorkbenchError(f"unknown group ranking {ranking!r}.", expected="diff or sensitivity")
    if budget < 1:
        raise WorkbenchError(f"budget {budget} is too small.", expected="at least 1 task evaluation")
    if target is not None and target_drop is not None:
        raise WorkbenchError("give one of target and target_drop, not both.", expected="--target-drop 0.01")
    if target is None and target_drop is None:
        target_drop = 0.01
    if confidence is not None and not (isinstance(confidence, (int, float)) and 0.5 <= confidence < 1):
        raise WorkbenchError(
            f"confidence={confidence!r} is not a level to use.", expected="a number in [0.5, 1), e.g. 0.95"
        )

    def say(text: str) -> None:  # one ProgressEvent per evaluation: "evaluation 3 of 8, 38%: ..."; False stops
        report_or_stop(progress, ProgressEvent("evaluation", text, index=evaluations, total=budget))

    start = time.perf_counter()
    phases: dict[str, float] = {}  # wall seconds per part of the search (where a slow search spends its time)
    # CPU seconds of this process (all its threads) per part: on a shared machine the wall clock measures the
    # neighbours too, the CPU time does not
    phases_cpu: dict[str, float] = {}
    start_cpu = time.process_time()

    running: list[str] = []  # the phases open now, innermost last: a nested phase's time is not counted twice

    @contextlib.contextmanager
    def timed(phase: str) -> Iterator[None]:
        began, began_cpu = time.perf_counter(), time.process_time()
        running.append(phase)
        try:
            yield
        finally:
            running.pop()
            wall, cpu = time.perf_counter() - began, time.process_time() - began_cpu
            phases[phase] = phases.get(phase, 0.0) + wall
            phases_cpu[phase] = phases_cpu.get(phase, 0.0) + cpu
            if running:  # the enclosing phase adds its whole span when it ends: this part is not its own
                phases[running[-1]] = phases.get(running[-1], 0.0) - wall
                phases_cpu[running[-1]] = phases_cpu.get(running[-1], 0.0) - cpu

    ranges = ranges or session.ranges("mse")
    higher = bool(session.entry.higher_is_better)
    with timed("fp32 metric"):
        fp32_result = session.evaluate(limit=limit)
    fp32 = float(fp32_result.value)
    if target is None:
        target = fp32 - target_drop if higher else fp32 + target_drop  # type: ignore[operator]
    total_samples = int(fp32_result.n_samples)
    if screen is not None and screen < 1:
        raise WorkbenchError(f"screen={screen} is too small.", expected="at least 1 evaluation sample, or None")
    # trials are scored on the first ``screening`` samples (whole batches, so they are the full run's batches)
    screening: int | None = None
    if screen is not None and screen < total_samples:
        from workbench.calib.prefix import EVAL_BATCH

        screening = max(EVAL_BATCH, screen // EVAL_BATCH * EVAL_BATCH)
        screening = screening if screening < total_samples else None
    trial_limit = screening if screening is not None else limit
    base = base_plan or session.default_plan(ladder[0])
    eight_bit = [f for f in ladder if f in ("int8", "fp8")]

    def eight_bit_mix() -> dict[str, Precision]:
        """Both 8-bit formats are allowed: each node in the one whose quantization adds less noise there (the
        per-layer diff of the all-INT8 and the all-FP8 model). A tensor with a rare outlier ruins INT8 on every layer
        it reaches, and no single group's change can repair that alone. The diff runs on evaluation samples (what
        the metric sees): calibration data that hold the outlier make INT8's noise look small next to the outlier's
        own power."""
        with timed("8-bit mix: per-layer diff per format"):
            samples = [feed for feed, _ in session.entry.evaluation_batches(limit=8 * max(1, diff_batches))]
            scores_by_format = {
                fmt: session.score_int8_nodes(
                    session.diff(session.quantize(ranges, session.default_plan(fmt)), samples, max_batches=None),
                    session.default_plan(fmt),
                )
                for fmt in eight_bit
            }
        first, alternative = scores_by_format[ladder[0]], scores_by_format[eight_bit[1]]
        return {
            n: cast(Precision, eight_bit[1]) for n in sorted(first) if n in alternative and alternative[n] < first[n]
        }

    math_ops = _math_ops(session)
    placement = session.placement(base)
    quantized = placement.quantized_nodes
    candidates = quantized + [n for n in placement.residual_skips if n not in quantized]
    ops = {n.name: n.op_type for n in session.prepared.graph.node}
    topo = {n.name: i for i, n in enumerate(session.prepared.graph.node)}
    candidates.sort(key=lambda n: topo.get(n, 0))
    notes: list[str] = []
    eight_bit_only = set(keep_8bit)

    def better(a: float, b: float) -> bool:
        return a > b if higher else a < b

    raise_by = 0.0  # how much the screening samples flattered a plan the whole set then failed

    def meets(value: float, on_screen: bool = False) -> bool:
        # 1e-9: a target computed as FP32 - 0.0 must be met by the FP32 value itself
        goal = target + (raise_by if higher else -raise_by) if on_screen else target  # type: ignore[operator]
        return value >= goal - 1e-9 if higher else value <= goal + 1e-9

    def bound_of(record: EvaluatedPlan) -> float:
        """The plan's metric at the worst end of its ``confidence`` interval (nan without one)."""
        if confidence is None:
            return math.nan
        return paired_bound(record.scores, fp32_result.scores, fp32, float(confidence), higher)

    def meets_confidently(record: EvaluatedPlan) -> bool:
        """The whole-set rule: the point estimate meets the target, and with a confidence its interval's end too
        (missing per-sample scores leave the point estimate to decide)."""
        bound = bound_of(record)
        return meets(record.metric) and (math.isnan(bound) or meets(bound))

    if align_grids not in (None, True, False, "auto"):
        raise WorkbenchError(f"align_grids={align_grids!r} is not a choice.", expected="True, False, 'auto' or None")
    if align_grids not in (None, "auto"):
        session.align_grids = bool(align_grids)
    elif align_grids == "auto":
        session.align_grids = False  # the rounding alone: chosen on the plain model, alignment after it
    rounding = None
    if weight_rounding not in (None, "auto"):
        from workbench.calib.rounding import check_weight_rounding

        session.weight_rounding = check_weight_rounding(weight_rounding)
    elif weight_rounding == "auto" and align_grids == "auto":
        from workbench.calib.quantization_choice import choose_rounding_and_alignment

        with timed("weight rounding and grid alignment"):
            # the screen may leave a real gain unclear: the search's whole set then decides (a second look)
            rounding, alignment = choose_rounding_and_alignment(
                session, ranges, base, trial_limit, second_look=True, whole_limit=limit
            )
            notes.append(rounding.note)
            notes.append(alignment.note + (" (outside the search's budget)" if alignment.evaluations else ""))
    elif weight_rounding == "auto":
        from workbench.calib.rounding_choice import choose_weight_rounding

        with timed("weight rounding: nearest vs GPTQ"):
            rounding = choose_weight_rounding(session, ranges, base, trial_limit, second_look=True, whole_limit=limit)
            notes.append(rounding.note)
    if align_grids == "auto" and weight_rounding != "auto":
        with timed("grid alignment: with vs without"):
            from workbench.calib.alignment_choice import choose_grid_alignment

            alignment = choose_grid_alignment(session, ranges, base, trial_limit)
            notes.append(alignment.note + (" (outside the search's budget)" if alignment.evaluations else ""))
    full = session.quantize(ranges, base)
    if rounding is None:
        rounding = scored_start
    # the start plan's predictions when the choice above scored this very model: its record and its whole-set
    # confirmation run only the samples the choice did not
    start_outputs = None
    if rounding is not None and rounding.predictions is not None and rounding.digest():
        from workbench.calib.rounding_choice import model_digest

        if model_digest(full) == rounding.digest():
            start_outputs = rounding.predictions
            notes.append(
                f"start plan: the rounding choice's predictions on its {len(start_outputs[2])} samples, this very "
                "model's (those samples not run again)"
            )
    shapes = session.entry.input_profiles() if hasattr(session.entry, "input_profiles") else None
    layer_map = None
    full_cost = None
    try:
        with timed("groups: engine build"):
            full_cost, layer_map = build_plan_engine(full, name="all_int8", shapes=shapes)
    except WorkbenchError as error:  # no TensorRT backend: groups fall back to single nodes, costs are absent
        notes.append(f"no engine build ({error.problem}); groups are single nodes and costs are missing")
        build_costs = False
    groups = fusion_groups(candidates, ops, layer_map)
    if granularity == "block":
        groups = block_groups(groups)

    evaluated: list[EvaluatedPlan] = []
    evaluations = 0
    cache = None
    cached_plan = base

    def prefix_cache_of_start() -> Any:
        """The prefix cache, filled from the start plan when first needed (its first trial; the start plan's record
        when the choice above did not score it): a start plan that meets the target needs none."""
        nonlocal cache
        if cache is None:
            from workbench.calib.prefix import PrefixCache

            with timed("prefix cache filled (the start plan on the screen)"):
                cache = PrefixCache(session, full, limit=trial_limit, cut_nodes=[group.nodes[0] for group in groups])
        return cache

    def first_change(plan: PrecisionPlan) -> str | None:
        changed = [n for n in candidates if plan.precision_of(n) != cached_plan.precision_of(n)]
        return min(changed, key=lambda n: topo.get(n, 0)) if changed else None

    def worse_than_current(partial: MetricResult) -> bool:
        """The paired interval decides: this trial cannot beat the current plan (so it would be stepped back)."""
        scores = np.asarray(partial.scores, dtype=np.float64)
        reference = np.asarray(evaluated[current_index].scores[: scores.size], dtype=np.float64)
        if scores.size < 2 or reference.size != scores.size:
            return False
        gain = scores - reference if higher else reference - scores
        return bool(gain.mean() + paired_half_width(scores, reference, EARLY_STOP_CONFIDENCE) < 0)

    def record(
        plan: PrecisionPlan,
        model: Any,
        fallen: tuple[str, ...],
        cost: EngineCost | None,
        whole: bool = False,
        stop_early: bool = True,
        earlier: Any = None,
    ) -> float:
        """Evaluate ``plan`` (on the screening samples, or with ``whole`` on the whole set) and keep its record;
        ``earlier``: the plan's screening predictions (else the prefix cache's base plan's are used)."""
        nonlocal evaluations
        if whole and earlier is not None:  # only the samples they do not cover run (none after a second look)
            from workbench.calib.session import ort_predict

            measured = session.entry.evaluate(ort_predict(getattr(model, "proto", model)), limit=limit, earlier=earlier)
        elif whole and cache is not None and cache.base_outputs is not None:
            # the plan is the cache's base: its screening samples' predictions are known, only the rest runs
            from workbench.calib.session import ort_predict

            measured = session.entry.evaluate(
                ort_predict(getattr(model, "proto", model)), limit=limit, earlier=cache.base_outputs
            )
        elif whole:
            measured = session.evaluate(model, limit=limit)
        elif not evaluated and start_outputs is not None:  # the start plan, scored by the choice above
            predictions, labels, indices = start_outputs
            count = len(indices) if trial_limit is None else min(trial_limit, len(indices))
            measured = session.entry._metric(predictions[:count], labels[:count], indices[:count])
        elif not prefix_cache:
            measured = session.evaluate(model, limit=trial_limit)
        elif not evaluated:
            measured = prefix_cache_of_start().base_result
        else:
            measured = prefix_cache_of_start().evaluate(
                model, first_change(plan), worse_than_current if early_stop and stop_early else None
            )
        value = float(measured.value)
        evaluations += 1
        if build_costs and cost is None:
            try:
                cost, _ = build_plan_engine(model, name=f"plan{len(evaluated)}", shapes=shapes)
            except WorkbenchError as error:  # the metric stands; the plan's engine structure is unknown
                notes.append(f"plan {len(evaluated)}: engine build failed ({error.problem[:200]})")
        within_confidence = True  # a whole-set record (or an unscreened one) meets the target at its interval's end too
        if confidence is not None and (whole or screening is None):
            bound = paired_bound(getattr(measured, "scores", ()) or (), fp32_result.scores, fp32, confidence, higher)
            within_confidence = bool(math.isnan(bound) or meets(bound))
        placed = session.placement(plan)
        int8 = [n for n in placed.int8_nodes if n in math_ops]
        fp8 = [n for n in placed.fp8_nodes if n in math_ops]
        counts = {"int8": len(int8), "fp8": len(fp8)}
        for name in math_ops:
            if name not in placed.formats or name in placed.excluded:
                wider = plan.precision_of(name) if plan.precision_of(name) in ("fp16", "fp32") else "fp32"
                counts[wider] = counts.get(wider, 0) + 1
        evaluated.append(
            EvaluatedPlan(
                index=len(evaluated),
                fallback_nodes=fallen,
                metric=value,
                meets_target=meets(value, on_screen=not whole and screening is not None) and within_confidence,
                int8_math_nodes=len(int8),
                math_nodes=len(math_ops),
                int8_share=len(int8) / max(len(math_ops), 1),
                cost=cost,
                stopped_early=bool(measured.details.get("stopped_early", False)),
                n_samples=int(measured.n_samples),
                scores=tuple(float(x) for x in getattr(measured, "scores", ()) or ()),
                overrides=dict(plan.overrides) if formats else {},
                format_counts={k: v for k, v in counts.items() if v},
                eight_bit_share=(len(int8) + len(fp8)) / max(len(math_ops), 1),
            )
        )
        return value

    def rung_overrides(group: PrecisionGroup, fmt: str) -> dict[str, Precision]:
        """The nodes a group moves to ``fmt``: all of them, but never a ``keep_8bit`` op out of 8 bits."""
        wide = fmt not in ("int8", "fp8")
        return {
            n: cast(Precision, fmt)
            for n in group.nodes
            if not (wide and ops.get(n) in eight_bit_only)
            and plan.precision_of(n) != fmt
            # a node already out of 8 bits (a residual skip, the stem) is not pulled back into them, nor from FP32
            # down to FP16
            and (wide or plan.precision_of(n) not in ("fp16", "fp32"))
            and not (fmt == "fp16" and plan.precision_of(n) == "fp32")
        }

    plan = base
    fallen: tuple[str, ...] = ()
    start_label = "all-" + ladder[0].upper()
    on = f" on {screening} of {total_samples} samples" if screening is not None else ""
    current = int8_metric = record(plan, full, fallen, full_cost if build_costs else None)
    say(f"FP32 {fp32:.4f}, {start_label} {int8_metric:.4f}{on}, target {target:.4f} [1/{budget} evaluations]")
    current_index = 0
    confirmed_index: int | None = None  # the whole-set record of the current plan (screening searches)
    reverts: list[Revert] = []
    # the next rung of its ladder each group is tried at (a group whose ladder is used up is done)
    next_rung = {group.name: 1 for group in groups}
    stop = ""

    def passes_screen() -> bool:
        """The current plan's screening score clears the (raised) target; with a confidence, by the half-width its
        paired interval would have on the whole set too (the screen's per-sample spread over the whole set's
        count), so a whole-set confirmation whose interval could not clear the target is not spent."""
        if confidence is None or screening is None:
            return meets(current, on_screen=True)
        half = paired_half_width(evaluated[current_index].scores, fp32_result.scores, confidence, total_samples)
        if math.isnan(half):
            return meets(current, on_screen=True)
        return meets(current - half if higher else current + half, on_screen=True)

    def confirm() -> bool:
        """The current plan on the whole set (screening searches): True when it meets the target there too."""
        nonlocal raise_by, confirmed_index
        if screening is None:
            met = meets_confidently(evaluated[current_index])
            if not met and meets(current):
                bound = bound_of(evaluated[current_index])
                say(f"{current:.4f} meets the target, its {confidence:.0%} interval's end {bound:.4f} does not")
            return met
        with timed("whole-set confirmations"):
            earlier = start_outputs if current_index == 0 else None  # the start plan: what the choice ran is known
            whole = record(plan, session.quantize(ranges, plan), fallen, None, whole=True, earlier=earlier)
        confirmed_index = len(evaluated) - 1
        met = meets_confidently(evaluated[confirmed_index])
        bound = bound_of(evaluated[confirmed_index])
        say(
            f"whole set ({total_samples} samples): {whole:.4f}"
            + (f" ({confidence:.0%} interval end {bound:.4f})" if not math.isnan(bound) else "")
            + f" ({current:.4f} on the screening samples), target "
            f"{target:.4f} {'met' if met else 'NOT met'} [{evaluations}/{budget} evaluations, "
            f"{time.perf_counter() - start:.0f} s]"
        )
        flattered = current - whole if higher else whole - current
        if not met and flattered > 0:  # the screen must now clear the target by the gap it showed (passes_screen
            raise_by = max(raise_by, flattered + 1e-9)  # adds the half-width; a screen that undersold adds nothing)
        return met

    def upper_bound(record: EvaluatedPlan) -> float:
        """The best the plan's metric could be on the whole population (99 % normal interval of its scores)."""
        values = np.asarray(record.scores, dtype=np.float64)
        if values.size < 2:
            return record.metric if higher else -record.metric
        half = paired_half_width(values, np.zeros_like(values), EARLY_STOP_CONFIDENCE)  # the scores' own interval
        return float(values.mean() + half if higher else -(values.mean() - half))

    def reachable() -> str:
        """With ``keep_8bit`` the target may be out of reach: the widest plan the rules allow (every group at its
        last rung, the kept ops in their start format) is scored first. When even its interval's best lies short
        of the target (on the screening samples, else on the whole set), the search stops there and keeps the
        better of the two plans, scored on the whole set; otherwise the usual search follows from the start plan."""
        nonlocal current, current_index, plan, fallen, confirmed_index, cached_plan
        overrides: dict[str, Precision] = {}
        for group in groups:
            overrides.update(rung_overrides(group, ladder[-1]))
        if not overrides:
            return ""
        widest = plan.with_overrides(overrides)
        widest_fallen = fallen + tuple(n for n in overrides if n not in fallen)  # the skip trial's Adds stay listed
        widest_model = session.quantize(ranges, widest)
        with timed("trials"):
            value = record(widest, widest_model, widest_fallen, None, stop_early=False)
        widest_index = len(evaluated) - 1
        whole_index = None
        goal = target if higher else -target  # type: ignore[operator]
        say(
            f"widest plan the rules allow ({len(overrides)} node(s) to {ladder[-1]}): {value:.4f} "
            f"[{evaluations}/{budget} evaluations, {time.perf_counter() - start:.0f} s]"
        )
        short = upper_bound(evaluated[widest_index]) < goal
        if not short and screening is not None and not meets(value, on_screen=True):
            outputs = cache.last_outputs if cache is not None else None
            with timed("whole-set confirmations"):
                record(widest, widest_model, widest_fallen, None, whole=True, earlier=outputs)
            whole_index = len(evaluated) - 1
            say(
                f"widest plan on the whole set ({total_samples} samples): {evaluated[-1].metric:.4f} "
                f"[{evaluations}/{budget} evaluations, {time.perf_counter() - start:.0f} s]"
            )
            short = upper_bound(evaluated[whole_index]) < goal
        if not short:
            return ""
        if better(value, current):  # the widest plan is the answer; the start plan is the prefix cache's base
            plan, fallen, current, current_index = widest, widest_fallen, value, widest_index
            confirmed_index = whole_index
            if cache is not None:
                cache.adopt()
                cached_plan = widest
        scored = evaluated[whole_index if whole_index is not None else widest_index]
        return (
            f"target out of reach with {', '.join(keep_8bit)} in 8 bits: the widest plan the rules allow scores "
            f"{scored.metric:.4f} on {scored.n_samples} samples, its 99 % interval short of {target:.4f}"
        )

    def one_trial(group: str, overrides: dict[str, Precision], what: str) -> str:
        """One trial outside the group ranking (the residual skips, the stem, the 8-bit mix): the current plan with
        ``overrides``, kept when it scores better; returns "target met" when it is kept and confirmed."""
        nonlocal plan, fallen, current, current_index, confirmed_index, cached_plan
        fmt = next(iter(overrides.values()))
        trial = plan.with_overrides(overrides)
        trial_fallen = fallen + tuple(n for n in overrides if n not in fallen)
        with timed("trials"):
            value = record(trial, session.quantize(ranges, trial), trial_fallen, None)
        kept = better(value, current) and not evaluated[-1].stopped_early
        reverts.append(
            Revert(
                step=len(reverts) + 1,
                group=group,
                nodes=tuple(overrides),
                score=0.0,
                metric_before=current,
                metric_after=value,
                kept=kept,
                evaluations_used=evaluations,
                seconds=time.perf_counter() - start,
                format=fmt,
            )
        )
        say(
            f"{group}, {len(overrides)} {what} to {fmt}: {current:.4f} -> {value:.4f} "
            f"{'kept' if kept else 'stepped back'} [{evaluations}/{budget} evaluations, "
            f"{time.perf_counter() - start:.0f} s]"
        )
        if not kept:
            return ""
        plan, fallen, current, current_index = trial, trial_fallen, value, len(evaluated) - 1
        confirmed_index = None
        if cache is not None:  # later plans start from this one's activations
            cache.adopt()
            cached_plan = trial
        return "target met" if passes_screen() and confirm() else ""

    if passes_screen() and confirm():
        stop = f"target met by {start_label}"
    skips = [
        n
        for n in placement.residual_skips
        if plan.precision_of(n) in ("int8", "fp8") and ops.get(n) not in eight_bit_only
    ]
    wide_rung = ladder[-1] in ("fp16", "fp32")  # a ladder of 8-bit formats only keeps the skips in 8 bits too
    if not stop and skips and wide_rung and evaluations < budget:  # the skips out of 8 bits, every math op kept
        stop = one_trial(SKIP_GROUP, dict.fromkeys(skips, cast(Precision, fallback)), "Add(s)")
    stem = (
        [
            n
            for n in fp8_stem_layers(session.prepared, prepared=True)
            if n in session.placement(plan).quantized_nodes and ops.get(n) not in eight_bit_only
        ]
        if not stop and wide_rung and evaluations < budget
        else []
    )
    if stem:  # the stem out of 8 bits, the rest as it is
        stop = one_trial(STEM_GROUP, dict.fromkeys(stem, cast(Precision, fallback)), "Conv(s)")
    # a caller's own start plan is kept as given; the default start (the CLI passes it explicitly) gets the mix
    default_start = base_plan is None or base_plan.to_json() == session.default_plan(ladder[0]).to_json()
    mix = eight_bit_mix() if not stop and default_start and len(eight_bit) == 2 and evaluations < budget else {}
    # nodes already out of 8 bits (the residual skips) stay there
    mix = {n: f for n, f in mix.items() if plan.precision_of(n) not in ("fp16", "fp32")}
    if mix:  # the next trial (after the residual skips'): every node in its better 8-bit format by the per-layer diff
        stop = one_trial(MIX_GROUP, mix, "node(s)")
    if not stop and keep_8bit and reach_check and evaluations < budget:
        stop = reachable()
    while not stop:
        active = [g for g in groups if next_rung[g.name] < len(ladder) and rung_overrides(g, ladder[next_rung[g.name]])]
        if not active:
            stop = "no group left to revert"
            break
        with timed("ranking"):
            if ranking == "sensitivity":
                session.rank_by_sensitivity(session.quantize(ranges, plan), max_batches=diff_batches)
                scores = dict(session.last_sensitivity)
            else:
                diff = session.diff(session.quantize(ranges, plan), max_batches=diff_batches)
                scores = session.score_int8_nodes(diff, plan)
        ranked = sorted(active, key=lambda g: (-sum(scores.get(n, 0.0) for n in g.nodes), g.name))
        moved = False
        for group in ranked:
            while next_rung[group.name] < len(ladder) and not stop:
                if evaluations >= budget:
                    stop = f"budget of {budget} evaluations spent"
                    break
                fmt = ladder[next_rung[group.name]]
                next_rung[group.name] += 1
                overrides = rung_overrides(group, fmt)
                if not overrides:
                    continue
                trial = plan.with_overrides(overrides)
                trial_fallen = fallen + tuple(n for n in overrides if n not in fallen)
                with timed("trials"):
                    value = record(trial, session.quantize(ranges, trial), trial_fallen, None)
                early = evaluated[-1].stopped_early
                kept = better(value, current) and not early
                reverts.append(
                    Revert(
                        step=len(reverts) + 1,
                        group=group.name,
                        nodes=tuple(overrides),
                        score=float(sum(scores.get(n, 0.0) for n in group.nodes)),
                        metric_before=current,
                        metric_after=value,
                        kept=kept,
                        evaluations_used=evaluations,
                        seconds=time.perf_counter() - start,
                        format=fmt,
                    )
                )
                say(
                    f"{group.name} ({len(overrides)} node(s)) to {fmt}: {current:.4f} -> {value:.4f} "
                    f"{'kept' if kept else 'stepped back'}"
                    + (f" (stopped after {evaluated[-1].n_samples} samples: cannot improve)" if early else "")
                    + f" [{evaluations}/{budget} evaluations, "
                    f"{time.perf_counter() - start:.0f} s]"
                )
                if kept:
                    plan, fallen, current = trial, trial_fallen, value
                    current_index = len(evaluated) - 1
                    confirmed_index = None
                    if cache is not None:  # later plans start from this one's activations
                        cache.adopt()
                        cached_plan = trial
                    moved = True
                    if passes_screen() and confirm():
                        stop = "target met"
                    break
            if moved or stop:
                break
        if not stop and not moved:
            stop = "no revert improved the metric"
    if screening is not None and confirmed_index is None:
        confirm()  # the whole set's number of the plan the search ends on (not refused by the budget)
    chosen_index = confirmed_index if confirmed_index is not None else current_index
    evaluated[chosen_index] = replace(evaluated[chosen_index], chosen=True)
    final = evaluated[chosen_index]
    if confidence is not None and math.isnan(bound_of(final)):
        notes.append(
            f"target at {confidence:.0%} confidence: the metric gave no per-sample scores on the same samples as "
            "FP32's, so the point estimate decided"
        )
    final_metric = final.metric
    eight_bit_final = set(session.quantized_nodes(plan))
    by_type: dict[str, list[int]] = {}
    for name, op in math_ops.items():
        counts = by_type.setdefault(op, [0, 0])
        counts[0] += name in eight_bit_final  # INT8 (or FP8 in a search over formats)
        counts[1] += 1
    return MixedPrecisionResult(
        model=str(getattr(session.entry, "name", "")),
        metric_name=str(session.entry.metric_name),
        higher_is_better=higher,
        fp32_metric=fp32,
        int8_metric=int8_metric,
        target=float(target),
        target_drop=target_drop,
        fallback=fallback,
        met=meets_confidently(final),
        metric=final_metric,
        plan=PrecisionPlan(plan.default, plan.overrides, note=f"mixed-precision search ({fallback} fallback)"),
        fallback_nodes=fallen,
        int8_math_nodes=final.int8_math_nodes,
        math_nodes=final.math_nodes,
        int8_share=final.int8_share,
        evaluations_used=evaluations,
        budget=budget,
        seconds=time.perf_counter() - start,
        evaluation_samples=int(final.n_samples),
        granularity=granularity,
        ranking=ranking,
        groups=tuple(groups),
        reverts=tuple(reverts),
        evaluated=tuple(evaluated),
        stop_reason=stop,
        cost_label=full_cost.label if full_cost is not None else "",
        notes=tuple(notes),
        ops_by_type=by_type,
        formats=tuple(formats or ()),
        screening_samples=screening or 0,
        start_label=start_label,
        phase_seconds={k: round(v, 3) for k, v in phases.items()},
        phase_cpu_seconds={k: round(v, 3) for k, v in phases_cpu.items()},
        cpu_seconds=time.process_time() - start_cpu,
        weight_rounding=str(getattr(session, "weight_rounding", "nearest")),
        align_grids=bool(getattr(session, "align_grids", False)),
        confidence=float(confidence or 0.0),
        metric_bound=bound_of(final),
    )
