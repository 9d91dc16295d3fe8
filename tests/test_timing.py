"""CPU tests of workbench.timing: statistics with known answers, the dynamic batcher on a fake clock, the CPU
executor end to end on a real model (ONNX Runtime), figures and trace export, and the `workbench time` CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import rapidocr_onnxruntime

from workbench.cli import main as cli_main
from workbench.errors import WorkbenchError
from workbench.timing import RunConfig, run_pipeline, stats
from workbench.timing.batcher import DynamicBatcher, FakeClock, Request, poisson_arrivals
from workbench.timing.executors import OrtCpuExecutor, parse_shape_overrides
from workbench.timing.result import BatchRecord
from workbench.timing.trace import export_trace, trace_events
from workbench.viz import timing as timing_figures

CLS_MODEL = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
CLS_SHAPE = {"x": (1, 3, 48, 192)}  # the model names both H and W "?"; pin them
FAST = dict(warmup_s=0.05, window_s=0.1, min_windows=3, max_windows=3)


# --- statistics ------------------------------------------------------------------------------------------------


def test_percentiles_match_linear_interpolation() -> None:
    values = np.arange(1, 101, dtype=float)  # 1..100
    p = stats.percentiles(values, (50, 90, 99))
    assert p[50.0] == pytest.approx(50.5)
    assert p[90.0] == pytest.approx(90.1)
    assert p[99.0] == pytest.approx(99.01)
    assert math.isnan(stats.percentiles([], (50,))[50.0])


def test_bootstrap_interval_covers_true_quantile_and_guard_flags_small_samples() -> None:
    rng = np.random.default_rng(1)
    small = rng.exponential(1.0, size=100)
    large = rng.exponential(1.0, size=5000)
    est_small = stats.bootstrap_percentiles(small, (50, 99))
    est_large = stats.bootstrap_percentiles(large, (50, 99))
    true_p50, true_p99 = math.log(2), -math.log(0.01)  # exponential(1) quantiles
    assert est_large[50.0].ci_low <= true_p50 <= est_large[50.0].ci_high
    assert est_large[99.0].ci_low <= true_p99 <= est_large[99.0].ci_high
    width = lambda e: e.ci_high - e.ci_low  # noqa: E731
    assert width(est_large[50.0]) < width(est_small[50.0])
    assert stats.min_samples_for(99) == 500 and stats.min_samples_for(50) == 10
    assert est_small[50.0].reliable and not est_small[99.0].reliable
    assert est_large[99.0].reliable


def test_union_busy_fraction_and_overlap_on_known_spans() -> None:
    spans = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (7.0, 7.0)]
    assert stats.merge_spans(spans) == [(0.0, 3.0), (5.0, 6.0)]
    assert stats.union_length(spans) == pytest.approx(4.0)
    assert stats.busy_fraction(spans, 0.0, 10.0) == pytest.approx(0.4)
    assert stats.busy_fraction(spans, 2.0, 6.0) == pytest.approx(0.5)  # clipped to the window
    assert stats.overlap_concurrency([(0.0, 2.0), (1.0, 3.0)]) == pytest.approx(4.0 / 3.0)
    assert stats.time_average_in_flight([(0.0, 10.0), (0.0, 5.0)], 0.0, 10.0) == pytest.approx(1.5)


def test_littles_law_holds_for_a_steady_synthetic_stream() -> None:
    intervals = [(float(t), float(t) + 3.0) for t in range(100)]  # one arrival per ms, 3 ms each
    check = stats.littles_law_check(intervals, 10.0, 90.0)
    assert check.throughput_per_ms == pytest.approx(81 / 80)
    assert check.mean_latency_ms == pytest.approx(3.0)
    assert check.measured_in_flight == pytest.approx(3.0)
    assert check.ok


def test_windows_and_stability_rule() -> None:
    completions = [0.5, 1.5, 1.6, 2.5, 2.6, 2.7]
    assert stats.window_throughputs(completions, 0.0, 1.0, 3) == [1.0, 2.0, 3.0]
    assert stats.is_stable([100.0, 50.0, 100.0, 95.0, 104.0])
    assert not stats.is_stable([100.0, 80.0, 120.0])
    assert not stats.is_stable([100.0, 100.0])


# --- dynamic batcher -------------------------------------------------------------------------------------------


def test_batcher_waits_for_delay_then_releases_with_queue_times() -> None:
    clock = FakeClock()
    batcher = DynamicBatcher(max_batch=4, max_queue_delay_s=0.002)
    first, second = Request(0, clock()), None
    batcher.offer(first)
    clock.advance(0.0005)
    second = Request(1, clock())
    batcher.offer(second)
    clock.advance(0.0005)
    assert batcher.poll(clock()) is None  # oldest waited 1 ms < 2 ms and the batch is not full
    assert batcher.deadline_s() == pytest.approx(0.002)
    clock.advance(0.001)
    batch = batcher.poll(clock())
    assert batch == [first, second]
    assert first.queue_s == pytest.approx(0.002) and second.queue_s == pytest.approx(0.0015)
    assert len(batcher) == 0 and batcher.poll(clock()) is None


def test_batcher_releases_full_batches_at_once_and_keeps_the_rest() -> None:
    clock = FakeClock(10.0)
    batcher = DynamicBatcher(max_batch=4, max_queue_delay_s=1.0)
    requests = [Request(i, clock(), samples=1) for i in range(5)]
    for r in requests:
        batcher.offer(r)
    batch = batcher.poll(clock())
    assert [r.request_id for r in batch] == [0, 1, 2, 3]
    assert all(r.queue_s == 0.0 for r in batch)
    assert len(batcher) == 1 and batcher.poll(clock()) is None
    multi = DynamicBatcher(max_batch=4)
    for i, samples in enumerate((3, 2)):  # a 3-sample and a 2-sample request do not share a batch of 4
        multi.offer(Request(i, 0.0, samples=samples))
    assert [r.request_id for r in multi.poll(0.0)] == [0]
    with pytest.raises(WorkbenchError, match="max_batch"):
        multi.offer(Request(9, 0.0, samples=5))


def test_batcher_expires_requests_past_their_timeout() -> None:
    clock = FakeClock()
    batcher = DynamicBatcher(max_batch=8, max_queue_delay_s=0.010, timeout_s=0.001)
    batcher.offer(Request(0, clock()))
    clock.advance(0.0015)
    batcher.offer(Request(1, clock()))
    assert batcher.poll(clock()) is None
    expired = batcher.take_expired()
    assert [r.request_id for r in expired] == [0] and expired[0].status == "expired"
    assert len(batcher) == 1


def test_poisson_arrivals_have_the_requested_rate() -> None:
    arrivals = poisson_arrivals(1000.0, seed=3)
    times = np.array([next(arrivals) for _ in range(20000)])
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(1e-3, rel=0.03)
    assert gaps.std() == pytest.approx(1e-3, rel=0.05)  # exponential: std == mean
    with pytest.raises(WorkbenchError):
        next(poisson_arrivals(0.0))


# --- CPU executor end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cls_executor() -> OrtCpuExecutor:
    return OrtCpuExecutor(CLS_MODEL, shapes=CLS_SHAPE)


def test_cpu_executor_needs_pinned_symbolic_dims() -> None:
    with pytest.raises(WorkbenchError, match="--shape x:"):
        OrtCpuExecutor(CLS_MODEL)
    with pytest.raises(WorkbenchError, match="no such ONNX file"):
        OrtCpuExecutor("missing.onnx")
    assert parse_shape_overrides(["x:1x3x48x192"]) == {"x": (1, 3, 48, 192)}
    with pytest.raises(WorkbenchError):
        parse_shape_overrides(["x:1xAx3"])


def test_every_input_that_needs_a_shape_is_named_at_once(tmp_path) -> None:
    """A text model's ids and mask both have a symbolic sequence: one refusal names both (it took two runs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
            helper.make_node("Cast", ["mask"], ["m"], name="mask_float", to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "axis"], ["m3"], name="mask_3d"),
            helper.make_node("Mul", ["e", "m3"], ["y"], name="masked"),
        ],
        "text",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])],
        [
            numpy_helper.from_array(np.ones((10, 4), np.float32), "emb"),
            numpy_helper.from_array(np.array([2], np.int64), "axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "text.onnx")
    with pytest.raises(WorkbenchError, match="--shape ids:NxN --shape mask:NxN") as refused:
        OrtCpuExecutor(tmp_path / "text.onnx")
    assert "inputs ['ids', 'mask'] have symbolic non-batch dimensions" in str(refused.value)
    executor = OrtCpuExecutor(tmp_path / "text.onnx", shapes={"ids": (1, 8), "mask": (1, 8)})
    assert [slot.sample_shape for slot in executor.inputs] == [(8,), (8,)]


def test_cpu_pipeline_closed_loop_end_to_end(cls_executor: OrtCpuExecutor) -> None:
    import onnxruntime as ort

    result = run_pipeline(cls_executor, RunConfig(streams=2, batch=2, **FAST), model="ocr-cls")
    assert result.executor == "cpu" and "no GPU" in result.executor_label
    assert result.streams == 2 and result.batch == 2 and result.n_requests > 10
    lanes_used = {r.lane for r in result.records}
    assert lanes_used == {0, 1}
    for r in result.records:
        assert r.dispatch_ms <= r.enqueue_end_ms
        assert r.h2d_start_ms <= r.compute_end_ms <= r.d2h_end_ms
        assert r.stage_ms()["h2d"] == 0.0 and r.stage_ms()["d2h"] == 0.0
    # throughput = samples completed inside the steady-state window / its length, recomputed here
    lo, hi = result.warmup_ms, result.warmup_ms + result.span_ms
    done = sum(r.size for r in result.records if lo <= r.d2h_end_ms <= hi)
    assert result.throughput_per_s == pytest.approx(done / result.span_ms * 1e3)
    assert 0 < result.busy_fraction <= 1
    assert result.latency_ms["p50"] <= result.latency_ms["p99"]
    # the lane really ran the model: its outputs equal a fresh ORT session on the same feed
    lane = cls_executor.bind_lane(0, [2])
    lane.enqueue(2)
    session = ort.InferenceSession(str(CLS_MODEL), providers=["CPUExecutionProvider"])
    expected = session.run(None, lane._feeds[2])[0]
    np.testing.assert_allclose(lane.last_outputs[0], expected, rtol=1e-5, atol=1e-6)
    document = result.to_json()
    json.dumps(document)  # serialisable
    assert "records" not in document and len(result.to_json(include_records=True)["records"]) == len(result.records)


def test_throughput_and_p99_carry_bootstrap_intervals_from_a_real_run(
    cls_executor: OrtCpuExecutor, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real ONNX Runtime run: throughput's interval is the bootstrap over the span's sub-windows, recomputed here
    from the run's own completions; the timing table and the CLI's row print both intervals and n."""
    from workbench.report.tables import timing_table_html
    from workbench.timing.cli import _print_row

    result = run_pipeline(cls_executor, RunConfig(streams=2, batch=2, **FAST), model="ocr-cls")
    low, high = result.throughput_ci_per_s
    assert low <= result.throughput_per_s <= high and 0 < low < high, (low, result.throughput_per_s, high)
    lo, hi = result.warmup_ms, result.warmup_ms + result.span_ms
    completions = [r.d2h_end_ms for r in result.records if lo <= r.d2h_end_ms <= hi for _ in range(r.size)]
    again = stats.throughput_interval(completions, lo, hi)
    assert (again[0] * 1e3, again[1] * 1e3) == pytest.approx((low, high))
    p99_low, p99_high = result.latency_ci_ms["p99"]
    assert p99_low <= result.latency_ms["p99"] <= p99_high
    assert result.to_json()["throughput_ci_per_s"] == [low, high]  # and the JSON keeps it
    table = timing_table_html([result])
    assert f"{result.throughput_per_s:.0f} [{low:.0f}, {high:.0f}]" in table
    assert f"{result.latency_ms['p99']:.2f} [{p99_low:.2f}, {p99_high:.2f}]" in table
    assert "bootstrap" in table and "sub-windows" in table and "<td></td>" not in table
    figure = timing_figures.latency_throughput_figure([timing_figures.sweep_point(result)])
    _print_row("2 stream(s)", result)
    printed = capsys.readouterr().out
    assert f"[{low:.1f}, {high:.1f}] samples/s" in printed and f"(n={result.n_requests})" in printed
    error_x = figure.data[0].error_x
    assert error_x.array[0] == pytest.approx(high - result.throughput_per_s)
    assert error_x.arrayminus[0] == pytest.approx(result.throughput_per_s - low)


def test_throughput_interval_covers_a_known_rate() -> None:
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(1.0, size=4000))  # a Poisson stream of rate 1 per unit time
    low, high = stats.throughput_interval(times, 0.0, float(times[-1]))
    assert low < 1.0 < high and high - low < 0.15
    assert all(math.isnan(v) for v in stats.throughput_interval([], 0.0, 1.0))
    assert all(math.isnan(v) for v in stats.throughput_interval([0.5], 1.0, 1.0))


def test_cpu_pipeline_open_loop_with_dynamic_batching(cls_executor: OrtCpuExecutor) -> None:
    config = RunConfig(
        streams=2, load="open", rate_per_s=300.0, dynamic_batching=True, max_batch=4, max_queue_delay_ms=3.0, **FAST
    )
    result = run_pipeline(cls_executor, config)
    assert result.dynamic_batching == {"max_batch": 4, "max_queue_delay_ms": 3.0}
    assert result.stages_ms["queue"] > 0.0  # arrivals wait for their batch
    assert max(r.size for r in result.records) > 1
    assert all(r.padded_size in (1, 2, 4) and r.padded_size >= r.size for r in result.records)
    # the offered load, measured by arrival times (fixed in advance): what was served depends on how busy the CPU is
    lo, hi = result.warmup_ms, result.warmup_ms + result.span_ms
    arrived = sum(1 for r in result.records for a in r.arrivals_ms if lo <= a <= hi)
    assert arrived / result.span_ms * 1e3 == pytest.approx(300.0, rel=0.5)  # ~90 arrivals: 0.5 is > 4 sigma
    assert 0 < result.requests_per_s <= 1.5 * 300.0  # served: at most what was offered (plus noise)


def test_sync_baseline_keeps_one_request_in_flight(cls_executor: OrtCpuExecutor) -> None:
    result = run_pipeline(cls_executor, RunConfig(load="sync", streams=4, **FAST))
    assert result.streams == 1 and result.depth == 1
    ordered = sorted(result.records, key=lambda r: r.dispatch_ms)
    for before, after in zip(ordered, ordered[1:]):
        assert after.dispatch_ms >= before.d2h_end_ms  # never overlapping


def test_run_config_rejects_bad_values() -> None:
    for bad in (
        RunConfig(load="burst"),
        RunConfig(streams=0),
        RunConfig(load="open"),
        RunConfig(dynamic_batching=True, batch=16, max_batch=8),
    ):
        with pytest.raises(WorkbenchError):
            bad.validate()
    assert RunConfig(dynamic_batching=True, max_batch=8).batch_sizes() == [1, 2, 4, 8]
    assert RunConfig(batch=3).batch_sizes() == [3]


# --- figures and trace -----------------------------------------------------------------------------------------


def _synthetic_records() -> list[BatchRecord]:
    records = []
    for i in range(4):
        lane = i % 2
        t = 1.0 * i
        records.append(
            BatchRecord(
                lane=lane,
                slot=0,
                size=1,
                padded_size=1,
                arrivals_ms=[t - 0.5],
                request_samples=[1],
                dispatch_ms=t,
                enqueue_end_ms=t + 0.02,
                h2d_start_ms=t + 0.05,
                h2d_end_ms=t + 0.1,
                compute_end_ms=t + 0.9,
                d2h_end_ms=t + 1.0,
                measured=True,
            )
        )
    return records


def test_gantt_has_one_row_per_stream_and_numeric_bars() -> None:
    records = _synthetic_records()
    figure = timing_figures.gantt_figure(records, start_ms=0.0, window_ms=5.0)
    by_name = {trace.name: trace for trace in figure.data}
    assert set(by_name) == {"enqueue", "queue", "h2d", "compute", "d2h"}
    assert all(trace.type == "bar" and trace.orientation == "h" for trace in figure.data)
    compute = by_name["compute"]
    assert list(compute.y) == ["stream 0", "stream 1", "stream 0", "stream 1"]
    assert list(compute.base) == pytest.approx([0.1, 1.1, 2.1, 3.1])
    assert list(compute.x) == pytest.approx([0.8] * 4)
    assert set(by_name["enqueue"].y) == {"host enqueue"}
    assert figure.layout.xaxis.type == "linear"
    assert list(figure.layout.yaxis.categoryarray) == ["stream 1", "stream 0", "host queue", "host enqueue"]
    narrow = timing_figures.gantt_figure(records, start_ms=0.0, window_ms=1.15)
    assert len({trace.name: trace for trace in narrow.data}["compute"].x) == 2  # only spans inside the window


def test_trace_export_is_valid_chrome_trace(tmp_path: Path) -> None:
    records = _synthetic_records()
    events = trace_events(records, "test device")
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 4 * 5  # enqueue, queue, h2d, compute, d2h per request
    compute = [e for e in spans if e["name"] == "compute"]
    assert [e["tid"] for e in compute] == [1, 2, 1, 2]
    assert compute[0]["ts"] == pytest.approx(100.0) and compute[0]["dur"] == pytest.approx(800.0)  # microseconds
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[(2, 1)] == "stream 0" and names[(2, 2)] == "stream 1"
    executor = OrtCpuExecutor(CLS_MODEL, shapes=CLS_SHAPE)
    result = run_pipeline(executor, RunConfig(streams=1, **FAST))
    path = export_trace(result, tmp_path / "trace.json")
    document = json.loads(path.read_text())
    assert document["displayTimeUnit"] == "ms" and document["metadata"]["executor"] == "cpu"
    assert sum(1 for e in document["traceEvents"] if e["ph"] == "X" and e["name"] == "compute") == len(result.records)


def test_latency_figures_have_sla_and_percentile_lines() -> None:
    points = [
        {"streams": s, "batch": 1, "throughput_per_s": 100.0 * s, "latency_ms": {"p99": 1.0 + s}} for s in (1, 2, 4)
    ]
    curve = timing_figures.latency_throughput_figure(points, sla_ms=4.0)
    assert list(curve.data[0].x) == [100.0, 200.0, 400.0] and list(curve.data[0].y) == [2.0, 3.0, 5.0]
    assert any(shape.y0 == 4.0 and shape.y1 == 4.0 for shape in curve.layout.shapes)
    hist = timing_figures.latency_histogram([1.0, 2.0, 3.0], percentiles={"p50": 2.0, "p99": 2.98})
    assert hist.data[0].type == "histogram" and len(hist.layout.shapes) == 2


# --- CLI -------------------------------------------------------------------------------------------------------


def test_cli_time_writes_the_documented_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "TIMING.json"
    trace = tmp_path / "trace.json"
    code = cli_main(
        [
            "time",
            str(CLS_MODEL),
            "--executor",
            "cpu",
            "--shape",
            "x:1x3x48x192",
            "--streams",
            "1,2",
            "--batch",
            "1",
            "--warmup",
            "0.05",
            "--window",
            "0.1",
            "--max-windows",
            "3",
            "-o",
            str(out),
            "--trace",
            str(trace),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    for key in ("executor", "streams", "batch", "throughput_per_s", "latency_ms", "stages_ms", "busy_fraction"):
        assert key in doc
    assert doc["executor"] == "cpu" and doc["streams"] == [1, 2] and doc["batch"] == 1
    assert set(doc["latency_ms"]) >= {"p50", "p90", "p99"}
    assert [r["streams"] for r in doc["runs"]] == [1, 2] and doc["baseline"]["load"] == "sync"
    assert doc["throughput_per_s"] == max(r["throughput_per_s"] for r in doc["runs"])
    assert json.loads(trace.read_text())["traceEvents"]
    assert "sync baseline" in capsys.readouterr().out


def test_cli_time_bad_input_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["time", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "t.json")]) == 2
    assert "no such ONNX file" in capsys.readouterr().err
    assert cli_main(["time", str(CLS_MODEL), "--load", "open", "-o", str(tmp_path / "t.json")]) == 2
    assert "--rate" in capsys.readouterr().err
    assert cli_main(["time", "resnet-9000", "--executor", "torch", "-o", str(tmp_path / "t.json")]) == 2
    assert not (tmp_path / "t.json").exists()


# --- sweep, callbacks, timeouts --------------------------------------------------------------------------------


class _LaneBudgetedCpuExecutor(OrtCpuExecutor):
    """The CPU executor with a declared per-lane memory need, to exercise the sweep's memory guard."""

    lane_bytes = 300 * 2**20

    def estimate_new_lane_bytes(self, n_lanes: int, batch_sizes: list[int]) -> int:
        return n_lanes * max(batch_sizes) * self.lane_bytes


def test_sweep_runs_the_grid_and_skips_what_would_not_fit() -> None:
    from workbench.timing import grid_plan, run_sweep

    executor = _LaneBudgetedCpuExecutor(CLS_MODEL, shapes=CLS_SHAPE)
    steps: list[str] = []
    sweep = run_sweep(
        executor,
        grid_plan((1, 2, 4), (1, 2)),
        RunConfig(**FAST),
        free_bytes=lambda: 2 * 2**30,
        progress=lambda event: steps.append(f"{event.index}/{event.total} {event.message}"),
    )  # 2 GiB free: 0.9 * 2 GiB fits 6 lane-batches
    assert [(r.streams, r.batch) for r in sweep.results] == [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)]
    assert [(s.streams, s.batch) for s in sweep.skipped] == [(4, 2)]
    assert "2048 MiB free" in sweep.skipped[0].reason
    assert steps[0] == "0/6 timing 1 stream(s) x batch 1" and len(steps) == 6
    assert sweep.find(2, 2) is sweep.results[-1] and sweep.find(4, 2) is None


def test_sweep_plans_put_the_chosen_configuration_first_and_stop_when_asked(cls_executor: OrtCpuExecutor) -> None:
    from workbench.timing import interactive_config, run_sweep, sweep_plan

    assert sweep_plan(4, 8, include_baselines=True) == [(4, 8), (1, 8), (4, 1), (1, 1)]
    assert sweep_plan(1, 1, include_baselines=True) == [(1, 1)]
    assert sweep_plan(4, 8, include_baselines=False) == [(4, 8)]
    config = interactive_config(0.05, load="closed")
    assert (config.warmup_s, config.window_s, config.min_windows, config.max_windows) == (0.05, 0.05, 3, 4)
    assert interactive_config(1.0).warmup_s == 0.2
    stopped = run_sweep(cls_executor, sweep_plan(2, 1, True), config, progress=lambda event: event.index < 1)
    assert stopped.stopped and [(r.streams, r.batch) for r in stopped.results] == [(2, 1)]


def test_callbacks_fire_once_per_batch_and_timeouts_are_counted(cls_executor: OrtCpuExecutor) -> None:
    seen: list[BatchRecord] = []
    result = run_pipeline(cls_executor, RunConfig(streams=2, timeout_ms=1e-3, **FAST), on_complete=seen.append)
    assert len(seen) == len(result.records) and all(not math.isnan(r.d2h_end_ms) for r in seen)
    assert result.timeouts["late"] == result.n_requests  # every request takes longer than 1 us


def test_cpu_lanes_keep_a_failure_to_its_own_slot(cls_executor: OrtCpuExecutor) -> None:
    """One lanes class for timing and serving: a slot's failure is raised by wait() on that slot only, and the
    slot works again once its next batch runs."""
    from workbench.timing.lanes import ThreadLanes

    lanes = ThreadLanes(cls_executor, n_lanes=1, depth=2, batch_sizes=[2])
    try:
        good = lanes.input_array(0, 0).copy()
        assert good.shape == (2, 3, 48, 192)
        lanes._inputs[(0, 1)] = [np.zeros((2, 5), dtype=np.float32)]  # a feed of the wrong rank: ORT refuses it
        lanes.submit(0, 0, 2)
        lanes.submit(0, 1, 2)
        lanes.wait(0, 0)
        assert lanes.output_rows(0, 0, 0, 0, 2).shape[0] == 2
        with pytest.raises(WorkbenchError, match="lane 0 slot 1"):
            lanes.wait(0, 1)
        lanes._inputs[(0, 1)] = [good]
        lanes.submit(0, 1, 2)
        lanes.wait(0, 1)  # the earlier failure was that batch's, not the slot's for ever
        np.testing.assert_allclose(lanes.output_rows(0, 1, 0, 0, 2), lanes.output_rows(0, 0, 0, 0, 2), rtol=1e-5)
    finally:
        lanes.close()


def test_cpu_pipeline_times_a_model_whose_integer_input_indexes_a_two_row_table(tmp_path: Path) -> None:
    """BERT's token types index a table of two rows: timing feeds ids 0 or 1 (ids 1..99 failed MiniLM's Gather and
    with it the quickstart's timing stage on every BERT-style model)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "token_type_embeddings")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["token_type_embeddings", "token_type_ids"], ["embedded"]),
            helper.make_node("ReduceMean", ["embedded"], ["y"], keepdims=0),
        ],
        "token_types",
        [helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["N", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [table],
    )
    path = tmp_path / "token_types.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    executor = OrtCpuExecutor(path, shapes={"token_type_ids": (1, 8)})
    result = run_pipeline(executor, RunConfig(streams=2, batch=2, **FAST))
    assert result.n_requests > 3 and result.throughput_per_s > 0
    lane = executor.bind_lane(0, [2])
    lane.enqueue(2)
    ids = lane._feeds[2]["token_type_ids"]
    assert set(np.unique(ids)) == {0, 1}  # both rows used, none past the table
