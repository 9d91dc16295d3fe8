"""Lanes: where the pipeline's and the server's work runs. ``CudaLanes`` for GPU executors, ``ThreadLanes`` for the
CPU executor; :func:`make_lanes` picks one.

Both are :class:`Lanes`: ``submit(lane, slot, size)``, ``is_done``, ``wait`` (raises that slot's failure),
``spans_ms`` (h2d_start, h2d_end, compute_end, d2h_end, in ms since ``start_clock``), per-slot ``input_array`` and
``output_rows``, and ``close``.

CudaLanes: each lane has its own non-blocking stream (with a priority), its executor binding (device buffers bound
once), and per slot pinned host buffers plus four timing events. Several slots per lane keep several requests in
flight; completion is observed through the slot's last event (blocking-sync event, so waiting yields the CPU rather
than spinning). Everything CUDA comes from ``cuda.core`` with ``cuda.bindings`` for async copies; both are imported
lazily because CPU-only machines do not have them.
"""

from __future__ import annotations

import ctypes
import math
import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from workbench.errors import WorkbenchError
from workbench.timing.executors import TIMING_INT_RANGE, Executor, TensorSlot, random_feed

HARDWARE_QUEUES = 32


class Lanes(Protocol):
    """What the dispatcher (timing) and the engine manager (serving) drive: ``n_lanes`` x ``depth`` slots, each
    running one batch at a time. A slot's failure is raised by ``wait`` on that slot."""

    n_lanes: int
    depth: int

    def start_clock(self) -> float: ...
    def submit(self, lane: int, slot: int, size: int) -> None: ...
    def is_done(self, lane: int, slot: int) -> bool: ...
    def wait(self, lane: int, slot: int) -> None: ...
    def synchronize_lane(self, lane: int) -> None: ...
    def spans_ms(self, lane: int, slot: int) -> tuple[float, float, float, float]: ...
    def memory_info(self) -> tuple[int, int]: ...
    def input_array(self, lane: int, slot: int, index: int = 0) -> np.ndarray: ...
    def output_rows(self, lane: int, slot: int, index: int, start: int, stop: int) -> np.ndarray: ...
    def close(self) -> None: ...


def request_hardware_queues(n: int = HARDWARE_QUEUES) -> str:
    """Ask for ``n`` hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS) unless the user chose a value.

    Measured on the H200 (bench/results/pipeline_h200_*.md): with the default 8 queues, lanes beyond 4 added no
    throughput because each request's timing events and copies share queues with other lanes' work; with 32 the
    pipeline scaled like a minimal loop. The variable is read when the CUDA context is created, so this must run
    before the first CUDA call in the process; returns the value in effect (as far as we can tell).
    """
    return os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", str(int(n)))


def _check(result: Any, what: str) -> Any:
    """cuda.bindings calls return (CUresult, *values); raise on anything but success."""
    status = result[0] if isinstance(result, tuple) else result
    if int(status) != 0:
        raise WorkbenchError(f"CUDA call {what} failed with {status!r}.")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


def _sample_size(tensor: TensorSlot) -> int:
    return int(np.prod(tensor.sample_shape, dtype=np.int64))


class PinnedBuffer:
    """Page-locked host memory from cuda.core's pinned memory resource, viewed as a numpy array."""

    def __init__(self, nbytes: int) -> None:
        from cuda.core import LegacyPinnedMemoryResource  # type: ignore[import-not-found]

        self.nbytes = max(int(nbytes), 1)
        self._buffer = LegacyPinnedMemoryResource().allocate(self.nbytes)
        self.pointer = int(self._buffer.handle)
        self.array = np.frombuffer(
            memoryview((ctypes.c_byte * self.nbytes).from_address(self.pointer)).cast("B"), dtype=np.uint8
        )

    def close(self) -> None:
        self._buffer.close()


class CudaLanes:
    def __init__(
        self,
        executor: Executor,
        n_lanes: int,
        depth: int,
        batch_sizes: Sequence[int],
        priorities: Sequence[int] | None = None,
        seed: int = 0,
        spin_wait: bool = False,
        stage_events: bool = True,
        sm_count: int | None = None,
        sm_owner: str | None = None,
    ) -> None:
        request_hardware_queues()
        from cuda.bindings import driver  # type: ignore[import-not-found]
        from cuda.core import Device, EventOptions, StreamOptions  # type: ignore[import-not-found]

        self._driver = driver
        self.stage_events = bool(stage_events)
        self.n_lanes, self.depth = int(n_lanes), int(depth)
        self.device = Device()
        self.device.set_current()
        self.executor = executor
        max_batch = self.max_batch = max(batch_sizes)
        prios = list(priorities) if priorities is not None else [0] * self.n_lanes
        # sm_count: the lanes' streams live in a green context holding that many SMs (the rest stay free for others).
        self.partition: Any = None
        if sm_count is not None:
            from workbench.timing.green import SmPartition

            self.partition = SmPartition(sm_count, self.device.device_id, owner=sm_owner)
            self.streams: list[Any] = [self.partition.create_stream(prios[i % len(prios)]) for i in range(self.n_lanes)]
        else:
            self.streams = [
                self.device.create_stream(options=StreamOptions(nonblocking=True, priority=prios[i % len(prios)]))
                for i in range(self.n_lanes)
            ]
        self.sm_count = self.partition.sm_count if self.partition is not None else None
        self.stream_handles = [s.handle for s in self.streams]
        self.bindings = [executor.bind_lane(i, batch_sizes, self.streams[i]) for i in range(self.n_lanes)]
        timing = EventOptions(timing_enabled=True)
        # Blocking-sync events let the waiting host thread sleep; spin_wait (trtexec 11's default) trades a busy
        # core for a faster wake-up.
        waitable = EventOptions(timing_enabled=True, blocking_sync=not spin_wait)
        self._events = [
            [
                [
                    self.device.create_event(timing),
                    self.device.create_event(timing),
                    self.device.create_event(timing),
                    self.device.create_event(waitable),
                ]
                for _ in range(self.depth)
            ]
            for _ in range(self.n_lanes)
        ]
        rng = np.random.default_rng(seed)
        self._host_in: list[list[list[PinnedBuffer]]] = []
        self._host_out: list[list[list[PinnedBuffer]]] = []
        for _ in range(self.n_lanes):
            lane_in, lane_out = [], []
            for _ in range(self.depth):
                ins = [PinnedBuffer(t.nbytes(max_batch)) for t in executor.inputs]
                for buf, t in zip(ins, executor.inputs):  # non-zero data, written once
                    view = buf.array.view(t.dtype)
                    view[:] = (
                        rng.integers(*TIMING_INT_RANGE, size=view.size)
                        if np.issubdtype(t.dtype, np.integer)
                        else rng.standard_normal(view.size)
                    ).astype(t.dtype)
                lane_in.append(ins)
                lane_out.append([PinnedBuffer(t.nbytes(max_batch)) for t in executor.outputs])
            self._host_in.append(lane_in)
            self._host_out.append(lane_out)
        self._sizes_nbytes = {
            s: ([t.nbytes(s) for t in executor.inputs], [t.nbytes(s) for t in executor.outputs]) for s in batch_sizes
        }
        self._ptrs = [{s: (b.input_pointers(s), b.output_pointers(s)) for s in batch_sizes} for b in self.bindings]
        self._t0 = self.device.create_event(timing)
        # Raw handles for the hot path: one driver call per operation, no wrapper checks per request.
        self._event_handles = [[[e.handle for e in slot] for slot in lane] for lane in self._events]
        self._record = driver.cuEventRecord
        self._h2d = driver.cuMemcpyHtoDAsync
        self._d2h = driver.cuMemcpyDtoHAsync
        self._host_in_ptrs = [[[b.pointer for b in slot] for slot in lane] for lane in self._host_in]
        self._host_out_ptrs = [[[b.pointer for b in slot] for slot in lane] for lane in self._host_out]
        self.device.sync()

    def set_graph_priority(self, priority: int) -> bool:
        """Run the lanes' CUDA graphs at ``priority`` from now on (re-instantiated and uploaded); False when the
        executor has no graphs whose priority can be set (eager work follows the streams' own priority)."""
        changed = False
        for binding in self.bindings:
            use_priority = getattr(binding, "use_priority", None)
            if use_priority is not None and getattr(binding, "graphs", None):
                use_priority(int(priority), upload=True)
                changed = True
        return changed

    def memory_info(self) -> tuple[int, int]:
        free, total = _check(self._driver.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def start_clock(self) -> float:
        """Record the t=0 event on an idle device and return the host time it corresponds to."""
        self.device.sync()
        host = time.perf_counter()
        self.streams[0].record(self._t0)
        self._t0.sync()
        return host

    def submit(self, lane: int, slot: int, size: int) -> None:
        # Return codes of these async calls are not checked per request (cost); errors surface at the next
        # event wait / elapsed-time read, which are checked.
        record = self._record
        handle = self.stream_handles[lane]
        ev = self._event_handles[lane][slot]
        dev_in, dev_out = self._ptrs[lane][size]
        in_bytes, out_bytes = self._sizes_nbytes[size]
        record(ev[0], handle)
        for dst, host, nbytes in zip(dev_in, self._host_in_ptrs[lane][slot], in_bytes):
            self._h2d(dst, host, nbytes, handle)
        if self.stage_events:
            record(ev[1], handle)
        self.bindings[lane].enqueue(size, self.streams[lane])
        if self.stage_events:
            record(ev[2], handle)
        for src, host, nbytes in zip(dev_out, self._host_out_ptrs[lane][slot], out_bytes):
            self._d2h(host, src, nbytes, handle)
        record(ev[3], handle)

    def is_done(self, lane: int, slot: int) -> bool:
        return bool(self._events[lane][slot][3].is_done)

    def wait(self, lane: int, slot: int) -> None:
        self._events[lane][slot][3].sync()

    def synchronize_lane(self, lane: int) -> None:
        self.streams[lane].sync()

    def spans_ms(self, lane: int, slot: int) -> tuple[float, float, float, float]:
        t0 = self._t0
        e = self._events[lane][slot]
        if not self.stage_events:  # only end-to-end device span known
            return (e[0] - t0, math.nan, math.nan, e[3] - t0)
        return (e[0] - t0, e[1] - t0, e[2] - t0, e[3] - t0)

    def output_array(self, lane: int, slot: int, index: int = 0) -> np.ndarray:
        return self._host_out[lane][slot][index].array.view(self.executor.outputs[index].dtype)

    def input_array(self, lane: int, slot: int, index: int = 0) -> np.ndarray:
        """The slot's pinned input ``index`` (max batch, batch-first): what the next ``submit`` of that slot copies to
        the GPU."""
        tensor = self.executor.inputs[index]
        flat = self._host_in[lane][slot][index].array.view(tensor.dtype)
        return flat[: self.max_batch * _sample_size(tensor)].reshape(self.max_batch, *tensor.sample_shape)

    def output_rows(self, lane: int, slot: int, index: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the slot's output ``index`` from its last completed batch (a copy)."""
        tensor = self.executor.outputs[index]
        per = _sample_size(tensor)
        flat = self.output_array(lane, slot, index)
        return np.array(flat[start * per : stop * per].reshape(stop - start, *tensor.sample_shape))

    def close(self) -> None:
        self.device.sync()
        for lane in self._host_in + self._host_out:
            for slot in lane:
                for buf in slot:
                    buf.close()
        self._host_in, self._host_out = [], []
        for s in self.streams:
            s.close()
        if self.partition is not None:
            self.partition.close()


class ThreadLanes:
    """CPU lanes: one worker thread per lane, each running its lane's ONNX Runtime session on the slot's own inputs
    (so serving requests can carry data) and keeping the slot's outputs; spans are host-clock ms since
    ``start_clock``. A failure belongs to its slot: ``wait`` on that slot raises it, other slots are unaffected."""

    def __init__(self, executor: Executor, n_lanes: int, depth: int, batch_sizes: Sequence[int], seed: int = 0) -> None:
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
        slots = [(lane, slot) for lane in range(self.n_lanes) for slot in range(self.depth)]
        self._inputs = {key: [feed[t.name].copy() for t in executor.inputs] for key in slots}
        self._outputs: dict[tuple[int, int], list[np.ndarray]] = {key: [] for key in slots}
        self._done = {key: threading.Event() for key in slots}
        for event in self._done.values():
            event.set()
        self._spans = dict.fromkeys(slots, (0.0, 0.0, 0.0, 0.0))
        self._errors: dict[tuple[int, int], BaseException] = {}
        self._queues: list[queue.SimpleQueue[tuple[int, int] | None]] = [
            queue.SimpleQueue() for _ in range(self.n_lanes)
        ]
        self._t0 = time.perf_counter()
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True, name=f"cpu-lane-{i}")
            for i in range(self.n_lanes)
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
            key = (lane, slot)
            start = time.perf_counter()
            try:
                feed = {name: array[:size] for name, array in zip(names, self._inputs[key])}
                self._outputs[key] = binding.run(feed)  # type: ignore[attr-defined]
            except BaseException as error:  # reported for this slot's batch by wait()
                self._errors[key] = error
            end = time.perf_counter()
            s, e = (start - self._t0) * 1e3, (end - self._t0) * 1e3
            self._spans[key] = (s, s, e, e)
            self._done[key].set()

    def memory_info(self) -> tuple[int, int]:
        return (0, 0)

    def start_clock(self) -> float:
        self._t0 = time.perf_counter()
        return self._t0

    def submit(self, lane: int, slot: int, size: int) -> None:
        self._errors.pop((lane, slot), None)
        self._done[(lane, slot)].clear()
        self._queues[lane].put((slot, size))

    def is_done(self, lane: int, slot: int) -> bool:
        return self._done[(lane, slot)].is_set()

    def wait(self, lane: int, slot: int) -> None:
        self._done[(lane, slot)].wait()
        error = self._errors.get((lane, slot))
        if error is not None:
            raise WorkbenchError(f"the CPU executor failed on lane {lane} slot {slot}: {error}") from error

    def synchronize_lane(self, lane: int) -> None:
        for slot in range(self.depth):
            self.wait(lane, slot)

    def spans_ms(self, lane: int, slot: int) -> tuple[float, float, float, float]:
        return self._spans[(lane, slot)]

    def input_array(self, lane: int, slot: int, index: int = 0) -> np.ndarray:
        """The slot's input ``index`` (max batch, batch-first): what the next ``submit`` of that slot runs on."""
        return self._inputs[(lane, slot)][index]

    def output_rows(self, lane: int, slot: int, index: int, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the slot's output ``index`` from its last completed batch (a copy)."""
        return np.array(self._outputs[(lane, slot)][index][start:stop])

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(timeout=10)


def make_lanes(
    executor: Executor, n_lanes: int, depth: int, batch_sizes: Sequence[int], seed: int = 0, **cuda_options: Any
) -> Lanes:
    """The lanes for ``executor``: :class:`CudaLanes` (``cuda_options`` are its keyword arguments: priorities,
    spin_wait, stage_events, sm_count, sm_owner) for a GPU executor, :class:`ThreadLanes` for the CPU one, which has
    no streams, events or SM partitions (asking for an SM partition there is refused; the rest does not apply)."""
    if executor.device == "cuda":
        return CudaLanes(executor, n_lanes, depth, batch_sizes, seed=seed, **cuda_options)
    sm_count = cuda_options.get("sm_count")
    if sm_count is not None:
        raise WorkbenchError(
            f"sm_count={sm_count} partitions a GPU's SMs, but the {executor.name} executor runs on the {executor.device}.",
            expected="sm_count=None for a CPU executor, or a GPU executor (torch, trt)",
        )
    return ThreadLanes(executor, n_lanes, depth, batch_sizes, seed=seed)
