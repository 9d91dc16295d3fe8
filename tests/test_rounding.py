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
        nearest, gptq = (float(x) for x in re.findall(r"scores (\S+) rounded to nearest and (\S+) with GPTQ", note)[0])
        assert result.weight_rounding == session.weight_rounding
        assert result.weight_rounding == ("gptq" if gptq > nearest else "nearest")
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
