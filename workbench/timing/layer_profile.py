"""Per-layer time: PyTorch modules through torch.profiler mapped to ONNX node names, TensorRT's IProfiler, and
``trtexec --exportProfile`` JSON.

PyTorch: every module gets a ``record_function`` range (forward pre/post hooks) and torch.profiler records the
kernels launched inside it; a module's *self* time is its range's kernel time minus its child modules' (so the
residual ``Add`` of a ResNet block lands on the block). Profiling runs eager: a CUDA graph replay is one launch with
no module boundaries, but it runs the same kernels. On a CPU-only machine the same path reports CPU time, labelled.

ONNX names: the TorchScript exporter names a node ``/scope/.../OpType`` where each scope level is a module's
attribute name, written with its parent's name for container children (``/layer1/layer1.0/conv1/Conv``) and with a
``_N`` suffix for the N-th reuse of one module (``relu_1``); ``onnx_module_path`` undoes that. A module's time is
spread evenly over its ONNX nodes (``per_onnx_node``), which is exact for the usual one-node leaf modules.

TensorRT: ``trt_layer_profiler`` builds an ``IProfiler`` that sums ``report_layer_time`` per layer (attach it to an
execution context; enqueue then becomes synchronous, so never time with it attached), and ``read_trtexec_profile``
reads trtexec's ``--exportProfile`` file. Neither can run here (no GPU TensorRT can run on): unverified.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from workbench.artifact import Artifact
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    import onnx
    import tensorrt as trt_module
    import torch
    from torch.profiler import record_function

PREFIX = "wb.module::"


@dataclass(frozen=True)
class LayerTime(Artifact):
    name: str  # module path (PyTorch) or engine layer name (TensorRT)
    time_ms: float  # mean per inference (self time for modules)
    onnx_nodes: tuple[str, ...] = ()
    share: float = math.nan  # of the profile's total
    folded: tuple[str, ...] = ()  # modules with no ONNX node whose time is counted here (e.g. BatchNorm -> Conv)


@dataclass(frozen=True)
class LayerProfile(Artifact):
    """Per-layer time of one model. ``clock`` says what was timed (CUDA kernel time, CPU time, TensorRT layer time)."""

    model: str
    source: str  # "torch.profiler" | "tensorrt IProfiler" | "trtexec --exportProfile"
    clock: str
    batch: int
    iterations: int
    total_ms: float  # whole forward (sum of layer times for TensorRT sources)
    layers: tuple[LayerTime, ...]
    unmapped_modules: tuple[str, ...] = ()
    unmapped_onnx_nodes: tuple[str, ...] = ()
    verified: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

    def per_onnx_node(self) -> dict[str, float]:
        """ms per ONNX node name (a module's time split evenly over its nodes), for the engine explorer overlay."""
        out: dict[str, float] = {}
        for layer in self.layers:
            for node in layer.onnx_nodes:
                out[node] = out.get(node, 0.0) + layer.time_ms / len(layer.onnx_nodes)
        return out

    def top(self, n: int = 10) -> list[LayerTime]:
        return sorted(self.layers, key=lambda layer: layer.time_ms, reverse=True)[:n]


def onnx_module_path(node_name: str, module_names: Iterable[str]) -> str | None:
    """The module path an exported ONNX node came from (``/layer1/layer1.0/conv1/Conv`` -> ``layer1.0.conv1``);
    '' for the top module, None for a name without a scope."""
    if not node_name.startswith("/"):
        return None
    known = set(module_names)
    parts = node_name.strip("/").split("/")[:-1]  # the last part is the op type
    path: list[str] = []
    for part in parts:
        if path and part.startswith(path[-1] + "."):
            path[-1] = part  # container child written with its parent's name
            continue
        candidate = ".".join(path + [part])
        if candidate not in known:
            stripped = re.sub(r"_\d+$", "", part)  # the N-th call of a reused module
            if ".".join(path + [stripped]) in known:
                part = stripped
        path.append(part)
    name = ".".join(path)
    return name if name in known else None


def torch_layer_profile(
    module: torch.nn.Module,
    example: torch.Tensor,
    *,
    onnx_model: onnx.ModelProto | str | os.PathLike[str] | None = None,
    iterations: int = 20,
    warmup: int = 5,
    model: str = "",
) -> LayerProfile:
    """Profile ``module(example)`` per module with torch.profiler (CUDA kernel time when ``example`` is on a GPU,
    else CPU time); map modules to the nodes of ``onnx_model`` (an ONNX ModelProto or path) when given."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = bool(getattr(example, "is_cuda", False))
    names = {id(m): n for n, m in module.named_modules()}
    stack: list[record_function] = []
    order: dict[str, int] = {}  # first-call order, to fold node-less modules into the one run before them

    def pre(mod: torch.nn.Module, _inputs: tuple[torch.Tensor, ...]) -> None:
        order.setdefault(names[id(mod)], len(order))
        rf = record_function(PREFIX + names[id(mod)])
        rf.__enter__()
        stack.append(rf)

    def post(mod: torch.nn.Module, _inputs: tuple[torch.Tensor, ...], _output: object) -> None:
        stack.pop().__exit__(None, None, None)

    handles = []
    for mod in module.modules():
        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with torch.inference_mode():
            for _ in range(warmup):
                module(example)
            if cuda:
                torch.cuda.synchronize()
            with profile(activities=activities) as prof:
                for _ in range(iterations):
                    module(example)
                if cuda:
                    torch.cuda.synchronize()
    finally:
        for handle in handles:
            handle.remove()
    inclusive: dict[str, float] = {}
    for event in prof.events():
        if not event.name.startswith(PREFIX):
            continue
        if cuda and str(getattr(event, "device_type", "")).endswith("CUDA"):
            continue  # the GPU-side copy of the range; its kernels are counted on the CPU-side range
        value_us = event.device_time_total if cuda else event.cpu_time_total
        key = event.name[len(PREFIX) :]
        inclusive[key] = inclusive.get(key, 0.0) + float(value_us) / 1e3 / iterations
    module_names = [n for n, _ in module.named_modules()]
    self_ms: dict[str, float] = {}
    for name in module_names:
        children = [c for c in module_names if c and _parent(c) == name]
        self_ms[name] = max(inclusive.get(name, 0.0) - sum(inclusive.get(c, 0.0) for c in children), 0.0)
    total = inclusive.get("", sum(self_ms.values()))
    nodes_by_module: dict[str, list[str]] = {}
    unmapped_nodes: list[str] = []
    if onnx_model is not None:
        import onnx

        proto = onnx.load(str(onnx_model)) if isinstance(onnx_model, (str, os.PathLike)) else onnx_model
        for node in proto.graph.node:
            owner = onnx_module_path(node.name, module_names)
            if owner is None:
                unmapped_nodes.append(node.name)
            else:
                nodes_by_module.setdefault(owner, []).append(node.name)
    unmapped_modules: list[str] = []
    folded: dict[str, list[str]] = {}
    if onnx_model is not None:
        # A module with time but no ONNX node was folded away on export (BatchNorm into the Conv before it): count
        # its time on the mapped leaf module that ran just before it.
        ran = sorted(order, key=order.__getitem__)
        for name in ran:
            if self_ms.get(name, 0.0) > 0 and not nodes_by_module.get(name):
                unmapped_modules.append(name)
                before = [m for m in ran[: order[name]] if nodes_by_module.get(m)]
                if before:
                    folded.setdefault(before[-1], []).append(name)
    moved = {m for names_ in folded.values() for m in names_}
    layers = tuple(
        LayerTime(
            name or "(top)",
            ms + sum(self_ms[m] for m in folded.get(name, ())),
            tuple(nodes_by_module.get(name, ())),
            (ms + sum(self_ms[m] for m in folded.get(name, ()))) / total if total > 0 else math.nan,
            tuple(folded.get(name, ())),
        )
        for name, ms in self_ms.items()
        if name not in moved and (ms > 0 or nodes_by_module.get(name))
    )
    batch = int(example.shape[0]) if hasattr(example, "shape") else 1
    notes = ["eager execution (a CUDA graph replay has no module boundaries; it runs the same kernels)"]
    if unmapped_modules:
        notes.append(
            f"{len(unmapped_modules)} module(s) with time but no ONNX node (e.g. BatchNorm folded into Conv on export);"
            " their time is counted on the module that ran just before them"
        )
    if unmapped_nodes:
        notes.append(f"{len(unmapped_nodes)} ONNX node(s) without a module scope (exporter-added, e.g. Identity)")
    return LayerProfile(
        model=model or type(module).__name__,
        source="torch.profiler",
        clock="CUDA kernel time" if cuda else "CPU time (no GPU here)",
        batch=batch,
        iterations=iterations,
        total_ms=total,
        layers=layers,
        unmapped_modules=tuple(unmapped_modules),
        unmapped_onnx_nodes=tuple(unmapped_nodes),
        notes=tuple(notes),
    )


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def trt_layer_profiler(trt: ModuleType) -> trt_module.IProfiler:
    """An ``IProfiler`` (of the given tensorrt / tensorrt_rtx module) that sums layer times; ``.profile(...)``
    turns them into a LayerProfile. Unverified here: no TensorRT engine runs on our machines."""

    class _Profiler(trt.IProfiler):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.total_ms: dict[str, float] = {}
            self.calls: dict[str, int] = {}

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            self.total_ms[layer_name] = self.total_ms.get(layer_name, 0.0) + float(ms)
            self.calls[layer_name] = self.calls.get(layer_name, 0) + 1

        def profile(self, model: str = "", batch: int = 1, layer_map: Mapping[str, Sequence[str]] | None = None):
            runs = max(self.calls.values(), default=0)
            means = {name: total / max(self.calls[name], 1) for name, total in self.total_ms.items()}
            return _trt_profile(model, "tensorrt IProfiler", batch, runs, means, layer_map)

    return _Profiler()


def read_trtexec_profile(
    path: str | os.PathLike[str],
    *,
    model: str = "",
    batch: int = 1,
    layer_map: Mapping[str, Sequence[str]] | None = None,
) -> LayerProfile:
    """Read ``trtexec --exportProfile=FILE``: a JSON list whose first item is ``{"count": N}`` and whose others are
    ``{"name", "timeMs", "averageMs", "medianMs", "percentage"}`` per layer. ``layer_map`` maps engine layer names
    to the ONNX nodes they fused (the engine's layer map)."""
    from workbench._io import read_json

    path = Path(path)
    data = read_json(path, what="trtexec --exportProfile JSON")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "count" not in data[0]:
        raise WorkbenchError(
            f"{path}: not a trtexec layer profile.", expected='a JSON list starting with {"count": N}, then layers'
        )
    count = data[0]["count"]
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**63:
        raise WorkbenchError(f"{path}: count {count!r} is not an iteration count.", expected="an integer >= 0")
    means: dict[str, float] = {}
    for index, item in enumerate(data[1:], start=1):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or "averageMs" not in item:
            raise WorkbenchError(f"{path}: item {index} is not a layer record.", expected='{"name", "averageMs", ...}')
        value = item["averageMs"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise WorkbenchError(
                f"{path}: item {index} ({item['name']!r}) has averageMs {value!r}.", expected="a finite number >= 0"
            )
        means[item["name"]] = means.get(item["name"], 0.0) + float(value)
    return _trt_profile(model, "trtexec --exportProfile", batch, int(data[0]["count"]), means, layer_map)


def _trt_profile(
    model: str,
    source: str,
    batch: int,
    iterations: int,
    means: Mapping[str, float],
    layer_map: Mapping[str, Sequence[str]] | None,
) -> LayerProfile:
    total = sum(means.values())
    layers = tuple(
        LayerTime(name, ms, tuple((layer_map or {}).get(name, ())), ms / total if total > 0 else math.nan)
        for name, ms in means.items()
    )
    return LayerProfile(
        model=model,
        source=source,
        clock="TensorRT layer time (profiled run: enqueue synchronous)",
        batch=batch,
        iterations=iterations,
        total_ms=total,
        layers=layers,
        unmapped_modules=tuple(layer.name for layer in layers if layer_map is not None and not layer.onnx_nodes),
        verified=False,
        notes=("not run on our machines: no GPU here runs TensorRT engines",),
    )
