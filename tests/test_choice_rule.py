"""The engine-choice rule and the intervals it rests on, on metric tables recorded from real runs (issue 16).

Scores are per-sample right/wrong lists with the recorded counts; the rule sees what the quickstart's metrics stage
hands it (MetricRow with scores).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.calib.search import paired_bound
from workbench.errors import WorkbenchError
from workbench.flow import MetricRow, choose, recommend
from workbench.flow.choose import EngineCandidate
from workbench.flow.config import QuickstartConfig
from workbench.flow.rule import judge
from workbench.flow.uncertainty import bootstrap_interval, estimate, paired_difference, wilson_interval
from workbench.precision import Variant


def _row(variant: str, right: int, n: int, wrong_first: bool = False, metric: str = "top1_agreement") -> MetricRow:
    scores = [0.0] * (n - right) + [1.0] * right if wrong_first else [1.0] * right + [0.0] * (n - right)
    return MetricRow(variant, f"{variant}.onnx", metric, right / n, n, True, 0.0, tuple(scores))


def test_wilson_interval_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for k, n in ((57, 64), (64, 64), (0, 10), (397, 400), (31, 32)):
        expected = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((expected.low, expected.high), abs=1e-9)


def test_estimate_picks_wilson_for_right_wrong_and_bootstrap_otherwise() -> None:
    accuracy = estimate(0.5, 4, (1.0, 0.0, 1.0, 0.0))
    assert accuracy.method == "Wilson 95%" and accuracy.low < 0.5 < accuracy.high
    cosine = estimate(0.95, 5, (0.9, 0.95, 1.0, 0.93, 0.97))
    assert cosine.method == "bootstrap 95%" and 0.9 <= cosine.low < 0.95 < cosine.high <= 1.0
    assert bootstrap_interval([0.9, 0.95, 1.0, 0.93, 0.97]) == bootstrap_interval([0.9, 0.95, 1.0, 0.93, 0.97])
    assert not estimate(0.4, 10).has_interval and "no interval" in estimate(0.4, 10).text()


def test_efficientnet_mixed_int8_losing_eleven_points_is_not_chosen_under_green() -> None:
    """Recorded: FP32 1.0, mixed INT8 0.8906 on 64 samples was chosen and exported under 'done'."""
    rows = [_row("fp32", 64, 64), _row("fp16", 64, 64), _row("int8-all", 58, 64), _row("int8-mixed", 57, 64)]
    asked_int8 = choose(rows, "int8", 0.01)
    assert asked_int8.variant == "int8-all"  # the mixed plan measured worse and costs more: never taken
    assert asked_int8.level == "bad" and not asked_int8.ok  # a resolved loss beyond the allowed drop
    assert "loses 0.0938" in asked_int8.reason and "the rule picks fp16" in asked_int8.reason
    auto = choose(rows, "auto", 0.01)
    assert auto.variant == "fp16" and auto.ok


def test_max_calibration_all_int8_beats_mixed_so_mixed_is_not_chosen() -> None:
    """Recorded: int8-all 0.9950, int8-mixed 0.9925 (400 samples) and mixed was chosen."""
    rows = [_row("fp32", 400, 400), _row("fp16", 400, 400), _row("int8-all", 398, 400), _row("int8-mixed", 397, 400)]
    # the point-estimate rule (confidence=None): within the allowed drop, but 400 samples cannot rule out a loss past
    # it: amber, not green (issue 24)
    for precision in ("int8", "auto"):
        choice = choose(rows, precision, 0.01, confidence=None)
        assert choice.variant == "int8-all", choice
        judged = next(j for j in choice.judgements if j.variant == "int8-all")
        assert judged.acceptable and not judged.resolved and judged.loss_high > 0.01
        assert choice.level == "warning" and not choice.ok and "cannot rule out" in choice.reason
    # with a tighter tolerance the samples cannot say whether all-INT8 loses too much: amber, not red, not green
    tight = choose(rows, "int8", 0.001, confidence=None)
    assert tight.level == "warning" and "not resolved" in tight.reason and tight.rule_variant == "fp16"


def test_rule_decides_at_the_searchs_confidence_by_default() -> None:
    """The same 400 samples under the default rule (95 %, the search's criterion): all-INT8's 2 wrong samples are
    within 0.01 by the point estimate, but its paired interval reaches 0.0119, so the search would call it not met;
    the rule does not pick it either (auto takes FP16), and asked for INT8 it says why in amber."""
    rows = [_row("fp32", 400, 400), _row("fp16", 400, 400), _row("int8-all", 398, 400), _row("int8-mixed", 397, 400)]
    auto = choose(rows, "auto", 0.01)
    assert auto.variant == auto.rule_variant == "fp16" and auto.ok
    assert "at 95% confidence" in auto.rule
    asked = choose(rows, "int8", 0.01)
    judged = next(j for j in asked.judgements if j.variant == "int8-all")
    assert judged.point_within and not judged.acceptable and judged.decided_by_interval
    assert judged.confidence == 0.95 and judged.loss_high == pytest.approx(0.0119, abs=1e-4)
    assert asked.variant == "int8-all" and asked.level == "warning" and "may lose up to 0.0119" in asked.reason
    assert "the rule picks fp16" in asked.reason
    # a mixed plan the search met at 95 % is what the rule takes over an all-INT8 plan that only its point estimate met
    met = [_row("fp32", 400, 400), _row("int8-all", 398, 400), _row("int8-mixed", 400, 400)]
    assert choose(met, "int8", 0.01).variant == choose(met, "auto", 0.01).variant == "int8-mixed"
    # an interval wholly within the drop is green, and says the bound
    wide = choose(rows, "auto", 0.05)
    assert wide.variant == "int8-all" and wide.ok and "at 95% confidence" in wide.reason


@settings(max_examples=120, deadline=None)
@given(
    st.integers(min_value=2, max_value=300),
    st.data(),
    st.sampled_from([0.0, 0.005, 0.01, 0.05]),
    st.sampled_from([0.5, 0.9, 0.95, 0.99]),
    st.booleans(),
    st.booleans(),
)
def test_rule_and_search_agree_on_every_score_table(
    n: int, data: st.DataObject, drop: float, level: float, higher: bool, binary: bool
) -> None:
    """For any per-sample scores (right/wrong or continuous, higher- or lower-is-better), the rule's "within the
    drop" is the search's "target met" (point estimate and the paired bound, :func:`workbench.calib.search.
    paired_bound`, with the search's slack), so the journey never exports a variant its own search would reject,
    nor rejects one the search met."""
    values = st.sampled_from([0.0, 1.0]) if binary else st.floats(0.0, 1.0, allow_nan=False).map(lambda v: round(v, 3))
    fp32_scores = data.draw(st.lists(values, min_size=n, max_size=n))
    plan_scores = data.draw(st.lists(values, min_size=n, max_size=n))
    # a metric that is not the mean of its per-sample scores (a ratio of sums, e.g. a character error rate) moves the
    # point estimate off the paired mean: the search still decides on both, and so must the rule
    offset = data.draw(st.sampled_from([0.0, 0.0, 0.003, -0.004]))
    fp32_value, plan_value = sum(fp32_scores) / n, sum(plan_scores) / n + offset
    rows = [
        MetricRow("fp32", "a", "m", fp32_value, n, higher, 0.0, tuple(fp32_scores)),
        MetricRow("int8-all", "b", "m", plan_value, n, higher, plan_value - fp32_value, tuple(plan_scores)),
    ]
    judged = next(j for j in choose(rows, "int8", drop, confidence=level).judgements if j.variant == "int8-all")
    target = fp32_value - drop if higher else fp32_value + drop
    bound = paired_bound(plan_scores, fp32_scores, fp32_value, level, higher)

    def meets(value: float) -> bool:  # search_mixed_precision's meets()
        return value >= target - 1e-9 if higher else value <= target + 1e-9

    search_met = meets(plan_value) and (math.isnan(bound) or meets(bound))
    if min(abs(bound - target), abs(plan_value - target)) > 1e-9:  # sums in another order may land either side
        assert judged.acceptable == search_met
        assert judged.confidence == (None if math.isnan(bound) else level)


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=2, max_value=300), st.data(), st.booleans(), st.booleans())
def test_the_difference_a_table_shows_is_the_interval_that_decides(
    n: int, data: st.DataObject, higher: bool, binary: bool
) -> None:
    """The "vs FP32" interval of the metrics table is the paired interval the rule (and the search) decide on at
    95 %: its worst end is the "loss at most / up to" beside it, so the two columns cannot disagree."""
    values = st.sampled_from([0.0, 1.0]) if binary else st.floats(0.0, 1.0, allow_nan=False).map(lambda v: round(v, 3))
    fp32_scores = data.draw(st.lists(values, min_size=n, max_size=n))
    plan_scores = data.draw(st.lists(values, min_size=n, max_size=n))
    fp32_value, plan_value = sum(fp32_scores) / n, sum(plan_scores) / n
    rows = [
        MetricRow("fp32", "a", "m", fp32_value, n, higher, 0.0, tuple(fp32_scores)),
        MetricRow("int8-all", "b", "m", plan_value, n, higher, plan_value - fp32_value, tuple(plan_scores)),
    ]
    judged = judge(rows, 0.01, confidence=0.95)[Variant.INT8_ALL]
    shown = judged.vs_fp32
    assert shown.method == "paired normal 95%" and shown.n == n and judged.confidence == 0.95
    worst_loss = -shown.low if higher else shown.high  # a loss is a fall (higher-is-better) or a rise
    assert judged.loss_high == pytest.approx(worst_loss, abs=1e-12)
    assert shown.low <= shown.delta + 1e-12 and shown.delta <= shown.high + 1e-12


def test_differences_small_samples_cannot_resolve_are_called_noise() -> None:
    """Recorded in notebook 03 (32 samples): 0.9688 -> 0.9375 -> 0.8750 as more layers go to FP32."""
    fp32 = _row("fp32", 31, 32)
    one_more_wrong = _row("int8-mixed", 30, 32)
    difference = paired_difference(fp32.value, fp32.scores, one_more_wrong.value, one_more_wrong.scores)
    assert difference.delta == pytest.approx(-1 / 32) and difference.within_noise
    rows = [fp32, _row("int8-all", 31, 32), one_more_wrong]
    judged = choose(rows, "auto", 0.01).judgements
    assert {j.variant: j.vs_fp32.within_noise for j in judged}["int8-mixed"]
    # the same one-in-32 difference, 32x more often, is resolved
    big = paired_difference(1.0, [1.0] * 1024, 31 / 32, [1.0] * 992 + [0.0] * 32)
    assert not big.within_noise and big.high < 0


def test_metric_where_lower_is_better_and_missing_rows() -> None:
    lower = [
        MetricRow("fp32", "a", "cer", 0.10, 4, False, 0.0, (0.1, 0.1, 0.1, 0.1)),
        MetricRow("int8-all", "b", "cer", 0.30, 4, False, 0.2, (0.3, 0.3, 0.3, 0.3)),
    ]
    choice = choose(lower, "int8", 0.05)
    assert choice.level == "bad" and choice.rule_variant == "fp32"
    unchecked = choose([], "int8", 0.01)
    assert unchecked.level == "warning" and "unchecked" in unchecked.reason


def test_recommend_over_candidates_uses_the_same_rule() -> None:
    def candidate(precision: str, variant: str, delta: float, throughput: float) -> EngineCandidate:
        return EngineCandidate(precision, variant, "", 1.0, 10, "acc", 1 + delta, delta, True, throughput, 1.0, "cpu")

    fast_but_bad = candidate("int8", "int8-mixed", -0.109, 900.0)
    fp16 = candidate("fp16", "fp16", 0.0, 300.0)
    fp32 = candidate("fp32", "fp32", 0.0, 500.0)  # faster on this CPU, but not the cheaper TensorRT engine
    assert recommend([fast_but_bad, fp16, fp32], 0.01) is fp16
    assert recommend([fast_but_bad], 0.01) is None


def test_recommend_and_the_config_decide_at_the_rules_confidence() -> None:
    def candidate(variant: str, delta: float, bound: float) -> EngineCandidate:
        return EngineCandidate(
            variant[:4], variant, "", 1.0, 10, "acc", 1 + delta, delta, True, 100.0, 1.0, "cpu", loss_bound=bound
        )

    only_point = candidate("int8-all", -0.005, 0.0119)  # within 0.01 by the point estimate, not at 95 %
    fp16 = candidate("fp16", 0.0, 0.0)
    assert recommend([only_point, fp16], 0.01) is fp16
    assert recommend([only_point, fp16], 0.02) is only_point
    assert recommend([candidate("int8-all", -0.005, math.nan)], 0.01) is not None  # no interval: the point estimate
    assert QuickstartConfig().decision_confidence == 0.95
    assert QuickstartConfig(confidence=0.0).decision_confidence is None
    for bad in (0.3, 1.0, "0.95", True):
        with pytest.raises(WorkbenchError, match="confidence"):
            QuickstartConfig(confidence=bad)  # type: ignore[arg-type]


def test_verdict_texts_at_a_confidence() -> None:
    """The metrics table says where the deciding bound lies (never a negative loss), a low decision level never turns
    a verdict red on its own narrow interval (red blocks export: it needs 95 %), and without per-sample scores the
    reason says the point estimate decided."""
    from workbench.report.tables import metrics_table_html

    gain = [_row("fp32", 390, 400), _row("int8-all", 400, 400)]
    table = metrics_table_html(gain, max_drop=0.01)
    assert "within 0.01 of FP32 at 95%" in table and "yes (loss at most 0.0000)" in table and "-0." not in table
    rows = [
        _row("fp32", 400, 400),
        _row("int8-all", 392, 400),
    ]  # loses 0.02 (8 samples): 95 % low end 0.0063, 50 % 0.0153
    at_half = choose(rows, "int8", 0.012, confidence=0.5)
    assert not at_half.ok and at_half.level == "warning", at_half  # resolved past 0.012 at 50 %, not at 95 %
    assert choose(rows, "int8", 0.005, confidence=0.5).level == "bad"  # resolved at 95 % too
    no_scores = [MetricRow(v, "x", "f1", value, 1, True, 0.0, ()) for v, value in (("fp32", 0.9), ("int8-all", 0.9))]
    unpaired = choose(no_scores, "int8", 0.01)
    assert unpaired.ok and "the point estimate decided" in unpaired.reason
