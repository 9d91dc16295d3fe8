"""CPU tests of workbench.timing.serving with the ONNX Runtime executor: a manager with two models, admission
control, hot reload under load (a good, a broken and an unloadable version), versions on responses, batching into
buckets with measured padding, the adaptive delay, the saturation and SLA searches, and their figure."""

from __future__ import annotations

import gc
import json
import math
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.errors import WorkbenchError
from workbench.timing.executors import OrtCpuExecutor
from workbench.timing.serving import (
    EngineManager,
    LoadProbe,
    ModelServer,
    ServeConfig,
    SlaSearchResult,
    saturation_search,
    sla_search,
)
from workbench.timing.serving.search import ServingProbe
from workbench.timing.serving.server import adaptive_delay_s
from workbench.zoo.digits import DIGITS_ONNX


def matmul_model(path: Path, weight: np.ndarray, layers: int = 1) -> Path:
    """x[N, K] -> (x @ W) repeated ``layers`` times -> y: a model whose outputs identify its weights exactly."""
    k = weight.shape[0]
    nodes, inits = [], [numpy_helper.from_array(weight.astype(np.float32), "W")]
    name = "x"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [name, "W"], [f"h{i}"], name=f"/layer{i}/MatMul"))
        name = f"h{i}"
    nodes.append(helper.make_node("Identity", [name], ["y"], name="/out/Identity"))
    graph = helper.make_graph(
        nodes,
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", k])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def reference(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture()
def weights() -> np.ndarray:
    return (np.random.default_rng(0).standard_normal((64, 64)) / 8).astype(np.float32)


def test_manager_serves_two_models_each_with_its_own_outputs_versions_and_stats(tmp_path: Path, weights) -> None:
    mm = matmul_model(tmp_path / "mm.onnx", weights)
    digits_x = np.random.default_rng(1).standard_normal((20, 1, 32, 32)).astype(np.float32)
    mm_x = np.random.default_rng(2).standard_normal((20, 64)).astype(np.float32)
    with EngineManager() as manager:
        manager.add("digits", lambda: OrtCpuExecutor(DIGITS_ONNX), "d1", ServeConfig(lanes=2, max_batch=8))
        manager.add("mm", lambda: OrtCpuExecutor(mm), "m1", ServeConfig(lanes=1, max_batch=4, priority="high"))
        futures = []
        for i in range(20):  # interleaved, from several threads' worth of requests at once
            futures.append(("digits", i, manager.submit("digits", {"image": digits_x[i : i + 1]})))
            futures.append(("mm", i, manager.submit("mm", [mm_x[i : i + 1]])))
        responses = [(name, i, f.result(timeout=30)) for name, i, f in futures]
        stats = manager.stats()
        with pytest.raises(WorkbenchError, match="no model named"):
            manager.submit("nope", samples=1)
    digits_ref = ort.InferenceSession(str(DIGITS_ONNX), providers=["CPUExecutionProvider"]).run(
        None, {"image": digits_x}
    )[0]
    mm_ref = reference(mm, mm_x)
    for name, i, response in responses:
        assert response.ok and response.model == name
        assert response.version == ("d1" if name == "digits" else "m1")
        expected = digits_ref[i] if name == "digits" else mm_ref[i]
        np.testing.assert_allclose(response.outputs[0][0], expected, rtol=1e-5, atol=1e-5)
        assert response.latency_ms > 0 and response.padded_samples >= response.batch_samples >= 1
    for name in ("digits", "mm"):
        s = stats[name]
        assert s.offered == s.completed == 20 and s.refused == s.expired == s.failed == 0
        assert s.responses_by_version == {("d1" if name == "digits" else "m1"): 20}
        assert s.latency_n == 20 and not s.latency_reliable["p99"]  # 20 samples cannot support a p99
    assert stats["mm"].priority == "high" and stats["mm"].config.max_batch == 4
    assert json.loads(json.dumps(stats["digits"].to_json()))["model"] == "digits"


def test_full_queue_refuses_at_once_with_a_clear_status_and_drops_nothing(tmp_path: Path) -> None:
    slow = matmul_model(tmp_path / "slow.onnx", np.eye(256, dtype=np.float32) * 0.5, layers=40)
    config = ServeConfig(lanes=1, depth=1, max_batch=1, queue_capacity=3)
    with ModelServer("slow", lambda: OrtCpuExecutor(slow), "1", config) as server:
        x = np.ones((1, 256), dtype=np.float32)
        futures = []
        for _ in range(30):
            before = time.perf_counter()
            futures.append(server.submit([x]))
            assert time.perf_counter() - before < 0.05  # never blocks
        refused_at_once = [f for f in futures if f.done() and f.result().status == "refused"]
        responses = [f.result(timeout=60) for f in futures]
        stats = server.stats()
    statuses = [r.status for r in responses]
    assert set(statuses) <= {"ok", "refused"}
    assert statuses.count("refused") == len(refused_at_once) >= 20  # capacity 3 + 1 in flight of 30
    assert all(
        "queue full (3 requests waiting)" in f.result().reason and f.result().version is None for f in refused_at_once
    )
    assert stats.offered == 30 and stats.refused == len(refused_at_once) and stats.completed == statuses.count("ok")


def test_hot_reload_under_load_switches_at_request_boundaries_and_rejects_bad_versions(tmp_path: Path, weights) -> None:
    v1 = matmul_model(tmp_path / "v1.onnx", weights, layers=8)
    v2 = matmul_model(tmp_path / "v2.onnx", weights * np.float32(1 + 2e-6), layers=8)  # same within tolerance
    broken = matmul_model(tmp_path / "broken.onnx", weights * np.float32(1.5), layers=8)  # loads, answers wrongly
    x = np.random.default_rng(3).standard_normal((400, 64)).astype(np.float32)
    expected = {"v1": reference(v1, x), "v2": reference(v2, x)}
    assert not np.array_equal(expected["v1"], expected["v2"])  # responses tell which version ran them
    config = ServeConfig(lanes=2, depth=2, max_batch=8, max_queue_delay_ms=1.0)
    server = ModelServer("mm", lambda: OrtCpuExecutor(v1), "v1", config)
    futures: list = []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set() and i < len(x):
            futures.append((i, server.submit([x[i : i + 1]])))
            i += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.05)
    bad = server.reload(lambda: OrtCpuExecutor(broken), "v-broken")
    missing = server.reload(lambda: OrtCpuExecutor(tmp_path / "missing.onnx"), "v-missing")
    good = server.reload(lambda: OrtCpuExecutor(v2), "v2", rtol=1e-4, atol=1e-4)
    time.sleep(0.05)
    stop.set()
    thread.join()
    responses = [(i, f.result(timeout=30)) for i, f in futures]
    after = server.infer([x[:2]])
    stats = server.stats()
    server.close()

    assert not bad.accepted and bad.stage == "check" and "differ beyond" in bad.reason and bad.max_abs_error > 0.1
    assert not missing.accepted and missing.stage == "load" and "no such ONNX file" in missing.reason
    assert good.accepted and good.stage == "swapped" and 0 < good.max_abs_error < 1e-4
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the reload gave the collector back
    assert good.started_s <= good.swapped_s <= good.drained_s  # a v1 batch timed before the swap drains at it
    assert after.version == "v2" and server.versions == ["v1", "v2"]
    assert all(r.ok for _, r in responses)  # nothing refused or failed during three reloads
    seen = {r.version for _, r in responses}
    assert seen == {"v1", "v2"}  # traffic crossed the swap; the rejected versions never answered
    for i, r in responses:  # each response's outputs are exactly those of the version it names
        np.testing.assert_array_equal(r.outputs[0][0], expected[r.version][i])
    # v1 answered only requests dispatched before the swap; in-flight v1 batches finished on v1 after it
    assert stats.responses_by_version["v1"] + stats.responses_by_version["v2"] == stats.completed == len(responses) + 1
    assert [rep.new_version for rep in server.reloads] == ["v-broken", "v-missing", "v2"]


def test_batches_pad_to_buckets_and_padding_is_measured(tmp_path: Path, weights) -> None:
    mm = matmul_model(tmp_path / "mm.onnx", weights)
    config = ServeConfig(lanes=1, depth=1, max_batch=16, max_queue_delay_ms=50.0, adaptive_delay=False)
    assert config.bucket_sizes() == [1, 2, 4, 8, 16] and config.pad(5) == 8 and config.pad(16) == 16
    x = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
    with ModelServer("mm", lambda: OrtCpuExecutor(mm), "1", config) as server:
        futures = [server.submit([x[i : i + 1]]) for i in range(5)]  # one batch of 5 after the 50 ms delay
        responses = [f.result(timeout=10) for f in futures]
        stats = server.stats()
    assert {(r.batch_samples, r.padded_samples) for r in responses} == {(5, 8)}
    assert stats.bucket_counts == {8: 1} and stats.padding_fraction == pytest.approx(3 / 8)
    np.testing.assert_allclose(np.concatenate([r.outputs[0] for r in responses]), reference(mm, x), rtol=1e-5)
    assert all(r.queue_ms >= 0 for r in responses) and max(r.queue_ms for r in responses) >= 40


def test_adaptive_delay_follows_the_arrival_rate() -> None:
    service = {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8, 16: 3.0}  # ms per batch: bigger batches pay off
    cap = 0.004
    assert adaptive_delay_s(200.0, service, 1, cap) == 0.0  # 1 request/ms keeps up: no wait
    assert adaptive_delay_s(2000.0, service, 1, cap) == pytest.approx(4 / 2000)  # needs batches of 4
    assert adaptive_delay_s(2000.0, service, 4, cap) == 0.0  # ... and has them
    assert adaptive_delay_s(100000.0, service, 1, cap) == pytest.approx(16 / 100000)  # max bucket, fills fast
    assert adaptive_delay_s(4800.0, service, 1, cap) == pytest.approx(16 / 4800)  # 3.3 ms, under the cap
    assert adaptive_delay_s(4800.0, service, 1, 0.002) == 0.002
    assert adaptive_delay_s(500.0, service, 1, 0.0) == 0.0


def _queue_probe(capacity_fn, budget_ms: float, calls: list):
    """A synthetic server: M/D/1-like p99 that blows up near a configuration's capacity."""

    def probe(config: ServeConfig, rate: float) -> LoadProbe:
        calls.append((config, rate))
        capacity = capacity_fn(config)
        rho = rate / capacity
        service_ms = 1000.0 * config.max_batch / capacity
        p99 = (
            math.inf
            if rho >= 1
            else service_ms * (1 + config.max_queue_delay_ms / 4) + 4.6 * service_ms * rho / (2 * (1 - rho))
        )
        return LoadProbe(
            config, rate, min(rate, capacity), p99, (p99, p99), p99 / 2, 1000, 0, 0, 1.0, 0.0, p99 <= budget_ms, ""
        )

    return probe


def _capacity(config: ServeConfig) -> float:
    # more batch and lanes help with diminishing returns; a small delay helps a little, then hurts
    return (
        3000
        * math.log2(1 + config.max_batch) ** 0.8
        * (1 + 0.3 * math.log2(config.lanes))
        / (1 + 0.05 * config.lanes)
        * (1 + 0.05 * min(config.max_queue_delay_ms, 1.0))
    )


def test_saturation_search_brackets_the_budget_rate_within_tolerance() -> None:
    calls: list = []
    config = ServeConfig(max_batch=16)
    probe = _queue_probe(_capacity, 10.0, calls)
    result = saturation_search(lambda r: probe(config, r), config, 10.0, start_rate=1000.0, max_probes=12)
    rates = np.linspace(100, _capacity(config), 20000)
    oracle = _queue_probe(_capacity, 10.0, [])
    true_best = max(r for r in rates if oracle(config, r).passed)
    assert result.best_rate_per_s <= true_best and result.best_rate_per_s >= 0.95 * true_best
    assert len(result.probes) == len(calls) <= 12 and result.best.passed
    assert any(not p.passed for p in result.probes)  # the bracket's upper end was measured, not assumed
    pruned = saturation_search(lambda r: probe(config, r), config, 10.0, 1000.0, beat=2 * true_best)
    assert len(pruned.probes) == 1 and pruned.best_rate_per_s == 0.0


def test_coordinate_sla_search_matches_the_grid_with_a_quarter_of_its_runs() -> None:
    space = {"lanes": (1, 2, 4), "max_batch": (8, 16, 32, 64, 128), "max_queue_delay_ms": (0, 1, 2, 4)}
    grid_calls: list = []
    coordinate_calls: list = []
    grid = sla_search(_queue_probe(_capacity, 10.0, grid_calls), 10.0, space, strategy="grid", start_rate=500.0)
    quick = sla_search(_queue_probe(_capacity, 10.0, coordinate_calls), 10.0, space, start_rate=500.0)
    assert grid.configurations == grid.grid_size == 60 and grid.runs == len(grid_calls)
    assert quick.best_rate_per_s >= 0.95 * grid.best_rate_per_s
    assert quick.runs <= 0.25 * grid.runs, (quick.runs, grid.runs)
    assert quick.configurations < grid.grid_size
    restored = SlaSearchResult.from_json(json.loads(json.dumps(quick.to_json())))
    assert restored.best_rate_per_s == quick.best_rate_per_s and len(restored.tried) == len(quick.tried)
    assert restored.triton_settings()["dynamic_batching"]["max_queue_delay_microseconds"] == int(
        quick.chosen.config.max_queue_delay_ms * 1000
    )
    from workbench.viz.serving import sla_search_figure

    figure = sla_search_figure(quick, grid=grid)
    names = {trace.name for trace in figure.data}
    assert "chosen" in names and any(s.y0 == 10.0 for s in figure.layout.shapes)
    assert sum(len(t.x) for t in figure.data if t.name not in ("chosen",)) >= quick.runs


def test_real_saturation_search_on_the_cpu_executor() -> None:
    executor = OrtCpuExecutor(DIGITS_ONNX)
    probe = ServingProbe(
        lambda c: ModelServer("digits", lambda: executor, "1", c, owns_executor=False),
        budget_ms=20.0,
        duration_s=0.15,
        warmup_s=0.05,
        min_requests=100,
    )
    try:
        config = ServeConfig(lanes=1, depth=2, max_batch=8, max_queue_delay_ms=1.0)
        start = 0.2 * probe.capacity_estimate(config)
        result = saturation_search(lambda r: probe(config, r), config, 20.0, start, max_probes=4, rel_tol=0.2)
    finally:
        probe.close()
    assert len(result.probes) >= 2 and all(p.n_requests > 0 for p in result.probes)
    for p in result.probes:  # the verdicts follow from the measurements
        assert p.passed == (p.p99_ms <= 20.0 and p.refused == 0 and p.expired == 0)
    assert result.best_rate_per_s > 0 and result.best.throughput_per_s > 0.5 * result.best_rate_per_s


def test_bad_settings_are_refused_with_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(WorkbenchError, match="lanes=0"):
        ServeConfig(lanes=0)
    with pytest.raises(WorkbenchError, match="priority='urgent'"):
        ServeConfig(priority="urgent")
    with pytest.raises(WorkbenchError, match="sm_count=0"):
        ServeConfig(sm_count=0)
    partitioned = ServeConfig(sm_count=72)  # an SM partition is part of the settings: label and JSON carry it
    assert "72 SMs" in partitioned.label() and ServeConfig.from_json(partitioned.to_json()) == partitioned
    with pytest.raises(WorkbenchError, match="partitions a GPU's SMs"):
        ModelServer("x", lambda: OrtCpuExecutor(DIGITS_ONNX), "1", partitioned)
    with pytest.raises(WorkbenchError, match="the loader failed|no such ONNX file"):
        ModelServer("x", lambda: OrtCpuExecutor(tmp_path / "none.onnx"), "1")
    with ModelServer("d", lambda: OrtCpuExecutor(DIGITS_ONNX), "1", ServeConfig(max_batch=4)) as server:
        with pytest.raises(WorkbenchError, match="does not fit"):
            server.submit(samples=5)
        assert server.reload(lambda: OrtCpuExecutor(DIGITS_ONNX), "1").reason.startswith("version '1' was already")
    assert server.submit(samples=1).result().status == "refused"  # closed: refused, not dropped


def test_serving_settings_become_a_valid_triton_config() -> None:
    from workbench.export.triton import TritonOptions, triton_config, validate_triton_config

    config = ServeConfig(
        lanes=3, max_batch=64, max_queue_delay_ms=2.5, queue_capacity=500, timeout_ms=40.0, priority="high"
    )
    io = [
        {
            "name": "x",
            "io_mode": "input",
            "datatype": "half",
            "dimensions": [-1, 3, 224, 224],
            "profiles": [{"min": [1, 3, 224, 224], "opt": [8, 3, 224, 224], "max": [64, 3, 224, 224]}],
        },
        {"name": "y", "io_mode": "output", "datatype": "half", "dimensions": [-1, 1000]},
    ]
    parsed = validate_triton_config(triton_config(io, TritonOptions.from_serving(config, "resnet50")))
    assert parsed.max_batch_size == 64 and parsed.instance_group[0].count == 3
    assert parsed.instance_group[0].rate_limiter.priority == 1
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 2500
    assert parsed.dynamic_batching.default_queue_policy.max_queue_size == 500
    assert parsed.dynamic_batching.default_queue_policy.default_timeout_microseconds == 40000
    assert [g.batch_size for g in parsed.optimization.cuda.graph_spec] == [1, 2, 4, 8, 16, 32, 64]
    assert parsed.version_policy.latest.num_versions == 1


def test_coordinate_search_on_the_h200_grid_replayed() -> None:
    """Replays the committed H200 grid (each configuration passes exactly up to its measured best rate): the
    coordinate search must reach 95 % of the grid's best with at most a quarter of its runs. A check of the search
    logic on a measured landscape, not a new measurement."""
    from workbench.repo import bench_results_dir

    doc = json.loads((bench_results_dir() / "serving_h200_2026-12-03.json").read_text())
    grid = SlaSearchResult.from_json(doc["sections"]["sla"]["sla_10ms_grid"])
    best = {(t.config.lanes, t.config.max_batch, t.config.max_queue_delay_ms): t.best_rate_per_s for t in grid.tried}

    def replay(config: ServeConfig, rate: float) -> LoadProbe:
        ok = rate <= best[(config.lanes, config.max_batch, config.max_queue_delay_ms)]
        return LoadProbe(config, rate, rate, 5.0 if ok else 50.0, (5.0, 50.0), 2.0, 1000, 0, 0, 1.0, 0.0, ok, "")

    quick = sla_search(replay, 10.0, grid.space, start_rate=3000.0, max_probes=6)
    assert quick.best_rate_per_s >= 0.95 * grid.best_rate_per_s
    assert quick.runs <= 0.25 * grid.runs
