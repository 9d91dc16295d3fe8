"""The quickstart journey: flow stages, the panel's widgets, and both notebooks executed headless with nbclient.

Everything runs for real: TensorRT-RTX builds the engines, ONNX Runtime measures the metrics and the CPU timing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from notebook_runner import execute_notebook

from workbench.errors import WorkbenchError
from workbench.flow import (
    STAGE_BY_NAME,
    STAGE_NAMES,
    QuickstartConfig,
    QuickstartRun,
    QuickstartSession,
    StageStatus,
    run_stage,
)
from workbench.flow.workspace import Workspace
from workbench.precision import Variant
from workbench.progress import ProgressEvent

REPO = Path(__file__).resolve().parents[1]
FAST = dict(model="digits-cnn", timing_window_s=0.1, calibration_samples=64, diff_samples=16)


def test_config_rejects_bad_settings_with_readable_errors() -> None:
    with pytest.raises(WorkbenchError, match="precision 'int4' is not offered.*auto / fp32 / fp16 / int8 / fp8"):
        QuickstartConfig(precision="int4")
    with pytest.raises(WorkbenchError, match="streams=0 is out of range.*1..64"):
        QuickstartConfig(streams=0)
    with pytest.raises(WorkbenchError, match="calibration method 'kl'"):
        QuickstartConfig(calibration_method="kl")


def test_stage_dependencies_and_failures(tmp_path: Path) -> None:
    # nothing ran yet: any change runs every stage; a bad value is refused before anything changes
    session = QuickstartSession(QuickstartConfig(out_dir=str(tmp_path), **FAST))
    plan = session.plan_update({"streams": 3})
    assert plan.whole_run and plan.stages == STAGE_NAMES and plan.changed == {"streams"}
    with pytest.raises(WorkbenchError, match="streams=0 is out of range"):
        session.plan_update({"streams": 0})
    assert session.plan_update({"streams": 2}).stages == ()  # the value in use: nothing to do
    # a stage whose input stage never completed is blocked, says which one it needed, and leaves no artifact
    config = QuickstartConfig(out_dir=str(tmp_path), **FAST)
    workspace = Workspace(config)
    run = run_stage(QuickstartRun(config), "fusion", workspace)
    assert run.stage("fusion").status is StageStatus.BLOCKED and "build_fp32" in run.stage("fusion").reason
    assert run.fusion is None
    # a stage that fails says why and clears the artifact an earlier run of it left (nothing stale stays)
    run = run_stage(run, "build_fp32", workspace)
    run = run_stage(run, "fusion", workspace)
    assert run.fusion is not None and run.fusion.engine_layers == run.fp32_engine.layer_count
    (tmp_path / "blocked" / "digits-cnn.fp32.engine").mkdir(parents=True)  # a folder where the engine goes
    broken = Workspace(QuickstartConfig(out_dir=str(tmp_path / "blocked"), **FAST))
    run = run_stage(run, "build_fp32", broken)
    assert run.stage("build_fp32").status is StageStatus.FAILED and run.fp32_engine is None, run.stage("build_fp32")


def test_session_reruns_only_affected_stages(tmp_path: Path) -> None:
    session = QuickstartSession(QuickstartConfig(out_dir=str(tmp_path), **FAST))
    run = session.run_all()
    # every stage done; only the mixed build may not apply (when the search's pick is the all-INT8 plan), and the
    # FP8 build is off unless precision fp8 asks for it
    not_done = {n: run.stage(n) for n in STAGE_NAMES if not run.stage(n).ok}
    assert run.stage("build_fp8_all").status is StageStatus.OFF
    not_done.pop("build_fp8_all")
    assert set(not_done) <= {"build_mixed"}, not_done
    assert (run.mixed_build is not None) == (run.search_pick is Variant.INT8_MIXED), run.stage("build_mixed")
    if not_done:
        assert not_done["build_mixed"].status is StageStatus.NOT_APPLICABLE
        assert "all-INT8 plan" in not_done["build_mixed"].reason
    # every engine comes from a build stage, one VariantBuild per variant
    assert set(run.builds) >= {Variant.FP32, Variant.FP16, Variant.INT8_ALL}
    assert run.selection.build is run.builds[run.selection.variant]
    # the whole-run rule and the first stage a setting affects, in one place
    assert session.plan_update({"streams": 3}).stages[0] == "timing"
    # another precision among the built ones is only a new choice: select, timing, export (an answer at once) ...
    assert session.plan_update({"precision": "fp16"}).stages == ("select", "timing", "export")
    # ... while asking for FP8 builds it first, then measures it; never the search
    assert session.plan_update({"precision": "fp8"}).stages[0] == "build_fp8_all"
    assert "search" not in session.plan_update({"precision": "fp8"}).stages
    assert session.plan_update({"calibration_method": "max", "batch": 4}).stages[0] == "calibrate"
    assert session.plan_update({"data": ""}).stages == ()  # unchanged
    for whole in ({"model": "ocr-cls"}, {"out_dir": str(tmp_path / "other")}):
        plan = session.plan_update(whole)
        assert plan.whole_run and plan.stages == STAGE_NAMES, plan
    before = dict(run.stages)
    run = session.update(streams=3)
    for name in STAGE_NAMES[: STAGE_NAMES.index("timing")]:
        assert run.stages[name] is before[name], name  # untouched
    assert run.stages["timing"] is not before["timing"]
    assert run.timing.chosen.streams == 3
    assert run.stage("export").ok and (run.bundle.path / "manifest.json").is_file()
    assert run.bundle.path.parent == tmp_path / "export"  # a new folder per export: the first one stays
    assert len([p for p in (tmp_path / "export").iterdir() if (p / "manifest.json").is_file()]) == 2
    # the INT8 engine really holds INT8 layers and ships its calibration cache
    int8 = run.builds[Variant.INT8_ALL]
    assert int8.engine.summary()["by_precision"].get("int8", 0) > 0 and int8.calibration_cache.is_file()
    # every engine carries the layer map made at build time; the run record round-trips through JSON
    assert run.fp32_engine.layer_map.stats().engine_layers == run.fp32_engine.layer_count
    again = QuickstartRun.from_json(run.to_json())
    assert again.builds[Variant.INT8_ALL].engine.engine_sha256 == int8.engine.engine_sha256
    assert again.selection.variant is run.selection.variant and again.stages["timing"].status is StageStatus.DONE
    assert again.timing.chosen.throughput_per_s == run.timing.chosen.throughput_per_s


def test_quickstart_panel_widgets_drive_figures_and_tables(tmp_path: Path) -> None:
    from workbench.ui.quickstart_panel import QuickstartPanel

    panel = QuickstartPanel(QuickstartConfig(out_dir=str(tmp_path), precision="int8", **FAST), background=False)
    assert panel.refresh_count == 0 and not panel.session.run.stages  # nothing runs or displays on construction
    shown: list[str] = []  # every text the progress label showed during the run
    panel.progress.label.observe(lambda change: shown.append(change["new"]), names="value")
    panel.run()
    assert panel.status.kind == "ok", panel.status.text
    # the search's evaluations show as the stage's detail ("... · evaluation 1 of 8, 12%: ...")
    assert any(t.startswith("Mixed-precision search") and " \u00b7 evaluation 1 of " in t for t in shown), shown
    assert "chosen 2 stream(s) x batch 8" in panel.timing_figure.layout.title.text
    assert _streams_timed(panel, "batch 8") == {"1 stream", "2 streams"}
    timing_table = panel.timing_table.value

    panel.streams.value = 5
    assert panel.status.kind == "ok", panel.status.text
    assert "chosen 5 stream(s) x batch 8" in panel.timing_figure.layout.title.text
    assert _streams_timed(panel, "batch 8") == {"1 stream", "5 streams"}
    assert panel.timing_table.value != timing_table
    assert panel.session.run.timing.chosen.streams == 5

    metrics_table = panel.metrics_table.value
    fusion_view = panel.fusion_view.value
    int8_variant = panel.session.run.selection.variant  # all-INT8, or the mixed plan where it measured better
    assert f"{int8_variant}.engine</h4>" in fusion_view and f"&#9654; {int8_variant}" in metrics_table
    engine = panel.session.run.selection.engine  # the tab draws that engine: one named box per layer
    assert fusion_view.count('<g class="layer"') == len(engine.layer_map.layers)
    assert "Engine choice" in metrics_table and "Wilson 95%" in metrics_table  # the rule, and intervals
    panel.precision.value = "fp16"
    assert panel.status.kind == "ok", panel.status.text
    assert "&#9654; fp16" in panel.metrics_table.value and panel.metrics_table.value != metrics_table
    assert "fp16.engine</h4>" in panel.fusion_view.value
    assert panel.session.run.selection.engine.engine_path.name.endswith("fp16.engine")

    panel.batch.value = 4
    assert "chosen 5 stream(s) x batch 4" in panel.timing_figure.layout.title.text
    assert _streams_timed(panel, "batch 4") == {"1 stream", "5 streams"}

    diff_before = [trace.y for trace in panel.diff_figure.data]
    panel.calibration_method.value = "max"
    assert panel.status.kind == "ok", panel.status.text
    assert panel.session.run.calibration.ranges.method == "max"
    assert [trace.y for trace in panel.diff_figure.data] != diff_before  # other ranges, other per-layer errors

    # a bad setting is refused with the CLI's message, not clamped: the widget goes back, no result changes
    before = panel.session.run
    panel.streams.value = 99
    assert panel.status.kind == "error"
    assert panel.status.text == "Error: streams=99 is out of range. Expected: 1..64."
    assert "Traceback" not in panel.status.widget.value
    assert panel.streams.value == 5 and panel.session.run is before and not panel.stale.is_stale
    panel.max_metric_drop.value = 2.0
    assert panel.status.text == "Error: max_metric_drop=2.0 is out of range. Expected: 0..1."
    assert panel.max_metric_drop.value == 0.01 and panel.session.run is before

    # the allowed drop and the confidence re-run the search and the choice, and the table says what decided
    assert "within 0.01 of FP32 at 95%" in panel.metrics_table.value
    panel.max_metric_drop.value = 0.05
    assert panel.status.kind == "ok", panel.status.text
    assert panel.session.config.max_metric_drop == 0.05 and panel.session.run.mixed_search.result.target == (
        pytest.approx(panel.session.run.mixed_search.result.fp32_metric - 0.05)
    )
    assert "within 0.05 of FP32 at 95%" in panel.metrics_table.value
    panel.confidence.value = 0.0  # off: the point estimate decides, in the search and in the rule
    assert panel.status.kind == "ok", panel.status.text
    assert panel.session.config.decision_confidence is None
    assert "within 0.05 of FP32</th>" in panel.metrics_table.value and "loss at most" not in panel.metrics_table.value
    assert [label for label, _ in panel.confidence.options][:2] == ["95%", "99%"]


def _streams_timed(panel, series: str) -> set[str]:
    """The stream counts the timing figure shows on one curve (one curve per batch size)."""
    return {text for trace in panel.timing_figure.data if trace.name == series for text in trace.text}


def _execute(notebook: str, workdir: Path, model: str | None = None) -> list[str]:
    shutil.copy(REPO / "notebooks" / notebook, workdir / notebook)
    return [execute_notebook(notebook, workdir=workdir, model=model).text]


def test_quickstart_notebook_executes_headless(tmp_path: Path) -> None:
    """On digits-cnn (the fastest zoo model): test_browser runs the notebook as shipped (ocr-cls) in JupyterLab."""
    text = "\n".join(_execute("00_quickstart.ipynb", tmp_path, model="digits-cnn"))
    assert "digits-cnn" in text and "ocr-cls" not in text
    stage_lines = {line.split(":")[0].split(" s  ", 1)[-1]: line for line in text.splitlines() if " s  " in line}
    for name in STAGE_NAMES:  # the notebook prints one line per stage; every stage completed (FP8: only when asked)
        title = STAGE_BY_NAME[name].title
        line = stage_lines[title]
        if name == "build_mixed" and line.startswith("not_applicable"):  # mse ranges: all-INT8 may meet the target
            assert "the all-INT8 engine is the mixed-precision answer" in line, line
            continue
        assert line.startswith("off" if name == "build_fp8_all" else "done"), line
    report = tmp_path / "out" / "quickstart" / "report.html"
    assert report.is_file() and report.stat().st_size > 1_000_000
    assert any((p / "manifest.json").is_file() for p in (tmp_path / "out" / "quickstart" / "export").iterdir())


def test_export_notebook_executes_headless(tmp_path: Path) -> None:
    """On digits-cnn, as test_browser drives it (the export panel on ocr-cls, the notebook's default model, is
    tested in test_mixed_front)."""
    text = "\n".join(_execute("05_export.ipynb", tmp_path, model="digits-cnn"))
    assert "digits-cnn" in text and "ocr-cls" not in text
    assert "'precision': 'fp32'" in text and "'precision': 'fp16'" in text and "'precision': 'int8'" in text
    assert "recommended:" in text
    bundles = [p for p in (tmp_path / "out" / "export" / "export").iterdir() if (p / "manifest.json").is_file()]
    assert len(bundles) == 3 and all((p / "model.engine").is_file() for p in bundles)  # three exports, three bundles
    plans = [p for p in bundles if "-plan" in p.name]  # one of them a plan picked from the search's Pareto front
    assert len(plans) == 1 and "(search's pick)" in text and "[" in text.split(plans[0].name, 1)[1]


def test_shared_controls() -> None:
    from workbench.ui import controls
    from workbench.ui.progress import ProgressAdapter

    assert controls.streams_input(3).value == 3
    assert controls.precision_dropdown("fp16").value == "fp16"
    assert controls.calibration_method_dropdown("mse").value == "mse"
    assert controls.model_picker("ocr-cls").value == "ocr-cls"
    assert controls.batch_dropdown(4, options=(1, 4)).options == (1, 4)
    assert controls.max_drop_input(0.03).value == 0.03
    assert controls.confidence_dropdown(0.0).label == "off (point estimate)"
    odd = controls.confidence_dropdown(0.8)  # a level set in the config is offered as it is, not snapped to a choice
    assert odd.value == 0.8 and odd.label == "80.0%"
    status = controls.StatusArea()
    status.error(WorkbenchError("x.onnx: no such file.", expected="an ONNX path"))
    assert status.kind == "error" and status.text == "Error: x.onnx: no such file. Expected: an ONNX path."
    try:
        {}["missing"]
    except KeyError as error:
        status.error(error)
    assert status.text.startswith("Unexpected error KeyError: 'missing' (at test_quickstart.py:")
    progress = ProgressAdapter()
    progress(ProgressEvent("stage", "Calibrate INT8 ranges", 3, 11, name="calibrate"))  # a flow stage
    assert (progress.bar.value, progress.bar.max, progress.message) == (3, 11, "Calibrate INT8 ranges")
    assert progress.label.value == "Calibrate INT8 ranges"
    assert progress.clock.running and progress.clock.elapsed >= 0  # the page counts the seconds on from here
    assert "workbench-busy" in progress.widget._dom_classes  # the page pins a busy bar scrolled out of view
    # a nested task (the search's evaluations inside a stage) is the step's detail; the bar stays on the stages
    progress(ProgressEvent("evaluation", "plan 2", 3, 8))
    assert progress.label.value == "Calibrate INT8 ranges \u00b7 evaluation 3 of 8, 38%: plan 2"
    assert (progress.bar.value, progress.bar.max) == (3, 11)
    progress(ProgressEvent("stage", "Build the INT8 engine", 4, 11))
    assert progress.label.value == "Build the INT8 engine"  # the next stage: its detail starts empty
    progress.done()
    assert not progress.clock.running and progress.label.value.startswith("done (")  # the seconds it took
    assert "workbench-busy" not in progress.widget._dom_classes
    # a TensorRT build on its own (the engine panel): its top-level phases move the bar
    progress.start("building")
    assert progress(ProgressEvent("build", "Building engine", 0, 4, kind="start")) is True
    progress(ProgressEvent("build", "Building engine", 1))
    assert (progress.bar.value, progress.bar.max) == (2, 4)
    progress.cancel()
    assert progress(ProgressEvent("build", "Building engine", 2)) is False  # Cancel stops the work at its next step
