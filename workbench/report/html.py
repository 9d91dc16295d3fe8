"""The main job's report: one self-contained ``report.html`` (plotly.js inline, no network) read from a typed run.

Sections: run summary, cleaning waterfall, fusion view (a static SVG drawing of the engine), per-layer diff chart, task-metric table, timing results,
bottleneck diagnosis (each verdict cites a number measured in this run), exported bundle. A stage that did not run
shows why instead of a chart.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING

from plotly.offline import get_plotlyjs

from workbench._io import write_text_atomic
from workbench.engine.lint import lint
from workbench.flow.artifacts import QuickstartRun, StageStatus
from workbench.flow.formats import run_front
from workbench.flow.stages import STAGE_BY_NAME
from workbench.precision.variant import VARIANTS, Variant
from workbench.report.diagnosis import (
    NEXT_STEPS_NOTE,
    diagnose,
    kept_wider,
    layer_cause,
    next_step_commands,
    node_inputs,
)
from workbench.report.tables import (
    choice_html,
    esc,
    format_front_table_html,
    front_table_html,
    html_table,
    metrics_table_html,
    precision_checks_html,
    stage_table_html,
    timing_table_html,
    verdicts_html,
)
from workbench.viz import calib as calib_figures
from workbench.viz import clean as clean_figures
from workbench.viz import engine_view, palette
from workbench.viz import metrics as metric_figures
from workbench.viz import timing as timing_figures

if TYPE_CHECKING:
    import plotly.graph_objects as go

SECTION_IDS = (
    "summary",
    "cleaning",
    "fusion",
    "layer-diff",
    "metrics",
    "mixed-precision",
    "timing",
    "diagnosis",
    "export",
    "next-steps",
)

_CSS = (
    """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.92rem} td,th{border:1px solid #ddd;padding:.3rem .55rem;text-align:left;vertical-align:top}
th{background:#f5f5f5} """
    + " ".join(f".status-{s.value}{{color:{palette.STATUS_COLORS[s.value]}}}" for s in StageStatus)
    + """
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5rem .8rem;margin:.6rem 0} .muted{color:#666;font-size:.9rem}
code{background:#f3f3f3;padding:0 .25rem;border-radius:3px;overflow-wrap:anywhere} pre{white-space:pre-wrap}
"""
)


def _figure_html(figure: go.Figure, div_id: str) -> str:
    return str(figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False}))


def _stage_note(run: QuickstartRun, stage: str) -> str:
    result = run.stage(stage)
    title = STAGE_BY_NAME[stage].title
    return f'<p class="note">Stage <b>{esc(title)}</b> is {esc(result.status.label)}: {esc(result.text)}</p>'


def _section(section_id: str, title: str, content: str) -> str:
    return f'<section id="{section_id}"><h2>{esc(title)}</h2>\n{content}\n</section>'


def _summary_section(run: QuickstartRun) -> str:
    cfg, env = run.config, run.environment
    gpu = env.gpu if env else None
    where = (
        f"GPU: {gpu}"
        if gpu
        else "no NVIDIA GPU on this machine: engines were built ahead of time (not executed); "
        "accuracy and timing come from ONNX Runtime CPU"
    )
    backend = f"{env.backend} {env.backend_version}" if env else "unknown"
    chosen = f"{run.chosen_variant} engine" if run.chosen_variant else "no engine chosen"
    return (
        f"<p>Model <b>{esc(cfg.model)}</b>; precision asked <b>{esc(cfg.precision)}</b>, {esc(chosen)}; calibration "
        f"<b>{esc(cfg.calibration_method)}</b>; {cfg.streams} stream(s), batch {cfg.batch}. Backend "
        f"{esc(backend)}; {esc(where)}.</p>" + stage_table_html(run)
    )


def _cleaning_section(run: QuickstartRun) -> str:
    if run.cleaning is None:
        return _stage_note(run, "clean")
    clean = run.cleaning.result
    rows = [
        [
            p.name,
            p.status,
            p.nodes_before,
            p.nodes_after,
            f"{p.max_abs_diff:.2e}" if p.max_abs_diff is not None else "-",
        ]
        for p in clean.passes
    ]
    return _figure_html(clean_figures.node_waterfall_figure(clean), "fig-cleaning") + html_table(
        ["pass", "status", "nodes before", "nodes after", "max |diff|"], rows
    )


def _fusion_section(run: QuickstartRun) -> str:
    if run.fp32_engine is None or not run.stage("fusion").ok:
        return _stage_note(run, "fusion")
    fp32 = run.fp32_engine
    content = (
        '<p class="muted">Each box is one engine layer: the ONNX op types it fused, its index, type and precision, '
        "and its first ONNX nodes (hover for all); dashed boxes are layers TensorRT inserted.</p>"
        '<h3>FP32 engine</h3><div id="fig-fusion">'
        + engine_view.engine_view_html(fp32.layer_map, fp32.engine_layers, table_id="wb-nodes-fp32")
        + "</div>"
    )
    chosen = run.selection.build if run.selection else None
    if chosen is not None and chosen.variant is not Variant.FP32:
        engine = chosen.engine
        content += (
            f"<h3>Chosen engine: {esc(VARIANTS[chosen.variant].label)} (fusions gained vs FP32 outlined green)</h3>"
            '<div id="fig-fusion-chosen">'
            + engine_view.engine_view_html(
                engine.layer_map,
                engine.engine_layers,
                fusion_diff=engine_view.fusion_diff_of(fp32.layer_map, engine.layer_map),
                table_id="wb-nodes-chosen",
            )
            + "</div>"
        )
    return content + _lint_html(run) + "<h3>Requested vs actual precision</h3>" + precision_checks_html(run)


def _lint_html(run: QuickstartRun) -> str:
    """The engine linter's findings on the engines of this run (a table per engine; none is said plainly)."""
    parts = ["<h3>Engine lint</h3>"]
    engines = {Variant.FP32: run.fp32_engine}
    if run.selection is not None:
        engines[run.selection.variant] = run.selection.engine
    for variant, engine in engines.items():
        title = VARIANTS[variant].label
        if engine is None:
            continue
        report = lint(engine.layer_map, engine.engine_layers, engine.built_onnx(), engine.precision_check)
        rows = report.rows()
        if not rows:
            parts.append(f"<p>{esc(title)} engine: no findings.</p>")
            continue
        parts.append(f"<p>{esc(title)} engine: " + esc(", ".join(f"{k} {v}" for k, v in report.counts().items())))
        parts.append(
            html_table(
                ["kind", "severity", "layer", "ONNX nodes", "finding", "fix"], [list(r.values()) for r in rows[:40]]
            )
        )
    return "".join(parts)


def _layer_diff_section(run: QuickstartRun) -> str:
    if run.layer_diff is None:
        return _stage_note(run, "layer_diff")
    diff = run.layer_diff.diff
    content = _figure_html(calib_figures.sqnr_figure(diff, highlight=list(kept_wider(run))), "fig-layer-diff")
    inputs = node_inputs(run)
    worst = [
        [
            row.node,
            row.name,
            f"{row.noise_added:.3g}",
            f"{row.drop_db:.1f}",
            f"{row.sqnr_db_accumulated:.1f}",
            layer_cause(diff, row, inputs),
        ]
        for row in diff.ranking(5)
    ]
    return content + (
        "<p>Tensors where INT8 adds the most relative noise power (worst first):</p>"
        + html_table(["node", "tensor", "noise added", "SQNR drop dB", "accumulated SQNR dB", "cause"], worst)
    )


def _metrics_section(run: QuickstartRun) -> str:
    if run.metrics is None or not run.metrics.rows:
        return _stage_note(run, "metrics")
    rows, chosen = run.metrics.rows, run.chosen_variant
    return (
        (choice_html(run.selection.choice) if run.selection else "")
        + metrics_table_html(rows, chosen, run.config.max_metric_drop, run.config.decision_confidence)
        + _figure_html(metric_figures.metrics_figure(rows, chosen), "fig-metrics")
        + f'<p class="muted">{esc(run.metrics.how)}.</p>'
    )


def _mixed_section(run: QuickstartRun) -> str:
    """The accuracy-target search: every evaluated plan (metric with 95 % interval against INT8 share and engine
    structure), the chosen plan marked, and the Pareto front as a table."""
    if run.mixed_search is None:
        return _stage_note(run, "search") + _format_front_html(run)
    search = run.mixed_search
    result = search.result
    chosen = search.intervals[result.chosen.index]
    figure = calib_figures.pareto_figure(result, intervals=search.intervals, front=[c.index for c in search.front])
    cost_label = result.cost_label or "no engine was built (no TensorRT backend)"
    return (
        f"<p>Target: {esc(result.metric_name)} {'&ge;' if result.higher_is_better else '&le;'} "
        f"{result.target:.4f} (FP32 {result.fp32_metric:.4f} {'minus' if result.higher_is_better else 'plus'} "
        f"{run.config.max_metric_drop:g}); all-INT8 {result.int8_metric:.4f}. The search chose "
        f"<b>{esc(chosen.text())}</b> with {result.int8_math_nodes}/{result.math_nodes} Conv/Gemm/MatMul nodes INT8"
        f"; target {esc(result.target_verdict)}. {result.evaluations_used} plan(s) evaluated "
        f"(+1 FP32) in {result.seconds:.1f} s, budget {result.budget}; stopped: {esc(result.stop_reason)}. "
        f"{esc(_pick_text(run))}</p>"
        + _figure_html(figure, "fig-pareto")
        + f"<p>Pareto front ({len(search.front)} of {len(result.evaluated)} plans: none better on metric, INT8 "
        "share and engine layers + reformats at once); the export panel picks from these:</p>"
        + front_table_html(search, picked=result.chosen.index if run.search_pick is run.chosen_variant else None)
        + f'<p class="muted">Engine columns: {esc(cost_label)}. Metric: {esc(search.how)}.</p>'
        + _format_front_html(run)
    )


def _format_front_html(run: QuickstartRun) -> str:
    """The Pareto front across formats: every built variant and search plan, metric against engine size."""
    front = run_front(run)
    if front is None or not any(p.engine_bytes is not None for p in front.points):
        return "<h3>Pareto front across formats</h3><p>No engine was built with a measured metric, so there is no front.</p>"
    notes = "".join(f"; {esc(note)}" for note in front.notes)
    return (
        "<h3>Pareto front across formats</h3><p>Each built engine (FP32, FP16, INT8, FP8 when asked for, mixed) and "
        f"each plan of the search: {esc(front.metric_name)} against engine size. On the front: "
        + esc(", ".join(p.label for p in front.front))
        + ".</p>"
        + _figure_html(calib_figures.format_front_figure(front), "fig-format-front")
        + format_front_table_html(front)
        + f'<p class="muted">Metric: {esc(front.how)}. Cost: {esc(front.cost_how)}{notes}.</p>'
    )


def _pick_text(run: QuickstartRun) -> str:
    """Which engine the search's pick is, and whether it is the one chosen (and exported)."""
    pick = run.search_pick
    if pick is None:
        return ""
    if pick not in run.builds:
        return f"Its engine ({pick}) was not built: {run.stage('build_mixed').text}."
    if pick is run.chosen_variant:
        return f"Its engine ({pick}) is the one chosen" + (" and exported." if run.bundle is not None else ".")
    return f"Its engine is {pick}; the rule chose {run.chosen_variant} (see the engine choice)."


def _timing_section(run: QuickstartRun) -> str:
    if run.timing is None:
        return _stage_note(run, "timing")
    results = run.timing.results
    content = (
        f'<p class="note">{esc(run.timing.reason)}.</p>'
        + timing_table_html(results)
        + _figure_html(
            timing_figures.latency_throughput_figure(results, title=timing_figures.chosen_title(run.timing.chosen)),
            "fig-timing",
        )
    )
    notes = sorted({note for r in results for note in r.notes})
    if notes:
        content += "<ul class='muted'>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"
    return content


def _export_section(run: QuickstartRun) -> str:
    if run.bundle is None:
        return _stage_note(run, "export")
    bundle = run.bundle
    files = sorted(str(p.relative_to(bundle.path)) for p in bundle.path.rglob("*") if p.is_file())
    chosen = run.selection.build if run.selection else None
    what = f"{chosen.variant} engine, {chosen.source}" if chosen and chosen.source else f"{run.chosen_variant} engine"
    return (
        f"<p>Bundle <code>{esc(bundle.path)}</code> ({esc(what)}):</p><ul>"
        + "".join(f"<li><code>{esc(name)}</code></li>" for name in files)
        + "</ul><p class='muted'>manifest.json records: "
        + esc(", ".join(sorted(bundle.manifest)))
        + "</p>"
    )


def _next_steps_section(run: QuickstartRun) -> str:
    """What to run next on this run's own files, each step with the reason from this run; every command runs as
    printed (absolute paths, options the CLI has) on a CPU-only machine."""
    steps = next_step_commands(run)
    if not steps:
        return "<p>No next step applies: no stage of this run left files to look at further.</p>"
    return (
        "<ol>"
        + "".join(f"<li>{esc(why)}:<br><code>workbench {esc(command)}</code></li>" for why, command in steps)
        + "</ol>"
        + f'<p class="muted">{esc(NEXT_STEPS_NOTE)}</p>'
    )


def render_report(run: QuickstartRun) -> str:
    """The report as one HTML string with plotly.js embedded (opens offline)."""
    parts = [
        _section("summary", "Run summary", _summary_section(run)),
        _section("cleaning", "Cleaning waterfall", _cleaning_section(run)),
        _section("fusion", "Fusion view", _fusion_section(run)),
        _section("layer-diff", "Per-layer diff", _layer_diff_section(run)),
        _section("metrics", "Task-metric table", _metrics_section(run)),
        _section("mixed-precision", "Mixed-precision search (Pareto view)", _mixed_section(run)),
        _section("timing", "Timing results", _timing_section(run)),
        _section("diagnosis", "Bottleneck diagnosis", verdicts_html(diagnose(run))),
        _section("export", "Exported bundle", _export_section(run)),
        _section("next-steps", "Next steps", _next_steps_section(run)),
    ]
    model = esc(run.config.model)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>trt-workbench report: {model}</title><style>{_CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>trt-workbench report: {model}</h1><p class='muted'>generated {stamp} by trt-workbench "
        "(<code>workbench demo</code> or the quickstart notebook); self-contained (plotly.js inline), opens offline.</p>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )


def write_report(run: QuickstartRun, path: str | Path = "out/report.html") -> Path:
    """Render the report and write it atomically to ``path``."""
    return write_text_atomic(path, render_report(run))
