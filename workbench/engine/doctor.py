"""`workbench doctor`: what this machine can do — backend, GPU, whether engines can run here and why not."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.artifact import JsonObject

PACKAGES = (
    "tensorrt",
    "tensorrt-rtx-cu13",
    "onnx",
    "onnx-graphsurgeon",
    "onnxruntime",
    "polygraphy",
    "numpy",
    "plotly",
    "ipywidgets",
    "jupyterlab",
    "tqdm",
    "cuda-core",
    "cuda-bindings",
    "torch",
    "cupy-cuda13x",
)


@dataclass
class DoctorReport:
    python: str
    platform: str
    backend: str | None
    backend_version: str | None
    backend_error: str | None
    available_backends: list[str]
    forced_by_env: str | None
    gpu_present: bool
    gpu_name: str
    gpu_compute_capability: str | None
    engine_can_run: bool
    engine_can_run_reason: str
    fp8_can_run: bool  # this GPU has FP8 tensor cores (compute capability 8.9+)
    fp8_reason: str
    can_build: bool
    onnxruntime_providers: list[str]
    packages: dict[str, str | None] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return asdict(self)


def diagnose() -> DoctorReport:
    import os

    from workbench.engine.backend import BACKEND_ENV, available_backends, detect_gpu, engine_runnable, get_backend
    from workbench.engine.targets import fp8_support_line
    from workbench.errors import WorkbenchError

    backend = None
    error = None
    try:
        backend = get_backend()
    except WorkbenchError as exc:
        error = str(exc)
    gpu = detect_gpu()
    fp8_can_run, fp8_reason = fp8_support_line(gpu.name, gpu.compute_capability if gpu.present else None)
    if backend is not None:
        can_run, reason = engine_runnable(backend, gpu)
    else:
        can_run, reason = False, "no TensorRT backend is importable"
    try:
        import onnxruntime

        providers = list(onnxruntime.get_available_providers())
    except Exception as exc:  # report, don't crash: doctor exists to explain broken set-ups
        providers = [f"unavailable: {exc}"]
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return DoctorReport(
        python=sys.version.split()[0],
        platform=f"{platform.system()} {platform.machine()}",
        backend=backend.name if backend else None,
        backend_version=backend.version if backend else None,
        backend_error=error,
        available_backends=available_backends(),
        forced_by_env=os.environ.get(BACKEND_ENV),
        gpu_present=gpu.present,
        gpu_name=gpu.name,
        gpu_compute_capability=".".join(map(str, gpu.compute_capability)) if gpu.compute_capability else None,
        engine_can_run=can_run,
        engine_can_run_reason=reason,
        fp8_can_run=fp8_can_run,
        fp8_reason=fp8_reason,
        can_build=backend is not None,
        onnxruntime_providers=providers,
        packages=versions,
    )


def format_report(report: DoctorReport) -> str:
    yes_no = {True: "yes", False: "no"}
    lines = [
        f"python            {report.python} ({report.platform})",
        f"TensorRT backend  {report.backend or 'none'} {report.backend_version or ''}".rstrip()
        + (f"  (forced by WORKBENCH_TRT_BACKEND={report.forced_by_env})" if report.forced_by_env else ""),
        f"importable        {', '.join(report.available_backends) or 'none'}",
        f"can build         {yes_no[report.can_build]}"
        + (f"  ({report.backend_error})" if report.backend_error else ""),
        f"GPU               {report.gpu_name or 'none'}"
        + (f" (compute capability {report.gpu_compute_capability})" if report.gpu_compute_capability else ""),
        f"engine can run    {yes_no[report.engine_can_run]}: {report.engine_can_run_reason}",
        f"FP8 engines       {yes_no[report.fp8_can_run]}: {report.fp8_reason}",
        f"ORT providers     {', '.join(report.onnxruntime_providers)}",
        "packages          " + ", ".join(f"{k} {v}" for k, v in report.packages.items() if v),
        "not installed     " + ", ".join(k for k, v in report.packages.items() if not v),
    ]
    return "\n".join(lines)
