"""Panels that follow their container: one invisible widget every panel carries.

It brings the page-wide rules the panels need at any width (controls wrap below ~1,000 px instead of forcing
scrollbars, wide tables scroll inside their own box, tab titles are not cut) and one observer: when a figure's box
changes width (its tab is shown, the window or the side bar is resized), the widget tells the kernel, and the panel
asks each of its figures to size itself to its container again (plotly's ``relayout`` with ``autosize``; plotly's
widget does not follow its box by itself, seen in JupyterLab 4 / ipywidgets 8: a figure drawn in a hidden tab stayed
at plotly's 700 px default). Nothing here computes anything.

Two more things only the page can do: a busy progress bar that Run All scrolled out of view is pinned, as a copy, to
the bottom of the notebook's view (with its Cancel button) until it finishes or comes back into view; and on a
whole-run change (a model switch) the outputs of the cells below the panel are marked stale (greyed, with the
reason) until those cells run again (their new outputs are new elements, unmarked).
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
.workbench-progress-pinned {
  position: fixed; z-index: 1000; display: none; align-items: center; gap: 8px; max-width: 90vw;
  padding: 4px 10px; border: 1px solid #9ab; border-radius: 4px; background: #f7fbff; color: #123;
  font: 13px sans-serif; box-shadow: 0 1px 4px rgba(0,0,0,.25); cursor: pointer;
}
.workbench-progress-pinned .bar { width: 120px; height: 8px; background: #dde; flex: 0 0 auto; }
.workbench-progress-pinned .bar > div { height: 100%; background: #2a7ab9; }
.workbench-progress-pinned .text { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.workbench-stale-output { opacity: 0.45; }
.workbench-stale-output::before {
  content: "\\26A0  Stale: " attr(data-workbench-stale); display: block; color: #8a5a00; opacity: 1;
  font: 12px sans-serif; white-space: normal;
}
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
  let pending = null, resizing = null;
  const resizeSoon = () => {  // one window resize event for a burst of box changes (plotly's responsive handler)
    if (resizing === null) {
      resizing = setTimeout(() => { resizing = null; window.dispatchEvent(new Event("resize")); }, 200);
    }
  };
  const outputs = new ResizeObserver((entries) => {
    const stale = entries.some((entry) => {
      const svg = entry.target.querySelector(".main-svg");
      return svg && Math.abs(svg.getBoundingClientRect().width - entry.contentRect.width) > 4;
    });
    if (stale) { resizeSoon(); }
  });
  const observer = new ResizeObserver((entries) => {
    let changed = false;
    for (const entry of entries) {
      const width = Math.round(entry.contentRect.width);
      if (width > 0 && widths.get(entry.target) !== width) { widths.set(entry.target, width); changed = true; }
    }
    if (changed) { resizeSoon(); }  // in the page: responsive figures redraw at once, even while the kernel is busy
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
  const watch = (root) => {
    root.querySelectorAll(".workbench-panel .js-plotly-plot").forEach((el) => {
      // the figure's own box (shown/hidden as a tab page) and the box around it (resized with the window)
      if (!el.__workbenchFit) { el.__workbenchFit = true; observer.observe(el); if (el.parentElement) { observer.observe(el.parentElement); } }
    });
    // figures a cell displays (JupyterLab's plotly renderer): responsive (see _responsive_notebook_figures), they
    // follow a window resize; JupyterLab did not resize them (seen: drawn at plotly's 700 px in a 468 px output
    // area, and kept their first width when the window changed), so a width change of their box sends one
    root.querySelectorAll(".jp-OutputArea-output.jp-RenderedPlotly").forEach((el) => {
      if (!el.__workbenchFit) { el.__workbenchFit = true; outputs.observe(el); }
    });
  };
  watch(document);
  let queued = false;  // at most one scan per frame, however many nodes the page changes
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(() => { queued = false; watch(document); pinCheck(); }); }
  }).observe(document.body, { childList: true, subtree: true });
  pinCheck = pinBusyProgress();
}
let pinCheck = () => {};
// The notebook's scrolling box around an element (JupyterLab scrolls the notebook, not the window).
function scroller(el) {
  for (let box = el.parentElement; box; box = box.parentElement) {
    if (["auto", "scroll"].includes(getComputedStyle(box).overflowY) && box.clientHeight < box.scrollHeight) { return box; }
  }
  return null;
}
// A busy progress bar out of view is pinned, as a copy, to the bottom of the notebook's view (Run All leaves the
// view on the last cell while the panel's cell works); a click scrolls to the panel, its Cancel cancels.
function pinBusyProgress() {
  const pin = document.createElement("div");
  pin.className = "workbench-progress-pinned";
  pin.innerHTML = '<div class="bar"><div></div></div><span class="text"></span><button>Cancel</button>';
  document.body.appendChild(pin);
  let source = null;
  pin.addEventListener("click", (event) => {
    if (!source) { return; }
    const cancel = [...source.querySelectorAll("button")].find((b) => b.innerText.includes("Cancel"));
    if (event.target.tagName === "BUTTON") { if (cancel) { cancel.click(); } }
    else { source.scrollIntoView({ block: "center" }); }
  });
  const check = () => {
    source = null;
    let view = null;
    for (const el of document.querySelectorAll(".workbench-progress.workbench-busy")) {
      if (el.offsetParent === null) { continue; }  // a notebook in a hidden tab
      const box = scroller(el);
      view = box ? box.getBoundingClientRect() : { top: 0, bottom: window.innerHeight, left: 0 };
      const rect = el.getBoundingClientRect();
      // pinned unless the whole bar is in view (the sampler of tests/test_browser.py uses the same rule)
      if (rect.top < view.top || rect.bottom > Math.min(view.bottom, window.innerHeight)) { source = el; break; }
    }
    if (!source) { pin.style.display = "none"; return; }
    const text = source.innerText.replace(/Cancel/g, "").replace(/\\s+/g, " ").trim();
    const bar = source.querySelector(".progress-bar, .jupyter-widgets .progress-bar");
    const cancel = [...source.querySelectorAll("button")].find((b) => b.innerText.includes("Cancel"));
    pin.querySelector(".text").textContent = text;
    pin.querySelector(".bar > div").style.width = bar ? bar.style.width || getComputedStyle(bar).width : "0";
    pin.querySelector("button").style.display = cancel && cancel.offsetParent !== null ? "" : "none";
    pin.style.left = `${Math.round(view.left + 16)}px`;
    pin.style.bottom = `${Math.round(window.innerHeight - view.bottom + 12)}px`;
    pin.style.display = "flex";
  };
  setInterval(check, 200);
  // and at the next frame after any scroll (Run All scrolls the notebook as cells run) or change of the page's
  // nodes (new outputs push the bar out of view; install's observer calls the returned check): no 200 ms lag
  let framed = false;
  document.addEventListener("scroll", () => {
    if (!framed) { framed = true; requestAnimationFrame(() => { framed = false; check(); }); }
  }, { capture: true, passive: true });
  return check;
}
// On a whole-run change the outputs of the cells below the panel's cell are marked stale; a cell that runs again
// replaces its output elements, so its mark goes with them.
function markBelow(el, why) {
  const cell = el.closest(".jp-Cell");
  if (!cell || !why) { return; }
  for (let next = cell.nextElementSibling; next; next = next.nextElementSibling) {
    next.querySelectorAll(".jp-OutputArea-child").forEach((child) => {
      child.classList.add("workbench-stale-output");
      child.dataset.workbenchStale = why;
    });
  }
}
function render({ model, el }) {
  install(model.get("css"));
  window.__workbenchFit.add(model);
  el.style.display = "none";
  model.on("change:stale_below", () => markBelow(el, model.get("stale_below")));
  return () => window.__workbenchFit.delete(model);
}
export default { render };
"""


def _responsive_notebook_figures() -> None:
    """Figures a notebook cell displays (plotly's mimetype renderers) redraw at their box's width on a window resize
    (plotly.js's ``responsive`` config); the page's observer above sends that resize when a box's width changes."""
    import plotly.io as pio

    for name in pio.renderers:
        renderer = pio.renderers[name]
        if isinstance(getattr(renderer, "config", None), dict):
            renderer.config = {**renderer.config, "responsive": True}


class FitToContainer(anywidget.AnyWidget):  # type: ignore[misc]
    """Invisible: installs the panels' layout rules and figure re-layout observer once per page."""

    _esm = _ESM
    css = traitlets.Unicode(PANEL_CSS).tag(sync=True)
    resized = traitlets.Int(0).tag(sync=True)  # the page counts a figure box's width changes here
    stale_below = traitlets.Unicode("").tag(sync=True)  # why the outputs below the panel are stale ("" none)

    def mark_below_stale(self, why: str) -> None:
        """Mark the outputs of the cells below the panel stale (in JupyterLab), e.g. on a model switch."""
        self.stale_below = ""
        self.stale_below = why


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


def fit_panel(box: Any, holder: Any = None) -> FitToContainer:
    """``box`` (a panel's top-level VBox) marked as a workbench panel, its figures re-laid out on the fit widget's
    width changes; the fit widget goes into ``holder`` (default ``box``: a box whose children stay) and is returned
    (the panel marks the cells below it stale through it)."""
    _responsive_notebook_figures()  # the figures the notebook's later cells display
    fit = FitToContainer()
    fit.observe(lambda _change: [autosize(figure) for figure in figures_in(box)], names="resized")
    box.add_class("workbench-panel")
    holder = box if holder is None else holder
    holder.children = (*holder.children, fit)
    return fit
