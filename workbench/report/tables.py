"""HTML tables of a quickstart run, shared by the report and the notebook panels (one table per kind of data)."""

from __future__ import annotations

import html
import math
from collections.abc import Collection, Sequence
from pathlib import Path

from workbench.calib.paired import DEFAULT_CONFIDENCE
from workbench.flow.artifacts import MetricRow, QuickstartRun
from workbench.flow.choose import EngineCandidate
from workbench.flow.formats import FormatFront
from workbench.flow.mixed import MixedSearch
from workbench.flow.rule import DEFAULT_MAX_DROP, Choice, judge, next_steps
from workbench.flow.stages import STAGE_BY_NAME, STAGE_NAMES
from workbench.precision.variant import Variant
from workbench.report.diagnosis import Verdict
from workbench.timing import TimingResult
from workbench.timing.stats import THROUGHPUT_CI_HOW
from workbench.viz.palette import STATUS_COLORS


def esc(value: object) -> str:
    return html.escape(str(value))


def html_table(headers: Sequence[str], rows: Sequence[Sequence[object]], raw_columns: tuple[int, ...] = ()) -> str:
    """A plain table; cells are escaped except in ``raw_columns`` (already HTML). A cell with no text reads "-": a
    table never shows a blank cell (nothing measured is said, not left empty)."""

    def cell_html(index: int, cell: object) -> str:
        text = "" if cell is None else str(cell)
        if not text.strip():
            return "-"
        return text if index in raw_columns else esc(text)

    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell_html(i, cell)}</td>" for i, cell in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _status_span(kind: str, text: str) -> str:
    return f'<span class="status-{kind}" style="color:{STATUS_COLORS.get(kind, "inherit")}">{esc(text)}</span>'


def stage_table_html(run: QuickstartRun, pending: Collection[str] = ()) -> str:
    """Every stage that ran: title, status, seconds and its one-line result. Stages in ``pending`` are about to re-run:
    their old result is shown struck through as stale."""
    rows = []
    for name in STAGE_NAMES:
        if name not in run.stages and name not in pending:
            continue
        result = run.stage(name)
        title = STAGE_BY_NAME[name].title
        if name in pending:
            status = _status_span("stale", "stale: re-running")
            summary = f"<s>{esc(result.text)}</s>" if name in run.stages else ""
        else:
            status, summary = _status_span(result.status.value, result.status.label), esc(result.text)
        rows.append([esc(title), status, f"{result.seconds:.2f}" if name not in pending else "", summary])
    return html_table(["stage", "status", "seconds", "result"], rows, raw_columns=(0, 1, 3))


def metrics_table_html(
    rows: Sequence[MetricRow],
    chosen: Variant | None = None,
    max_drop: float = DEFAULT_MAX_DROP,
    confidence: float | None = DEFAULT_CONFIDENCE,
) -> str:
    """The task metric per precision variant with its 95 % interval and sample count, the paired difference to FP32
    (and whether it is within noise), and whether it is within the allowed drop; ``chosen`` (a variant) is marked."""
    judged = judge(rows, max_drop, confidence)
    body = []
    for row in rows:
        verdict = judged.get(row.variant)
        estimate = row.estimate
        interval = f" [{estimate.low:.4f}, {estimate.high:.4f}]" if estimate.has_interval else ""
        if verdict is None or row.variant is Variant.FP32:
            versus, allowed = ("reference" if row.variant is Variant.FP32 else f"{row.delta_vs_fp32:+.4f}"), "-"
        else:
            versus = verdict.vs_fp32.text() + (" (within noise)" if verdict.vs_fp32.within_noise else "")
            allowed = "yes" if verdict.acceptable else "no"
            if verdict.confidence is not None and verdict.acceptable:  # decided at the interval's worst end
                allowed += f" (loss at most {max(verdict.loss_high, 0.0):.4f})"
            elif verdict.decided_by_interval:
                allowed += f" (loss up to {verdict.loss_high:.4f})"
            elif not verdict.resolved:
                allowed += " (unresolved)"
        body.append(
            [
                ("&#9654; " if row.variant == chosen else "") + esc(row.variant),
                f"{row.value:.4f}{interval}",
                versus,
                allowed,
                row.n_samples,
                esc(Path(row.onnx_path).name),
            ]
        )
    method = next((row.estimate.method for row in rows if row.estimate.has_interval), "")
    return html_table(
        [
            (rows[0].metric if rows else "metric") + (f" [{method}]" if method else ""),
            "value",
            "vs FP32 [paired 95%]",
            f"within {max_drop:g} of FP32" + (f" at {confidence:.0%}" if confidence is not None else ""),
            "samples",
            "ONNX evaluated",
        ],
        body,
        raw_columns=(0, 5),
    )


def choice_html(choice: Choice) -> str:
    """The rule, the engine chosen and the verdict, coloured by level (green ok, amber unresolved/unchecked, red)."""
    color = STATUS_COLORS[{"ok": "ok", "warning": "warning", "bad": "error"}[choice.level]]
    steps = next_steps(choice)
    return (
        f'<p class="choice choice-{choice.level}" style="color:{color}"><b>Engine choice: {esc(choice.variant)}</b> '
        f"({esc(choice.level)}): {esc(choice.reason)}." + (f" {esc(steps)}" if steps else "") + "</p>"
        f'<p class="muted">{esc(choice.rule)}</p>'
    )


def _interval_text(value: float, interval: tuple[float, float] | None, spec: str) -> str:
    """``value [low, high]``, or the value and "(no interval)" where none was measured."""
    low, high = interval if interval is not None else (math.nan, math.nan)
    if not (math.isfinite(low) and math.isfinite(high)):
        return f"{value:{spec}} (no interval)"
    return f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"


def _throughput_text(result: TimingResult) -> str:
    """Throughput with its bootstrap 95% interval (:data:`workbench.timing.stats.THROUGHPUT_CI_HOW`)."""
    return _interval_text(result.throughput_per_s, result.throughput_ci_per_s, ".0f")


def _percentile_text(result: TimingResult, name: str) -> str:
    """A latency percentile with its bootstrap 95% interval (where the run measured one)."""
    return _interval_text(result.latency_ms.get(name, math.nan), result.latency_ci_ms.get(name), ".2f")


TIMING_INTERVALS_HOW = (
    f"Intervals: samples/s, {THROUGHPUT_CI_HOW}; p99, percentile-bootstrap 95% interval (1,000 resamples of the "
    "measured request latencies). A p99 from fewer than 500 requests is marked (few samples)."
)


def timing_table_html(results: Sequence[TimingResult]) -> str:
    """One row per timed configuration: throughput and p99, each with its bootstrap 95% interval and the number of
    samples behind it, p50, busy fraction, requests and whether the windows agreed (stable); how the intervals were
    computed is said below the table."""
    body = [
        [
            r.streams,
            r.batch,
            _throughput_text(r),
            f"{r.latency_ms.get('p50', math.nan):.2f}",
            _percentile_text(r, "p99") + ("" if r.latency_reliable.get("p99", False) else " (few samples)"),
            f"{r.busy_fraction:.0%}",
            r.n_requests,
            "yes" if r.stable else "no",
        ]
        for r in results
    ]
    header = ["streams", "batch", "samples/s [95% CI]", "p50 ms", "p99 ms [95% CI]", "busy", "requests (n)", "stable"]
    return html_table(header, body) + f'<p class="muted">{esc(TIMING_INTERVALS_HOW)}</p>'


def verdicts_html(verdicts: Sequence[Verdict]) -> str:
    if not verdicts:
        return "<p>No stage produced numbers to diagnose.</p>"
    colors = {"ok": STATUS_COLORS["ok"], "warning": STATUS_COLORS["warning"], "bad": STATUS_COLORS["error"]}

    def item(verdict: Verdict) -> str:
        style = f' style="color:{colors[verdict.level]}"' if verdict.level in colors else ""
        return f"<li{style}><b>{esc(verdict.topic)}</b>: {esc(verdict.text)}</li>"

    return "<ul>" + "".join(item(v) for v in verdicts) + "</ul>"


def candidates_table_html(candidates: Sequence[EngineCandidate], chosen: str | None = None) -> str:
    """One row per built engine (the export panel's comparison): its metric with 95 % interval and samples, speed,
    size, and the rule's verdict (the reason in the cell's tooltip); ``chosen`` marks the precision picked."""

    def number(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    rows = [
        [
            ("&#9654; " if c.precision == chosen else "") + esc(c.precision),
            c.variant,
            number(c.metric, ".4f"),
            "-" if not c.interval_method else f"[{c.metric_low:.4f}, {c.metric_high:.4f}]",
            c.n_samples,
            number(c.delta_vs_fp32, "+.4f"),
            number(c.throughput_per_s, ".0f"),
            number(c.p50_ms, ".2f"),
            f"{c.engine_mb:.2f}",
            c.layers,
            f"<span title='{esc(c.verdict_reason)}'>{esc(c.verdict or '-')}</span>",
            c.how,
        ]
        for c in candidates
    ]
    metric = next((c.metric_name for c in candidates if c.metric_name), "metric")
    headers = ["precision", "engine", metric, "95% interval", "samples", "vs FP32", "samples/s", "p50 ms", "engine MB"]
    return html_table([*headers, "layers", "rule", "how measured"], rows, raw_columns=(0, 10))


def front_table_html(search: MixedSearch, picked: int | None = None) -> str:
    """The Pareto front of a mixed-precision search, one row per plan: metric with 95 % interval and samples, INT8
    share, fallback, engine structure (a CPU build: not speed), whether it meets the target. ``picked`` is marked."""
    rows = [
        [
            ("&#9654; " if c.index == picked else "")
            + esc(f"{c.index}{' (search pick)' if c.chosen_by_search else ''}"),
            c.estimate.text(),
            f"{c.delta_vs_fp32:+.4f}",
            f"{c.int8_math_nodes}/{c.math_nodes} ({c.int8_share:.0%})",
            f"{c.fallback_nodes} to {c.fallback}",
            "-" if c.engine_layers is None else c.engine_layers,
            "-" if c.qdq_kernels is None else c.qdq_kernels,
            "-" if c.reformat_layers is None else c.reformat_layers,
            "-" if c.engine_bytes is None else f"{c.engine_bytes / 1e6:.2f}",
            "yes" if c.meets_target else "no",
        ]
        for c in search.front
    ]
    result = search.result
    return html_table(
        [
            "plan",
            f"{result.metric_name} [95% interval] (n)",
            "vs FP32",
            "INT8 math nodes",
            "fallback",
            "engine layers",
            "Q/DQ kernels",
            "reformats",
            "engine MB",
            "meets target",
        ],
        rows,
        raw_columns=(0,),
    )


def format_front_table_html(front: FormatFront) -> str:
    """One row per point of a front across formats, the front first (cheapest engine first): formats, metric with
    95 % interval and n, engine size and layers, where it was measured; every cell has text."""
    ordered = [*front.front, *(p for p in front.points if not p.on_front)]
    rows = [
        [
            ("&#9654; " if p.chosen else "") + esc(p.label),
            esc(p.mix),
            esc(p.estimate.text()),
            "-" if p.engine_mb is None else f"{p.engine_mb:.2f}",
            "-" if p.engine_layers is None else p.engine_layers,
            "yes" if p.on_front else "no",
            esc(p.source),
        ]
        for p in ordered
    ]
    headers = ["plan / engine", "math nodes per format", f"{front.metric_name} [95%] (n)", "engine MB", "layers"]
    return html_table([*headers, "on the front", "measured"], rows, raw_columns=(0, 1, 2, 6))


def precision_checks_html(run: QuickstartRun, limit: int = 20) -> str:
    """Requested vs actual precision of every engine this run built: one line per engine (nodes checked per requested
    precision, mismatches), then each mismatch (node, op, requested, actual, the layer running it, the reason) up to
    ``limit`` per engine. An engine without a check says so."""
    builds = run.builds
    if not builds:
        return "<p>No engine was built, so no precision was checked.</p>"
    lines, rows = [], []
    for variant, build in builds.items():
        check = build.engine.precision_check
        if check is None:
            lines.append(f"<li>{esc(variant)}: not checked (the build recorded no layer precisions)</li>")
            continue
        lines.append(f"<li>{esc(variant)}: {esc(check.summary())}</li>")
        rows += [
            [variant, m.node, m.op or "-", m.requested or "-", m.actual or "-", m.layer or "no layer"]
            + [m.reason or "reason not known"]
            for m in check.mismatches[:limit]
        ]
        if len(check.mismatches) > limit:
            rows.append([variant, f"... {len(check.mismatches) - limit} more", "-", "-", "-", "-", "see .layers.json"])
    table = (
        html_table(["engine", "ONNX node", "op", "requested", "actual", "engine layer", "why"], rows)
        if rows
        else "<p>Every checked node runs at the precision requested.</p>"
    )
    return "<ul>" + "".join(lines) + "</ul>" + table
