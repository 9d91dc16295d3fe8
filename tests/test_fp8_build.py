"""FP8 from the command line to the engine: `calibrate --format fp8`, a real TensorRT-RTX build for FP8 targets, the
layer map's FP8 layers, the export's FP8 requirement, and the refusals (an older target, fp8 asked of an INT8 model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli_forked

from workbench.engine.build import EngineArtifact


@pytest.fixture(scope="module")
def fp8_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    folder = tmp_path_factory.mktemp("fp8")
    qdq = folder / "digits.fp8.onnx"
    calibrate = run_cli_forked(
        ["calibrate", "digits-cnn", "--format", "fp8", "--max-batches", "2", "-o", str(qdq), "--no-progress"],
        cwd=folder,
    )
    assert calibrate.returncode == 0, calibrate.stdout + calibrate.stderr
    # no third-party logger noise (graphsurgeon's "[W] Could not convert FLOAT8E4M3FN" and its pip hint for colors)
    assert "[W]" not in calibrate.stdout + calibrate.stderr, calibrate.stdout + calibrate.stderr
    engine = folder / "digits.fp8.engine"
    build = run_cli_forked(["build", str(qdq), "--precision", "fp8", "-o", str(engine), "--no-progress"], cwd=folder)
    assert build.returncode == 0, build.stdout + build.stderr
    return qdq, engine, calibrate.stdout + build.stdout


def test_calibrate_fp8_writes_fp8_qdq_and_reports_it(fp8_build: tuple[Path, Path, str]) -> None:
    from workbench.model import load_onnx
    from workbench.precision.qdq_rules import qdq_formats

    qdq, _, out = fp8_build
    assert qdq_formats(load_onnx(qdq, check=False).proto) == {"fp8"}
    assert "0 INT8 nodes, 6 FP8 nodes, method mse-fp8" in out, out
    # the task metric line: FP8 keeps the digits CNN at FP32's accuracy (450 test images)
    line = next(text for text in out.splitlines() if text.startswith("task metric"))
    fp32, quantized = (float(part.split()[-1]) for part in line.split("(")[0].split("  ")[:2])
    assert quantized >= fp32 - 0.01, line


def test_fp8_build_targets_fp8_gpus_and_maps_fp8_layers(fp8_build: tuple[Path, Path, str]) -> None:
    """The RTX build of the FP8 Q/DQ model: targets of compute capability 8.9+ chosen for it, every convolution and
    GEMM layer reads FP8 (from the layer records' ``Datatype: FP8``), every Q/DQ pair inside an FP8 kernel."""
    from workbench.explore.graphs import BuildView
    from workbench.explore.overlays import precision_overlay
    from workbench.viz import palette
    from workbench.viz.engine_view import engine_view_html

    _, engine, out = fp8_build
    artifact = EngineArtifact.load(engine)
    assert artifact.options.compute_capabilities == ("SM89", "SM120", "SM121")
    assert "targets     SM89, SM120, SM121" in out
    assert any("FP8-capable targets" in note for note in artifact.warnings)
    math = [layer for layer in artifact.layer_map.layers if layer.layer_type.lower() in ("correlation", "gemm")]
    assert len(math) == 6 and all(layer.is_fp8_kernel and layer.precision == "fp8" for layer in math)
    assert artifact.layer_map.stats().by_precision.get("fp8", 0) >= 6
    audit = artifact.layer_map.qdq_audit()
    assert audit and {pair.status for pair in audit} == {"fp8-kernel"}, [(p.quantize, p.status) for p in audit]
    document = json.loads(artifact.layers_path.read_text())
    assert document["build"]["quantized_formats"] == ["fp8"]
    assert any(t["datatype"] == "FP8" for layer in document["engine_layers"] for t in layer["inputs"])
    # the engine view and the explorer's precision overlay colour FP8 layers with the palette's FP8 colour
    assert palette.FP8 in engine_view_html(artifact.layer_map, artifact.engine_layers, with_table=False)
    overlay = precision_overlay(BuildView("fp8", artifact.layer_map, artifact.engine_layers))
    assert ("fp8", palette.FP8) in overlay.legend


def test_fp8_refusals(fp8_build: tuple[Path, Path, str], tmp_path: Path) -> None:
    qdq, _, _ = fp8_build
    older = run_cli_forked(
        ["build", str(qdq), "--compute-capability", "SM86", "-o", str(tmp_path / "a.engine"), "--no-progress"],
        cwd=tmp_path,
    )
    assert older.returncode == 2 and "SM86 have no FP8 tensor cores" in older.stderr, older.stderr
    assert not (tmp_path / "a.engine").exists()
    int8 = tmp_path / "digits.int8.onnx"
    calibrate = run_cli_forked(
        ["calibrate", "digits-cnn", "--max-batches", "1", "-o", str(int8), "--no-progress"], cwd=tmp_path
    )
    assert calibrate.returncode == 0, calibrate.stderr
    wrong = run_cli_forked(
        ["build", str(int8), "--precision", "fp8", "-o", str(tmp_path / "b.engine"), "--no-progress"], cwd=tmp_path
    )
    assert wrong.returncode == 2 and "no FLOAT8E4M3FN Q/DQ nodes" in wrong.stderr, wrong.stderr
    entropy = run_cli_forked(
        ["calibrate", "digits-cnn", "--format", "fp8", "--method", "entropy", "-o", str(tmp_path / "c.onnx")],
        cwd=tmp_path,
    )
    assert entropy.returncode == 2 and "entropy is INT8's" in entropy.stderr, entropy.stderr


def test_export_and_doctor_say_which_gpus_run_fp8(fp8_build: tuple[Path, Path, str], tmp_path: Path) -> None:
    _, engine, _ = fp8_build
    bundle = tmp_path / "bundle"
    export = run_cli_forked(["export", str(engine), "-o", str(bundle), "--triton"], cwd=tmp_path)
    assert export.returncode == 0, export.stderr
    assert "FP8 layers: runs on compute capability 8.9+" in export.stdout
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["fp8"]["min_compute_capability"] == "8.9" and manifest["fp8"]["layers"] >= 6
    assert manifest["target_compute_capabilities"] == ["8.9", "12.0", "12.1"]
    config = (bundle / manifest["triton"]["config"]).read_text()
    assert 'key: "precision"' in config and 'string_value: "fp8"' in config
    doctor = run_cli_forked(["doctor", "--json"], cwd=tmp_path)
    report = json.loads(doctor.stdout)
    assert "fp8_can_run" in report and "8.9" in report["fp8_reason"]
