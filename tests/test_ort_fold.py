"""The weights' Q/DQ chains folded once for ONNX Runtime (workbench.ort.fold_constant_qdq): every output bit for bit
the graph's as written, on real zoo models and on the edge cases a fold could get wrong."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.ort import cpu_session, fold_constant_qdq, session_predict


@pytest.mark.parametrize(("name", "fmt"), [("minilm", "int8"), ("ocr-rec", "int8"), ("ocr-cls", "fp8")])
def test_folding_changes_no_output_bit_on_real_models(name: str, fmt: str) -> None:
    """MiniLM's MatMuls are where it could: a GEMM prepacks constant weights and sums in another order (FP8 weights:
    ocr-cls's Convs and MatMuls). The folded graph has no weight Q/DQ left, and its outputs and task metric equal the
    graph's as written, bit for bit."""
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry(name)
    session = CalibrationSession(entry.load(), data="zoo", entry=entry, progress=False, max_batches=1)
    proto = session.quantize(session.ranges("max"), session.default_plan(fmt)).proto
    folded = fold_constant_qdq(proto)
    assert folded is not None
    weights = {init.name for init in proto.graph.initializer}
    left = [n for n in folded.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert len(left) < sum(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node)
    assert not [n.name for n in left if all(not i or i in weights for i in n.input)], "a weight's Q/DQ is left"
    as_written = session_predict(cpu_session(proto, fold_weights=False))
    with_folding = session_predict(cpu_session(proto))  # the default
    for feed, _labels in list(entry.evaluation_batches(limit=8))[:2]:
        expected, got = as_written(feed), with_folding(feed)
        assert all(np.array_equal(expected[k], got[k]) for k in expected), name
    # the task metric the search and the metrics stage report: the same number either way
    assert entry.evaluate(session_predict(cpu_session(proto)), limit=8).value == (
        entry.evaluate(session_predict(cpu_session(proto, fold_weights=False)), limit=8).value
    )


def _weight_model(*, weight_is_input: bool = False, dq_is_output: bool = False, q_read_elsewhere: bool = False):
    """x[2,4] @ DQ(Q(w[4,3])) (int8, per-tensor scale); options make the chain something that must not fold."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.array(0.02, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "s", "z"], ["wq"], name="q"),
        helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["wd"], name="dq"),
        helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])]
    if weight_is_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 3]))
    if dq_is_output:
        outputs.append(helper.make_tensor_value_info("wd", TensorProto.FLOAT, [4, 3]))
    if q_read_elsewhere:
        nodes.append(helper.make_node("Cast", ["wq"], ["wq_float"], to=TensorProto.FLOAT, name="cast"))
        outputs.append(helper.make_tensor_value_info("wq_float", TensorProto.FLOAT, [4, 3]))
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), w


def test_the_plain_chain_folds_and_runs_the_same() -> None:
    model, _ = _weight_model()
    folded = fold_constant_qdq(model)
    assert folded is not None and [n.op_type for n in folded.graph.node] == ["MatMul"]
    assert fold_constant_qdq(model.SerializeToString()) is not None  # bytes too
    feed = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)}
    got = session_predict(cpu_session(model))(feed)["y"]
    assert np.array_equal(got, session_predict(cpu_session(model, fold_weights=False))(feed)["y"])
    assert len(model.graph.node) == 3  # the caller's model is untouched


def test_what_must_stay_computed_is_not_folded() -> None:
    feed = {"x": np.ones((2, 4), np.float32)}
    # a weight that is also a graph input can be fed another value: not a constant
    model, w = _weight_model(weight_is_input=True)
    assert fold_constant_qdq(model) is None
    session = cpu_session(model)
    assert [i.name for i in session.get_overridable_initializers()] == ["w"]
    doubled = session.run(["y"], {**feed, "w": (2 * w).astype(np.float32)})[0]
    assert not np.array_equal(doubled, session.run(["y"], feed)[0])
    # an output the caller asked for, or a graph output, stays a computed tensor
    model, _ = _weight_model()
    assert fold_constant_qdq(model, keep=["wd"]) is None
    asked = session_predict(cpu_session(model, extra_outputs=["wd"]))(feed)
    assert asked["wd"].shape == (4, 3)
    model, _ = _weight_model(dq_is_output=True)
    assert fold_constant_qdq(model) is None
    # a quantized weight read by something other than its DequantizeLinear keeps its QuantizeLinear (and so its DQ)
    model, _ = _weight_model(q_read_elsewhere=True)
    assert fold_constant_qdq(model) is None
    both = session_predict(cpu_session(model))(feed)
    assert np.array_equal(both["y"], session_predict(cpu_session(model, fold_weights=False))(feed)["y"])


def test_a_graph_without_qdq_or_with_external_weights_is_left_as_it_is(tmp_path) -> None:
    model, _ = _weight_model()
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    del plain.graph.node[:2]
    plain.graph.node[0].input[1] = "w"
    assert fold_constant_qdq(plain) is None
    path = tmp_path / "external.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, size_threshold=0)
    external = onnx.load(str(path), load_external_data=False)
    assert fold_constant_qdq(external) is None  # its weights are not in memory here
    feed = {"x": np.ones((2, 4), np.float32)}
    assert session_predict(cpu_session(path))(feed)["y"].shape == (2, 3)  # a file with external data still runs


def test_a_gemm_left_in_float_keeps_the_model_as_written() -> None:
    """Folding needs weight prepacking off, which would move a MatMul that reads a weight left in float (a mixed plan's
    FP32 GEMM): such a model is not folded, so its outputs stay the graph's as written."""
    model, w = _weight_model()
    model.graph.initializer.append(numpy_helper.from_array(w.T.copy(), "w_float"))
    model.graph.node.append(helper.make_node("MatMul", ["y", "w_float"], ["z"], name="mm_float"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4]))
    assert fold_constant_qdq(model) is None


def _with_if(model: onnx.ModelProto, then_op: str) -> onnx.ModelProto:
    """``model`` plus If(flag): the then-branch applies ``then_op`` to the dequantized weight ``wd`` (read from the
    outer scope), the else-branch negates it."""
    then_inputs = ["wd", "wd"] if then_op in ("Mul", "MatMul") else ["wd"]
    then_graph = helper.make_graph(
        [helper.make_node(then_op, then_inputs, ["then_out"], name="then_op")],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["wd"], ["else_out"], name="else_neg")],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)],
    )
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.node.append(
        helper.make_node("If", ["flag"], ["chosen"], then_branch=then_graph, else_branch=else_graph, name="if")
    )
    model.graph.output.append(helper.make_tensor_value_info("chosen", TensorProto.FLOAT, None))
    return model


def test_a_weight_read_inside_an_if_body_is_folded_where_the_body_finds_it() -> None:
    """An If branch reads the dequantized weight from the outer scope: the folded value is a top-level initializer of
    that name, and both branches give what the graph as written gives."""
    model = _with_if(_weight_model()[0], "Mul")
    folded = fold_constant_qdq(model)
    assert folded is not None and "wd" in {init.name for init in folded.graph.initializer}
    for flag in (True, False):
        feed = {"x": np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), "flag": np.array(flag)}
        got = session_predict(cpu_session(model))(feed)
        expected = session_predict(cpu_session(model, fold_weights=False))(feed)
        assert all(np.array_equal(got[k], expected[k]) for k in expected)


def test_constants_onnx_runtime_may_prepack_elsewhere_keep_the_model_as_written() -> None:
    """Prepacking goes off for a folded model as a whole: a GEMM in an If body, or one reading a Constant node's
    output, could be prepacked in the graph as written, so such a model is not folded."""
    assert fold_constant_qdq(_with_if(_weight_model()[0], "MatMul")) is None
    model, w = _weight_model()
    model.graph.node.append(
        helper.make_node("Constant", [], ["w_const"], value=numpy_helper.from_array(w.T.copy()), name="const")
    )
    model.graph.node.append(helper.make_node("MatMul", ["y", "w_const"], ["z"], name="mm_const"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4]))
    assert fold_constant_qdq(model) is None
