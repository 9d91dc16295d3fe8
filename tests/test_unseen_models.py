"""Models the zoo has never seen, through the real stage CLIs (TensorRT-RTX builder, ONNX Runtime, forked CLI).

Each model comes from ``tests/fixtures/unseen_models.py`` (onnx.helper, seeded weights). A model either goes through
clean -> build -> fusions -> explore export -> calibrate -> diff -> export -> verify, or is refused with exit 2, an
``error:`` line saying what is unsupported and what would work, no traceback and no file written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli_runner import run_cli_forked, snapshot
from tests.fixtures.unseen_models import MODELS, write_model
from workbench.flow import StageStatus
from workbench.precision.variant import Variant

# dims the ONNX leaves symbolic besides the batch: the build needs a profile for them
SHAPES = {
    "tokens-float": ["ids:1x4,2x8,4x16", "feats:1x4x16,2x8x16,4x16x16"],
    "dynamic-hw": ["x:1x3x8x8,2x3x16x16,4x3x32x32"],
    "transformer": ["x:1x4x16,2x8x16,4x16x16"],
    "audio-conv1d": ["wave:1x1x64,2x1x256,4x1x1024"],
}
# the whole journey passes on these (deep-chain, 2,001 nodes, is covered by the slower bench only)
JOURNEY = [
    "conv-opset13",
    "conv-opset21",
    "multi-io",
    "tokens-float",
    "dynamic-hw",
    "control-flow",
    "passthrough",
    "external-data",
    "odd-names",
    "transformer",
    "audio-conv1d",
    "conv3d",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("unseen-models")
    for name in MODELS:
        write_model(name, folder)
    return folder


def _ok(run, what: str) -> None:
    assert run.returncode == 0, f"{what}: exit {run.returncode}\n{run.stdout[-1500:]}\n{run.stderr[-3000:]}"
    assert "Traceback" not in run.stderr, run.stderr


def _refused(run, *needles: str) -> str:
    assert run.returncode == 2, f"exit {run.returncode}\n{run.stdout[-1000:]}\n{run.stderr[-2000:]}"
    assert "Traceback" not in run.stderr, run.stderr
    line = next(line for line in run.stderr.splitlines() if "error:" in line)
    for needle in needles:
        assert needle in line, line
    return line


def test_fixtures_are_valid_onnx_that_ort_runs(models: Path) -> None:
    import numpy as np
    import onnx

    from workbench.ort import cpu_predict

    for name in MODELS:
        path = models / f"{name}.onnx"
        proto = onnx.load(path)
        if name == "custom-op":
            continue
        onnx.checker.check_model(proto, full_check=True)
        feed = {}
        for value in proto.graph.input:
            dims = [d.dim_value or 2 for d in value.type.tensor_type.shape.dim]
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            feed[value.name] = np.ones(dims, dtype=dtype)
        outputs = cpu_predict(path, what=name)(feed)
        assert len(outputs) == len(proto.graph.output)
    assert (models / "external-data.onnx.data").is_file()


@pytest.mark.parametrize("name", JOURNEY)
def test_journey_through_the_stage_clis(models: Path, tmp_path: Path, name: str) -> None:
    model = str(models / f"{name}.onnx")
    shapes = [arg for spec in SHAPES.get(name, []) for arg in ("--shapes", spec)]
    out = tmp_path
    _ok(run_cli_forked(["clean", model, "-o", str(out / "c.onnx"), "--report", str(out / "c.json")], out), "clean")
    report = json.loads((out / "c.json").read_text())
    assert report["nodes_after"] <= report["nodes_before"]
    cleaned = str(out / "c.onnx")
    _ok(run_cli_forked(["build", cleaned, "-o", str(out / "e.engine"), "--no-progress", *shapes], out), "build")
    records = json.loads((out / "e.layers.json").read_text())
    assert records["engine_layers"], "the layer map is empty"
    _ok(run_cli_forked(["fusions", str(out / "e.layers.json"), "--html", str(out / "f.html")], out), "fusions")
    assert (out / "f.html").stat().st_size > 1000
    _ok(run_cli_forked(["explore", str(out / "e.engine"), "--export", str(out / "x")], out), "explore")
    assert any((out / "x").iterdir())
    calib = ["calibrate", cleaned, "--data", "random", "-o", str(out / "q.onnx"), "--no-progress"]
    _ok(run_cli_forked([*calib, "--max-batches", "2"], out), "calibrate")
    diff = ["diff", cleaned, str(out / "q.onnx"), "--data", "random", "-o", str(out / "d.json"), "--no-progress"]
    _ok(run_cli_forked([*diff, "--max-batches", "1"], out), "diff")
    assert json.loads((out / "d.json").read_text())["tensors"]
    _ok(run_cli_forked(["export", str(out / "e.engine"), "-o", str(out / "bundle")], out), "export")
    _ok(run_cli_forked(["verify", str(out / "bundle")], out), "verify")


@pytest.mark.parametrize("name", ["multi-io", "control-flow", "passthrough"])
def test_fp16_build_of_models_that_broke_it(models: Path, tmp_path: Path, name: str) -> None:
    """multi-io: an FP16 graph output also read by an FP16 node got a second Cast of the same name; control-flow: a
    Loop body's outer-scope weight was dropped and an If branch read an FP16 tensor; passthrough: the parser renames
    an input that is also an output to '__x', so the profile missed it."""
    engine = tmp_path / "e.engine"
    run = run_cli_forked(
        ["build", str(models / f"{name}.onnx"), "-o", str(engine), "--precision", "fp16", "--no-progress"], tmp_path
    )
    _ok(run, "fp16 build")
    layers = json.loads(engine.with_suffix(".layers.json").read_text())["engine_layers"]
    precisions = {layer.get("precision") for layer in layers}
    assert "fp16" in precisions or name == "passthrough", precisions


def test_autocast_keeps_nodes_a_subgraph_reads_in_fp32(models: Path) -> None:
    from workbench.model import load_onnx
    from workbench.precision import PrecisionPlan, apply_precision_plan

    result = apply_precision_plan(load_onnx(models / "control-flow.onnx"), PrecisionPlan(default="fp16"))
    assert result.kept_fp32.get("pre_matmul") == "read-by-subgraph"
    assert "wl" in {init.name for init in result.proto.graph.initializer}  # the Loop body's weight is kept


def test_custom_op_is_refused_naming_the_op(models: Path, tmp_path: Path) -> None:
    model = str(models / "custom-op.onnx")
    before = snapshot(tmp_path)
    line = _refused(run_cli_forked(["clean", model, "-o", str(tmp_path / "c.onnx")], tmp_path), "custom op", "MyRelu")
    assert "standard ONNX ops" in line
    _refused(
        run_cli_forked(["build", model, "-o", str(tmp_path / "e.engine"), "--no-progress"], tmp_path),
        "'my_relu' (MyRelu)",
        "plugin",
    )
    # the FP16 build parses a rewrite in a temporary folder, gone when the error is read: the user's file is named
    fp16 = ["build", model, "-o", str(tmp_path / "h.engine"), "--precision", "fp16", "--no-progress"]
    line = _refused(run_cli_forked(fp16, tmp_path), "'my_relu' (MyRelu)", f"{model} (as rewritten for the fp16 build)")
    assert "workbench-build-" not in line
    calib = ["calibrate", model, "--data", "random", "-o", str(tmp_path / "q.onnx"), "--no-progress"]
    _refused(run_cli_forked(calib, tmp_path), "custom op")
    assert snapshot(tmp_path) == before


def test_int8_on_a_model_with_nothing_to_quantize_is_refused(models: Path, tmp_path: Path) -> None:
    argv = ["calibrate", str(models / "no-math.onnx"), "--data", "random", "-o", str(tmp_path / "q.onnx")]
    _refused(run_cli_forked([*argv, "--cache", str(tmp_path / "c.json")], tmp_path), "nothing to quantize", "Sigmoid")
    assert not any(tmp_path.iterdir())


def test_int8_on_an_fp16_model_is_refused(models: Path, tmp_path: Path) -> None:
    argv = ["calibrate", str(models / "fp16.onnx"), "--data", "random", "-o", str(tmp_path / "q.onnx")]
    _refused(run_cli_forked(argv, tmp_path), "float16", "FP32 model")
    assert not any(tmp_path.iterdir())


def _quickstart(model: Path, out: Path, **settings):
    from workbench.flow import QuickstartConfig, run_quickstart

    small = dict(calibration_samples=16, diff_samples=8, evaluation_samples=16, search_budget=1)
    small |= dict(timing_window_s=0.05, sweep=False)
    return run_quickstart(QuickstartConfig(model=str(model), out_dir=str(out), **(small | settings)))


def test_demo_runs_the_whole_journey_on_an_onnx_file(models: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["demo", "--model", str(models / "multi-io.onnx"), "--out", str(out), "--eval-samples", "16"]
    run = run_cli_forked([*argv, "--calibration-samples", "16", "--search-budget", "1"], tmp_path, timeout=240)
    _ok(run, "demo")
    assert "seeded RANDOM inputs" in run.stdout
    stages = json.loads((out / "run.json").read_text())["stages"]
    # every stage done; the mixed build does not apply when the search's pick is the all-INT8 plan
    assert stages.pop("build_fp8_all")["status"] == "off"  # FP8 is built only when asked for
    assert {stage["status"] for stage in stages.values()} <= {"done", "not_applicable"}, stages
    assert {name for name, stage in stages.items() if stage["status"] != "done"} <= {"build_mixed"}, stages
    metrics = json.loads((out / "run.json").read_text())["metrics"]
    assert {row["n_samples"] for row in metrics["rows"]} == {16}
    assert "RANDOM" in metrics["how"]
    assert "RANDOM" in (out / "report.html").read_text()
    assert list((out / "export").iterdir())


def test_quickstart_skips_int8_with_the_reason_when_nothing_to_quantize(models: Path, tmp_path: Path) -> None:
    run = _quickstart(models / "no-math.onnx", tmp_path)
    calibrate = run.stage("calibrate")
    assert calibrate.status is StageStatus.NOT_APPLICABLE and "nothing to quantize" in calibrate.reason, calibrate
    assert run.calibration is None and run.mixed_engine is None
    for name in ("build_int8_all", "layer_diff", "build_mixed", "search"):  # the chain says why
        assert run.stage(name).status is StageStatus.NOT_APPLICABLE, run.stage(name)
        assert "does not apply" in run.stage(name).reason, run.stage(name)
    assert not [s for s in run.stages.values() if s.status is StageStatus.FAILED], run.stages
    assert run.selection is not None and run.selection.variant in ("fp32", "fp16")
    assert run.bundle is not None


def test_quickstart_on_an_fp16_model_skips_int8(models: Path, tmp_path: Path) -> None:
    run = _quickstart(models / "fp16.onnx", tmp_path, export=False)
    calibrate = run.stage("calibrate")
    assert calibrate.status is StageStatus.NOT_APPLICABLE and "float16" in calibrate.reason, calibrate
    assert not [s for s in run.stages.values() if s.status is StageStatus.FAILED], run.stages


def test_quickstart_mixed_keeps_some_int8_and_token_inputs_time(models: Path, tmp_path: Path) -> None:
    """tokens-float has 2 INT8 nodes: a 'mixed' plan without INT8 is no mixed engine (its build failed once); the
    timing executor's token ids (1..99) were out of its 50-row embedding table."""
    run = _quickstart(models / "tokens-float.onnx", tmp_path, export=False, search_budget=4, max_metric_drop=0.0)
    assert run.stage("search").ok, run.stage("search")
    pick = run.mixed_search.result.chosen
    if run.mixed_build is not None:  # built only from a pick that keeps some INT8 and some nodes wider
        assert pick.fallback_nodes and pick.int8_math_nodes > 0
        assert run.mixed_build.plan is not None and run.mixed_build.engine.summary()["by_precision"].get("int8", 0)
    else:
        assert run.stage("build_mixed").status is StageStatus.NOT_APPLICABLE, run.stage("build_mixed")
    assert run.stage("timing").ok, run.stage("timing")


def test_an_engine_with_a_bad_verdict_is_blocked_from_export_and_the_printed_command_exports_it(
    models: Path, tmp_path: Path
) -> None:
    """A tolerance no INT8 engine meets (max_metric_drop 1e-6 on the output cosine, a resolved loss): asked for INT8,
    the engine's verdict is bad, so the export stage is blocked with the reason and two ways to export anyway,
    both of which work."""
    import shlex

    from workbench.export.bundle import verify_bundle
    from workbench.flow import QuickstartConfig, QuickstartSession

    small = dict(calibration_samples=16, diff_samples=8, evaluation_samples=16, timing_window_s=0.05, sweep=False)
    out = tmp_path / "out"
    config = QuickstartConfig(
        model=str(models / "multi-io.onnx"),
        out_dir=str(out),
        precision="int8",
        max_metric_drop=1e-6,
        search_budget=0,
        **small,
    )
    session = QuickstartSession(config)
    run = session.run_all()
    assert run.selection.choice.level == "bad", run.selection.choice
    export = run.stage("export")
    assert export.status is StageStatus.BLOCKED and run.bundle is None, export
    assert (
        "verdict is bad" in export.reason and "export_bad=True" in export.reason and "--export-anyway" in export.reason
    )
    assert not (out / "export").exists()  # nothing was written
    words = shlex.split(export.reason.split("export this engine as built: ", 1)[1])
    assert words[:2] == ["workbench", "export"] and "--calibration-cache" in words
    _ok(run_cli_forked(words[1:], tmp_path, timeout=240), "the printed export command")
    printed = Path(words[words.index("-o") + 1])
    assert verify_bundle(printed).ok and (printed / "calibration.cache").is_file()
    # asked to export anyway: only the export stage re-runs, and it ships the same engine
    again = session.update(export_bad=True)
    assert again.stage("export").ok and again.stages["select"] is run.stages["select"], again.stage("export")
    manifest = json.loads((again.bundle.path / "manifest.json").read_text())
    assert manifest["accuracy"]["choice_level"] == "bad" and manifest["accuracy"]["variant"] == "int8-all"
    # the same from the command line: demo --export-anyway exports the engine whose verdict is bad
    cli_out = tmp_path / "cli"
    argv = ["demo", "--model", str(models / "multi-io.onnx"), "--out", str(cli_out), "--precision", "int8"]
    argv += ["--max-metric-drop", "1e-6", "--search-budget", "0", "--calibration-samples", "16", "--eval-samples", "16"]
    cli = run_cli_forked([*argv, "--export-anyway", "--confidence", "off"], tmp_path, timeout=240)
    _ok(cli, "demo --export-anyway")
    assert "int8-all (bad)" in cli.stdout and "exported to" in cli.stdout, cli.stdout[-2000:]
    # --confidence off: the point estimate decides the rule (the config records 0, and the rule says so)
    assert json.loads((cli_out / "run.json").read_text())["config"]["confidence"] == 0.0
    assert "by its point estimate" in cli.stdout
    assert [p for p in (cli_out / "export").iterdir() if (p / "manifest.json").is_file()]


def test_demo_exits_2_when_a_stage_failed(models: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["demo", "--model", str(models / "custom-op.onnx"), "--out", str(out), "--eval-samples", "8"]
    line = _refused(run_cli_forked(argv, tmp_path, timeout=240), "stage(s) failed", "clean", "build_fp32")
    assert "report" in line
    assert (out / "report.html").is_file()


def test_demo_refuses_a_model_with_a_fixed_batch_other_than_1_before_any_work(tmp_path: Path) -> None:
    """A batch of 1 that the graph hard-codes runs at batch 1 (below); a fixed batch of 4 is refused."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "fixed4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [numpy_helper.from_array(np.ones((8, 3), np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "fixed4.onnx")
    out = tmp_path / "out"
    line = _refused(
        run_cli_forked(["demo", "--model", str(tmp_path / "fixed4.onnx"), "--out", str(out)], tmp_path),
        "no dynamic batch axis",
    )
    assert "only a fixed batch of 1" in line
    assert not out.exists()


@pytest.mark.parametrize("name", ["no-math", "passthrough"])
def test_quickstart_panel_on_an_onnx_file_draws_and_says_what_did_not_apply(
    models: Path, tmp_path: Path, name: str
) -> None:
    """The notebook panel (real widgets, plotly figures) on a file: no warning for stages that cannot apply; the
    figures and tables fill from what ran."""
    from workbench.flow import QuickstartConfig
    from workbench.ui.quickstart_panel import QuickstartPanel

    config = QuickstartConfig(
        model=str(models / f"{name}.onnx"),
        out_dir=str(tmp_path),
        calibration_samples=16,
        diff_samples=8,
        evaluation_samples=16,
        search_budget=1,
        timing_window_s=0.05,
        sweep=False,
        export=False,
    )
    panel = QuickstartPanel(config, background=False)
    panel.run()
    assert panel.status.kind == "ok", panel.status.text
    assert "not applicable to this model" in panel.status.text
    assert panel.session.run.selection is not None
    assert '<g class="layer"' in panel.fusion_view.value
    assert "worst_output_agreement_vs_fp32" in panel.metrics_table.value
    assert panel.timing_figure.data


def _batch1_conv(path: Path, *, hard_coded_reshape: bool) -> Path:
    """Conv -> Relu -> GlobalAveragePool -> Flatten (or Reshape to [1, 8]) -> Gemm, exported with a fixed batch of 1
    (what torch.onnx.export gives without dynamic_axes)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.2).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.2).astype(np.float32), "G"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"),
    ]
    if hard_coded_reshape:
        weights.append(numpy_helper.from_array(np.array([1, 8], np.int64), "shape"))
        nodes.append(helper.make_node("Reshape", ["g", "shape"], ["f"], name="reshape"))
    else:
        nodes.append(helper.make_node("Flatten", ["g"], ["f"], name="flatten"))
    nodes.append(helper.make_node("Gemm", ["f", "G"], ["y"], transB=1, name="fc"))
    graph = helper.make_graph(
        nodes,
        "batch1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_fixed_batch_1_model_gets_a_proven_batch_axis_and_runs_the_journey(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = _batch1_conv(tmp_path / "static.onnx", hard_coded_reshape=False)
    original = model.read_bytes()
    entry = OnnxFileEntry(model)
    assert entry.profiles["x"] == ((1, 3, 16, 16), (8, 3, 16, 16), (64, 3, 16, 16))
    assert any("made symbolic" in note and "3 random samples" in note for note in entry.notes), entry.notes
    assert entry.onnx_path() != model and entry.onnx_path().is_file()
    assert model.read_bytes() == original  # the user's file is never rewritten
    assert entry.name == "static"  # outputs are named after the user's file, not the cached copy
    copied = tmp_path / "materialized.onnx"
    entry._materialize(copied)  # the zoo protocol's self-contained copy: the model this entry runs
    from workbench.ort import cpu_predict

    feed = {"x": np.random.default_rng(3).standard_normal((2, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_array_equal(cpu_predict(copied)(feed)["y"], cpu_predict(entry.onnx_path())(feed)["y"])
    run = _quickstart(model, tmp_path / "out", export=False)
    for name in ("clean", "build_fp32", "calibrate", "timing"):
        assert run.stage(name).ok, run.stage(name)


def test_a_batch_1_model_that_hard_codes_its_batch_runs_the_journey_at_batch_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Reshape to [1, 8] (what detectors do) fails the batch-3 proof: instead of a refusal, the journey runs at batch
    1 (one sample per calibration and evaluation run, a batch-1 engine profile, streams instead of batching) and the
    run says so and why."""
    from workbench.report.diagnosis import diagnose
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = _batch1_conv(tmp_path / "hard.onnx", hard_coded_reshape=True)
    entry = OnnxFileEntry(model)
    assert entry.max_batch == 1 and entry.onnx_path() == model  # the file itself runs, no unproven copy
    assert entry.input_profiles()["x"] == ((1, 3, 16, 16),) * 3
    assert [feed["x"].shape[0] for feed in entry.calibration_batches(limit=5, batch_size=8)] == [1] * 5
    (note,) = [note for note in entry.notes if "hard-codes" in note]
    assert "reshape" in note.lower() and "batch of 3" in note and "streams instead of batching" in note
    run = _quickstart(model, tmp_path / "out", export=False, streams=2, batch=8)
    # every stage done (the mixed build does not apply when the search's pick is all-INT8)
    skipped = ("export", "build_mixed", "build_fp8_all")  # FP8 is built only when asked for
    assert not [s for name, s in run.stages.items() if not s.ok and name not in skipped], run.stages
    assert run.stage("build_mixed").status in (StageStatus.DONE, StageStatus.NOT_APPLICABLE), run.stage("build_mixed")
    assert "hard-codes" in run.metrics.how and {row.n_samples for row in run.metrics.rows} == {16}
    assert run.timing.fixed_batch == 1 and {result.batch for result in run.timing.results} == {1}
    assert "streams do the batching" in run.stage("timing").summary
    (batching,) = [verdict for verdict in diagnose(run) if verdict.topic == "batching"]
    assert "hard-codes a batch of 1" in batching.text
    assert not list((tmp_path / "cache").rglob("*.onnx"))  # no unproven batch copy left behind


def _npz_batches(folder: Path, batches: list[dict]) -> Path:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    for index, feed in enumerate(batches):
        np.savez(folder / f"batch_{index:03d}.npz", **feed)
    return folder


def test_your_own_data_calibrates_and_evaluates_your_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--data DIR: the first half of the samples calibrates, the second half is the evaluation set; the run says so."""
    import numpy as np

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = _batch1_conv(tmp_path / "static.onnx", hard_coded_reshape=False)
    rng = np.random.default_rng(5)
    data = _npz_batches(
        tmp_path / "data", [{"x": rng.uniform(0, 1, (8, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    )
    run = _quickstart(model, tmp_path / "out", export=False, data=str(data))
    assert run.stage("calibrate").ok, run.stage("calibrate")
    assert f"first 12 of 24 samples from {data}" in run.metrics.how
    assert {row.n_samples for row in run.metrics.rows} == {12}
    assert "RANDOM" not in run.metrics.how


@pytest.mark.parametrize(
    "feed, needle",
    [
        ({"image": np.zeros((4, 3, 16, 16), np.float32)}, "do not match the model's inputs"),
        ({"x": np.zeros((4, 3, 8, 8), np.float32)}, "has shape (4, 3, 8, 8)"),
        ({"x": np.full((4, 3, 16, 16), np.nan, np.float32)}, "NaN or infinite"),
        ({"x": np.zeros((4, 3, 16, 16), np.int64)}, "is int64, the model takes float32"),
    ],
    ids=["wrong-key", "wrong-shape", "nan", "wrong-dtype"],
)
def test_bad_data_for_your_file_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, feed: dict, needle: str
) -> None:
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = _batch1_conv(tmp_path / "static.onnx", hard_coded_reshape=False)
    data = _npz_batches(tmp_path / "data", [feed])
    out = tmp_path / "out"
    _refused(run_cli_forked(["demo", "--model", str(model), "--data", str(data), "--out", str(out)], tmp_path), needle)
    assert not out.exists()


def test_a_folder_of_images_for_your_file_is_refused_naming_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's "holds no .npz files" never ran (a zip over the empty file list stopped first), so a folder of
    PNGs gave "0 sample(s)": now the refusal says what the folder holds and what is expected."""
    import cv2

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = _batch1_conv(tmp_path / "static.onnx", hard_coded_reshape=False)
    images = tmp_path / "images"
    images.mkdir()
    for index in range(3):
        cv2.imwrite(str(images / f"im{index}.png"), np.full((16, 16, 3), 40 * index, np.uint8))
    out = tmp_path / "out"
    argv = ["demo", "--model", str(model), "--data", str(images), "--out", str(out)]
    line = _refused(run_cli_forked(argv, tmp_path), "holds no .npz files (it holds 3 .png file(s))")
    assert "arrays keyed by model input name" in line
    assert not out.exists()


def test_data_for_a_zoo_model_or_without_a_model_is_refused(tmp_path: Path) -> None:
    from workbench.errors import WorkbenchError
    from workbench.flow import QuickstartConfig, run_quickstart

    with pytest.raises(WorkbenchError, match="brings its own data set"):
        run_quickstart(QuickstartConfig(model="digits-cnn", data=str(tmp_path), out_dir=str(tmp_path / "out")))
    _refused(run_cli_forked(["demo", "--data", str(tmp_path), "--out", str(tmp_path / "o")], tmp_path), "--model")


def test_changing_the_data_reruns_the_whole_journey_on_the_new_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The panel's session.update(data=...) must not keep metrics measured on the old samples."""
    from workbench.flow import QuickstartConfig, QuickstartSession

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    model = _batch1_conv(tmp_path / "static.onnx", hard_coded_reshape=False)
    rng = np.random.default_rng(9)
    data = _npz_batches(tmp_path / "data", [{"x": rng.uniform(0, 1, (4, 3, 16, 16)).astype(np.float32)}])
    small = dict(calibration_samples=8, diff_samples=8, evaluation_samples=8, search_budget=0, export=False)
    session = QuickstartSession(QuickstartConfig(model=str(model), out_dir=str(tmp_path / "out"), **small))
    first = session.run_all()
    assert "RANDOM" in first.metrics.how and {row.n_samples for row in first.metrics.rows} == {8}
    second = session.update(data=str(data))
    assert f"first 2 of 4 samples from {data}" in second.metrics.how
    assert {row.n_samples for row in second.metrics.rows} == {2}


def test_a_fixed_input_next_to_batched_ones_is_refused_as_a_parameter_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x[N, 4] * s[1, 4]: s is a run-time parameter, not a batch of 1, so no batch copy is made of it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from workbench.errors import WorkbenchError
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["m"]), helper.make_node("MatMul", ["m", "W"], ["y"])],
        "scaled",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "scaled.onnx")
    with pytest.raises(
        WorkbenchError, match=r"\['s'\] have no dynamic batch axis.*other input\(s\) \['x'\] are batched"
    ):
        OnnxFileEntry(tmp_path / "scaled.onnx")
    assert not (tmp_path / "cache").exists()


def test_clean_goes_past_an_initializer_nothing_reads(models: Path, tmp_path: Path) -> None:
    """dead-ends: ONNX Runtime drops an initializer no node reads before it takes the arrays clean hands it from
    memory, then refused the array ("Failed to find existing initializer"): clean could not even check the input."""
    import onnx

    out = tmp_path / "c.onnx"
    run = run_cli_forked(
        ["clean", str(models / "dead-ends.onnx"), "-o", str(out), "--report", str(tmp_path / "r.json")], tmp_path
    )
    _ok(run, "clean")
    cleaned = onnx.load(out)
    assert "unused_w" not in {init.name for init in cleaned.graph.initializer}
    assert [i.name for i in cleaned.graph.input] == ["x", "unused_input"]  # the interface is the user's: kept
    assert not {"Dropout", "Identity"} & {node.op_type for node in cleaned.graph.node}


def test_weights_stored_in_fp16_are_calibrated_as_the_fp32_they_compute_in(models: Path, tmp_path: Path) -> None:
    """fp16-weights keeps its weights in FP16 and casts them to FP32 before use: it computes in FP32, so calibrate
    takes it (it refused it as "computes in float16"), folds each Cast into the FP32 weight it gives and quantizes
    that per channel; the INT8 build runs every quantized node in INT8."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    written = tmp_path / "q.onnx"
    run = run_cli_forked(
        ["calibrate", str(models / "fp16-weights.onnx"), "--data", "random", "-o", str(written), "--no-progress"],
        tmp_path,
    )
    _ok(run, "calibrate")
    proto = onnx.load(written)
    assert "Cast" not in {node.op_type for node in proto.graph.node}
    inits = {init.name: init for init in proto.graph.initializer}
    conv = next(node for node in proto.graph.node if node.op_type == "Conv")
    weight_dq = next(node for node in proto.graph.node if node.output[0] == conv.input[1])
    scale = numpy_helper.to_array(inits[weight_dq.input[1]])
    stored = numpy_helper.to_array(onnx.load(models / "fp16-weights.onnx").graph.initializer[0]).astype(np.float32)
    np.testing.assert_allclose(scale, np.abs(stored).reshape(8, -1).max(axis=1) / 127, rtol=1e-6)
    build = ["build", str(written), "-o", str(tmp_path / "q.engine"), "--strict-precision", "--no-progress"]
    _ok(run_cli_forked(build, tmp_path), "strict INT8 build")


def test_a_quantized_model_is_refused_by_calibrate_and_the_quickstart_builds_it_as_it_is(
    models: Path, tmp_path: Path
) -> None:
    """prequantized carries its own INT8 Q/DQ (a file another tool quantized): calibrate says so before reading any
    data and writes nothing; the quickstart marks calibration not applicable instead of failing (it exited 2),
    and its FP32 engine shows the model's own INT8 layers."""
    cli = tmp_path / "cli"
    cli.mkdir()
    argv = ["calibrate", str(models / "prequantized.onnx"), "--data", "random", "-o", str(cli / "q.onnx")]
    line = _refused(run_cli_forked(argv, cli), "already quantized", "3 of its 3 Conv/Gemm/MatMul")
    assert "FP32 model" in line
    assert not any(cli.iterdir())
    run = _quickstart(models / "prequantized.onnx", tmp_path / "qs", export=False)
    calibrate = run.stage("calibrate")
    assert calibrate.status is StageStatus.NOT_APPLICABLE and "already quantized" in calibrate.reason, calibrate
    assert not [s for s in run.stages.values() if s.status is StageStatus.FAILED], run.stages
    assert run.fp32_engine is not None and run.fp32_engine.summary()["by_precision"].get("int8", 0) > 0


def test_shared_tied_and_left_hand_weights_are_all_quantized_and_run_as_asked(models: Path, tmp_path: Path) -> None:
    """shared-weights: one weight read by two Convs gets one Q/DQ pair, the W·x MatMul's left weight is quantized per
    output row (it was left in float, so TensorRT-RTX ran that MatMul in FP32), the Constant-node Gemm weight per
    channel; the strict INT8 build passes."""
    import onnx

    written = tmp_path / "q.onnx"
    calibrate = ["calibrate", str(models / "shared-weights.onnx"), "--data", "random", "-o", str(written)]
    _ok(run_cli_forked([*calibrate, "--no-progress"], tmp_path), "calibrate")
    proto = onnx.load(written)
    dq_of = {node.output[0]: node for node in proto.graph.node if node.op_type == "DequantizeLinear"}
    nodes = {node.name: node for node in proto.graph.node}
    assert nodes["conv_a"].input[1] == nodes["conv_b_same_weight"].input[1] in dq_of
    left = dq_of[nodes["left_weight_matmul"].input[0]]
    assert left.input[0].startswith("wl") and next(a.i for a in left.attribute if a.name == "axis") == 0
    assert nodes["gemm_const_weight"].input[1] in dq_of
    build = ["build", str(written), "-o", str(tmp_path / "q.engine"), "--strict-precision", "--no-progress"]
    run = run_cli_forked(build, tmp_path)
    _ok(run, "strict INT8 build")
    assert "all run as requested" in run.stdout


def test_a_search_that_misses_its_target_on_all_int8_does_not_say_no_node_needs_to_stay_wider(
    models: Path, tmp_path: Path
) -> None:
    """Its pick is the all-INT8 plan because nothing it scored did better, not because INT8 is good enough: the
    mixed build stage said "no node needs to stay wider" under a search line saying the target was NOT met (a Swin
    exported from Hugging Face, 0.9883 for a 0.99 target)."""
    run = _quickstart(models / "multi-io.onnx", tmp_path, export=False, max_metric_drop=1e-6, search_budget=1)
    result = run.mixed_search.result
    assert run.search_pick is Variant.INT8_ALL and not result.met, result.stop_reason
    reason = run.stage("build_mixed").reason
    assert run.stage("build_mixed").status is StageStatus.NOT_APPLICABLE, reason
    assert "the target is NOT met" in reason and "no node needs to stay wider" not in reason, reason


def test_an_activation_too_small_for_a_float32_scale_gets_the_smallest_normal_one(tmp_path: Path) -> None:
    """A randomly initialised Hugging Face MobileViT has activations of ~1e-40: amax / 127 underflowed to a scale of
    0, which TensorRT's parser refuses ("Scale coefficients must all be positive") and the per-layer diff divided by
    (a traceback). Here x * 1e-37 feeds a Conv: amax ~3e-37 is a normal float32 on every CPU (a denormal input
    could be flushed to zero by one that sets FTZ/DAZ, and then the tensor is dead, not tiny), amax / 127 is below
    the normal range; its scale is float32's smallest normal number, the INT8 and FP8 models build, the diff runs."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Mul", ["x", "tiny"], ["t"], name="shrink"),
        helper.make_node("Conv", ["t", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    inits = [
        numpy_helper.from_array(np.array(1e-37, np.float32), "tiny"),
        numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    for fmt in ("int8", "fp8"):
        written = tmp_path / f"q.{fmt}.onnx"
        calibrate = ["calibrate", str(path), "--data", "random", "--format", fmt, "-o", str(written), "--no-progress"]
        _ok(run_cli_forked(calibrate, tmp_path), f"calibrate {fmt}")
        proto = onnx.load(written)
        inits_by_name = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
        quantize = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "t")
        assert inits_by_name[quantize.input[1]] == np.finfo(np.float32).tiny
        build = ["build", str(written), "-o", str(tmp_path / f"{fmt}.engine"), "--precision", fmt, "--no-progress"]
        _ok(run_cli_forked(build, tmp_path), f"build {fmt}")
    diff = ["diff", str(path), str(tmp_path / "q.int8.onnx"), "--data", "random", "-o", str(tmp_path / "d.json")]
    _ok(run_cli_forked([*diff, "--no-progress"], tmp_path), "diff")


def _waveform_conv(path: Path, kernel: int) -> Path:
    """A Conv1d over a waveform of symbolic length: a feature extractor whose kernel spans ``kernel`` samples."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = (np.random.default_rng(0).standard_normal((4, 1, kernel)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["wave", "w"], ["y"], name="extractor", strides=[kernel // 4])],
        "waveform",
        [helper.make_tensor_value_info("wave", TensorProto.FLOAT, ["N", 1, "samples"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "frames"])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_symbolic_dimensions_take_the_first_size_the_model_runs_at(tmp_path: Path) -> None:
    """A waveform model whose kernel spans 40 samples cannot run at the 16 the quickstart gave every symbolic
    dimension (a Hugging Face wav2vec2 failed every stage with four different messages): the entry takes the first
    of 16, 64, 256, ... at which ONNX Runtime runs it and says so; a model that runs at none keeps 16 with a note
    (its stages fail with ONNX Runtime's reason and the report shows what ran: tests/test_seams_numbers.py)."""
    from workbench.zoo.onnx_file import OnnxFileEntry

    entry = OnnxFileEntry(_waveform_conv(tmp_path / "kernel40.onnx", 40))
    assert entry.profiles["wave"] == ((1, 1, 64), (8, 1, 64), (64, 1, 64))
    assert any("set to 64" in note and "did not run the model at 16" in note for note in entry.notes), entry.notes
    feed, _ = entry._sample("evaluation", 0)
    assert feed["wave"].shape == (1, 64)
    never = OnnxFileEntry(_waveform_conv(tmp_path / "kernel20000.onnx", 20000))  # its stages fail, the report says
    assert never.profiles["wave"][0] == (1, 1, 16)
    assert any("none of 16, 64, 256, 1024, 4096, 16384" in note and "--data DIR" in note for note in never.notes)


def test_build_names_every_input_that_needs_shapes_at_once(models: Path, tmp_path: Path) -> None:
    """tokens-float's ids and features share a symbolic sequence: one refusal names both inputs and the flags for
    both (it named the first only, so a text model with ids and a mask took two failed builds), nothing written."""
    argv = ["build", str(models / "tokens-float.onnx"), "-o", str(tmp_path / "e.engine"), "--no-progress"]
    line = _refused(run_cli_forked(argv, tmp_path), "inputs ['ids', 'feats'] have dynamic non-batch dimensions")
    assert "--shapes ids:MIN,OPT,MAX --shapes feats:MIN,OPT,MAX" in line
    assert not list(tmp_path.glob("e.*"))


def test_models_onnx_runtime_quantized_are_refused_saying_why(models: Path, tmp_path: Path) -> None:
    """onnxruntime.quantization's own outputs: QOperator format (QLinearConv, QLinearMatMul) and quantize_dynamic
    (ConvInteger, MatMulInteger, DynamicQuantizeLinear), and its QDQ default (asymmetric uint8 activations). build
    said the parser's "Assertion failed: shiftIsAllZeros(zeroPoint)" or "false"; calibrate said "nothing to
    quantize". Each is now refused saying what the model is and what TensorRT takes, nothing written."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": np.full((1, 3, 16, 16), 0.1 * i, np.float32)} for i in range(4)])

        def get_next(self):
            return next(self.batches, None)

    fp32 = models / "conv-opset13.onnx"
    quantize_static(str(fp32), str(tmp_path / "qop.onnx"), Reader(), quant_format=QuantFormat.QOperator)
    quantize_dynamic(str(fp32), str(tmp_path / "dyn.onnx"))
    quantize_static(str(fp32), str(tmp_path / "qdq_uint8.onnx"), Reader(), quant_format=QuantFormat.QDQ)
    out = tmp_path / "out"
    out.mkdir()
    for name, needle in [
        ("qop", "ONNX Runtime's operator format (QLinearConv x2"),
        ("dyn", "ONNX Runtime's operator format (DynamicQuantizeLinear"),
        ("qdq_uint8", "zero point must be a constant 0 (TensorRT quantizes symmetrically)"),
    ]:
        build = ["build", str(tmp_path / f"{name}.onnx"), "-o", str(out / f"{name}.engine"), "--no-progress"]
        _refused(run_cli_forked(build, out), needle)
    for name in ("qop", "dyn"):
        calibrate = ["calibrate", str(tmp_path / f"{name}.onnx"), "--data", "random", "-o", str(out / "q.onnx")]
        _refused(run_cli_forked(calibrate, out), "already quantized, in ONNX Runtime's operator format")
    assert not any(out.iterdir())


def test_an_op_the_parser_rejects_without_a_reason_is_named_with_its_error_code(models: Path, tmp_path: Path) -> None:
    """TensorRT's parser rejects SplitToSequence with the text "false": the refusal says "unsupported node" (its
    error code) for each node, not "false"."""
    argv = ["build", str(models / "sequence-ops.onnx"), "-o", str(tmp_path / "e.engine"), "--no-progress"]
    line = _refused(run_cli_forked(argv, tmp_path), "node 'split' (SplitToSequence): unsupported node")
    assert ": false" not in line and "node 'concat' (ConcatFromSequence): unsupported node" in line
