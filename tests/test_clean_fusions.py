"""Fusions that move a node into its neighbour (issue 26): a per-channel affine folded forward into the Convs that
read it, and MatMul + constant Add as one Gemm. Small graphs built with onnx-graphsurgeon, run through the real
pipeline (real ONNX Runtime checks), compared with the original in ONNX Runtime here as well."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort

from workbench.clean import CleanOptions, clean_model

F32 = np.float32
RNG = np.random.default_rng(7)


def export(graph: gs.Graph, opset: int = 13) -> onnx.ModelProto:
    graph.opset = opset
    model = gs.export_onnx(graph)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def ops(model: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in model.graph.node)


def const(name: str, *shape: int, low: float | None = None) -> gs.Constant:
    values = RNG.uniform(low, 2.0, shape) if low is not None else RNG.standard_normal(shape)
    return gs.Constant(name, values.astype(F32))


def assert_same_outputs(original: onnx.ModelProto, cleaned: onnx.ModelProto, feed: dict[str, np.ndarray]) -> None:
    for want, got in zip(run(original, feed), run(cleaned, feed)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------- affine into the next Conv


def _concat_affine_graph(conv_attrs: list[dict], affine: str = "bn+mul+add") -> onnx.ModelProto:
    """Two Conv branches joined by a Concat (8 channels), then BatchNormalization / Mul / Add (as ``affine``
    names them), read by one Conv per entry of ``conv_attrs`` whose outputs are summed."""
    x = gs.Variable("x", F32, ["N", 3, 10, 10])
    left, right = gs.Variable("left", F32, None), gs.Variable("right", F32, None)
    joined = gs.Variable("joined", F32, None)
    nodes = [
        gs.Node("Conv", inputs=[x, const("wl", 4, 3, 1, 1)], outputs=[left]),
        gs.Node("Conv", attrs={"pads": [1, 1, 1, 1]}, inputs=[x, const("wr", 4, 3, 3, 3)], outputs=[right]),
        gs.Node("Concat", attrs={"axis": 1}, inputs=[left, right], outputs=[joined]),
    ]
    current = joined
    for step in affine.split("+"):
        out = gs.Variable(f"after_{step}", F32, None)
        if step == "bn":
            params = [const("gamma", 8), const("beta", 8), const("mean", 8), const("var", 8, low=0.5)]
            nodes.append(gs.Node("BatchNormalization", inputs=[current, *params], outputs=[out]))
        elif step == "mul":
            nodes.append(gs.Node("Mul", inputs=[current, const("scale", 1, 8, 1, 1)], outputs=[out]))
        elif step == "add":
            nodes.append(gs.Node("Add", inputs=[const("shift", 8, 1, 1), current], outputs=[out]))
        current = out
    total = None
    for index, attrs in enumerate(conv_attrs):
        group = attrs.get("group", 1)
        kernel = 3 if "pads" in attrs or "auto_pad" in attrs else 1
        out = gs.Variable(f"conv{index}", F32, None)
        inputs = [current, const(f"w{index}", 8, 8 // group, kernel, kernel), const(f"b{index}", 8)]
        nodes.append(gs.Node("Conv", attrs=attrs, inputs=inputs, outputs=[out]))
        if total is None:
            total = out
        else:
            summed = gs.Variable(f"sum{index}", F32, None)
            nodes.append(gs.Node("Add", inputs=[total, out], outputs=[summed]))
            total = summed
    assert total is not None
    total.dtype, total.shape = F32, ["N", 8, 10, 10]
    return export(gs.Graph(nodes=nodes, inputs=[x], outputs=[total]))


FEED = {"x": RNG.standard_normal((2, 3, 10, 10)).astype(F32)}


def test_affine_after_a_concat_folds_into_every_conv_that_reads_it():
    # a plain 1x1 Conv and a grouped (4 groups) 1x1 Conv: no padding, so the shift moves into the biases
    model = _concat_affine_graph([{}, {"group": 4}])
    result = clean_model(model, CleanOptions(passes=["fuse_affine_into_next_conv"]))
    report = result.report("fuse_affine_into_next_conv")
    assert report.status == "accepted", report.failure
    assert report.op_count_delta() == {"BatchNormalization": -1, "Mul": -1, "Add": -1}
    assert ops(result.model)["Conv"] == 4
    assert report.max_abs_diff is not None and report.max_abs_diff > 0  # the weights really changed
    assert_same_outputs(model, result.model, FEED)


def test_affine_stays_where_padding_would_read_zero_instead_of_the_shift():
    # a padded 3x3 Conv reads zeros around the border: a nonzero shift cannot move into it, a scale can
    shifted = _concat_affine_graph([{}, {"pads": [1, 1, 1, 1]}], affine="mul+add")
    result = clean_model(shifted, CleanOptions(passes=["fuse_affine_into_next_conv"]))
    assert ops(result.model)["Mul"] == 1 and ops(result.model)["Add"] == 2  # the shift's Add and the sum
    assert result.report("fuse_affine_into_next_conv").status == "unchanged"

    for padding in ({"pads": [1, 1, 1, 1]}, {"auto_pad": "SAME_UPPER"}):
        scaled = _concat_affine_graph([padding], affine="mul")
        result = clean_model(scaled, CleanOptions(passes=["fuse_affine_into_next_conv"]))
        assert result.report("fuse_affine_into_next_conv").status == "accepted"
        assert "Mul" not in ops(result.model)
        assert_same_outputs(scaled, result.model, FEED)


def test_affine_with_a_reader_that_is_not_a_conv_stays():
    model = _concat_affine_graph([{}], affine="bn")
    graph = gs.import_onnx(model)
    normalized = next(node for node in graph.nodes if node.op == "BatchNormalization").outputs[0]
    extra = gs.Variable("relu_out", F32, ["N", 8, 10, 10])
    graph.nodes.append(gs.Node("Relu", inputs=[normalized], outputs=[extra]))
    graph.outputs.append(extra)
    model = export(graph)
    result = clean_model(model, CleanOptions(passes=["fuse_affine_into_next_conv"]))
    assert result.report("fuse_affine_into_next_conv").status == "unchanged"
    assert ops(result.model)["BatchNormalization"] == 1


def test_default_passes_fold_an_inception_style_affine_chain():
    model = _concat_affine_graph([{}, {}], affine="bn+mul+add")
    result = clean_model(model)
    assert not {"BatchNormalization", "Mul"} & set(ops(result.model))
    assert ops(result.model)["Add"] == 1  # only the sum of the two Convs
    assert result.report("fuse_affine_into_next_conv").status == "accepted"
    assert_same_outputs(model, result.model, FEED)


# ------------------------------------------------------------------------------------- MatMul + Add → Gemm


def _linear(x_shape: list, bias_shape: tuple[int, ...], weight_first: bool = False) -> onnx.ModelProto:
    x = gs.Variable("x", F32, x_shape)
    product = gs.Variable("product", F32, None)
    y = gs.Variable("y", F32, ([1] if len(bias_shape) > len(x_shape) else []) + x_shape[:-1] + [5])
    bias = const("bias", *bias_shape)
    nodes = [
        gs.Node("MatMul", inputs=[x, const("w", 6, 5)], outputs=[product]),
        gs.Node("Add", inputs=[bias, product] if weight_first else [product, bias], outputs=[y]),
    ]
    return export(gs.Graph(nodes=nodes, inputs=[x], outputs=[y]))


def test_matmul_with_constant_bias_becomes_one_gemm_when_both_operands_have_rank_2():
    for bias_shape, first in (((5,), False), ((1, 5), True), ((1,), False)):
        model = _linear(["N", 6], bias_shape, weight_first=first)
        result = clean_model(model, CleanOptions(passes=["fuse_matmul_add_gemm"]))
        report = result.report("fuse_matmul_add_gemm")
        assert report.status == "accepted", report.failure
        assert ops(result.model) == Counter({"Gemm": 1})
        assert_same_outputs(model, result.model, {"x": RNG.standard_normal((3, 6)).astype(F32)})


def test_matmul_add_stays_where_gemm_cannot_express_it():
    # A of rank 3 (Gemm takes matrices only), and a rank-3 bias that widens the product's rank
    for model in (_linear(["N", 4, 6], (5,)), _linear(["N", 6], (1, 1, 5))):
        result = clean_model(model, CleanOptions(passes=["fuse_matmul_add_gemm"]))
        assert result.report("fuse_matmul_add_gemm").status == "unchanged"
        assert ops(result.model) == Counter({"MatMul": 1, "Add": 1})
