"""How a panel puts a figure on screen: replace a FigureWidget's content in place, or show a note instead.

The widget on screen stays the same object (no flicker, no new output), only its traces and layout change.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go

from workbench.viz import palette


def replace_figure(widget: go.FigureWidget, figure: go.Figure) -> None:
    """Swap ``widget``'s traces and layout for ``figure``'s (nothing of the old figure survives)."""
    # Setting a layout sends plotly.js a relayout of the new keys only: keys the new figure lacks (a note's
    # annotation, a second axis) stayed drawn in the page (seen: the "model changed" note over the fresh figures),
    # so they are removed by name. Clearing the layout inside the batch made the front end drop the traces added
    # with it (seen in Chromium: empty axes after a re-run), so the old layout is cleared on its own first.
    new_keys = set(figure.layout.to_plotly_json())
    gone = sorted(set(widget.layout.to_plotly_json()) - new_keys - {"autosize", "width"})
    widget.layout = {}
    with widget.batch_update():
        widget.data = ()
        widget.add_traces(list(figure.data))
        widget.layout = figure.layout
        for key in gone:
            widget.layout[key] = None
        widget.layout.autosize = True  # the width of the output area: figures here never fix a width
        widget.layout.width = None


def note_figure(text: str, *, height: int = 200) -> go.Figure:
    """An empty figure carrying one message: why there is no chart here (a stage that did not run, an error)."""
    figure = go.Figure()
    figure.add_annotation(
        text=html.escape(text), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"color": palette.TEXT}
    )
    figure.update_layout(template=palette.TEMPLATE, height=height, xaxis_visible=False, yaxis_visible=False)
    return figure


def show_note(widget: go.FigureWidget, text: str, *, height: int = 200) -> None:
    """Replace ``widget``'s content with a message."""
    replace_figure(widget, note_figure(text, height=height))
