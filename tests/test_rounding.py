"""GPTQ weight rounding: the layer-input Hessians against ONNX Runtime's own layers (every Conv layout we read), the
rounding on a real model (on the grid, kept only where it gains on held-out batches, lower output error), and the
errors a user meets."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.calib.fp8 import fake_quantize_as
from workbench.calib.methods import per_channel_amax, scale_from_amax
from workbench.calib.rounding import MIN_GAIN_DB, gptq_round, layer_inputs
from workbench.errors import WorkbenchError

# (input shape, weight shape, Conv attributes): plain, grouped, depthwise, strided and asymmetric pads, dilated, 1-D
CONV_CASES = [
    ((2, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 8, 7), (6, 2, 3, 1), {"group": 2, "strides": [2, 1], "pads": [0, 1, 2, 0]}),
    ((2, 5, 10, 10), (5, 1, 5, 5), {"group": 5, "pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((2, 3, 11, 11), (2, 3, 3, 3), {"dilations": [2, 2], "pads": [2, 1, 2, 1]}),
    ((2, 3, 16), (4, 3, 3), {"pads": [1, 1], "strides": [2]}),
]


def _single_layer(op: str, input_shape: tuple[int, ...], weight: np.ndarray, attrs: dict[str, object]) -> object:
    from onnx import TensorProto, helper, numpy_helper

    node = helper.make_node(op, ["x", "w"], ["y"], name="layer", **attrs)
    graph = helper.make_graph(
        [node],
        "one_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight.astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _output_energy(op: str, input_shape: tuple[int, ...], weight: np.ndarray, attrs: dict, feeds: list) -> float:
    from workbench.ort import cpu_predict

    predict = cpu_predict(_single_layer(op, input_shape, weight, attrs))
    return float(sum((predict(feed)["y"].astype(np.float64) ** 2).sum() for feed in feeds))


def _quadratic_form(matrix_rows: np.ndarray, hessian: np.ndarray) -> float:
    return float((np.matmul(matrix_rows, hessian) * matrix_rows).sum())


@pytest.mark.parametrize("case", range(len(CONV_CASES) + 2))
def test_layer_input_hessians_give_onnx_runtimes_own_output_energy(case: int) -> None:
    """|W X|^2 from our H = X^T X equals the energy of ONNX Runtime's output of the same layer, for the weight and
    for an unrelated direction: only an im2col with exactly the layer's layout (groups, pads, strides, dilations,
    kernel order) gives that for both."""
    rng = np.random.default_rng(case)
    if case < len(CONV_CASES):
        input_shape, weight_shape, attrs = CONV_CASES[case]
        op = "Conv"
    elif case == len(CONV_CASES):
        input_shape, weight_shape, attrs, op = (6, 5), (3, 5), {"transB": 1}, "Gemm"
    else:
        input_shape, weight_shape, attrs, op = (2, 4, 5), (5, 3), {}, "MatMul"
    weight = rng.standard_normal(weight_shape).astype(np.float32)
    feeds = [{"x": rng.standard_normal(input_shape).astype(np.float32)} for _ in range(3)]
    model = _single_layer(op, input_shape, weight, attrs)
    found = layer_inputs(model, feeds, ["w"])["w"]
    assert found.op == op and found.rows > 0 and found.check_rows > 0
    hessian = found.hessian + found.check  # the two halves (even and odd batches) together: all the data
    groups = hessian.shape[0]
    axis = 1 if op == "MatMul" else 0
    for direction in (weight, rng.standard_normal(weight_shape).astype(np.float32)):
        rows = np.moveaxis(direction, axis, 0).reshape(groups, -1, hessian.shape[1]).astype(np.float64)
        ours = _quadratic_form(rows, hessian)
        reference = _output_energy(op, input_shape, direction, attrs, feeds)
        assert ours == pytest.approx(reference, rel=1e-4)


def test_one_batch_gives_no_hessian_to_hold_out() -> None:
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = _single_layer("Conv", (2, 3, 9, 9), weight, {})
    assert layer_inputs(model, [{"x": rng.standard_normal((2, 3, 9, 9)).astype(np.float32)}], ["w"]) == {}


@pytest.fixture(scope="module")
def digits_sessions():
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=64, batch_size=8))
    return {
        rounding: CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False, weight_rounding=rounding)
        for rounding in ("nearest", "gptq")
    }


def _weights_of(proto: object) -> dict[str, np.ndarray]:
    """{weight initializer read by a QuantizeLinear: (values, scale, zero point's ONNX type)}"""
    from onnx import numpy_helper

    initializers = {i.name: i for i in proto.graph.initializer}  # type: ignore[attr-defined]
    found = {}
    for node in proto.graph.node:  # type: ignore[attr-defined]
        if node.op_type == "QuantizeLinear" and node.input[0] in initializers:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            found[node.input[0]] = (
                numpy_helper.to_array(initializers[node.input[0]]),
                numpy_helper.to_array(initializers[node.input[1]]),
                initializers[node.input[2]].data_type,
                axis,
            )
    return found


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_gptq_weights_sit_on_their_grid_and_lower_the_output_error(digits_sessions, fmt: str) -> None:
    from onnx import TensorProto

    from workbench.calib.session import ort_predict

    models = {}
    for rounding, session in digits_sessions.items():
        ranges = session.ranges("mse")
        models[rounding] = session.quantize(ranges, session.default_plan(fmt))
    gptq = models["gptq"]
    assert gptq.weight_rounding and not models["nearest"].weight_rounding
    assert any("GPTQ weight rounding kept on" in note for note in gptq.notes)
    for report in gptq.weight_rounding:  # never worse than nearest on the held-out batches; equal where not kept
        assert report.gptq_db >= report.nearest_db
        assert report.gptq_db == report.nearest_db or report.gptq_db >= report.nearest_db + MIN_GAIN_DB
    assert any(r.gptq_db >= r.nearest_db + MIN_GAIN_DB for r in gptq.weight_rounding)
    weights = _weights_of(gptq.proto)
    expected_type = TensorProto.FLOAT8E4M3FN if fmt == "fp8" else TensorProto.INT8
    rounded = [name for name in weights if name.endswith("_gptq")]
    assert rounded, "no weight was rounded by GPTQ"
    for name in rounded:  # on the grid: quantizing again gives the same values, so TensorRT changes nothing
        values, scale, zero_type, axis = weights[name]
        if zero_type != expected_type:
            continue  # the stem kept out of FP8 is not quantized at all; other formats are not this test's
        np.testing.assert_array_equal(fake_quantize_as(values, scale, fmt, axis), values)
    # the model's output on evaluation samples (not the calibration data) moves less from FP32's
    entry = digits_sessions["gptq"].entry
    feeds = [feed for feed, _, _ in entry._batches("evaluation", None, 64)][:4]
    reference = ort_predict(digits_sessions["gptq"].prepared)
    errors = {}
    for rounding, model in models.items():
        predict = ort_predict(model.proto)
        errors[rounding] = sum(
            float(((predict(feed)[k] - value) ** 2).sum()) for feed in feeds for k, value in reference(feed).items()
        )
    assert errors["gptq"] < 0.9 * errors["nearest"], errors


def test_gptq_round_refuses_a_hessian_of_another_layer(digits_sessions) -> None:
    session = digits_sessions["gptq"]
    inputs = session.layer_inputs()
    first, second = [inputs[name] for name in list(inputs)[:2]]
    from onnx import numpy_helper

    weight = next(numpy_helper.to_array(i) for i in session.prepared.graph.initializer if i.name == first.weight)
    scale = scale_from_amax(per_channel_amax(weight, 0))
    if first.hessian.shape == second.hessian.shape:
        pytest.skip("the first two layers read inputs of the same width")
    with pytest.raises(WorkbenchError, match="Hessian"):
        gptq_round(weight, scale, 0, "int8", second)


def test_unknown_weight_rounding_is_refused() -> None:
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    with pytest.raises(WorkbenchError, match="weight rounding 'optimal'"):
        CalibrationSession(entry.load(), entry=entry, progress=False, weight_rounding="optimal")  # type: ignore[arg-type]


def test_cli_weight_rounding_gptq_writes_other_weights_and_says_so(tmp_path, capsys) -> None:
    from workbench.cli import main

    written = {}
    for rounding in ("nearest", "gptq"):
        output = tmp_path / f"{rounding}.onnx"
        code = main(
            [
                "calibrate",
                "digits-cnn",
                "-o",
                str(output),
                "--max-batches",
                "4",
                "--weight-rounding",
                rounding,
                "--no-progress",
            ]
        )
        assert code == 0
        import onnx

        written[rounding] = _weights_of(onnx.load(str(output)))
    printed = capsys.readouterr()
    assert "GPTQ weight rounding kept on" in printed.out + printed.err
    assert any(name.endswith("_gptq") for name in written["gptq"])
    assert not any(name.endswith("_gptq") for name in written["nearest"])


def test_the_search_rounds_weights_the_way_its_start_plan_scores_better(digits_sessions) -> None:
    import re

    from workbench.calib.search import search_mixed_precision

    session = digits_sessions["nearest"]
    try:
        result = search_mixed_precision(
            session, target=1.01, budget=1, limit=120, build_costs=False, weight_rounding="auto"
        )
        note = next(n for n in result.notes if n.startswith("weights rounded by"))
        pattern = r"scores (\S+) rounded to nearest and (\S+) with GPTQ .*paired gain \S+ \[(\S+), "
        nearest, gptq, low = (float(x) for x in re.findall(pattern, note)[0])
        assert result.weight_rounding == session.weight_rounding
        assert result.weight_rounding == ("gptq" if low > 0 else "nearest")
        # the plans were scored with that rounding: the start plan's metric is the one the note gives for it
        assert result.int8_metric == pytest.approx(gptq if result.weight_rounding == "gptq" else nearest)
    finally:
        session.weight_rounding = "nearest"


def test_layers_past_the_hessian_memory_cap_keep_nearest_with_a_warning(monkeypatch) -> None:
    import workbench.calib.rounding as rounding

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = _single_layer("Conv", (2, 3, 9, 9), weight, {})
    feeds = [{"x": rng.standard_normal((2, 3, 9, 9)).astype(np.float32)} for _ in range(2)]
    assert set(layer_inputs(model, feeds, ["w"])) == {"w"}
    monkeypatch.setattr(rounding, "MAX_HESSIAN_BYTES", 27 * 27 * 16 - 1)  # one byte short of this layer's two halves
    with pytest.warns(UserWarning, match="1 of 1 weighted layers keep nearest rounding"):
        assert layer_inputs(model, feeds, ["w"]) == {}


def test_gptq_on_one_calibration_batch_says_it_rounded_to_nearest() -> None:
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=8, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False, weight_rounding="gptq")
    quantized = session.quantize(session.ranges("mse"))
    assert not quantized.weight_rounding
    assert any("no layer could take it" in note for note in quantized.notes), quantized.notes


def test_gptq_gains_needs_a_clear_paired_gain_and_keeps_nearest_on_a_tie() -> None:
    from workbench.calib.paired import sign_test_p
    from workbench.calib.rounding import gptq_gains, rounding_gain

    nearest = [1.0] * 200 + [0.0] * 56
    ten_better = [1.0] * 210 + [0.0] * 46  # 10 samples gained, none lost: mean 0.039, interval clear of zero
    one_better = [1.0] * 201 + [0.0] * 55  # one sample: a float difference between CPUs could make it
    assert gptq_gains(nearest, ten_better, higher_is_better=True)
    assert not gptq_gains(ten_better, nearest, higher_is_better=True)
    assert not gptq_gains(nearest, one_better, higher_is_better=True)
    assert not gptq_gains(nearest, nearest, higher_is_better=True)  # a tie: nearest (no extra pass, no fitting)
    # the exact sign test guards small counts the normal interval lets through
    four, six = [1.0] * 204 + [0.0] * 52, [1.0] * 206 + [0.0] * 50
    assert rounding_gain(nearest, four, higher_is_better=True)[1] > 0 and not gptq_gains(
        nearest, four, higher_is_better=True
    )
    assert gptq_gains(nearest, six, higher_is_better=True)  # 6 of 6 differing: p = 2 / 64
    assert not gptq_gains([0.0, 0.0], [1.0, 1.0], higher_is_better=True)  # two samples, no spread: no evidence
    assert sign_test_p(6, 0) == pytest.approx(0.03125) and sign_test_p(4, 0) == pytest.approx(0.125)
    assert sign_test_p(5, 5) == 1.0 and sign_test_p(0, 0) == 1.0
    mean, low, high = rounding_gain(nearest, ten_better, higher_is_better=True)
    half = 1.959964 * np.std(np.array(ten_better) - np.array(nearest), ddof=1) / np.sqrt(256)
    assert mean == pytest.approx(10 / 256) and (low, high) == pytest.approx((mean - half, mean + half))
    errors = np.linspace(0.5, 0.6, 64)
    assert gptq_gains(errors, errors - 0.01, higher_is_better=False)  # an error metric: lower is the gain
    assert not gptq_gains(nearest, ten_better[:3], higher_is_better=True)  # not the same samples: no evidence
    assert not gptq_gains([], [], higher_is_better=True)


def test_auto_rounding_on_one_calibration_batch_scores_nothing() -> None:
    from workbench.calib.rounding_choice import choose_weight_rounding
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=8, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    choice = choose_weight_rounding(session, session.ranges("mse"), session.default_plan("int8"), 64)
    assert choice.choice == "nearest" == session.weight_rounding
    assert choice.evaluations == 1 and set(choice.metrics) == {"nearest"} and choice.gain is None
    assert "it needs two calibration batches" in choice.note


def test_calibrate_on_a_zoo_model_keeps_the_rounding_that_scores_better(tmp_path) -> None:
    """`calibrate MODEL` (no --weight-rounding) on a zoo model scores nearest and GPTQ on the first samples and
    writes the better one; the printed scores are the session's own on those samples, and the weights written are
    the chosen rounding's."""
    import re

    import onnx

    from tests.cli_runner import run_cli_forked
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    output = tmp_path / "auto.onnx"
    argv = ["calibrate", "digits-cnn", "--format", "fp8", "--max-batches", "4", "--eval-limit", "96"]
    run = run_cli_forked([*argv, "-o", str(output), "--no-progress"], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "weight rounding auto: scoring the plan with nearest and with GPTQ weight rounding" in run.stdout
    found = re.findall(
        r"weights rounded by (\S+): the plan scores (\S+) rounded to nearest and (\S+) with GPTQ on the first 96 "
        r"evaluation samples; GPTQ's paired gain \S+ \[(\S+), \S+\]",
        run.stdout,
    )
    assert found, run.stdout
    chosen, nearest, gptq, low = found[0][0], float(found[0][1]), float(found[0][2]), float(found[0][3])
    assert chosen == ("GPTQ" if low > 0 else "nearest")  # kept only when the paired gain is clear of zero
    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=32, batch_size=8))
    for rounding, printed in (("nearest", nearest), ("gptq", gptq)):
        session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False, weight_rounding=rounding)
        plan = session.default_plan("fp8")
        assert session.evaluate(session.quantize(session.ranges("mse"), plan), limit=96).value == pytest.approx(
            printed, abs=5e-5
        )
    written = {i.name for i in onnx.load(str(output)).graph.initializer}
    assert any(name.endswith("_gptq") for name in written) == (chosen == "GPTQ")
    # the metric printed at the end is the chosen rounding's, on the same samples (that evaluation is reused)
    printed = float(re.findall(r"quantized (\S+)  \((\d+) samples\)", run.stdout)[0][0])
    assert printed == pytest.approx(gptq if chosen == "GPTQ" else nearest, abs=5e-5)


def test_the_journey_rounds_weights_as_calibrate_does_and_its_search_keeps_the_choice(tmp_path) -> None:
    """The quickstart's calibrate stage applies `calibrate`'s default rules (the better of nearest and GPTQ on the
    first samples, then grid alignment where it lowers the error): the INT8-all model written carries both choices,
    the stage's summary says what was measured, and the search quantizes the same way."""
    import onnx

    from workbench.flow import QuickstartConfig, QuickstartSession

    config = QuickstartConfig(
        model="digits-cnn", out_dir=str(tmp_path), search_budget=1, calibration_samples=32, evaluation_samples=64
    )
    run = QuickstartSession(config).run_stages(["calibrate", "search"])
    calibration = run.calibration
    assert calibration is not None and calibration.weight_rounding in ("nearest", "gptq")
    assert calibration.weight_rounding_note.startswith(
        f"weights rounded by {'GPTQ' if calibration.weight_rounding == 'gptq' else 'nearest'}"
    )
    assert "on the first 64 evaluation samples" in calibration.weight_rounding_note
    assert calibration.weight_rounding_note in run.stage("calibrate").summary
    written = {i.name for i in onnx.load(str(calibration.onnx_path)).graph.initializer}
    assert any(name.endswith("_gptq") for name in written) == (calibration.weight_rounding == "gptq")
    assert run.mixed_search is not None and run.mixed_search.result.weight_rounding == calibration.weight_rounding
    # grid alignment likewise: chosen after the rounding, written into the INT8-all model, kept by the search
    assert calibration.grid_alignment_note.startswith(f"grid alignment {'on' if calibration.grid_alignment else 'off'}")
    assert calibration.grid_alignment_note in run.stage("calibrate").summary
    from workbench.precision.recipe import read_recipe

    recipe = read_recipe(onnx.load(str(calibration.onnx_path)))  # what the written model records of itself
    assert recipe is not None and recipe.grid_alignment == calibration.grid_alignment
    assert recipe.weight_rounding != "gptq" or calibration.weight_rounding == "gptq"  # GPTQ ships only where chosen
    assert run.mixed_search.result.align_grids == calibration.grid_alignment


def test_a_metric_without_per_sample_scores_keeps_nearest_without_scoring_gptq() -> None:
    """A metric that is one number for the whole set (mAP-like: a user's own entry may score so) has nothing to
    pair: no GPTQ pass and no second evaluation. digits-cnn with its per-sample scores dropped stands in for it."""
    from dataclasses import replace

    from workbench.calib.rounding_choice import choose_weight_rounding
    from workbench.calib.session import CalibrationSession
    from workbench.zoo.digits import DigitsCnnEntry

    class SetLevelDigits(DigitsCnnEntry):
        def _metric(self, predictions, labels, indices):
            return replace(super()._metric(predictions, labels, indices), scores=[])

    entry = SetLevelDigits()
    feeds = list(entry.calibration_batches(limit=16, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    choice = choose_weight_rounding(session, session.ranges("mse"), session.default_plan("int8"), 8)
    assert choice.choice == "nearest" == session.weight_rounding and set(choice.metrics) == {"nearest"}
    assert "no per-sample scores" in choice.note and not session._layer_inputs  # the GPTQ pass never ran


def test_ocr_det_scores_each_page_so_its_metric_has_an_interval_and_pairs() -> None:
    """ocr-det's line recall is the mean of its pages' recalls: one score per page, whose mean is the metric on
    any prefix, so it gets an interval and paired comparisons like the other zoo metrics."""
    from workbench.flow.uncertainty import estimate, paired_difference
    from workbench.zoo import get_entry

    entry = get_entry("ocr-det")
    fp32 = entry.evaluate_onnx(entry.onnx_path(), limit=16)
    assert len(fp32.scores) == fp32.n_samples == 16 and all(0.0 <= s <= 1.0 for s in fp32.scores)
    assert fp32.value == pytest.approx(sum(fp32.scores) / 16)
    matched, lines = fp32.details["matched"], fp32.details["text_lines"]
    assert fp32.details["recall_over_all_lines"] == pytest.approx(matched / lines) and lines > 16  # lines, not pages
    interval = estimate(fp32.value, fp32.n_samples, fp32.scores)
    assert interval.has_interval and interval.low <= fp32.value <= interval.high
    first = entry.evaluate_onnx(entry.onnx_path(), limit=8)
    assert first.scores == fp32.scores[:8]  # a prefix's scores are the whole run's first ones
    same = paired_difference(fp32.value, fp32.scores, fp32.value, fp32.scores)
    assert same.has_interval and same.delta == 0.0


def test_ocr_det_page_scores_on_pages_unlike_the_zoo_s() -> None:
    """Per-page recall on pages the generator never makes: a page without text lines misses nothing (1), a page
    with lines and no box finds none (0), two boxes on one line count once, and a box under IoU 0.5 counts not at
    all; the details still count over all lines."""
    from workbench.zoo import get_entry

    entry = get_entry("ocr-det")
    line = np.array([[10, 10, 110, 40]], np.float64)
    two_lines = np.array([[10, 10, 110, 40], [10, 60, 110, 90]], np.float64)
    pages_truth = [np.zeros((0, 4)), line, line, two_lines]
    pages_predicted = [
        np.array([[0, 0, 50, 50]], np.float32),  # a box where there is no line
        np.zeros((0, 4), np.float32),  # no box
        np.array([[10, 10, 110, 40], [12, 10, 112, 40]], np.float32),  # two boxes on one line
        np.array([[10, 10, 110, 40], [10, 60, 30, 90]], np.float32),  # the second box covers a fifth of its line
    ]
    result = entry._metric(pages_predicted, pages_truth, [0, 1, 2, 3])
    assert result.scores == [1.0, 0.0, 1.0, 0.5] and result.value == pytest.approx(0.625)
    assert result.details["text_lines"] == 4 and result.details["matched"] == 2
    assert result.details["recall_over_all_lines"] == pytest.approx(2 / 4)  # the pages' mean is not this
    assert result.details["precision"] == pytest.approx(2 / 5)  # 5 boxes, 2 matched


def test_journey_rounding_follows_evaluation_samples_and_fp8_leaves_the_int8_choice(tmp_path) -> None:
    """The rounding is chosen on the journey's evaluation samples, so changing them reruns calibrate; the FP8-all
    stage chooses for its own plan and leaves the session with the INT8 plan's choice (what search and export use)."""
    from workbench.flow import QuickstartConfig, QuickstartSession

    config = QuickstartConfig(
        model="digits-cnn", out_dir=str(tmp_path), precision="fp8", calibration_samples=32, evaluation_samples=64
    )
    journey = QuickstartSession(config)
    run = journey.run_stages(["calibrate", "build_fp8_all"])
    assert "on the first 64 evaluation samples" in run.calibration.weight_rounding_note
    fp8 = run.stage("build_fp8_all")
    assert fp8.ok, fp8.reason
    assert run.fp8_all_build.source.endswith(("weights nearest)", "weights GPTQ)"))
    session = journey.workspace.calibration_session(run)
    assert session.weight_rounding == run.calibration.weight_rounding
    assert journey.plan_update({"evaluation_samples": 96}).stages[0] == "calibrate"


def test_the_search_writes_the_weights_of_the_rounding_it_reports(tmp_path) -> None:
    """`calibrate FILE --target-drop` on a small transformer (cosine agreement with FP32, per-sample scores that move
    a little for every sample): the search report's weight rounding, its note and the written model's weights agree,
    whichever rounding the rule keeps on this machine."""
    import json

    import onnx

    from tests.cli_runner import run_cli_forked
    from tests.fixtures.unseen_models import write_model

    model = write_model("transformer", tmp_path)
    argv = ["calibrate", str(model), "--data", "random", "--target-drop", "0.01", "--budget", "2", "-o", "q.onnx"]
    run = run_cli_forked([*argv, "--no-progress"], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "q.mixed.json").read_text())
    note = next(n for n in report["notes"] if n.startswith("weights rounded by"))
    assert note.startswith(
        "weights rounded by GPTQ" if report["weight_rounding"] == "gptq" else "weights rounded by nearest"
    )
    written = {i.name for i in onnx.load(str(tmp_path / "q.onnx")).graph.initializer}
    assert any(name.endswith("_gptq") for name in written) == (report["weight_rounding"] == "gptq")


def test_auto_rounding_on_one_evaluation_sample_keeps_nearest_and_says_why(digits_sessions) -> None:
    from workbench.calib.rounding_choice import choose_weight_rounding

    session = digits_sessions["nearest"]
    choice = choose_weight_rounding(session, session.ranges("mse"), session.default_plan("int8"), 1)
    assert choice.choice == "nearest" == session.weight_rounding and "has one sample to pair" in choice.note
    assert choice.samples == 1 and len(choice.scores) == 1 and set(choice.metrics) == {"nearest"}


def test_an_unclear_gain_on_the_screen_gets_a_second_look_on_the_whole_set() -> None:
    """MiniLM, the choice limited to its first 8 sentences: GPTQ's mean cosine gain there is +0.00019 with 4 gains
    and 4 losses (each at least 8.8e-5, far above the ~1e-6 that differs between CPUs; 2026-12-06), not clear, so in
    the search both roundings are scored on the rest of its 250 sentences too and those keep GPTQ (on all 256:
    +0.00046 [+0.00021, +0.00071], 157 gains, 99 losses); a user's evaluation budget is not overrun. The search's
    start plan is the model the choice scored: its screening record is GPTQ's first 8 scores and its whole-set
    metric the choice's 250 (not a whole number of the zoo's batches of 8), each as a fresh evaluation gives.
    (EfficientNet-Lite0's top-1 agreement on a few crops would hang on one crop that another CPU may flip.)"""
    from workbench.calib.rounding_choice import choose_weight_rounding
    from workbench.calib.search import search_mixed_precision
    from workbench.calib.session import CalibrationSession
    from workbench.ort import cpu_predict
    from workbench.zoo import get_entry

    entry = get_entry("minilm")
    session = CalibrationSession(entry.load(), entry=entry, progress=False, max_batches=2)
    ranges, plan = session.ranges("mse"), session.default_plan("int8")
    one_look = choose_weight_rounding(session, ranges, plan, 8)  # a user's budget of 8: one look, nearest kept
    assert "rest too" not in one_look.note and one_look.choice == "nearest" and one_look.samples == 8
    result = search_mixed_precision(  # as calibrate --target-drop asks (MiniLM has nothing to align)
        session, target_drop=0.5, budget=2, limit=250, screen=8, build_costs=False, weight_rounding="auto"
    )
    note = next(n for n in result.notes if n.startswith("weights rounded by"))
    assert "on the first 250 evaluation samples (unclear on the first 8, so both were scored on the rest too)" in note
    assert "4 evaluations" in note and "is clear" in note, note
    assert result.weight_rounding == "gptq" == session.weight_rounding and result.met
    fresh = entry.evaluate(cpu_predict(session.quantize(ranges, plan).proto), limit=250)  # GPTQ's plan
    screened, confirmed = result.evaluated[0], result.evaluated[-1]
    assert screened.n_samples == 8 and list(screened.scores) == list(fresh.scores[:8])
    assert confirmed.n_samples == 250 and list(confirmed.scores) == list(fresh.scores)


def test_auto_rounding_that_fails_midway_leaves_the_session_on_its_rounding(digits_sessions, monkeypatch) -> None:
    """An error while GPTQ's plan is scored (here the evaluation raises) must not leave the session rounding by GPTQ:
    notebook 03's search reads the session's rounding after the panel reported the error."""
    from workbench.calib.rounding_choice import choose_weight_rounding

    session = digits_sessions["nearest"]
    evaluate = session.entry.evaluate_kept

    def fails_on_gptq(predict, limit=None, batch_size=8, *, earlier=None):
        if session.weight_rounding == "gptq":
            raise OSError("disk full while scoring")
        return evaluate(predict, limit, batch_size, earlier=earlier)

    monkeypatch.setattr(session.entry, "evaluate_kept", fails_on_gptq)
    with pytest.raises(OSError, match="disk full"):
        choose_weight_rounding(session, session.ranges("mse"), session.default_plan("int8"), 32)
    assert session.weight_rounding == "nearest"


def test_calibrate_without_a_target_writes_the_gptq_weights_auto_keeps(tmp_path) -> None:
    """`calibrate minilm` with no --weight-rounding and no target (auto, the default for a zoo model): on MiniLM,
    GPTQ's cosine gain over nearest is clear (2026-12-05: +0.0009 [+0.0004, +0.0013] on 128 sentences; on 48 the low
    end was +0.0002, a margin one flipped rounding on another CPU could eat; per-sample float differences between
    CPUs are ~1e-6), so the written model carries GPTQ's weights, the note says so, and the metric printed for the
    written model is the GPTQ score the choice measured."""
    import re

    import onnx

    from tests.cli_runner import run_cli_forked

    argv = ["calibrate", "minilm", "--data", "zoo", "--eval-limit", "128", "--max-batches", "2", "-o", "m.onnx"]
    run = run_cli_forked([*argv, "--no-progress"], cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    text = run.stdout + run.stderr
    chosen = re.search(r"weights rounded by GPTQ: .* and ([0-9.]+) with GPTQ on the first 128 evaluation samples", text)
    assert chosen and "is clear" in text, text[-2000:]
    written = {i.name for i in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    assert any(name.endswith("_gptq") for name in written), sorted(written)[:10]
    assert f"quantized {chosen.group(1)}  (128 samples)" in text


def test_a_rerun_of_the_journeys_calibrate_stage_reaches_the_same_choices(tmp_path, monkeypatch) -> None:
    """The workspace keeps one calibration session across re-runs (a new range method, more evaluation samples):
    a re-run whose session the last run left aligned still chooses the rounding and the alignment together from
    the same four quantizations, and reaches the same choices on the same measurements."""
    import workbench.flow.stages as stages
    from workbench.flow import QuickstartConfig, QuickstartSession

    seen: list[tuple[str, str]] = []
    choose = stages.choose_rounding_and_alignment

    def spy(session, *args, **kwargs):
        rounding, alignment = choose(session, *args, **kwargs)
        seen.append((rounding.note, alignment.note))
        return rounding, alignment

    monkeypatch.setattr(stages, "choose_rounding_and_alignment", spy)
    config = QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path), calibration_samples=32, evaluation_samples=64)
    journey = QuickstartSession(config)
    first = journey.run_stages(["calibrate"]).calibration
    session = journey.workspace.calibration_session(journey.run)
    session.align_grids = not first.grid_alignment  # as a run with the other choice would leave it
    second = journey.run_stages(["calibrate"]).calibration
    assert len(seen) == 2 and seen[0] == seen[1], seen
    assert first is not None and second is not None
    assert (second.weight_rounding, second.grid_alignment) == (first.weight_rounding, first.grid_alignment)
    assert session.align_grids == second.grid_alignment


def test_a_layer_whose_hessian_underflowed_rounds_those_channels_to_nearest_instead_of_crashing() -> None:
    """Recorded from a real calibration that crashed (numpy LinAlgError, `demo` exit 1 with a traceback): a randomly
    initialised Hugging Face MobileNetV2 (transformers 5.24, `MobileNetV2Config(depth_multiplier=0.35, num_labels=10,
    image_size=64)`, `torch.manual_seed(0)`, `torch.onnx.export` opset 17), `calibrate --data random --weight-rounding
    gptq`: its depthwise inputs are ~1e-21, their float32 products underflow, and 2 of the layer's 336 channels are left
    with a damped Hessian that is not positive definite. The fixture holds those two channels and four others of that
    layer (weights, scales, both halves' Hessians, the input's INT8 scale). The channels with a Hessian GPTQ can use
    get the very factor a batched factorisation gives; the other two round to nearest."""
    from pathlib import Path

    from workbench.calib.rounding import DAMPING, LayerInput, _inverse_factor

    data = np.load(Path(__file__).parent / "fixtures" / "gptq_underflow_layer.npz")
    layer = LayerInput(
        "onnx::Conv_1866", "Conv", data["hessian"], data["check"], int(data["rows"]), int(data["check_rows"])
    )
    rounded, report = gptq_round(
        data["weight"], data["scale"], 0, "int8", layer, ("int8", float(data["input_scale"]))
    )  # raised LinAlgError before
    nearest = fake_quantize_as(data["weight"], data["scale"].reshape(-1, 1, 1, 1).astype(np.float32), "int8")
    np.testing.assert_array_equal(rounded, nearest)  # nothing gains on this layer: all nearest, on the grid
    assert report.gptq_db == report.nearest_db

    from workbench.calib.rounding import _with_input_noise

    hessian = _with_input_noise(layer.hessian, layer.rows, ("int8", float(data["input_scale"])))
    index = np.arange(hessian.shape[1])
    mean = np.diagonal(hessian, axis1=1, axis2=2).mean(axis=1)
    hessian[:, index, index] += DAMPING * mean[:, None]
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(np.linalg.inv(hessian))  # the batched factorisation that crashed
    factor = _inverse_factor(hessian)
    np.testing.assert_array_equal(factor[:2], np.broadcast_to(np.eye(9), (2, 9, 9)))  # the two that are not PD
    usable = np.linalg.cholesky(np.linalg.inv(hessian[2:])).transpose(0, 2, 1)
    np.testing.assert_array_equal(factor[2:], usable)
