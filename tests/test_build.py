"""Real engine builds with the TensorRT backend available here (TensorRT-RTX on a CPU-only machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine.build import BuildOptions, engine_from_onnx, layers_path_for, parse_shapes_arg, profiles_for
from workbench.errors import WorkbenchError
from workbench.model import load_onnx
from workbench.progress import ProgressEvent

REPO = Path(__file__).resolve().parents[1]


def test_build_real_model_writes_engine_layers_and_log(rapidocr_models: Path, tmp_path: Path) -> None:
    model = load_onnx(rapidocr_models / "ch_PP-OCRv4_rec_infer.onnx")
    engine_path = tmp_path / "rec.engine"
    artifact = engine_from_onnx(
        model,
        engine_path,
        BuildOptions(
            shapes={"x": ((1, 3, 48, 320), (2, 3, 48, 320), (4, 3, 48, 320))}, progress=False, workspace_bytes=256 << 20
        ),
    )
    assert engine_path.stat().st_size == artifact.engine_bytes > 1_000_000
    assert artifact.layers_path == tmp_path / "rec.layers.json"
    document = json.loads(artifact.layers_path.read_text())
    layers = document["engine_layers"]
    assert len(layers) == artifact.layer_count > 10
    assert {"name", "type", "precision", "onnx_nodes", "tactic"} <= set(layers[0])
    # the recogniser's convolutions are fused into engine layers; every Conv node is named by some layer
    convs = {node.name for node in model.proto.graph.node if node.op_type == "Conv"}
    mapped = {name for layer in layers for name in layer["onnx_nodes"]}
    assert convs and convs <= mapped
    precisions = [layer["precision"] for layer in layers]
    assert set(precisions) <= {"fp32", "none"}  # "none": layers without typed tensors (shape calls)
    assert precisions.count("fp32") > 10
    assert document["io_tensors"][0]["profiles"][0]["max"] == [4, 3, 48, 320]
    assert "Layers:" in artifact.build_log_path.read_text()
    assert artifact.backend in ("tensorrt_rtx", "tensorrt")


def test_timing_cache_saved_where_supported_and_said_otherwise(rapidocr_models: Path, tmp_path: Path) -> None:
    from workbench.engine.backend import get_backend, supports_timing_cache

    cache = tmp_path / "timing.cache"
    options = BuildOptions(shapes={"x": ((1, 3, 48, 320),) * 3}, progress=False, timing_cache_path=str(cache))
    artifact = engine_from_onnx(rapidocr_models / "ch_PP-OCRv4_rec_infer.onnx", tmp_path / "a.engine", options)
    if supports_timing_cache(get_backend()):
        assert cache.stat().st_size > 0
    else:  # TensorRT-RTX: timing-cache calls are documented no-ops
        assert not cache.exists()
        assert any("timing cache not saved" in note for note in artifact.warnings)


def test_progress_callback_sees_builder_phases(rapidocr_models: Path, tmp_path: Path) -> None:
    events: list[tuple[str, str, str]] = []

    def on_progress(event: ProgressEvent) -> bool:
        assert event.task == "build"
        events.append((event.kind, event.message, event.parent))
        return True

    engine_from_onnx(
        rapidocr_models / "ch_PP-OCRv4_rec_infer.onnx",
        tmp_path / "p.engine",
        BuildOptions(shapes={"x": ((1, 3, 48, 320),) * 3}, progress_callback=on_progress),
    )
    top_level = [phase for kind, phase, parent in events if kind == "start" and not parent]
    assert "Building engine" in top_level
    assert any(kind == "finish" for kind, _, _ in events)


def test_dynamic_non_batch_dim_without_shapes_is_a_clear_error(rapidocr_models: Path) -> None:
    model = load_onnx(rapidocr_models / "ch_PP-OCRv4_rec_infer.onnx")
    with pytest.raises(WorkbenchError, match=r"input 'x' has a dynamic dimension .* axis 2.*--shapes x:"):
        profiles_for(model, {})


def test_shape_argument_parsing() -> None:
    assert parse_shapes_arg(["x:1x3x48x320"]) == {"x": ((1, 3, 48, 320),) * 3}
    assert parse_shapes_arg(["in:0:1x8,2x8,4x8"])["in:0"] == ((1, 8), (2, 8), (4, 8))
    with pytest.raises(WorkbenchError, match="cannot read --shapes"):
        parse_shapes_arg(["x=1x3"])
    with pytest.raises(WorkbenchError, match="not ordered"):
        parse_shapes_arg(["x:4x3,2x3,1x3"])


def test_layers_path_naming() -> None:
    assert layers_path_for("out/MODEL.engine") == Path("out/MODEL.layers.json")
    assert layers_path_for("m.plan") == Path("m.layers.json")


@pytest.mark.parametrize("problem", ["truncated", "not-onnx", "missing", "empty", "directory"])
def test_bad_input_is_a_workbench_error_naming_the_file(problem: str, rapidocr_models: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    if problem == "truncated":
        data = (rapidocr_models / "ch_ppocr_mobile_v2.0_cls_infer.onnx").read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif problem == "not-onnx":
        path.write_text("this is a README, not a model\n" * 50)
    elif problem == "empty":
        path.write_bytes(b"")
    elif problem == "directory":
        path.mkdir()
    with pytest.raises(WorkbenchError) as info:
        engine_from_onnx(path, tmp_path / "out.engine", BuildOptions(progress=False))
    assert str(path) in str(info.value)
    assert not (tmp_path / "out.engine").exists()


def test_failed_build_keeps_the_previous_engine(rapidocr_models: Path, tmp_path: Path) -> None:
    engine = tmp_path / "rec.engine"
    engine.write_bytes(b"previous engine")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"\x08\x07garbage")
    with pytest.raises(WorkbenchError):
        engine_from_onnx(broken, engine, BuildOptions(progress=False))
    assert engine.read_bytes() == b"previous engine"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


@pytest.mark.parametrize("problem", ["truncated", "not-onnx", "missing"])
def test_cli_bad_input_exits_nonzero_without_traceback(problem: str, rapidocr_models: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    if problem == "truncated":
        data = (rapidocr_models / "ch_PP-OCRv4_rec_infer.onnx").read_bytes()
        path.write_bytes(data[:4096])
    elif problem == "not-onnx":
        path.write_bytes(bytes(range(256)) * 64)
    result = _cli("build", str(path), "-o", str(tmp_path / "x.engine"), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr and "error:" in result.stderr


def test_cli_build_prints_summary(rapidocr_models: Path, tmp_path: Path) -> None:
    result = _cli(
        "build",
        str(rapidocr_models / "ch_PP-OCRv4_rec_infer.onnx"),
        "-o",
        str(tmp_path / "rec.engine"),
        "--shapes",
        "x:1x3x48x320",
        "--no-progress",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "engine layers" in result.stdout and "rec.layers.json" in result.stdout
    assert (tmp_path / "rec.layers.json").exists()
