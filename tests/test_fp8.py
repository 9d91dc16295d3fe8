"""FP8 (E4M3FN) quantization: the grid against an independent bit-level reference, ONNX Runtime's FP8 Q/DQ against
it, FP8 placement and ranges on a real model, and the per-layer diff of an FP8 model."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.calib.fp8 import (
    E4M3_MAX,
    amax_for,
    amax_mse_fp8,
    fake_quantize_fp8,
    fp8_scale_from_amax,
    round_to_e4m3,
)
from workbench.calib.histogram import TensorHistogram
from workbench.errors import WorkbenchError
from workbench.precision import PrecisionPlan


def e4m3_reference(values: np.ndarray) -> np.ndarray:
    """E4M3FN rounding written out from the format (not from ml_dtypes): 3 mantissa bits, exponent bias 7, normals
    from 2^-6, subnormal step 2^-9; round to nearest, ties to even; saturate at 448; NaN stays NaN."""
    x = np.asarray(values, dtype=np.float64)
    magnitude = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        exponent = np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0)))
    step = np.where(magnitude < 2.0**-6, 2.0**-9, 2.0 ** (exponent - 3))
    # np.rint rounds half to even; magnitude / step is exact in float64 for float32 inputs
    rounded = np.minimum(np.rint(magnitude / step) * step, E4M3_MAX)
    rounded = np.where(magnitude >= E4M3_MAX, E4M3_MAX, rounded)
    return np.where(np.isnan(x), np.nan, np.copysign(rounded, x)).astype(np.float32)


def _probe_values() -> np.ndarray:
    rng = np.random.default_rng(0)
    ties = [1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 5 * 2.0**-10, 240.0 + 8.0, 464.0, 15.5, 0.01171875]
    edges = [0.0, -0.0, 448.0, 449.0, 500.0, 1e6, 2.0**-6, 2.0**-9, 2.0**-11, np.nan]
    spread = rng.standard_normal(4000) * np.exp(rng.uniform(-8, 6, 4000))
    values = np.concatenate([ties, edges, spread, -np.asarray(ties)]).astype(np.float32)
    return values


def test_round_to_e4m3_matches_the_bit_level_reference() -> None:
    values = _probe_values()
    np.testing.assert_array_equal(round_to_e4m3(values), e4m3_reference(values))
    # the ties named above, by hand: even mantissa wins, half the smallest subnormal goes to zero, saturation at 448
    np.testing.assert_array_equal(
        round_to_e4m3(np.array([1.0625, 1.1875, 2.0**-10, 3 * 2.0**-10, 464.0, -1e6], np.float32)),
        np.array([1.0, 1.25, 0.0, 2.0**-8, 448.0, -448.0], np.float32),
    )


def _qdq_model(scale: np.ndarray, axis: int | None, shape: list[int], opset: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    zero = helper.make_tensor("zero", TensorProto.FLOAT8E4M3FN, list(scale.shape), [0.0] * scale.size)
    attrs = {"axis": axis} if axis is not None else {}
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], **attrs),
            helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], **attrs),
        ],
        "fp8_qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(scale.astype(np.float32), "scale"), zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model.SerializeToString()


@pytest.mark.parametrize("opset", [19, 21])
def test_onnx_runtime_fp8_qdq_matches_the_reference(opset: int) -> None:
    """ORT CPU (optimizations off, as every accuracy number here is computed) runs FP8 Q/DQ exactly as E4M3 rounds."""
    from workbench.ort import cpu_session

    values = _probe_values()
    values = values[np.isfinite(values)]  # NaN propagates in both; compared element-wise below without it
    scale = np.array(0.37, np.float32)
    session = cpu_session(_qdq_model(scale, None, [values.size], opset), what="an FP8 Q/DQ test model")
    out = session.run(None, {"x": values})[0]
    expected = e4m3_reference(values / scale) * scale
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out, fake_quantize_fp8(values, scale))
    # per channel (axis 0), as weights are quantized
    weights = np.random.default_rng(1).standard_normal((4, 27)).astype(np.float32) * np.array(
        [[0.01], [1], [30], [900]]
    )
    channel_scales = fp8_scale_from_amax(np.abs(weights).max(axis=1))
    session = cpu_session(_qdq_model(channel_scales, 0, [4, 27], opset), what="an FP8 Q/DQ test model")
    out = session.run(None, {"x": weights.astype(np.float32)})[0]
    np.testing.assert_array_equal(out, e4m3_reference(weights / channel_scales[:, None]) * channel_scales[:, None])
    np.testing.assert_array_equal(out, fake_quantize_fp8(weights, channel_scales, axis=0))


def test_fp8_ranges_on_the_fp8_grid() -> None:
    """MSE over the FP8 grid finds the bottom of the true error curve (a brute-force scan of 300 amax values)."""
    rng = np.random.default_rng(2)
    for values in (rng.uniform(-1, 1, 20_000), rng.laplace(size=20_000), rng.standard_t(2, 20_000)):
        values = values.astype(np.float32)
        hist = TensorHistogram("t")
        hist.add(values)
        assert amax_for(hist, "max", "fp8") == pytest.approx(float(np.abs(values).max()))
        chosen = amax_for(hist, "mse", "fp8")
        assert chosen == amax_mse_fp8(hist)

        def error(amax: float, values: np.ndarray = values) -> float:
            return float(((fake_quantize_fp8(values, amax / E4M3_MAX) - values) ** 2).mean())

        scan = np.linspace(hist.amax / 4, hist.amax, 300)
        assert error(chosen) <= error(hist.amax)
        assert error(chosen) <= min(error(a) for a in scan) * 1.001
    with pytest.raises(WorkbenchError, match="entropy"):
        amax_for(hist, "entropy", "fp8")


@pytest.fixture(scope="module")
def digits_session():  # type: ignore[no-untyped-def]
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    session = CalibrationSession(entry.load(), entry=entry, progress=False, max_batches=2)
    session.statistics()
    return session


def test_fp8_qdq_model_runs_in_ort_and_quantizes_like_the_reference(digits_session) -> None:  # type: ignore[no-untyped-def]
    """All-FP8 digits CNN: FP8 zero points, opset 19, every Conv/Gemm input and weight quantized; the DQ outputs ORT
    computes are the reference's E4M3 rounding of the FP32 tensors; the task metric stays near FP32's."""
    from onnx import TensorProto, numpy_helper

    from workbench.ort import cpu_session
    from workbench.precision.qdq_rules import qdq_formats

    session = digits_session
    ranges = session.ranges("mse")
    quantized = session.quantize(ranges, PrecisionPlan(default="fp8"))
    proto = quantized.proto
    assert qdq_formats(proto) == {"fp8"}
    assert next(i.version for i in proto.opset_import if i.domain in ("", "ai.onnx")) >= 19
    math_nodes = [n.name for n in proto.graph.node if n.op_type in ("Conv", "Gemm")]
    assert sorted(quantized.placement.fp8_nodes) == sorted(math_nodes) and not quantized.placement.int8_nodes
    inits = {i.name: i for i in proto.graph.initializer}
    zero_points = [inits[n.input[2]] for n in proto.graph.node if n.op_type == "QuantizeLinear"]
    assert zero_points and all(z.data_type == TensorProto.FLOAT8E4M3FN for z in zero_points)

    # the graph input's and the first weight's DequantizeLinear outputs, from ORT, against the reference
    first_conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    dq_of = {n.output[0]: n for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    input_dq, weight_dq = dq_of[first_conv.input[0]], dq_of[first_conv.input[1]]
    ort = cpu_session(proto, extra_outputs=[input_dq.output[0], weight_dq.output[0]], what="the FP8 digits model")
    feed = next(iter(session.source.batches(1)))
    image_dq, weight_out = ort.run([input_dq.output[0], weight_dq.output[0]], feed)
    image_scale = numpy_helper.to_array(inits[input_dq.input[1]])
    expected = e4m3_reference(feed["image"] / image_scale) * image_scale
    np.testing.assert_array_equal(image_dq, expected)
    assert image_scale == pytest.approx(session.fp8_ranges(ranges).amax["image"] / E4M3_MAX)
    weight_name = next(n.input[0] for n in proto.graph.node if n.output[0] == weight_dq.input[0])
    weight = numpy_helper.to_array(inits[weight_name])
    weight_scales = numpy_helper.to_array(inits[weight_dq.input[1]])
    # per-channel scales chosen by E4M3 rounding error: within one binade above amax / 448 (slight clipping allowed)
    ratio = weight_scales / (np.abs(weight).reshape(weight.shape[0], -1).max(1) / E4M3_MAX)
    assert np.all(ratio > 0.95) and np.all(ratio < 2.0), ratio
    np.testing.assert_array_equal(
        weight_out, e4m3_reference(weight / weight_scales[:, None, None, None]) * weight_scales[:, None, None, None]
    )

    fp32 = session.evaluate().value
    fp8 = session.evaluate(quantized).value
    assert fp8 >= fp32 - 0.01, (fp32, fp8)


def test_mixed_int8_fp8_plan_gives_one_pair_per_format(digits_session) -> None:  # type: ignore[no-untyped-def]
    """A plan mixing INT8 and FP8: each node reads its inputs in its own format; the per-layer diff says which."""
    from workbench.precision.qdq_rules import qdq_formats

    session = digits_session
    nodes = session.quantized_nodes()
    plan = PrecisionPlan(default="int8", overrides={name: "fp8" for name in nodes[::2]})
    quantized = session.quantize(session.ranges("mse"), plan)
    assert qdq_formats(quantized.proto) == {"int8", "fp8"}
    assert quantized.placement.fp8_nodes == nodes[::2] and quantized.placement.int8_nodes == nodes[1::2]
    assert quantized.placement.quantized_nodes == nodes
    by_output = {n.output[0]: n for n in quantized.proto.graph.node}
    inits = {i.name: i for i in quantized.proto.graph.initializer}
    for node in quantized.proto.graph.node:
        if node.name not in nodes:
            continue
        expected = "fp8" if node.name in nodes[::2] else "int8"
        for name in node.input[:2]:
            dq = by_output[name]
            assert dq.op_type == "DequantizeLinear"
            zero = inits[dq.input[2]]
            assert ("fp8" if zero.data_type == 17 else "int8") == expected, (node.name, name)
    diff = session.diff(quantized, max_batches=1)
    formats = {row.name: row.format for row in diff.tensors if row.quantized}
    assert set(formats.values()) == {"int8", "fp8"}
    assert formats["image"] == "fp8"  # read by the first Conv, which the plan puts in FP8
    assert all(row.sqnr_db_local is not None and row.sqnr_db_local > 15 for row in diff.tensors if row.quantized)
    assert session.evaluate(quantized).value >= session.evaluate().value - 0.01


def test_fp8_variant_is_one_row_with_its_colour() -> None:
    from workbench.precision.variant import COST_ORDER, VARIANTS, Variant, parse_variant, variants_for
    from workbench.viz import palette

    info = VARIANTS[Variant.FP8_ALL]
    assert (info.precision, info.quantized, info.mixed, info.choice) == ("fp8", True, False, "fp8")
    assert parse_variant("fp8-all") is Variant.FP8_ALL and variants_for("fp8") == (Variant.FP8_ALL,)
    assert COST_ORDER.index(Variant.FP8_ALL) < COST_ORDER.index(Variant.FP16)
    assert palette.precision_color(Variant.FP8_ALL) == palette.precision_color("fp8") == palette.FP8


def test_tensorrt_fp8_conv_rules_name_the_small_and_wide_convs(digits_session) -> None:  # type: ignore[no-untyped-def]
    """The convolutions TensorRT's FP8 kernels do not serve (ModelOpt's FP8 rules: <= 16 channels, > 32 taps) are
    named with their reason, and a plan that keeps them FP32 gives a model where only the others read FP8."""
    from workbench.precision.qdq_rules import fp8_conv_exclusions

    session = digits_session
    excluded = fp8_conv_exclusions(session.prepared)
    assert set(excluded) == {"/0/Conv", "/3/Conv"}  # 1 -> 16 and 16 -> 32 channels
    assert "1 input / 16 output channels" in excluded["/0/Conv"]
    plan = session.default_plan("fp8").with_overrides(dict.fromkeys(excluded, "fp32"))
    quantized = session.quantize(session.ranges("mse"), plan)
    assert not set(excluded) & set(quantized.placement.quantized_nodes)
    assert {"/6/Conv", "/9/Conv", "/12/Conv", "/17/Gemm"} == set(quantized.placement.fp8_nodes)


def test_engine_cost_counts_fp8_layers(digits_session) -> None:  # type: ignore[no-untyped-def]
    from workbench.calib.cost import build_plan_engine

    session = digits_session
    cost, layer_map = build_plan_engine(session.quantize(session.ranges("mse"), session.default_plan("fp8")))
    assert cost.fp8_math_layers == cost.math_layers == 6 and cost.int8_math_layers == 0
    assert cost.fp8_layers == sum(layer.precision == "fp8" for layer in layer_map.layers) >= 6
    assert cost.fp8_layers + cost.int8_layers + cost.fp16_layers + cost.fp32_layers + cost.other_layers == len(
        layer_map.layers
    )


def test_fp8_weight_scales_by_mse_beat_amax_on_a_real_depthwise_conv() -> None:
    """EfficientNet-Lite0's first depthwise conv (9 weights per channel): the per-channel scale searched over one
    binade has a smaller E4M3 rounding error than amax / 448 on every channel, and a much smaller total."""
    from onnx import numpy_helper

    from workbench.calib.fp8 import fake_quantize_fp8, fp8_weight_scales
    from workbench.zoo import get_entry

    proto = get_entry("efficientnet-lite0").load().proto
    inits = {i.name: i for i in proto.graph.initializer}
    node = next(n for n in proto.graph.node if n.name == "/_blocks.0/_depthwise_conv/Conv")
    weight = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    assert weight.shape == (32, 1, 3, 3)

    def errors(method: str) -> np.ndarray:
        scale = fp8_weight_scales(weight, 0, method=method)
        return np.square(fake_quantize_fp8(weight, scale, 0) - weight).reshape(32, -1).sum(1)

    amax_error, mse_error = errors("max"), errors("mse")
    assert np.all(mse_error <= amax_error * (1 + 1e-6))
    assert mse_error.sum() < 0.5 * amax_error.sum(), (mse_error.sum(), amax_error.sum())  # measured: -8.6 dB
    with pytest.raises(WorkbenchError, match="weight scale method"):
        fp8_weight_scales(weight, 0, method="entropy")


def test_local_bias_correction_removes_a_layers_mean_error(digits_session) -> None:  # type: ignore[no-untyped-def]
    """All-FP8 digits CNN: the local (all-at-once, two-pass) bias correction folds each layer's per-channel mean
    error against its float twin into its bias."""
    from workbench.calib.bias import bias_correct_local

    session = digits_session
    quantized = session.quantize(session.ranges("mse"), PrecisionPlan(default="fp8"))
    feeds = list(session.source.batches(2))
    corrected = bias_correct_local(quantized, feeds)
    assert set(corrected.corrected) == set(quantized.placement.fp8_nodes) and not corrected.skipped
    assert all(value > 0 for value in corrected.corrected.values())
    # the first Conv reads the image itself, so its local error is its whole error: measured against FP32, the
    # per-channel mean of its output error is gone after the correction
    from workbench.ort import cpu_session

    first = quantized.placement.fp8_nodes[0]
    output = next(n.output[0] for n in quantized.proto.graph.node if n.name == first)

    def channel_shift(proto) -> np.ndarray:  # type: ignore[no-untyped-def]
        run = cpu_session(proto, extra_outputs=[output]).run
        reference = cpu_session(session.prepared_fp8, extra_outputs=[output]).run
        return np.mean([(run([output], f)[0] - reference([output], f)[0]).mean(axis=(0, 2, 3)) for f in feeds], 0)

    before, after = np.abs(channel_shift(quantized.proto)), np.abs(channel_shift(corrected.proto))
    assert after.mean() < 0.05 * before.mean(), (before, after)
    with pytest.raises(WorkbenchError, match="passes"):
        bias_correct_local(quantized, feeds, passes=0)


def test_fp8_quantizes_minilm_attention_matmuls() -> None:
    """FP8 puts Q/DQ on both inputs of Q·Kᵀ and softmax·V (INT8 leaves the attention core out); ORT runs it."""
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("minilm")
    feeds = list(entry.calibration_batches(limit=8, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    attention = session.attention_matmuls()
    assert len(attention) == 12
    assert not set(attention) & set(session.quantized_nodes(session.default_plan("int8")))
    quantized = session.quantize(session.ranges("mse"), session.default_plan("fp8"))
    assert set(attention) <= set(quantized.placement.fp8_nodes) and not quantized.placement.excluded
    dq_outputs = {n.output[0] for n in quantized.proto.graph.node if n.op_type == "DequantizeLinear"}
    for node in quantized.proto.graph.node:
        if node.name in attention:
            assert all(name in dq_outputs for name in node.input[:2]), node.name
    assert session.evaluate(quantized, limit=16).value > 0.99


def test_fp8_default_plan_keeps_only_the_stem_out_of_fp8() -> None:
    """EfficientNet-Lite0: the FP8 plan keeps its stem Conv and first depthwise Conv FP16 (2 of 50, within the 5 %
    budget), every other Conv FP8; the digits CNN (6 layers) has no budget for a stem and stays all FP8."""
    from workbench.calib.session import CalibrationSession
    from workbench.precision.qdq_rules import fp8_stem_layers
    from workbench.zoo import get_entry

    entry = get_entry("efficientnet-lite0")
    session = CalibrationSession(entry.load(), data="random", progress=False)
    stem = fp8_stem_layers(session.prepared, prepared=True)
    assert list(stem) == ["/_conv_stem/Conv", "/_blocks.0/_depthwise_conv/Conv"]
    plan = session.default_plan("fp8")
    assert plan.default == "fp8" and plan.overrides == dict.fromkeys(stem, "fp16")
    placement = session.placement(plan)
    assert len(placement.fp8_nodes) == 48 and set(stem) <= set(placement.excluded)
    assert session.default_plan("int8").overrides == {}
    assert fp8_stem_layers(get_entry("digits-cnn").load().proto) == {}


def _attention_block() -> object:
    """A single-head attention block (Q, K, V projections, Q·Kᵀ, softmax, ·V, output projection), opset 19."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    width = 64
    weights = {n: rng.normal(0, 0.1, (width, width)).astype(np.float32) for n in ("wq", "wk", "wv", "wo")}
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v_proj"),
        helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="q_kt"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"], name="probs_v"),
        helper.make_node("MatMul", ["context", "wo"], ["y"], name="out_proj"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, width])],
        [numpy_helper.from_array(v, n) for n, v in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def test_fp8_attention_matmuls_build_as_fp8_layers_on_rtx(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The FP8 plan quantizes Q·Kᵀ and softmax·V (both inputs activations); ORT runs the model, and a real
    TensorRT-RTX build for SM89 runs every MatMul of the block, the two attention ones included, as FP8 layers."""
    import onnx

    from workbench.calib.cost import build_plan_engine
    from workbench.calib.session import CalibrationSession

    path = tmp_path / "attention.onnx"
    onnx.save(_attention_block(), str(path))
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (1, 32, 64)).astype(np.float32)} for _ in range(4)]
    session = CalibrationSession(path, data=feeds, progress=False)
    assert session.attention_matmuls() == ["q_kt", "probs_v"]
    quantized = session.quantize(session.ranges("mse"), session.default_plan("fp8"))
    assert set(quantized.placement.fp8_nodes) == {"q_proj", "k_proj", "v_proj", "q_kt", "probs_v", "out_proj"}
    from workbench.ort import cpu_session

    fp32 = cpu_session(session.prepared_fp8).run(["y"], feeds[0])[0]
    fp8 = cpu_session(quantized.proto).run(["y"], feeds[0])[0]
    assert 10 * np.log10(np.sum(fp32**2) / np.sum((fp8 - fp32) ** 2)) > 15  # FP8 noise, not a broken graph
    _, layer_map = build_plan_engine(quantized, tmp_path, name="attention")
    for node in ("q_kt", "probs_v", "q_proj", "out_proj"):
        layers = [layer for layer in layer_map.layers if node in layer.onnx_nodes]
        assert any(layer.is_fp8_kernel for layer in layers), (node, [(x.name, x.precision) for x in layers])
