"""Notebook panel for the cleaner: pick a model, tick passes, run; waterfall, op-count table, neighbourhood.

Thin by design: widgets forward to :func:`workbench.clean.clean_model` and :mod:`workbench.viz.clean`.
Nothing is displayed in the constructor; show ``panel.widget`` yourself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.clean import DEFAULT_PASSES, CleanOptions, CleanResult, clean_model
from workbench.ui.controls import figure_widget
from workbench.ui.figures import replace_figure
from workbench.ui.fit import fit_panel
from workbench.ui.progress import ProgressAdapter
from workbench.viz import clean as figures

_PATH_CHOICE = "(path below)"


class CleanPanel:
    """Model picker (zoo name or a path), one checkbox per pass, a run button, and three figures."""

    def __init__(self, model: str = "ocr-cls", passes: tuple[str, ...] = DEFAULT_PASSES, path: str = "") -> None:
        import ipywidgets as widgets

        from workbench.ui.controls import StatusArea, model_picker
        from workbench.zoo import entry_names

        names = list(entry_names()) + [_PATH_CHOICE]
        self.model_picker = model_picker(model if model in names else _PATH_CHOICE, names)
        self.path_text = widgets.Text(value=path, description="ONNX path", placeholder="/path/to/model.onnx")
        self.pass_boxes = {
            name: widgets.Checkbox(value=name in passes, description=name, indent=False) for name in DEFAULT_PASSES
        }
        self.check_box = widgets.Checkbox(value=True, description="check every pass (ORT equivalence)", indent=False)
        self.run_button = widgets.Button(description="Clean", button_style="primary")
        self.pass_picker = widgets.Dropdown(options=[], description="show pass")
        self.status = StatusArea()
        self.progress = ProgressAdapter("cleaning")
        self.waterfall = figure_widget()
        self.table = figure_widget()
        self.neighbourhood = figure_widget()
        self.result: CleanResult | None = None
        self.run_button.on_click(lambda _: self.run())
        self.pass_picker.observe(lambda change: self.select_pass(change["new"]), names="value")
        self.widget = widgets.VBox(
            [
                widgets.HBox([self.model_picker, self.path_text]),
                widgets.GridBox(
                    list(self.pass_boxes.values()), layout=widgets.Layout(grid_template_columns="repeat(4, 240px)")
                ),
                widgets.HBox([self.check_box, self.run_button]),
                self.progress.widget,
                self.status.widget,
                self.waterfall,
                self.table,
                self.pass_picker,
                self.neighbourhood,
            ]
        )
        fit_panel(self.widget)  # follows its container: wraps, scrolls wide tables, re-lays out figures

    @property
    def selected_passes(self) -> list[str]:
        return [name for name, box in self.pass_boxes.items() if box.value]

    def source(self) -> tuple[Any, dict | None]:
        """The chosen model (zoo entry's ONNX path, or the typed path) and its input profile (None for a path)."""
        if self.model_picker.value == _PATH_CHOICE:
            return Path(self.path_text.value.strip()), None
        from workbench.zoo import get_entry

        entry = get_entry(self.model_picker.value)
        return entry.onnx_path(), entry.input_profiles()

    def run(self) -> CleanResult | None:
        """Clean the chosen model with the ticked passes and redraw every figure; errors go to the status line."""
        self.status.busy("cleaning…")
        self.progress.start(f"cleaning with {len(self.selected_passes)} pass(es)")
        try:
            source, profile = self.source()
            self.result = clean_model(
                source, CleanOptions(passes=self.selected_passes, profile=profile, check=self.check_box.value)
            )
        except Exception as error:  # shown, not raised: a panel must survive bad input
            self.progress.failed("failed")
            self.status.error(error)
            return None
        self.progress.done("cleaned")
        result = self.result
        rolled = ", ".join(r.name for r in result.rolled_back) or "none"
        self.status.ok(
            f"{result.nodes_before} → {result.nodes_after} nodes in {result.seconds:.2f} s (checks {result.check_seconds:.2f} s); rolled back: {rolled}"
        )
        replace_figure(self.waterfall, figures.node_waterfall_figure(result))
        replace_figure(self.table, figures.op_delta_table_figure(result))
        changed = [r.name for r in result.passes if r.nodes_removed or r.nodes_added]
        options = changed or [r.name for r in result.passes]
        self.pass_picker.options = options
        if self.pass_picker.value in options:
            self.select_pass(self.pass_picker.value)
        else:
            self.pass_picker.value = options[0] if options else None  # triggers select_pass
        return result

    def select_pass(self, name: str | None) -> None:
        if not name or self.result is None:
            return
        replace_figure(self.neighbourhood, figures.neighbourhood_figure(self.result.report(name)))
        replace_figure(self.table, figures.op_delta_table_figure(self.result, name))
