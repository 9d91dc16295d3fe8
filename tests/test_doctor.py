"""`workbench doctor` reports the backend and, on a machine without a usable GPU, why no engine can run."""

from __future__ import annotations

import json
import subprocess
import sys

from workbench.engine.backend import detect_gpu, get_backend


def test_doctor_json_reports_backend_and_why_engines_cannot_run() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "workbench", "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    backend = get_backend()
    assert report["backend"] == backend.name
    assert report["backend_version"] == backend.version
    assert report["can_build"] is True
    assert "CPUExecutionProvider" in report["onnxruntime_providers"]
    assert report["packages"]["onnx"]
    gpu = detect_gpu()
    assert report["gpu_present"] is gpu.present
    if not gpu.present:
        assert report["engine_can_run"] is False
        assert "no NVIDIA GPU" in report["engine_can_run_reason"]
    elif backend.is_rtx and gpu.compute_capability == (9, 0):
        assert report["engine_can_run"] is False
        assert "does not run on compute capability 9.0" in report["engine_can_run_reason"]


def test_doctor_text_output_is_readable() -> None:
    result = subprocess.run([sys.executable, "-m", "workbench", "doctor"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "TensorRT backend" in result.stdout and "engine can run" in result.stdout
