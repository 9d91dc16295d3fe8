"""Notebook panel for the async pipeline: knobs on top, timeline / histogram / sweep curve below, updated in place.

Thin: a run goes through :func:`workbench.timing.run_pipeline`, a sweep through :func:`workbench.timing.run_sweep`
(the journey's and the CLI's sweep too); limits come from :mod:`workbench.timing.limits`, figures from
:mod:`workbench.viz.timing`.
Nothing is displayed in the constructor: show ``panel.widget`` yourself.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from typing import Any

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.report.tables import timing_table_html
from workbench.timing import RunConfig, TimingResult, grid_plan, interactive_config, run_pipeline, run_sweep
from workbench.timing.limits import BATCH_CHOICES, check_streams
from workbench.ui import controls
from workbench.ui.controls import figure_widget
from workbench.ui.figures import replace_figure
from workbench.ui.fit import fit_panel
from workbench.ui.progress import ProgressAdapter
from workbench.viz import timing as timing_figures

ExecutorFactory = Callable[[str, bool], Any]  # (executor name, cuda_graph) -> executor


class TimingPanel:
    """Executor, streams (within :mod:`workbench.timing.limits`), batch, dynamic batching + max delay, CUDA graph,
    load mode; run and sweep."""

    def __init__(
        self,
        executor_factory: ExecutorFactory,
        *,
        executors: tuple[str, ...] = ("cpu",),
        model: str = "",
        streams: int = 2,
        batch: int = 1,
        load: str = "closed",
        rate_per_s: float = 500.0,
        sla_ms: float = 5.0,
        window_s: float = 0.2,
        auto_run: bool = True,
    ) -> None:
        self._factory = executor_factory
        self._executors: dict[tuple[str, bool], Any] = {}
        self.model = model
        self.window_s = window_s
        self.auto_run = auto_run
        self.executor = widgets.Dropdown(options=list(executors), value=executors[0], description="executor")
        self.streams = controls.streams_input(streams)
        self._quiet = False  # set while the panel puts a value back into a widget
        self._streams_in_use = streams
        self.batch = controls.batch_dropdown(batch, options=BATCH_CHOICES)
        self.load = widgets.Dropdown(
            options=[("closed loop", "closed"), ("open loop (Poisson)", "open"), ("synchronous baseline", "sync")],
            value=load,
            description="load",
        )
        self.rate = widgets.FloatText(value=rate_per_s, description="rate (req/s)")
        self.dynamic_batching = widgets.Checkbox(value=False, description="dynamic batching (open loop)")
        self.max_delay_ms = widgets.FloatSlider(
            value=0.5, min=0.0, max=5.0, step=0.1, description="max delay ms", continuous_update=False
        )
        self.cuda_graph = widgets.Checkbox(value=True, description="CUDA graph")
        self.sla_ms = widgets.FloatText(value=sla_ms, description="SLA p99 (ms)")
        self.run_button = widgets.Button(description="Run", button_style="primary", icon="play")
        self.sweep_button = widgets.Button(description="Sweep streams 1,2,4,8", icon="line-chart")
        self.status = controls.StatusArea()
        self.progress = ProgressAdapter("timing")
        self.summary = widgets.HTML()
        self.timeline_figure = figure_widget()
        self.histogram_figure = figure_widget()
        self.sweep_figure = figure_widget()
        self.results: list[TimingResult] = []
        self.sweep_points: list[dict[str, object]] = []
        self.last: TimingResult | None = None
        self.run_button.on_click(lambda _b: self.run())
        self.sweep_button.on_click(lambda _b: self.sweep())
        for w in (
            self.executor,
            self.streams,
            self.batch,
            self.load,
            self.rate,
            self.dynamic_batching,
            self.max_delay_ms,
            self.cuda_graph,
        ):
            w.observe(self._changed, names="value")
        self.sla_ms.observe(lambda _c: self._draw_sweep(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox(
                    [
                        widgets.VBox([self.executor, self.streams, self.batch, self.cuda_graph]),
                        widgets.VBox([self.load, self.rate, self.dynamic_batching, self.max_delay_ms]),
                        widgets.VBox([self.sla_ms, self.run_button, self.sweep_button]),
                    ]
                ),
                self.progress.widget,
                self.status.widget,
                self.summary,
                self.timeline_figure,
                self.histogram_figure,
                self.sweep_figure,
            ]
        )
        fit_panel(self.widget)  # follows its container: wraps, scrolls wide tables, re-lays out figures

    # --- actions -------------------------------------------------------------------------------------------
    def _changed(self, _change: Mapping[str, object]) -> None:
        if self._quiet:
            return
        try:  # refused with the CLI's message, not clamped
            check_streams(self.streams.value)
        except WorkbenchError as error:
            self.status.error(error)
            self._set_quietly(self.streams, self._streams_in_use)
            return
        if self.auto_run:
            self.run()

    def _set_quietly(self, widget: widgets.ValueWidget, value: object) -> None:
        self._quiet = True
        try:
            widget.value = value
        finally:
            self._quiet = False

    def _get_executor(self) -> Any:
        key = (self.executor.value, bool(self.cuda_graph.value))
        if key not in self._executors:
            self._executors[key] = self._factory(*key)
        return self._executors[key]

    def config(self, streams: int | None = None) -> RunConfig:
        return interactive_config(
            self.window_s,
            streams=int(streams or self.streams.value),
            batch=int(self.batch.value),
            load=self.load.value,
            rate_per_s=float(self.rate.value) if self.load.value == "open" else None,
            dynamic_batching=bool(self.dynamic_batching.value) and self.load.value == "open",
            max_batch=max(8, int(self.batch.value)),
            max_queue_delay_ms=float(self.max_delay_ms.value),
        )

    def run(self, streams: int | None = None) -> TimingResult | None:
        n = int(streams or self.streams.value)
        self.status.busy("running...")
        self.progress.start(f"timing {n} stream(s)")
        try:
            result = run_pipeline(self._get_executor(), self.config(streams), model=self.model)
        except Exception as error:  # shown as a message in the panel
            self.progress.failed("failed")
            self.status.error(error)
            return None
        self.progress.done(f"timed {n} stream(s)")
        self._keep([result])
        return result

    def sweep(self, streams: tuple[int, ...] = (1, 2, 4, 8)) -> list[TimingResult]:
        """Time each stream count at the panel's settings (the one sweep of :mod:`workbench.timing.sweep`)."""
        plan = grid_plan(streams, [int(self.batch.value)])
        self.status.busy("sweeping...")
        self.progress.start("sweep", total=len(plan))
        try:
            sweep = run_sweep(self._get_executor(), plan, self.config(), model=self.model, progress=self.progress)
        except Exception as error:  # shown as a message in the panel
            self.progress.failed("failed")
            self.status.error(error)
            return []
        self.progress.done(f"swept {len(sweep.results)} of {len(plan)} configurations")
        self._keep(list(sweep.results))
        return list(sweep.results)

    def _keep(self, results: list[TimingResult]) -> None:
        """Add timed results to the sweep curve and show the last one."""
        if not results:
            return
        self.results.extend(results)
        self.sweep_points.extend(timing_figures.sweep_point(r) for r in results)
        result = self.last = results[-1]
        self._draw(result)
        self.status.ok(
            f"{result.executor_label}: {result.throughput_per_s:.0f} samples/s, "
            f"p99 {result.latency_ms.get('p99', math.nan):.2f} ms"
        )

    # --- drawing -------------------------------------------------------------------------------------------
    def _draw(self, result: TimingResult) -> None:
        """Draw ``result`` and make the streams field show the streams it was timed with."""
        self._streams_in_use = result.streams
        if self.streams.value != result.streams:
            self._set_quietly(self.streams, result.streams)
        replace_figure(
            self.timeline_figure,
            timing_figures.gantt_figure(
                result.records,
                title=f"Timeline: {result.streams} stream(s), batch {result.batch}, {result.load} (shown: the last run)",
            ),
        )
        replace_figure(
            self.histogram_figure,
            timing_figures.latency_histogram(
                result.latencies_ms, percentiles={k: result.latency_ms[k] for k in ("p50", "p99")}
            ),
        )
        self._draw_sweep()
        self.summary.value = self._summary_html(result)

    def _draw_sweep(self) -> None:
        replace_figure(
            self.sweep_figure,
            timing_figures.latency_throughput_figure(
                self.sweep_points, sla_ms=float(self.sla_ms.value) if self.sla_ms.value else None
            ),
        )

    @staticmethod
    def _summary_html(r: TimingResult) -> str:
        """The run's row of the shared timing table (throughput and p99 with their bootstrap 95% intervals and n),
        then the stage medians and notes."""
        stages = ", ".join(f"{k} {v:.3f}" for k, v in r.stages_ms.items() if not math.isnan(v))
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in r.notes)
        return (
            f"<b>{html.escape(r.executor_label)}</b>"
            + timing_table_html([r])
            + f"latency p90 {r.latency_ms['p90']:.3f} ms; enqueue p50 {r.enqueue_us_p50:.1f} us"
            f"<br>stage medians (ms): {html.escape(stages)}" + (f"<ul>{notes}</ul>" if notes else "")
        )


def make_panel(
    cpu_model: str = "digits-cnn", torch_model: str = "efficientnet-lite0", **kwargs: Any
) -> tuple[TimingPanel, str]:
    """A panel for this machine (:func:`workbench.timing.factory.local_executors`: the torch GPU executor when CUDA
    is usable, else the CPU executor), and why."""
    from workbench.timing.factory import local_executors, make_executor

    here = local_executors(cpu_model, torch_model)

    def factory(name: str, cuda_graph: bool) -> Any:
        return make_executor(here.models[name], name, cuda_graph=cuda_graph)[0]

    return TimingPanel(factory, executors=here.names, model=here.default_model, **kwargs), here.reason
