"""Choose among several built engines (accuracy vs speed) and export one. Thin over :mod:`workbench.flow`.

Two ways to pick: one engine per precision (``compare``), or one plan of the mixed-precision search's Pareto front
(``show_front``; the front, each plan's interval and the export are computed in :mod:`workbench.flow`).

Nothing is displayed in the constructor: show ``panel.widget`` yourself.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TypeVar

import ipywidgets as widgets

from workbench.export import Bundle
from workbench.flow import (
    EngineCandidate,
    PlanCandidate,
    QuickstartConfig,
    QuickstartSession,
    compare_precisions,
    export_plan,
    export_selection,
    front_candidates,
    recommend,
)
from workbench.flow.formats import run_front
from workbench.report.tables import candidates_table_html, front_table_html
from workbench.ui import controls
from workbench.ui.controls import figure_widget
from workbench.ui.figures import replace_figure
from workbench.ui.fit import fit_panel
from workbench.ui.progress import ProgressAdapter, Worker
from workbench.viz.calib import format_front_figure, pareto_figure
from workbench.viz.metrics import candidates_figure

T = TypeVar("T")


class ExportPanel:
    def __init__(
        self,
        config: QuickstartConfig | None = None,
        *,
        session: QuickstartSession | None = None,
        background: bool = True,
    ) -> None:
        self.session = session or QuickstartSession(config or QuickstartConfig(sweep=False, export=False))
        self.progress = ProgressAdapter("stages", cancellable=True)
        self.worker = Worker(self.progress, background=background)
        self.session.progress = self.progress
        self.status = controls.StatusArea()
        self.precision = controls.precision_dropdown(self.session.config.precision)
        self.folder = widgets.Text(
            value="", description="folder", placeholder="(new folder per export)", style={"description_width": "110px"}
        )
        self.replace = widgets.Checkbox(value=False, description="replace an existing bundle there", indent=False)
        self.compare_button = widgets.Button(description="Build and compare", icon="balance-scale")
        self.export_button = widgets.Button(description="Export chosen", button_style="primary", icon="download")
        self.table = widgets.HTML(value="<p>Nothing compared yet: press <b>Build and compare</b>.</p>")
        self.figure = figure_widget()
        self.front_button = widgets.Button(
            description="Show Pareto front", icon="line-chart", layout=widgets.Layout(width="auto", min_width="170px")
        )
        self.plan_picker = widgets.Dropdown(
            options=[], description="plan", style={"description_width": "60px"}, layout=widgets.Layout(width="70%")
        )
        self.plan_button = widgets.Button(description="Export plan", button_style="primary", icon="download")
        self.front_table = widgets.HTML(
            value="<p>Mixed-precision plans: press <b>Show Pareto front</b> (runs the accuracy-target search).</p>"
        )
        self.pareto = figure_widget()
        self.formats = figure_widget()  # the Pareto front across formats (built variants and search plans)
        self.front: tuple[PlanCandidate, ...] = ()
        self.candidates: list[EngineCandidate] = []
        self.bundle: Bundle | None = None
        self.bundles: list[Bundle] = []
        self.compare_button.on_click(lambda _b: self.compare(wait=False))
        self.export_button.on_click(lambda _b: self.export(self.precision.value, wait=False))
        self.precision.observe(lambda _change: self._render(), names="value")
        self.front_button.on_click(lambda _b: self.show_front(wait=False))
        self.plan_button.on_click(lambda _b: self.export_plan(self.plan_picker.value, wait=False))
        self.plan_picker.observe(lambda _change: self._render_front_table(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.precision, self.compare_button]),
                widgets.HBox([self.folder, self.replace, self.export_button]),
                self.progress.widget,
                self.status.widget,
                self.table,
                self.figure,
                widgets.HTML("<h4>Mixed-precision plans: the Pareto front of the accuracy-target search</h4>"),
                widgets.HBox([self.front_button, self.plan_picker, self.plan_button]),
                self.front_table,
                self.pareto,
                widgets.HTML("<h4>Pareto front across formats: every engine and plan, metric against engine size</h4>"),
                self.formats,
            ],
            layout=widgets.Layout(width="100%"),
        )
        fit_panel(self.widget)  # follows its container: wraps, scrolls wide tables, re-lays out figures
        self.widget.add_class("workbench-export-panel")

    def _guarded(self, action: Callable[[], T]) -> T | None:
        try:
            return action()
        except Exception as error:
            self.progress.failed("failed")
            self.status.error(error)
            return None

    def compare(self, wait: bool = True) -> list[EngineCandidate]:
        """Run the journey once (if needed), then build and time the engine of every precision."""
        self.status.busy("building and timing every precision...")
        self.progress.start("building and timing every precision", total=3)

        def work() -> None:
            result = self._guarded(lambda: compare_precisions(self.session, progress=self.progress))
            if result is not None:
                self.candidates = result
                self._render()
                self._load_front()
                self.progress.done(f"{len(result)} engines compared")
                self.status.ok(f"{len(result)} engines compared")

        self.worker.submit(work, wait=wait)
        return self.candidates

    def recommend(self, max_metric_drop: float | None = None) -> EngineCandidate | None:
        """The rule's pick among the compared engines (:func:`workbench.flow.recommend`), at the run's allowed drop
        (``max_metric_drop`` of its config) unless another is given."""
        drop = self.session.config.max_metric_drop if max_metric_drop is None else max_metric_drop
        return recommend(self.candidates, drop)

    def export(self, precision: str, wait: bool = True) -> Bundle | None:
        """Export the engine of ``precision`` (its bundle records accuracy with its interval, and timing): into a
        new folder per export, or the folder typed in the panel (an existing one only with "replace" ticked)."""

        def make() -> Bundle:
            run = self.session.update(precision=precision)
            if self.precision.value != precision:
                self.precision.value = precision
            return export_selection(run, self.folder.value.strip() or None, overwrite=self.replace.value)

        def outcome(bundle: Bundle) -> tuple[str, str]:
            choice = self.session.run.selection.choice if self.session.run.selection else None
            return f"exported to {bundle.path}", choice.reason if choice is not None and not choice.ok else ""

        return self._export(f"exporting the {precision} engine", make, outcome, wait)

    def _export(
        self, what: str, make: Callable[[], Bundle], outcome: Callable[[Bundle], tuple[str, str]], wait: bool
    ) -> Bundle | None:
        """Run ``make`` on the worker with progress shown; keep the bundle; ``outcome`` gives (text, warning)."""
        self.status.busy(f"{what}...")
        self.progress.start(what, total=2)
        exported: list[Bundle] = []

        def work() -> None:
            self._guarded(lambda: exported.append(make()))
            if not exported:
                return
            self.bundle = exported[0]
            self.bundles.append(self.bundle)
            text, warning = outcome(self.bundle)
            self.progress.done("exported")
            if warning:
                self.status.warn(f"{text}; but {warning}")
            else:
                self.status.ok(text)

        self.worker.submit(work, wait=wait)
        return exported[0] if exported else None

    def show_front(self, wait: bool = True) -> tuple[PlanCandidate, ...]:
        """Run the journey's mixed-precision search if it has not run, then list its Pareto front to pick from."""
        self.status.busy("mixed-precision search...")
        self.progress.start("mixed-precision search", total=1)

        def work() -> None:
            front = self._guarded(lambda: front_candidates(self.session))
            if front is not None:
                self._load_front()
                self.progress.done(f"{len(front)} plan(s) on the front")
                self.status.ok(f"{len(front)} plan(s) on the Pareto front")

        self.worker.submit(work, wait=wait)
        return self.front

    def export_plan(self, index: int | None = None, wait: bool = True) -> Bundle | None:
        """Build and export plan ``index`` of the front (default: the one picked), into a new folder per export or
        the folder typed in the panel (an existing one only with "replace" ticked)."""
        index = self.plan_picker.value if index is None else index

        def make() -> Bundle:
            return export_plan(self.session, index, self.folder.value.strip() or None, overwrite=self.replace.value)

        def outcome(bundle: Bundle) -> tuple[str, str]:
            if self.plan_picker.value != index and index in dict(self.plan_picker.options).values():
                self.plan_picker.value = index
            picked = next((c for c in self.front if c.index == index), None)
            missed = picked is not None and not picked.meets_target
            return f"plan {index} exported to {bundle.path}", "it misses the search's target" if missed else ""

        return self._export(f"building and exporting plan {index}", make, outcome, wait)

    def _load_front(self) -> None:
        search = self.session.run.mixed_search
        self.front = search.front if search is not None else ()
        options = [(c.label, c.index) for c in self.front]
        picked = next((c.index for c in self.front if c.chosen_by_search), options[0][1] if options else None)
        self.plan_picker.options = options
        self.plan_picker.value = picked
        self._render_front()

    def _render_front_table(self) -> None:
        search = self.session.run.mixed_search
        if search is None:
            return
        self.front_table.value = front_table_html(search, self.plan_picker.value) + (
            f"<p class='muted'>Engine columns: {html.escape(search.result.cost_label or 'no engine built')}. "
            f"Metric: {html.escape(search.how)}.</p>"
        )

    def _render_front(self) -> None:
        search = self.session.run.mixed_search
        if search is None:
            return
        self._render_front_table()
        replace_figure(
            self.pareto,
            pareto_figure(search.result, intervals=search.intervals, front=[c.index for c in search.front]),
        )
        self._render_formats()

    def _render_formats(self) -> None:
        front = run_front(self.session.run)  # None until the metrics stage ran
        if front is not None and any(point.engine_bytes is not None for point in front.points):
            replace_figure(self.formats, format_front_figure(front))

    def _render(self) -> None:
        # the marker follows the rule's pick (not the last export); the precision selected for export is ringed
        pick = self.recommend() if self.candidates else None
        rule_pick = pick.precision if pick is not None else None
        self.table.value = candidates_table_html(self.candidates, rule_pick)
        replace_figure(
            self.figure, candidates_figure(self.candidates, rule_pick, exported=(str(self.precision.value),))
        )
        self._render_formats()
