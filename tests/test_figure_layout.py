"""Layout of the figures: they follow their container (no fixed width), keep titles clear of plotly's toolbar,
use sane axis ranges and show the measured spread. Fast: figures built from small inputs of the real result types."""

from __future__ import annotations

import math
import re

import plotly.graph_objects as go
import pytest

from workbench.flow.artifacts import MetricRow
from workbench.flow.choose import EngineCandidate
from workbench.viz import layout
from workbench.viz.metrics import candidates_figure, metric_table_figure, metrics_figure
from workbench.viz.serving import sla_search_figure
from workbench.viz.timing import gantt_figure, latency_histogram, latency_throughput_figure


def _title_lines(figure: go.Figure) -> list[str]:
    text = figure.layout.title.text or ""
    return [re.sub(r"<[^>]+>", "", line) for line in re.split(r"<br\s*/?>", text)] if text else []


def assert_fits_its_container(figure: go.Figure) -> None:
    """No width (the container's), autosize on; a title starts below the modebar row, left-aligned, wrapped, with
    the top margin holding all its lines."""
    assert figure.layout.width is None and figure.layout.autosize is True
    lines = _title_lines(figure)
    if not lines:
        return
    title = figure.layout.title
    assert title.yref == "container" and title.y == 1 and title.yanchor == "top"
    assert title.pad.t >= layout.MODEBAR_PX  # below the toolbar's row
    assert title.xanchor == "left"
    assert all(len(line) <= layout.TITLE_WRAP_CHARS * 5 // 4 for line in lines), lines
    assert figure.layout.margin.t >= layout.MODEBAR_PX + layout.SUBTITLE_LINE_PX * len(lines)


def _row(variant: str, right: int, n: int) -> MetricRow:
    return MetricRow(variant, "", "accuracy", right / n, n, True, scores=tuple([1.0] * right + [0.0] * (n - right)))


def test_metrics_figure_shows_95_intervals_on_a_fraction_axis() -> None:
    rows = [_row("fp32", 295, 300), _row("int8-all", 270, 300), _row("int8-mixed", 291, 300)]
    figure = metrics_figure(rows, "int8-mixed")
    assert_fits_its_container(figure)
    trace = figure.data[0]
    for row, plus, minus in zip(rows, trace.error_y.array, trace.error_y.arrayminus, strict=True):
        estimate = row.estimate
        assert plus == pytest.approx(estimate.high - row.value) and minus == pytest.approx(row.value - estimate.low)
        assert plus > 0 and minus > 0
    low, high = figure.layout.yaxis.range
    assert 0 <= low <= min(r.estimate.low for r in rows) and max(r.estimate.high for r in rows) <= high <= 1.02
    assert "95%" in figure.layout.title.text


def test_candidates_figure_range_marks_the_rules_pick_and_has_intervals() -> None:
    def candidate(precision: str, variant: str, metric: float, speed: float) -> EngineCandidate:
        return EngineCandidate(
            precision, variant, "", 1.0, 10, "accuracy", metric, 0.0, True, speed, 1.0, "ORT", 300,
            metric - 0.02, min(1.0, metric + 0.01), "Wilson 95%",
        )  # fmt: skip

    candidates = [
        candidate("fp32", "fp32", 0.98, 100.0),
        candidate("fp16", "fp16", 0.98, 180.0),
        candidate("int8", "int8-mixed", 0.97, 300.0),
    ]
    figure = candidates_figure(candidates, "fp16", exported=("fp32",))
    assert_fits_its_container(figure)
    low, high = figure.layout.yaxis.range
    assert 0.9 < low < 0.95 and 0.99 <= high <= 1.02  # not 0-1.5
    trace = figure.data[0]
    assert list(trace.marker.size) == [12, 18, 12]  # the rule's pick, not the last export
    assert trace.marker.symbol[0] == "circle-dot"  # exported
    assert trace.error_y.array[0] == pytest.approx(0.01) and trace.error_y.arrayminus[0] == pytest.approx(0.02)


def test_latency_throughput_figure_draws_p99_and_throughput_intervals() -> None:
    points = [
        {
            "series": "cpu b1",
            "streams": streams,
            "batch": 1,
            "throughput_per_s": 100.0 * streams,
            "latency_ms": {"p99": 2.0 * streams},
            "latency_ci_ms": {"p99": (1.8 * streams, 2.5 * streams)},
            "throughput_ci_per_s": (95.0 * streams, 104.0 * streams),  # bootstrap 95% interval
        }
        for streams in (1, 2, 4)
    ]
    figure = latency_throughput_figure(points, sla_ms=10.0, title="a long title " * 12)
    assert_fits_its_container(figure)
    assert len(_title_lines(figure)) >= 2  # wrapped, not running under the toolbar
    trace = figure.data[0]
    assert list(trace.error_y.array) == pytest.approx([0.5, 1.0, 2.0])
    assert list(trace.error_y.arrayminus) == pytest.approx([0.2, 0.4, 0.8])
    assert list(trace.error_x.array) == pytest.approx([4.0, 8.0, 16.0])
    assert list(trace.error_x.arrayminus) == pytest.approx([5.0, 10.0, 20.0])
    assert list(trace.textposition) == ["top center", "bottom center", "top center"]  # labels alternate


def test_sla_axis_stops_at_100x_the_budget_when_a_probe_saturates() -> None:
    from workbench.timing.serving.result import LoadProbe, ServeConfig
    from workbench.timing.serving.search import sla_search

    def probe(config: ServeConfig, rate: float) -> LoadProbe:
        capacity = 1000.0 * config.max_batch**0.5
        rho = rate / capacity
        p99 = 1e10 if rho >= 1 else 2.0 + 4.0 * rho / (1 - rho)  # a saturated run: requests never served
        return LoadProbe(
            config, rate, min(rate, capacity), p99, (0.9 * p99, 1.2 * p99), p99 / 2, 100, 0, 0, 1.0, 0.0, p99 <= 10, ""
        )

    result = sla_search(probe, 10.0, {"lanes": (1,), "max_batch": (1, 4), "max_queue_delay_ms": (0,)}, start_rate=200.0)
    figure = sla_search_figure(result)
    assert_fits_its_container(figure)
    low, high = figure.layout.yaxis.range
    assert high <= math.log10(100 * 10.0 * 1.5) + 1e-9 and low < math.log10(10.0)
    curve = figure.data[0]  # every probe's p99 with its 95% interval as an error bar
    assert list(curve.error_y.array) == pytest.approx([0.2 * y for y in curve.y])
    assert list(curve.error_y.arrayminus) == pytest.approx([0.1 * y for y in curve.y])


def test_every_other_figure_fits_its_container() -> None:
    records = [
        {
            "lane": lane,
            "dispatch_ms": t,
            "enqueue_end_ms": t + 0.1,
            "arrivals_ms": [t],
            "h2d_start_ms": t + 0.1,
            "h2d_end_ms": t + 0.2,
            "compute_end_ms": t + 1.0,
            "d2h_end_ms": t + 1.1,
            "measured": True,
        }
        for lane, t in ((0, 0.0), (1, 0.5), (0, 1.2))
    ]
    for figure in (
        gantt_figure(records),
        latency_histogram([1.0, 1.2, 1.5, 2.0, 3.0], percentiles={"p50": 1.5, "p99": 3.0}),
        metric_table_figure([{"variant": "fp32", "metric": "accuracy", "value": 0.98}]),
    ):
        assert_fits_its_container(figure)


def test_wrap_title_keeps_markup_and_breaks_long_lines() -> None:
    text = "word " * 40 + "<br><sup>" + "detail " * 30 + "</sup>"
    wrapped = layout.wrap_title(text)
    lines = re.split(r"<br\s*/?>", wrapped)
    assert len(lines) >= 4 and all(
        len(re.sub(r"<[^>]+>", "", line)) <= layout.TITLE_WRAP_CHARS * 5 // 4 for line in lines
    )
    assert sum(line.startswith("<sup>") and line.endswith("</sup>") for line in lines) >= 2


def test_export_panel_marks_the_rules_pick_not_the_last_export(tmp_path) -> None:
    """05's table and figure mark what the rule picks among the compared engines; exporting another precision
    (the notebook exports fp32 last) rings that one but does not move the marker."""
    from workbench.flow import QuickstartConfig, recommend
    from workbench.ui.export_panel import ExportPanel

    def candidate(precision: str, variant: str, right: int, speed: float) -> EngineCandidate:
        metric = right / 400
        return EngineCandidate(
            precision, variant, "", 1.0, 10, "accuracy", metric, metric - 0.99, True, speed, 1.0, "ORT", 400,
            metric - 0.01, min(1.0, metric + 0.005), "Wilson 95%",
        )  # fmt: skip

    panel = ExportPanel(QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path)), background=False)
    panel.candidates = [
        candidate("fp32", "fp32", 396, 100.0),
        candidate("fp16", "fp16", 396, 180.0),
        candidate("int8", "int8-mixed", 395, 300.0),
    ]
    pick = recommend(panel.candidates, panel.session.config.max_metric_drop)
    assert pick is not None
    for selected in ("fp32", pick.precision):
        panel.precision.value = selected  # what an export selects
        panel._render()
        assert f"&#9654; {pick.precision}" in panel.table.value and panel.table.value.count("&#9654;") == 1
        sizes = dict(zip(panel.figure.data[0].text, panel.figure.data[0].marker.size, strict=True))
        assert sizes[f"{pick.precision} (rule's pick)"] == 18 and sorted(sizes.values()) == [12, 12, 18]


def test_timing_figures_of_the_committed_h200_results_are_readable() -> None:
    """Real measured data (bench/results, ResNet-50 FP16 on an H200): one 155 ms configuration among 2-10 ms ones puts
    the latency axis on a log scale with 1-2-5 ticks; no two point labels land on each other or on the SLA label; the
    SLA and budget labels sit on their lines (on a log axis an annotation's y is log10 of the value)."""
    import json

    from workbench.repo import bench_results_dir
    from workbench.timing.serving import SlaSearchResult
    from workbench.viz.timing import LABEL_ROOM

    bench = json.loads((bench_results_dir() / "pipeline_h200_2026-12-02.json").read_text())
    resnet = next(m for m in bench["models"] if m["model"] == "resnet50")
    points = [dict(r, series=f"{r['kind']}, batch {r['batch']}") for r in resnet["runs"] if r["kind"] == "pipeline"]
    points += [dict(r, series="open batched") for r in resnet["runs"] if r["kind"] == "open_batched"]
    figure = latency_throughput_figure(points, sla_ms=5.0)
    assert_fits_its_container(figure)
    assert figure.layout.yaxis.type == "log" and {1, 2, 5} & {round(v) for v in figure.layout.yaxis.tickvals}
    (sla,) = [a for a in figure.layout.annotations if a.text == "SLA 5 ms"]
    assert sla.y == pytest.approx(math.log10(5.0))
    labelled = [
        (x, math.log10(y)) for trace in figure.data for x, y, t in zip(trace.x, trace.y, trace.text, strict=True) if t
    ]
    assert len(labelled) >= 6 and all(len(trace.customdata) == len(trace.x) for trace in figure.data)
    x0, x1 = min(x for x, _ in labelled), max(x for x, _ in labelled)
    ys = [math.log10(p["latency_ms"]["p99"]) for p in points]
    for i, (xa, ya) in enumerate(labelled):
        for xb, yb in labelled[i + 1 :]:
            apart_x = abs(xa - xb) / (x1 - x0) >= LABEL_ROOM[0] * 0.9
            apart_y = abs(ya - yb) / (max(ys) - min(ys)) >= LABEL_ROOM[1] * 0.9
            assert apart_x or apart_y, ((xa, ya), (xb, yb))

    run2 = json.loads((bench_results_dir() / "serving_h200_2026-12-03_run2.json").read_text())
    quick = SlaSearchResult.from_json(run2["sections"]["sla"]["sla_10ms_coordinate"])
    serving = sla_search_figure(quick)
    (budget,) = [a for a in serving.layout.annotations if a.text == "p99 budget 10 ms"]
    assert budget.y == pytest.approx(1.0)  # log10(10): on the line, not at 10**10
    ticks = serving.layout.yaxis.tickvals
    assert 10 in ticks and all(f"{v:g}"[0] in "125" for v in ticks)  # 1-2-5 per decade, not 3, 4, 6, ... digits
