"""One loaded model version: its executor, its lanes (with per-slot input and output buffers) and its warm-up.

A version is built completely on the side (executor, lanes, CUDA graphs per bucket, warm-up, golden batch) before
the server ever dispatches to it, so no request can reach a half-loaded version. GPU executors get ``CudaLanes``
(one stream per lane at the model's priority, pinned buffers per slot); the CPU executor gets ``ThreadLanes`` (one
worker thread per lane, its own ONNX Runtime session, numpy buffers per slot so requests can carry data); both from
:func:`workbench.timing.lanes.make_lanes`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.timing.executors import Executor
from workbench.timing.lanes import CudaLanes, Lanes, make_lanes
from workbench.timing.serving.config import ServeConfig, cuda_stream_priority


def _cuda_priority_range() -> tuple[int, int]:
    from cuda.bindings import runtime  # type: ignore[import-not-found]

    status, least, greatest = runtime.cudaDeviceGetStreamPriorityRange()
    if int(status) != 0:
        return 0, 0
    return int(least), int(greatest)


class VersionRuntime:
    """A model version ready to serve: executor + lanes + free-slot list + per-bucket service-time estimates."""

    def __init__(
        self,
        model: str,
        version: str,
        executor: Executor,
        config: ServeConfig,
        seed: int = 0,
        background: bool = False,
    ) -> None:
        self.model, self.version, self.executor, self.config = model, version, executor, config
        self.device = executor.device
        sizes = config.bucket_sizes()
        self.max_batch = sizes[-1]
        self.stream_priority: int | None = None
        least, greatest = _cuda_priority_range() if executor.device == "cuda" else (0, 0)
        if executor.device == "cuda":
            if hasattr(executor, "capture_error_mode"):
                executor.capture_error_mode = "thread_local"  # type: ignore[attr-defined]  # capture while serving
            self.stream_priority = cuda_stream_priority(config.priority, least, greatest)
        self.lanes: Lanes = make_lanes(
            executor,
            config.lanes,
            config.depth,
            sizes,
            priorities=[self.stream_priority or 0] * config.lanes,
            seed=seed,
            spin_wait=config.spin_wait,
            sm_count=config.sm_count,
            sm_owner=model,  # a reloaded version runs on the same SMs as the one it replaces
        )
        # A version loaded next to live traffic warms up and is checked with its graphs at the lowest priority,
        # so that work yields to the version serving; promote() restores the model's priority before the swap.
        self.background = (
            bool(background) and isinstance(self.lanes, CudaLanes) and self.lanes.set_graph_priority(least)
        )
        self.t0_host = self.lanes.start_clock()
        self.free: deque[tuple[int, int]] = deque(
            (lane, slot) for slot in range(config.depth) for lane in range(config.lanes)
        )
        self.inflight: dict[tuple[int, int], Any] = {}
        self.service_ms: dict[int, float] = {}
        self.closed = False

    # --- data in and out of a slot ------------------------------------------------------------------------------

    def write_inputs(self, lane: int, slot: int, row: int, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]):
        """Copy one request's inputs (batch-first arrays) into the slot's buffers at ``row``."""
        arrays = [inputs[t.name] for t in self.executor.inputs] if isinstance(inputs, Mapping) else list(inputs)
        if len(arrays) != len(self.executor.inputs):
            raise WorkbenchError(
                f"{self.model}: a request has {len(arrays)} input(s), the model takes {len(self.executor.inputs)}.",
                expected=", ".join(t.name for t in self.executor.inputs),
            )
        rows = 0
        for index, (slot_info, array) in enumerate(zip(self.executor.inputs, arrays)):
            array = np.asarray(array)
            if tuple(array.shape[1:]) != tuple(slot_info.sample_shape):
                raise WorkbenchError(
                    f"{self.model}: input {slot_info.name!r} has shape {array.shape}.",
                    expected=f"(N, {', '.join(str(d) for d in slot_info.sample_shape)})",
                )
            view = self.lanes.input_array(lane, slot, index)
            view[row : row + array.shape[0]] = array.astype(view.dtype, copy=False)
            rows = array.shape[0]
        return rows

    def read_outputs(self, lane: int, slot: int, start: int, stop: int) -> list[np.ndarray]:
        return [self.lanes.output_rows(lane, slot, i, start, stop) for i in range(len(self.executor.outputs))]

    # --- side work before serving -------------------------------------------------------------------------------

    def run_batch(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one batch synchronously through the serving path (slot buffers, padding, lanes); only before serving."""
        if self.inflight:
            raise WorkbenchError(f"{self.model} {self.version}: run_batch while serving is not allowed.")
        arrays = [inputs[t.name] for t in self.executor.inputs] if isinstance(inputs, Mapping) else list(inputs)
        n = int(np.asarray(arrays[0]).shape[0])
        if not 1 <= n <= self.max_batch:
            raise WorkbenchError(
                f"{self.model}: a golden batch of {n} samples does not fit.", expected=f"1..{self.max_batch} samples"
            )
        self.write_inputs(0, 0, 0, arrays)
        self.lanes.submit(0, 0, self.config.pad(n))
        self.lanes.wait(0, 0)
        return self.read_outputs(0, 0, 0, n)

    def warm_up(self, repeats: int = 3) -> dict[int, float]:
        """Run every bucket ``repeats`` times on lane 0 (first launches, allocator, caches) and keep each bucket's
        median device time (H2D start to D2H end) as the adaptive delay's service-time estimate."""
        for size in self.config.bucket_sizes():
            times = []
            for _ in range(max(int(repeats), 1)):
                self.lanes.submit(0, 0, size)
                self.lanes.wait(0, 0)
                spans = self.lanes.spans_ms(0, 0)
                times.append(spans[3] - spans[0])
            self.service_ms[size] = float(np.median(times))
        return dict(self.service_ms)

    def promote(self) -> None:
        """Give a version loaded in the background its model's priority (before it starts serving)."""
        if self.background and isinstance(self.lanes, CudaLanes) and self.stream_priority is not None:
            self.lanes.set_graph_priority(self.stream_priority)
            self.background = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.lanes.close()
