"""Notebook 04 executes headless, and its panel reacts to its widgets (figures update in place)."""

from __future__ import annotations

from pathlib import Path

import pytest
from notebook_runner import execute_notebook

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "04_async_pipeline.ipynb"


def test_notebook_04_runs_headless_and_says_which_executor() -> None:
    text = execute_notebook(NOTEBOOK.name).text
    from workbench.engine.backend import detect_gpu

    if not detect_gpu().present:
        assert "runs the CPU executor" in text and "not GPU or TensorRT timings" in text
    assert "'executor': 'cpu'" in text or "'executor': 'torch'" in text
    assert "H200" in text  # the committed H200 timeline is drawn from bench/results
    # serving: live manager (admission refusals, hot reload with a rejected version) and the committed H200 search
    assert "refused at once (queue full (4 requests waiting))" in text
    assert "reload v2: accepted=True; v3: accepted=False at load" in text
    assert "'v1'" in text and "'v2'" in text  # responses by version
    assert "H200: coordinate search" in text


def test_panel_widgets_drive_the_figures_in_place() -> None:
    from workbench.ui.timing_panel import make_panel

    panel, how = make_panel(cpu_model="digits-cnn", streams=1, window_s=0.08)
    if "CPU executor" not in how:
        pytest.skip("this test drives the CPU executor")
    timeline, sweep = panel.timeline_figure, panel.sweep_figure
    assert panel.run() is not None
    rows_before = set(timeline.layout.yaxis.categoryarray)
    low, high = panel.last.throughput_ci_per_s  # the summary is the shared timing table: intervals and n
    assert f"{panel.last.throughput_per_s:.0f} [{low:.0f}, {high:.0f}]" in panel.summary.value
    assert "p99 ms [95% CI]" in panel.summary.value and "bootstrap" in panel.summary.value
    assert rows_before == {"host enqueue", "stream 0"}

    panel.streams.value = 3  # auto_run: the observer re-runs and redraws the same FigureWidget objects
    assert panel.last is not None and panel.last.streams == 3
    assert panel.timeline_figure is timeline
    assert {"stream 0", "stream 1", "stream 2"} <= set(timeline.layout.yaxis.categoryarray)
    assert len(sweep.data) == 1 and len(sweep.data[0].x) == 2  # two closed-loop points in one series

    panel.load.value = "open"
    panel.rate.value = 400.0
    panel.dynamic_batching.value = True
    assert panel.last.load == "open" and panel.last.dynamic_batching is not None
    assert "host queue" in set(timeline.layout.yaxis.categoryarray)  # queue spans appear under open loop
    assert len(sweep.data) >= 2  # a new series for the open-loop points
    # every request is drawn, or counted in the title as an outlier not drawn (a loaded machine makes some)
    import re

    n_hist = len(panel.histogram_figure.data[0].x)
    outliers = re.search(r"\((\d+) outlier\(s\)", panel.histogram_figure.layout.title.text or "")
    assert n_hist + (int(outliers.group(1)) if outliers else 0) == len(panel.last.latencies_ms)
    panel.sla_ms.value = 2.5
    assert any(shape.y0 == 2.5 for shape in sweep.layout.shapes)

    # the sweep button runs the one sweep (workbench.timing.run_sweep) at the panel's settings, step by step
    swept = panel.sweep((1, 2))
    assert [(r.streams, r.load) for r in swept] == [(1, "open"), (2, "open")]
    assert panel.progress.message == "swept 2 of 2 configurations" and panel.last is swept[-1]
