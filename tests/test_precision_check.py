"""Requested vs actual precision on real TensorRT-RTX builds: FP8 asked of a ConvTranspose (no FP8 kernel) is listed
as a mismatch with its reason and fails --strict-precision; a Conv asked in FP8, and an FP16 build, run as asked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
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
