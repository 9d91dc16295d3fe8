"""Grid alignment (workbench.calib.align): the input grid read from 8-bit images, the rewrites exact in float on real
models (only the rounding changes), the input quantized losslessly, lower INT8 error, the same engine layers in a
real TensorRT-RTX build, the tensors it must leave alone, and the session / CLI / search wiring."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from workbench.calib.align import align_qdq, find_input_grid
from workbench.calib.qdq import bypass_qdq_pairs
from workbench.calib.session import CalibrationSession
from workbench.ort import cpu_predict

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(1, 3, 1, 1)


def _images(count: int, seed: int = 0, size: int = 16) -> np.ndarray:
    """ImageNet-normalised images from 8-bit pixels: smooth shapes plus pixel noise, every level 0..255 present."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(count, 3, size, size)).astype(np.float32)
    return ((pixels / 255.0 - MEAN) / STD).astype(np.float32)


def _without_activation_pairs(proto: object, keep: tuple[str, ...] = ()) -> object:
    """Weights still quantized; activation pairs bypassed except those of tensors starting with ``keep``."""
    return bypass_qdq_pairs(proto, lambda tensor, is_weight: is_weight or (bool(keep) and tensor.startswith(keep)))


def _image_model(path: Path, batch: int | str = "batch") -> Path:
    """image -> Conv 3x3 (pads 1) -> Relu -> zero Pad -> Conv 3x3 stride 2 -> Relu -> Conv 1x1 -> mean: the
    layouts the rewrites meet (pads attribute, a Pad node, no padding)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    weights = {
        "w1": rng.normal(0, 0.3, (8, 3, 3, 3)),
        "b1": rng.normal(0, 0.1, 8),
        "w2": rng.normal(0, 0.2, (8, 8, 3, 3)),
        "b2": rng.normal(0, 0.1, 8),
        "w3": rng.normal(0, 0.3, (4, 8, 1, 1)),
        "pads": np.array([0, 0, 0, 0, 0, 0, 1, 1], dtype=np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Pad", ["r1", "pads"], ["p1"], name="pad1", mode="constant"),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
        helper.make_node("ReduceMean", ["c3"], ["logits"], name="mean", axes=[2, 3], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "aligned_layouts",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 4])],
        [numpy_helper.from_array(v.astype(np.int64 if k == "pads" else np.float32), k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def image_session(tmp_path_factory) -> CalibrationSession:
    path = _image_model(tmp_path_factory.mktemp("align") / "image.onnx")
    feeds = [{"image": _images(8, seed)} for seed in range(4)]
    return CalibrationSession(str(path), data=feeds, progress=False)


def test_the_grid_of_8_bit_images_is_found_and_other_data_is_refused() -> None:
    images = _images(4)
    steps, anchors = find_input_grid(images)
    np.testing.assert_allclose(steps, 1.0 / (255.0 * STD.ravel()), rtol=1e-5)
    integers = (images - anchors.reshape(1, 3, 1, 1)) / steps.reshape(1, 3, 1, 1)
    assert np.abs(integers - np.round(integers)).max() < 1e-3
    assert integers.min() > -128.5 and integers.max() < 127.5
    rng = np.random.default_rng(0)
    assert find_input_grid(rng.normal(size=(4, 3, 8, 8)).astype(np.float32)) is None  # continuous values
    assert find_input_grid(np.linspace(0, 1, 600, dtype=np.float32).reshape(1, 1, 600)) is None  # 600 levels
    assert find_input_grid(np.ones((2, 3, 4, 4), np.float32)) is None  # a constant channel
    assert find_input_grid(np.arange(12).reshape(2, 3, 2)) is None  # integers are not a float input
    # fewer levels are centred in -128..127
    steps, anchors = find_input_grid(np.arange(0, 10, dtype=np.float32).reshape(1, 1, 10) * 0.5 + 3.0)
    levels = (np.arange(0, 10) * 0.5 + 3.0 - anchors[0]) / steps[0]
    assert levels.min() >= -128 and levels.max() <= 127 and abs(levels.min() + levels.max()) <= 2


def test_rewrites_are_exact_in_float_and_the_input_is_quantized_losslessly(image_session) -> None:
    session = image_session
    quantized = session.quantize()
    feeds = {"image": _images(6, seed=9)}
    aligned, alignment = align_qdq(quantized.proto, {"image": _images(32, seed=3)})
    assert list(alignment.input_grids) == ["image"]
    assert set(alignment.shifted) == {"r1", "r2"}
    assert set(alignment.border_maps) == {"conv1", "conv2"}  # the pads attribute, and the Pad node
    assert alignment.requantized_weights == ("conv1",)

    # the shifts are exact in float: with the activation pairs bypassed, the model is unchanged
    only_shift, _ = align_qdq(quantized.proto, {"image": _images(32, seed=3)}, input_grids=False)
    reference = cpu_predict(_without_activation_pairs(quantized.proto))(feeds)["logits"]
    shifted = cpu_predict(_without_activation_pairs(only_shift))(feeds)["logits"]
    np.testing.assert_allclose(shifted, reference, atol=1e-5 * np.abs(reference).max())

    # the input's quantization is lossless: bypassing its pair changes nothing (it does in the unaligned model)
    with_input_pair = cpu_predict(_without_activation_pairs(aligned, keep=("image",)))(feeds)["logits"]
    without_any = cpu_predict(_without_activation_pairs(aligned))(feeds)["logits"]
    np.testing.assert_allclose(with_input_pair, without_any, atol=1e-5 * np.abs(without_any).max())
    base_with_input = cpu_predict(_without_activation_pairs(quantized.proto, keep=("image",)))(feeds)["logits"]
    assert np.abs(base_with_input - reference).max() > 1e-3 * np.abs(reference).max()

    # and a shifted tensor's rounding error falls (half the step; its zeros stay exact either way)
    import onnx

    def value(proto: object, name: str) -> np.ndarray:
        model = onnx.ModelProto()
        model.CopyFrom(proto)
        model.graph.output.append(onnx.ValueInfoProto(name=name))
        return cpu_predict(model)(feeds)[name]

    def dequantized(proto: object) -> str:
        return next(n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear" and "r1" in n.input[0])

    relu = value(session.prepared, "r1")
    shift = float(session.ranges().amax["r1"]) / 2
    base_error = np.mean((value(quantized.proto, dequantized(quantized.proto)) - relu) ** 2)
    aligned_error = np.mean((value(aligned, dequantized(aligned)) + shift - relu) ** 2)
    assert aligned_error < 0.75 * base_error, (aligned_error, base_error)


def test_tensors_that_cannot_absorb_the_shift_are_left_alone(image_session, tmp_path) -> None:
    import onnx

    quantized = image_session.quantize()
    # dynamic spatial shapes: no border map can be made, so tensors read by padded Convs stay as they are
    _, alignment = align_qdq(quantized.proto, {"image": _images(8)}, static_shapes=False)
    assert "image" in alignment.skipped and "r1" in alignment.skipped
    assert "not static" in alignment.skipped["r1"]
    assert alignment.shifted == ("r2",)  # read by the 1x1 Conv: no padding, no map needed
    # a graph that fixes its batch at 8 is run on 8 samples for its shapes; with fewer there is no border map, and
    # only the reader without padding is shifted
    fixed = CalibrationSession(
        str(_image_model(tmp_path / "fixed.onnx", batch=8)), data=[{"image": _images(8)}], progress=False
    ).quantize()
    _, alignment = align_qdq(fixed.proto, {"image": _images(8)})
    assert set(alignment.shifted) == {"r1", "r2"} and "image" in alignment.input_grids
    _, alignment = align_qdq(fixed.proto, {"image": _images(4)})
    assert alignment.shifted == ("r2",) and "could not be run" in alignment.skipped["r1"]
    # not an 8-bit grid (noise between the levels): the input keeps its calibrated scale
    noisy = _images(8) + np.random.default_rng(0).normal(0, 1e-3, (8, 3, 16, 16)).astype(np.float32)
    _, alignment = align_qdq(quantized.proto, {"image": noisy})
    assert "uniform grid" in alignment.skipped["image"]
    # a non-negative tensor read by something other than a Conv is not shifted
    model = onnx.ModelProto()
    model.CopyFrom(quantized.proto)
    dequantized = next(n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and "r2" in n.input[0])
    model.graph.node.append(onnx.helper.make_node("Neg", [dequantized], ["extra"], name="extra_reader"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    _, alignment = align_qdq(model, {"image": _images(8)})
    assert "r2" not in alignment.shifted and "Neg" in alignment.skipped["r2"]


def test_a_real_model_keeps_its_engine_layers_and_gains(tmp_path) -> None:
    """digits-cnn: shifts exact in float, lower error on evaluation samples, and the TensorRT-RTX build keeps every
    layer and every INT8 kernel (the shift and the border maps fuse into the Convs)."""
    from workbench.calib.cost import build_plan_engine
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=32, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    quantized = session.quantize()
    session.align_grids = True
    aligned = session.quantize()
    assert aligned.alignment is not None and len(aligned.alignment.shifted) == 4
    assert any("grid alignment" in note for note in aligned.notes)
    samples = next(iter(entry.evaluation_batches(limit=64, batch_size=64)))[0]
    fp32 = cpu_predict(session.prepared)(samples)
    name = entry.metric_output
    errors = [float(np.mean((cpu_predict(q.proto)(samples)[name] - fp32[name]) ** 2)) for q in (quantized, aligned)]
    assert errors[1] < errors[0], errors
    reference = cpu_predict(_without_activation_pairs(quantized.proto))(samples)[name]
    shifted = cpu_predict(_without_activation_pairs(aligned.proto))(samples)[name]
    np.testing.assert_allclose(shifted, reference, atol=1e-5 * np.abs(reference).max())
    base_cost, _ = build_plan_engine(quantized, name="base", shapes=entry.input_profiles())
    aligned_cost, _ = build_plan_engine(aligned, name="aligned", shapes=entry.input_profiles())
    assert aligned_cost.engine_layers == base_cost.engine_layers
    assert aligned_cost.int8_math_layers == base_cost.int8_math_layers == base_cost.math_layers
    assert aligned_cost.qdq_kernels == base_cost.qdq_kernels
    # the record of what was done survives JSON
    from workbench.calib.qdq import QdqModel

    assert QdqModel.from_json(aligned.to_json()).alignment == aligned.alignment


def test_cli_and_search_take_the_option(tmp_path, capsys) -> None:
    from workbench.calib.search import search_mixed_precision
    from workbench.cli import main as cli_main
    from workbench.zoo import get_entry

    output = tmp_path / "digits.int8.onnx"
    code = cli_main(
        ["calibrate", "digits-cnn", "--data", "zoo", "--align-grids", "on", "--output", str(output), "--no-progress"]
    )
    assert code == 0 and output.exists()
    assert "grid alignment: 0 input(s) on their pixel grid" in capsys.readouterr().out
    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=16, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    result = search_mixed_precision(session, target_drop=0.05, budget=2, limit=64, build_costs=False, align_grids=True)
    assert result.align_grids and session.align_grids
    assert session.quantize(session.ranges("mse"), result.plan).alignment is not None
    # auto: the start plan scored both ways; the choice is the one the recorded scores support
    result = search_mixed_precision(
        session, target_drop=0.05, budget=2, limit=64, screen=32, build_costs=False, align_grids="auto"
    )
    note = next(n for n in result.notes if n.startswith("grid alignment"))
    assert result.align_grids == session.align_grids == ("grid alignment on" in note)
    noise_plain, noise_aligned = (float(x) for x in re.findall(r"output noise (\S+) -> (\S+) on", note)[0])
    if "so it decides" in note:  # one side's noise under 80 % of the other's: it decides, no task evaluation
        assert min(noise_plain, noise_aligned) < 0.8 * max(noise_plain, noise_aligned) * 1.01  # printed to 3 digits
        assert result.align_grids == (noise_aligned < noise_plain)
    elif "so it stays off" in note:  # the paired interval straddles 0 too: no measured gain, no rewrite
        assert not result.align_grids
    else:
        assert result.align_grids == ("gains" in note)
    # calibrate's default for a model with a task metric: auto, chosen on the plan it writes
    capsys.readouterr()
    assert cli_main(["calibrate", "digits-cnn", "--data", "zoo", "--output", str(output), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    choice = re.search(r"grid alignment (on|off): output noise \S+ -> \S+ on 32 samples", printed)
    assert choice is not None, printed
    assert ("warning: grid alignment: " in printed) == (choice.group(1) == "on")  # the model written follows it
    # what the border maps cost is said in bytes, whichever way it went (digits-cnn: four padded Convs)
    assert re.search(r"its 4 border map\(s\) add \d+\.\d KiB to the model's \d+\.\d KiB", printed), printed


def test_auto_alignment_falls_back_and_restores_the_session(monkeypatch) -> None:
    """auto is calibrate's default: a plan that cannot be aligned keeps its plain quantization (with the reason),
    and an error while the choice is scored leaves the session on the setting it had."""
    import workbench.calib.alignment_choice as alignment_choice
    from workbench.calib.alignment_choice import choose_grid_alignment
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=16, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    ranges, plan = session.ranges("mse"), session.default_plan("int8")

    def refuses(quantized):
        raise ValueError("border map of an unknown shape")

    with monkeypatch.context() as patch:
        patch.setattr(session, "_aligned", refuses)
        choice = choose_grid_alignment(session, ranges, plan, 32)
    assert not choice.choice and not session.align_grids and choice.noise is None
    assert "aligning this plan failed (border map of an unknown shape)" in choice.note
    # equal noise both ways: the task metric is scored, and here the evaluation fails
    monkeypatch.setattr(alignment_choice, "relative_output_noise", lambda session, protos: [1e-4, 1e-4])
    monkeypatch.setattr(session, "evaluate", lambda *args, **kwargs: (_ for _ in ()).throw(OSError("disk full")))
    session.align_grids = True
    with pytest.raises(OSError, match="disk full"):
        choose_grid_alignment(session, ranges, plan, 32)
    assert session.align_grids is True


def test_auto_alignment_leaves_a_plan_without_int8_alone_and_says_why() -> None:
    """An all-FP8 plan (calibrate --format fp8 takes auto by default too) has no INT8 grid to align: nothing is
    quantized twice and the note gives that reason."""
    from workbench.calib.alignment_choice import choose_grid_alignment
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    session = CalibrationSession(entry.load(), data=list(entry.calibration_batches(limit=16)), entry=entry)
    session.align_grids = True
    choice = choose_grid_alignment(session, session.ranges("mse"), session.default_plan("fp8"), 32)
    assert not choice.choice and not session.align_grids and choice.evaluations == 0
    assert choice.note == "grid alignment off: the plan has no INT8 tensor (alignment moves INT8 grids only)"
