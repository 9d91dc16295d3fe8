"""HTML tables of a quickstart run, shared by the report and the notebook panels (one table per kind of data)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench.flow.quickstart import STAGE_NAMES, MetricRow, QuickstartRun
from workbench.report.diagnosis import Verdict
from workbench.timing import TimingResult


def esc(value: Any) -> str:
    return html.escape(str(value))


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], raw_columns: tuple[int, ...] = ()) -> str:
    """A plain table; cells are escaped except in ``raw_columns`` (already HTML)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell if i in raw_columns else esc(cell)}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def stage_table_html(run: QuickstartRun) -> str:
    """Every stage that ran: title, status, seconds and its one-line result."""
    rows = [
        [
            esc(run.stage(name).title),
            f'<span class="status-{run.stage(name).status}">{run.stage(name).status}</span>',
            f"{run.stage(name).seconds:.2f}",
            esc(run.stage(name).summary),
        ]
        for name in STAGE_NAMES
        if name in run.stages
    ]
    return html_table(["stage", "status", "seconds", "result"], rows, raw_columns=(0, 1, 3))


def metrics_table_html(rows: Sequence[MetricRow], chosen: str | None = None) -> str:
    """The task metric per precision variant; ``chosen`` (a variant) is marked."""
    body = [
        [
            ("&#9654; " if row.variant == chosen else "") + esc(row.variant),
            f"{row.value:.4f}",
            f"{row.delta_vs_fp32:+.4f}",
            row.n_samples,
            esc(Path(row.onnx_path).name),
        ]
        for row in rows
    ]
    return html_table(
        ["variant", rows[0].metric if rows else "metric", "vs FP32", "samples", "ONNX evaluated"],
        body,
        raw_columns=(0, 4),
    )


def timing_table_html(results: Sequence[TimingResult]) -> str:
    body = [
        [
            r.streams,
            r.batch,
            f"{r.throughput_per_s:.0f}",
            f"{r.latency_ms.get('p50', math.nan):.2f}",
            f"{r.latency_ms.get('p99', math.nan):.2f}",
            f"{r.busy_fraction:.0%}",
            r.n_requests,
            "yes" if r.stable else "no",
        ]
        for r in results
    ]
    return html_table(["streams", "batch", "samples/s", "p50 ms", "p99 ms", "busy", "requests", "stable"], body)


def verdicts_html(verdicts: Sequence[Verdict]) -> str:
    if not verdicts:
        return "<p>No stage produced numbers to diagnose.</p>"
    return "<ul>" + "".join(f"<li><b>{esc(v.topic)}</b>: {esc(v.text)}</li>" for v in verdicts) + "</ul>"
