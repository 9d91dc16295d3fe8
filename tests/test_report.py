"""The main job: `workbench demo` runs the quickstart flow headless and writes a self-contained out/report.html."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.demo import DemoResult
from workbench.flow import QuickstartRun, StageStatus
from workbench.precision import Variant
from workbench.report import SECTION_IDS, diagnose


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    from workbench.demo import run_demo

    out = tmp_path_factory.mktemp("demo-out")
    # digits-cnn keeps this fast; the default model's whole journey runs in the quickstart notebook tests
    return run_demo("digits-cnn", out, timing_window_s=0.1)


def test_demo_writes_a_self_contained_report(demo: DemoResult) -> None:
    report = demo.report
    out = report.parent
    assert report == Path(demo.run.config.out_dir) / "report.html"
    html = report.read_text(encoding="utf-8")
    # offline: plotly.js is inline, no script or stylesheet comes from the network
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r"<link[^>]+href=[\"']https?:", html)
    assert "Plotly.newPlot" in html and len(html) > 3_000_000  # the bundled plotly.js is ~4.6 MB
    for section in SECTION_IDS:
        assert f'<section id="{section}">' in html, section
    for heading in (
        "Cleaning waterfall",
        "Fusion view",
        "Per-layer diff",
        "Task-metric table",
        "Mixed-precision search (Pareto view)",
        "Timing results",
        "Bottleneck diagnosis",
        "Exported bundle",
    ):
        assert f"<h2>{heading}</h2>" in html
    for figure in ("fig-cleaning", "fig-fusion", "fig-layer-diff", "fig-metrics", "fig-pareto", "fig-timing"):
        assert f'id="{figure}"' in html, figure
    # timing rows carry their spread: throughput's range over the windows, p99's bootstrap 95% interval
    assert "samples/s [95% CI]" in html and "p99 ms [95% CI]" in html and "sub-windows" in html
    for result in demo.run.timing.results:
        low, high = result.throughput_ci_per_s
        assert f"{result.throughput_per_s:.0f} [{low:.0f}, {high:.0f}]" in html
    # no blank table cell anywhere; every ranked layer has a cause, or a "no known cause: ..." the data supports
    assert not re.search(r"<td>\s*</td>", html)
    causes = re.findall(r"<td>([^<]*)</td></tr>", html.split('<section id="layer-diff">')[1].split("</section>")[0])
    assert len(causes) == len(demo.run.layer_diff.diff.ranking(5)) and all(causes), causes
    assert all(c.startswith(("range ", "its ", "no known cause: ")) for c in causes), causes
    # a next-steps section whose commands name this run's files (tests/test_printed_commands.py runs them)
    steps = html.split('<section id="next-steps">')[1].split("</section>")[0]
    assert f"workbench verify {demo.run.bundle.path.resolve()}" in steps and "workbench diff digits-cnn" in steps
    assert "no NVIDIA GPU" in html  # says plainly where numbers come from
    assert "<h3>Engine lint</h3>" in html and '<g class="layer"' in html  # fusion view: the static engine drawing
    run = demo.run  # the typed run, not its JSON
    not_done = {name: stage for name, stage in run.stages.items() if not stage.ok}
    assert not_done.pop("build_fp8_all").status is StageStatus.OFF  # FP8 is built only when asked for
    assert set(not_done) <= {"build_mixed"}, not_done  # no mixed engine when the search's pick is all-INT8
    assert all(stage.status is StageStatus.NOT_APPLICABLE for stage in not_done.values()), not_done
    assert not demo.failed
    # the report, the run and the bundle name the same engine
    chosen = run.selection
    assert run.bundle is not None and run.bundle.path.parent == out / "export"
    assert run.bundle.manifest["accuracy"]["variant"] == str(chosen.variant)
    assert f"{chosen.variant} engine" in html and f"<b>Engine choice: {chosen.variant}</b>" in html
    assert QuickstartRun.from_json(json.loads((out / "run.json").read_text())).chosen_variant is chosen.variant


def test_diagnosis_cites_numbers_from_the_run(tmp_path: Path) -> None:
    from workbench.flow import QuickstartConfig, run_quickstart

    run = run_quickstart(
        QuickstartConfig(
            model="digits-cnn", out_dir=str(tmp_path), timing_window_s=0.1, calibration_samples=64, diff_samples=16
        )
    )
    verdicts = {v.topic: v for v in diagnose(run)}
    assert {"busy with", "more streams", "batching", "accuracy", "task metric", "fusion"} <= set(verdicts)
    for verdict in verdicts.values():
        assert re.search(r"\d", verdict.text), verdict.text
        assert verdict.evidence
    chosen = run.timing.chosen
    one_stream = run.timing.find(1, chosen.batch)
    ratio = chosen.throughput_per_s / one_stream.throughput_per_s
    assert verdicts["more streams"].evidence["ratio"] == pytest.approx(ratio)
    assert f"({ratio:.2f}x)" in verdicts["more streams"].text
    assert ("more streams help" in verdicts["more streams"].text) == (ratio >= 1.15)
    if ratio < 1.15:  # the reason given must agree with the measured busy fraction (no "already 41% busy")
        busy = one_stream.busy_fraction
        text = verdicts["more streams"].text
        assert (f"already {busy:.0%} busy" in text) == (busy >= 0.8)
        assert (f"only {busy:.0%} busy" in text) == (busy < 0.8)
    worst = run.layer_diff.diff.ranking(1)[0]
    assert (
        worst.node in verdicts["accuracy"].text
        and f"{worst.noise_added:.2g} relative noise" in verdicts["accuracy"].text
    )
    fp32 = run.metrics.row(Variant.FP32)
    assert f"FP32 {fp32.value:.4f}" in verdicts["task metric"].text


def test_report_says_why_a_stage_is_missing(tmp_path: Path) -> None:
    from dataclasses import replace

    from workbench.flow import QuickstartConfig, QuickstartSession, StageResult, run_stage
    from workbench.report import render_report

    session = QuickstartSession(QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path), timing_window_s=0.1))
    workspace = session.prepare()
    run = session.run
    for name in ("clean", "build_fp32", "fusion"):
        run = run_stage(run, name, workspace)
    failed = StageResult(
        "layer_diff", "Per-layer INT8 diff", StageStatus.FAILED, reason="calibration data: no such folder x/"
    )
    run = replace(run, stages={**run.stages, "layer_diff": failed})
    html = render_report(run)
    assert "calibration data: no such folder x/" in html
    assert 'id="fig-fusion"' in html and 'id="fig-layer-diff"' not in html


def test_demo_cli_rejects_bad_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--out", str(tmp_path), "--streams", "0"]) == 2
    assert "streams=0 is out of range" in capsys.readouterr().err


def test_demo_says_a_long_stage_is_still_running_and_what_it_does_now(capsys: pytest.CaptureFixture[str]) -> None:
    """The session's events drive the beat: a stage starts it, a nested task's step (the calibrate stage's GPTQ, the
    search's evaluation) is the line's detail with its own count, never the stage's number, and the end stops it."""
    import time

    from workbench.demo import StillRunning
    from workbench.progress import ProgressEvent

    heartbeat = StillRunning(every_s=0.1)
    heartbeat(ProgressEvent("stage", "Calibrate INT8 ranges", 4, 14, name="calibrate"))
    time.sleep(0.35)
    plain = capsys.readouterr().out.splitlines()
    heartbeat(ProgressEvent("calibration", "GPTQ rounding of conv1.weight", 3, 54))
    time.sleep(0.35)
    detailed = capsys.readouterr().out.splitlines()
    heartbeat(ProgressEvent("stage", "finished", 14, 14, name="done", kind="finish"))
    assert len(plain) >= 2 and len(detailed) >= 2, (plain, detailed)
    assert all(re.fullmatch(r"\[ 5/14\] \.\.\.  Calibrate INT8 ranges: still running, \d+ s", line) for line in plain)
    assert all(
        re.fullmatch(
            r"\[ 5/14\] \.\.\.  Calibrate INT8 ranges: still running, \d+ s "
            r"\(calibration 3 of 54, 6%: GPTQ rounding of conv1\.weight\)",
            line,
        )
        for line in detailed
    ), detailed
    time.sleep(0.25)  # stopped means silent
    assert capsys.readouterr().out == ""


def test_report_and_quickstart_panel_show_requested_vs_actual_precision(demo: DemoResult, tmp_path: Path) -> None:
    """Every built engine's requested-vs-actual check is in the report (fusion section and diagnosis) and the
    quickstart panel's Fusion tab: the demo's engines run as requested; a real FP8 build of a ConvTranspose (no FP8
    kernel) added as the run's FP8 engine shows its mismatch, node, layer and reason."""
    from dataclasses import replace

    from test_precision_check import _fp8_model

    from workbench.engine.build import BuildOptions, engine_from_onnx
    from workbench.flow.artifacts import VariantBuild
    from workbench.model import load_onnx
    from workbench.report import precision_checks_html, render_report

    run = demo.run
    html = demo.report.read_text(encoding="utf-8")
    fusion = html.split('<section id="fusion">')[1].split("</section>")[0]
    assert "<h3>Requested vs actual precision</h3>" in fusion
    for variant, build in run.builds.items():
        assert f"<li>{variant}: {build.engine.precision_check.summary()}</li>" in fusion
    verdict = next(v for v in diagnose(run) if v.topic == "requested vs actual precision")
    assert verdict.level == "ok" and "run at the precision requested" in verdict.text

    onnx_path = _fp8_model(tmp_path / "deconv.onnx", "ConvTranspose")
    engine = engine_from_onnx(
        load_onnx(onnx_path, check=False), tmp_path / "deconv.engine", BuildOptions(progress=False)
    )
    (mismatch,) = engine.precision_check.mismatches
    broken = replace(run, fp8_all_build=VariantBuild(Variant.FP8_ALL, onnx_path, engine))
    table = precision_checks_html(broken)
    assert f"<li>fp8-all: {engine.precision_check.summary()}</li>" in table and "1 mismatch(es)" in table
    row = f"<td>fp8-all</td><td>target</td><td>ConvTranspose</td><td>fp8</td><td>fp32</td><td>{mismatch.layer}</td>"
    assert row in table and "no FP8 kernel for this ConvTranspose" in table and not re.search(r"<td>\s*</td>", table)
    verdict = next(v for v in diagnose(broken) if v.topic == "requested vs actual precision")
    assert verdict.level == "warning" and "1 node(s) run at another precision than requested" in verdict.text
    assert row in render_report(broken)

    from workbench.flow import QuickstartSession
    from workbench.ui.quickstart_panel import QuickstartPanel

    session = QuickstartSession(run.config)
    session.run = broken
    panel = QuickstartPanel(session=session, background=False)
    panel.refresh()
    assert "Requested vs actual precision" in panel.fusion_view.value and row in panel.fusion_view.value
