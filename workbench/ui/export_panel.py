"""Choose among several built engines (accuracy vs speed) and export one. Thin over :mod:`workbench.flow`.

Nothing is displayed in the constructor: show ``panel.widget`` yourself.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.export import Bundle
from workbench.flow import EngineCandidate, QuickstartConfig, QuickstartSession, compare_precisions, recommend
from workbench.ui import controls
from workbench.ui.figures import replace_figure
from workbench.ui.progress import ProgressAdapter
from workbench.viz.metrics import candidates_figure


def candidates_table_html(candidates: list[EngineCandidate], chosen: str | None = None) -> str:
    rows = "".join(
        f"<tr><td>{'&#9654; ' if c.precision == chosen else ''}{html.escape(c.precision)}</td>"
        f"<td>{'-' if c.metric is None else f'{c.metric:.4f}'}</td>"
        f"<td>{'-' if c.delta_vs_fp32 is None else f'{c.delta_vs_fp32:+.4f}'}</td>"
        f"<td>{'-' if c.throughput_per_s is None else f'{c.throughput_per_s:.0f}'}</td>"
        f"<td>{'-' if c.p50_ms is None else f'{c.p50_ms:.2f}'}</td><td>{c.engine_mb:.2f}</td><td>{c.layers}</td>"
        f"<td>{html.escape(c.how)}</td></tr>"
        for c in candidates
    )
    metric = next((c.metric_name for c in candidates if c.metric_name), "metric")
    return (
        "<table><tr><th>precision</th><th>" + html.escape(metric) + "</th><th>vs FP32</th><th>samples/s</th>"
        "<th>p50 ms</th><th>engine MB</th><th>layers</th><th>how measured</th></tr>" + rows + "</table>"
    )


class ExportPanel:
    def __init__(self, config: QuickstartConfig | None = None, *, session: QuickstartSession | None = None) -> None:
        self.session = session or QuickstartSession(config or QuickstartConfig(sweep=False))
        self.progress = ProgressAdapter("stages")
        self.session.progress = self.progress
        self.status = controls.StatusArea()
        self.precision = controls.precision_dropdown(self.session.config.precision)
        self.compare_button = widgets.Button(description="Build and compare", icon="balance-scale")
        self.export_button = widgets.Button(description="Export chosen", button_style="primary", icon="download")
        self.table = widgets.HTML()
        self.figure = go.FigureWidget()
        self.candidates: list[EngineCandidate] = []
        self.bundle: Bundle | None = None
        self.compare_button.on_click(lambda _b: self.compare())
        self.export_button.on_click(lambda _b: self._guarded(lambda: self.export(self.precision.value)))
        self.precision.observe(lambda _change: self._render(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.precision, self.compare_button, self.export_button]),
                self.progress.widget,
                self.status.widget,
                self.table,
                self.figure,
            ]
        )

    def _guarded(self, action: Any) -> Any:
        try:
            return action()
        except Exception as error:
            self.status.error(error)
            return None

    def compare(self) -> list[EngineCandidate]:
        self.status.busy("building and timing every precision...")
        result = self._guarded(lambda: compare_precisions(self.session))
        if result is not None:
            self.candidates = result
            self._render()
            self.status.ok(f"{len(result)} engines compared")
        return self.candidates

    def recommend(self, max_metric_drop: float = 0.005) -> EngineCandidate | None:
        return recommend(self.candidates, max_metric_drop)

    def export(self, precision: str) -> Bundle | None:
        """Export the engine of ``precision`` (its bundle records accuracy and timing)."""
        run = self.session.update(precision=precision)
        if self.precision.value != precision:
            self.precision.value = precision
        result = run.stage("export")
        if not result.ok:
            self.status.warn(f"export {result.status}: {result.summary}")
            return None
        self.bundle = run.bundle
        self.status.ok(result.summary)
        return self.bundle

    def _render(self) -> None:
        self.table.value = candidates_table_html(self.candidates, self.precision.value)
        replace_figure(self.figure, candidates_figure(self.candidates, self.precision.value))
