"""Notebook panel for INT8 calibration: method, percentile, batches, weight rounding, grid alignment, per-layer
precision (INT8, FP8, FP16, FP32), "fall back worst N".

Thin by design: every widget forwards to one :class:`workbench.calib.CalibrationSession` (statistics are gathered
once per number of batches; switching method or precision re-reads no data) and redraws figures from
:mod:`workbench.viz.calib`. Nothing is displayed or computed in the constructor; call :meth:`run`, then show
``panel.widget``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from workbench.calib.alignment_choice import GRID_ALIGNMENT_CHOICES
from workbench.calib.methods import check_percentile
from workbench.calib.rounding import WEIGHT_ROUNDING_LABELS, WeightRoundingChoice
from workbench.errors import WorkbenchError
from workbench.flow.uncertainty import versus_reference
from workbench.precision import PrecisionPlan
from workbench.ui.controls import figure_widget
from workbench.ui.figures import replace_figure
from workbench.ui.fit import fit_panel
from workbench.ui.progress import ProgressAdapter
from workbench.viz.calib import histogram_figure, sqnr_figure
from workbench.viz.metrics import metric_table_figure


class CalibrationPanel:
    """Calibrate a zoo model interactively and watch per-layer SQNR and the task metric respond."""

    def __init__(
        self,
        model: str = "ocr-rec",
        *,
        method: str = "mse",  # calibrate's default (notebook 03 shows max, whose INT8 loss it diagnoses)
        percentile: float = 99.99,
        weight_rounding: WeightRoundingChoice = "auto",
        grid_alignment: str = "auto",
        max_batches: int = 4,
        batch_choices: Sequence[int] = (1, 2, 4, 8, 16),
        diff_batches: int = 1,
        eval_limit: int | None = 64,
        fallback_precision: str = "fp32",
        worst_n: int = 3,
        data: Any = None,
    ) -> None:
        import ipywidgets as widgets

        from workbench.ui.controls import StatusArea, calibration_method_dropdown

        if not isinstance(weight_rounding, str) or weight_rounding not in WEIGHT_ROUNDING_LABELS:
            raise WorkbenchError(
                f"weight rounding {weight_rounding!r} is not known.", expected=" or ".join(WEIGHT_ROUNDING_LABELS)
            )
        if not isinstance(grid_alignment, str) or grid_alignment not in GRID_ALIGNMENT_CHOICES:
            raise WorkbenchError(
                f"grid alignment {grid_alignment!r} is not known.", expected=" or ".join(GRID_ALIGNMENT_CHOICES)
            )
        self.model_name = model
        self.data = data
        self.diff_batches = diff_batches
        self.eval_limit = eval_limit
        self.fallback_precision = fallback_precision
        self.session: Any = None
        self.plan = PrecisionPlan(default="int8")
        self.statistics: Any = None
        self.ranges: Any = None
        self.quantized: Any = None
        self.diff: Any = None
        self.metric_rows: list[dict[str, Any]] = []
        self.worst: list[str] = []
        self.rounding_note = ""  # what the weights' rounding is and why (auto: what it measured)
        # (dropdown value, ranges version, grids dropdown when auto: both auto are chosen together) it was set for
        self._rounding_for: tuple[str, int, str] | None = None
        self.alignment_note = ""  # whether INT8 grids are aligned and why (auto: what it measured)
        # (dropdown value, ranges version, weight rounding) the alignment was set for
        self._alignment_for: tuple[str, int, str] | None = None
        self._ranges_version = 0

        self.method = calibration_method_dropdown(method)
        # plain text fields: a bounded field clamps 100.5 to 100 silently; the panel refuses out-of-range values
        self.percentile = widgets.FloatText(value=percentile, step=0.001, description="percentile (0-100]")
        self._in_use = {"percentile": percentile, "worst_n": worst_n}
        choices = sorted(set(batch_choices) | {max_batches})
        self.batches = widgets.Dropdown(options=choices, value=max_batches, description="batches")
        # auto is calibrate's default for zoo models: the all-INT8 plan is scored with both roundings and GPTQ is kept
        # only on a clear gain (workbench.calib.rounding_choice); a mixed plan keeps what all-INT8 chose, as the search
        self.rounding = widgets.Dropdown(
            options=[(label, value) for value, label in WEIGHT_ROUNDING_LABELS.items()],
            value=weight_rounding,
            description="weights",
        )
        # auto is calibrate's default too; with the weights on auto both are chosen together
        # (workbench.calib.quantization_choice)
        self.alignment = widgets.Dropdown(
            options=[(value, value) for value in GRID_ALIGNMENT_CHOICES], value=grid_alignment, description="grids"
        )
        self.node = widgets.Dropdown(options=[], description="layer")
        self.node_precision = widgets.ToggleButtons(
            options=["int8", "fp8", "fp16", "fp32"], value="int8", description="precision"
        )
        self.tensor = widgets.Dropdown(options=[], description="histogram of")
        self.worst_n = widgets.IntText(value=worst_n, description="N")
        self.fallback_button = widgets.Button(description="Fall back worst N", button_style="warning")
        self.run_button = widgets.Button(description="Calibrate", button_style="primary")
        self.status = StatusArea()
        self.progress = ProgressAdapter("calibration")
        self.sqnr = figure_widget()
        self.histogram = figure_widget()
        self.table = figure_widget()
        self._quiet = False  # set while the panel itself changes widget values

        self.run_button.on_click(lambda _: self.run())
        self.fallback_button.on_click(lambda _: self.fall_back_worst())
        for control in (self.method, self.percentile, self.batches):
            control.observe(lambda change: self._recalibrate(), names="value")
        self.rounding.observe(lambda change: self._change_quantization(self.rounding, change["old"]), names="value")
        self.alignment.observe(lambda change: self._change_quantization(self.alignment, change["old"]), names="value")
        self.worst_n.observe(lambda change: self._check_worst_n(), names="value")
        self.node.observe(lambda change: self._show_node_precision(), names="value")
        self.node_precision.observe(lambda change: self._set_node_precision(), names="value")
        self.tensor.observe(lambda change: self._draw_histogram(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox(
                    [self.method, self.percentile, self.batches, self.rounding, self.alignment, self.run_button]
                ),
                widgets.HBox([self.node, self.node_precision]),
                widgets.HBox([self.worst_n, self.fallback_button]),
                self.progress.widget,
                self.status.widget,
                self.table,
                self.sqnr,
                self.tensor,
                self.histogram,
            ]
        )
        fit_panel(self.widget)  # follows its container: wraps, scrolls wide tables, re-lays out figures

    # ------------------------------------------------------------------ actions
    def run(self) -> None:
        """(Re)calibrate with the current widget values and redraw everything."""
        try:
            self.status.busy("calibrating…")
            self.progress.start("loading the model", total=4)
            self._ensure_session()
            self.progress.step(f"statistics over {self.batches.value} batch(es)", 1)
            self.session.max_batches = self.batches.value  # GPTQ's layer inputs read the same batches
            self.statistics = self.session.statistics(self.batches.value)
            self.ranges = self.statistics.ranges(self.method.value, percentile=self.percentile.value)
            self._ranges_version += 1
            self._quiet = True
            try:
                self.tensor.options = list(self.statistics.histograms)
                nodes = self.session.int8_nodes()
                self.node.options = nodes
            finally:
                self._quiet = False
            self._requantize()
            self._select_defaults()
            self._draw_histogram()
            warnings = "; ".join(self.ranges.warnings)
            self.progress.done("calibrated")
            self.status.ok(
                f"{len(self.statistics.histograms)} tensors from {self.statistics.num_samples} samples "
                f"({self.statistics.seconds:.1f} s), method {self.method.value}; {self.rounding_note}; "
                f"{self.alignment_note}" + (f" — {warnings}" if warnings else "")
            )
        except Exception as error:  # shown in the panel, never as a traceback
            self.progress.failed("failed")
            self.status.error(error)

    def fall_back_worst(self, n: int | None = None) -> list[str]:
        """Move the N worst INT8 layers (by the current diff) to the fallback precision; returns their names."""
        try:
            if self.diff is None:
                self.run()
            if n is None:
                if not self._check_worst_n():
                    return []
                n = self.worst_n.value
            self.status.busy(f"falling back the worst {n} layer(s)…")
            self.progress.start(f"ranking INT8 layers, falling back {n}", total=4)
            self.worst = self.session.worst_int8_nodes(self.diff, n, self.plan)  # one INT8 layer always stays
            self.plan = self.session.fallback_plan(self.worst, self.fallback_precision, self.plan)  # type: ignore[arg-type]
            self._requantize()
            self._show_node_precision()
            self.progress.done("done")
            self.status.ok(f"fell back to {self.fallback_precision}: {', '.join(self.worst)}")
            return self.worst
        except Exception as error:
            self.progress.failed("failed")
            self.status.error(error)
            return []

    def set_precision(self, node: str, precision: str) -> None:
        """Per-layer precision (same as choosing the layer and its toggle in the widgets)."""
        self.node.value = node
        self.node_precision.value = precision

    # ------------------------------------------------------------------ internals
    def _ensure_session(self) -> None:
        if self.session is not None:
            return
        from workbench.calib.session import CalibrationSession
        from workbench.zoo import get_entry

        entry = get_entry(self.model_name)
        self.session = CalibrationSession(entry.load(), entry=entry, data=self.data, progress=False)

    def _recalibrate(self) -> None:
        if self._quiet:
            return
        value = self.percentile.value
        try:
            check_percentile(value)  # the method's own rule (the CLI's --percentile too)
        except WorkbenchError as error:
            self._refuse(self.percentile, "percentile", error)
            return
        self._in_use["percentile"] = value
        if self.session is None:
            return
        self.run()

    def _check_worst_n(self) -> bool:
        """N must name at least one and at most every INT8 layer; otherwise refused (the field goes back)."""
        if self._quiet:
            return True
        n = self.worst_n.value
        try:
            if self.session is not None:
                self.session.check_fallback_count(n, self.plan)
            elif n < 1:
                raise WorkbenchError(f"N={n} is out of range.", expected="at least 1")
        except WorkbenchError as error:
            self._refuse(self.worst_n, "worst_n", error)
            return False
        self._in_use["worst_n"] = n
        return True

    def _refuse(self, widget: Any, key: str, error: WorkbenchError) -> None:
        """Show the error and put the value in use back, changing nothing else."""
        self.status.error(error)
        self._quiet = True
        try:
            widget.value = self._in_use[key]
        finally:
            self._quiet = False

    def _change_quantization(self, control: Any, previous: str) -> None:
        """The weights or grids dropdown changed from ``previous``: requantize; on an error the session, the dropdown
        and the drawn results go back to what was in use."""
        if self._quiet or self.session is None or self.ranges is None:
            return
        rounding, rounding_for = self.session.weight_rounding, self._rounding_for
        aligned, alignment_for = self.session.align_grids, self._alignment_for
        notes = (self.rounding_note, self.alignment_note)
        try:
            self.status.busy(f"{control.description}: {control.label}…")
            self.progress.start(f"{control.description}: {control.label}", total=4)
            self._requantize()
            self.progress.done("done")
            self.status.ok(f"{self.rounding_note}; {self.alignment_note}")
        except Exception as error:
            self.progress.failed("failed")
            self.session.weight_rounding, self._rounding_for = rounding, rounding_for
            self.session.align_grids, self._alignment_for = aligned, alignment_for
            self.rounding_note, self.alignment_note = notes
            self._quiet = True
            try:
                control.value = previous
                with contextlib.suppress(Exception):  # the first error is the one to show
                    self._requantize()  # its metrics are cached by the model's bytes: a redraw, no new evaluation
            finally:
                self._quiet = False
            self.status.error(error)

    def _apply_rounding(self) -> None:
        """Put the dropdown's weight rounding on the session; auto measures it (once per ranges) on all-INT8."""
        wanted: WeightRoundingChoice = self.rounding.value
        key = (wanted, self._ranges_version, self.alignment.value if wanted == "auto" else "")
        if self._rounding_for == key:
            return
        if wanted == "auto" and self.alignment.value == "auto":  # both chosen together, as calibrate does
            from workbench.calib.quantization_choice import choose_rounding_and_alignment

            self.progress.step("weight rounding and grid alignment: all-INT8 quantized four ways and scored", 2)
            plan = self.session.default_plan("int8")
            rounding, alignment = choose_rounding_and_alignment(self.session, self.ranges, plan, self.eval_limit)
            self.rounding_note, self.alignment_note = rounding.note, alignment.note
            self._rounding_for = key
            self._alignment_for = ("auto", self._ranges_version, self.session.weight_rounding)
            return
        # auto alone: chosen on the plain model (alignment after it) or on the alignment the panel fixes
        self.session.align_grids, self._alignment_for = self.alignment.value == "on", None
        if wanted == "auto":
            from workbench.calib.rounding_choice import choose_weight_rounding

            self.progress.step("weight rounding: all-INT8 scored with nearest and with GPTQ", 2)
            plan = self.session.default_plan("int8")
            self.rounding_note = choose_weight_rounding(self.session, self.ranges, plan, self.eval_limit).note
        else:
            self.session.weight_rounding = wanted
            self.rounding_note = f"weights rounded by {WEIGHT_ROUNDING_LABELS[wanted]} (chosen in the panel)"
        self._rounding_for = key

    def _apply_alignment(self) -> None:
        """Put the dropdown's grid alignment on the session; auto measures it on all-INT8 (once per ranges and
        rounding), as `calibrate` does when the weight rounding is forced (both auto: chosen with the rounding)."""
        wanted = self.alignment.value
        key = (wanted, self._ranges_version, self.session.weight_rounding)
        if self._alignment_for == key:
            return
        if wanted == "auto":
            from workbench.calib.alignment_choice import choose_grid_alignment

            self.progress.step("grid alignment: all-INT8 quantized with and without it", 2)
            plan = self.session.default_plan("int8")
            self.alignment_note = choose_grid_alignment(self.session, self.ranges, plan, self.eval_limit).note
        else:
            self.session.align_grids = wanted == "on"
            self.alignment_note = f"grid alignment {wanted} (chosen in the panel)"
        self._alignment_for = key

    def _requantize(self) -> None:
        self._apply_rounding()
        self._apply_alignment()
        self.progress.step("inserting Q/DQ and diffing every layer", 2)
        int8_model = self.session.quantize(self.ranges)
        self.quantized = int8_model if not self.plan.overrides else self.session.quantize(self.ranges, self.plan)
        self.diff = self.session.diff(self.quantized, max_batches=self.diff_batches)
        replace_figure(self.sqnr, sqnr_figure(self.diff, highlight=self.worst_tensors()))
        self._metrics(int8_model)

    def _select_defaults(self) -> None:
        """First render not blank: the layer and histogram pickers start on the worst INT8 layer and its input."""
        ranked = self.session.rank_int8_nodes(self.diff, self.plan)
        self._quiet = True
        try:
            if self.node.value not in self.node.options and self.node.options:
                self.node.value = next((n for n in ranked if n in self.node.options), self.node.options[0])
            if self.tensor.value not in self.tensor.options and self.tensor.options:
                worst = self.diff.ranking(1)
                inputs = self.session.input_tensors(ranked[0]) if ranked else []
                candidates = [t for t in inputs if t in self.tensor.options]
                name = worst[0].name if worst and worst[0].name in self.tensor.options else None
                self.tensor.value = name or (candidates[0] if candidates else self.tensor.options[0])
        finally:
            self._quiet = False
        self._show_node_precision()

    def worst_tensors(self) -> list[str]:
        """The output tensors of the layers "fall back worst N" moved out of INT8 (what the SQNR chart marks)."""
        return self.session.output_tensors(self.worst) if self.worst else []

    def _metrics(self, int8_model: Any) -> None:
        rows = []
        self.progress.step("task metric of each variant", 3)
        total = len(self.session.int8_nodes())
        if self.session.entry is not None:
            fp32 = self.session.evaluate(limit=self.eval_limit)
            int8 = self.session.evaluate(int8_model, limit=self.eval_limit)
            rows.append(
                {
                    "variant": "FP32",
                    "metric": fp32.name,
                    "value": fp32.value,
                    "int8_nodes": 0,
                    "fp8_nodes": 0,
                    "fallback": 0,
                }
            )
            rows.append(
                {
                    # what the model's weights are, not what was asked: GPTQ on one batch rounds to nearest
                    "variant": f"INT8 ({self.method.value}{', GPTQ weights' if int8_model.weight_rounding else ''}"
                    f"{', grids aligned' if int8_model.alignment and int8_model.alignment.rewritten else ''})",
                    "metric": int8.name,
                    "value": int8.value,
                    "int8_nodes": total,
                    "fp8_nodes": 0,
                    "fallback": 0,
                }
            )
            if self.plan.overrides:
                mixed = self.session.evaluate(self.quantized, limit=self.eval_limit)
                kept = len(self.quantized.placement.int8_nodes)
                fp8 = len(self.quantized.placement.fp8_nodes)
                rows.append(
                    {
                        "variant": f"mixed ({self.plan.label})",
                        "metric": mixed.name,
                        "value": mixed.value,
                        "int8_nodes": kept,
                        "fp8_nodes": fp8,
                        "fallback": total - kept - fp8,  # FP16 / FP32
                    }
                )
        if rows:
            self._add_intervals(rows, [fp32, int8] + ([mixed] if self.plan.overrides else []))
        self.metric_rows = rows
        replace_figure(self.table, metric_table_figure(rows))

    @staticmethod
    def _add_intervals(rows: list[dict[str, Any]], results: list[Any]) -> None:
        """Each row's sample count, 95 % interval and paired difference to FP32 (:func:`versus_reference`)."""
        for row, compared in zip(rows, versus_reference(results)):
            interval = compared.estimate
            row["n"] = interval.n
            row["interval"] = f"[{interval.low:.4f}, {interval.high:.4f}]" if interval.has_interval else "-"
            row["vs_fp32"] = compared.difference_text()

    def _draw_histogram(self) -> None:
        if self._quiet or self.statistics is None or not self.tensor.value:
            return
        thresholds = self.statistics.all_methods(self.tensor.value, percentile=self.percentile.value)
        replace_figure(self.histogram, histogram_figure(self.statistics.histograms[self.tensor.value], thresholds))

    def _show_node_precision(self) -> None:
        if not self.node.value:
            return
        self._quiet = True
        try:
            self.node_precision.value = self.plan.precision_of(self.node.value)
        finally:
            self._quiet = False

    def _set_node_precision(self) -> None:
        if self._quiet or self.session is None or not self.node.value:
            return
        try:
            self.status.busy(f"{self.node.value} -> {self.node_precision.value}…")
            self.progress.start(f"{self.node.value} -> {self.node_precision.value}", total=4)
            self.plan = self.plan.with_overrides({self.node.value: self.node_precision.value})
            self._requantize()
            self.progress.done("done")
            self.status.ok(f"{self.node.value} -> {self.node_precision.value}")
        except Exception as error:
            self.progress.failed("failed")
            self.status.error(error)
