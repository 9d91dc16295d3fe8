"""The shared widgets: one widget per concept, the same in every notebook panel.

Thin factories and a status area that shows a WorkbenchError as a readable message (the progress adapter is in
:mod:`workbench.ui.progress`). Nothing here displays anything or computes anything.
"""

from __future__ import annotations

import html
import traceback
from collections.abc import Sequence

import ipywidgets as widgets
import plotly.graph_objects as go

from workbench.calib.paired import DEFAULT_CONFIDENCE
from workbench.errors import WorkbenchError
from workbench.flow.rule import DEFAULT_MAX_DROP
from workbench.precision.variant import CALIBRATION_METHOD_LABELS, PRECISION_CHOICE_LABELS
from workbench.timing.limits import BATCH_CHOICES, MAX_STREAMS, MIN_STREAMS
from workbench.viz.palette import STATUS_COLORS

# (label, value) pairs from the one typed list of each (workbench.precision.variant)
PRECISIONS = tuple((label, value) for value, label in PRECISION_CHOICE_LABELS.items())
CALIBRATION_METHODS = tuple((label, value) for value, label in CALIBRATION_METHOD_LABELS.items())
_STYLE = {"description_width": "110px"}
_LAYOUT = widgets.Layout(width="340px")


def precision_dropdown(value: str = "auto", options: Sequence[tuple[str, str]] = PRECISIONS) -> widgets.Dropdown:
    return widgets.Dropdown(options=list(options), value=value, description="precision", style=_STYLE, layout=_LAYOUT)


def calibration_method_dropdown(value: str = "mse") -> widgets.Dropdown:
    return widgets.Dropdown(
        options=list(CALIBRATION_METHODS), value=value, description="calibration", style=_STYLE, layout=_LAYOUT
    )


def streams_input(value: int = 2) -> widgets.IntText:
    """Pipeline lanes (CUDA streams on a GPU, worker threads on the CPU executor), within the timing limits.

    A text field, not a slider: a slider clamps an out-of-range value without a word; the panel refuses it with the
    message the CLI gives (:func:`workbench.timing.limits.check_streams`)."""
    return widgets.IntText(
        value=value, description=f"streams ({MIN_STREAMS}-{MAX_STREAMS})", style=_STYLE, layout=_LAYOUT
    )


# the decision levels offered for "within the drop" (the search's met and the engine rule's verdict); 0: point estimate
CONFIDENCE_CHOICES = (("95%", 0.95), ("99%", 0.99), ("90%", 0.9), ("off (point estimate)", 0.0))


def max_drop_input(value: float = DEFAULT_MAX_DROP) -> widgets.FloatText:
    """The task-metric loss vs FP32 an engine may have and still be chosen (the search's target drop).

    A text field, not a bounded one: a bounded field clamps an out-of-range value without a word; the panel refuses it
    with the message the CLI gives (:class:`workbench.flow.QuickstartConfig`)."""
    return widgets.FloatText(
        value=value,
        step=0.005,
        description="max drop",
        tooltip="the task-metric loss vs FP32 an engine may have and still be chosen (the search's target)",
        style=_STYLE,
        layout=_LAYOUT,
    )


def confidence_dropdown(value: float = DEFAULT_CONFIDENCE) -> widgets.Dropdown:
    """The level at which a loss is called within the drop (the search's "met" and the engine rule's verdict)."""
    options = list(CONFIDENCE_CHOICES)
    if all(abs(level - value) > 1e-12 for _, level in options):  # a level set in the config is offered as it is
        options.append((f"{value:.1%}", value))
    chosen = next(level for _, level in options if abs(level - value) <= 1e-12)
    return widgets.Dropdown(
        options=options,
        value=chosen,
        description="confidence",
        tooltip='the level at which a loss counts as within the drop: the worst end of its paired interval ("off": '
        "the point estimate)",
        style=_STYLE,
        layout=_LAYOUT,
    )


def figure_widget() -> go.FigureWidget:
    """An empty figure that takes the width of the output area (its figures set no fixed width)."""
    figure = go.FigureWidget()
    figure.layout.autosize = True
    return responsive(figure)


def responsive(figure: go.FigureWidget) -> go.FigureWidget:
    """``figure`` redrawn at its box's width on a window resize, in the page alone (plotly.js's ``responsive``; the
    fit widget sends that resize when a figure's box changes width): it follows even while the kernel is busy."""
    figure._config = {**figure._config, "responsive": True}
    return figure


def batch_dropdown(value: int = 8, options: Sequence[int] = BATCH_CHOICES) -> widgets.Dropdown:
    return widgets.Dropdown(options=list(options), value=value, description="batch size", style=_STYLE, layout=_LAYOUT)


def model_picker(value: str | None = None, names: Sequence[str] | None = None) -> widgets.Dropdown:
    """The zoo models (names only; choosing one loads nothing until the panel runs)."""
    if names is None:
        from workbench.zoo import entry_names

        names = entry_names()
    names = list(names)
    return widgets.Dropdown(
        options=names, value=value if value in names else names[0], description="model", style=_STYLE, layout=_LAYOUT
    )


class StatusArea:
    """One line of status under a panel. Errors show as a readable message, never as a traceback."""

    def __init__(self) -> None:
        self.widget = widgets.HTML(value="")
        self.kind = "idle"
        self.text = ""

    def _set(self, kind: str, text: str) -> None:
        self.kind, self.text = kind, text
        color = STATUS_COLORS[kind]
        self.widget.value = f'<div style="color:{color};white-space:pre-wrap">{html.escape(text)}</div>'

    def info(self, text: str) -> None:
        self._set("info", text)

    def busy(self, text: str) -> None:
        self._set("busy", text)

    def ok(self, text: str) -> None:
        self._set("ok", text)

    def warn(self, text: str) -> None:
        self._set("warning", text)

    def alert(self, text: str) -> None:
        """A result that is wrong to use (red), though nothing raised."""
        self._set("error", text)

    def error(self, error: BaseException) -> None:
        """A WorkbenchError as its message; anything else as 'unexpected error' with its type and last frame."""
        if isinstance(error, WorkbenchError):
            self._set("error", f"Error: {error}")
        else:
            frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
            where = f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
            self._set("error", f"Unexpected error {type(error).__name__}: {error}{where}. Please report it.")


class StaleBanner:
    """A line above a panel's results saying they are stale (and why), plus notes such as warnings of the run."""

    def __init__(self) -> None:
        self.widget = widgets.HTML(value="")
        self.text = ""
        self.notes: list[str] = []

    @property
    def is_stale(self) -> bool:
        return bool(self.text)

    def mark(self, why: str) -> None:
        self.text = why
        self._render()

    def note(self, text: str) -> None:
        """Something the user should see that is not an error (e.g. warnings raised during the run)."""
        self.notes = [text]
        self._render()

    def clear(self) -> None:
        self.text = ""
        self._render()

    def _render(self) -> None:
        parts = []
        if self.text:
            parts.append(
                f'<div class="workbench-stale-banner" style="color:{STATUS_COLORS["stale"]}">'
                f"&#9888; Stale: {html.escape(self.text)}</div>"
            )
        parts += [f'<div style="color:{STATUS_COLORS["warning"]}">{html.escape(n)}</div>' for n in self.notes]
        self.widget.value = "".join(parts)
