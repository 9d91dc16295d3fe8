"""The journey's long stages as a user lives them: each step is reported while it runs, a model is scored once per
run, and a stop asked for while a stage runs stops it there (digits-cnn: real calibration, real ONNX Runtime)."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.flow import QuickstartConfig, QuickstartSession, StageStatus
from workbench.precision import Variant
from workbench.progress import ProgressEvent


def test_calibrate_and_search_stages_report_their_steps_to_the_session_progress(tmp_path: Path) -> None:
    """The panel shows "evaluation 1 of 2": the search's per-evaluation events reach the session's callback. The
    calibrate stage (minutes on a ResNet-50: statistics, GPTQ's layer inputs and roundings, task-metric evaluations)
    reports its steps too, counted where they are, and only while it runs: none mixes into the search's."""
    from workbench.flow import QuickstartSession

    events: list[ProgressEvent] = []
    session = QuickstartSession(
        QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path), search_budget=2, calibration_samples=64),
        progress=events.append,
    )
    run = session.run_stages(["calibrate", "search"])
    assert run.stage("search").ok, run.stage("search").reason
    evaluations = [event for event in events if event.task == "evaluation"]
    assert len(evaluations) == run.mixed_search.result.evaluations_used >= 1
    assert all(event.total == 2 for event in evaluations)
    assert evaluations[0].text().startswith("evaluation 1 of 2")
    calibration = [event for event in events if event.task == "calibration"]
    assert calibration and events.index(calibration[-1]) < events.index(evaluations[0])
    batches = [event.index for event in calibration if event.message.startswith("activation statistics")]
    statistics_batches = run.calibration.ranges.statistics.num_batches
    assert batches == list(range(1, statistics_batches + 1)) and statistics_batches >= 2
    scoring = [e for e in calibration if e.message == "task metric of the quantized model on 450 evaluation samples"]
    assert scoring and all(event.total == 450 for event in scoring)
    first_pass = [event.index for event in scoring[: 450 // 8 + 1]]  # one event before each batch of 8
    assert first_pass == list(range(0, 450, 8)), first_pass
    calibrating = session.workspace.calibration_session(run)
    assert calibrating.events is None  # only while the calibrate stage runs
    assert calibrating._samples(10_000) == 450  # what is scored, not what was asked for
    gptq = [event for event in calibration if event.message.startswith("GPTQ rounding of ")]
    weights = {event.message.removeprefix("GPTQ rounding of ") for event in gptq}
    assert gptq and all(event.total == len(weights) and event.index < event.total for event in gptq), gptq


def test_the_metrics_stage_scores_again_only_what_calibration_did_not(tmp_path: Path) -> None:
    """The calibrate stage already scored the FP32 model and the all-INT8 model of the rounding it chose on the
    run's evaluation samples; the metrics stage takes those results (a ViT-B/16 spent about two minutes per
    evaluation on 2 cores), says so, and runs only the FP16 model. What it takes is what a fresh evaluation of each
    file gives, sample for sample."""
    session = QuickstartSession(QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path), calibration_samples=64))
    run = session.run_stages(["clean", "build_fp32", "build_fp16", "calibrate", "build_int8_all", "metrics"])
    rows = {row.variant: row for row in run.metrics.rows}
    assert set(rows) == {Variant.FP32, Variant.FP16, Variant.INT8_ALL}
    assert run.metrics.from_calibration == (Variant.FP32, Variant.INT8_ALL)  # FP16 alone was run
    assert (
        "(fp32, int8-all: scored by the calibrate stage on the same samples, not run again)"
        in run.stage("metrics").text
    )
    for row in rows.values():
        fresh = session.workspace.entry.evaluate_onnx(row.onnx_path, limit=run.config.evaluation_samples)
        assert (fresh.value, tuple(fresh.scores), fresh.n_samples) == (row.value, row.scores, row.n_samples), row


def test_the_search_stage_starts_from_the_predictions_calibrate_scored(tmp_path: Path) -> None:
    """digits-cnn's all-INT8 model meets the target: the calibrate stage's rounding choice scored that very model on
    the evaluation samples, so the search's start plan is not run again: no prefix cache is filled for it, no
    whole-set confirmation runs (the search's own phase record; without the reuse the start plan fills the prefix
    cache), the search says where its start came from, and its metric is the one the choice measured."""
    session = QuickstartSession(
        QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path), search_budget=4, calibration_samples=64)
    )
    run = session.run_stages(["calibrate"])
    choice = run.calibration.rounding_choice
    assert choice is not None and choice.predictions is not None
    assert choice.model is None and len(choice.model_sha256) == 64  # the run keeps the digest, not a model copy
    run = session.run_stages(["search"])
    result = run.mixed_search.result
    assert run.stage("search").ok and result.met and result.chosen.index == 0, result.stopped_reason
    ran = set(result.phase_seconds)
    assert not ran & {"prefix cache filled (the start plan on the screen)", "whole-set confirmations", "trials"}, ran
    assert "start plan: the rounding choice's predictions on its 450 samples" in " ".join(result.notes)
    assert result.evaluated[0].metric == choice.metrics[choice.choice]


def test_a_stop_asked_while_calibrating_stops_the_stage_there_and_the_next_update_goes_on_from_it(
    tmp_path: Path,
) -> None:
    """The panel's Cancel, or a setting changed while a stage runs, used to wait for the whole stage (478-574 s
    of a ViT-B/16's calibration). A callback that says stop at the calibrate stage's first GPTQ step cancels that
    stage there: cancelled with where it stopped, no calibration kept, later stages cancelled, the session's rounding
    as before. The next settings change runs the journey on from the cancelled stage, and what it calibrates is what
    an uninterrupted run calibrates."""
    seen: list[ProgressEvent] = []
    stop = True

    def callback(event: ProgressEvent) -> bool:
        seen.append(event)
        return not (stop and event.message.startswith("GPTQ layer inputs"))

    config = QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path / "a"), calibration_samples=64)
    session = QuickstartSession(config, progress=callback)
    session.run_stages(["clean", "build_fp32", "fusion", "build_fp16"])
    run = session.run_from("calibrate")
    calibrate = run.stage("calibrate")
    assert calibrate.status is StageStatus.CANCELLED and run.calibration is None
    assert "cancelled while it ran, at calibration 0 of" in calibrate.reason
    assert calibrate.reason.endswith("GPTQ layer inputs, batch by batch"), calibrate.reason
    assert all(run.stage(name).status is StageStatus.CANCELLED for name in ("build_int8_all", "search", "export"))
    assert session.workspace.calibration_session(run).weight_rounding == "nearest"
    assert not any(event.task == "stage" and event.name == "build_int8_all" for event in seen)

    stop = False
    plan = session.plan_update({"max_metric_drop": 0.02})
    assert plan.stages[0] == "calibrate", plan
    run = session.update(max_metric_drop=0.02)
    assert all(result.status is not StageStatus.CANCELLED for result in run.stages.values()), run.stages
    assert run.stage("calibrate").ok and run.stage("export").ok, run.stage("export").reason

    uninterrupted = QuickstartSession(config.validated(out_dir=str(tmp_path / "b"), max_metric_drop=0.02))
    fresh = uninterrupted.run_stages(["clean", "calibrate"]).calibration
    assert run.calibration.ranges.amax == fresh.ranges.amax
    assert run.calibration.weight_rounding_note == fresh.weight_rounding_note
    assert run.calibration.grid_alignment == fresh.grid_alignment


def test_cli_calibrate_shows_the_roundings_and_evaluations_of_its_choice_as_bars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`workbench calibrate MODEL` chooses the weight rounding by scoring the plan twice: on a full-size model that
    is minutes of GPTQ and evaluations, which drew no bar (only statistics and GPTQ's layer inputs did). Both now
    draw tqdm bars on standard error, named after the step, and `--no-progress` keeps standard error silent."""
    from workbench.cli import main

    assert main(["calibrate", "digits-cnn", "-o", str(tmp_path / "q.onnx")]) == 0
    bars = capsys.readouterr().err.replace("\r", "\n")
    assert "GPTQ rounding of " in bars and "/6 [" in bars, bars[-2000:]
    assert "task metric of the quantized model on 450 evaluation samples:" in bars and "/450 [" in bars
    assert main(["calibrate", "digits-cnn", "-o", str(tmp_path / "r.onnx"), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""


def test_a_stop_during_an_evaluation_batch_or_the_search_cancels_that_stage_there(tmp_path: Path) -> None:
    """The other places a stop is taken: between two batches of a task-metric evaluation (the calibrate stage's
    longest step) and at the search's next evaluation. Each cancels its own stage with where it stopped, keeps none
    of its result and cancels what follows."""
    stop_at: dict[str, object] = {"task": "calibration", "message": "task metric of the quantized model", "index": 8}

    def callback(event: ProgressEvent) -> bool:
        return not (
            event.task == stop_at["task"]
            and event.message.startswith(str(stop_at["message"]))
            and event.index == stop_at["index"]
        )

    config = QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path), calibration_samples=64, search_budget=4)
    session = QuickstartSession(config, progress=callback)
    run = session.run_from("calibrate")
    calibrate = run.stage("calibrate")
    assert calibrate.status is StageStatus.CANCELLED and run.calibration is None
    assert calibrate.reason.endswith(
        "at calibration 8 of 450, 2%: task metric of the quantized model on 450 evaluation samples"
    ), calibrate.reason
    assert run.stage("search").status is StageStatus.CANCELLED

    stop_at.update(task="evaluation", message="", index=1)
    run = session.run_from("calibrate")
    assert run.stage("calibrate").ok
    search = run.stage("search")
    assert search.status is StageStatus.CANCELLED and run.mixed_search is None
    assert "cancelled while it ran, at evaluation 1 of 4" in search.reason, search.reason
    assert all(run.stage(name).status is StageStatus.CANCELLED for name in ("build_mixed", "metrics", "export"))
