"""Calibration on real zoo models: TensorRT-RTX builds Int8 convolutions, diffs are right, fallback helps, CLI works."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from workbench.calib.data import IterableSource
from workbench.calib.diff import diff_models
from workbench.calib.methods import fake_quantize
from workbench.calib.session import CalibrationSession
from workbench.cli import main as cli_main


@pytest.fixture(scope="module")
def digits():
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    return entry, CalibrationSession(entry.load(), entry=entry, progress=False, max_batches=4)


@pytest.fixture(scope="module")
def rec():
    from workbench.zoo import get_entry

    entry = get_entry("ocr-rec")
    return entry, CalibrationSession(entry.load(), entry=entry, progress=False, max_batches=4)


def test_qdq_model_passes_lint_and_builds_with_int8_convolutions(digits, tmp_path) -> None:
    from workbench.clean.qdq_lint import lint_qdq
    from workbench.engine.build import BuildOptions, engine_from_onnx

    entry, session = digits
    quantized = session.quantize(session.ranges("entropy"))
    assert lint_qdq(quantized.proto) == []
    path = quantized.save(tmp_path / "digits.qdq.onnx")
    artifact = engine_from_onnx(
        path, tmp_path / "digits.engine", BuildOptions(shapes=entry.input_profiles(), progress=False)
    )
    int8_conv_layers = [
        layer
        for layer in artifact.engine_layers.layers
        if any(node in {"/0/Conv", "/3/Conv", "/6/Conv", "/9/Conv", "/12/Conv"} for node in layer.onnx_nodes)
        and any(t.datatype == "Int8" for t in layer.inputs)
    ]
    convs_covered = {node for layer in int8_conv_layers for node in layer.onnx_nodes if node.endswith("/Conv")}
    assert convs_covered == {"/0/Conv", "/3/Conv", "/6/Conv", "/9/Conv", "/12/Conv"}
    assert artifact.engine_path.stat().st_size > 0


def test_qdq_models_of_other_zoo_models_pass_lint(rec) -> None:
    from workbench.clean.qdq_lint import lint_qdq

    _, session = rec
    quantized = session.quantize(session.ranges("percentile"))
    assert len(quantized.placement.int8_nodes) > 40
    assert [f.to_json() for f in lint_qdq(quantized.proto) if f.severity == "error"] == []


def test_diff_metrics_match_a_direct_computation() -> None:
    from test_calib_core import _conv_model  # the same small graph the rule tests use

    from workbench.calib.qdq import insert_qdq
    from workbench.calib.stats import collect_statistics

    model = _conv_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"  # dynamic batch, so micro-batches can split
    rng = np.random.default_rng(7)
    feeds = [{"x": rng.normal(0, 1, (2, 3, 8, 8)).astype(np.float32)} for _ in range(3)]
    ranges = collect_statistics(model, IterableSource(feeds[:1]), progress=False).ranges("percentile", percentile=99.0)
    quantized = insert_qdq(model, ranges.amax)
    diff = diff_models(model, quantized.proto, feeds, progress=False, micro_batch=1)
    whole = diff_models(model, quantized.proto, feeds, progress=False, micro_batch=None)
    auto = diff_models(model, quantized.proto, feeds, progress=False)  # sized from the first sample
    # local SQNR and clipping of the graph input, computed by hand
    x = np.concatenate([f["x"] for f in feeds])
    scale = quantized.scales["x"]
    err = x - fake_quantize(x, scale)
    row = diff.row("x")
    assert row.sqnr_db_local == pytest.approx(
        10 * np.log10((x.astype(np.float64) ** 2).sum() / (err.astype(np.float64) ** 2).sum()), abs=1e-3
    )
    steps = np.rint(x / np.float32(scale))
    assert row.clipped_fraction == pytest.approx(float(((steps > 127) | (steps < -128)).mean()))  # int8 holds -128..127
    assert row.cause in ("range too tight (clipping)", "ok")
    # accumulated SQNR, cosine and max abs error of the output, from two plain ORT runs
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = np.concatenate(
        [ort.InferenceSession(model.SerializeToString(), options).run(None, f)[0] for f in feeds]
    ).astype(np.float64)
    test = np.concatenate(
        [ort.InferenceSession(quantized.proto.SerializeToString(), options).run(None, f)[0] for f in feeds]
    ).astype(np.float64)
    out = diff.row("c4")
    assert out.sqnr_db_accumulated == pytest.approx(
        10 * np.log10((reference**2).sum() / ((reference - test) ** 2).sum()), abs=1e-3
    )
    assert out.cosine == pytest.approx(
        (reference * test).sum() / np.sqrt((reference**2).sum() * (test**2).sum()), abs=1e-6
    )
    assert out.max_abs_err == pytest.approx(np.abs(reference - test).max(), rel=1e-5)
    # running sums make micro-batching invisible
    for a, b, c in zip(diff.tensors, whole.tensors, auto.tensors):
        assert a.name == b.name == c.name
        for field in ("sqnr_db_accumulated", "sqnr_db_local", "clipped_fraction", "max_abs_err"):
            assert getattr(a, field) == pytest.approx(getattr(b, field), abs=1e-4) == getattr(c, field)
    document = diff.to_json()
    assert {"name", "node", "sqnr_db_local", "sqnr_db_accumulated", "cosine", "max_abs_err", "clipped_fraction"} <= set(
        document["tensors"][0]
    )
    # weights appear with their own per-channel local SQNR
    assert any(r.kind == "weight" and r.sqnr_db_local > 30 for r in diff.tensors)


def test_fallback_of_the_worst_layers_improves_ocr_rec(rec) -> None:
    _, session = rec
    ranges = session.ranges("max")  # max ranges hurt PP-OCRv4 rec: a real, visible INT8 drop
    int8 = session.quantize(ranges)
    fp32_metric = session.evaluate(limit=48).value
    int8_metric = session.evaluate(int8, limit=48).value
    assert int8_metric < fp32_metric - 0.05
    diff = session.diff(int8, max_batches=1)
    ranked = session.rank_int8_nodes(diff)
    plan, mixed = session.fall_back_worst(8, ranges=ranges, diff=diff)
    int8_nodes = session.int8_nodes()
    assert set(plan.overrides) == set(ranked[:8])  # INT8 nodes and residual Adds with a quantized skip
    assert len(mixed.placement.int8_nodes) == len(int8_nodes) - len(set(ranked[:8]) & set(int8_nodes))
    mixed_metric = session.evaluate(mixed, limit=48).value
    assert mixed_metric > int8_metric + 0.05


def test_cli_calibrate_with_npz_folder_cache_and_diff(digits, tmp_path, capsys) -> None:
    entry, _ = digits
    data = tmp_path / "calibration"
    data.mkdir()
    for index, feed in enumerate(entry.calibration_batches(limit=32)):
        np.savez(data / f"batch_{index:03d}.npz", **feed)
    model = str(entry.onnx_path())
    out, cache, diff_path = tmp_path / "q.onnx", tmp_path / "digits.calib.json", tmp_path / "diff.json"
    assert (
        cli_main(
            [
                "calibrate",
                model,
                "--data",
                str(data),
                "--method",
                "entropy",
                "-o",
                str(out),
                "--cache",
                str(cache),
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "statistics:" in printed and "4 batches / 32 samples" in printed and out.is_file()
    cached = json.loads(cache.read_text())
    assert cached["method"] == "entropy" and cached["model_sha256"] == entry.load().sha256 and cached["data_digest"]
    assert all(v["amax"] > 0 and v["histogram_digest"] for v in cached["tensors"].values())
    # second run: method switched from the cached histograms, no statistics gathered, one layer kept in FP32
    out2 = tmp_path / "q2.onnx"
    assert (
        cli_main(
            [
                "calibrate",
                model,
                "--method",
                "mse",
                "-o",
                str(out2),
                "--cache",
                str(cache),
                "--keep",
                "/0/Conv",
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "no statistics gathered" in printed and "4 INT8 nodes" not in printed and "5 INT8 nodes" in printed
    assert cli_main(["diff", model, str(out2), "--data", str(data), "-o", str(diff_path), "--no-progress"]) == 0
    document = json.loads(diff_path.read_text())
    names = {row["name"] for row in document["tensors"]}
    assert "/0/Conv_output_0" in names and "image" not in names  # /0/Conv kept in FP32: its input has no Q/DQ
    assert document["task_metric"] is None and document["num_samples"] == 32
    # a zoo name gets the labelled task metric
    assert (
        cli_main(
            [
                "diff",
                "digits-cnn",
                str(out2),
                "--data",
                "zoo",
                "--max-batches",
                "1",
                "-o",
                str(diff_path),
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads(diff_path.read_text())["task_metric"]["name"] == entry.metric_name
    # user errors: one line, exit 2
    assert cli_main(["calibrate", model, "-o", str(out)]) == 2
    assert "no calibration data" in capsys.readouterr().err
    assert cli_main(["calibrate", model, "--data", str(tmp_path / "missing"), "-o", str(out)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_cli_entry_point_runs_as_a_process(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workbench", "calibrate", "--help"], capture_output=True, text=True, check=True
    )
    assert "--target-drop" in result.stdout and "--keep" in result.stdout
    assert "--fallback-worst" not in result.stdout  # removed: one way to ask for a target


def test_image_folder_uses_the_zoo_preprocessing(tmp_path) -> None:
    from workbench.calib.data import FolderSource, resolve_source
    from workbench.zoo import get_entry

    entry = get_entry("ocr-cls")
    entry.write_calibration_images(tmp_path / "ocr-cls" / "images", limit=12)
    source = resolve_source(str(tmp_path / "ocr-cls"), entry=entry, batch_size=8)  # calibration/README.md layout
    assert isinstance(source, FolderSource) and source.kind == "images" and len(source) == 2
    ours = list(source.batches())
    expected = list(entry.calibration_batches(limit=12, batch_size=8))
    assert [b["x"].shape[0] for b in ours] == [8, 4]
    for a, b in zip(ours, expected):
        np.testing.assert_allclose(a["x"], b["x"], atol=1e-6)
    with pytest.raises(Exception, match="no preprocessing"):
        resolve_source(str(tmp_path / "ocr-cls" / "images"))  # images without a zoo model


def test_sensitivity_ranking_bypasses_one_node_at_a_time(tmp_path) -> None:
    import onnx
    from test_calib_core import _conv_model

    from workbench.model import load_onnx

    model = _conv_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, str(tmp_path / "conv.onnx"))
    rng = np.random.default_rng(11)
    feeds = [{"x": rng.normal(0, 1, (4, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
    session = CalibrationSession(load_onnx(tmp_path / "conv.onnx", check=False), data=feeds, progress=False)
    ranges = session.ranges("percentile", percentile=95.0)  # tight ranges: every layer clips a little
    quantized = session.quantize(ranges)
    ranked = session.rank_by_sensitivity(quantized, max_batches=2)
    assert set(ranked) == {"conv1", "conv2", "conv3", "conv4", "residual"}
    scores = session.last_sensitivity
    assert scores[ranked[0]] >= scores[ranked[-1]] and scores[ranked[0]] > 0

    # the score is what falling back that node alone removes from the output noise
    def output_noise(proto) -> float:
        from workbench.calib.session import ort_predict

        reference, test = ort_predict(session.prepared), ort_predict(proto)
        num = den = 0.0
        for feed in feeds:
            r, t = reference(feed)["c4"].astype(np.float64), test(feed)["c4"].astype(np.float64)
            num, den = num + ((r - t) ** 2).sum(), den + (r**2).sum()
        return num / den

    alone = session.quantize(ranges, session.fallback_plan([ranked[0]]))
    assert output_noise(quantized.proto) - output_noise(alone.proto) == pytest.approx(scores[ranked[0]], rel=0.05)
