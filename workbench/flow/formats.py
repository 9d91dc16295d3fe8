"""The Pareto front across formats: every measured plan or engine (INT8, FP8, FP16, FP32 and their mixes) as task
metric against engine cost, and which of them no other beats on both at once.

Engine cost is the serialized size of a real TensorRT-RTX build of that plan (what ships and loads), the same build
the search counts layers and reformats from; the layers are shown beside it. It is a **size**, not a speed (a
CPU-only build runs nothing), and it is measured, not predicted: on a small model the Q/DQ scales and extra kernels
of an INT8 build can outweigh what its 1-byte weights save. The metric is the one the search or the journey
measured, with its 95 % interval and sample count; points measured on other sample counts are not mixed.

Nothing here draws: :func:`workbench.viz.calib.format_front_figure` draws a :class:`FormatFront`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from workbench.artifact import Artifact
from workbench.flow.uncertainty import Estimate, estimate

if TYPE_CHECKING:
    from workbench.calib.search import MixedPrecisionResult
    from workbench.calib.session import CalibrationSession
    from workbench.flow.artifacts import QuickstartRun

FORMATS = ("int8", "fp8", "fp16", "fp32")
COST_HOW = "serialized engine size of a TensorRT-RTX build of each plan (what ships; a size, not a speed)"


@dataclass(frozen=True)
class FormatPoint(Artifact):
    """One measured plan or engine: its formats, task metric with 95 % interval, and engine cost."""

    label: str  # "plan 3", "FP32 (reference)", "INT8 (all)"
    format: str  # one of FORMATS when every math node is in it, else "mixed"
    formats: dict[str, int]  # Conv/Gemm/MatMul nodes per format (empty when not counted)
    metric: float
    n_samples: int
    metric_low: float
    metric_high: float
    interval_method: str
    engine_bytes: int | None
    engine_layers: int | None
    source: str  # where it was measured, in words
    chosen: bool = False  # the search's pick or the journey's chosen engine
    on_front: bool = False

    @property
    def estimate(self) -> Estimate:
        return Estimate(self.metric, self.n_samples, self.metric_low, self.metric_high, self.interval_method)

    @property
    def mix(self) -> str:
        """``int8 40 · fp8 3 · fp16 2`` (the format alone when nothing was counted)."""
        return " · ".join(f"{k} {v}" for k, v in self.formats.items() if v) or self.format

    @property
    def engine_mb(self) -> float | None:
        return None if self.engine_bytes is None else self.engine_bytes / 1e6


@dataclass(frozen=True)
class FormatFront(Artifact):
    """Every point measured on the same samples, the front among them flagged, and how both axes were measured."""

    model: str
    metric_name: str
    higher_is_better: bool
    points: tuple[FormatPoint, ...]
    target: float | None = None
    how: str = ""
    cost_how: str = COST_HOW
    notes: tuple[str, ...] = field(default=())

    @property
    def front(self) -> tuple[FormatPoint, ...]:
        """The points on the front, cheapest engine first."""
        return tuple(sorted((p for p in self.points if p.on_front), key=lambda p: p.engine_bytes or 0))


def _format_of(counts: dict[str, int]) -> str:
    used = [k for k, v in counts.items() if v]
    return used[0] if len(used) == 1 else "mixed"


SIZE_TOLERANCE = 0.01  # engine sizes within 1 % of each other count as equal on the front (a few bytes decide nothing)


def _dominates(a: FormatPoint, b: FormatPoint, higher_is_better: bool) -> bool:
    """``a`` is at least as good as ``b`` on metric and engine size (sizes within :data:`SIZE_TOLERANCE` equal) and
    strictly better on one of them."""
    if a.engine_bytes is None or b.engine_bytes is None:
        return False
    sign = 1.0 if higher_is_better else -1.0
    metric_no_worse, metric_better = sign * a.metric >= sign * b.metric, sign * a.metric > sign * b.metric
    size_no_worse = a.engine_bytes <= b.engine_bytes * (1 + SIZE_TOLERANCE)
    size_better = a.engine_bytes < b.engine_bytes * (1 - SIZE_TOLERANCE)
    return metric_no_worse and size_no_worse and (metric_better or size_better)


def flag_front(points: Sequence[FormatPoint], higher_is_better: bool = True) -> tuple[FormatPoint, ...]:
    """``points`` with ``on_front`` set: no other point has a metric at least as good and an engine at most as large
    (sizes within 1 % count as equal), one of them strictly. Points without an engine size or metric are never on it."""
    usable = [p.engine_bytes is not None and math.isfinite(p.metric) for p in points]
    return tuple(
        replace(
            p,
            on_front=ok
            and not any(o_ok and _dominates(o, p, higher_is_better) for o, o_ok in zip(points, usable) if o is not p),
        )
        for p, ok in zip(points, usable)
    )


def search_points(result: MixedPrecisionResult, intervals: Sequence[Estimate] | None = None) -> list[FormatPoint]:
    """One point per plan a (format) search evaluated: its math nodes per format, metric with interval, engine size
    from the plan's build (``None`` when the search built no engine)."""
    points = []
    for plan in result.evaluated:
        interval = (
            intervals[plan.index]
            if intervals is not None
            else estimate(plan.metric, plan.n_samples or result.evaluation_samples, plan.scores)
        )
        counts = dict(plan.format_counts) or {
            "int8": plan.int8_math_nodes,
            result.fallback: plan.math_nodes - plan.int8_math_nodes,
        }
        points.append(
            FormatPoint(
                label=f"plan {plan.index}",
                format=_format_of(counts),
                formats={k: counts[k] for k in FORMATS if counts.get(k)},
                metric=plan.metric,
                n_samples=interval.n,
                metric_low=interval.low,
                metric_high=interval.high,
                interval_method=interval.method,
                engine_bytes=plan.cost.engine_bytes if plan.cost is not None else None,
                engine_layers=plan.cost.engine_layers if plan.cost is not None else None,
                source=f"{'format' if result.formats else 'mixed-precision'} search, plan {plan.index}",
                chosen=plan.chosen,
            )
        )
    return points


def reference_point(session: CalibrationSession, result: MixedPrecisionResult, limit: int | None) -> FormatPoint:
    """The FP32 model as a point: its metric on the search's samples (``limit`` as the search was given it, so the
    session's cached evaluation is reused) and the size of its TensorRT-RTX build."""
    from workbench.calib.cost import build_plan_engine

    measured = session.evaluate(limit=limit)
    interval = estimate(float(measured.value), int(measured.n_samples), tuple(measured.scores or ()))
    entry = session.entry
    shapes = entry.input_profiles() if entry is not None and hasattr(entry, "input_profiles") else None
    cost, _layers = build_plan_engine(session.model.proto, name="fp32", shapes=shapes)
    return FormatPoint(
        label="FP32 (reference)",
        format="fp32",
        formats={"fp32": result.math_nodes},
        metric=interval.value,
        n_samples=interval.n,
        metric_low=interval.low,
        metric_high=interval.high,
        interval_method=interval.method,
        engine_bytes=cost.engine_bytes,
        engine_layers=cost.engine_layers,
        source="the FP32 model",
    )


def search_front(
    result: MixedPrecisionResult, intervals: Sequence[Estimate] | None = None, extra: Sequence[FormatPoint] = ()
) -> FormatFront:
    """The front across formats of one search's plans (and ``extra`` points measured on the same samples, e.g. the
    FP32 reference)."""
    points = flag_front([*extra, *search_points(result, intervals)], result.higher_is_better)
    return FormatFront(
        model=result.model,
        metric_name=result.metric_name,
        higher_is_better=result.higher_is_better,
        points=points,
        target=result.target,
        how=f"{result.evaluation_samples} evaluation samples per plan, ONNX Runtime CPU (Q/DQ simulated)",
    )


def run_front(run: QuickstartRun) -> FormatFront | None:
    """The journey's front across formats: each built precision variant (FP32, FP16, INT8, FP8, mixed) with the
    metric the metrics stage measured and its engine's size, plus the plans of the mixed-precision search (same
    evaluation samples); None before the metrics stage."""
    from workbench.precision.variant import VARIANTS, Variant

    if run.metrics is None or not run.metrics.rows:
        return None
    builds = run.builds
    search = run.mixed_search
    math_nodes = search.result.math_nodes if search is not None else 0
    points = []
    for row in run.metrics.rows:
        build = builds.get(row.variant)
        info = VARIANTS[row.variant]
        counts: dict[str, int] = {info.precision: math_nodes} if math_nodes else {}
        if row.variant is Variant.INT8_MIXED and search is not None:
            counts = dict(search.result.chosen.format_counts)
        interval = row.estimate
        points.append(
            FormatPoint(
                label=info.label,
                format="mixed" if info.mixed else info.precision,
                formats=counts,
                metric=row.value,
                n_samples=interval.n,
                metric_low=interval.low,
                metric_high=interval.high,
                interval_method=interval.method,
                engine_bytes=build.engine.engine_bytes if build is not None else None,
                engine_layers=build.engine.layer_count if build is not None else None,
                source=f"the {row.variant} engine",
                chosen=row.variant is run.chosen_variant,
            )
        )
    notes = []
    if search is not None:
        n = run.metrics.rows[0].n_samples
        plans = [p for p in search_points(search.result, search.intervals) if p.n_samples == n and p.label != "plan 0"]
        skipped = len(search.result.evaluated) - 1 - len(plans)
        if skipped:
            notes.append(f"{skipped} search plan(s) measured on other samples than the variants are not shown")
        points += [replace(p, chosen=False) for p in plans]  # plan 0 is the INT8 (all) engine, shown as that
    first = run.metrics.rows[0]
    return FormatFront(
        model=run.config.model,
        metric_name=first.metric,
        higher_is_better=first.higher_is_better,
        points=flag_front(points, first.higher_is_better),
        target=search.result.target if search is not None else None,
        how=f"{first.n_samples} evaluation samples each, ONNX Runtime CPU; {run.metrics.how}",
        notes=tuple(notes),
    )
