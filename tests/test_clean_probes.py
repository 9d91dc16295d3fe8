"""Checks without --data on models with length constraints (issue 26): when no default probe runs, the checker
reads lower bounds from the graph and tries growing sizes; ONNX Runtime's own error lines stay off the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.clean import clean_model
from workbench.clean.checks import cap_batch, default_probe_shapes, size_hints
from workbench.clean.graph_utils import total_node_count
from workbench.cli import main
from workbench.errors import WorkbenchError
from workbench.model import TensorSpec

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from control_flow_models import silero_vad_path  # noqa: E402

ORT_ERROR_LINE = "[E:onnxruntime"


def _framed_signal(pad: int, frame: int, hop: int, reshape_to: list[int] | None = None) -> onnx.ModelProto:
    """A 1-D signal [N, T] framed like an STFT front end: reflect Pad, then a strided Conv with ``frame`` taps
    (T + 2 * pad must be at least ``frame``), optionally a Reshape to a constant shape."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Unsqueeze", ["x", "axis1"], ["x3"]),
        helper.make_node("Pad", ["x3", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Conv", ["padded", "filters"], ["frames"], strides=[hop]),
        helper.make_node("ReduceMean", ["frames"], ["y"], axes=[2], keepdims=0),
    ]
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([0, 0, pad, 0, 0, pad], np.int64), "pads"),
        numpy_helper.from_array(rng.standard_normal((4, 1, frame)).astype(np.float32), "filters"),
    ]
    output_shape: list = ["N", 4]
    if reshape_to is not None:
        nodes[-1] = helper.make_node("ReduceMean", ["frames"], ["mean"], axes=[1], keepdims=0)
        nodes.append(helper.make_node("Reshape", ["mean", "shape"], ["y"]))
        inits.append(numpy_helper.from_array(np.array(reshape_to, np.int64), "shape"))
        output_shape = [None] * len(reshape_to)
    graph = helper.make_graph(
        nodes,
        "framed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, output_shape)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_size_hints_read_pad_and_window_lengths():
    lower, sizes = size_hints(_framed_signal(pad=100, frame=400, hop=160, reshape_to=[1, 700]))
    assert lower == 400  # the window; the reflect padding needs only 101
    assert 700 in sizes


def test_a_framed_signal_too_long_for_the_default_probes_is_checked_at_sizes_found_in_the_graph(capfd):
    model = _framed_signal(pad=100, frame=400, hop=160)
    result = clean_model(model)
    lengths = [shapes["x"][1] for shapes in result.probe_shapes]
    assert lengths and min(lengths) >= 400 - 2 * 100
    assert all(length <= 16384 for length in lengths)
    assert any("search over sizes" in issue for issue in result.baseline_issues)
    assert ORT_ERROR_LINE not in capfd.readouterr().err


def test_no_size_that_runs_gives_one_error_with_ort_s_reason_and_no_red_lines(capfd):
    # a Reshape of the [N, frames] means to [3, 7] needs exactly 21 frames at batch 1 (T from 3400 to 3559 with
    # this hop), a length no size tried gives
    model = _framed_signal(pad=100, frame=400, hop=160, reshape_to=[3, 7])
    with pytest.raises(WorkbenchError) as caught:
        clean_model(model)
    message = str(caught.value)
    assert "search over larger sizes" in message and "Reshape" in message
    assert ORT_ERROR_LINE not in capfd.readouterr().err


def test_named_batch_dimensions_stay_equal_when_the_probe_batch_is_capped():
    # an RNN state [layers, batch, hidden] shares the batch name with the signal's first axis
    inputs = (TensorSpec("x", "float32", ("N", "T")), TensorSpec("state", "float32", (2, "N", 8)))
    probes = cap_batch(default_probe_shapes(inputs), inputs, 2)
    assert all(probe["x"][0] == probe["state"][1] for probe in probes)


def test_silero_vad_cleans_without_data_and_without_ort_lines_on_the_terminal(tmp_path, capfd):
    out = tmp_path / "vad.clean.onnx"
    assert main(["clean", str(silero_vad_path("silero_vad.onnx")), "-o", str(out)]) == 0
    captured = capfd.readouterr()
    assert ORT_ERROR_LINE not in captured.err and ORT_ERROR_LINE not in captured.out
    assert "search over sizes" in captured.out
    compared = next(line for line in captured.out.splitlines() if line.startswith("outputs compared at:"))
    assert "input=[1, 256]" in compared  # the STFT needs 256 samples after its 64-sample reflect padding
    assert total_node_count(onnx.load(out)) < 689  # cleaned, not only accepted
