"""Calibration core on synthetic data with known answers: histograms, range methods, Q/DQ rules, caches."""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from workbench.calib.data import IterableSource, RandomSource
from workbench.calib.histogram import NUM_BINS, TensorHistogram
from workbench.calib.methods import (
    amax_entropy,
    amax_max,
    amax_mse,
    amax_percentile,
    entropy_divergences,
    fake_quantize,
    mse_errors,
    per_channel_amax,
    scale_from_amax,
)
from workbench.calib.qdq import insert_qdq
from workbench.calib.stats import CalibrationRanges, collect_statistics, load_tensorrt_cache
from workbench.errors import WorkbenchError
from workbench.precision import PrecisionPlan
from workbench.precision.qdq_rules import activation_tensors


def _hist(*batches: np.ndarray) -> TensorHistogram:
    hist = TensorHistogram("t")
    for batch in batches:
        hist.add(batch)
    return hist


# ----------------------------------------------------------------------------- histograms
def test_histogram_growth_is_exact_and_order_independent() -> None:
    rng = np.random.default_rng(0)
    batches = [rng.normal(0, scale, size=5000).astype(np.float32) for scale in (0.01, 1.0, 30.0, 0.5, 400.0)]
    forward = _hist(*batches)
    backward = _hist(*batches[::-1])
    shuffled = _hist(*[batches[i] for i in (2, 0, 4, 1, 3)])
    at_once = _hist(np.concatenate(batches))
    assert forward.digest() == backward.digest() == shuffled.digest() == at_once.digest()
    np.testing.assert_array_equal(forward.total_counts, at_once.total_counts)
    # the counts are exactly those of binning all values once at the final width
    everything = np.abs(np.concatenate(batches))
    expected = np.bincount(np.minimum((everything / forward.width).astype(np.int64), NUM_BINS - 1), minlength=NUM_BINS)
    np.testing.assert_array_equal(forward.total_counts, expected)
    assert forward.total_counts.sum() == everything.size == forward.count
    assert forward.amax == pytest.approx(float(everything.max()))
    assert forward.counts.size == NUM_BINS  # memory does not grow with range or batches


def test_histogram_merge_equals_single_stream_and_handles_zeros_and_nan() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-3, 3, 1000).astype(np.float32), rng.uniform(-90, 90, 1000).astype(np.float32)
    merged = _hist(np.zeros(10, np.float32), a)
    merged.merge(_hist(b))
    assert merged.digest() == _hist(a, b, np.zeros(10, np.float32)).digest()
    with_nan = _hist(np.array([1.0, np.nan, np.inf, -2.0], dtype=np.float32))
    assert with_nan.nonfinite == 2 and with_nan.count == 2 and with_nan.amax == 2.0
    assert TensorHistogram.from_json(merged.to_json()).digest() == merged.digest()


def test_statistics_do_not_depend_on_batch_order_end_to_end() -> None:
    model = _conv_model()
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.normal(0, s, (2, 3, 8, 8)).astype(np.float32)} for s in (0.1, 5.0, 1.0, 20.0)]
    first = collect_statistics(model, IterableSource(feeds), progress=False)
    second = collect_statistics(model, IterableSource(feeds[::-1]), progress=False)
    assert first.data_digest == second.data_digest
    for name in first.histograms:
        assert first.histograms[name].digest() == second.histograms[name].digest()
    for method in ("max", "percentile", "entropy", "mse"):
        assert first.ranges(method).amax == second.ranges(method).amax


# ----------------------------------------------------------------------------- methods
def test_max_and_percentile_known_answers() -> None:
    values = np.arange(1, 10001, dtype=np.float32) / 1000.0  # uniform 0.001 .. 10.0
    hist = _hist(values)
    assert amax_max(hist) == pytest.approx(10.0)
    # 99 % of the mass lies below 9.9; the answer is a bin edge, so within one bin width
    assert amax_percentile(hist, 99.0) == pytest.approx(9.9, abs=hist.width)
    assert amax_percentile(hist, 50.0) == pytest.approx(5.0, abs=hist.width)
    assert amax_percentile(hist, 100.0) == pytest.approx(10.0)
    with pytest.raises(WorkbenchError, match="percentile"):
        amax_percentile(hist, 0.0)


def test_mse_keeps_a_uniform_range_and_minimises_the_true_error() -> None:
    rng = np.random.default_rng(3)
    uniform = rng.uniform(-4, 4, 200_000).astype(np.float32)
    assert amax_mse(_hist(uniform)) == pytest.approx(4.0, rel=0.03)
    values = np.concatenate([rng.laplace(0, 0.5, 200_000), [40.0] * 3]).astype(np.float32)
    hist = _hist(values)

    def true_mse(amax: float) -> float:
        return float(((fake_quantize(values, amax / 127) - values) ** 2).mean())

    chosen = amax_mse(hist)
    assert chosen < amax_max(hist)
    for other in (amax_max(hist), chosen * 0.5, chosen * 2.0, amax_percentile(hist, 99.0)):
        assert true_mse(chosen) <= true_mse(other) * 1.02


def test_mse_range_does_not_hang_on_where_the_grid_lands_on_a_frequent_value() -> None:
    """A value many samples share (a background) moved by a fraction of a quantization step: the exact error's
    minimum follows it (the grid lands on it at one amax or another), the expected rounding error's does not."""
    rng = np.random.default_rng(5)
    tail = rng.laplace(0, 2.0, 100_000)
    chosen: dict[str, list[float]] = {"exact": [], "expected": []}
    for background in np.linspace(3.0, 3.3, 7):  # the INT8 step is about 0.15 here
        hist = _hist(np.concatenate([tail, np.full(30_000, background)]).astype(np.float32))
        for rounding, amaxes in chosen.items():
            amaxes.append(amax_mse(hist, rounding=rounding))  # type: ignore[arg-type]
    spread = {rounding: max(amaxes) / min(amaxes) - 1.0 for rounding, amaxes in chosen.items()}
    assert spread["exact"] > 0.02, spread  # the effect exists in this data
    assert len(set(chosen["expected"])) == 1, chosen  # inside the range the background costs step^2 / 12 anywhere
    assert chosen["expected"][0] == amax_mse(_hist(np.concatenate([tail, np.full(30_000, 3.1)]).astype(np.float32)))
    # on data without such a value both agree, and the expected one's true error is the exact minimum's
    smooth = rng.laplace(0, 0.5, 200_000).astype(np.float32)
    exact, expected = (amax_mse(_hist(smooth), rounding=r) for r in ("exact", "expected"))
    assert expected == pytest.approx(exact, rel=0.05)

    def true_mse(amax: float) -> float:
        return float(((fake_quantize(smooth, amax / 127) - smooth) ** 2).mean())

    assert true_mse(expected) <= true_mse(exact) * 1.01
    with pytest.raises(WorkbenchError, match="rounding error"):
        amax_mse(_hist(smooth), rounding="nearest")  # type: ignore[arg-type]
    with pytest.raises(WorkbenchError, match="uniform int8 grid"):
        mse_errors(_hist(smooth), grid=lambda points, amax: points, rounding="expected")


def _reference_entropy(counts: np.ndarray, width: float, levels: int = 128) -> tuple[float, np.ndarray]:
    """pytorch-quantization's _compute_amax_entropy written as a plain loop (the straightforward reference)."""
    from scipy.stats import entropy

    bins = counts.astype(np.float64).copy()
    bins[0] = bins[1]
    divergences = []
    for i in range(levels, len(bins) + 1):
        space = np.linspace(0, i, num=levels + 1)
        digitized = np.digitize(range(i), space) - 1
        digitized[bins[:i] == 0] = -1
        group = np.zeros(levels)
        for index, g in enumerate(digitized):
            if g != -1:
                group[g] += bins[index]
        for key, count in Counter(digitized).items():
            if key != -1:
                group[key] /= count
        q = np.array([group[g] if g != -1 else 0.0 for g in digitized])
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        divergences.append(entropy(p, q))
    divergences = np.array(divergences)
    last = len(divergences) - 1 - int(np.argmin(divergences[::-1]))
    return (last + levels) * width, divergences


@pytest.mark.parametrize("seed", [0, 1])
def test_entropy_matches_plain_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = np.concatenate([np.maximum(rng.normal(0.2, 1.0, 50_000), 0), rng.laplace(0, 0.3, 20_000), [9.0]]).astype(
        np.float32
    )
    hist = _hist(values)
    counts = hist.total_counts
    used = counts[: int(np.flatnonzero(counts)[-1]) + 1]
    reference_amax, reference_div = _reference_entropy(used, hist.width)
    _, ours = entropy_divergences(hist)
    finite = np.isfinite(reference_div)
    np.testing.assert_allclose(ours[finite], reference_div[finite], rtol=1e-9, atol=1e-12)
    assert np.array_equal(np.isinf(ours), ~finite)
    assert amax_entropy(hist) == pytest.approx(reference_amax)
    assert amax_entropy(hist) < amax_max(hist)  # it clips the lone outlier at 9.0


def test_per_channel_scales_and_fake_quantize() -> None:
    weight = np.zeros((4, 2, 3, 3), dtype=np.float32)
    for channel in range(4):
        weight[channel] = (channel + 1) * np.linspace(-1, 1, 18).reshape(2, 3, 3)
    np.testing.assert_allclose(per_channel_amax(weight, 0), [1, 2, 3, 4])
    transposed = np.transpose(weight, (1, 0, 2, 3))  # ConvTranspose layout [C_in, C_out, kh, kw]
    np.testing.assert_allclose(per_channel_amax(transposed, 1), [1, 2, 3, 4])
    scales = scale_from_amax(per_channel_amax(weight, 0))
    assert np.all(scales > 0) and scales[3] == pytest.approx(4 / 127)
    assert scale_from_amax(0.0) > 0  # an all-zero tensor still gets a positive scale
    restored = fake_quantize(weight, scales, axis=0)
    assert np.abs(restored - weight).max() <= scales.max() / 2 + 1e-7
    np.testing.assert_array_equal(fake_quantize(np.array([0.5, 1.5, 2.5, 1000.0], np.float32), 1.0), [0, 2, 2, 127])


# ----------------------------------------------------------------------------- Q/DQ rules on small graphs
def _conv_model() -> onnx.ModelProto:
    """x -> Conv -> Relu -> Conv -> Add(skip = x-branch Relu) -> Concat(with pooled) -> Conv; plus a Pad before a Conv."""
    rng = np.random.default_rng(0)
    x = gs.Variable("x", np.float32, (2, 3, 8, 8))
    w1 = gs.Constant("w1", rng.normal(0, 1, (4, 3, 3, 3)).astype(np.float32))
    w2 = gs.Constant("w2", rng.normal(0, 1, (4, 4, 3, 3)).astype(np.float32))
    w3 = gs.Constant("w3", rng.normal(0, 1, (2, 8, 1, 1)).astype(np.float32))
    w4 = gs.Constant("w4", rng.normal(0, 1, (2, 2, 3, 3)).astype(np.float32))
    c1, r1, c2, add, pool, cat, c3, padded, c4 = (
        gs.Variable(n, np.float32) for n in ("c1", "r1", "c2", "add", "pool", "cat", "c3", "padded", "c4")
    )
    pads = gs.Constant("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64))
    nodes = [
        gs.Node("Conv", "conv1", {"pads": [1, 1, 1, 1]}, [x, w1], [c1]),
        gs.Node("Relu", "relu1", {}, [c1], [r1]),
        gs.Node("Conv", "conv2", {"pads": [1, 1, 1, 1]}, [r1, w2], [c2]),
        gs.Node("Add", "residual", {}, [c2, r1], [add]),
        gs.Node("MaxPool", "pool", {"kernel_shape": [1, 1]}, [r1], [pool]),
        gs.Node("Concat", "concat", {"axis": 1}, [add, pool], [cat]),
        gs.Node("Conv", "conv3", {}, [cat, w3], [c3]),
        gs.Node("Pad", "pad", {"mode": "constant"}, [c3, pads], [padded]),
        gs.Node("Conv", "conv4", {}, [padded, w4], [c4]),
    ]
    c4.dtype = np.float32
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[c4], opset=17)
    model = gs.export_onnx(graph)
    model.ir_version = 8
    return model


def _attention_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    x = gs.Variable("x", np.float32, (1, 4, 16))
    wq, wk, wv = (gs.Constant(n, rng.normal(0, 1, (16, 16)).astype(np.float32)) for n in ("wq", "wk", "wv"))
    q, k, v, kt, scores, probs, ctx, ln = (
        gs.Variable(n, np.float32) for n in ("q", "k", "v", "kt", "scores", "probs", "ctx", "ln")
    )
    scale = gs.Constant("ln_scale", np.ones(16, np.float32))
    bias = gs.Constant("ln_bias", np.zeros(16, np.float32))
    nodes = [
        gs.Node("MatMul", "proj_q", {}, [x, wq], [q]),
        gs.Node("MatMul", "proj_k", {}, [x, wk], [k]),
        gs.Node("MatMul", "proj_v", {}, [x, wv], [v]),
        gs.Node("Transpose", "kt", {"perm": [0, 2, 1]}, [k], [kt]),
        gs.Node("MatMul", "qk", {}, [q, kt], [scores]),
        gs.Node("Softmax", "softmax", {"axis": -1}, [scores], [probs]),
        gs.Node("MatMul", "pv", {}, [probs, v], [ctx]),
        gs.Node("LayerNormalization", "ln", {"axis": -1}, [ctx, scale, bias], [ln]),
    ]
    ln.dtype = np.float32
    model = gs.export_onnx(gs.Graph(nodes=nodes, inputs=[x], outputs=[ln], opset=17))
    model.ir_version = 8
    return model


def _qdq_facts(model: onnx.ModelProto) -> dict[str, dict]:
    """For each node: which of its inputs come through a DequantizeLinear, and that DQ's scale/axis."""
    from onnx import numpy_helper

    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dq_by_output = {n.output[0]: n for n in model.graph.node if n.op_type == "DequantizeLinear"}
    facts = {}
    for node in model.graph.node:
        entry = {}
        for index, name in enumerate(node.input):
            if name in dq_by_output:
                dq = dq_by_output[name]
                axis = next((a.i for a in dq.attribute if a.name == "axis"), None)
                entry[index] = {"scale": inits[dq.input[1]], "zero": inits[dq.input[2]], "axis": axis, "source": None}
        facts[node.name] = entry
    q_source = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            if name in dq_by_output:
                facts[node.name][index]["source"] = q_source[dq_by_output[name].input[0]]
    return facts


def test_qdq_follows_tensorrt_rules_on_a_conv_graph() -> None:
    model = _conv_model()
    needed = activation_tensors(model)
    amax = {name: 2.0 + i for i, name in enumerate(needed)}
    result = insert_qdq(model, amax)
    facts = _qdq_facts(result.proto)
    # Conv inputs: activation per tensor, weight per channel on axis 0; zero points int8 0, scales > 0
    assert set(facts["conv1"]) == {0, 1} and facts["conv1"][1]["axis"] == 0 and facts["conv1"][1]["scale"].shape == (4,)
    assert facts["conv1"][0]["scale"].shape == () and facts["conv1"][0]["zero"].dtype == np.int8
    for node in facts.values():
        for item in node.values():
            assert np.all(item["scale"] > 0) and np.all(item["zero"] == 0)
    # residual Add: only the skip input (r1, not conv2's output) is quantized
    assert set(facts["residual"]) == {1} and facts["residual"][1]["source"] == "r1"
    assert result.placement.residual_skips == {"residual": "r1"}
    # no Q/DQ on Conv outputs, none on the ReLU
    assert facts["relu1"] == {} and 0 not in facts["residual"]
    # Pad before Conv: Q/DQ moved onto the Pad's input so TensorRT can fuse Pad into Conv
    assert facts["conv4"][0] if 0 in facts["conv4"] else True
    assert 0 in facts["pad"] and facts["pad"][0]["source"] == "c3" and 0 not in facts["conv4"]
    # the model still runs and stays close to FP32 (ORT, simulated quantization)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    feed = {"x": np.random.default_rng(5).normal(0, 1, (2, 3, 8, 8)).astype(np.float32)}
    reference = ort.InferenceSession(model.SerializeToString(), options).run(None, feed)[0]
    stats = collect_statistics(model, IterableSource([feed]), progress=False)
    quantized = insert_qdq(model, stats.ranges("max").amax)
    out = ort.InferenceSession(quantized.proto.SerializeToString(), options).run(None, feed)[0]
    sqnr = 10 * np.log10((reference**2).sum() / ((reference - out) ** 2).sum())
    assert sqnr > 20.0


def test_concat_inputs_share_one_scale() -> None:
    model = _conv_model()
    # make the pooled branch feed a Conv too, so two Concat inputs are quantized
    graph = gs.import_onnx(model)
    tensors = graph.tensors()
    extra_out = gs.Variable("c5", np.float32)
    graph.nodes.append(
        gs.Node(
            "Conv", "conv5", {}, [tensors["pool"], gs.Constant("w5", np.ones((1, 4, 1, 1), np.float32))], [extra_out]
        )
    )
    graph.outputs.append(extra_out)
    model = gs.export_onnx(graph.cleanup().toposort())
    needed = activation_tensors(model)
    amax = {name: 1.0 for name in needed}
    amax["pool"], amax["add"] = 3.0, 7.0
    result = insert_qdq(model, amax)
    group = next(g for g in result.placement.shared_scale_groups if "pool" in g)
    assert "cat" in group and "add" not in group  # the Add output is not quantized itself, so it has no scale
    assert result.scales["pool"] == pytest.approx(result.scales["cat"]) == pytest.approx(max(3.0, amax["cat"]) / 127)


def test_attention_core_and_layernorm_are_not_quantized_and_plan_is_respected() -> None:
    model = _attention_model()
    result = insert_qdq(model, {name: 1.0 for name in activation_tensors(model)})
    facts = _qdq_facts(result.proto)
    assert facts["qk"] == {} and facts["pv"] == {} and facts["ln"] == {}
    assert "attention" in result.placement.excluded["qk"]
    assert facts["proj_q"][1]["axis"] == 1 and facts["proj_q"][1]["scale"].shape == (16,)  # MatMul weight: per column
    kept = insert_qdq(
        model, {name: 1.0 for name in activation_tensors(model)}, PrecisionPlan("int8", {"proj_v": "fp32"})
    )
    kept_facts = _qdq_facts(kept.proto)
    assert kept_facts["proj_v"] == {} and kept_facts["proj_k"] != {}
    assert kept.placement.excluded["proj_v"] == "plan says fp32"


def test_qdq_output_passes_the_cleaners_lint_and_refuses_bad_input() -> None:
    from workbench.clean.qdq_lint import lint_qdq

    for model in (_conv_model(), _attention_model()):
        result = insert_qdq(model, {name: 1.5 for name in activation_tensors(model)})
        assert [f.to_json() for f in lint_qdq(result.proto)] == []
        with pytest.raises(WorkbenchError, match="already has Q/DQ"):
            insert_qdq(result.proto, {})
    with pytest.raises(WorkbenchError, match="no calibrated range"):
        insert_qdq(_conv_model(), {})


def test_fp16_fallback_uses_autocast() -> None:
    model = _conv_model()
    amax = {name: 2.0 for name in activation_tensors(model)}
    result = insert_qdq(model, amax, PrecisionPlan("int8", {"conv3": "fp16"}))
    assert "conv3" in result.fp16_nodes
    assert any(n.op_type == "Cast" for n in result.proto.graph.node)
    assert _qdq_facts(result.proto).get("conv3", {}) == {} or all(
        item["source"] is None for item in _qdq_facts(result.proto)["conv3"].values()
    )


# ----------------------------------------------------------------------------- caches and data
def test_cache_round_trip_and_method_switch(tmp_path) -> None:
    model = _conv_model()
    rng = np.random.default_rng(4)
    stats = collect_statistics(
        model, IterableSource([{"x": rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)}]), progress=False
    )
    ranges = stats.ranges("entropy")
    path = ranges.save(tmp_path / "model.calib.json")
    loaded = CalibrationRanges.load(path, model_sha256=ranges.model_sha256)
    assert loaded.amax == pytest.approx(ranges.amax) and loaded.method == "entropy"
    assert loaded.histogram_digests == ranges.histogram_digests and loaded.data_digest == stats.data_digest
    assert loaded.statistics is not None
    assert loaded.statistics.ranges("mse").amax == pytest.approx(stats.ranges("mse").amax)  # no data re-read
    with pytest.raises(WorkbenchError, match="different model"):
        CalibrationRanges.load(path, model_sha256="0" * 64)
    (tmp_path / "bad.json").write_text('{"x": 1}')
    with pytest.raises(WorkbenchError, match="not a workbench calibration cache"):
        CalibrationRanges.load(tmp_path / "bad.json")


def test_tensorrt_text_cache_loader(tmp_path) -> None:
    scales = {"input": 0.0078125, "conv1_out": 0.05, "(Unnamed Layer* 3) [Activation]_output": 1.5e-3}
    lines = ["TRT-8601-EntropyCalibration2"] + [f"{name}: {struct.pack('>f', s).hex()}" for name, s in scales.items()]
    path = tmp_path / "calib.cache"
    path.write_text("\n".join(lines) + "\n")
    ranges = load_tensorrt_cache(path)
    assert ranges.method == "tensorrt:EntropyCalibration2"
    for name, scale in scales.items():
        assert ranges.amax[name] == pytest.approx(np.float32(scale) * 127)
    assert CalibrationRanges.load(path).amax == ranges.amax  # the generic loader recognises the header
    path.write_text("TRT-8601-EntropyCalibration2\nconv: zz\n")
    with pytest.raises(WorkbenchError, match="hex float32"):
        load_tensorrt_cache(path)


def test_random_data_is_flagged_and_bad_feeds_are_explained() -> None:
    from workbench.model import TensorSpec

    model = _conv_model()
    with pytest.warns(UserWarning, match="RANDOM"):
        stats = collect_statistics(
            model, RandomSource([TensorSpec("x", "float32", (2, 3, 8, 8))], num_batches=2), progress=False
        )
    assert stats.random_data and any("RANDOM" in w for w in stats.ranges("max").warnings)
    with pytest.raises(WorkbenchError, match="lacks model input"):
        collect_statistics(model, IterableSource([{"y": np.zeros((2, 3, 8, 8), np.float32)}]), progress=False)


def test_cli_shows_the_random_data_warning_once(tmp_path) -> None:
    """The stage both warns (for notebooks) and returns the text as a note; the CLI shows it once, as a warning line."""
    from cli_runner import run_cli_subprocess, tiny_onnx

    from workbench.calib.data import RANDOM_DATA_WARNING

    model = tiny_onnx(tmp_path / "tiny.onnx")
    out = tmp_path / "q.onnx"
    # its own process: a forked child would inherit pytest's warning capture and hide a duplicate on stderr
    run = run_cli_subprocess(["calibrate", str(model), "--data", "random", "-o", str(out), "--no-progress"], tmp_path)
    assert run.returncode == 0, run.stderr
    both = run.stdout + run.stderr
    assert both.count(RANDOM_DATA_WARNING) == 1, both
    assert f"warning: {RANDOM_DATA_WARNING}" in run.stdout
    assert "UserWarning" not in both
    assert out.exists()
