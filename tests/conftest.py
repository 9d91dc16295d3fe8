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
