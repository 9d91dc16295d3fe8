"""One sweep over (streams, batch) configurations: which ones to time, and the loop that times them.

The journey's timing stage, the timing panel and ``workbench time`` all plan with :func:`sweep_plan` or
:func:`grid_plan` and run with :func:`run_sweep`; a configuration whose lanes would not fit in device memory is
skipped with the reason (executors that can estimate their per-lane memory only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from workbench.artifact import Artifact
from workbench.progress import ProgressEvent, ProgressFn, report
from workbench.timing.executors import Executor
from workbench.timing.limits import INTERACTIVE_MAX_WINDOWS, INTERACTIVE_MIN_WINDOWS, MAX_INTERACTIVE_WARMUP_S
from workbench.timing.pipeline import RunConfig, run_pipeline
from workbench.timing.result import TimingResult


def sweep_plan(streams: int, batch: int, include_baselines: bool) -> list[tuple[int, int]]:
    """(streams, batch) to time: the chosen one first, then (with ``include_baselines``) streams=1, batch=1 and
    both at 1, so a reader can see whether streams and batching help."""
    chosen = (int(streams), int(batch))
    plan = [chosen]
    if include_baselines:
        for candidate in ((1, chosen[1]), (chosen[0], 1), (1, 1)):
            if candidate not in plan:
                plan.append(candidate)
    return plan


def grid_plan(streams: Iterable[int], batches: Iterable[int]) -> list[tuple[int, int]]:
    """Every streams x batch configuration, batch by batch (each batch's stream counts in the order given)."""
    stream_counts = [int(n) for n in streams]
    return [(n, int(b)) for b in batches for n in stream_counts]


def interactive_config(window_s: float, **settings: Any) -> RunConfig:
    """A short run for interactive use (the journey, the timing panel): 3-4 windows of ``window_s`` after a
    warm-up of at most 0.2 s. ``settings`` are the other RunConfig fields (load, rate, batching...)."""
    return RunConfig(
        warmup_s=min(MAX_INTERACTIVE_WARMUP_S, window_s),
        window_s=window_s,
        min_windows=INTERACTIVE_MIN_WINDOWS,
        max_windows=INTERACTIVE_MAX_WINDOWS,
        **settings,
    )


@dataclass(frozen=True)
class SkippedRun(Artifact):
    """A configuration the sweep did not run, and why."""

    streams: int
    batch: int
    reason: str


@dataclass(frozen=True)
class Sweep(Artifact):
    """The timed configurations in plan order, and those skipped (with the reason)."""

    results: tuple[TimingResult, ...]
    skipped: tuple[SkippedRun, ...] = ()
    stopped: bool = False  # the progress hook asked to stop before every configuration ran

    def find(self, streams: int, batch: int) -> TimingResult | None:
        return next((r for r in self.results if r.streams == streams and r.batch == batch), None)


def run_sweep(
    executor: Executor,
    plan: Sequence[tuple[int, int]],
    base: RunConfig,
    *,
    model: str = "",
    progress: ProgressFn | None = None,
    on_result: Callable[[TimingResult], object] | None = None,
    memory_fraction: float = 0.9,
    free_bytes: Callable[[], int] | None = None,
) -> Sweep:
    """Time every (streams, batch) of ``plan`` with the other settings of ``base``; a failing run raises.

    ``progress`` hears of each configuration before it runs (a :class:`~workbench.progress.ProgressEvent`; returning
    False stops the sweep there), ``on_result``
    gets each result as soon as it is measured (the CLI prints it).

    An executor that can estimate its per-lane memory (``estimate_new_lane_bytes``) is checked against the free
    device memory (``free_bytes``, default: cuMemGetInfo) before each configuration; one that would not fit within
    ``memory_fraction`` of it is skipped and reported.
    """
    results: list[TimingResult] = []
    skipped: list[SkippedRun] = []
    for index, (streams, batch) in enumerate(plan):
        config = replace(base, streams=int(streams), batch=int(batch))
        step = ProgressEvent("timing", _label(streams, batch), index, len(plan), name=f"{streams}x{batch}")
        if not report(progress, step):
            return Sweep(tuple(results), tuple(skipped), stopped=True)
        fits, why = _fits_in_memory(executor, config, memory_fraction, free_bytes)
        if not fits:
            skipped.append(SkippedRun(int(streams), int(batch), why))
            continue
        result = run_pipeline(executor, config, model=model)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return Sweep(tuple(results), tuple(skipped))


def _label(streams: int, batch: int) -> str:
    return f"timing {streams} stream(s) x batch {batch}"


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
