"""The executor for a MODEL argument: ONNX Runtime on CPU threads, PyTorch CUDA graphs, or a TensorRT engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.timing.executors import OrtCpuExecutor, parse_shape_overrides
from workbench.timing.torch_executor import TorchExecutor, torch_module_for
from workbench.timing.trt_executor import TrtExecutor
from workbench.zoo import resolve_model

EXECUTORS = ("cpu", "torch", "trt")


def make_executor(
    model: str, executor: str, *, batch: int = 1, shapes: list[str] | None = None, cuda_graph: bool = True
) -> tuple[Any, str]:
    """Build the executor for MODEL; returns (executor, model label)."""
    if executor == "cpu":
        overrides: dict[str, Any] = parse_shape_overrides(shapes)
        path, entry = resolve_model(model)
        if entry is None and not path.is_file():
            raise WorkbenchError(f"{model}: no such ONNX file.", expected="an existing .onnx path or a zoo name")
        if entry is not None and not overrides:
            overrides = dict(entry.input_profiles())
        return OrtCpuExecutor(path, shapes=overrides), model
    if executor == "torch":
        module, sample_shape, description = torch_module_for(model)
        return TorchExecutor(module, sample_shape, cuda_graph=cuda_graph, description=description), model
    if executor == "trt":
        if not str(model).endswith(".engine"):
            raise WorkbenchError(
                f"{model}: the trt executor times a built engine.",
                expected="a .engine path",
                hint="build one with `workbench build MODEL -o X.engine`",
            )
        return TrtExecutor(model, cuda_graph=cuda_graph), model
    raise WorkbenchError(f"unknown executor {executor!r}.", expected=" | ".join(EXECUTORS))


@dataclass(frozen=True)
class LocalExecutors:
    """The executors this machine can time interactively (the default first), the model each times, and why."""

    names: tuple[str, ...]
    models: dict[str, str]
    reason: str

    @property
    def default_model(self) -> str:
        return self.models[self.names[0]]


def local_executors(cpu_model: str, torch_model: str) -> LocalExecutors:
    """The PyTorch GPU executor (and the CPU one beside it) when CUDA is usable through PyTorch here, else the CPU
    executor alone; says why, so a notebook never passes CPU numbers off as GPU ones."""
    from workbench.engine.backend import detect_gpu

    gpu = detect_gpu()
    cuda_ok = False
    if gpu.present:
        try:
            import torch

            cuda_ok = bool(torch.cuda.is_available())
        except ImportError:
            cuda_ok = False
    models = {"torch": torch_model, "cpu": cpu_model}
    if cuda_ok:
        return LocalExecutors(
            ("torch", "cpu"),
            models,
            f"GPU {gpu.name}: the torch executor times {torch_model} (FP16, CUDA graph per lane, cuda.core "
            f"streams and events); the CPU executor times {cpu_model} with ONNX Runtime for comparison.",
        )
    why = "no NVIDIA GPU found" if not gpu.present else "PyTorch here has no CUDA"
    return LocalExecutors(
        ("cpu",),
        models,
        f"{why}: this notebook runs the CPU executor (ONNX Runtime sessions on worker threads) on "
        f"{cpu_model}. These are CPU numbers: no CUDA streams, no copies, not GPU or TensorRT timings.",
    )
