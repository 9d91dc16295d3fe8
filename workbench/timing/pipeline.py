"""The dispatcher: one host thread feeding N lanes under closed-loop, open-loop or synchronous load.

Slots are used round-robin across lanes (lane 0 slot 0, lane 1 slot 0, ..., lane 0 slot 1, ...), so the next slot
is always the oldest in flight; when it is still busy the dispatcher waits on its completion event (a blocking-sync
event: the thread sleeps, it does not spin). Host clocks time only the enqueue calls; everything else comes from
the lanes' events. Warm-up is discarded; measurement windows repeat until the last three agree within 10 % or ten
windows have run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from workbench.errors import WorkbenchError
from workbench.timing import stats
from workbench.timing.batcher import DynamicBatcher, Request, poisson_arrivals
from workbench.timing.executors import Executor
from workbench.timing.nvml import NvmlSampler
from workbench.timing.result import BatchRecord, TimingResult, summarize_records

LOADS = ("closed", "open", "sync")


@dataclass
class RunConfig:
    streams: int = 1
    batch: int = 1  # samples per request
    depth: int = 2  # requests in flight per lane
    load: str = "closed"
    rate_per_s: float | None = None  # open loop: requests per second
    dynamic_batching: bool = False
    max_batch: int = 8
    max_queue_delay_ms: float = 0.0
    timeout_ms: float | None = None
    warmup_s: float = 0.2
    window_s: float = 0.5
    min_windows: int = 3
    max_windows: int = 10
    stream_priorities: tuple[int, ...] | None = None
    stage_events: bool = True  # False: 2 events per request (end to end only), no H2D/compute/D2H split
    spin_wait: bool = False  # True: busy-wait on completion events (faster wake-up, one core spinning)
    idle_poll_s: float = 50e-6  # open loop: longest sleep while waiting for the next arrival
    seed: int = 0

    def validate(self) -> None:
        if self.load not in LOADS:
            raise WorkbenchError(f"load mode {self.load!r} is unknown.", expected=" | ".join(LOADS))
        if not 1 <= self.streams <= 64:
            raise WorkbenchError(f"streams={self.streams} is out of range.", expected="1..64 lanes")
        if self.batch < 1 or self.depth < 1:
            raise WorkbenchError(f"batch={self.batch}, depth={self.depth}: both must be >= 1.")
        if self.load == "open" and not self.rate_per_s:
            raise WorkbenchError("open-loop load needs a rate.", expected="rate_per_s > 0 (CLI: --rate)")
        if self.dynamic_batching and self.batch > self.max_batch:
            raise WorkbenchError(f"batch={self.batch} exceeds the batcher's max_batch={self.max_batch}.")
        if self.window_s <= 0 or self.max_windows < 1:
            raise WorkbenchError("window_s must be > 0 and max_windows >= 1.")

    def batch_sizes(self) -> list[int]:
        """Batch sizes the executor prepares (one CUDA graph each): the request size, or powers of two up to max."""
        if not self.dynamic_batching:
            return [self.batch]
        sizes = {self.max_batch}
        s = 1
        while s < self.max_batch:
            sizes.add(s)
            s *= 2
        return sorted(x for x in sizes if x >= self.batch) or [self.max_batch]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def make_lanes(executor: Executor, config: RunConfig) -> Any:
    n_lanes = 1 if config.load == "sync" else config.streams
    depth = 1 if config.load == "sync" else config.depth
    if executor.device == "cuda":
        from workbench.timing.lanes import CudaLanes

        return CudaLanes(
            executor,
            n_lanes,
            depth,
            config.batch_sizes(),
            config.stream_priorities,
            config.seed,
            spin_wait=config.spin_wait,
            stage_events=config.stage_events,
        )
    from workbench.timing.lanes import ThreadLanes

    return ThreadLanes(executor, n_lanes, depth, config.batch_sizes())


def run_pipeline(
    executor: Executor,
    config: RunConfig,
    *,
    model: str = "",
    on_complete: Callable[[BatchRecord], None] | None = None,
    lanes: Any = None,
) -> TimingResult:
    """Run one configuration and return its TimingResult (records included for timelines and traces)."""
    config.validate()
    own_lanes = lanes is None
    lanes = lanes or make_lanes(executor, config)
    sampler = NvmlSampler() if executor.device == "cuda" else None
    try:
        records, t_start, t_stop, host_windows, notes, expired = _dispatch(lanes, config, on_complete, sampler)
    finally:
        if own_lanes:
            lanes.close()
    if t_stop <= t_start:
        raise WorkbenchError(
            "the run ended before its warm-up did; nothing was measured.",
            expected="a longer run (raise window_s or lower warmup_s)",
        )
    summary = summarize_records(records, t_start, t_stop)
    n_windows = max(len(host_windows), 1)
    window_ms = (t_stop - t_start) / n_windows
    completions = [r.d2h_end_ms for r in records for _ in range(r.size)]
    windows = [w * 1e3 for w in stats.window_throughputs(completions, t_start, window_ms, n_windows)]
    stable = stats.is_stable(windows) if n_windows >= 3 else False
    if not stable:
        notes.append(f"throughput did not settle within +-10 % over the last 3 of {n_windows} windows")
    for q, ok in summary["latency_reliable"].items():
        if not ok:
            notes.append(
                f"{q} rests on {summary['n_requests']} samples (< {stats.min_samples_for(float(q[1:]))}); "
                "its value is reported with a wide interval"
            )
    little = summary["littles_law"]
    if config.load == "closed":  # requests the closed loop keeps outstanding, for comparison with the measured L
        little["configured_in_flight"] = lanes.n_lanes * lanes.depth
    if not little["ok"]:
        notes.append(
            f"Little's law check off by {little['relative_error']:.0%} (throughput x latency "
            f"{little['predicted_in_flight']:.2f} vs {little['measured_in_flight']:.2f} in flight)"
        )
    enqueue_ms = summary["stages_ms"].get("enqueue", math.nan)
    compute_ms = summary["stages_ms"].get("compute", math.nan)
    if enqueue_ms > 0.8 * compute_ms:
        notes.append("host enqueue time exceeds 80 % of GPU compute time: the host thread is the bottleneck")
    if executor.device == "cuda":
        import os

        queues = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8 (default)")
        notes.append(f"CUDA_DEVICE_MAX_CONNECTIONS={queues}")
        if lanes.n_lanes > 8 and queues.startswith("8"):
            notes.append("more lanes than hardware queues: lanes share queues and may serialize")
    if sampler is not None and not sampler.available:
        notes.append(sampler.reason)
    timeouts = {"expired": expired, "late": sum(r.late for r in records if r.measured)}
    graph = executor.graph_status()
    return TimingResult(
        executor=executor.name,
        executor_label=executor.label(),
        model=model,
        streams=lanes.n_lanes,
        depth=lanes.depth,
        batch=config.batch,
        load=config.load,
        cuda_graph=graph,
        dynamic_batching=(
            {"max_batch": config.max_batch, "max_queue_delay_ms": config.max_queue_delay_ms}
            if config.dynamic_batching
            else None
        ),
        rate_per_s=config.rate_per_s if config.load == "open" else None,
        throughput_per_s=summary["throughput_per_s"],
        requests_per_s=summary["requests_per_s"],
        latency_ms=summary["latency_ms"],
        latency_ci_ms=summary["latency_ci_ms"],
        latency_reliable=summary["latency_reliable"],
        stages_ms=summary["stages_ms"],
        enqueue_us_p50=summary["enqueue_us_p50"],
        busy_fraction=summary["busy_fraction"],
        compute_overlap=summary["compute_overlap"],
        n_requests=summary["n_requests"],
        n_batches=summary["n_batches"],
        window_s=window_ms / 1e3,
        window_throughputs=windows,
        stable=stable,
        warmup_ms=t_start,
        span_ms=t_stop - t_start,
        littles_law=little,
        timeouts=timeouts,
        mean_padded_fraction=summary["mean_padded_fraction"],
        device=getattr(sampler, "name", "") if sampler is not None and sampler.available else executor.device,
        clocks=sampler.samples if sampler is not None else [],
        notes=notes,
        records=records,
        latencies_ms=summary["latencies_ms"],
    )


def _dispatch(
    lanes: Any, config: RunConfig, on_complete: Callable[[BatchRecord], None] | None, sampler: NvmlSampler | None
) -> tuple[list[BatchRecord], float, float, list[float], list[str], int]:
    clock = time.perf_counter
    notes: list[str] = []
    sizes = config.batch_sizes()
    sync = config.load == "sync"
    open_loop = config.load == "open"
    keys = [(lane, slot) for slot in range(lanes.depth) for lane in range(lanes.n_lanes)]
    n_keys = len(keys)
    inflight: dict[tuple[int, int], BatchRecord] = {}
    records: list[BatchRecord] = []
    timeout_ms = config.timeout_ms
    batcher = DynamicBatcher(
        config.max_batch if config.dynamic_batching else config.batch,
        config.max_queue_delay_ms / 1e3 if config.dynamic_batching else 0.0,
        None if timeout_ms is None else timeout_ms / 1e3,
    )
    arrivals = poisson_arrivals(config.rate_per_s, seed=config.seed) if open_loop and config.rate_per_s else None
    next_arrival = next(arrivals) if arrivals is not None else math.inf
    request_id = 0
    expired = 0

    warm_end_ms = config.warmup_s * 1e3
    window_ms = config.window_s * 1e3
    host_windows: list[float] = []
    window_count = 0
    measured_requests = 0
    stop_ms = math.inf
    need = stats.min_samples_for(99.0)

    def pad(size: int) -> int:
        for s in sizes:
            if s >= size:
                return s
        return sizes[-1]

    def reap(key: tuple[int, int]) -> None:
        nonlocal window_count
        rec = inflight.pop(key)
        rec.h2d_start_ms, rec.h2d_end_ms, rec.compute_end_ms, rec.d2h_end_ms = lanes.spans_ms(*key)
        if timeout_ms is not None:
            rec.late = sum(1 for a in rec.arrivals_ms if rec.d2h_end_ms - a > timeout_ms)
        if rec.d2h_end_ms >= warm_end_ms:
            window_count += rec.size
        records.append(rec)
        if on_complete is not None:
            on_complete(rec)

    t0 = lanes.start_clock()
    if sampler is not None:
        sampler.sample("start")
    next_window_ms = warm_end_ms + window_ms
    i = 0
    while True:
        now_ms = (clock() - t0) * 1e3
        if now_ms >= next_window_ms and stop_ms == math.inf:
            host_windows.append(window_count / config.window_s)
            window_count = 0
            next_window_ms += window_ms
            if sampler is not None:
                sampler.sample(f"window {len(host_windows)}")
            enough = measured_requests >= need or len(host_windows) >= config.max_windows
            if len(host_windows) >= config.max_windows or (
                len(host_windows) >= config.min_windows and stats.is_stable(host_windows) and enough
            ):
                stop_ms = now_ms
        if stop_ms != math.inf and not (open_loop and len(batcher)):
            break
        key = keys[i % n_keys]
        if key in inflight:
            # The next slot round-robin is the oldest in flight: wait for it (sleeping on its event).
            lanes.wait(*key)
            reap(key)
        if open_loop:
            now_ms = (clock() - t0) * 1e3
            # Admit every request that has arrived by now; arrival times are fixed in advance, so waiting
            # below never hides queueing delay.
            while next_arrival * 1e3 <= now_ms and stop_ms == math.inf:
                batcher.offer(Request(request_id, next_arrival, config.batch))
                request_id += 1
                next_arrival = next(arrivals)  # type: ignore[arg-type]
            batch = batcher.poll(now_ms / 1e3)
            expired += len(batcher.take_expired())
            if not batch:
                # Idle: deliver finished work, then sleep until the next arrival or batch deadline.
                for k in list(inflight):
                    if lanes.is_done(*k):
                        reap(k)
                deadline = batcher.deadline_s()
                wake_ms = min(next_arrival, deadline if deadline is not None else math.inf) * 1e3
                gap_s = (wake_ms - (clock() - t0) * 1e3) / 1e3
                if gap_s > 0:
                    time.sleep(min(gap_s, config.idle_poll_s))
                continue
            arrivals_ms = [r.arrival_s * 1e3 for r in batch]
            samples = [r.samples for r in batch]
        else:
            arrivals_ms = []
            samples = [config.batch]
        size = sum(samples)
        t_dispatch = (clock() - t0) * 1e3
        if not open_loop:
            arrivals_ms = [t_dispatch]
        padded = pad(size)
        lanes.submit(key[0], key[1], padded)
        t_enqueued = (clock() - t0) * 1e3
        measured = warm_end_ms <= t_dispatch and stop_ms == math.inf
        if measured:
            measured_requests += len(arrivals_ms)
        inflight[key] = BatchRecord(
            key[0], key[1], size, padded, arrivals_ms, samples, t_dispatch, t_enqueued, measured=measured
        )
        if sync:
            lanes.synchronize_lane(key[0])  # the seed-style loop: copy, execute, synchronize, copy
        i += 1
    for key in sorted(inflight, key=lambda k: inflight[k].dispatch_ms):
        lanes.wait(*key)
        reap(key)
    if sampler is not None:
        sampler.sample("end")
    if expired:
        notes.append(f"{expired} request(s) expired in the queue (timeout {timeout_ms} ms) and were never run")
    records.sort(key=lambda r: r.dispatch_ms)
    end_ms = stop_ms if stop_ms != math.inf else (clock() - t0) * 1e3
    return records, warm_end_ms, end_ms, host_windows, notes, expired


def measure_compute_limit(executor: Executor, batch: int, iterations: int = 200, warmup: int = 20) -> dict[str, Any]:
    """GPU-bound limit: back-to-back enqueues on one stream, no copies, timed by two events around them."""
    if executor.device != "cuda":
        raise WorkbenchError("the GPU-bound limit needs a GPU executor.", expected="--executor torch or trt")
    from cuda.core import Device, EventOptions  # type: ignore[import-not-found]

    device = Device()
    device.set_current()
    stream = device.create_stream()
    binding = executor.bind_lane(0, [batch], stream)
    for _ in range(warmup):
        binding.enqueue(batch, stream)
    opts = EventOptions(timing_enabled=True)
    start, end = device.create_event(opts), device.create_event(opts)
    stream.record(start)
    host0 = time.perf_counter()
    for _ in range(iterations):
        binding.enqueue(batch, stream)
    host1 = time.perf_counter()
    stream.record(end)
    end.sync()
    elapsed_ms = end - start
    stream.close()
    return {
        "kind": "gpu_limit",
        "batch": batch,
        "iterations": iterations,
        "elapsed_ms": elapsed_ms,
        "throughput_per_s": iterations * batch / elapsed_ms * 1e3,
        "per_enqueue_ms": elapsed_ms / iterations,
        "host_enqueue_us_mean": (host1 - host0) / iterations * 1e6,
    }


def sweep(
    executor: Executor,
    base: RunConfig,
    streams: Sequence[int],
    batches: Sequence[int],
    *,
    model: str = "",
    memory_fraction: float = 0.9,
    free_bytes: Callable[[], int] | None = None,
) -> tuple[list[TimingResult], list[dict[str, Any]]]:
    """Run every streams x batch configuration; skip (and say why) those that would not fit in device memory.

    An executor that can estimate its per-lane memory (``estimate_new_lane_bytes``) is checked against the free
    device memory (``free_bytes``, default: cuMemGetInfo) before each configuration.
    """
    results: list[TimingResult] = []
    skipped: list[dict[str, Any]] = []
    for b in batches:
        for n in streams:
            config = RunConfig(**{**base.to_json(), "streams": int(n), "batch": int(b)})
            fits, why = _fits_in_memory(executor, config, memory_fraction, free_bytes)
            if not fits:
                skipped.append({"streams": n, "batch": b, "reason": why})
                continue
            results.append(run_pipeline(executor, config, model=model))
    return results, skipped


def _device_free_bytes() -> int:
    from cuda.bindings import driver  # type: ignore[import-not-found]

    status, free, _total = driver.cuMemGetInfo()
    return int(free) if int(status) == 0 else -1


def _fits_in_memory(
    executor: Executor, config: RunConfig, fraction: float, free_bytes: Callable[[], int] | None = None
) -> tuple[bool, str]:
    estimate = getattr(executor, "estimate_new_lane_bytes", None)
    if estimate is None:
        return True, ""
    need = int(estimate(config.streams, config.batch_sizes()))
    free = (free_bytes or _device_free_bytes)()
    if free < 0:
        return True, ""
    if need > fraction * free:
        return False, (
            f"needs ~{need / 2**20:.0f} MiB more device memory for {config.streams} lanes at batch "
            f"{config.batch}; {free / 2**20:.0f} MiB free"
        )
    return True, ""
