"""Weight rounding and grid alignment chosen together (workbench.calib.quantization_choice), and the search's start
plan scored once: real zoo models (digits-cnn: its alignment left to the task metric; ocr-cls: decided by the output
noise), real ONNX Runtime."""

from __future__ import annotations

import pytest

from workbench.calib.session import CalibrationSession
from workbench.ort import cpu_predict

EVAL = 96


def _session(name: str) -> CalibrationSession:
    from workbench.zoo import get_entry

    entry = get_entry(name)
    feeds = list(entry.calibration_batches(limit=64, batch_size=8))
    return CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)


@pytest.mark.parametrize("name", ["digits-cnn", "ocr-cls"])
def test_each_rounding_gets_the_alignment_its_noise_shows_and_the_task_metric_picks_the_rounding(name) -> None:
    """Both roundings are quantized with and without alignment; each rounding is aligned where the output noise
    clearly says so; the rounding is then chosen on the task metric between the two, each with its alignment, and
    the session is left on exactly the model that was scored (its predictions handed on are that model's)."""
    from workbench.calib.alignment_choice import noise_clear, relative_output_noise
    from workbench.calib.quantization_choice import choose_rounding_and_alignment
    from workbench.calib.rounding import gptq_gains
    from workbench.calib.rounding_choice import model_digest

    session = _session(name)
    ranges, plan = session.ranges("mse"), session.default_plan("int8")
    models = {}
    for rounding in ("nearest", "gptq"):
        for aligned in (False, True):
            session.weight_rounding, session.align_grids = rounding, aligned
            models[rounding, aligned] = session.quantize(ranges, plan)
    noise = dict(zip(models, relative_output_noise(session, list(models.values()))))
    expected_alignment = {
        r: bool(noise_clear((noise[r, False], noise[r, True]))) for r in ("nearest", "gptq")
    }  # not clear: without, until the rounding is chosen

    session.weight_rounding, session.align_grids = "nearest", True  # whatever a last run left
    rounding, alignment = choose_rounding_and_alignment(session, ranges, plan, EVAL)

    for name, label in (("nearest", "rounded to nearest"), ("gptq", "with GPTQ")):
        said = "grid-aligned" if expected_alignment[name] else "no grid alignment"
        assert f"{label} ({said})" in rounding.note, rounding.note
    entry = session.entry
    scores = {
        r: entry.evaluate(cpu_predict(models[r, expected_alignment[r]].proto), limit=EVAL).scores
        for r in ("nearest", "gptq")
    }
    clear = gptq_gains(scores["nearest"], scores["gptq"], higher_is_better=entry.higher_is_better)
    assert rounding.choice == ("gptq" if clear else "nearest") == session.weight_rounding
    # the alignment: the chosen rounding's noise where it is clear (no task evaluation), else the task metric's call
    by_noise = noise_clear((noise[rounding.choice, False], noise[rounding.choice, True]))
    if by_noise is not None:
        assert alignment.choice == by_noise and alignment.evaluations == 0
    else:
        assert alignment.evaluations == 1 and "task metric" in alignment.note
    assert session.align_grids == alignment.choice
    # the session now quantizes the very model the choice scored (when the alignment did not change it after)
    chosen = session.quantize(ranges, plan)
    if alignment.choice == expected_alignment[rounding.choice]:
        assert model_digest(chosen) == model_digest(rounding.model)
        predictions, labels, indices = rounding.predictions
        assert len(indices) == EVAL
        assert entry._metric(predictions, labels, indices).scores == scores[rounding.choice]


def test_the_search_scores_its_start_plan_once_and_fills_the_prefix_cache_only_for_trials() -> None:
    """With both choices auto, the start plan is the model the choice scored: its screening record is those
    predictions and its whole-set confirmation runs only the rest, each score as a fresh evaluation gives; a start
    plan that meets the target fills no prefix cache. Trials (an unreachable target) fill it then, and score as
    without it."""
    from workbench.calib.search import search_mixed_precision

    session = _session("ocr-cls")  # 3 of its first 120 lines disagree with FP32: the scores are not all equal
    kwargs = {"limit": 120, "screen": 48, "build_costs": False, "weight_rounding": "auto", "align_grids": "auto"}
    (
        session.evaluate(limit=48),
        session.evaluate(limit=120),
    )  # FP32's metric, kept: every sample counted below is a plan's
    reduced: list[int] = []
    reduce = session.entry._reduce

    def counted(outputs, feed):
        reduced.append(len(next(iter(feed.values()))))
        return reduce(outputs, feed)

    session.entry._reduce = counted
    try:
        met = search_mixed_precision(session, target_drop=0.5, budget=2, **kwargs)
    finally:
        del session.entry._reduce
    # the choice's two roundings on the 48 screening lines, then the start plan's other 72 lines: nothing twice (a
    # second look, should another CPU's rounding leave a gain above zero unclear, runs both on the 72 and no more)
    note = next(n for n in met.notes if n.startswith("weights rounded by"))
    second_look = "scored on the rest too" in note
    assert sum(reduced) == (48 + 48 + 72 + 72 if second_look else 48 + 48 + 72), (reduced, note)
    assert met.met and met.stop_reason.startswith("target met by")
    assert not any(phase.startswith("prefix cache") for phase in met.phase_seconds), met.phase_seconds
    start = session.quantize(session.ranges("mse"), session.default_plan("int8"))
    fresh = session.entry.evaluate(cpu_predict(start.proto), limit=120).scores
    screened, confirmed = met.evaluated[0], met.evaluated[-1]
    assert screened.n_samples == 48 and list(screened.scores) == list(fresh[:48])
    assert confirmed.n_samples == 120 and list(confirmed.scores) == list(fresh) and len(set(fresh)) == 2

    unreachable = {"target": 1.01, "budget": 3, "formats": ("int8", "fp8", "fp16"), **kwargs}
    trials = search_mixed_precision(session, early_stop=False, **unreachable)
    assert any(phase.startswith("prefix cache") for phase in trials.phase_seconds), trials.phase_seconds
    trial = next(p for p in trials.evaluated[1:] if p.overrides and p.n_samples == 48)  # run from the prefix cache
    model = session.quantize(session.ranges("mse"), session.default_plan("int8").with_overrides(trial.overrides))
    assert list(trial.scores) == list(session.entry.evaluate(cpu_predict(model.proto), limit=48).scores)


def test_a_session_quantizes_a_plan_once_and_hands_each_caller_its_own_model() -> None:
    """The choices and the search quantize the same plan several times: the session keeps the last few, keyed by
    everything they are made from. A caller editing its model does not change the next caller's; another rounding,
    alignment, plan or set of ranges is quantized anew."""
    from workbench.calib import session as session_module

    session = _session("digits-cnn")
    ranges, plan = session.ranges("mse"), session.default_plan("int8")
    first = session.quantize(ranges, plan)
    kept = first.proto.SerializeToString(deterministic=True)
    first.proto.graph.node[0].name = "edited by a caller"
    again = session.quantize(ranges, plan)
    assert again.proto is not first.proto and again.proto.SerializeToString(deterministic=True) == kept
    calls: list[str] = []
    original = session._quantize

    def counted(*args, **kwargs):
        calls.append("quantized")
        return original(*args, **kwargs)

    session._quantize = counted  # type: ignore[method-assign]
    session.quantize(ranges, plan)
    assert calls == []  # kept
    session.weight_rounding = "gptq"
    gptq = session.quantize(ranges, plan)
    session.align_grids = True
    session.quantize(ranges, plan)
    wider = {name: value * 2 for name, value in ranges.amax.items()}
    session.quantize(type(ranges)(amax=wider, method=ranges.method), plan)
    session.quantize(ranges, plan.with_overrides({session.quantized_nodes()[0]: "fp16"}))
    assert len(calls) == 4
    assert gptq.proto.SerializeToString(deterministic=True) != kept
    nodes = session.quantized_nodes()
    assert len(nodes) >= session_module.QUANTIZED_KEPT
    for node in nodes[: session_module.QUANTIZED_KEPT]:  # as many new models as it keeps: the oldest fall out
        session.quantize(ranges, plan.with_overrides({node: "fp32"}))
    session.weight_rounding, session.align_grids = "gptq", False
    session.quantize(ranges, plan)
    assert len(calls) == 4 + session_module.QUANTIZED_KEPT + 1


def test_a_model_past_the_memory_budget_is_not_kept(monkeypatch) -> None:
    """A user's large model is quantized again rather than held several times over."""
    from workbench.calib import session as session_module

    session = _session("digits-cnn")
    ranges, plan = session.ranges("mse"), session.default_plan("int8")
    size = session.quantize(ranges, plan).proto.ByteSize()
    monkeypatch.setattr(session_module, "QUANTIZED_KEPT_BYTES", size - 1)
    session._quantized.clear()
    first = session.quantize(ranges, plan)
    assert not session._quantized  # over the budget alone: not kept
    second = session.quantize(ranges, plan)
    assert second.proto is not first.proto
    monkeypatch.setattr(session_module, "QUANTIZED_KEPT_BYTES", int(size * 1.5))
    session.quantize(ranges, plan)
    session.quantize(ranges, plan.with_overrides({session.quantized_nodes()[0]: "fp32"}))
    assert len(session._quantized) == 1  # two fit the count, not the bytes: the older one went
