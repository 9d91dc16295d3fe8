"""Notebook panel for INT8 calibration: method, percentile, batches, per-layer precision, "fall back worst N".

Thin by design: every widget forwards to one :class:`workbench.calib.CalibrationSession` (statistics are gathered
once per number of batches; switching method or precision re-reads no data) and redraws figures from
:mod:`workbench.viz.calib`. Nothing is displayed or computed in the constructor; call :meth:`run`, then show
``panel.widget``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.precision import PrecisionPlan
from workbench.ui.figures import replace_figure
from workbench.ui.progress import ProgressAdapter
from workbench.viz.calib import histogram_figure, sqnr_figure
from workbench.viz.metrics import metric_table_figure


class CalibrationPanel:
    """Calibrate a zoo model interactively and watch per-layer SQNR and the task metric respond."""

    def __init__(
        self,
        model: str = "ocr-rec",
        *,
        method: str = "max",
        percentile: float = 99.99,
        max_batches: int = 4,
        batch_choices: Sequence[int] = (1, 2, 4, 8, 16),
        diff_batches: int = 1,
        eval_limit: int | None = 64,
        fallback_precision: str = "fp32",
        worst_n: int = 3,
        data: Any = None,
    ) -> None:
        import ipywidgets as widgets
        import plotly.graph_objects as go

        from workbench.ui.controls import StatusArea, calibration_method_dropdown

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

        self.method = calibration_method_dropdown(method)
        self.percentile = widgets.BoundedFloatText(
            value=percentile, min=90.0, max=100.0, step=0.001, description="percentile"
        )
        choices = sorted(set(batch_choices) | {max_batches})
        self.batches = widgets.Dropdown(options=choices, value=max_batches, description="batches")
        self.node = widgets.Dropdown(options=[], description="layer")
        self.node_precision = widgets.ToggleButtons(
            options=["int8", "fp16", "fp32"], value="int8", description="precision"
        )
        self.tensor = widgets.Dropdown(options=[], description="histogram of")
        self.worst_n = widgets.BoundedIntText(value=worst_n, min=1, max=500, description="N")
        self.fallback_button = widgets.Button(description="Fall back worst N", button_style="warning")
        self.run_button = widgets.Button(description="Calibrate", button_style="primary")
        self.status = StatusArea()
        self.progress = ProgressAdapter("calibration")
        self.sqnr = go.FigureWidget()
        self.histogram = go.FigureWidget()
        self.table = go.FigureWidget()
        self._quiet = False  # set while the panel itself changes widget values

        self.run_button.on_click(lambda _: self.run())
        self.fallback_button.on_click(lambda _: self.fall_back_worst())
        for control in (self.method, self.percentile, self.batches):
            control.observe(lambda change: self._recalibrate(), names="value")
        self.node.observe(lambda change: self._show_node_precision(), names="value")
        self.node_precision.observe(lambda change: self._set_node_precision(), names="value")
        self.tensor.observe(lambda change: self._draw_histogram(), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.method, self.percentile, self.batches, self.run_button]),
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

    # ------------------------------------------------------------------ actions
    def run(self) -> None:
        """(Re)calibrate with the current widget values and redraw everything."""
        try:
            self.status.busy("calibrating…")
            self.progress.start("loading the model", total=4)
            self._ensure_session()
            self.progress.step(f"statistics over {self.batches.value} batch(es)", 1)
            self.statistics = self.session.statistics(self.batches.value)
            self.ranges = self.statistics.ranges(self.method.value, percentile=self.percentile.value)
            self._quiet = True
            try:
                self.tensor.options = list(self.statistics.histograms)
                nodes = self.session.int8_nodes()
                self.node.options = nodes
            finally:
                self._quiet = False
            self._requantize()
            self._draw_histogram()
            warnings = "; ".join(self.ranges.warnings)
            self.progress.done("calibrated")
            self.status.ok(
                f"{len(self.statistics.histograms)} tensors from {self.statistics.num_samples} samples "
                f"({self.statistics.seconds:.1f} s), method {self.method.value}"
                + (f" — {warnings}" if warnings else "")
            )
        except Exception as error:  # shown in the panel, never as a traceback
            self.progress.failed("failed")
            self.status.error(error)

    def fall_back_worst(self, n: int | None = None) -> list[str]:
        """Move the N worst INT8 layers (by the current diff) to the fallback precision; returns their names."""
        try:
            if self.diff is None:
                self.run()
            n = self.worst_n.value if n is None else n
            self.status.busy(f"falling back the worst {n} layer(s)…")
            self.progress.start(f"ranking INT8 layers, falling back {n}", total=4)
            ranked = [
                node
                for node in self.session.rank_int8_nodes(self.diff, self.plan)
                if self.plan.precision_of(node) == "int8"
            ]
            self.worst = ranked[:n]
            self.plan = self.plan.with_overrides({node: self.fallback_precision for node in self.worst})  # type: ignore[misc]
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
        if self._quiet or self.session is None:
            return
        self.run()

    def _requantize(self) -> None:
        self.progress.step("inserting Q/DQ and diffing every layer", 2)
        int8_model = self.session.quantize(self.ranges)
        self.quantized = int8_model if not self.plan.overrides else self.session.quantize(self.ranges, self.plan)
        self.diff = self.session.diff(self.quantized, max_batches=self.diff_batches)
        replace_figure(self.sqnr, sqnr_figure(self.diff, highlight=self.worst_tensors()))
        self._metrics(int8_model)

    def worst_tensors(self) -> list[str]:
        """The output tensors of the layers "fall back worst N" moved out of INT8 (what the SQNR chart marks)."""
        if not self.worst:
            return []
        outputs = {n.name: list(n.output) for n in self.session.model.proto.graph.node}
        return [t for node in self.worst for t in outputs.get(node, [])]

    def _metrics(self, int8_model: Any) -> None:
        rows = []
        self.progress.step("task metric of each variant", 3)
        total = len(self.session.int8_nodes())
        if self.session.entry is not None:
            fp32 = self.session.evaluate(limit=self.eval_limit)
            int8 = self.session.evaluate(int8_model, limit=self.eval_limit)
            rows.append({"variant": "FP32", "metric": fp32.name, "value": fp32.value, "int8_nodes": 0, "fallback": 0})
            rows.append(
                {
                    "variant": f"INT8 ({self.method.value})",
                    "metric": int8.name,
                    "value": int8.value,
                    "int8_nodes": total,
                    "fallback": 0,
                }
            )
            if self.plan.overrides:
                mixed = self.session.evaluate(self.quantized, limit=self.eval_limit)
                kept = len(self.quantized.placement.int8_nodes)
                rows.append(
                    {
                        "variant": f"mixed ({self.plan.label})",
                        "metric": mixed.name,
                        "value": mixed.value,
                        "int8_nodes": kept,
                        "fallback": total - kept,
                    }
                )
        self.metric_rows = rows
        replace_figure(self.table, metric_table_figure(rows))

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
