"""Saturation search (highest open-loop rate that holds a p99 budget) and the SLA search over serving settings.

The searches take a ``probe``: a callable that runs one open-loop load at a rate and returns a :class:`LoadProbe`.
:class:`ServingProbe` is the real one (a :class:`ModelServer` per configuration, kept open across its probes); tests
can pass any other, which is how the search logic is checked without a GPU.

Saturation search: probe upward by ``growth`` until a rate fails, then bisect (geometrically) between the best
passing and the lowest failing rate until they are within ``rel_tol``. With an incumbent (``beat``), the first probe
is at its rate, and a configuration that fails there stops at once: it cannot be the best.

SLA search, ``coordinate`` strategy (coordinate search, in the spirit of model_analyzer's quick search): from a
start point, try every value of one axis (max queue delay, then max batch, then lanes) with the others fixed, move
whenever a configuration beats the incumbent, and repeat passes until none does. Whole-axis sweeps rather than single
steps, because the measured rate is not unimodal along an axis (the H200 run of 2026-12-03: a one-step search stopped
at 0.75x of the grid's best). ``grid`` tries everything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from workbench.errors import WorkbenchError
from workbench.timing.serving.config import ServeConfig
from workbench.timing.serving.result import LoadProbe, SaturationResult, SlaSearchResult
from workbench.timing.serving.server import ModelServer

AXES = ("max_batch", "lanes", "max_queue_delay_ms")
Probe = Callable[[ServeConfig, float], LoadProbe]


def judge(config: ServeConfig, rate: float, stats: Any, budget_ms: float) -> LoadProbe:
    """A LoadProbe from a run's ModelStats: passed when p99 <= budget and nothing was refused, expired or failed."""
    p99 = stats.latency_ms.get("p99", math.nan)
    why = []
    if not p99 <= budget_ms:
        why.append(f"p99 {p99:.2f} ms > {budget_ms:g} ms")
    for what in ("refused", "expired", "failed"):
        if getattr(stats, what):
            why.append(f"{getattr(stats, what)} {what}")
    if stats.latency_n == 0:
        why.append("no request completed")
    return LoadProbe(
        config=config,
        rate_per_s=float(rate),
        throughput_per_s=float(stats.throughput_per_s),
        p99_ms=float(p99),
        p99_ci_ms=tuple(stats.latency_ci_ms.get("p99", (math.nan, math.nan))),  # type: ignore[arg-type]
        p50_ms=float(stats.latency_ms.get("p50", math.nan)),
        n_requests=int(stats.latency_n),
        refused=int(stats.refused),
        expired=int(stats.expired),
        mean_batch=float(stats.mean_batch),
        padding_fraction=float(stats.padding_fraction),
        passed=not why,
        why="; ".join(why),
    )


def saturation_search(
    probe: Callable[[float], LoadProbe],
    config: ServeConfig,
    budget_ms: float,
    start_rate: float,
    *,
    beat: float | None = None,
    max_probes: int = 8,
    rel_tol: float = 0.05,
    growth: float = 1.6,
    min_rate: float = 1.0,
) -> SaturationResult:
    if start_rate <= 0 or budget_ms <= 0:
        raise WorkbenchError(
            f"saturation search: start rate {start_rate}/s and budget {budget_ms} ms must be positive."
        )
    probes: list[LoadProbe] = []
    best: LoadProbe | None = None
    fail_rate = math.inf
    # With an incumbent, start at its rate: failing there proves this configuration is no better; passing there
    # (a tie so far) continues upward in small steps, since the answer is near.
    rate = float(beat) if beat else float(start_rate)
    if beat:
        growth = min(growth, 1 + 3 * rel_tol)
    while len(probes) < max_probes and rate >= min_rate:
        result = probe(rate)
        probes.append(result)
        if result.passed:
            if best is None or rate > best.rate_per_s:
                best = result
        else:
            fail_rate = min(fail_rate, rate)
            if beat and len(probes) == 1:
                break  # cannot even match the incumbent
        lo = best.rate_per_s if best is not None else None
        if math.isinf(fail_rate):
            rate = rate * growth
        elif lo is None:
            rate = fail_rate / growth
        else:
            if fail_rate / lo <= 1 + rel_tol:
                break
            rate = math.sqrt(lo * fail_rate)
    return SaturationResult(
        config=config,
        budget_ms=float(budget_ms),
        best_rate_per_s=best.rate_per_s if best is not None else 0.0,
        best=best,
        probes=tuple(probes),
    )


def _grid(space: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
    points: list[dict[str, float]] = [{}]
    for axis in AXES:
        points = [dict(p, **{axis: v}) for p in points for v in space[axis]]
    return points


def sla_search(
    probe: Probe,
    budget_ms: float,
    space: Mapping[str, Sequence[float]],
    *,
    base: ServeConfig | None = None,
    strategy: str = "coordinate",
    start_rate: Callable[[ServeConfig], float] | float = 100.0,
    start: Mapping[str, float] | None = None,
    max_probes: int = 8,
    rel_tol: float = 0.05,
    model: str = "",
    progress: Callable[[SaturationResult], None] | None = None,
    axis_order: Sequence[str] = ("max_queue_delay_ms", "max_batch", "lanes"),
) -> SlaSearchResult:
    """Highest sustainable open-loop rate at p99 <= ``budget_ms`` over ``space`` (lists per axis of AXES)."""
    missing = [a for a in AXES if not space.get(a)]
    if missing:
        raise WorkbenchError(f"SLA search: no values for {', '.join(missing)}.", expected=f"values for {AXES}")
    if strategy not in ("coordinate", "grid"):
        raise WorkbenchError(f"SLA search strategy {strategy!r} is unknown.", expected="coordinate | grid")
    base = base or ServeConfig()
    axes = {a: sorted(float(v) for v in space[a]) for a in AXES}
    grid_size = math.prod(len(v) for v in axes.values())
    tried: dict[tuple[float, ...], SaturationResult] = {}
    incumbent: list[SaturationResult] = []

    def config_at(point: Mapping[str, float]) -> ServeConfig:
        return replace(
            base,
            max_batch=int(point["max_batch"]),
            lanes=int(point["lanes"]),
            max_queue_delay_ms=float(point["max_queue_delay_ms"]),
            buckets=tuple(b for b in base.buckets if b <= int(point["max_batch"])),
        )

    def evaluate(point: Mapping[str, float], prune: bool) -> SaturationResult:
        key = tuple(point[a] for a in AXES)
        if key in tried:
            return tried[key]
        config = config_at(point)
        best_so_far = incumbent[0].best_rate_per_s if incumbent and prune else None
        first = start_rate(config) if callable(start_rate) else float(start_rate)
        result = saturation_search(
            lambda rate: probe(config, rate),
            config,
            budget_ms,
            first,
            beat=best_so_far or None,
            max_probes=max_probes,
            rel_tol=rel_tol,
        )
        tried[key] = result
        if not incumbent or result.best_rate_per_s > incumbent[0].best_rate_per_s:
            incumbent[:] = [result]
        if progress is not None:
            progress(result)
        return result

    notes: list[str] = []
    if strategy == "grid":
        for point in _grid(axes):
            evaluate(point, prune=False)
    else:
        current = dict(start) if start else {a: axes[a][(len(axes[a]) - 1) // 2] for a in AXES}
        for a in AXES:
            if current[a] not in axes[a]:
                raise WorkbenchError(f"SLA search start {a}={current[a]} is not in the space {axes[a]}.")
        evaluate(current, prune=False)
        improved = True
        while improved:  # passes of full-axis line searches until none moves the incumbent
            improved = False
            for axis in axis_order:
                for value in axes[axis]:
                    if value == current[axis]:
                        continue
                    neighbour = dict(current, **{axis: value})
                    before = incumbent[0].best_rate_per_s
                    if evaluate(neighbour, prune=True).best_rate_per_s > before:
                        current = neighbour
                        improved = True
        notes.append(
            "coordinate search: every value of one axis at a time from the best point so far; a configuration that "
            "failed at the incumbent's rate was not searched further"
        )
    chosen = incumbent[0] if incumbent and incumbent[0].best_rate_per_s > 0 else None
    if chosen is None:
        notes.append(f"no configuration held p99 <= {budget_ms:g} ms at any probed rate")
    return SlaSearchResult(
        model=model,
        budget_ms=float(budget_ms),
        strategy=strategy,
        space={a: tuple(axes[a]) for a in AXES},
        grid_size=grid_size,
        configurations=len(tried),
        runs=sum(len(r.probes) for r in tried.values()),
        chosen=chosen,
        tried=tuple(tried.values()),
        notes=tuple(notes),
    )


class ServingProbe:
    """The real probe: one ModelServer per configuration (kept open across that configuration's probes).

    ``make_server(config)`` builds the server (it can reuse executors: a torch executor keeps its captured CUDA
    graphs per lane). Each probe runs ``warmup_s`` plus ``duration_s`` (longer when needed for ``min_requests``
    p99 samples) of Poisson arrivals and judges the requests that arrived after the warm-up.
    """

    def __init__(
        self,
        make_server: Callable[[ServeConfig], ModelServer],
        budget_ms: float,
        *,
        duration_s: float = 0.4,
        warmup_s: float = 0.15,
        min_requests: int = 600,
        max_duration_s: float = 3.0,
        seed: int = 0,
    ) -> None:
        self.make_server = make_server
        self.budget_ms = budget_ms
        self.duration_s, self.warmup_s, self.min_requests = duration_s, warmup_s, min_requests
        self.max_duration_s = max_duration_s
        self.seed = seed
        self._config: ServeConfig | None = None
        self._server: ModelServer | None = None
        self.n_probes = 0

    def server(self, config: ServeConfig) -> ModelServer:
        if self._config != config:
            self.close()
            self._server = self.make_server(config)
            self._config = config
        assert self._server is not None
        return self._server

    def capacity_estimate(self, config: ServeConfig) -> float:
        """Requests/s if one max-size batch ran after another (from the warm-up's service times): a start rate."""
        runtime = self.server(config)._active
        size = runtime.max_batch
        return size / max(runtime.service_ms.get(size, 1.0), 1e-6) * 1e3

    def __call__(self, config: ServeConfig, rate: float) -> LoadProbe:
        server = self.server(config)
        duration = min(max(self.duration_s, self.min_requests / max(rate, 1e-9)), self.max_duration_s)
        self.n_probes += 1
        server.reset_stats()
        stats = server.run_load(rate, duration, warmup_s=self.warmup_s, seed=self.seed + self.n_probes)
        return judge(config, rate, stats, self.budget_ms)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._server, self._config = None, None
