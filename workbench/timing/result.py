"""Records the dispatcher keeps and the TimingResult computed from them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.artifact import NOT_SERIALIZED, Artifact, JsonObject
from workbench.timing import stats

STAGES = ("queue", "enqueue", "wait", "h2d", "compute", "d2h")


@dataclass(frozen=True)
class BatchRecord(Artifact):
    """One dispatched unit of work (a batch of one or more requests). Times are ms since the run's t=0.

    Host clock: ``arrivals_ms`` (per request), ``dispatch_ms`` and ``enqueue_end_ms`` (around the enqueue calls).
    Device clock (CUDA events; host clock on the CPU executor): ``h2d_start_ms`` .. ``d2h_end_ms``.
    """

    lane: int
    slot: int
    size: int  # samples actually requested
    padded_size: int  # size the executor ran (>= size when padded to a prepared batch size)
    arrivals_ms: tuple[float, ...]
    request_samples: tuple[int, ...]
    dispatch_ms: float
    enqueue_end_ms: float = math.nan
    h2d_start_ms: float = math.nan
    h2d_end_ms: float = math.nan
    compute_end_ms: float = math.nan
    d2h_end_ms: float = math.nan
    measured: bool = False
    late: int = 0  # requests of this batch that completed after their timeout

    def stage_ms(self) -> dict[str, float]:
        return {
            "enqueue": self.enqueue_end_ms - self.dispatch_ms,
            "wait": max(self.h2d_start_ms - self.dispatch_ms, 0.0),
            "h2d": self.h2d_end_ms - self.h2d_start_ms,
            "compute": self.compute_end_ms - self.h2d_end_ms,
            "d2h": self.d2h_end_ms - self.compute_end_ms,
        }


@dataclass(frozen=True)
class TimingResult(Artifact):
    """One timed configuration: throughput, latency percentiles with intervals, stage medians and checks.

    ``records`` (every batch, for timelines and traces) and ``latencies_ms`` stay in memory; the JSON carries
    ``records`` only when asked (``to_json(include_records=True)``).
    """

    executor: str
    executor_label: str
    model: str
    streams: int
    depth: int
    batch: int
    load: str  # "closed" | "open" | "sync"
    cuda_graph: dict[str, Any]
    dynamic_batching: dict[str, Any] | None
    rate_per_s: float | None
    throughput_per_s: float  # samples (images) per second
    requests_per_s: float
    latency_ms: dict[str, float]
    latency_ci_ms: dict[str, tuple[float, float]]
    latency_reliable: dict[str, bool]
    stages_ms: dict[str, float]  # medians
    enqueue_us_p50: float
    busy_fraction: float
    compute_overlap: float
    n_requests: int
    n_batches: int
    window_s: float
    window_throughputs: tuple[float, ...]
    stable: bool
    warmup_ms: float
    span_ms: float
    littles_law: stats.LittleCheck
    timeouts: dict[str, int]
    mean_padded_fraction: float
    device: str
    clocks: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    # throughput's 95% interval (samples/s): stats.throughput_interval, a bootstrap over sub-windows of the span
    throughput_ci_per_s: tuple[float, float] = (math.nan, math.nan)
    records: tuple[BatchRecord, ...] = field(default=(), repr=False, compare=False, metadata=NOT_SERIALIZED)
    latencies_ms: tuple[float, ...] = field(default=(), repr=False, compare=False, metadata=NOT_SERIALIZED)

    def to_json(self, include_records: bool = False) -> JsonObject:
        out = super().to_json()
        if include_records:
            out["records"] = [record.to_json() for record in self.records]
        return out


def summarize_records(records: list[BatchRecord], t_start_ms: float, t_stop_ms: float) -> dict[str, Any]:
    """Everything statistical about a run's records over the steady-state window [t_start_ms, t_stop_ms]."""
    measured = [r for r in records if r.measured]
    span = t_stop_ms - t_start_ms
    completed_in = [r for r in records if t_start_ms <= r.d2h_end_ms <= t_stop_ms]
    samples_done = sum(r.size for r in completed_in)
    requests_done = sum(len(r.arrivals_ms) for r in completed_in)
    latencies = [r.d2h_end_ms - a for r in measured for a in r.arrivals_ms]
    estimates = stats.bootstrap_percentiles(latencies)
    stage_lists: dict[str, list[float]] = {s: [] for s in STAGES}
    for r in measured:
        for name, value in r.stage_ms().items():
            stage_lists[name].append(value)
        stage_lists["queue"].extend(r.dispatch_ms - a for a in r.arrivals_ms)
    compute_spans = [(r.h2d_end_ms, r.compute_end_ms) for r in records]
    intervals = [(a, r.d2h_end_ms) for r in records for a in r.arrivals_ms]
    little = stats.littles_law_check(intervals, t_start_ms, t_stop_ms)
    completions = [r.d2h_end_ms for r in completed_in for _ in range(r.size)]  # one time per sample
    ci_per_ms = stats.throughput_interval(completions, t_start_ms, t_stop_ms)
    return {
        "throughput_per_s": samples_done / span * 1e3 if span > 0 else math.nan,
        "throughput_ci_per_s": (ci_per_ms[0] * 1e3, ci_per_ms[1] * 1e3),
        "requests_per_s": requests_done / span * 1e3 if span > 0 else math.nan,
        "latency_ms": {f"p{int(q)}": e.value for q, e in estimates.items()}
        | {"mean": float(np.mean(latencies)) if latencies else math.nan},
        "latency_ci_ms": {f"p{int(q)}": (e.ci_low, e.ci_high) for q, e in estimates.items()},
        "latency_reliable": {f"p{int(q)}": e.reliable for q, e in estimates.items()},
        "stages_ms": {k: (float(np.median(v)) if v else math.nan) for k, v in stage_lists.items()},
        "enqueue_us_p50": float(np.median(stage_lists["enqueue"])) * 1e3 if stage_lists["enqueue"] else math.nan,
        "busy_fraction": stats.busy_fraction(compute_spans, t_start_ms, t_stop_ms),
        "compute_overlap": stats.overlap_concurrency(stats.clip_spans(compute_spans, t_start_ms, t_stop_ms)),
        "littles_law": little,
        "latencies_ms": latencies,
        "n_requests": len(latencies),
        "n_batches": len(measured),
        "mean_padded_fraction": (
            float(np.mean([(r.padded_size - r.size) / r.padded_size for r in measured])) if measured else 0.0
        ),
    }
