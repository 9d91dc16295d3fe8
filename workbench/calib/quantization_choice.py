"""Weight rounding and grid alignment both ``auto``: chosen together, each where it is measured best.

The two interact: grid alignment lowers the activations' error, which shows in the model's output only where the
weights' error does not drown it. EfficientNet-Lite0 all-INT8 (2026-12-06, 32 crops): alignment takes the output
noise from 1.89e-2 to 1.56e-2 with nearest weights (ratio 0.82: not clear) but from 6.92e-3 to 2.78e-3 with GPTQ
weights (0.40); and GPTQ's top-1 gain is +0.020 [+0.002, +0.038] on 1,000 crops without alignment (unclear on the
first 256) but +0.052 [+0.035, +0.069] with it (+0.051 [+0.016, +0.085] on the first 256). Choosing the rounding on
the plain model and the alignment after it (one at a time) measured each where its effect is smallest.

So, when GPTQ can be scored: (1) both roundings are quantized without and with alignment and each rounding's
alignment is taken from the output noise where it is clear (:func:`workbench.calib.alignment_choice.noise_clear`;
one FP32 pass on :data:`~workbench.calib.alignment_choice.NOISE_SAMPLES` samples, no task evaluation), else without;
(2) the task metric chooses the rounding between the two, each with its alignment
(:func:`workbench.calib.rounding_choice.choose_weight_rounding`, paired per sample as before); (3) when the chosen
rounding's alignment was not clear from the noise, the task metric decides it as
:func:`~workbench.calib.alignment_choice.choose_grid_alignment` does (the rounding's scores are its plain scores).
Where GPTQ cannot be scored (no 8-bit weight, no per-sample metric, too few calibration batches) or nothing can be
aligned, the rounding is chosen first and the alignment after it, as before. ``calibrate``, the accuracy-target
search, the quickstart and the calibration panel choose here when both are ``auto``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.calib.alignment_choice import (
    AlignmentChoice,
    choose_grid_alignment,
    decide_by_metric,
    decide_by_noise,
    noise_clear,
    quantize_both_ways,
    relative_output_noise,
)
from workbench.calib.rounding_choice import RoundingChoice, choose_weight_rounding

if TYPE_CHECKING:
    from workbench.calib.rounding import WeightRounding
    from workbench.calib.session import CalibrationSession
    from workbench.calib.stats import CalibrationRanges
    from workbench.precision import PrecisionPlan


def choose_rounding_and_alignment(
    session: CalibrationSession,
    ranges: CalibrationRanges,
    plan: PrecisionPlan,
    limit: int | None,
    *,
    second_look: bool = False,
    whole_limit: int | None = None,
) -> tuple[RoundingChoice, AlignmentChoice]:
    """Choose the weight rounding and the grid alignment of ``plan`` together (module docstring) on the first
    ``limit`` evaluation samples and leave both on the session; ``second_look`` and ``whole_limit`` as in
    :func:`~workbench.calib.rounding_choice.choose_weight_rounding`. On an error the session keeps what it had."""
    before = session.weight_rounding, session.align_grids
    try:
        return _choose(session, ranges, plan, limit, second_look, whole_limit)
    except BaseException:
        session.weight_rounding, session.align_grids = before
        raise


def _gptq_can_be_scored(session: CalibrationSession, plan: PrecisionPlan, limit: int | None) -> bool:
    """GPTQ has weights to round, layer inputs to round them with and a metric with per-sample scores to pair."""
    if not session.placement(plan).weights:
        return False
    if len(session.evaluate(limit=limit).scores) < 2:  # the FP32 metric: kept in the zoo cache folder
        return False
    return bool(session.layer_inputs())


def _choose(
    session: CalibrationSession,
    ranges: CalibrationRanges,
    plan: PrecisionPlan,
    limit: int | None,
    second_look: bool,
    whole_limit: int | None,
) -> tuple[RoundingChoice, AlignmentChoice]:
    def one_at_a_time() -> tuple[RoundingChoice, AlignmentChoice]:
        session.align_grids = False
        rounding = choose_weight_rounding(
            session, ranges, plan, limit, second_look=second_look, whole_limit=whole_limit
        )
        return rounding, choose_grid_alignment(session, ranges, plan, limit, rounding.scores)

    if not _gptq_can_be_scored(session, plan, limit):
        return one_at_a_time()
    pairs = {}
    roundings: tuple[WeightRounding, ...] = ("nearest", "gptq")
    for name in roundings:
        session.weight_rounding = name
        pair = quantize_both_ways(session, ranges, plan)
        if isinstance(pair, AlignmentChoice):  # nothing to align here (or aligning fails): the rounding alone
            return one_at_a_time()
        pairs[name] = pair
    values = relative_output_noise(session, [model for pair in pairs.values() for model in pair])
    noise = {"nearest": (values[0], values[1]), "gptq": (values[2], values[3])}
    aligned = {name: bool(noise_clear(noise[name])) for name in pairs}  # not clear: without, for now
    rounding = choose_weight_rounding(
        session, ranges, plan, limit, second_look=second_look, whole_limit=whole_limit, alignments=aligned
    )
    session.weight_rounding = rounding.choice
    plain, with_alignment = pairs[rounding.choice]
    alignment = decide_by_noise(session, plain, with_alignment, noise[rounding.choice])
    if alignment is None:  # the chosen rounding was scored without alignment: its scores are the plain ones
        alignment = decide_by_metric(session, plain, with_alignment, noise[rounding.choice], limit, rounding.scores)
    return rounding, alignment
