"""Grid alignment ``auto``: with or without :mod:`workbench.calib.align`, whichever quantizes the plan with less
error (measured, not assumed).

Alignment is exact in float and only makes quantization steps finer, so the model-output noise against FP32 measures
what it does: when one side's noise is under :data:`CLEAR_NOISE_RATIO` of the other's, that decides on
:data:`NOISE_SAMPLES` samples with no task evaluation (a top-1 agreement on a few hundred samples moves by points under
any perturbation: EfficientNet-Lite0's alignment scored 0.961 vs 0.965 on the first 256 crops and 0.953 vs 0.946 on
all 1,000, while it more than halved the logits' error). Otherwise the task metric decides when its paired 99 %
interval is clear of zero; else it stays off (a default that changes the model and grows it by its border maps
only where that measurably helps: ocr-rec's noise 5.62e-2 vs 5.50e-2, its exact match 0.9531 vs 0.9453 on 256 lines,
2026-12-05). ``calibrate``'s default for models with a task metric, the
accuracy-target search's start, the quickstart's calibrate stage and the calibration panel choose here; with the weight
rounding ``auto`` too, both are chosen together (:mod:`workbench.calib.quantization_choice`: each rounding is aligned
where its own noise says so, the task metric then picks the rounding).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.calib.paired import paired_half_width
from workbench.model.resources import format_bytes

if TYPE_CHECKING:
    from workbench.calib.qdq import QdqModel
    from workbench.calib.session import CalibrationSession
    from workbench.calib.stats import CalibrationRanges
    from workbench.precision import PrecisionPlan

GRID_ALIGNMENT_CHOICES = ("auto", "on", "off")  # calibrate's --align-grids, the calibration panel's "grids"
NOISE_SAMPLES = 32  # evaluation samples for the output-noise comparison of the two quantizations
# one quantization's output noise under this share of the other's is a clear difference; EfficientNet-Lite0's
# alignment: 2.7e-3 vs 7.4e-3 on 32 samples (2.98e-3 vs 7.19e-3 on 128)
CLEAR_NOISE_RATIO = 0.8
DECISION_CONFIDENCE = 0.99  # two-sided: the task metric decides only when its paired interval is clear of zero


@dataclass(frozen=True)
class AlignmentChoice:
    """What ``align_grids="auto"`` measured and chose for one plan: the relative output noise against FP32 without
    and with alignment (None when no tensor qualifies and nothing was scored), the task metric both ways when the
    noise did not decide, and the evaluations that took."""

    choice: bool
    noise: tuple[float, float] | None  # (without, with), output error energy over FP32's on NOISE_SAMPLES samples
    metrics: Mapping[str, float] = field(default_factory=dict)  # {"without": value, "with": value} when scored
    samples: int = 0
    evaluations: int = 0  # task evaluations it ran
    note: str = ""


def relative_output_noise(
    session: CalibrationSession, protos: Sequence[Any], samples: int = NOISE_SAMPLES
) -> list[float]:
    """Each model's output error energy over the FP32 output energy on the first ``samples`` evaluation samples."""
    from workbench.calib.session import ort_predict
    from workbench.calib.session import relative_output_noise as noise_of

    feeds = [feed for feed, _ in session.entry.evaluation_batches(limit=samples)]
    references = [ort_predict(session.prepared)(feed) for feed in feeds]
    return [noise_of(getattr(proto, "proto", proto), feeds, references) for proto in protos]


def choose_grid_alignment(
    session: CalibrationSession,
    ranges: CalibrationRanges,
    plan: PrecisionPlan,
    limit: int | None,
    plain_scores: Sequence[float] | None = None,
) -> AlignmentChoice:
    """Quantize ``plan`` with and without grid alignment, choose (module docstring) and leave the choice on the
    session; on an error the session keeps the setting it had. ``plain_scores``: the plan's per-sample task scores
    without alignment on the first ``limit`` evaluation samples, when already measured (the rounding choice's)."""
    before = session.align_grids
    try:
        return _choose(session, ranges, plan, limit, plain_scores)
    except BaseException:
        session.align_grids = before
        raise


def _choose(
    session: CalibrationSession,
    ranges: CalibrationRanges,
    plan: PrecisionPlan,
    limit: int | None,
    plain_scores: Sequence[float] | None,
) -> AlignmentChoice:
    pair = quantize_both_ways(session, ranges, plan)
    if isinstance(pair, AlignmentChoice):
        return pair
    plain, aligned = pair
    noise_plain, noise_aligned = relative_output_noise(session, (plain, aligned))
    noise = (noise_plain, noise_aligned)
    by_noise = decide_by_noise(session, plain, aligned, noise)
    if by_noise is not None:
        return by_noise
    return decide_by_metric(session, plain, aligned, noise, limit, plain_scores)


def quantize_both_ways(
    session: CalibrationSession, ranges: CalibrationRanges, plan: PrecisionPlan
) -> tuple[QdqModel, QdqModel] | AlignmentChoice:
    """``plan`` quantized without and with grid alignment (with the session's weight rounding; the session is left
    unaligned), or the choice "off" with its reason when there is nothing to align or aligning fails."""
    session.align_grids = False
    if not session.placement(plan).int8_nodes:
        return AlignmentChoice(
            False, None, note="grid alignment off: the plan has no INT8 tensor (alignment moves INT8 grids only)"
        )
    plain = session.quantize(ranges, plan)  # first: its errors are the plan's own, not alignment's
    session.align_grids = True
    try:
        aligned = session.quantize(ranges, plan)
    except Exception as error:  # an optimization chosen by default never costs the user the model that worked
        return AlignmentChoice(False, None, note=f"grid alignment off: aligning this plan failed ({error})")
    finally:
        session.align_grids = False
    if aligned.alignment is None or not aligned.alignment.rewritten:
        return AlignmentChoice(
            False,
            None,
            note="grid alignment off: no tensor qualifies (no 8-bit-pixel input, no non-negative tensor read by "
            "Convs only)",
        )
    return plain, aligned


def noise_clear(noise: tuple[float, float]) -> bool | None:
    """True / False when the (without, with) output noise shows alignment clearly lowers / raises it, else None."""
    noise_plain, noise_aligned = noise
    if min(noise_plain, noise_aligned) < CLEAR_NOISE_RATIO * max(noise_plain, noise_aligned):
        return noise_aligned < noise_plain
    return None


def _noise_text(plain: QdqModel, aligned: QdqModel, noise: tuple[float, float]) -> str:
    noise_plain, noise_aligned = noise
    text = f"output noise {noise_plain:.2e} -> {noise_aligned:.2e} on {NOISE_SAMPLES} samples"
    # what it costs: the border maps are constants the size of a Conv's output, in the model and in the engine
    if aligned.alignment is not None and aligned.alignment.border_maps:
        plain_bytes = plain.proto.ByteSize()
        text += (
            f"; its {len(aligned.alignment.border_maps)} border map(s) add "
            f"{format_bytes(aligned.proto.ByteSize() - plain_bytes)} to the model's {format_bytes(plain_bytes)} "
            "(the engine grows about as much)"
        )
    return text


def decide_by_noise(
    session: CalibrationSession, plain: QdqModel, aligned: QdqModel, noise: tuple[float, float]
) -> AlignmentChoice | None:
    """The choice when the output noise decides (:func:`noise_clear`), left on the session; None when it does not."""
    clear = noise_clear(noise)
    if clear is None:
        return None
    session.align_grids = clear
    return AlignmentChoice(
        clear,
        noise,
        note=f"grid alignment {'on' if clear else 'off'}: {_noise_text(plain, aligned, noise)}, a clear difference "
        f"(under {CLEAR_NOISE_RATIO:.0%} of the other side), so it decides (no task evaluation)",
    )


def decide_by_metric(
    session: CalibrationSession,
    plain: QdqModel,
    aligned: QdqModel,
    noise: tuple[float, float],
    limit: int | None,
    plain_scores: Sequence[float] | None,
) -> AlignmentChoice:
    """The task metric decides (the noise did not): on only when its paired 99 % interval is clear of zero."""
    evaluations = 1
    if plain_scores is None or len(plain_scores) == 0:
        plain_scores = session.evaluate(plain, limit=limit).scores
        evaluations = 2
    plain_array = np.asarray(plain_scores, dtype=np.float64)
    result = session.evaluate(aligned, limit=limit)
    higher = bool(session.entry.higher_is_better)
    gain = (np.asarray(result.scores, dtype=np.float64) - plain_array) * (1.0 if higher else -1.0)
    half = paired_half_width(result.scores, plain_array, DECISION_CONFIDENCE) if gain.size > 1 else np.inf
    if gain.size and gain.mean() - half > 0:
        session.align_grids, why = True, f"the task metric gains (paired {DECISION_CONFIDENCE:.0%} interval above 0)"
    elif gain.size and gain.mean() + half < 0:
        session.align_grids, why = False, f"the task metric loses (paired {DECISION_CONFIDENCE:.0%} interval below 0)"
    else:
        session.align_grids = False
        why = "neither the noise nor the task metric shows a clear difference, so it stays off"
    without = float(plain_array.mean()) if plain_array.size else float("nan")
    return AlignmentChoice(
        session.align_grids,
        noise,
        {"without": without, "with": float(result.value)},
        int(gain.size),
        evaluations,
        f"grid alignment {'on' if session.align_grids else 'off'}: {_noise_text(plain, aligned, noise)}; the plan "
        f"scores {without:.4f} without and {float(result.value):.4f} with it on {gain.size} samples; {why}; "
        f"{evaluations} task evaluation(s)",
    )
