"""Requested vs actual precision on real TensorRT-RTX builds: FP8 asked of a ConvTranspose (no FP8 kernel) is listed
as a mismatch with its reason and fails --strict-precision; a Conv asked in FP8, and an FP16 build, run as asked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_runner import run_cli_forked
from onnx import TensorProto, helper, numpy_helper


def _fp8_model(path: Path, op: str) -> Path:
    """x -> FP8 Q/DQ -> Conv or ConvTranspose (weights FP8 per channel) -> y; the node is named 'target'."""
    rng = np.random.default_rng(0)
    transpose = op == "ConvTranspose"
    weight = rng.standard_normal((16, 16, 2, 2) if transpose else (16, 16, 3, 3)).astype(np.float32)
    axis = 1 if transpose else 0
    channel_amax = np.abs(np.moveaxis(weight, axis, 0)).reshape(16, -1).max(axis=1)
    inits = [
        numpy_helper.from_array(weight, "W"),
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        helper.make_tensor("x_zero", TensorProto.FLOAT8E4M3FN, [], [0.0]),
        numpy_helper.from_array((channel_amax / 448).astype(np.float32), "w_scale"),
        helper.make_tensor("w_zero", TensorProto.FLOAT8E4M3FN, [16], [0.0] * 16),
    ]
    attrs = {"strides": [2, 2]} if transpose else {"pads": [1, 1, 1, 1]}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"], name="x_Q"),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"], name="x_DQ"),
        helper.make_node("QuantizeLinear", ["W", "w_scale", "w_zero"], ["wq"], name="w_Q", axis=axis),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "w_zero"], ["wd"], name="w_DQ", axis=axis),
        helper.make_node(op, ["xd", "wd"], ["y"], name="target", **attrs),
    ]
    size = 16 if transpose else 8
    graph = helper.make_graph(
        nodes,
        op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, size, size])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_fp8_convtranspose_is_a_mismatch_and_fails_strict_precision(tmp_path: Path) -> None:
    model = _fp8_model(tmp_path / "deconv.onnx", "ConvTranspose")
    strict = run_cli_forked(
        ["build", str(model), "-o", str(tmp_path / "strict.engine"), "--strict-precision", "--no-progress"],
        cwd=tmp_path,
    )
    assert strict.returncode == 2, strict.stdout + strict.stderr
    assert "target (ConvTranspose): requested fp8, runs fp32" in strict.stderr
    assert "no FP8 kernel for this ConvTranspose" in strict.stderr
    assert not list(tmp_path.glob("strict*"))  # nothing written
    loose = run_cli_forked(["build", str(model), "-o", str(tmp_path / "d.engine"), "--no-progress"], cwd=tmp_path)
    assert loose.returncode == 0, loose.stderr
    assert "1 mismatch(es)" in loose.stdout and "mismatch  target (ConvTranspose)" in loose.stdout
    check = json.loads((tmp_path / "d.layers.json").read_text())["precision_check"]
    assert check["checked"] == 1 and len(check["mismatches"]) == 1
    mismatch = check["mismatches"][0]
    assert (mismatch["node"], mismatch["requested"], mismatch["actual"]) == ("target", "fp8", "fp32")
    assert mismatch["layer_type"] == "deconv"
    # the linter lists it too
    from workbench.engine.build import EngineArtifact
    from workbench.engine.lint import lint

    engine = EngineArtifact.load(tmp_path / "d.engine")
    report = lint(engine.layer_map, engine.engine_layers, None, engine.precision_check)
    assert [f.onnx_nodes for f in report.of_kind("precision-mismatch")] == [("target",)]
    # and the explorer's view of the build carries the check to its lint (from the artifact and from the file)
    from workbench.explore.graphs import load_view

    for source in (engine, tmp_path / "d.layers.json"):
        view = load_view(source)
        assert view.precision_check is not None and len(view.precision_check.mismatches) == 1


def test_fp8_conv_and_fp16_builds_run_as_requested(tmp_path: Path) -> None:
    conv = _fp8_model(tmp_path / "conv.onnx", "Conv")
    strict = run_cli_forked(
        ["build", str(conv), "-o", str(tmp_path / "conv.engine"), "--strict-precision", "--no-progress"], cwd=tmp_path
    )
    assert strict.returncode == 0, strict.stderr
    assert "1 node(s) checked (fp8 1); all run as requested" in strict.stdout
    fp16 = run_cli_forked(
        ["build", "digits-cnn", "--precision", "fp16", "-o", str(tmp_path / "d16.engine"), "--strict-precision"],
        cwd=tmp_path,
    )
    assert fp16.returncode == 0, fp16.stderr
    check = json.loads((tmp_path / "d16.layers.json").read_text())["precision_check"]
    assert check["requested"]["fp16"] >= 6 and check["mismatches"] == []


def _left_weight_model(path: Path) -> Path:
    """y = W · x with the constant W on the left (a learned query bank, DETR / Perceiver style), in float."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["W", "x"], ["y"], name="left_mm")]
    graph = helper.make_graph(
        nodes,
        "left",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 48, 32])],
        [numpy_helper.from_array(rng.standard_normal((48, 64)).astype(np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_constant_left_operand_is_quantized_per_row_and_a_float_one_is_a_mismatch(tmp_path: Path) -> None:
    """MatMul(W, x): calibration quantizes W per output row (axis 0), so TensorRT-RTX runs an INT8 GEMM. A Q/DQ model
    that dequantizes only x (what calibration wrote before) leaves W in float: RTX computes the product in FP32 in
    a generated kernel whose *output* is INT8 when a later Q reads it, which must not pass for an INT8 node."""
    model = _left_weight_model(tmp_path / "left.onnx")
    calibrated = tmp_path / "left.int8.onnx"
    run = run_cli_forked(
        ["calibrate", str(model), "--data", "random", "-o", str(calibrated), "--no-progress"], cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    proto = onnx.load(str(calibrated))
    weight_dq = next(
        n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.output[0] in proto.graph.node[-1].input[:1]
    )
    assert next(a.i for a in weight_dq.attribute if a.name == "axis") == 0
    scale = next(i for i in proto.graph.initializer if i.name == weight_dq.input[1])
    assert list(scale.dims) == [48]  # one scale per output row
    build = run_cli_forked(
        [
            "build",
            str(calibrated),
            "-o",
            str(tmp_path / "q.engine"),
            "--shapes",
            "x:1x64x32,2x64x32,4x64x32",
            "--strict-precision",
            "--no-progress",
        ],
        cwd=tmp_path,
    )
    assert build.returncode == 0, build.stderr
    layers = json.loads((tmp_path / "q.layers.json").read_text())["engine_layers"]
    gemm = [layer for layer in layers if "left_mm" in layer["onnx_nodes"] and layer["type"] == "gemm"]
    assert gemm and gemm[0]["precision"] == "int8"

    # the same model with W left in float behind an x-only Q/DQ, followed by a Q/DQ of y (the fused output Q)
    half = onnx.load(str(model))
    inits = [
        numpy_helper.from_array(np.array(0.03, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "z"),
    ]
    half.graph.initializer.extend(inits)
    del half.graph.node[:]
    half.graph.node.extend(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="x_Q"),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="x_DQ"),
            helper.make_node("MatMul", ["W", "xd"], ["m"], name="left_mm"),
            helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"], name="m_Q"),
            helper.make_node("DequantizeLinear", ["mq", "s", "z"], ["y"], name="m_DQ"),
        ]
    )
    onnx.save(half, str(tmp_path / "half.onnx"))
    strict = run_cli_forked(
        [
            "build",
            str(tmp_path / "half.onnx"),
            "-o",
            str(tmp_path / "h.engine"),
            "--shapes",
            "x:1x64x32,2x64x32,4x64x32",
            "--strict-precision",
            "--no-progress",
        ],
        cwd=tmp_path,
    )
    assert strict.returncode == 2, strict.stdout + strict.stderr
    assert "left_mm (MatMul): requested int8, runs fp32" in strict.stderr
    assert "constant operand 'W' has no Q/DQ" in strict.stderr
    assert not list(tmp_path.glob("h.*"))  # nothing written


@pytest.mark.parametrize("trans_a", [0, 1])
def test_a_gemm_constant_a_is_quantized_per_output_row_and_builds_as_int8(tmp_path: Path, trans_a: int) -> None:
    """Gemm(A, x) with a constant A ([M, K], or [K, M] with transA): its scales go along M (axis 0, or 1 with
    transA); TensorRT-RTX builds an INT8 GEMM and every node runs as asked."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((64, 48) if trans_a else (48, 64)).astype(np.float32)
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0], name="to_columns"),
        helper.make_node("Gemm", ["A", "xt"], ["yt"], name="gemm_left", transA=trans_a),
        helper.make_node("Transpose", ["yt"], ["y"], perm=[1, 0], name="to_rows"),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm_left",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 48])],
        [numpy_helper.from_array(weight, "A")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "gemm.onnx")
    calibrated = tmp_path / "gemm.int8.onnx"
    argv = ["calibrate", str(tmp_path / "gemm.onnx"), "--data", "random", "-o", str(calibrated), "--no-progress"]
    run = run_cli_forked(argv, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    proto = onnx.load(str(calibrated))
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    weight_dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == gemm.input[0])
    assert next(a.i for a in weight_dq.attribute if a.name == "axis") == trans_a
    scale = next(i for i in proto.graph.initializer if i.name == weight_dq.input[1])
    assert list(scale.dims) == [48]
    build = ["build", str(calibrated), "-o", str(tmp_path / "g.engine"), "--shapes", "x:1x64,4x64,8x64"]
    run = run_cli_forked([*build, "--strict-precision", "--no-progress"], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    layers = json.loads((tmp_path / "g.layers.json").read_text())["engine_layers"]
    assert any(
        layer["type"] == "gemm" and layer["precision"] == "int8"
        for layer in layers
        if "gemm_left" in layer["onnx_nodes"]
    )
