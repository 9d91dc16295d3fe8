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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.artifact import Artifact
from workbench.errors import WorkbenchError
from workbench.timing import stats
from workbench.timing.batcher import DynamicBatcher, Request, poisson_arrivals
from workbench.timing.executors import Executor
from workbench.timing.lanes import Lanes, make_lanes
from workbench.timing.limits import MAX_REQUEST_BATCH, check_streams
from workbench.timing.nvml import NvmlSampler
from workbench.timing.result import BatchRecord, TimingResult, summarize_records

LOADS = ("closed", "open", "sync")


@dataclass(frozen=True)
class RunConfig(Artifact):
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
        check_streams(self.streams)
        if not 1 <= self.batch <= MAX_REQUEST_BATCH or self.depth < 1:
            raise WorkbenchError(
                f"batch={self.batch}, depth={self.depth}: out of range.",
                expected=f"batch 1..{MAX_REQUEST_BATCH}, depth >= 1",
            )
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


def lanes_for(executor: Executor, config: RunConfig) -> Lanes:
    """The lanes a run of ``config`` needs (the synchronous baseline: one lane, one slot)."""
    sync = config.load == "sync"
    return make_lanes(
        executor,
        1 if sync else config.streams,
        1 if sync else config.depth,
        config.batch_sizes(),
        priorities=config.stream_priorities,
        seed=config.seed,
        spin_wait=config.spin_wait,
        stage_events=config.stage_events,
    )


@dataclass(frozen=True)
class DispatchOutcome:
    """What the dispatcher hands back: every completed batch and the steady-state window it measured."""

    records: tuple[BatchRecord, ...]  # sorted by dispatch time
    start_ms: float  # end of the warm-up: the measured window starts here
    stop_ms: float  # when measurement stopped (or the run ended)
    host_windows: tuple[float, ...]  # samples per second completed in each host-clock window
    notes: tuple[str, ...]
    expired: int  # requests that timed out in the queue and never ran


def run_pipeline(
    executor: Executor,
    config: RunConfig,
    *,
    model: str = "",
    on_complete: Callable[[BatchRecord], None] | None = None,
    lanes: Lanes | None = None,
) -> TimingResult:
    """Run one configuration and return its TimingResult (records included for timelines and traces)."""
    config.validate()
    own_lanes = lanes is None
    lanes = lanes or lanes_for(executor, config)
    sampler = NvmlSampler() if executor.device == "cuda" else None
    try:
        outcome = _Dispatcher(lanes, config, on_complete, sampler).run()
    finally:
        if own_lanes:
            lanes.close()
    if outcome.stop_ms <= outcome.start_ms:
        raise WorkbenchError(
            "the run ended before its warm-up did; nothing was measured.",
            expected="a longer run (raise window_s or lower warmup_s)",
        )
    records = outcome.records
    summary = summarize_records(list(records), outcome.start_ms, outcome.stop_ms)
    n_windows = max(len(outcome.host_windows), 1)
    window_ms = (outcome.stop_ms - outcome.start_ms) / n_windows
    completions = [r.d2h_end_ms for r in records for _ in range(r.size)]
    windows = [w * 1e3 for w in stats.window_throughputs(completions, outcome.start_ms, window_ms, n_windows)]
    stable = stats.is_stable(windows) if n_windows >= 3 else False
    little = summary["littles_law"]
    if config.load == "closed":  # requests the closed loop keeps outstanding, for comparison with the measured L
        little = replace(little, configured_in_flight=lanes.n_lanes * lanes.depth)
    notes = list(outcome.notes) + _result_notes(summary, little, n_windows, stable, executor, lanes, sampler)
    return TimingResult(
        executor=executor.name,
        executor_label=executor.label(),
        model=model,
        streams=lanes.n_lanes,
        depth=lanes.depth,
        batch=config.batch,
        load=config.load,
        cuda_graph=executor.graph_status(),
        dynamic_batching=(
            {"max_batch": config.max_batch, "max_queue_delay_ms": config.max_queue_delay_ms}
            if config.dynamic_batching
            else None
        ),
        rate_per_s=config.rate_per_s if config.load == "open" else None,
        throughput_per_s=summary["throughput_per_s"],
        throughput_ci_per_s=summary["throughput_ci_per_s"],
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
        window_throughputs=tuple(windows),
        stable=stable,
        warmup_ms=outcome.start_ms,
        span_ms=outcome.stop_ms - outcome.start_ms,
        littles_law=little,
        timeouts={"expired": outcome.expired, "late": sum(r.late for r in records if r.measured)},
        mean_padded_fraction=summary["mean_padded_fraction"],
        device=getattr(sampler, "name", "") if sampler is not None and sampler.available else executor.device,
        clocks=tuple(sampler.samples) if sampler is not None else (),
        notes=tuple(notes),
        records=records,
        latencies_ms=tuple(summary["latencies_ms"]),
    )


def _result_notes(
    summary: dict[str, Any],
    little: stats.LittleCheck,
    n_windows: int,
    stable: bool,
    executor: Executor,
    lanes: Lanes,
    sampler: NvmlSampler | None,
) -> list[str]:
    """What a reader should know before trusting the numbers: stability, sample sizes, Little's law, host limits."""
    notes = []
    if not stable:
        notes.append(f"throughput did not settle within +-10 % over the last 3 of {n_windows} windows")
    for q, ok in summary["latency_reliable"].items():
        if not ok:
            notes.append(
                f"{q} rests on {summary['n_requests']} samples (< {stats.min_samples_for(float(q[1:]))}); "
                "its value is reported with a wide interval"
            )
    if not little.ok:
        notes.append(
            f"Little's law check off by {little.relative_error:.0%} (throughput x latency "
            f"{little.predicted_in_flight:.2f} vs {little.measured_in_flight:.2f} in flight)"
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
    return notes


@dataclass
class _Dispatcher:
    """One run's dispatch loop and its state (mutable on purpose: the loop's bookkeeping, never returned).

    Slots are used round-robin; work goes to the next slot once its previous batch is reaped. Host windows count
    samples completed after the warm-up; measurement stops once enough windows agree (or ``max_windows`` ran).
    """

    lanes: Lanes
    config: RunConfig
    on_complete: Callable[[BatchRecord], None] | None
    sampler: NvmlSampler | None
    inflight: dict[tuple[int, int], BatchRecord] = field(default_factory=dict)
    records: list[BatchRecord] = field(default_factory=list)
    host_windows: list[float] = field(default_factory=list)
    window_count: int = 0  # samples completed in the current host window (after the warm-up)
    measured_requests: int = 0
    stop_ms: float = math.inf
    expired: int = 0
    request_id: int = 0

    def __post_init__(self) -> None:
        config = self.config
        self.sizes = config.batch_sizes()
        self.open_loop = config.load == "open"
        self.keys = [(lane, slot) for slot in range(self.lanes.depth) for lane in range(self.lanes.n_lanes)]
        self.batcher = DynamicBatcher(
            config.max_batch if config.dynamic_batching else config.batch,
            config.max_queue_delay_ms / 1e3 if config.dynamic_batching else 0.0,
            None if config.timeout_ms is None else config.timeout_ms / 1e3,
        )
        self.arrivals = (
            poisson_arrivals(config.rate_per_s, seed=config.seed) if self.open_loop and config.rate_per_s else None
        )
        self.next_arrival = next(self.arrivals) if self.arrivals is not None else math.inf
        self.warm_end_ms = config.warmup_s * 1e3
        self.window_ms = config.window_s * 1e3
        self.next_window_ms = self.warm_end_ms + self.window_ms
        self.need = stats.min_samples_for(99.0)

    def now_ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def pad(self, size: int) -> int:
        """The prepared batch size that runs ``size`` samples."""
        for s in self.sizes:
            if s >= size:
                return s
        return self.sizes[-1]

    def reap(self, key: tuple[int, int]) -> None:
        """Complete the batch in slot ``key`` with the lane's device timestamps."""
        started = self.inflight.pop(key)
        h2d_start, h2d_end, compute_end, d2h_end = self.lanes.spans_ms(*key)
        timeout_ms = self.config.timeout_ms
        late = sum(1 for a in started.arrivals_ms if d2h_end - a > timeout_ms) if timeout_ms is not None else 0
        record = replace(
            started,
            h2d_start_ms=h2d_start,
            h2d_end_ms=h2d_end,
            compute_end_ms=compute_end,
            d2h_end_ms=d2h_end,
            late=late,
        )
        if record.d2h_end_ms >= self.warm_end_ms:
            self.window_count += record.size
        self.records.append(record)
        if self.on_complete is not None:
            self.on_complete(record)

    def close_window_if_due(self, now_ms: float) -> None:
        """At a window boundary: record its throughput and decide whether measurement can stop."""
        if now_ms < self.next_window_ms or self.stop_ms != math.inf:
            return
        config = self.config
        self.host_windows.append(self.window_count / config.window_s)
        self.window_count = 0
        self.next_window_ms += self.window_ms
        if self.sampler is not None:
            self.sampler.sample(f"window {len(self.host_windows)}")
        done = len(self.host_windows)
        enough = self.measured_requests >= self.need or done >= config.max_windows
        if done >= config.max_windows or (done >= config.min_windows and stats.is_stable(self.host_windows) and enough):
            self.stop_ms = now_ms

    def next_open_loop_batch(self) -> tuple[list[float], list[int]] | None:
        """Admit every request that has arrived by now and poll the batcher; None when there is nothing to run
        yet (finished work is reaped and the thread sleeps until the next arrival or batch deadline)."""
        now_ms = self.now_ms()
        # Arrival times are fixed in advance, so waiting below never hides queueing delay.
        while self.next_arrival * 1e3 <= now_ms and self.stop_ms == math.inf:
            self.batcher.offer(Request(self.request_id, self.next_arrival, self.config.batch))
            self.request_id += 1
            self.next_arrival = next(self.arrivals)  # type: ignore[arg-type]
        batch = self.batcher.poll(now_ms / 1e3)
        self.expired += len(self.batcher.take_expired())
        if batch:
            return [r.arrival_s * 1e3 for r in batch], [r.samples for r in batch]
        for key in list(self.inflight):
            if self.lanes.is_done(*key):
                self.lanes.wait(*key)  # returns at once; raises the slot's failure
                self.reap(key)
        deadline = self.batcher.deadline_s()
        wake_ms = min(self.next_arrival, deadline if deadline is not None else math.inf) * 1e3
        gap_s = (wake_ms - self.now_ms()) / 1e3
        if gap_s > 0:
            time.sleep(min(gap_s, self.config.idle_poll_s))
        return None

    def submit(self, key: tuple[int, int], arrivals_ms: list[float], samples: list[int]) -> None:
        size = sum(samples)
        t_dispatch = self.now_ms()
        if not self.open_loop:
            arrivals_ms = [t_dispatch]
        padded = self.pad(size)
        self.lanes.submit(key[0], key[1], padded)
        t_enqueued = self.now_ms()
        measured = self.warm_end_ms <= t_dispatch and self.stop_ms == math.inf
        if measured:
            self.measured_requests += len(arrivals_ms)
        self.inflight[key] = BatchRecord(
            key[0], key[1], size, padded, tuple(arrivals_ms), tuple(samples), t_dispatch, t_enqueued, measured=measured
        )
        if self.config.load == "sync":
            self.lanes.synchronize_lane(key[0])  # the seed-style loop: copy, execute, synchronize, copy

    def run(self) -> DispatchOutcome:
        self.t0 = self.lanes.start_clock()
        if self.sampler is not None:
            self.sampler.sample("start")
        i = 0
        while True:
            self.close_window_if_due(self.now_ms())
            if self.stop_ms != math.inf and not (self.open_loop and len(self.batcher)):
                break
            key = self.keys[i % len(self.keys)]
            if key in self.inflight:
                # The next slot round-robin is the oldest in flight: wait for it (sleeping on its event).
                self.lanes.wait(*key)
                self.reap(key)
            if self.open_loop:
                work = self.next_open_loop_batch()
                if work is None:
                    continue
                arrivals_ms, samples = work
            else:
                arrivals_ms, samples = [], [self.config.batch]
            self.submit(key, arrivals_ms, samples)
            i += 1
        for key in sorted(self.inflight, key=lambda k: self.inflight[k].dispatch_ms):
            self.lanes.wait(*key)
            self.reap(key)
        if self.sampler is not None:
            self.sampler.sample("end")
        notes = []
        if self.expired:
            notes.append(
                f"{self.expired} request(s) expired in the queue (timeout {self.config.timeout_ms} ms) and were never run"
            )
        self.records.sort(key=lambda r: r.dispatch_ms)
        end_ms = self.stop_ms if self.stop_ms != math.inf else self.now_ms()
        return DispatchOutcome(
            tuple(self.records), self.warm_end_ms, end_ms, tuple(self.host_windows), tuple(notes), self.expired
        )


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
