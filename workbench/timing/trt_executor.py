"""TensorRT executor for the pipeline. UNVERIFIED: no machine we have can execute a TensorRT engine.

(Full TensorRT is not installable on our machines and TensorRT-RTX refuses the H200's compute capability 9.0.)
Every TensorRT call goes through ``workbench.engine.backend.EngineRunner`` (type-checked there against tensorrt-stubs);
this module only arranges per-lane resources:

* one execution context per lane, created with user-managed memory and given its own scratch buffer of
  ``get_device_memory_size_for_profile_v2(profile)`` bytes (contexts running in parallel must not share it);
* device buffers sized for the largest batch, bound once with ``set_tensor_address``;
* an input-consumed event per lane (``set_input_consumed_event``) so a caller may refill inputs early;
* ``execute_async_v3`` on the lane's stream, optionally captured once per batch size into a CUDA graph
  (enqueue once before capture, as TensorRT requires); if capture fails the lane falls back to plain enqueue and the
  reason is reported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from workbench.artifact import JsonObject
from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from cuda.bindings import driver
    from cuda.core import Stream

    from workbench.engine.backend import Backend
from workbench.timing.executors import TensorSlot

_TRT_DTYPES = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT8": np.int8,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "BF16": np.float32,
}


def _np_dtype(trt_dtype: str) -> np.dtype:
    key = trt_dtype.rsplit(".", 1)[-1].upper()
    if key not in _TRT_DTYPES:
        raise WorkbenchError(f"tensor data type {trt_dtype} is not supported by the timing pipeline.")
    return np.dtype(_TRT_DTYPES[key])


class TrtExecutor:
    name = "trt"
    device = "cuda"

    def __init__(
        self,
        engine_path: str | os.PathLike[str],
        *,
        backend: Backend | None = None,
        cuda_graph: bool = True,
        profile_index: int = 0,
    ) -> None:
        from workbench.engine.backend import EngineRunner, get_backend
        from workbench.timing.lanes import request_hardware_queues

        request_hardware_queues()
        path = Path(engine_path)
        if not path.is_file():
            raise WorkbenchError(f"{path}: no such engine file.", expected="a .engine written by `workbench build`")
        self.backend = backend or get_backend()
        self.runner = EngineRunner(self.backend, path.read_bytes())
        self.engine_path = path
        self.profile_index = int(profile_index)
        self.cuda_graph_requested = self.cuda_graph_active = bool(cuda_graph)
        self.fallback_reason = ""
        self.inputs: list[TensorSlot] = []
        self.outputs: list[TensorSlot] = []
        for io in self.runner.bindings():
            if any(d < 0 for d in io.shape[1:]):
                raise WorkbenchError(
                    f"tensor {io.name!r} has dynamic non-batch dimensions {io.shape}.",
                    expected="only the batch dimension dynamic (build with a fixed sample shape)",
                )
            slot = TensorSlot(io.name, tuple(int(d) for d in io.shape[1:]), _np_dtype(io.dtype))
            (self.inputs if io.is_input else self.outputs).append(slot)
        self._lanes: dict[int, _TrtLane] = {}

    def label(self) -> str:
        mode = "CUDA graph per lane" if self.cuda_graph_active else "execute_async_v3"
        return f"{self.backend.name} {self.backend.version} {self.engine_path.name}, {mode} (unverified here)"

    def graph_status(self) -> JsonObject:
        return {
            "requested": self.cuda_graph_requested,
            "active": self.cuda_graph_active,
            "fallback_reason": self.fallback_reason,
        }

    def estimate_new_lane_bytes(self, n_lanes: int, batch_sizes: Sequence[int]) -> int:
        per_lane = self.runner.context_memory_bytes(self.profile_index)
        max_b = max(batch_sizes)
        per_lane += sum(t.nbytes(max_b) for t in self.inputs + self.outputs)
        return sum(per_lane for i in range(n_lanes) if i not in self._lanes)

    def bind_lane(self, lane: int, batch_sizes: Sequence[int], stream: Stream) -> _TrtLane:
        existing = self._lanes.get(lane)
        if existing is not None and set(batch_sizes) <= set(existing.sizes):
            return existing
        binding = _TrtLane(self, sorted(set(int(s) for s in batch_sizes)), stream)
        self._lanes[lane] = binding
        return binding

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()


class _TrtLane:
    def __init__(self, owner: TrtExecutor, sizes: list[int], stream: Stream) -> None:
        from cuda.bindings import driver  # type: ignore[import-not-found]
        from cuda.core import Device  # type: ignore[import-not-found]

        self.owner, self.sizes, self._driver = owner, sizes, driver
        runner = owner.runner
        device = Device()
        max_b = sizes[-1]
        self._buffers = []
        self.addresses: dict[str, int] = {}
        for slot in owner.inputs + owner.outputs:
            buf = device.allocate(max(slot.nbytes(max_b), 1))
            self._buffers.append(buf)
            self.addresses[slot.name] = int(buf.handle)
        scratch_bytes = runner.context_memory_bytes(owner.profile_index)
        self.context = runner.create_context(user_managed_memory=True)
        self._scratch = device.allocate(max(scratch_bytes, 1))
        runner.set_device_memory(self.context, int(self._scratch.handle), scratch_bytes)
        handle = int(stream.handle)
        runner.select_profile(self.context, owner.profile_index, handle)
        runner.bind(self.context, self.addresses)
        self.input_consumed = device.create_event()
        runner.set_input_consumed_event(self.context, int(self.input_consumed.handle))
        self._current_size = -1
        self.graph_exec: dict[int, driver.CUgraphExec] = {}
        self.priority_status = "kernel priorities follow the lane's stream"
        if owner.cuda_graph_active:
            try:
                for size in sizes:
                    self._set_batch(size)
                    runner.enqueue(self.context, handle)  # TensorRT needs one plain enqueue before capture
                    self.graph_exec[size] = self._capture(handle)
            except Exception as error:
                owner.cuda_graph_active = False
                owner.fallback_reason = f"CUDA graph capture of execute_async_v3 failed ({error}); plain enqueue"
                self.graph_exec.clear()
        stream.sync()

    def _capture(self, handle: int) -> driver.CUgraphExec:
        drv = self._driver
        mode = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        stream = drv.CUstream(handle)
        (status,) = drv.cuStreamBeginCapture(stream, mode)
        if int(status) != 0:
            raise WorkbenchError(f"cuStreamBeginCapture failed: {status!r}")
        try:
            self.owner.runner.enqueue(self.context, handle)
        finally:
            status, graph = drv.cuStreamEndCapture(stream)
        if int(status) != 0:
            raise WorkbenchError(f"cuStreamEndCapture failed: {status!r}")
        from workbench.timing.graph_priority import instantiate_at_priority, stream_priority

        # Kernel nodes at the lane stream's priority: a plain instantiation did not honour it (graph_priority.py).
        try:
            return instantiate_at_priority(graph, stream_priority(stream))
        except WorkbenchError as error:  # a driver without node priorities: the graph still runs, at default priority
            self.priority_status = f"kernel priorities not set ({error})"
            status, graph_exec = drv.cuGraphInstantiate(graph, 0)
            if int(status) != 0:
                raise WorkbenchError(f"cuGraphInstantiate failed: {status!r}") from error
            return graph_exec

    def _set_batch(self, size: int) -> None:
        if size != self._current_size:
            for slot in self.owner.inputs:
                self.owner.runner.set_input_shape(self.context, slot.name, (size, *slot.sample_shape))
            self._current_size = size

    def input_pointers(self, size: int) -> list[int]:
        return [self.addresses[s.name] for s in self.owner.inputs]

    def output_pointers(self, size: int) -> list[int]:
        return [self.addresses[s.name] for s in self.owner.outputs]

    def enqueue(self, size: int, stream: Stream) -> None:
        graph = self.graph_exec.get(size)
        if graph is not None:
            (status,) = self._driver.cuGraphLaunch(graph, stream.handle)
            if int(status) != 0:
                raise WorkbenchError(f"cuGraphLaunch failed: {status!r}")
            return
        self._set_batch(size)
        self.owner.runner.enqueue(self.context, int(stream.handle))

    def close(self) -> None:
        for buf in self._buffers:
            buf.close()
        self._scratch.close()
