"""Shared test set-up: one zoo cache for the whole run, GPU tests skipped where no NVIDIA GPU is present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    # Zoo models (some exported from PyTorch on first use) are materialized once per checkout and reused.
    os.environ.setdefault("WORKBENCH_CACHE", str(REPO / ".cache" / "zoo"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # ONNX Runtime's waiting threads sleep instead of spinning (results are the same bits): two workers, their
    # notebook kernels and Chromium share two cores, and spinning threads took the others' CPU (measured: four test
    # files on two workers, 105 s -> 84 s, user CPU 181 s -> 138 s)
    os.environ.setdefault("WORKBENCH_ORT_SPIN", "0")
    # the same for numpy's OpenBLAS threads (its thread count, so its results, unchanged): they sleep after a call
    # instead of spinning for ~0.1 s (measured: the GPTQ-heavy files on two workers, user CPU 77-81 s -> 65-71 s);
    # set here, before the xdist workers, notebook kernels and CLI children start and load it
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    # tqdm's default lock includes a process-shared semaphore that forked CLI children (tests/cli_runner.py) inherit:
    # a child SIGKILLed while holding it (test_trust kills children mid-run) left it taken, and every later child of
    # that worker hung on its first progress bar (a full run, 2026-12-06: 7 tests past their 120 s). A thread lock
    # is the worker's own; tqdm only needs a process-shared one to order bars of several processes on one terminal.
    import threading

    import tqdm.std

    tqdm.std.tqdm.set_lock(threading.RLock())  # the base class: tqdm.auto's and the notebook's bars inherit it


# Real-browser tests assert on what a user sees within a second or two: under pytest-xdist (make test) they share
# one worker and run one after another, never two Chromium + JupyterLab pairs at once.
BROWSER_TEST_FILES = frozenset({"test_browser.py", "test_explore_browser.py"})
# The longest units, started first (longest first): xdist hands out files by their number of tests, which left the
# browser unit (5 minutes, 6 tests) for last, running alone while the other worker sat idle.
LONGEST_FIRST = ("browser", "test_quickstart.py", "test_calib_notebook.py", "test_mixed_front.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the browser files as one unit (each file's fixtures stay in one worker), the longest
    units first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BrowserFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "browser" if Path(path).name in BROWSER_TEST_FILES else path

        def _assign_work_unit(self, node: object) -> None:
            for name in reversed(LONGEST_FIRST):
                scope = next((s for s in self.workqueue if s == name or Path(s).name == name), None)
                if scope is not None:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return BrowserFilesTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from workbench.engine.backend import detect_gpu

    gpu = detect_gpu()
    if gpu.present:
        return
    skip = pytest.mark.skip(reason=f"needs an NVIDIA GPU; {gpu.source}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def rapidocr_models() -> Path:
    import rapidocr_onnxruntime

    return Path(rapidocr_onnxruntime.__file__).parent / "models"
