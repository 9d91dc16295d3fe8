"""Weight rounding ``auto``: nearest or GPTQ, whichever gives the plan the better task metric (measured, not assumed).

GPTQ helps some models and hurts others (all-INT8, 2026-12-05: EfficientNet-Lite0 0.907 -> 0.946, ocr-rec 0.983 ->
0.890, where it drops the spaces between words that FP32 only just keeps), and no per-layer error measure predicts
which: so the plan is scored both ways on the same evaluation samples and GPTQ is kept only when its paired gain is
clear (:func:`workbench.calib.rounding.gptq_gains`: a paired 95 % interval above zero and an exact sign test).
``calibrate``'s default for models with a task metric, the accuracy-target search's start, and the quickstart's
calibrate and FP8 stages all choose here; where the grid alignment is ``auto`` too, each rounding is scored with the
alignment its output noise asks for (:mod:`workbench.calib.quantization_choice`).

Scored on the first ``limit`` samples only (the search's screen), a gain of a few points is often not clear though
it is real: EfficientNet-Lite0's INT8 gain on 256 crops was +0.059 [+0.023, +0.095] with one set of ranges and
+0.031 [-0.001, +0.064] with ranges moved by at most 1.2 % (2026-12-06), while on 2,000 crops it is +0.045 [+0.032,
+0.058]. So in the accuracy-target search, when its screen leaves the gain unclear but above zero, both roundings
are scored on the rest of the search's evaluation set too (only the samples not yet run) and that set decides
(``second_look``). Elsewhere the limit is the user's evaluation budget (``--eval-limit``, the quickstart's and the
calibration panel's evaluation samples), which a choice does not overrun.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from workbench.calib.rounding import ROUNDING_CONFIDENCE, WeightRounding, gptq_gains, rounding_gain

if TYPE_CHECKING:
    from workbench.calib.qdq import QdqModel
    from workbench.calib.session import CalibrationSession
    from workbench.calib.stats import CalibrationRanges
    from workbench.precision import PrecisionPlan
    from workbench.zoo.base import MetricResult


@dataclass(frozen=True)
class RoundingChoice:
    """What ``weight_rounding="auto"`` measured and chose: the plan's task metric with each rounding on the same
    first ``samples`` evaluation samples and GPTQ's paired gain (none when GPTQ has no layer to round: nearest)."""

    choice: WeightRounding
    metrics: Mapping[str, float]  # what was scored: {"nearest": value, "gptq": value}, or fewer
    samples: int  # the samples the choice was made on (the whole set after a second look)
    scores: tuple[float, ...]  # the chosen rounding's per-sample scores on the first `limit` samples (reused)
    gain: tuple[float, float, float] | None  # GPTQ's mean per-sample gain and its paired interval (low, high)
    note: str
    # the chosen model (QdqModel) and its (predictions, labels, indices) on the samples it was scored on: a caller
    # quantizing the same model again (the search's start plan, compared by model_digest) need not run them again
    predictions: Any = field(default=None, compare=False, repr=False)
    model: Any = field(default=None, compare=False, repr=False)
    model_sha256: str = field(default="", compare=False, repr=False)  # the model's digest once it is let go

    @property
    def evaluations(self) -> int:
        return len(self.metrics)

    def digest(self) -> str:
        """:func:`model_digest` of the chosen model ("" when none was kept)."""
        return self.model_sha256 or (model_digest(self.model) if self.model is not None else "")

    def without_model(self) -> RoundingChoice:
        """The choice with its model's digest in place of the model: what a later stage needs to recognise the model
        (the quickstart keeps the choice for the whole session; a ViT-B/16's Q/DQ model is 340 MB)."""
        return replace(self, model=None, model_sha256=self.digest())


def _nearest(
    note: str, scored: MetricResult | None = None, predictions: Any = None, model: QdqModel | None = None
) -> RoundingChoice:
    """Nearest kept without GPTQ being scored; ``scored``: the plan's nearest-rounded metric when it was measured
    (``predictions``: what it scored, of ``model``)."""
    if scored is None:
        return RoundingChoice("nearest", {}, 0, (), None, note)
    scores = tuple(float(s) for s in scored.scores)
    return RoundingChoice(
        "nearest", {"nearest": float(scored.value)}, int(scored.n_samples), scores, None, note, predictions, model
    )


def choose_weight_rounding(
    session: CalibrationSession,
    ranges: CalibrationRanges,
    plan: PrecisionPlan,
    limit: int | None,
    *,
    second_look: bool = False,
    whole_limit: int | None = None,
    alignments: Mapping[WeightRounding, bool] | None = None,
) -> RoundingChoice:
    """Score ``plan`` with nearest and with GPTQ weight rounding on the first ``limit`` evaluation samples of the
    session's task metric and leave the choice on the session (GPTQ only when :func:`gptq_gains`); on an error the
    session keeps the rounding it had. ``second_look`` (the search: ``limit`` is its screen): a gain above zero that
    is not clear there is scored again on the first ``whole_limit`` samples (None: all) and decided there; two looks
    at 95 % each keep GPTQ wrongly at most about 5 % of the time (2.5 % per look, one-sided). ``alignments``: the
    grid alignment each rounding is quantized with ({"nearest": bool, "gptq": bool}, left on the session with the
    choice; :mod:`workbench.calib.quantization_choice`); None: the session's own setting for both."""
    before = session.weight_rounding, session.align_grids
    try:
        return _choose(session, ranges, plan, limit, whole_limit if second_look else limit, alignments)
    except BaseException:
        session.weight_rounding, session.align_grids = before
        raise


def _choose(
    session: CalibrationSession,
    ranges: CalibrationRanges,
    plan: PrecisionPlan,
    limit: int | None,
    whole_limit: int | None,
    alignments: Mapping[WeightRounding, bool] | None = None,
) -> RoundingChoice:
    def use(rounding: WeightRounding) -> None:
        session.weight_rounding = rounding
        if alignments is not None:
            session.align_grids = bool(alignments[rounding])

    def called(rounding: WeightRounding) -> str:
        """The rounding as the note names it, with the alignment it was scored with when that was chosen too."""
        name = "rounded to nearest" if rounding == "nearest" else "with GPTQ"
        if alignments is None:
            return name
        return f"{name} ({'grid-aligned' if alignments[rounding] else 'no grid alignment'})"

    use("nearest")
    nearest_model = session.quantize(ranges, plan)
    if not nearest_model.placement.weights:
        return _nearest("weights rounded to nearest: the plan has no 8-bit weight for GPTQ to round")
    kept: dict[str, Any] = {}

    def score_on(name: str, model: QdqModel, limit: int | None) -> MetricResult:
        """The task metric of ``model`` (its predictions kept: a second look runs only the samples after them)."""
        result, kept[name] = session.evaluate_kept(model, limit=limit, earlier=kept.get(name))
        return result

    results = {"nearest": score_on("nearest", nearest_model, limit)}
    scored = len(results["nearest"].scores)
    if scored < 2:  # a metric that is one number for the set (mAP-like); --eval-limit 1 scores one sample
        what = "no per-sample scores" if not scored else "one sample"
        return _nearest(
            f"weights rounded to nearest: the task metric ({results['nearest'].name}) has {what} to pair GPTQ's "
            "against (GPTQ not scored)",
            results["nearest"],
            kept["nearest"],
            nearest_model,
        )
    if not session.layer_inputs():
        return _nearest(
            "weights rounded to nearest: GPTQ has no layer to round here (it needs two calibration batches: one "
            "fits it, one checks it)",
            results["nearest"],
            kept["nearest"],
            nearest_model,
        )
    use("gptq")
    gptq_model = session.quantize(ranges, plan)
    results["gptq"] = score_on("gptq", gptq_model, limit)
    higher = bool(session.entry.higher_is_better) if session.entry is not None else True

    def decide() -> tuple[dict[str, Any], bool, bool]:
        """(each rounding's judged output, same_output, clear) on the samples scored so far."""
        # a metric judged on the worst of several outputs pairs per sample only while both judge the same output
        worst = {name: result.details.get("worst_output") for name, result in results.items()}
        same = worst["nearest"] == worst["gptq"]
        gains = same and gptq_gains(results["nearest"].scores, results["gptq"].scores, higher_is_better=higher)
        return worst, same, gains

    worst, same_output, clear = decide()
    screen = int(results["nearest"].n_samples)
    total = session.entry.split_size("evaluation") if session.entry is not None else screen
    whole = total if whole_limit is None else min(whole_limit, total)
    looked_again = False
    if not clear and same_output and whole > screen:
        mean_gain = rounding_gain(results["nearest"].scores, results["gptq"].scores, higher_is_better=higher)[0]
        if mean_gain > 0:  # unclear but above zero on the screen: the whole set decides
            results["nearest"] = score_on("nearest", nearest_model, whole_limit)
            results["gptq"] = score_on("gptq", gptq_model, whole_limit)
            worst, same_output, clear = decide()
            looked_again = True
    nearest_scores, gptq_scores = results["nearest"].scores, results["gptq"].scores
    choice: WeightRounding = "gptq" if clear else "nearest"
    use(choice)
    mean, low, high = rounding_gain(nearest_scores, gptq_scores, higher_is_better=higher)
    samples = int(results["nearest"].n_samples)
    why = (
        "clear"
        if choice == "gptq"
        else "not clear of zero"
        if same_output
        else f"not comparable: the worst output moved from {worst['nearest']!r} to {worst['gptq']!r}"
    )
    return RoundingChoice(
        choice,
        {name: float(result.value) for name, result in results.items()},
        samples,
        tuple(float(s) for s in results[choice].scores[:screen]),  # on the first `limit` samples, as documented
        (mean, low, high),
        f"weights rounded by {'GPTQ' if choice == 'gptq' else 'nearest'}: the plan scores "
        f"{results['nearest'].value:.4f} {called('nearest')} and {results['gptq'].value:.4f} {called('gptq')} on "
        "the first "
        f"{samples} evaluation samples"
        + (f" (unclear on the first {screen}, so both were scored on the rest too)" if looked_again else "")
        + f"; GPTQ's paired gain {mean:+.4f} [{low:+.4f}, {high:+.4f}] ({ROUNDING_CONFIDENCE:.0%}) is {why} "
        f"(weight rounding auto: {4 if looked_again else 2} evaluations)",
        kept[choice],
        gptq_model if choice == "gptq" else nearest_model,
    )


def model_digest(model: QdqModel) -> str:
    """sha256 of a model's deterministic serialization: the same Q/DQ model quantized twice has the same digest."""
    import hashlib

    return hashlib.sha256(model.proto.SerializeToString(deterministic=True)).hexdigest()
