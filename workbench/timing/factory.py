"""The executor for a MODEL argument: ONNX Runtime on CPU threads, PyTorch CUDA graphs, or a TensorRT engine."""

from __future__ import annotations

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
