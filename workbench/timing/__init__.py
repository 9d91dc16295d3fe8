"""Async pipeline timing: executors, lanes (CUDA streams or CPU threads), load generators, statistics, sweeps.

Nothing here imports torch, cuda or plotly at import time; GPU pieces load lazily when a GPU executor is used.
"""

from workbench.timing.pipeline import RunConfig, measure_compute_limit, run_pipeline
from workbench.timing.result import BatchRecord, TimingResult
from workbench.timing.sweep import Sweep, grid_plan, interactive_config, run_sweep, sweep_plan

__all__ = [
    "RunConfig",
    "run_pipeline",
    "measure_compute_limit",
    "Sweep",
    "grid_plan",
    "interactive_config",
    "run_sweep",
    "sweep_plan",
    "BatchRecord",
    "TimingResult",
]
