"""The rule that chooses an engine from measured task metrics, and the verdict on any choice: said to the user.

Rule: among the variants whose task metric is at most ``max_drop`` worse than FP32's, take the one expected to cost
least on TensorRT: all-INT8, then mixed INT8 (some layers kept wider), then FP16, then FP32 itself. A mixed plan is
never taken over all-INT8 unless it measured better: it costs more (wider layers, extra reformats), so it must buy
accuracy.

"At most ``max_drop`` worse" is decided the way the accuracy-target search decides "met"
(:func:`workbench.calib.search.search_mixed_precision`): at ``confidence`` (95 % by default) the worst end of the
variant's paired interval against FP32 (:func:`workbench.calib.paired.paired_interval`, normal, on the same
samples) must be within the drop, not only its point estimate. So a plan the search rejected as not met is not
picked here on its point estimate, and the journey exports the engine its own search calls met. ``confidence=None``
brings back the point estimate, with a pick whose interval reaches past the drop reported as unresolved (amber).
Every comparison shown carries its sample count and a 95 % interval (:mod:`workbench.flow.uncertainty`); a
difference whose interval contains 0 is reported as within noise.

Rows are anything with ``variant``, ``metric``, ``value``, ``n_samples``, ``higher_is_better`` and ``scores``
(a quickstart :class:`~workbench.flow.artifacts.MetricRow`). Variants are :class:`~workbench.precision.Variant`
members; their cost order and precision come from :data:`~workbench.precision.VARIANTS`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from workbench.artifact import Artifact
from workbench.calib.paired import DEFAULT_CONFIDENCE, paired_interval
from workbench.errors import WorkbenchError
from workbench.flow.uncertainty import Difference, Estimate, estimate, paired_difference
from workbench.precision.variant import COST_ORDER, VARIANTS, PrecisionChoice, Variant, parse_variant, variants_for

DEFAULT_MAX_DROP = 0.01
LEVELS = ("ok", "warning", "bad")


def _loss_text(loss: float, metric: str) -> str:
    """``loses 0.0123 of top1``, ``gains 0.0050 of top1`` or ``matches top1`` (no "-0.0000")."""
    if round(loss, 4) > 0:
        return f"loses {loss:.4f} of {metric}"
    if round(loss, 4) < 0:
        return f"gains {-loss:.4f} of {metric}"
    return f"matches {metric}"


class MeasuredRow(Protocol):
    """What the rule reads of a metric row (a :class:`~workbench.flow.artifacts.MetricRow`)."""

    @property
    def variant(self) -> Variant | str: ...
    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def n_samples(self) -> int: ...
    @property
    def higher_is_better(self) -> bool: ...
    @property
    def scores(self) -> tuple[float, ...]: ...


def confidence_text(confidence: float | None) -> str:
    """How "within the drop" is decided, in words."""
    if confidence is None:
        return "by its point estimate"
    return f"at {confidence:.0%} confidence (the worst end of its paired interval, as the search decides)"


def rule_text(
    max_drop: float,
    metric: str = "task metric",
    variants: Iterable[Variant] = COST_ORDER,
    confidence: float | None = DEFAULT_CONFIDENCE,
) -> str:
    """The rule in words, over ``variants`` (those that were built), cheapest first."""
    considered = set(variants)
    order = " < ".join(VARIANTS[v].label for v in COST_ORDER if v in considered)
    return (
        f"Rule: the engine expected to cost least on TensorRT ({order}) whose {metric} is at most {max_drop:g} below "
        f"FP32's {confidence_text(confidence)}; a mixed plan only where it measured better than its all-quantized "
        "variant."
    )


@dataclass(frozen=True)
class Judgement(Artifact):
    """One variant against FP32: its estimate, the paired difference, and whether it is within the allowed drop."""

    variant: Variant
    estimate: Estimate
    vs_fp32: Difference  # variant - FP32, in the metric's own direction
    loss: float  # how much worse than FP32 (positive = worse, whatever the metric's direction)
    loss_high: float  # the worst end of the loss's interval that decides (NaN without one)
    acceptable: bool  # loss <= max_drop, and with a confidence loss_high too
    resolved: bool  # the loss's interval lies on one side of max_drop
    confidence: float | None = None  # the level loss_high is at (None: the 95 % bootstrap, the point estimate decided)
    point_within: bool = False  # loss <= max_drop: within the drop by the point estimate alone

    @property
    def decided_by_interval(self) -> bool:
        """Within by the point estimate but not at the rule's confidence: rejected by the interval's end."""
        return self.point_within and not self.acceptable

    def text(self) -> str:
        if self.variant is Variant.FP32:
            return f"fp32 {self.estimate.text()}"
        noise = "; within noise of FP32" if self.vs_fp32.within_noise else ""
        return f"{self.variant} {self.estimate.text()}, vs FP32 {self.vs_fp32.text()}{noise}"


def loss_of(delta_vs_fp32: float, higher_is_better: bool) -> float:
    """How much worse than FP32 a variant-minus-FP32 difference is (positive = worse, whatever the direction)."""
    return -delta_vs_fp32 if higher_is_better else delta_vs_fp32


def within_drop(loss: float, max_drop: float) -> bool:
    """The rule's acceptability: a loss vs FP32 of at most ``max_drop`` (float round-off forgiven)."""
    return loss <= max_drop + 1e-9  # the search's own slack (search.meets), so the two cannot split on round-off


def _loss(difference: Difference, higher_is_better: bool) -> tuple[float, float, float]:
    """(loss, loss interval low, loss interval high) from a variant-minus-FP32 difference."""
    low, high = sorted(loss_of(end, higher_is_better) for end in (difference.low, difference.high))
    return loss_of(difference.delta, higher_is_better), low, high


def _confident_loss(fp32: MeasuredRow, row: MeasuredRow, confidence: float) -> tuple[float, float] | None:
    """(low, high) of the loss at ``confidence``: the search's own interval (:func:`workbench.calib.paired.
    paired_interval`, centred on the mean per-sample difference as ``paired_bound`` is, which is the metric's own
    difference unless the metric is not a per-sample mean, e.g. a ratio of sums); None when the rows have no
    per-sample scores on the same samples."""
    if len(row.scores) != len(fp32.scores):
        return None
    mean, half = paired_interval(row.scores, fp32.scores, confidence)
    if math.isnan(half):
        return None
    center = loss_of(mean, row.higher_is_better)
    return center - half, center + half


def judge(
    rows: Sequence[MeasuredRow],
    max_drop: float = DEFAULT_MAX_DROP,
    confidence: float | None = DEFAULT_CONFIDENCE,
) -> dict[Variant, Judgement]:
    """Every measured variant against FP32 (empty when FP32 has no row). ``confidence``: the level at which "within
    the drop" is decided (the search's criterion); None: the point estimate decides."""
    if not (isinstance(max_drop, (int, float)) and math.isfinite(max_drop) and max_drop >= 0):
        raise WorkbenchError(f"max_metric_drop={max_drop} must be a number >= 0.", expected="e.g. 0.01")
    check_confidence(confidence)
    by_variant = {parse_variant(row.variant, "metric row variant"): row for row in rows}
    fp32 = by_variant.get(Variant.FP32)
    if fp32 is None:
        return {}
    out: dict[Variant, Judgement] = {}
    for variant, row in by_variant.items():
        difference = paired_difference(fp32.value, fp32.scores, row.value, row.scores)
        loss, low, high = _loss(difference, row.higher_is_better)
        has_interval = difference.has_interval
        decided_at = None
        resolved_low, resolved_high = low, high
        if confidence is not None:
            confident = _confident_loss(fp32, row, confidence)
            if confident is not None:
                (low, high), has_interval, decided_at = confident, True, confidence
                # red (resolved, which blocks export) needs at least 95 %, whatever level decides acceptability
                resolved_low, resolved_high = _confident_loss(fp32, row, max(confidence, 0.95)) or (low, high)
        point_within = within_drop(loss, max_drop)
        # without scores on the same samples the point estimate decides (as in the search)
        acceptable = point_within and (decided_at is None or within_drop(high, max_drop))
        out[variant] = Judgement(
            variant,
            estimate(row.value, row.n_samples, row.scores),
            difference,
            loss,
            high,
            acceptable,
            has_interval and (within_drop(resolved_high, max_drop) or resolved_low > max_drop),
            decided_at,
            point_within,
        )
    return out


def check_confidence(confidence: float | None) -> None:
    """A decision level is None (the point estimate) or a probability in [0.5, 1) (``--confidence``'s range)."""
    if confidence is None:
        return
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0.5 <= confidence < 1:
        raise WorkbenchError(
            f"confidence={confidence!r} is not a decision level.",
            expected="a level between 0.5 and 1 such as 0.95, or None (0 in the quickstart's config) for the point "
            "estimate",
        )


@dataclass(frozen=True)
class Choice(Artifact):
    """The engine variant chosen for a requested precision, what the rule would pick, and the verdict on it."""

    precision: PrecisionChoice  # what was asked for: fp32 / fp16 / int8 / auto
    variant: Variant  # the metric variant whose engine is used (int8 -> int8-all or int8-mixed)
    rule_variant: Variant  # what the rule picks
    level: str  # ok / warning / bad
    reason: str
    rule: str
    max_drop: float
    judgements: tuple[Judgement, ...] = ()

    @property
    def ok(self) -> bool:
        return self.level == "ok"


def _pick(candidates: Sequence[Variant], judged: dict[Variant, Judgement]) -> Variant | None:
    """Among ``candidates`` (cheapest first): the cheapest within the allowed drop; when none is, the one that loses
    least (ties: the cheaper). A mixed plan is thereby taken over its all-quantized variant only where it measured
    better: it costs more (wider layers, extra reformats), so it must buy accuracy."""
    measured = [v for v in candidates if v in judged]
    if not measured:
        return candidates[0] if candidates else None
    acceptable = next((v for v in measured if judged[v].acceptable), None)
    return acceptable or min(measured, key=lambda v: (judged[v].loss, VARIANTS[v].cost_rank))


def choose(
    rows: Sequence[MeasuredRow],
    precision: PrecisionChoice = "auto",
    max_drop: float = DEFAULT_MAX_DROP,
    *,
    available: Sequence[Variant | str] = (),
    confidence: float | None = DEFAULT_CONFIDENCE,
) -> Choice:
    """The variant to build/export for ``precision`` ("auto" follows the rule) and the verdict on it.

    ``available`` lists the variants that have an engine (default: every variant with a metric row, plus fp32);
    ``confidence``: the level "within the drop" is decided at, the search's (None: the point estimate).
    """
    judged = judge(rows, max_drop, confidence)
    metric = rows[0].metric if rows else "task metric"
    usable = {parse_variant(v, "available variant") for v in available} if available else set(judged) | {Variant.FP32}
    rule = rule_text(max_drop, metric, usable, confidence)
    candidates = [v for v in COST_ORDER if v in usable]
    rule_variant = next((v for v in candidates if v in judged and judged[v].acceptable), Variant.FP32)
    if precision == "auto":
        variant = rule_variant
    else:
        asked = [v for v in variants_for(precision) if v in usable]
        variant = _pick(asked, judged) or variants_for(precision)[0]
    judgements = tuple(judged[v] for v in COST_ORDER if v in judged)
    if not judged:
        reason = "no task metric was measured against FP32, so this choice is unchecked"
        return Choice(precision, variant, variant, "warning", reason, rule, max_drop, judgements)
    chosen = judged.get(variant)
    if chosen is None:
        reason = f"{variant} has no measured task metric, so this choice is unchecked"
        return Choice(precision, variant, rule_variant, "warning", reason, rule, max_drop, judgements)
    n = chosen.estimate.n
    if variant is Variant.FP32:
        level = "ok"
        reason = f"FP32 is the reference ({metric} {chosen.estimate.text()})"
    elif chosen.acceptable:
        # point-estimate rule only: amber, not green, for a loss the data cannot rule out (the interval reaches past
        # the allowed drop); at a confidence, acceptable already means the interval's worst end is within the drop
        unresolved = not chosen.resolved and chosen.vs_fp32.has_interval
        level = "warning" if unresolved else "ok"
        reason = f"{variant} {_loss_text(chosen.loss, metric)} vs FP32 (allowed loss {max_drop:g}) on {n} samples"
        if chosen.confidence is not None:
            reason += f", loss at most {max(chosen.loss_high, 0.0):.4f} at {chosen.confidence:.0%} confidence"
        elif confidence is not None:
            reason += " (no per-sample scores to pair with FP32's: the point estimate decided)"
        elif unresolved:
            reason += f"; but {n} samples cannot rule out a loss up to {chosen.loss_high:.4f}"
    elif chosen.decided_by_interval:
        level = "warning"
        reason = (
            f"{variant} {_loss_text(chosen.loss, metric)} vs FP32, within the allowed {max_drop:g} by its point "
            f"estimate, but at {chosen.confidence:.0%} confidence it may lose up to {chosen.loss_high:.4f} on {n} "
            "samples: not within the drop by the rule (nor met by the search's criterion); more evaluation samples "
            "could settle it"
        )
    else:
        level = "bad" if chosen.resolved else "warning"
        level_text = f"{chosen.confidence:.0%} paired interval" if chosen.confidence is not None else "95% interval"
        reason = (
            f"{variant} loses {chosen.loss:.4f} of {metric} vs FP32 ({level_text} up to {chosen.loss_high:.4f}), "
            f"more than the allowed {max_drop:g}, on {n} samples"
        )
        if not chosen.resolved:
            reason += " (not resolved: evaluate more samples to be sure)"
    passed_over = [
        judged[v] for v in variants_for(VARIANTS[variant].choice) if VARIANTS[v].mixed and v in judged and v in usable
    ]
    if precision != "auto" and not VARIANTS[variant].mixed and passed_over:
        mixed = passed_over[0]
        reason += (
            f"; {VARIANTS[variant].label} used instead of the mixed plan, which did not measure better "
            f"({mixed.estimate.value:.4f} vs {chosen.estimate.value:.4f})"
            if mixed.loss >= chosen.loss
            else f"; {VARIANTS[variant].label} used: it is within the allowed drop and costs less than the mixed plan"
        )
    if variant != rule_variant and level != "ok":
        reason += f"; the rule picks {rule_variant}"
    return Choice(precision, variant, rule_variant, level, reason, rule, max_drop, judgements)


def next_steps(choice: Choice) -> str:
    """What to try when the chosen engine loses too much."""
    if choice.ok:
        return ""
    steps = []
    if VARIANTS[choice.variant].quantized:
        steps += [
            "give the mixed-precision search more evaluations (search_budget)",
            "another calibration method (percentile or mse often beat max)",
            "more calibration samples",
        ]
    if choice.rule_variant != choice.variant:
        steps.append(f"choose {choice.rule_variant} (what the rule picks) or precision 'auto'")
    if choice.level == "warning":
        steps.append("evaluate more samples (evaluation_samples) to resolve the difference")
    return "Try: " + "; ".join(steps) + "." if steps else ""
