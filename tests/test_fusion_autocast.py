"""FP16 AutoCast rewrite: real models through ONNX Runtime (reference path) and the documented keep-FP32 rules."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import WorkbenchError
from workbench.model import load_onnx
from workbench.precision import PrecisionPlan
from workbench.precision.autocast import FP16_MAX, apply_precision_plan
from workbench.zoo import get_entry


def _run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feed)


def test_fp16_rewrite_of_ocr_cls_keeps_input_and_matches_fp32(tmp_path: Path) -> None:
    model = get_entry("ocr-cls").load()
    before = model.proto.SerializeToString()
    result = apply_precision_plan(model, PrecisionPlan("fp16"))
    assert model.proto.SerializeToString() == before  # input untouched
    rewritten = result.save(tmp_path / "cls.fp16.onnx")
    assert result.fp16_nodes and result.kept_fp32
    assert result.kept_fp32.get("Softmax@0") == "sensitive-op"
    conv_weights = {init.name: init.data_type for init in rewritten.proto.graph.initializer}
    assert TensorProto.FLOAT16 in conv_weights.values()
    # graph I/O keep their FP32 types, so callers feed and read float32 as before
    assert [spec.dtype for spec in rewritten.inputs] == ["float32"] and [spec.dtype for spec in rewritten.outputs] == [
        "float32"
    ]
    x = np.random.default_rng(0).random((2, 3, 48, 192), dtype=np.float32)
    (reference,) = _run(model.path, {"x": x})
    (half,) = _run(rewritten.path, {"x": x})
    assert half.dtype == np.float32
    assert np.abs(reference - half).max() < 2e-2, np.abs(reference - half).max()
    assert (reference.argmax(1) == half.argmax(1)).all()


def _tiny_graph(tmp_path: Path, big: float) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    scale = numpy_helper.from_array(np.array([[1.0, 2.0, 3.0, big]], np.float32), "scale")
    shape = numpy_helper.from_array(np.array([1, 4], np.int64), "shape")
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["m"], name="mul_big"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["s"], name="softmax", axis=1),
        helper.make_node("Reshape", ["s", "shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y], [scale, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    return path


def test_rules_keep_large_initializers_and_sensitive_ops_fp32(tmp_path: Path) -> None:
    model = load_onnx(_tiny_graph(tmp_path, big=FP16_MAX * 2))
    result = apply_precision_plan(model, PrecisionPlan("fp16"))
    assert result.kept_fp32 == {"mul_big": "large-initializer", "softmax": "sensitive-op"}
    assert result.fp16_nodes == ("relu", "reshape")
    saved = result.save(tmp_path / "tiny.fp16.onnx")
    x = np.array([[0.5, -1.0, 2.0, 1e-3]], np.float32)
    (reference,) = _run(model.path, {"x": x})
    (half,) = _run(saved.path, {"x": x})
    assert np.allclose(reference, half, atol=1e-2)


def test_overrides_choose_nodes_and_int8_needs_qdq(tmp_path: Path) -> None:
    model = load_onnx(_tiny_graph(tmp_path, big=4.0))
    only_relu = apply_precision_plan(model, PrecisionPlan("fp32", {"relu": "fp16"}))
    assert only_relu.fp16_nodes == ("relu",) and only_relu.casts_added == 2  # one cast in, one back
    with pytest.raises(WorkbenchError, match="no QuantizeLinear/DequantizeLinear"):
        apply_precision_plan(model, PrecisionPlan("fp32", {"relu": "int8"}))
    with pytest.raises(WorkbenchError, match="does not have"):
        apply_precision_plan(model, PrecisionPlan("fp32", {"no_such_node": "fp16"}))
