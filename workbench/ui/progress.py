"""The one progress adapter every panel shows: a bar, the current step, and the time since the action started.

Callable as the flow's stage hook ``(stage, index, total, message)`` and as a TensorRT build progress callback
``(kind, phase, parent, step, total) -> bool``; panels whose stage reports no steps call :meth:`start` and
:meth:`step` themselves. Nothing here computes or displays anything.
"""

from __future__ import annotations

import time
from typing import Any

import ipywidgets as widgets

_STYLE = {"description_width": "110px"}


class ProgressAdapter:
    """A progress bar, a label with the current step and the elapsed seconds."""

    def __init__(self, description: str = "progress") -> None:
        self.bar = widgets.IntProgress(
            value=0, min=0, max=1, description=description, style=_STYLE, layout=widgets.Layout(width="340px")
        )
        self.label = widgets.Label(value="")
        self.widget = widgets.HBox([self.bar, self.label])
        self.started: float | None = None
        self.message = ""

    # --- what panels call ---------------------------------------------------------------------------------------
    def start(self, message: str, total: int = 1) -> None:
        """A new action: the bar restarts at 0 of ``total`` and the clock at 0 s."""
        self.started = time.monotonic()
        self.bar.max, self.bar.value, self.bar.bar_style = max(int(total), 1), 0, "info"
        self._show(message)

    def step(self, message: str, index: int | None = None, total: int | None = None) -> None:
        """The action moved on to ``message`` (step ``index`` of ``total`` when known)."""
        if self.started is None:
            self.start(message, total or 1)
        if total is not None:
            self.bar.max = max(int(total), 1)
        if index is not None:
            self.bar.value = min(int(index), self.bar.max)
        self._show(message)

    def done(self, message: str = "done") -> None:
        self.bar.value, self.bar.bar_style = self.bar.max, "success"
        self._show(message)
        self.started = None

    def failed(self, message: str = "failed") -> None:
        self.bar.bar_style = "danger"
        self._show(message)
        self.started = None

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    # --- as a callback ------------------------------------------------------------------------------------------
    def __call__(self, *event: Any) -> bool:
        if len(event) == 4:  # flow stage: (stage, index, total, message)
            _stage, index, total, message = event
            self.step(str(message), int(index), int(total))
        elif len(event) == 5:  # builder: (kind, phase, parent, step, total)
            kind, phase, parent, step, total = event
            if kind == "start" and not parent and total:
                self.bar.max, self.bar.value = int(total), 0
                self._show(str(phase))
            elif kind == "step" and phase == self.message:
                self.bar.value = min(int(step) + 1, self.bar.max)
                self._show(str(phase))
        return True

    def _show(self, message: str) -> None:
        self.message = message
        elapsed = f" ({self.elapsed_s:.1f} s)" if self.started is not None else ""
        self.label.value = f"{message}{elapsed}"
