"""The one progress-callback type: every slow step reports a :class:`ProgressEvent` to a :data:`ProgressFn`.

A stage of the journey, a TensorRT build phase, an evaluation of the precision search and a timing window all
report the same record: what runs (``task``), which step of how many, and a line for people. A callback that
returns ``False`` asks the work to stop at its next step (the panel's Cancel button); ``None`` or ``True`` go on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from workbench.errors import WorkbenchError

KINDS = ("start", "step", "finish")


@dataclass(frozen=True)
class ProgressEvent:
    """``index`` of ``total`` steps of ``task`` are done; ``message`` says what runs now."""

    task: str  # e.g. "stage", "build", "evaluation", "timing"
    message: str
    index: int = 0
    total: int | None = None  # None: the number of steps is not known
    name: str = ""  # a machine-readable name of the step (a stage name, a build phase)
    kind: str = "step"  # "start" of a (sub)task with ``total`` steps, a "step" done, or its "finish"
    parent: str = ""  # the enclosing phase of a nested one (TensorRT's builder phases nest); "" at the top level

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"progress kind {self.kind!r} is not one of {KINDS}")
        if self.index < 0 or (self.total is not None and self.total < 0):
            raise ValueError(f"progress index {self.index} / total {self.total} must not be negative")

    @property
    def fraction(self) -> float | None:
        """Share done in [0, 1], or None when the total is unknown."""
        if not self.total:
            return None
        return min(1.0, self.index / self.total)

    def text(self) -> str:
        """``evaluation 3 of 8, 38 %: plan 2`` — what a person reads."""
        if self.total:
            return f"{self.task} {self.index} of {self.total}, {self.fraction:.0%}: {self.message}"
        return f"{self.task}: {self.message}"


ProgressFn = Callable[[ProgressEvent], "bool | None"]


def nested_detail(event: ProgressEvent) -> str | None:
    """What a nested task's event (a search's evaluation, a calibration step) says about the step that encloses it:
    its line, "" once it finished, None when it changes nothing (a builder's inner phase starting). The panel's
    progress bar and the demo's still-running lines show the same detail."""
    if event.kind == "finish":
        return ""
    if event.kind == "step" or (event.kind == "start" and not event.parent):
        return event.text() if event.total else event.message
    return None


def report(progress: ProgressFn | None, event: ProgressEvent) -> bool:
    """Send ``event`` to ``progress`` (if any); False when the callback asked to stop."""
    return progress is None or progress(event) is not False


class Cancelled(WorkbenchError):
    """The progress callback asked the work to stop (it returned False); raised at the work's next step, so what it
    computed so far is dropped whole rather than kept half-done."""


def report_or_stop(progress: ProgressFn | None, event: ProgressEvent) -> None:
    """Send ``event``; raise :class:`Cancelled` when the callback asked to stop (the panel's Cancel, or a new setting
    that replaces the running action)."""
    if not report(progress, event):
        raise Cancelled(f"cancelled while it ran, at {event.text()}")
