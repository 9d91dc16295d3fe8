"""The quickstart control panel: one set of controls driving the whole journey, every stage's result in a tab.

Thin: the work happens in :class:`workbench.flow.QuickstartSession` (which re-runs only the stages a changed
setting affects); the panel turns results into figures and tables. Nothing is displayed in the constructor:
show ``panel.widget`` yourself.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.flow import QuickstartConfig, QuickstartRun, QuickstartSession
from workbench.report import diagnose, metrics_table_html, stage_table_html, timing_table_html, verdicts_html
from workbench.ui import controls
from workbench.ui.figures import note_figure, replace_figure
from workbench.ui.progress import ProgressAdapter
from workbench.viz import calib as calib_figures
from workbench.viz import clean as clean_figures
from workbench.viz import engine as engine_figures
from workbench.viz import metrics as metric_figures
from workbench.viz import timing as timing_figures

_TABS = ("Stages", "Cleaning", "Fusion", "Per-layer diff", "Task metric", "Timing", "Diagnosis")


class QuickstartPanel:
    """Precision, calibration method, streams, batch and model widgets over a QuickstartSession."""

    def __init__(self, config: QuickstartConfig | None = None, *, session: QuickstartSession | None = None) -> None:
        self.progress = ProgressAdapter("stages")
        self.status = controls.StatusArea()
        self.session = session or QuickstartSession(config or QuickstartConfig())
        self.session.progress = self.progress
        cfg = self.session.config
        self.model = controls.model_picker(cfg.model)
        self.precision = controls.precision_dropdown(cfg.precision)
        self.calibration_method = controls.calibration_method_dropdown(cfg.calibration_method)
        self.streams = controls.streams_slider(cfg.streams)
        self.batch = controls.batch_dropdown(cfg.batch)
        self.run_button = widgets.Button(description="Run all stages", button_style="primary", icon="play")
        self.stage_table = widgets.HTML()
        self.metrics_table = widgets.HTML()
        self.timing_table = widgets.HTML()
        self.diagnosis = widgets.HTML()
        self.cleaning_figure = go.FigureWidget()
        self.fusion_figure = go.FigureWidget()
        self.diff_figure = go.FigureWidget()
        self.metrics_figure = go.FigureWidget()
        self.timing_figure = go.FigureWidget()
        self.refresh_count = 0
        self.run_button.on_click(lambda _button: self.run())
        for name in ("model", "precision", "calibration_method", "streams", "batch"):
            getattr(self, name).observe(self._observer(name), names="value")
        tabs = widgets.Tab(
            children=[
                self.stage_table,
                self.cleaning_figure,
                self.fusion_figure,
                self.diff_figure,
                widgets.VBox([self.metrics_table, self.metrics_figure]),
                widgets.VBox([self.timing_table, self.timing_figure]),
                self.diagnosis,
            ]
        )
        for index, title in enumerate(_TABS):
            tabs.set_title(index, title)
        self.tabs = tabs
        self.widget = widgets.VBox(
            [
                widgets.HBox(
                    [
                        widgets.VBox([self.model, self.precision, self.calibration_method]),
                        widgets.VBox([self.streams, self.batch, self.run_button]),
                    ]
                ),
                self.progress.widget,
                self.status.widget,
                tabs,
            ]
        )
        self.widget.add_class("workbench-quickstart-panel")

    # --- actions ---------------------------------------------------------------------------------------------
    def _observer(self, name: str) -> Any:
        def changed(change: dict[str, Any]) -> None:
            self.apply(**{name: change["new"]})

        return changed

    def run(self) -> None:
        """Run every stage with the current settings."""
        self._guarded("running all stages", self.session.run_all)

    def apply(self, **changes: Any) -> None:
        """Change settings and re-run the affected stages (what the widgets call)."""
        self._guarded(
            "updating " + ", ".join(f"{k}={v}" for k, v in changes.items()), lambda: self.session.update(**changes)
        )

    def _guarded(self, what: str, action: Any) -> None:
        self.status.busy(f"{what}...")
        try:
            action()
        except Exception as error:  # shown as a message in the panel, never as a traceback
            self.status.error(error)
            return
        self.progress.done("finished")
        self.refresh()
        failed = [r for r in self.session.run.stages.values() if not r.ok]
        if failed:
            self.status.warn(
                f"done; {len(failed)} stage(s) did not complete: "
                + "; ".join(f"{r.title}: {r.summary}" for r in failed)
            )
        else:
            self.status.ok(f"done: {len(self.session.run.stages)} stages complete")

    # --- rendering -------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw every table and figure from the session's current run (the panel only reads the typed record)."""
        run = self.session.run
        self.stage_table.value = stage_table_html(run)
        replace_figure(
            self.cleaning_figure,
            clean_figures.node_waterfall_figure(run.cleaning.result)
            if run.cleaning
            else note_figure(run.stage("clean").summary),
        )
        replace_figure(self.fusion_figure, self._fusion_figure(run))
        kept = [node for node, p in run.fallback.plan.overrides.items() if p == "fp32"] if run.fallback else []
        replace_figure(
            self.diff_figure,
            calib_figures.sqnr_figure(run.layer_diff.diff, highlight=kept)
            if run.layer_diff
            else note_figure(run.stage("layer_diff").summary),
        )
        rows = run.metrics.rows if run.metrics else ()
        self.metrics_table.value = (
            metrics_table_html(rows, run.config.variant) if rows else html.escape(run.stage("metrics").summary)
        )
        replace_figure(
            self.metrics_figure,
            metric_figures.metrics_figure(rows, run.config.variant)
            if rows
            else note_figure(run.stage("metrics").summary),
        )
        if run.timing is not None:
            self.timing_table.value = f"<p>{html.escape(run.timing.reason)}</p>" + timing_table_html(run.timing.results)
            replace_figure(
                self.timing_figure,
                timing_figures.latency_throughput_figure(
                    run.timing.results, title=timing_figures.chosen_title(run.timing.chosen)
                ),
            )
        else:
            self.timing_table.value = html.escape(run.stage("timing").summary)
            replace_figure(self.timing_figure, note_figure(run.stage("timing").summary))
        self.diagnosis.value = verdicts_html(diagnose(run))
        self.refresh_count += 1

    @staticmethod
    def _fusion_figure(run: QuickstartRun) -> go.Figure:
        """The fusion view of the chosen engine (the FP32 one until an engine is chosen), from its layer map."""
        engine = run.selection.engine if run.selection else run.fp32_engine
        if engine is None:
            return note_figure(run.stage("fusion").summary)
        return engine_figures.side_by_side_figure(engine.layer_map, title=f"Fusion view: {engine.engine_path.name}")
