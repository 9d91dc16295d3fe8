"""The main job's report: one self-contained ``report.html`` (plotly.js inline, no network) and its diagnosis.

Sections: run summary, cleaning waterfall, fusion view, per-layer diff chart, task-metric table, timing results,
bottleneck diagnosis (each verdict cites a number measured in this run), exported bundle. A stage that did not run
shows why instead of a chart.
"""

from __future__ import annotations

import datetime as _dt
import html
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench._io import write_text_atomic

SECTION_IDS = ("summary", "cleaning", "fusion", "layer-diff", "metrics", "timing", "diagnosis", "export")
STREAMS_HELP_RATIO = 1.15  # a configuration "helps" when it gives at least 15 % more throughput
_SECTION_STAGES = {
    "cleaning": "clean",
    "fusion": "fusion",
    "layer-diff": "layer_diff",
    "metrics": "metrics",
    "timing": "timing",
    "export": "export",
}


@dataclass
class Verdict:
    """One line of the bottleneck diagnosis and the measured numbers it rests on."""

    topic: str
    text: str
    evidence: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _find(results: list[Any], streams: int, batch: int) -> Any | None:
    return next((r for r in results if r.streams == streams and r.batch == batch), None)


def diagnose(run: Any) -> list[Verdict]:
    """What the processor was busy with, whether streams or batching help, and which layers cost accuracy."""
    verdicts: list[Verdict] = []
    objects = run.objects
    results = objects.get("timing_results") or []
    if results:
        chosen = results[0]
        stages = chosen.stages_ms
        compute, latency = stages.get("compute", math.nan), chosen.latency_ms.get("p50", math.nan)
        device = "GPU" if chosen.executor != "cpu" else "CPU (ONNX Runtime, no GPU here)"
        share = compute / latency if latency and latency > 0 else math.nan
        waiting = stages.get("wait", 0.0) + stages.get("queue", 0.0)
        verdicts.append(
            Verdict(
                "busy with",
                (
                    f"The {device} was busy computing {chosen.busy_fraction:.0%} of the measured time; a request's median "
                    f"latency of {latency:.2f} ms was {compute:.2f} ms compute ({share:.0%}), {waiting:.2f} ms waiting for a "
                    f"free lane and {stages.get('h2d', 0.0) + stages.get('d2h', 0.0):.2f} ms copies."
                ),
                {
                    "busy_fraction": chosen.busy_fraction,
                    "p50_latency_ms": latency,
                    "compute_ms": compute,
                    "wait_ms": waiting,
                },
            )
        )
        host_bound = chosen.enqueue_us_p50 > 0.8 * compute * 1e3
        enqueue_note = (
            f"host enqueue took {chosen.enqueue_us_p50:.0f} us per request vs {compute * 1e3:.0f} us of "
            f"compute: the host thread {'is' if host_bound else 'is not'} the bottleneck"
            + (" (CPU executor: enqueue hands the request to a worker thread)" if chosen.executor == "cpu" else "")
        )
        verdicts.append(
            Verdict(
                "host",
                enqueue_note[0].upper() + enqueue_note[1:] + ".",
                {"enqueue_us_p50": chosen.enqueue_us_p50, "compute_ms": compute},
            )
        )
        one_stream = _find(results, 1, chosen.batch)
        if chosen.streams > 1 and one_stream is not None:
            ratio = chosen.throughput_per_s / one_stream.throughput_per_s
            helps = ratio >= STREAMS_HELP_RATIO
            verdicts.append(
                Verdict(
                    "more streams",
                    (
                        f"{chosen.streams} streams give {chosen.throughput_per_s:.0f} samples/s vs {one_stream.throughput_per_s:.0f} "
                        f"with 1 ({ratio:.2f}x): more streams {'help' if helps else 'do not help'}"
                        + (
                            ""
                            if helps
                            else f" (the {device} is already {one_stream.busy_fraction:.0%} busy with one stream)"
                        )
                        + "."
                    ),
                    {
                        "ratio": ratio,
                        "throughput_streams": chosen.throughput_per_s,
                        "throughput_1_stream": one_stream.throughput_per_s,
                    },
                )
            )
        else:
            verdicts.append(
                Verdict(
                    "more streams",
                    f"Timed with {chosen.streams} stream(s) only; raise the streams setting to compare.",
                    {"streams": float(chosen.streams)},
                )
            )
        unbatched = _find(results, chosen.streams, 1)
        if chosen.batch > 1 and unbatched is not None:
            ratio = chosen.throughput_per_s / unbatched.throughput_per_s
            cost = chosen.latency_ms.get("p50", math.nan) / unbatched.latency_ms.get("p50", math.nan)
            verdicts.append(
                Verdict(
                    "batching",
                    (
                        f"Batch {chosen.batch} gives {chosen.throughput_per_s:.0f} samples/s vs {unbatched.throughput_per_s:.0f} at "
                        f"batch 1 ({ratio:.2f}x) for {cost:.1f}x the median latency: batching "
                        f"{'helps throughput' if ratio >= STREAMS_HELP_RATIO else 'does not help'}."
                    ),
                    {"ratio": ratio, "latency_ratio": cost},
                )
            )
        else:
            verdicts.append(
                Verdict(
                    "batching",
                    f"Timed at batch {chosen.batch} only; raise the batch setting to compare.",
                    {"batch": float(chosen.batch)},
                )
            )
    diff = objects.get("layer_diff")
    if diff is not None:
        worst = diff.ranking(3)
        if worst:
            parts = [
                f"{row.node} (adds {row.noise_added:.2g} relative noise power, accumulated SQNR "
                f"{row.sqnr_db_accumulated:.1f} dB, {row.drop_db:.1f} dB drop)"
                for row in worst
            ]
            text = "INT8 error enters most at " + "; ".join(parts) + "."
            ranked = objects.get("int8_ranking") or []
            plan = objects.get("mixed_plan")
            if ranked and plan is not None:
                text += f" Worst INT8 layers, kept FP32 in the mixed engine: {', '.join(plan.overrides) or 'none'}."
            verdicts.append(
                Verdict(
                    "accuracy", text, {f"noise_added_{i}": float(row.noise_added or 0.0) for i, row in enumerate(worst)}
                )
            )
    rows = {row.variant: row for row in objects.get("metrics") or []}
    if "fp32" in rows and ("int8-all" in rows or "int8-mixed" in rows):
        fp32 = rows["fp32"]
        text = f"{fp32.metric}: FP32 {fp32.value:.4f}"
        evidence = {"fp32": fp32.value}
        for variant in ("fp16", "int8-all", "int8-mixed"):
            if variant in rows:
                text += f", {variant} {rows[variant].value:.4f} ({rows[variant].delta_vs_fp32:+.4f})"
                evidence[variant] = rows[variant].value
        plan = objects.get("mixed_plan")
        if plan is not None and plan.overrides:
            text += f"; falling back {len(plan.overrides)} layer(s) to FP32: {', '.join(plan.overrides)}"
        verdicts.append(Verdict("task metric", text + f" (ONNX Runtime CPU, {fp32.n_samples} samples).", evidence))
    artifact = objects.get("fp32_artifact")
    if artifact is not None:
        rows_f = objects.get("fusion_rows") or []
        fused = sum(1 for row in rows_f if len(row["onnx_nodes"]) > 1)
        verdicts.append(
            Verdict(
                "fusion",
                (
                    f"{artifact.onnx_node_count} ONNX nodes became {artifact.layer_count} engine layers; {fused} layers fuse two "
                    "or more nodes."
                ),
                {"onnx_nodes": float(artifact.onnx_node_count), "engine_layers": float(artifact.layer_count)},
            )
        )
    return verdicts


# --- HTML ------------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.92rem} td,th{border:1px solid #ddd;padding:.3rem .55rem;text-align:left;vertical-align:top}
th{background:#f5f5f5} .status-done{color:#2a7a2a} .status-failed{color:#b00} .status-unavailable,.status-skipped{color:#a66d00}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5rem .8rem;margin:.6rem 0} .muted{color:#666;font-size:.9rem}
code{background:#f3f3f3;padding:0 .25rem;border-radius:3px;overflow-wrap:anywhere} pre{white-space:pre-wrap}
"""


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _table(headers: list[str], rows: list[list[Any]], raw_columns: tuple[int, ...] = ()) -> str:
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell if i in raw_columns else _esc(cell)}</td>" for i, cell in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure_html(figure: Any, div_id: str) -> str:
    return str(figure.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config={"displaylogo": False}))


def _stage_note(run: Any, stage: str) -> str:
    result = run.stage(stage)
    return f'<p class="note">Stage <b>{_esc(result.title)}</b> is {_esc(result.status)}: {_esc(result.summary)}</p>'


def metrics_table_html(rows: list[Any], chosen: str | None = None) -> str:
    """The task-metric table (also shown by the notebook panel)."""
    body = [
        [
            ("&#9654; " if row.variant == chosen else "") + _esc(row.variant),
            f"{row.value:.4f}",
            f"{row.delta_vs_fp32:+.4f}",
            row.n_samples,
            _esc(Path(row.onnx_path).name),
        ]
        for row in rows
    ]
    return _table(
        ["variant", rows[0].metric if rows else "metric", "vs FP32", "samples", "ONNX evaluated"],
        body,
        raw_columns=(0, 4),
    )


def timing_table_html(results: list[Any]) -> str:
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
    return _table(["streams", "batch", "samples/s", "p50 ms", "p99 ms", "busy", "requests", "stable"], body)


def _section(section_id: str, title: str, content: str) -> str:
    return f'<section id="{section_id}"><h2>{_esc(title)}</h2>\n{content}\n</section>'


def _fusion_html(objects: dict[str, Any]) -> str:
    """The side-by-side ONNX/engine view when the layer-map module is present, else the fused-node bars."""
    from workbench.flow import fusion_rows
    from workbench.viz import flow as figures

    layer_map = objects.get("fp32_layermap")
    if layer_map is not None:
        from workbench.viz import engine as fusion_figures

        content = _figure_html(
            fusion_figures.side_by_side_figure(layer_map, title="Fusion view: FP32 engine"), "fig-fusion"
        )
        mixed = objects.get("mixed_artifact")
        if mixed is not None:
            from workbench.engine.layermap import LayerMap
            from workbench.model import load_onnx

            mixed_map = LayerMap.from_engine_layers(
                mixed.engine_layers,
                onnx_proto=load_onnx(mixed.onnx_path, check=False).proto,
                label=mixed.engine_path.stem,
            )
            content += _figure_html(
                fusion_figures.side_by_side_figure(mixed_map, title="Fusion view: mixed INT8 engine"),
                "fig-fusion-mixed",
            )
        return content
    content = _figure_html(figures.fusion_figure(objects["fusion_rows"], "Fusion view: FP32 engine"), "fig-fusion")
    if "mixed_artifact" in objects:
        content += _figure_html(
            figures.fusion_figure(fusion_rows(objects["mixed_artifact"]), "Fusion view: mixed INT8 engine"),
            "fig-fusion-mixed",
        )
    return content


def render_report(run: Any) -> str:
    """The report as one HTML string with plotly.js embedded (opens offline)."""
    from plotly.offline import get_plotlyjs

    from workbench.flow import STAGE_NAMES
    from workbench.viz import flow as figures

    objects = run.objects
    cfg = run.config
    env = run.environment
    parts: list[str] = []
    gpu = env.get("gpu")
    where = (
        f"GPU: {gpu}"
        if gpu
        else "no NVIDIA GPU on this machine: engines were built ahead of time (not executed); "
        "accuracy and timing come from ONNX Runtime CPU"
    )
    stage_rows = [
        [
            _esc(run.stage(n).title),
            f'<span class="status-{run.stage(n).status}">{run.stage(n).status}</span>',
            f"{run.stage(n).seconds:.2f}",
            _esc(run.stage(n).summary),
        ]
        for n in STAGE_NAMES
        if n in run.stages
    ]
    parts.append(
        _section(
            "summary",
            "Run summary",
            (
                f"<p>Model <b>{_esc(cfg.model)}</b>; chosen precision <b>{_esc(cfg.precision)}</b>; calibration "
                f"<b>{_esc(cfg.calibration_method)}</b>; {cfg.streams} stream(s), batch {cfg.batch}. Backend "
                f"{_esc(env.get('backend'))} {_esc(env.get('backend_version'))}; {_esc(where)}.</p>"
                + _table(["stage", "status", "seconds", "result"], stage_rows, raw_columns=(0, 1, 3))
            ),
        )
    )

    if "clean_result" in objects and run.stage("clean").ok:
        clean = objects["clean_result"]
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
        content = _figure_html(figures.cleaning_waterfall(clean), "fig-cleaning") + _table(
            ["pass", "status", "nodes before", "nodes after", "max |diff|"], rows
        )
    else:
        content = _stage_note(run, "clean")
    parts.append(_section("cleaning", "Cleaning waterfall", content))

    if run.stage("fusion").ok:
        content = _fusion_html(objects)
    else:
        content = _stage_note(run, "fusion")
    parts.append(_section("fusion", "Fusion view", content))

    if run.stage("layer_diff").ok:
        plan = objects.get("mixed_plan")
        diff = objects["layer_diff"]
        content = _figure_html(figures.layer_diff_figure(diff, list(plan.overrides) if plan else []), "fig-layer-diff")
        worst = [
            [
                row.node,
                row.name,
                f"{row.noise_added:.3g}",
                f"{row.drop_db:.1f}",
                f"{row.sqnr_db_accumulated:.1f}",
                row.cause or "",
            ]
            for row in diff.ranking(5)
        ]
        content += "<p>Tensors where INT8 adds the most relative noise power (worst first):</p>" + _table(
            ["node", "tensor", "noise added", "SQNR drop dB", "accumulated SQNR dB", "cause"], worst
        )
    else:
        content = _stage_note(run, "layer_diff")
    parts.append(_section("layer-diff", "Per-layer diff", content))

    if run.stage("metrics").ok and objects.get("metrics"):
        chosen = {"int8": "int8-mixed"}.get(cfg.precision, cfg.precision)
        content = (
            metrics_table_html(objects["metrics"], chosen)
            + _figure_html(figures.metrics_figure(objects["metrics"], chosen), "fig-metrics")
            + f'<p class="muted">{_esc(run.stage("metrics").data.get("how", ""))}.</p>'
        )
    else:
        content = _stage_note(run, "metrics")
    parts.append(_section("metrics", "Task-metric table", content))

    if run.stage("timing").ok:
        results = objects["timing_results"]
        content = (
            f'<p class="note">{_esc(run.stage("timing").data.get("reason", ""))}.</p>'
            + timing_table_html(results)
            + _figure_html(figures.timing_figure(results), "fig-timing")
        )
        notes = sorted({note for r in results for note in r.notes})
        if notes:
            content += "<ul class='muted'>" + "".join(f"<li>{_esc(n)}</li>" for n in notes) + "</ul>"
    else:
        content = _stage_note(run, "timing")
    parts.append(_section("timing", "Timing results", content))

    verdicts = diagnose(run)
    content = (
        "<ul>" + "".join(f"<li><b>{_esc(v.topic)}</b>: {_esc(v.text)}</li>" for v in verdicts) + "</ul>"
        if verdicts
        else "<p>No stage produced numbers to diagnose.</p>"
    )
    parts.append(_section("diagnosis", "Bottleneck diagnosis", content))

    if run.stage("export").ok:
        data = run.stage("export").data
        content = (
            f"<p>Bundle <code>{_esc(data.get('bundle', ''))}</code> ({_esc(cfg.precision)} engine):</p><ul>"
            + "".join(f"<li><code>{_esc(name)}</code></li>" for name in data.get("files", []))
            + "</ul><p class='muted'>manifest.json records: "
            + _esc(", ".join(data.get("manifest_keys", [])))
            + "</p>"
        )
    else:
        content = _stage_note(run, "export")
    parts.append(_section("export", "Exported bundle", content))

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>trt-workbench report: {_esc(cfg.model)}</title><style>{_CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<h1>trt-workbench report: {_esc(cfg.model)}</h1><p class='muted'>generated {stamp} by trt-workbench (<code>workbench demo</code> or the quickstart notebook); "
        "self-contained (plotly.js inline), opens offline.</p>\n" + "\n".join(parts) + "\n</body></html>\n"
    )


def write_report(run: Any, path: str | Path = "out/report.html") -> Path:
    """Render the report and write it atomically to ``path``."""
    return write_text_atomic(path, render_report(run))
