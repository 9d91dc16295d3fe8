"""The quickstart control panel: one set of controls driving the whole journey, every stage's result in a tab.

Thin: the work happens in :class:`workbench.flow.QuickstartSession` (which re-runs only the stages a changed
setting affects); the panel turns results into figures and tables. Nothing is displayed in the constructor:
show ``panel.widget`` yourself.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from workbench.errors import WorkbenchError
from workbench.flow import STAGE_NAMES, QuickstartConfig, QuickstartRun, QuickstartSession, StageResult, StageStatus

if TYPE_CHECKING:
    from workbench.flow.config import SettingValue
from workbench.report import (
    choice_html,
    diagnose,
    kept_wider,
    metrics_table_html,
    precision_checks_html,
    stage_table_html,
    timing_table_html,
    verdicts_html,
)
from workbench.ui import controls
from workbench.ui.figures import note_figure, replace_figure, show_note
from workbench.ui.fit import fit_panel
from workbench.ui.progress import ProgressAdapter, Worker
from workbench.viz import calib as calib_figures
from workbench.viz import clean as clean_figures
from workbench.viz import engine_view
from workbench.viz import metrics as metric_figures
from workbench.viz import timing as timing_figures

# the config fields a widget of the panel sets (each widget is the attribute of that name)
_SETTINGS = ("model", "precision", "calibration_method", "streams", "batch", "max_metric_drop", "confidence")
_TABS = ("Stages", "Cleaning", "Fusion", "Per-layer diff", "Task metric", "Timing", "Diagnosis")


class QuickstartPanel:
    """Model, precision, calibration method, allowed drop, confidence, streams and batch widgets over a
    QuickstartSession.

    Show ``panel.widget`` first, then call :meth:`run`: the progress bar, the current stage and the elapsed time show
    while it works. Changes made in the widgets run on a background thread (``background=True``), so the Cancel button
    and the other widgets stay live; a change while a run is busy cancels it and runs the latest settings.
    """

    def __init__(
        self,
        config: QuickstartConfig | None = None,
        *,
        session: QuickstartSession | None = None,
        background: bool = True,
    ) -> None:
        self.progress = ProgressAdapter("stages", cancellable=True)
        self.worker = Worker(self.progress, background=background)
        self.status = controls.StatusArea()
        self.stale = controls.StaleBanner()
        self.session = session or QuickstartSession(config or QuickstartConfig())
        self.session.progress = self.progress
        self.session.on_result = self._stage_finished
        cfg = self.session.config
        from workbench.zoo import entry_names

        names = entry_names()  # an ONNX file given in the config is offered beside the zoo models
        self.model = controls.model_picker(cfg.model, names if cfg.model in names else [*names, cfg.model])
        self.precision = controls.precision_dropdown(cfg.precision)
        self.calibration_method = controls.calibration_method_dropdown(cfg.calibration_method)
        self.streams = controls.streams_input(cfg.streams)
        self.batch = controls.batch_dropdown(cfg.batch)
        self.max_metric_drop = controls.max_drop_input(cfg.max_metric_drop)
        self.confidence = controls.confidence_dropdown(cfg.confidence)
        self.run_button = widgets.Button(description="Run all stages", button_style="primary", icon="play")
        self.stage_table = widgets.HTML()
        self.metrics_table = widgets.HTML()
        self.timing_table = widgets.HTML()
        self.diagnosis = widgets.HTML()
        self.cleaning_figure = controls.figure_widget()
        self.fusion_view = widgets.HTML()
        self.diff_figure = controls.figure_widget()
        self.metrics_figure = controls.figure_widget()
        self.timing_figure = controls.figure_widget()
        self.refresh_count = 0
        self._quiet = False  # set while the panel itself puts a value back into a widget
        self._pending: list[str] = []  # stages of the current action not re-run yet (shown as stale)
        self.run_button.on_click(lambda _button: self.run(wait=False))
        for name in _SETTINGS:
            getattr(self, name).observe(self._observer(name), names="value")
        tabs = widgets.Tab(
            children=[
                self.stage_table,
                self.cleaning_figure,
                self.fusion_view,
                self.diff_figure,
                widgets.VBox([self.metrics_table, self.metrics_figure]),
                widgets.VBox([self.timing_table, self.timing_figure]),
                self.diagnosis,
            ]
        )
        for index, title in enumerate(_TABS):
            tabs.set_title(index, title)
        self.tabs = tabs
        self.stage_table.value = "<p>Nothing has run yet: press <b>Run all stages</b>.</p>"
        self.widget = widgets.VBox(
            [
                widgets.HBox(
                    [
                        widgets.VBox([self.model, self.precision, self.calibration_method, self.max_metric_drop]),
                        widgets.VBox([self.streams, self.batch, self.confidence, self.run_button]),
                    ]
                ),
                self.progress.widget,
                self.status.widget,
                self.stale.widget,
                tabs,
            ],
            layout=widgets.Layout(width="100%"),
        )
        # follows its container: wraps, scrolls wide tables, re-lays out figures; marks the cells below stale
        self.fit = fit_panel(self.widget)
        self.widget.add_class("workbench-quickstart-panel")

    # --- actions ---------------------------------------------------------------------------------------------
    def _observer(self, name: str) -> Callable[[dict[str, Any]], None]:
        def changed(change: dict[str, Any]) -> None:
            if not self._quiet:
                self.apply(wait=False, **{name: change["new"]})

        return changed

    def run(self, wait: bool = True) -> None:
        """Run every stage with the current settings (``wait=False``: on the background thread)."""
        self._start(STAGE_NAMES, "running all stages", f"running every stage for {self.session.config.model}")
        self.worker.submit(lambda: self._act(self.session.run_all), wait=wait, on_warnings=self._warnings)

    def apply(self, wait: bool = True, **changes: SettingValue) -> None:
        """Change settings and re-run the affected stages (what the widgets call).

        An invalid value is refused with the message the CLI gives; the widget goes back to the value in use and no
        result changes."""
        try:
            plan = self.session.plan_update(changes)
        except WorkbenchError as error:
            self._show_settings(self.session.config)
            self.status.error(error)
            return
        if not plan.stages:
            return
        what = "updating " + ", ".join(f"{k}={v}" for k, v in changes.items())
        self._start(plan.stages, what, plan.why, clear=plan.whole_run)
        self.worker.submit(
            lambda: self._act(lambda: self.session.update(**changes)), wait=wait, on_warnings=self._warnings
        )

    def wait(self, timeout: float | None = None) -> None:
        """Block until the background action (and any queued one) finished."""
        self.worker.wait(timeout)

    def _start(self, stages: Sequence[str], what: str, why: str, *, clear: bool = False) -> None:
        """Before any work: the progress bar and busy status show, and every result about to be replaced is marked
        stale (``clear``: removed, e.g. on a model switch, so nothing of the old model stays on screen)."""
        self._pending = list(stages)
        self.stale.notes.clear()
        self.status.busy(f"{what}...")
        self.progress.start(what, total=len(stages))
        if clear:
            self._clear(why)
        else:
            self.stale.mark(f"{why}: the results below are being replaced, stage by stage")
            self.stage_table.value = stage_table_html(self.session.run, pending=self._pending)

    def _act(self, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as error:  # shown as a message in the panel, never as a traceback
            self.progress.failed("failed")
            self.status.error(error)
            self.stale.mark(
                f"the last action failed; the results below are from the previous run ({self._settings_text()})"
            )
            return
        finally:
            self._pending = []
        self._show_settings(self.session.config)
        self.refresh()
        self.stale.clear()
        run = self.session.run
        by_status: dict[StageStatus, list[StageResult]] = {status: [] for status in StageStatus}
        for result in run.stages.values():
            by_status[result.status].append(result)
        off = by_status[StageStatus.OFF]
        # stages that do not apply to this model (e.g. INT8 with nothing to quantize): a reason, no problem
        not_applicable = by_status[StageStatus.NOT_APPLICABLE]
        cancelled = by_status[StageStatus.CANCELLED]
        failed = by_status[StageStatus.FAILED] + [
            r for r in by_status[StageStatus.BLOCKED] if r.name != "export" or run.selection is None
        ]
        blocked_export = run.stage("export") if run.stage("export").status is StageStatus.BLOCKED else None
        choice = run.selection.choice if run.selection else None
        if cancelled:
            self.progress.failed("cancelled")
            self.status.warn(f"cancelled: {len(cancelled)} stage(s) did not run; their results are cleared")
        elif failed:
            self.progress.done("finished with problems")
            self.status.warn(
                f"done; {len(failed)} stage(s) did not complete: " + "; ".join(f"{r.title}: {r.reason}" for r in failed)
            )
        elif choice is not None and not choice.ok:
            self.progress.done("finished with a warning")
            text = f"done, but the {choice.variant} engine is not a safe choice: {choice.reason}"
            if blocked_export is not None:
                text += f". Export blocked: {blocked_export.reason}"
            if choice.level == "bad":
                self.status.alert(text)
            else:
                self.status.warn(text)
        else:
            self.progress.done("finished")
            complete = f"done: {len(run.stages) - len(off) - len(not_applicable)} stages complete"
            if off:
                complete += f" ({len(off)} turned off: {', '.join(r.title for r in off)})"
            if not_applicable:
                complete += (
                    f" ({len(not_applicable)} not applicable to this model: "
                    f"{', '.join(r.title for r in not_applicable)}; the first says why: {not_applicable[0].reason})"
                )
            self.status.ok(complete + (f"; {choice.reason}" if choice else ""))

    def _stage_finished(self, result: StageResult, index: int, total: int) -> None:
        if result.name in self._pending:
            self._pending.remove(result.name)
        self.stage_table.value = stage_table_html(self.session.run, pending=self._pending)

    def _warnings(self, messages: list[str]) -> None:
        self.stale.note("warnings during the run: " + "; ".join(messages[:5]))

    def _show_settings(self, config: QuickstartConfig) -> None:
        """Put the values in use back into the widgets (without triggering a run)."""
        self._quiet = True
        try:
            for name in _SETTINGS:
                widget = getattr(self, name)
                if widget.value != getattr(config, name):
                    widget.value = getattr(config, name)
        finally:
            self._quiet = False

    def _settings_text(self) -> str:
        cfg = self.session.config
        return f"model {cfg.model}, precision {cfg.precision}, {cfg.calibration_method}, {cfg.streams} stream(s), batch {cfg.batch}"

    def _clear(self, why: str) -> None:
        """Remove every result from the panel (a model switch): tables say why, figures say so, and the outputs of
        the cells below (the old run's tables and figures) are marked stale until they run again.

        Two passes: everything of the old model is blanked first, then the reasons are written. The page receives
        widget updates in order, so once any reason shows, nothing of the old model is left on screen (a user, or the
        browser test, reading the panel as the first reason appears sees no stale engine name). The stale banner is
        the first reason written; each widget's view renders its update on its own, so the test still waits for it."""
        figures = (self.cleaning_figure, self.diff_figure, self.metrics_figure, self.timing_figure)
        for table in (self.stage_table, self.metrics_table, self.timing_table, self.diagnosis, self.fusion_view):
            table.value = ""
        for figure in figures:
            show_note(figure, "")
        self.stale.mark(why)
        for figure in figures:
            show_note(figure, why)
        self.stage_table.value = f"<p>{html.escape(why)}.</p>"
        self.fusion_view.value = f"<p>{html.escape(why)}.</p>"
        self.fit.mark_below_stale(f"{why}; these outputs are from the previous run: run the cells again")

    # --- rendering -------------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Redraw every table and figure from the session's current run (the panel only reads the typed record)."""
        run = self.session.run
        self.stage_table.value = stage_table_html(run)
        replace_figure(
            self.cleaning_figure,
            clean_figures.node_waterfall_figure(run.cleaning.result)
            if run.cleaning
            else note_figure(run.stage("clean").text),
        )
        self.fusion_view.value = (
            self._fusion_html(run)
            + "<h4>Requested vs actual precision</h4>"
            + (
                precision_checks_html(run)  # read-only: each build's own check (workbench.engine.precision_check)
            )
        )
        kept = list(kept_wider(run))
        replace_figure(
            self.diff_figure,
            calib_figures.sqnr_figure(run.layer_diff.diff, highlight=kept)
            if run.layer_diff
            else note_figure(run.stage("layer_diff").text),
        )
        rows = run.metrics.rows if run.metrics else ()
        self.metrics_table.value = (
            (choice_html(run.selection.choice) if run.selection else "")
            + metrics_table_html(rows, run.chosen_variant, run.config.max_metric_drop, run.config.decision_confidence)
            if rows
            else html.escape(run.stage("metrics").text)
        )
        replace_figure(
            self.metrics_figure,
            metric_figures.metrics_figure(rows, run.chosen_variant) if rows else note_figure(run.stage("metrics").text),
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
            self.timing_table.value = html.escape(run.stage("timing").text)
            replace_figure(self.timing_figure, note_figure(run.stage("timing").text))
        self.diagnosis.value = verdicts_html(diagnose(run))
        self.refresh_count += 1

    @staticmethod
    def _fusion_html(run: QuickstartRun) -> str:
        """The engine view of the chosen engine (the FP32 one until an engine is chosen): named layer boxes coloured
        by precision with the ONNX ops each fused, the same drawing as the report's (``viz.engine_view``)."""
        engine = run.selection.engine if run.selection else run.fp32_engine
        if engine is None:
            return f"<p>{html.escape(run.stage('fusion').text)}</p>"
        heading = f"<h4>Fusion view: {html.escape(engine.engine_path.name)}</h4>"
        # no node table here: a widget's HTML runs no script, so its search box would not work
        return heading + engine_view.engine_view_html(engine.layer_map, engine.engine_layers, with_table=False)
