"""Grouped proofs against the one-check-per-pass semantics they stand for, on random pass sequences.

With checks on, consecutive changed passes are proven together (see workbench.clean.pipeline._PassRunner). Whatever
the grouping, each pass must end exactly as if it had been checked alone: good passes kept, bad or raising ones
rolled back, report-only ones reporting, and the final model the composition of the kept passes. Real ONNX Runtime
checks on a small real graph; the sequences come from Hypothesis.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest

from workbench.clean import CleanOptions, CleanPass, clean_model, register_pass

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

F32 = np.float32


def _model(weight: np.ndarray) -> onnx.ModelProto:
    x = gs.Variable("x", F32, ["N", weight.shape[0]])
    a, m = gs.Variable("a", F32, ["N", weight.shape[0]]), gs.Variable("m", F32, ["N", weight.shape[1]])
    y = gs.Variable("y", F32, ["N", weight.shape[1]])
    nodes = [
        gs.Node("Identity", name="identity", inputs=[x], outputs=[a]),
        gs.Node("MatMul", name="matmul", inputs=[a, gs.Constant("W", weight)], outputs=[m]),
        gs.Node("Relu", name="relu", inputs=[m], outputs=[y]),
    ]
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=13)
    model = gs.export_onnx(graph)
    model.ir_version = 8
    return model


def _if_model(weight: np.ndarray) -> onnx.ModelProto:
    """The same layers inside the then-branch of an If (the weight an initializer of the branch)."""
    h, T = onnx.helper, onnx.TensorProto
    then_branch = h.make_graph(
        [
            h.make_node("Identity", ["x"], ["a"], name="identity"),
            h.make_node("MatMul", ["a", "W"], ["m"], name="matmul"),
            h.make_node("Relu", ["m"], ["t"], name="relu"),
        ],
        "then",
        [],
        [h.make_tensor_value_info("t", T.FLOAT, ["N", weight.shape[1]])],
        initializer=[onnx.numpy_helper.from_array(weight, "W")],
    )
    else_branch = h.make_graph(
        [h.make_node("Neg", ["z"], ["e"], name="neg")],
        "else",
        [],
        [h.make_tensor_value_info("e", T.FLOAT, ["N", weight.shape[1]])],
    )
    graph = h.make_graph(
        [h.make_node("If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch)],
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, ["N", weight.shape[0]]),
            h.make_tensor_value_info("z", T.FLOAT, ["N", weight.shape[1]]),
            h.make_tensor_value_info("c", T.BOOL, []),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", weight.shape[1]])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _matmul(graph):
    return next((node for node in graph.nodes if node.op == "MatMul"), None)


def _nudge(graph, context):  # numeric, within tolerance: a new weight each time
    node = _matmul(graph)
    if node is None:  # another graph of the model (the run visits If bodies too)
        return
    old = node.inputs[1]
    node.inputs[1] = gs.Constant(old.name + "n", (np.asarray(old.values) * (1 + 1e-6)).astype(F32))


def _copy(graph, context):  # a new weight of equal value: bit-exact
    node = _matmul(graph)
    if node is None:  # another graph of the model (the run visits If bodies too)
        return
    old = node.inputs[1]
    node.inputs[1] = gs.Constant(old.name + "c", np.array(old.values))


def _rename(graph, context):  # exact, bit-exact: a new node name each time
    node = next((node for node in graph.nodes if node.op == "Relu"), None)
    if node is not None:
        node.name += "r"


def _double(graph, context):  # changes the outputs: never provable
    node = _matmul(graph)
    if node is None:  # another graph of the model (the run visits If bodies too)
        return
    old = node.inputs[1]
    node.inputs[1] = gs.Constant(old.name + "d", np.asarray(old.values) * 2)


def _reassign(graph, context):  # the same Constant given a new array: a change the fingerprint must see
    node = _matmul(graph)
    if node is not None:
        node.inputs[1].values = np.asarray(node.inputs[1].values) * 2


def _in_place(graph, context):  # a write into the weight's array: must fail loudly, never slip through
    node = _matmul(graph)
    if node is not None:
        node.inputs[1].values *= 2


def _raise(graph, context):
    node = _matmul(graph)
    if node is not None:
        node.op = "Gemm"
        raise RuntimeError("broken pass")


def _look(graph, context):  # report-only, changes nothing
    return None


# name -> (pass function, tolerance, what it does when checked alone)
PASSES = {
    "f_nudge": (_nudge, "numeric", "kept"),
    "f_copy_numeric": (_copy, "numeric", "kept"),
    "f_copy_exact": (_copy, "exact", "kept"),
    "f_rename": (_rename, "exact", "kept"),
    "f_double_exact": (_double, "exact", "rolled_back"),
    "f_double_numeric": (_double, "numeric", "rolled_back"),
    "f_raise": (_raise, "exact", "rolled_back"),
    "f_reassign": (_reassign, "exact", "rolled_back"),
    "f_in_place": (_in_place, "numeric", "rolled_back"),
    "f_look": (_look, "report", "report_only"),
    "remove_noops": (None, "exact", "noops"),
}


def _expected(sequence: list[str], weight: np.ndarray) -> tuple[list[str], np.ndarray, str, str, bool]:
    """The statuses, final weight, its name, the Relu's name and whether the Identity is left, of one check per
    pass."""
    statuses, value, name, relu, identity = [], weight, "W", "relu", True
    for pass_name in sequence:
        _, _, effect = PASSES[pass_name]
        if effect == "kept":
            statuses.append("accepted")
            if pass_name == "f_nudge":
                value, name = (value * (1 + 1e-6)).astype(F32), name + "n"
            elif pass_name == "f_rename":
                relu += "r"
            else:
                name += "c"
        elif effect == "noops":
            statuses.append("accepted" if identity else "unchanged")
            identity = False
        else:
            statuses.append(effect)
    return statuses, value, name, relu, identity


for _name, (_function, _tolerance, _) in PASSES.items():
    if _function is not None:
        register_pass(CleanPass(_name, _function, _tolerance), replace=True)


def _layers(model: onnx.ModelProto, where: str) -> onnx.GraphProto:
    if where == "top":
        return model.graph
    return next(attr.g for attr in model.graph.node[0].attribute if attr.name == "then_branch")


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted(PASSES)), min_size=1, max_size=7), st.sampled_from(["top", "body"]))
def test_grouped_proofs_end_as_one_check_per_pass(sequence, where):
    weight = (
        np.random.default_rng(0).standard_normal((64, 32)).astype(F32)
    )  # over the stub size: ORT reads it from memory
    model = _model(weight) if where == "top" else _if_model(weight)
    feeds = [] if where == "top" else [{"x": np.ones((2, 64), F32), "z": np.ones((2, 32), F32), "c": np.array(True)}]

    result = clean_model(model, CleanOptions(passes=sequence, extra_feeds=feeds))

    statuses, value, name, relu, identity = _expected(sequence, weight)
    assert [report.status for report in result.passes] == statuses, [
        (report.name, report.status, report.failure) for report in result.passes
    ]
    layers = _layers(result.model, where)
    inits = {init.name: onnx.numpy_helper.to_array(init) for init in layers.initializer}
    assert list(inits) == [name]
    np.testing.assert_array_equal(inits[name], value)
    assert ("Identity" in [node.op_type for node in layers.node]) == identity
    assert [node.op_type for node in layers.node][-2:] == ["MatMul", "Relu"]
    assert layers.node[-1].name == relu
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(F32)
    feed = {"x": x} if where == "top" else {"x": x, "z": np.ones((2, 32), F32), "c": np.array(True)}
    got = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    np.testing.assert_allclose(got[0], np.maximum(x @ value, 0), rtol=1e-5, atol=1e-5)
    for report in result.passes:  # a group names only passes that were proven, this one among them
        if report.checked_with:
            assert report.status == "accepted" and report.name in report.checked_with


def _expected_unchecked(sequence: list[str], weight: np.ndarray) -> tuple[list[str], np.ndarray, str, str, bool]:
    """As :func:`_expected` with checks off: every pass that does not raise is kept."""
    statuses, value, name, relu, identity = [], weight, "W", "relu", True
    for pass_name in sequence:
        if pass_name in ("f_raise", "f_in_place"):
            statuses.append("rolled_back")
            continue
        if pass_name == "f_look":
            statuses.append("report_only")
            continue
        if pass_name == "remove_noops":
            statuses.append("unchecked" if identity else "unchanged")
            identity = False
            continue
        statuses.append("unchecked")
        if pass_name == "f_nudge":
            value, name = (value * (1 + 1e-6)).astype(F32), name + "n"
        elif pass_name == "f_rename":
            relu += "r"
        elif pass_name.startswith("f_copy"):
            name += "c"
        elif pass_name.startswith("f_double"):
            value, name = value * 2, name + "d"
        elif pass_name == "f_reassign":
            value = value * 2
    return statuses, value, name, relu, identity


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(sorted(PASSES)), min_size=1, max_size=7), st.sampled_from(["top", "body"]))
def test_with_checks_off_the_model_is_every_pass_that_did_not_raise(sequence, where):
    # no export per pass: a raising pass is undone by replaying the kept ones on the original; the final model is
    # the light export with the weights filled in
    weight = np.random.default_rng(0).standard_normal((64, 32)).astype(F32)
    model = _model(weight) if where == "top" else _if_model(weight)

    result = clean_model(model, CleanOptions(passes=sequence, check=False))

    statuses, value, name, relu, identity = _expected_unchecked(sequence, weight)
    assert [report.status for report in result.passes] == statuses
    layers = _layers(result.model, where)
    inits = {init.name: onnx.numpy_helper.to_array(init) for init in layers.initializer}
    assert list(inits) == [name]
    np.testing.assert_array_equal(inits[name], value)
    assert ("Identity" in [node.op_type for node in layers.node]) == identity
    assert [node.op_type for node in layers.node][-2:] == ["MatMul", "Relu"] and layers.node[-1].name == relu
