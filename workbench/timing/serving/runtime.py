"""One loaded model version: its executor, its lanes (with per-slot input and output buffers) and its warm-up.

A version is built completely on the side (executor, lanes, CUDA graphs per bucket, warm-up, golden batch) before
the server ever dispatches to it, so no request can reach a half-loaded version. GPU executors get ``CudaLanes``
(one stream per lane at the model's priority, pinned buffers per slot); the CPU executor gets ``SlotThreadLanes``
(one worker thread per lane, its own ONNX Runtime session, numpy buffers per slot so requests can carry data).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from workbench.errors import WorkbenchError
from workbench.timing.executors import Executor, random_feed
from workbench.timing.serving.config import ServeConfig, cuda_stream_priority


class SlotThreadLanes:
    """CPU lanes whose slots own their inputs and outputs (``ThreadLanes`` shares one feed per lane and size).

    Same interface as the timing lanes (submit / is_done / wait / spans_ms / start_clock / close) plus
    ``input_array`` and ``outputs`` per slot. Spans are host-clock ms since ``start_clock``.
    """

    def __init__(self, executor: Executor, n_lanes: int, depth: int, batch_sizes: Sequence[int], seed: int = 0):
        self.n_lanes, self.depth = int(n_lanes), int(depth)
        self.executor = executor
        self.max_batch = max(batch_sizes)
        self.bindings = [executor.bind_lane(i, batch_sizes, None) for i in range(self.n_lanes)]
        for binding in self.bindings:
            if not hasattr(binding, "run"):
                raise WorkbenchError(
                    f"the {executor.name} executor's lanes cannot run caller-owned inputs.",
                    expected="an executor whose lane binding has run(feed) (ONNX Runtime CPU)",
                )
        feed = random_feed(executor.inputs, self.max_batch, seed=seed)
        self._inputs = [[[feed[t.name].copy() for t in executor.inputs] for _ in range(depth)] for _ in range(n_lanes)]
        self._outputs: list[list[list[np.ndarray]]] = [[[] for _ in range(depth)] for _ in range(n_lanes)]
        self._done = [[threading.Event() for _ in range(depth)] for _ in range(n_lanes)]
        for lane in self._done:
            for event in lane:
                event.set()
        self._spans = [[(0.0, 0.0, 0.0, 0.0)] * depth for _ in range(n_lanes)]
        self._errors: dict[tuple[int, int], BaseException] = {}
        self._queues: list[queue.SimpleQueue[tuple[int, int] | None]] = [queue.SimpleQueue() for _ in range(n_lanes)]
        self._t0 = time.perf_counter()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True, name=f"serving-lane-{i}")
            for i in range(n_lanes)
        ]
        for thread in self._threads:
            thread.start()

    def _work(self, lane: int) -> None:
        binding = self.bindings[lane]
        names = [t.name for t in self.executor.inputs]
        while True:
            item = self._queues[lane].get()
            if item is None:
                return
            slot, size = item
            start = time.perf_counter()
            try:
                feed = {name: array[:size] for name, array in zip(names, self._inputs[lane][slot])}
                self._outputs[lane][slot] = binding.run(feed)  # type: ignore[attr-defined]
            except BaseException as error:  # reported for this slot's batch by wait()
                self._errors[(lane, slot)] = error
            end = time.perf_counter()
            s, e = (start - self._t0) * 1e3, (end - self._t0) * 1e3
            self._spans[lane][slot] = (s, s, e, e)
            self._done[lane][slot].set()

    def start_clock(self) -> float:
        self._t0 = time.perf_counter()
        return self._t0

    def submit(self, lane: int, slot: int, size: int) -> None:
        self._errors.pop((lane, slot), None)
        self._done[lane][slot].clear()
        self._queues[lane].put((slot, size))

    def is_done(self, lane: int, slot: int) -> bool:
        return self._done[lane][slot].is_set()

    def wait(self, lane: int, slot: int) -> None:
        self._done[lane][slot].wait()
        error = self._errors.get((lane, slot))
        if error is not None:
            raise WorkbenchError(f"the CPU executor failed on lane {lane}: {error}") from error

    def spans_ms(self, lane: int, slot: int) -> tuple[float, float, float, float]:
        return self._spans[lane][slot]

    def input_array(self, lane: int, slot: int, index: int = 0) -> np.ndarray:
        return self._inputs[lane][slot][index]

    def output_rows(self, lane: int, slot: int, index: int, start: int, stop: int) -> np.ndarray:
        return np.array(self._outputs[lane][slot][index][start:stop])

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(timeout=10)


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
        if executor.device == "cuda":
            from workbench.timing.lanes import CudaLanes

            if hasattr(executor, "capture_error_mode"):
                executor.capture_error_mode = "thread_local"  # type: ignore[attr-defined]  # capture while serving
            least, greatest = _cuda_priority_range()
            self.stream_priority = cuda_stream_priority(config.priority, least, greatest)
            self.lanes: Any = CudaLanes(
                executor,
                config.lanes,
                config.depth,
                sizes,
                priorities=[self.stream_priority] * config.lanes,
                seed=seed,
                spin_wait=config.spin_wait,
                sm_count=config.sm_count,
                sm_owner=model,  # a reloaded version runs on the same SMs as the one it replaces
            )
            # A version loaded next to live traffic warms up and is checked with its graphs at the lowest priority,
            # so that work yields to the version serving; promote() restores the model's priority before the swap.
            self.background = bool(background) and self.lanes.set_graph_priority(least)
        else:
            if config.sm_count is not None:
                raise WorkbenchError(
                    f"sm_count={config.sm_count} partitions a GPU's SMs, but {model} runs on the {executor.device}.",
                    expected="sm_count=None for a CPU executor, or a GPU executor (torch, trt)",
                )
            self.lanes = SlotThreadLanes(executor, config.lanes, config.depth, sizes, seed=seed)
        self.t0_host = self.lanes.start_clock()
        self.free: deque[tuple[int, int]] = deque(
            (lane, slot) for slot in range(config.depth) for lane in range(config.lanes)
        )
        self.inflight: dict[tuple[int, int], Any] = {}
        self.service_ms: dict[int, float] = {}
        self.closed = False

    # --- data in and out of a slot ------------------------------------------------------------------------------

    def _input_view(self, lane: int, slot: int, index: int) -> np.ndarray:
        slot_info = self.executor.inputs[index]
        flat = self.lanes.input_array(lane, slot, index)
        return flat[: self.max_batch * int(np.prod(slot_info.sample_shape, dtype=np.int64))].reshape(
            self.max_batch, *slot_info.sample_shape
        )

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
            view = self._input_view(lane, slot, index)
            view[row : row + array.shape[0]] = array.astype(view.dtype, copy=False)
            rows = array.shape[0]
        return rows

    def read_outputs(self, lane: int, slot: int, start: int, stop: int) -> list[np.ndarray]:
        if self.device != "cuda":
            return [self.lanes.output_rows(lane, slot, i, start, stop) for i in range(len(self.executor.outputs))]
        out = []
        for index, slot_info in enumerate(self.executor.outputs):
            flat = self.lanes.output_array(lane, slot, index)
            per = int(np.prod(slot_info.sample_shape, dtype=np.int64))
            out.append(np.array(flat[start * per : stop * per].reshape(stop - start, *slot_info.sample_shape)))
        return out

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
        if getattr(self, "background", False):
            self.lanes.set_graph_priority(self.stream_priority)
            self.background = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.lanes.close()
