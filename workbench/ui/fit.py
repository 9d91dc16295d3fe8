"""Panels that follow their container: one invisible widget every panel carries.

It brings the page-wide rules the panels need at any width (controls wrap below ~1,000 px instead of forcing
scrollbars, wide tables scroll inside their own box, tab titles are not cut) and one observer: when a figure's box
changes width (its tab is shown, the window or the side bar is resized), the page gets a ``resize`` event, on which
plotly's widgets re-lay out to their container. A figure drawn while its tab was hidden (plotly's 700 px default)
thus takes the tab's width when the tab opens. Nothing here computes anything.
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
  window.__workbenchFit = true;
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
      pending = setTimeout(() => { pending = null; window.dispatchEvent(new Event("resize")); }, 120);
    }
  });
  const watch = (root) => root.querySelectorAll(".workbench-panel .js-plotly-plot").forEach((el) => {
    if (!el.__workbenchFit) { el.__workbenchFit = true; observer.observe(el.parentElement || el); }
  });
  watch(document);
  let queued = false;  // at most one scan per frame, however many nodes the page changes
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; watch(document); }); }
  }).observe(document.body, { childList: true, subtree: true });
}
function render({ model, el }) {
  install(model.get("css"));
  el.style.display = "none";
}
export default { render };
"""


class FitToContainer(anywidget.AnyWidget):  # type: ignore[misc]
    """Invisible: installs the panels' layout rules and figure re-layout observer once per page."""

    _esm = _ESM
    css = traitlets.Unicode(PANEL_CSS).tag(sync=True)


def fit_widget() -> FitToContainer:
    return FitToContainer()


def fit_panel(box: Any) -> Any:
    """``box`` (a panel's top-level VBox) marked as a workbench panel and carrying the fit widget; returns it."""
    box.add_class("workbench-panel")
    box.children = (*box.children, fit_widget())
    return box
