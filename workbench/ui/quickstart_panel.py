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

from workbench.flow import STAGE_NAMES, QuickstartConfig, QuickstartSession
from workbench.ui import controls

_TABS = ("Stages", "Cleaning", "Fusion", "Per-layer diff", "Task metric", "Timing", "Diagnosis")


def _replace_figure(target: go.FigureWidget, source: go.Figure) -> None:
    """Swap a FigureWidget's content in place (the widget on screen stays the same object)."""
    with target.batch_update():
        target.data = ()
        target.add_traces(list(source.data))
        target.layout = source.layout


def _note(text: str) -> go.Figure:
    figure = go.Figure()
    figure.add_annotation(text=html.escape(text), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    figure.update_layout(template="plotly_white", height=200, xaxis_visible=False, yaxis_visible=False)
    return figure


class QuickstartPanel:
    """Precision, calibration method, streams, batch and model widgets over a QuickstartSession."""

    def __init__(self, config: QuickstartConfig | None = None, *, session: QuickstartSession | None = None) -> None:
        self.progress = controls.ProgressAdapter("stages")
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
        failed = [r for r in self.session.run.stages.values() if r.status in ("failed", "unavailable", "skipped")]
        if failed:
            self.status.warn(
                f"done; {len(failed)} stage(s) did not complete: "
                + "; ".join(f"{r.title}: {r.summary}" for r in failed)
            )
        else:
            self.status.ok(f"done: {len(self.session.run.stages)} stages complete")

    # --- rendering -------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw every table and figure from the session's current run."""
        from workbench.report import diagnose, metrics_table_html, timing_table_html
        from workbench.viz import flow as figures

        run = self.session.run
        objects = run.objects
        rows = "".join(
            f"<tr><td>{html.escape(run.stage(n).title)}</td><td>{run.stage(n).status}</td>"
            f"<td>{run.stage(n).seconds:.2f}</td><td>{html.escape(run.stage(n).summary)}</td></tr>"
            for n in STAGE_NAMES
            if n in run.stages
        )
        self.stage_table.value = (
            "<table><tr><th>stage</th><th>status</th><th>s</th><th>result</th></tr>" + rows + "</table>"
        )
        clean = objects.get("clean_result")
        _replace_figure(
            self.cleaning_figure,
            figures.cleaning_waterfall(clean)
            if clean is not None and run.stage("clean").ok
            else _note(run.stage("clean").summary),
        )
        _replace_figure(self.fusion_figure, self._fusion_figure())
        diff = objects.get("layer_diff")
        plan = objects.get("mixed_plan")
        _replace_figure(
            self.diff_figure,
            figures.layer_diff_figure(diff, list(plan.overrides) if plan else [])
            if diff is not None and run.stage("layer_diff").ok
            else _note(run.stage("layer_diff").summary),
        )
        chosen = {"int8": "int8-mixed"}.get(run.config.precision, run.config.precision)
        metrics = objects.get("metrics") or []
        self.metrics_table.value = (
            metrics_table_html(metrics, chosen) if metrics else html.escape(run.stage("metrics").summary)
        )
        _replace_figure(
            self.metrics_figure,
            figures.metrics_figure(metrics, chosen) if metrics else _note(run.stage("metrics").summary),
        )
        timing = objects.get("timing_results") or []
        if timing and run.stage("timing").ok:
            self.timing_table.value = (
                f"<p>{html.escape(run.stage('timing').data.get('reason', ''))}</p>" + timing_table_html(timing)
            )
            _replace_figure(self.timing_figure, figures.timing_figure(timing))
        else:
            self.timing_table.value = html.escape(run.stage("timing").summary)
            _replace_figure(self.timing_figure, _note(run.stage("timing").summary))
        self.diagnosis.value = (
            "<ul>"
            + "".join(f"<li><b>{html.escape(v.topic)}</b>: {html.escape(v.text)}</li>" for v in diagnose(run))
            + "</ul>"
        )
        self.refresh_count += 1

    def _fusion_figure(self) -> go.Figure:
        """The fusion view of the chosen engine (side by side with its ONNX graph when the layer map is available)."""
        from workbench.flow import fusion_rows
        from workbench.viz import flow as figures

        run = self.session.run
        artifact = run.objects.get("chosen_artifact") or run.objects.get("fp32_artifact")
        if artifact is None:
            return _note(run.stage("fusion").summary)
        title = f"Fusion view: {artifact.engine_path.name}"
        try:
            from workbench.engine.layermap import LayerMap
            from workbench.model import load_onnx
            from workbench.viz import engine as fusion_figures

            layer_map = LayerMap.from_engine_layers(
                artifact.engine_layers,
                onnx_proto=load_onnx(artifact.onnx_path, check=False).proto,
                label=artifact.engine_path.stem,
            )
            return fusion_figures.side_by_side_figure(layer_map, title=title)
        except ImportError:
            return figures.fusion_figure(fusion_rows(artifact), title)
