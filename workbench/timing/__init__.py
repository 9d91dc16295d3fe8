"""Async pipeline timing: executors, lanes (CUDA streams or CPU threads), load generators, statistics, sweeps.

Nothing here imports torch, cuda or plotly at import time; GPU pieces load lazily when a GPU executor is used.
"""

from workbench.timing.pipeline import RunConfig, measure_compute_limit, run_pipeline, sweep
from workbench.timing.result import BatchRecord, TimingResult

__all__ = ["RunConfig", "run_pipeline", "measure_compute_limit", "sweep", "BatchRecord", "TimingResult"]
