"""Export a run's timeline as Chrome / Perfetto trace JSON (the "Trace Event Format", complete events ``ph: X``).

One process for the host thread (enqueue spans, queue waits) and one for the device, with a thread per lane/stream
holding that lane's H2D, compute and D2H spans. Open the file in ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

from workbench._io import write_json_atomic
from workbench.artifact import JsonObject
from workbench.timing.result import BatchRecord, TimingResult

HOST_PID = 1
DEVICE_PID = 2


def _span(name: str, pid: int, tid: int, start_ms: float, end_ms: float, args: JsonObject) -> JsonObject | None:
    if math.isnan(start_ms) or math.isnan(end_ms) or end_ms < start_ms:
        return None
    return {
        "name": name,
        "cat": name,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": start_ms * 1e3,
        "dur": (end_ms - start_ms) * 1e3,
        "args": args,
    }


def trace_events(records: Iterable[BatchRecord], device_label: str = "device") -> list[JsonObject]:
    events: list[JsonObject] = [
        {"name": "process_name", "ph": "M", "pid": HOST_PID, "args": {"name": "host (dispatcher thread)"}},
        {"name": "process_name", "ph": "M", "pid": DEVICE_PID, "args": {"name": device_label}},
        {"name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": 0, "args": {"name": "enqueue"}},
    ]
    lanes: set[int] = set()
    for index, r in enumerate(records):
        lanes.add(r.lane)
        args = {
            "request": index,
            "lane": r.lane,
            "slot": r.slot,
            "batch": r.size,
            "padded": r.padded_size,
            "measured": r.measured,
        }
        tid = r.lane + 1
        candidates = [
            _span("enqueue", HOST_PID, 0, r.dispatch_ms, r.enqueue_end_ms, args),
            _span("h2d", DEVICE_PID, tid, r.h2d_start_ms, r.h2d_end_ms, args),
            _span("compute", DEVICE_PID, tid, r.h2d_end_ms, r.compute_end_ms, args),
            _span("d2h", DEVICE_PID, tid, r.compute_end_ms, r.d2h_end_ms, args),
        ]
        if r.arrivals_ms and r.dispatch_ms > min(r.arrivals_ms):
            candidates.append(_span("queue", HOST_PID, 1, min(r.arrivals_ms), r.dispatch_ms, args))
        events.extend(e for e in candidates if e is not None)
    for lane in sorted(lanes):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": DEVICE_PID, "tid": lane + 1, "args": {"name": f"stream {lane}"}}
        )
    events.append({"name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": 1, "args": {"name": "queue (batcher)"}})
    return events


def trace_document(result: TimingResult) -> JsonObject:
    return {
        "traceEvents": trace_events(result.records, f"{result.device} ({result.executor_label})"),
        "displayTimeUnit": "ms",
        "metadata": {
            k: v
            for k, v in result.to_json().items()
            if k
            in (
                "executor",
                "executor_label",
                "model",
                "streams",
                "depth",
                "batch",
                "load",
                "throughput_per_s",
                "latency_ms",
                "cuda_graph",
                "dynamic_batching",
            )
        },
    }


def export_trace(result: TimingResult, path: str | os.PathLike[str]) -> Path:
    """Write the run's timeline as a Chrome/Perfetto trace (atomically); returns the path."""
    return write_json_atomic(path, trace_document(result))
