"""Notebook panel for the layer map: linked selection between ONNX nodes and engine layers.

Thin by design: it holds widgets and forwards to :mod:`workbench.engine` (one build function,
:func:`~workbench.engine.build.engine_for_model`, and the engine's own layer map) and :mod:`workbench.viz.engine`.
Nothing is displayed in the constructor; show ``panel.widget`` (or call ``panel.show()``) yourself.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from workbench.engine.layermap import LayerMap, diff_layer_maps
from workbench.precision.variant import VARIANTS
from workbench.ui.controls import responsive
from workbench.ui.fit import fit_panel
from workbench.ui.progress import ProgressAdapter
from workbench.viz import engine as figures

if TYPE_CHECKING:
    import ipywidgets
    from plotly.basedatatypes import BaseTraceType
    from plotly.callbacks import InputDeviceState, Points


class FusionPanel:
    """Side-by-side view as a FigureWidget: clicking (or choosing) a layer highlights its ONNX nodes, clicking a
    node highlights its layers. A sortable layer table and, with ``compare_with``, a fusion diff sit below."""

    def __init__(self, layer_map: LayerMap, *, compare_with: LayerMap | None = None, max_items: int = 400) -> None:
        import ipywidgets as widgets
        import plotly.graph_objects as go

        self.layer_map = layer_map
        self.compare_with = compare_with
        self.view = figures.side_by_side_layout(layer_map, max_items=max_items)
        self.figure = responsive(go.FigureWidget(figures.side_by_side_figure(layer_map, layout=self.view)))
        self.table = responsive(go.FigureWidget(figures.layer_table_figure(layer_map)))
        self.diff_figure = (
            responsive(go.FigureWidget(figures.fusion_diff_figure(diff_layer_maps(compare_with, layer_map))))
            if compare_with is not None
            else None
        )
        self.layer_picker = widgets.Dropdown(
            options=[("(none)", "")] + [(layer.name, layer.name) for layer in layer_map.layers],
            value="",
            description="layer",
        )
        self.sort_picker = widgets.Dropdown(options=list(figures.SORT_COLUMNS), value="index", description="sort by")
        self.descending = widgets.Checkbox(value=False, description="descending")
        self.details = widgets.HTML()
        self.hide_folded = widgets.Checkbox(value=False, description="hide folded nodes")
        self.max_items = max_items
        self.selected_layer: str = ""
        self.selected_node: str = ""
        self._trace(figures.NODES_TRACE).on_click(self._on_node_click)
        self._trace(figures.LAYERS_TRACE).on_click(self._on_layer_click)
        self.layer_picker.observe(lambda change: self.select_layer(change["new"]), names="value")
        self.sort_picker.observe(lambda change: self._resort(), names="value")
        self.descending.observe(lambda change: self._resort(), names="value")
        self.hide_folded.observe(lambda change: self._relayout(), names="value")

    # --- selection -------------------------------------------------------------------------------------------
    def _trace(self, name: str) -> BaseTraceType:
        return next(trace for trace in self.figure.data if trace.name == name)

    def select_layer(self, name: str) -> list[int]:
        """Highlight one engine layer and the ONNX node markers it came from; returns those marker indices."""
        if not name:
            self.clear()
            return []
        layer = self.layer_map.layer(name)
        items = sorted({self.view.item_of_node[node] for node in layer.onnx_nodes if node in self.view.item_of_node})
        self._highlight(items, [layer.index])
        self.selected_layer, self.selected_node = name, ""
        if self.layer_picker.value != name:
            self.layer_picker.value = name
        self.details.value = f"<b>{name}</b> ({layer.layer_type}, {layer.precision})<br>" + (
            "inserted by TensorRT, no ONNX source"
            if layer.inserted
            else f"{len(layer.onnx_nodes)} ONNX node(s): " + ", ".join(layer.onnx_nodes[:20])
        )
        return items

    def select_node(self, name: str) -> list[int]:
        """Highlight one ONNX node (its marker) and the engine layers that execute it; returns the layer indices."""
        node = self.layer_map.node(name)
        layers = [self.layer_map.layer(layer).index for layer in node.engine_layers]
        self._highlight([self.view.item_of_node[name]], layers)
        self.selected_node, self.selected_layer = name, ""
        self.details.value = f"<b>{name}</b> ({node.op_type})<br>" + (
            "folded away: in no engine layer" if node.folded else "in layers: " + ", ".join(node.engine_layers)
        )
        return layers

    def clear(self) -> None:
        with self.figure.batch_update():
            self._trace(figures.NODES_TRACE).selectedpoints = None
            self._trace(figures.LAYERS_TRACE).selectedpoints = None
            self._trace(figures.HIGHLIGHT_TRACE).update(x=[], y=[])
        self.selected_layer = self.selected_node = ""
        self.details.value = ""

    def _highlight(self, items: Sequence[int], layers: Sequence[int]) -> None:
        xs: list[float | None] = []
        ys: list[float | None] = []
        layer_set = set(layers)
        for item in items:
            for layer in self.view.items[item].layers:
                if layer in layer_set:
                    xs += [0.0, 1.0, None]
                    ys += [self.view.node_y(item), self.view.layer_y(layer), None]
        with self.figure.batch_update():
            self._trace(figures.NODES_TRACE).selectedpoints = list(items)
            self._trace(figures.LAYERS_TRACE).selectedpoints = list(layers)
            self._trace(figures.HIGHLIGHT_TRACE).update(x=xs, y=ys)

    def _on_layer_click(self, trace: BaseTraceType, points: Points, state: InputDeviceState) -> None:
        if points.point_inds:
            self.select_layer(self.view.layers[points.point_inds[0]].name)

    def _on_node_click(self, trace: BaseTraceType, points: Points, state: InputDeviceState) -> None:
        if points.point_inds:
            item = self.view.items[points.point_inds[0]]
            self.select_node(item.members[0].name)

    def _relayout(self) -> None:
        """Recompute the node column (e.g. without folded nodes) and update the widget's traces in place."""
        self.view = figures.side_by_side_layout(
            self.layer_map, max_items=self.max_items, hide_folded=self.hide_folded.value
        )
        fresh = figures.side_by_side_figure(self.layer_map, layout=self.view)
        with self.figure.batch_update():
            for name in (figures.LINKS_TRACE, figures.NODES_TRACE, figures.LAYERS_TRACE):
                new = next(trace for trace in fresh.data if trace.name == name)
                self._trace(name).update(
                    x=new.x,
                    y=new.y,
                    text=new.text,
                    hovertext=new.hovertext,
                    customdata=new.customdata,
                    marker=new.marker,
                    selectedpoints=None,
                )
            self._trace(figures.HIGHLIGHT_TRACE).update(x=[], y=[])
            self.figure.layout.title.text = fresh.layout.title.text
            self.figure.layout.height = fresh.layout.height
        if self.selected_layer:
            self.select_layer(self.selected_layer)

    # --- table -----------------------------------------------------------------------------------------------
    def _resort(self) -> None:
        fresh = figures.layer_table_figure(self.layer_map, self.sort_picker.value, self.descending.value)
        with self.table.batch_update():
            self.table.data[0].cells.values = fresh.data[0].cells.values
            self.table.data[0].cells.fill.color = fresh.data[0].cells.fill.color
            self.table.data[0].header.values = fresh.data[0].header.values
            self.table.layout.title.text = fresh.layout.title.text

    # --- layout ----------------------------------------------------------------------------------------------
    @property
    def widget(self) -> ipywidgets.VBox:
        import ipywidgets as widgets

        children: list[ipywidgets.Widget] = [
            widgets.HBox([self.layer_picker, self.hide_folded]),
            self.details,
            self.figure,
            widgets.HBox([self.sort_picker, self.descending]),
            self.table,
        ]
        if self.diff_figure is not None:
            children.append(self.diff_figure)
        return widgets.VBox(children)

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)


class FusionExplorer:
    """Choose a zoo model, a precision and a build to compare with; build (with a progress bar) and explore.

    ``build()`` does what the Build button does and returns the new :class:`FusionPanel`. Builds are cached per
    (model, precision) for the life of the explorer.
    """

    def __init__(
        self,
        out_dir: str = "out/fusions",
        *,
        model: str = "digits-cnn",
        precision: str = "fp16",
        compare: str = "fp32",
        models: Sequence[str] | None = None,
    ) -> None:
        import ipywidgets as widgets

        from workbench.zoo import entry_names

        self.out_dir = out_dir
        self.model = widgets.Dropdown(options=list(models or entry_names()), value=model, description="model")
        # the variants built straight from the ONNX (no calibration): FP32 and FP16
        buildable = [(info.label, variant.value) for variant, info in VARIANTS.items() if not info.quantized]
        self.precision = widgets.ToggleButtons(options=buildable, value=precision, description="precision")
        self.compare = widgets.Dropdown(options=[("(none)", ""), *buildable], value=compare, description="compare with")
        self.build_button = widgets.Button(description="Build", button_style="primary")
        self.progress = ProgressAdapter("build")
        self.message = widgets.HTML()
        self.panel: FusionPanel | None = None
        self.maps: dict[tuple[str, str], LayerMap] = {}
        self.build_seconds: dict[tuple[str, str], float] = {}
        self._controls = widgets.VBox(
            [
                widgets.HBox([self.model, self.compare]),
                self.precision,
                widgets.HBox([self.build_button, self.progress.widget]),
                self.message,
            ]
        )
        self.container = widgets.VBox([self._controls])
        # the fit widget rides with the controls (the panel below them is replaced per build)
        fit_panel(self.container, holder=self._controls)
        self.build_button.on_click(lambda _button: self.build())

    def layer_map(self, model: str, precision: str) -> LayerMap:
        """Build ``model`` at ``precision`` (once) and return the engine's own layer map."""
        key = (model, precision)
        if key not in self.maps:
            from workbench.engine.build import engine_for_model

            self.progress.start(f"building {model} {precision}")
            artifact = engine_for_model(model, precision, self.out_dir, progress_callback=self.progress)
            self.progress.done(f"built {model} {precision}")
            self.build_seconds[key] = artifact.build_seconds
            self.maps[key] = artifact.layer_map
        return self.maps[key]

    def build(self) -> FusionPanel | None:
        from workbench.errors import WorkbenchError

        try:
            after = self.layer_map(self.model.value, self.precision.value)
            before = (
                self.layer_map(self.model.value, self.compare.value)
                if self.compare.value and self.compare.value != self.precision.value
                else None
            )
        except WorkbenchError as error:
            self.progress.failed("failed")
            self.message.value = f"<span style='color:#b00'>{html.escape(str(error))}</span>"
            return None
        stats = after.stats()
        self.message.value = (
            f"{self.model.value} {self.precision.value}: {stats.onnx_nodes} ONNX nodes → "
            f"{stats.engine_layers} engine layers ({stats.folded_nodes} nodes folded, "
            f"{stats.inserted_layers} layers inserted)"
        )
        self.panel = FusionPanel(after, compare_with=before)
        self.container.children = (self._controls, self.panel.widget)
        return self.panel

    @property
    def widget(self) -> ipywidgets.VBox:
        return self.container
