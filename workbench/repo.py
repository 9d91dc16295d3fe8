"""Where the repository's committed files are, found from the package itself (never from the working directory)."""

from __future__ import annotations

from pathlib import Path

from workbench.errors import WorkbenchError

REPO_ROOT = Path(__file__).resolve().parents[1]


def bench_results_dir() -> Path:
    """``bench/results/`` of this checkout: the committed benchmark results the notebooks plot (e.g. H200 runs)."""
    folder = REPO_ROOT / "bench" / "results"
    if not folder.is_dir():
        raise WorkbenchError(
            f"{folder}: no committed benchmark results here.",
            expected="a trt-workbench source checkout (bench/results ships with the repository, not the package)",
        )
    return folder
