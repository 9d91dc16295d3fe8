"""One finishing step every figure of :mod:`workbench.viz` goes through, so each follows its container.

* No width: ``autosize`` takes the output area's width (a notebook cell, a panel tab, the report page); plotly's
  700 px default appears only where a figure was drawn while hidden, and the panels re-lay those out when shown.
* Titles are wrapped at a readable length and set left-aligned *below* the row where plotly draws its toolbar
  (the modebar, top right): a long title on a narrow output never sits under the toolbar's buttons. The top margin
  grows with the number of title lines.
"""

from __future__ import annotations

import re
import textwrap

import plotly.graph_objects as go

# The modebar is drawn in the figure's top ~30 px; the title starts below it.
MODEBAR_PX = 30
TITLE_LINE_PX = 20
SUBTITLE_LINE_PX = 15
TITLE_GAP_PX = 14
# Characters per title line: ~560 px of 14 px text, what a 900 px output leaves beside the margins.
TITLE_WRAP_CHARS = 64

_TAG = re.compile(r"<[^>]+>")


def _pack(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters, broken between clauses (after ``; `` or ``, ``) where possible and
    between words only inside a clause longer than a line: a phrase stays on one line."""
    clauses = re.split(r"(?<=[;,]) ", text)
    lines: list[str] = []
    for clause in clauses:
        if lines and len(lines[-1]) + 1 + len(clause) <= width:
            lines[-1] += " " + clause
        elif len(clause) <= width:
            lines.append(clause)
        else:  # a clause longer than a line continues the current line, broken between words
            head = lines.pop() + " " + clause if lines else clause
            lines += textwrap.wrap(head, width=width, break_long_words=False, break_on_hyphens=False)
    return lines


def wrap_title(text: str, width: int = TITLE_WRAP_CHARS) -> str:
    """``text`` with a ``<br>`` wherever a line would pass ``width`` visible characters; lines already broken by the
    caller (``<br>``) and ``<sup>`` subtitles (smaller type: a quarter longer) are wrapped on their own; lines holding
    other markup are left whole."""
    lines = []
    for line in re.split(r"<br\s*/?>", text):
        sup = re.fullmatch(r"\s*<sup>(.*)</sup>\s*", line, flags=re.S)
        body = sup.group(1) if sup else line
        limit = width + width // 4 if sup else width
        if len(body) <= limit or _TAG.search(body):
            lines.append(line)
            continue
        lines += [f"<sup>{part}</sup>" if sup else part for part in _pack(body, limit)]
    return "<br>".join(lines)


def _title_height(text: str) -> int:
    lines = re.split(r"<br\s*/?>", text) if text else []
    return sum(SUBTITLE_LINE_PX if line.strip().startswith("<sup>") else TITLE_LINE_PX for line in lines)


def fit_to_container(figure: go.Figure) -> go.Figure:
    """``figure`` sized by its container (no fixed width) with its title wrapped and clear of the toolbar."""
    layout = figure.layout
    title = (layout.title.text or "") if layout.title else ""
    margin = layout.margin
    top = MODEBAR_PX + (_title_height(wrap_title(title)) + TITLE_GAP_PX if title else 4)
    figure.update_layout(
        autosize=True,
        width=None,
        margin={
            "t": max(top, margin.t or 0) if title else top,
            "l": margin.l if margin.l is not None else 60,
            "r": margin.r if margin.r is not None else 20,
            "b": margin.b if margin.b is not None else 50,
        },
    )
    if title:
        figure.update_layout(
            title={
                "text": wrap_title(title),
                "x": 0,
                "xref": "container",
                "xanchor": "left",
                "y": 1,
                "yref": "container",
                "yanchor": "top",
                "pad": {"t": MODEBAR_PX, "l": 12},
                "font": {"size": 15},
            }
        )
    return figure
