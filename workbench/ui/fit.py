"""Panels that follow their container: one invisible widget every panel carries.

It brings the page-wide rules the panels need at any width (controls wrap below ~1,000 px instead of forcing
scrollbars, wide tables scroll inside their own box, tab titles are not cut) and one observer: when a figure's box
changes width (its tab is shown, the window or the side bar is resized), the widget tells the kernel, and the panel
asks each of its figures to size itself to its container again (plotly's ``relayout`` with ``autosize``; plotly's
widget does not follow its box by itself, seen in JupyterLab 4 / ipywidgets 8: a figure drawn in a hidden tab stayed
at plotly's 700 px default). Nothing here computes anything.
"""

from __future__ import annotations

from typing import Any

import anywidget
import traitlets

# Page-wide rules, scoped to the panels' own classes so nothing else in the notebook changes.
PANEL_CSS = """
.workbench-panel { max-width: 100%; box-sizing: border-box; }
.workbench-panel .widget-hbox, .workbench-panel .jupyter-widgets.widget-hbox { flex-wrap: wrap; row-gap: 4px; }
.workbench-panel .widget-hbox > * { max-width: 100%; }
.workbench-panel .widget-vbox { max-width: 100%; min-width: 0; }
.workbench-panel .widget-html, .workbench-panel .widget-html-content { max-width: 100%; min-width: 0; }
.workbench-panel .widget-html-content { overflow-x: auto; }
.workbench-panel .widget-html-content table { max-width: none; }
.workbench-panel .lm-TabBar-tab, .workbench-panel .p-TabBar-tab { min-width: max-content; flex: 0 0 auto; }
.workbench-panel .lm-TabBar-content, .workbench-panel .p-TabBar-content { flex-wrap: wrap; }
.workbench-panel .widget-text, .workbench-panel .widget-dropdown, .workbench-panel .widget-select {
  max-width: 100%;
}
.workbench-panel .js-plotly-plot, .workbench-panel .plotly-graph-div { max-width: 100%; }
"""

_ESM = """
function install(css) {
  if (window.__workbenchFit) { return; }
  window.__workbenchFit = new Set();  // the models of every fit widget on the page
  const style = document.createElement("style");
  style.dataset.workbench = "fit";
  style.textContent = css;
  document.head.appendChild(style);
  const widths = new WeakMap();
  let pending = null;
  const observer = new ResizeObserver((entries) => {
    let changed = false;
    for (const entry of entries) {
      const width = Math.round(entry.contentRect.width);
      if (width > 0 && widths.get(entry.target) !== width) { widths.set(entry.target, width); changed = true; }
    }
    if (changed && pending === null) {
      pending = setTimeout(() => {
        pending = null;
        for (const model of window.__workbenchFit) {
          model.set("resized", model.get("resized") + 1);
          model.save_changes();
        }
      }, 150);
    }
  });
  const watch = (root) => root.querySelectorAll(".workbench-panel .js-plotly-plot").forEach((el) => {
    // the figure's own box (shown/hidden as a tab page) and the box around it (resized with the window)
    if (!el.__workbenchFit) { el.__workbenchFit = true; observer.observe(el); if (el.parentElement) { observer.observe(el.parentElement); } }
  });
  watch(document);
  let queued = false;  // at most one scan per frame, however many nodes the page changes
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; watch(document); }); }
  }).observe(document.body, { childList: true, subtree: true });
}
function render({ model, el }) {
  install(model.get("css"));
  window.__workbenchFit.add(model);
  el.style.display = "none";
  return () => window.__workbenchFit.delete(model);
}
export default { render };
"""


class FitToContainer(anywidget.AnyWidget):  # type: ignore[misc]
    """Invisible: installs the panels' layout rules and figure re-layout observer once per page."""

    _esm = _ESM
    css = traitlets.Unicode(PANEL_CSS).tag(sync=True)
    resized = traitlets.Int(0).tag(sync=True)  # the page counts a figure box's width changes here


def figures_in(widget: Any) -> list[Any]:
    """The plotly FigureWidgets inside ``widget`` (boxes and tabs walked), as the panel holds them now."""
    import plotly.graph_objects as go

    if isinstance(widget, go.FigureWidget):
        return [widget]
    return [figure for child in getattr(widget, "children", ()) for figure in figures_in(child)]


def autosize(figure: Any) -> None:
    """Ask the page to size ``figure`` to its container again (two relayouts: plotly recomputes only on a change)."""
    figure.layout.autosize = False
    figure.layout.autosize = True


def fit_panel(box: Any, holder: Any = None) -> Any:
    """``box`` (a panel's top-level VBox) marked as a workbench panel, its figures re-laid out on the fit widget's
    width changes; the fit widget goes into ``holder`` (default ``box``: a box whose children stay). Returns ``box``."""
    fit = FitToContainer()
    fit.observe(lambda _change: [autosize(figure) for figure in figures_in(box)], names="resized")
    box.add_class("workbench-panel")
    holder = box if holder is None else holder
    holder.children = (*holder.children, fit)
    return box
