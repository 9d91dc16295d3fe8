"""Accuracy-target mixed precision: the most INT8 that keeps the task metric within an allowed drop.

NNCF's accuracy-control loop, over groups that follow the engine's fusions (:mod:`.groups`):

1. evaluate the all-INT8 plan on the task metric; stop if it meets the target;
2. rank the INT8 groups by the damage of the *current* plan attributed to them, summed over the group: by the
   per-layer diff (``ranking="diff"``, :meth:`~workbench.calib.session.CalibrationSession.score_int8_nodes`) or by
   leave-one-out output noise (``ranking="sensitivity"``, one ORT session per candidate, no task evaluation);
3. revert the worst group to the fallback precision (FP16 by default) and evaluate;
4. if the metric improved, keep the revert and re-rank with the reverted plan (step 2); if it did not, step back
   (undo the revert, never try that group again) and try the next group of the same ranking;
5. stop when the target is met, the evaluation budget is spent, or no group is left.

Every evaluated plan is kept (metric, INT8 share and, optionally, the engine structure from a TensorRT-RTX CPU
build, :mod:`.cost`) for the Pareto view. The FP32 reference costs one more task evaluation, counted separately.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from workbench.artifact import Artifact
from workbench.calib.cost import EngineCost, build_plan_engine
from workbench.calib.groups import PrecisionGroup, block_groups, fusion_groups
from workbench.errors import WorkbenchError
from workbench.precision import Precision, PrecisionPlan
from workbench.precision.qdq_rules import QUANTIZABLE_OPS

DEFAULT_BUDGET = 30


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
    ops_by_type: dict[str, list[int]] = field(default_factory=dict)  # op -> [INT8, total] in the final plan

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
        chosen = set(self.fallback_nodes)
        base = {node: precision for node, precision in self.plan.overrides.items() if node not in chosen}
        return PrecisionPlan(
            self.plan.default,
            base | dict.fromkeys(plan.fallback_nodes, cast(Precision, self.fallback)),
            note=f"mixed-precision search plan {index} ({len(plan.fallback_nodes)} node(s) to {self.fallback})",
        )

    def summary(self) -> str:
        share = ", ".join(f"{k} {v[0]}/{v[1]}" for k, v in self.ops_by_type.items())
        return (
            f"{self.metric_name} {self.metric:.4f} (FP32 {self.fp32_metric:.4f}, all-INT8 {self.int8_metric:.4f}, "
            f"target {self.target:.4f}: {'met' if self.met else 'NOT met'}); INT8 {share}; "
            f"{len([r for r in self.reverts if r.kept])} group(s) to {self.fallback}; {self.evaluations_used} task "
            f"evaluations (+1 FP32) in {self.seconds:.1f} s; stopped: {self.stop_reason}"
        )

    def save(self, path: Any) -> Any:
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
        values = (metric, plan.int8_share)
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


def _math_ops(session: Any) -> dict[str, str]:
    return {name: op for name, op in session.quantizable_nodes() if op in QUANTIZABLE_OPS}


def search_mixed_precision(
    session: Any,
    *,
    target_drop: float | None = None,
    target: float | None = None,
    fallback: Precision = "fp16",
    budget: int = DEFAULT_BUDGET,
    ranges: Any = None,
    limit: int | None = None,
    granularity: str = "fusion",
    build_costs: bool = True,
    diff_batches: int = 1,
    ranking: str = "diff",
    base_plan: PrecisionPlan | None = None,
    log: Callable[[str], None] | None = None,
) -> MixedPrecisionResult:
    """Search the plan with the most INT8 groups whose task metric meets ``target`` (or FP32 minus ``target_drop``,
    0.01 when neither is given).

    ``limit`` caps the evaluation samples; ``budget`` caps task evaluations of quantized plans; ``granularity``
    is "fusion" (groups from the all-INT8 engine's layer map) or "block" (fusion groups merged by name scope).
    """
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
    say = log or (lambda text: None)
    start = time.perf_counter()
    ranges = ranges or session.ranges("mse")
    higher = bool(session.entry.higher_is_better)
    fp32 = float(session.evaluate(limit=limit).value)
    if target is None:
        target = fp32 - target_drop if higher else fp32 + target_drop  # type: ignore[operator]
    base = base_plan or session.default_plan()
    math_ops = _math_ops(session)
    placement = session.placement(base)
    candidates = list(placement.int8_nodes) + [n for n in placement.residual_skips if n not in placement.int8_nodes]
    ops = {n.name: n.op_type for n in session.prepared.graph.node}
    topo = {n.name: i for i, n in enumerate(session.prepared.graph.node)}
    candidates.sort(key=lambda n: topo.get(n, 0))
    notes: list[str] = []

    def better(a: float, b: float) -> bool:
        return a > b if higher else a < b

    def meets(value: float) -> bool:  # 1e-9: a target computed as FP32 - 0.0 must be met by the FP32 value itself
        return value >= target - 1e-9 if higher else value <= target + 1e-9  # type: ignore[operator]

    full = session.quantize(ranges, base)
    shapes = session.entry.input_profiles() if hasattr(session.entry, "input_profiles") else None
    layer_map = None
    full_cost = None
    try:
        full_cost, layer_map = build_plan_engine(full, name="all_int8", shapes=shapes)
    except WorkbenchError as error:  # no TensorRT backend: groups fall back to single nodes, costs are absent
        notes.append(f"no engine build ({error.problem}); groups are single nodes and costs are missing")
        build_costs = False
    groups = fusion_groups(candidates, ops, layer_map)
    if granularity == "block":
        groups = block_groups(groups)

    evaluated: list[EvaluatedPlan] = []
    evaluations = 0

    def record(plan: PrecisionPlan, model: Any, fallen: tuple[str, ...], cost: EngineCost | None) -> float:
        nonlocal evaluations
        measured = session.evaluate(model, limit=limit)
        value = float(measured.value)
        evaluations += 1
        int8 = [n for n in session.int8_nodes(plan) if n in math_ops]
        if build_costs and cost is None:
            try:
                cost, _ = build_plan_engine(model, name=f"plan{len(evaluated)}", shapes=shapes)
            except WorkbenchError as error:  # the metric stands; the plan's engine structure is unknown
                notes.append(f"plan {len(evaluated)}: engine build failed ({error.problem[:200]})")
        evaluated.append(
            EvaluatedPlan(
                index=len(evaluated),
                fallback_nodes=fallen,
                metric=value,
                meets_target=meets(value),
                int8_math_nodes=len(int8),
                math_nodes=len(math_ops),
                int8_share=len(int8) / max(len(math_ops), 1),
                cost=cost,
                n_samples=int(measured.n_samples),
                scores=tuple(float(x) for x in getattr(measured, "scores", ()) or ()),
            )
        )
        return value

    plan = base
    fallen: tuple[str, ...] = ()
    current = int8_metric = record(plan, full, fallen, full_cost if build_costs else None)
    say(f"FP32 {fp32:.4f}, all-INT8 {int8_metric:.4f}, target {target:.4f}")
    current_index = 0
    reverts: list[Revert] = []
    rejected: set[str] = set()
    reverted: set[str] = set()
    stop = "target met by all-INT8" if meets(current) else ""
    while not stop:
        active = [g for g in groups if g.name not in rejected and g.name not in reverted]
        if not active:
            stop = "no group left to revert"
            break
        if ranking == "sensitivity":
            session.rank_by_sensitivity(session.quantize(ranges, plan), max_batches=diff_batches)
            scores = dict(session.last_sensitivity)
        else:
            diff = session.diff(session.quantize(ranges, plan), max_batches=diff_batches)
            scores = session.score_int8_nodes(diff, plan)
        ranked = sorted(active, key=lambda g: -sum(scores.get(n, 0.0) for n in g.nodes))
        moved = False
        for group in ranked:
            if evaluations >= budget:
                stop = f"budget of {budget} evaluations spent"
                break
            trial = plan.with_overrides({n: fallback for n in group.nodes})
            trial_fallen = fallen + group.nodes
            value = record(trial, session.quantize(ranges, trial), trial_fallen, None)
            kept = better(value, current)
            reverts.append(
                Revert(
                    step=len(reverts) + 1,
                    group=group.name,
                    nodes=group.nodes,
                    score=float(sum(scores.get(n, 0.0) for n in group.nodes)),
                    metric_before=current,
                    metric_after=value,
                    kept=kept,
                    evaluations_used=evaluations,
                    seconds=time.perf_counter() - start,
                )
            )
            say(
                f"revert {group.name} ({len(group.nodes)} node(s)): {current:.4f} -> {value:.4f} "
                f"{'kept' if kept else 'stepped back'} [{evaluations}/{budget}]"
            )
            if kept:
                plan, fallen, current = trial, trial_fallen, value
                current_index = len(evaluated) - 1
                reverted.add(group.name)
                moved = True
                if meets(current):
                    stop = "target met"
                break
            rejected.add(group.name)
        if not stop and not moved:
            stop = "no revert improved the metric"
    chosen_index = current_index
    evaluated[chosen_index] = replace(evaluated[chosen_index], chosen=True)
    final = evaluated[chosen_index]
    int8_final = set(session.int8_nodes(plan))
    by_type: dict[str, list[int]] = {}
    for name, op in math_ops.items():
        counts = by_type.setdefault(op, [0, 0])
        counts[0] += name in int8_final
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
        met=meets(current),
        metric=current,
        plan=PrecisionPlan(plan.default, plan.overrides, note=f"mixed-precision search ({fallback} fallback)"),
        fallback_nodes=fallen,
        int8_math_nodes=final.int8_math_nodes,
        math_nodes=final.math_nodes,
        int8_share=final.int8_share,
        evaluations_used=evaluations,
        budget=budget,
        seconds=time.perf_counter() - start,
        evaluation_samples=int(session.evaluate(limit=limit).n_samples),
        granularity=granularity,
        ranking=ranking,
        groups=tuple(groups),
        reverts=tuple(reverts),
        evaluated=tuple(evaluated),
        stop_reason=stop,
        cost_label=full_cost.label if full_cost is not None else "",
        notes=tuple(notes),
        ops_by_type=by_type,
    )
