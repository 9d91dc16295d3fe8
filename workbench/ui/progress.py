"""The one progress adapter every panel shows, and the worker that keeps long actions off the kernel's main thread.

:class:`ProgressAdapter`: a bar, the current step, the seconds since the action started (ticking while it runs) and a
Cancel button. Callable with the one progress type, :class:`workbench.progress.ProgressEvent`, from the flow's stages, the
sweep and TensorRT's builder phases alike (it returns False once Cancel was pressed, which stops the work at its
next step). The first task reporting after :meth:`start` moves the bar (the flow's stages, a sweep's
configurations); a nested one (an evaluation of the precision search, a TensorRT build inside a stage) shows as the
step's detail: "Mixed-precision search · evaluation 3 of 8, 38 %: plan 2"; the seconds since the start tick in the
page (:class:`Clock`), so they move even while the kernel's process is busy. Panels whose stage reports no
steps call :meth:`start` / :meth:`step` themselves. While busy the widget carries the class ``workbench-busy`` (the
page pins a copy of a busy bar that Run All scrolled out of view, see :mod:`workbench.ui.fit`).

:class:`Worker`: runs one panel action at a time on a background thread so widgets stay responsive; a new request
while one runs cancels it and runs after it (the latest settings win). ``Worker(background=False)`` runs inline
(scripts and tests that read results right after setting a widget).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anywidget
import ipywidgets as widgets
import traitlets

from workbench.log import split_warnings
from workbench.progress import ProgressEvent, nested_detail

_STYLE = {"description_width": "110px"}

# The seconds since the action started, counted in the page: a clock sent from the kernel froze whenever the kernel's
# process held its lock or got no CPU (measured: importing onnx holds the GIL 1.7 s in ml_dtypes' C extension on a busy
# 2-core machine) and every tick was a message through the server. The kernel sends the elapsed time with each step;
# the page counts on from there.
_CLOCK_ESM = """
function render({ model, el }) {
  el.classList.add("workbench-clock");
  let base = 0, anchor = performance.now();
  const sync = () => { base = model.get("elapsed"); anchor = performance.now(); draw(); };
  const draw = () => {
    el.textContent = model.get("running") ? `(${(base + (performance.now() - anchor) / 1000).toFixed(1)} s)` : "";
  };
  model.on("change:elapsed", sync);
  model.on("change:running", sync);
  sync();
  const timer = setInterval(draw, 250);
  return () => clearInterval(timer);
}
export default { render };
"""


class Clock(anywidget.AnyWidget):  # type: ignore[misc]
    """Elapsed seconds, counted on in the page from the last value the kernel sent (blank when not running)."""

    _esm = _CLOCK_ESM
    elapsed = traitlets.Float(0.0).tag(sync=True)
    running = traitlets.Bool(False).tag(sync=True)


class ProgressAdapter:
    """A progress bar, the current step with elapsed seconds, and a Cancel button (shown only while busy)."""

    def __init__(self, description: str = "progress", *, cancellable: bool = False) -> None:
        self.bar = widgets.IntProgress(
            value=0, min=0, max=1, description=description, style=_STYLE, layout=widgets.Layout(width="340px")
        )
        self.label = widgets.Label(value="")
        self.clock = Clock()
        self.cancel_button = widgets.Button(
            description="Cancel",
            icon="stop",
            button_style="danger",
            layout=widgets.Layout(display="none", width="90px"),
        )
        self.cancel_button.on_click(lambda _button: self.cancel())
        self.widget = widgets.HBox([self.bar, self.label, self.clock, self.cancel_button])
        self.widget.add_class("workbench-progress")
        self.cancellable = cancellable
        self.started: float | None = None
        self.message = ""
        self.cancel_requested = False
        self.detail = ""  # a nested task's step ("evaluation 3 of 8, 38 %: ..."), shown after the message
        self._main_task: str | None = None  # the task whose steps move the bar (the first to report after start)

    # --- what panels call ---------------------------------------------------------------------------------------
    def start(self, message: str, total: int = 1) -> None:
        """A new action: the bar restarts at 0 of ``total``, the clock at 0 s; Cancel shows if the action allows it."""
        self.started = time.monotonic()
        self.cancel_requested = False
        self.detail, self._main_task = "", None
        self.bar.max, self.bar.value, self.bar.bar_style = max(int(total), 1), 0, "info"
        self.cancel_button.layout.display = "" if self.cancellable else "none"
        self.cancel_button.disabled = False
        self.widget.add_class("workbench-busy")
        self._show(message)

    def step(self, message: str, index: int | None = None, total: int | None = None) -> None:
        """The action moved on to ``message`` (step ``index`` of ``total`` when known)."""
        if self.started is None:
            self.start(message, total or 1)
        if total is not None:
            self.bar.max = max(int(total), 1)
        if index is not None:
            self.bar.value = min(int(index), self.bar.max)
        self.detail = ""
        self._show(message)

    def done(self, message: str = "done") -> None:
        self.bar.value, self.bar.bar_style = self.bar.max, "success"
        self._finish(message)

    def failed(self, message: str = "failed") -> None:
        self.bar.bar_style = "danger"
        self._finish(message)

    def cancel(self) -> None:
        """Ask the running action to stop at its next step (the flow stops between stages)."""
        if self.started is not None:
            self.cancel_requested = True
            self.cancel_button.disabled = True
            self._show(f"{self.message}: cancelling after this step")

    def resume(self) -> None:
        """Take requests to stop back: the queued action that replaces a cancelled one runs (see :class:`Worker`)."""
        self.cancel_requested = False
        self.cancel_button.disabled = False

    @property
    def busy(self) -> bool:
        return self.started is not None

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    # --- as a callback ------------------------------------------------------------------------------------------
    def __call__(self, event: ProgressEvent) -> bool:
        """Show one :class:`~workbench.progress.ProgressEvent`; False once Cancel was pressed (the work stops)."""
        if self.cancel_requested:
            return False
        if self.started is None and event.kind == "step":
            self.start(event.message, event.total or 1)
        if self._main_task is None:
            self._main_task = event.task
        if event.task != self._main_task:  # a nested task: its step is the current step's detail
            detail = nested_detail(event)
            if detail is not None:
                self.detail = detail
            self._show(self.message)
        elif event.task == "build":  # TensorRT's builder phases: the top-level ones move the bar
            if event.kind == "start" and not event.parent and event.total:
                self.bar.max, self.bar.value = int(event.total), 0
                self._show(event.message)
            elif event.kind == "step" and event.message == self.message:
                self.bar.value = min(event.index + 1, self.bar.max)
                self._show(event.message)
        elif event.kind == "step":  # a stage of the journey, a configuration of a sweep ...
            self.step(event.message, event.index, event.total)
        return not self.cancel_requested

    # --- internals ----------------------------------------------------------------------------------------------
    def _finish(self, message: str) -> None:
        seconds = self.elapsed_s
        self.started = None
        self.cancel_button.layout.display = "none"
        self.clock.running = False
        self.widget.remove_class("workbench-busy")
        self.message, self.detail, self._main_task = message, "", None
        self.label.value = f"{message} ({seconds:.1f} s)"

    def _show(self, message: str) -> None:
        """The step (and its detail) in the label; while busy the page's clock counts on from the elapsed time."""
        self.message = message
        self.label.value = f"{message} \u00b7 {self.detail}" if self.detail else message
        if self.started is not None:
            self.clock.elapsed = round(self.elapsed_s, 1)
            self.clock.running = True


@contextmanager
def loading(message: str) -> Iterator[ProgressAdapter]:
    """A progress bar shown at once while a notebook cell imports the workbench (seconds on a busy machine), removed
    when the block ends: ``with loading("importing the cleaner"): from workbench.ui.clean_panel import CleanPanel``.
    This module is light to import (ipywidgets only), so the bar is on screen before the heavy imports start."""
    from IPython.display import display

    from workbench.ui.fit import FitToContainer

    progress = ProgressAdapter("loading")
    fit = FitToContainer()  # the page's rules from the start: a bar scrolled out of view is pinned
    shown = widgets.VBox([progress.widget, fit])
    display(shown)
    progress.start(message)
    try:
        yield progress
    finally:
        progress.done("loaded")
        shown.close()


class Worker:
    """One action at a time, off the kernel's main thread (or inline with ``background=False``).

    Every action runs under ``warnings.catch_warnings``: the workbench's own warnings are handed to ``on_warnings``
    for the panel to show; other libraries' (e.g. torch deprecations) go to the ``workbench.library_warnings`` log.
    """

    def __init__(self, progress: ProgressAdapter, *, background: bool = True) -> None:
        self.progress = progress
        self.background = background
        self._thread: threading.Thread | None = None
        self._pending: tuple[Callable[[], None], Callable[[list[str]], None] | None] | None = None
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(
        self, action: Callable[[], None], *, wait: bool = False, on_warnings: Callable[[list[str]], None] | None = None
    ) -> None:
        """Run ``action`` (inline when ``wait`` or not in background mode); a busy worker cancels and queues it."""
        if wait or not self.background:
            self.wait()
            self._run(action, on_warnings)
            return
        with self._lock:
            if self.busy:
                self._pending = (action, on_warnings)
                self.progress.cancel()
                return
            self._thread = threading.Thread(
                target=self._loop, args=(action, on_warnings), name="workbench-panel", daemon=True
            )
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running (and any queued) action finished."""
        while True:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return
            thread.join(timeout)
            if timeout is not None:
                return

    def _loop(self, action: Callable[[], None], on_warnings: Callable[[list[str]], None] | None) -> None:
        while True:
            self._run(action, on_warnings)
            with self._lock:
                if self._pending is None:
                    return
                (action, on_warnings), self._pending = self._pending, None
            self.progress.resume()  # the Cancel that stopped the run before was meant for that run, not this one

    @staticmethod
    def _run(action: Callable[[], None], on_warnings: Callable[[list[str]], None] | None) -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            action()
        own = split_warnings(caught)  # other libraries' warnings go to the log, not the panel
        if on_warnings is not None and own:
            on_warnings(own)
