"""Typed results of serving: responses, per-model statistics, reload reports, saturation and SLA searches."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.artifact import Artifact
from workbench.timing import stats
from workbench.timing.serving.config import ServeConfig

STATUSES = ("ok", "refused", "expired", "failed")


@dataclass(frozen=True)
class Response:
    """What a request gets back. ``version`` is the model version that produced the outputs (None if it never ran).

    ``status``: ``ok``; ``refused`` (the model's queue was full, or the server closed: answered at once, never
    queued); ``expired`` (waited past the timeout, never run); ``failed`` (the executor raised; ``reason`` says
    what). Latency runs from arrival to the end of the batch's output copy (device event on the GPU).
    """

    request_id: int
    model: str
    version: str | None
    status: str
    latency_ms: float = math.nan
    queue_ms: float = math.nan
    batch_samples: int = 0
    padded_samples: int = 0
    outputs: tuple[np.ndarray, ...] | None = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class ModelStats(Artifact):
    """Per-model serving statistics over a window of arrivals (all requests that arrived in it, however they ended).

    Latency percentiles come with bootstrap 95 % intervals and their sample count; ``padding_fraction`` is padded
    samples over samples run (the price of one CUDA graph per bucket).
    """

    model: str
    active_version: str
    versions: tuple[str, ...]
    priority: str
    stream_priority: int | None
    config: ServeConfig
    window_s: float
    offered: int
    refused: int
    expired: int
    failed: int
    completed: int
    throughput_per_s: float  # completed requests per second of window
    samples_per_s: float
    batches: int
    mean_batch: float
    padding_fraction: float
    bucket_counts: dict[int, int]
    responses_by_version: dict[str, int]
    latency_ms: dict[str, float]
    latency_ci_ms: dict[str, tuple[float, float]]
    latency_n: int
    latency_reliable: dict[str, bool]
    queue_ms_p50: float
    pending_at_end: int = 0

    def summary(self) -> str:
        p99 = self.latency_ms.get("p99", math.nan)
        return (
            f"{self.model} [{self.active_version}] {self.throughput_per_s:,.0f} req/s, p99 {p99:.2f} ms "
            f"(n={self.latency_n}), refused {self.refused}, expired {self.expired}, failed {self.failed}, "
            f"mean batch {self.mean_batch:.1f}, padding {self.padding_fraction:.1%}"
        )


def latency_summary(
    latencies_ms: list[float] | np.ndarray,
) -> tuple[dict[str, float], dict[str, tuple[float, float]], dict[str, bool], int]:
    estimates = stats.bootstrap_percentiles(latencies_ms, n_resamples=400)
    data = np.asarray(latencies_ms, dtype=float)
    point = {f"p{int(q)}": e.value for q, e in estimates.items()} | {
        "mean": float(data.mean()) if data.size else math.nan
    }
    ci = {f"p{int(q)}": (e.ci_low, e.ci_high) for q, e in estimates.items()}
    reliable = {f"p{int(q)}": e.reliable for q, e in estimates.items()}
    return point, ci, reliable, int(data.size)


@dataclass(frozen=True)
class ReloadReport(Artifact):
    """The outcome of one hot reload. A rejected version never served a request; the old one kept serving."""

    model: str
    old_version: str
    new_version: str
    accepted: bool
    stage: str  # "load" | "check" | "swapped"
    reason: str
    max_abs_error: float = math.nan
    max_rel_error: float = math.nan
    rtol: float = math.nan
    atol: float = math.nan
    golden_samples: int = 0
    load_s: float = math.nan
    check_s: float = math.nan
    started_s: float = math.nan  # host clock (perf_counter) when the reload began
    swapped_s: float = math.nan  # host clock when new requests started going to the new version
    drained_s: float = math.nan  # host clock when the old version's last in-flight batch completed
    phases: dict[str, float] = field(default_factory=dict)  # host clock at each step (executor built, lanes ready...)


@dataclass(frozen=True)
class LoadProbe(Artifact):
    """One open-loop run at a fixed Poisson arrival rate (the unit of a saturation search)."""

    config: ServeConfig
    rate_per_s: float
    throughput_per_s: float
    p99_ms: float
    p99_ci_ms: tuple[float, float]
    p50_ms: float
    n_requests: int
    refused: int
    expired: int
    mean_batch: float
    padding_fraction: float
    passed: bool
    why: str = ""


@dataclass(frozen=True)
class SaturationResult(Artifact):
    """The highest open-loop rate found to hold ``budget_ms`` at p99, with every probe that was run."""

    config: ServeConfig
    budget_ms: float
    best_rate_per_s: float  # 0.0 when no probed rate held the budget
    best: LoadProbe | None
    probes: tuple[LoadProbe, ...]


@dataclass(frozen=True)
class SlaSearchResult(Artifact):
    """A p99-budget search over lanes x max batch x max queue delay (Triton model_analyzer's job).

    ``strategy`` is ``coordinate`` (coordinate ascent from a start point, only neighbours of the best so far) or
    ``grid`` (every configuration). ``runs`` counts load probes, ``configurations`` counts configurations tried,
    out of ``grid_size``. Every tried configuration's probes are kept for the latency-throughput figure.
    """

    model: str
    budget_ms: float
    strategy: str
    space: dict[str, tuple[float, ...]]
    grid_size: int
    configurations: int
    runs: int
    chosen: SaturationResult | None
    tried: tuple[SaturationResult, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def best_rate_per_s(self) -> float:
        return self.chosen.best_rate_per_s if self.chosen is not None else 0.0

    def triton_settings(self) -> dict[str, Any]:
        """The chosen configuration as Triton model-config fields (instance count, dynamic batching)."""
        if self.chosen is None:
            return {}
        config = self.chosen.config
        return {
            "instance_group": {"count": config.lanes, "kind": "KIND_GPU"},
            "max_batch_size": config.max_batch,
            "dynamic_batching": {"max_queue_delay_microseconds": int(round(config.max_queue_delay_ms * 1000))},
        }
