"""GPU tests of serving (torch CUDA-graph executor, cuda.core lanes). Skipped without a CUDA GPU.

Run on the H200: ``python3 -m pytest tests/test_serving_gpu.py -q``.
"""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cuda.core")

from workbench.timing.layer_profile import torch_layer_profile  # noqa: E402
from workbench.timing.serving import EngineManager, ModelServer, ServeConfig  # noqa: E402
from workbench.timing.torch_executor import TorchExecutor  # noqa: E402

pytestmark = pytest.mark.gpu


def small_cnn(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).eval()


def eager(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return module.cuda().float()(torch.from_numpy(x).cuda()).cpu().numpy()


def test_gpu_server_outputs_versions_buckets_and_stream_priorities() -> None:
    from cuda.bindings import runtime

    _, least, greatest = runtime.cudaDeviceGetStreamPriorityRange()
    module = small_cnn()
    x = np.random.default_rng(0).standard_normal((24, 3, 32, 32)).astype(np.float32)
    expected = eager(copy.deepcopy(module), x)
    with EngineManager() as manager:
        hi = manager.add(
            "hi",
            lambda: TorchExecutor(copy.deepcopy(module), (3, 32, 32), dtype="float32"),
            "1",
            ServeConfig(lanes=2, max_batch=8, priority="high", max_queue_delay_ms=1.0),
        )
        lo = manager.add(
            "lo",
            lambda: TorchExecutor(copy.deepcopy(module), (3, 32, 32), dtype="float32"),
            "1",
            ServeConfig(lanes=1, max_batch=16, priority="low"),
        )
        assert hi._active.stream_priority == int(greatest) and lo._active.stream_priority == int(least)
        futures = [(i, manager.submit("hi" if i % 2 else "lo", [x[i : i + 1]])) for i in range(24)]
        responses = [(i, f.result(timeout=30)) for i, f in futures]
        burst = [hi.submit([x[i : i + 3]]) for i in range(0, 15, 3)]  # 3-sample requests batch and pad
        burst_responses = [f.result(timeout=30) for f in burst]
    for i, r in responses:
        assert r.ok and r.version == "1"
        np.testing.assert_allclose(r.outputs[0][0], expected[i], rtol=1e-3, atol=1e-3)
    for j, r in enumerate(burst_responses):
        np.testing.assert_allclose(r.outputs[0], expected[3 * j : 3 * j + 3], rtol=1e-3, atol=1e-3)
        assert r.padded_samples in (4, 8) and r.padded_samples >= r.batch_samples


def test_gpu_hot_reload_under_load_rejects_a_broken_version_and_keeps_serving() -> None:
    module = small_cnn()
    broken = copy.deepcopy(module)
    with torch.no_grad():
        broken[0].weight.mul_(3.0)
    x = np.random.default_rng(1).standard_normal((64, 3, 32, 32)).astype(np.float32)
    expected = eager(copy.deepcopy(module), x)
    server = ModelServer(
        "cnn",
        lambda: TorchExecutor(copy.deepcopy(module), (3, 32, 32), dtype="float32"),
        "v1",
        ServeConfig(lanes=2, depth=2, max_batch=16, max_queue_delay_ms=0.5),
    )
    futures: list = []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set():
            futures.append((i % 64, server.submit([x[i % 64 : i % 64 + 1]])))
            i += 1
            time.sleep(0.0002)

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(0.1)
    bad = server.reload(lambda: TorchExecutor(copy.deepcopy(broken), (3, 32, 32), dtype="float32"), "v-bad")
    good = server.reload(lambda: TorchExecutor(copy.deepcopy(module), (3, 32, 32), dtype="float32"), "v2")
    time.sleep(0.1)
    stop.set()
    thread.join()
    responses = [(i, f.result(timeout=30)) for i, f in futures]
    server.close()
    assert not bad.accepted and bad.stage == "check"
    assert good.accepted, good.reason
    assert all(r.ok for _, r in responses) and {r.version for _, r in responses} == {"v1", "v2"}
    for i, r in responses:
        np.testing.assert_allclose(r.outputs[0][0], expected[i], rtol=1e-3, atol=1e-3)


def test_gpu_layer_profile_reports_kernel_time_per_module() -> None:
    import io

    import onnx

    module = small_cnn().cuda().half()
    x = torch.randn(8, 3, 64, 64, device="cuda", dtype=torch.float16)
    buffer = io.BytesIO()
    torch.onnx.export(
        small_cnn(), (torch.randn(1, 3, 64, 64),), buffer, dynamo=False, opset_version=17, input_names=["x"]
    )
    profile = torch_layer_profile(module, x, onnx_model=onnx.load_from_string(buffer.getvalue()), iterations=10)
    assert profile.clock == "CUDA kernel time" and profile.total_ms > 0
    by_name = {layer.name: layer for layer in profile.layers}
    assert by_name["0"].time_ms > 0 and by_name["0"].onnx_nodes == ("/0/Conv",)
    assert profile.unmapped_onnx_nodes == ()
    assert sum(layer.time_ms for layer in profile.layers) == pytest.approx(profile.total_ms, rel=0.05)


def test_sm_partition_confines_graph_launches_and_partitions_are_disjoint() -> None:
    """A model on a green context of a quarter of the SMs runs measurably slower than on the whole GPU (its CUDA
    graphs captured on the partition's stream stay inside it); the second partition gets the rest; a third is
    refused with what fits."""
    import torchvision
    from cuda.bindings import driver

    from workbench.errors import WorkbenchError
    from workbench.timing.green import SmPartition

    total = torch.cuda.get_device_properties(0).multi_processor_count
    module = torchvision.models.resnet50()
    whole = TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", description="resnet50")
    confined = TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", description="resnet50")

    def images_per_s(executor: TorchExecutor, stream) -> float:
        binding = executor.bind_lane(0, [64], stream)
        for _ in range(5):
            binding.enqueue(64, stream)
        stream.sync()
        start = time.perf_counter()
        for _ in range(20):
            binding.enqueue(64, stream)
        stream.sync()
        return 64 * 20 / (time.perf_counter() - start)

    from cuda.core import Device

    device = Device()
    device.set_current()
    full_rate = images_per_s(whole, device.create_stream())
    quarter = SmPartition(total // 4)
    rest = SmPartition(total - quarter.sm_count)
    try:
        assert quarter.sm_count >= total // 4 and quarter.sm_count + rest.sm_count <= total
        part_rate = images_per_s(confined, quarter.create_stream())
        assert confined.cuda_graph_active, confined.fallback_reason
        assert part_rate < 0.6 * full_rate, (part_rate, full_rate)  # a quarter of the SMs: far below the whole GPU
        with pytest.raises(WorkbenchError, match="does not fit"):
            SmPartition(8)
    finally:
        quarter.close()
        rest.close()
    again = SmPartition(total // 2)  # closed partitions return their SMs
    again.close()
    assert int(driver.cuCtxSynchronize()[0]) == 0


def test_hot_reload_of_a_partitioned_model_keeps_its_sms() -> None:
    """A reloaded version of a model on an SM partition runs on that model's SMs (it does not take the rest of the
    GPU, which stays free for a second partitioned model), and its answers match."""
    module = small_cnn()
    x = np.random.default_rng(2).standard_normal((4, 3, 32, 32)).astype(np.float32)
    expected = eager(copy.deepcopy(module), x)
    total = torch.cuda.get_device_properties(0).multi_processor_count
    config = ServeConfig(lanes=1, depth=2, max_batch=4, sm_count=total // 2)
    load = lambda: TorchExecutor(copy.deepcopy(module), (3, 32, 32), dtype="float32")  # noqa: E731
    with ModelServer("a", load, "v1", config) as first:
        granted = first._active.lanes.sm_count
        report = first.reload(load, "v2")
        assert report.accepted, report.reason
        assert first._active.lanes.sm_count == granted
        rest = total - granted
        with ModelServer("b", load, "v1", ServeConfig(lanes=1, depth=2, max_batch=4, sm_count=rest)) as second:
            assert second._active.lanes.sm_count == rest
            for server in (first, second):
                response = server.infer([x])
                assert response.ok
                np.testing.assert_allclose(response.outputs[0], expected, rtol=1e-3, atol=1e-3)


def test_graph_kernels_run_at_the_lane_priority() -> None:
    """Every kernel node of a lane's CUDA graph carries the lane stream's priority (the executable graph is
    instantiated to use it), a lane re-bound to a stream of another priority follows it, and it takes effect: a
    high-priority ResNet-50 at batch 1 next to a saturating low-priority batch-64 graph finishes several times
    sooner than at equal priority (bench/priority_probe.py measured 2.5 ms vs 13 ms on an H200)."""
    import torchvision
    from cuda.bindings import driver
    from cuda.core import Device, StreamOptions

    device = Device()
    device.set_current()
    _, least, greatest = driver.cuCtxGetStreamPriorityRange()
    urgent = device.create_stream(options=StreamOptions(nonblocking=True, priority=int(greatest)))
    calm = device.create_stream(options=StreamOptions(nonblocking=True, priority=int(least)))
    module = torchvision.models.resnet50()
    hi = TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", description="hi")
    lo = TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", description="lo")

    def node_priorities(lane) -> set[int]:
        attribute = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PRIORITY
        kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
        found = set()
        for captured in lane.graphs.values():
            graph = driver.CUgraph(int(captured.raw_cuda_graph()))
            _, _, count = driver.cuGraphGetNodes(graph, 0)
            _, nodes, _ = driver.cuGraphGetNodes(graph, count)
            found |= {
                int(driver.cuGraphKernelNodeGetAttribute(node, attribute)[1].priority)
                for node in nodes
                if driver.cuGraphNodeGetType(node)[1] == kernel
            }
        return found

    hi_lane = hi.bind_lane(0, [1], urgent)
    assert hi_lane.priority == int(greatest) and node_priorities(hi_lane) == {int(greatest)}, hi_lane.priority_status
    lo_lane = lo.bind_lane(0, [64], calm)
    assert node_priorities(lo_lane) == {int(least)}

    def hi_ms_next_to_lo(hi_stream) -> float:
        lane = hi.bind_lane(0, [1], hi_stream)  # re-bound: the graphs follow the stream's priority
        stop = threading.Event()

        def saturate() -> None:
            device.set_current()
            while not stop.is_set():
                lo_lane.enqueue(64, calm)
                lo_lane.enqueue(64, calm)
                calm.sync()

        worker = threading.Thread(target=saturate, daemon=True)
        worker.start()
        time.sleep(0.3)
        times = []
        try:
            for _ in range(30):
                start = time.perf_counter()
                lane.enqueue(1, hi_stream)
                hi_stream.sync()
                times.append(time.perf_counter() - start)
        finally:
            stop.set()
            worker.join(timeout=30)
        return float(np.median(times) * 1e3)

    equal = device.create_stream(options=StreamOptions(nonblocking=True, priority=int(least)))
    at_equal = hi_ms_next_to_lo(equal)
    assert node_priorities(hi.bind_lane(0, [1], equal)) == {int(least)}
    at_high = hi_ms_next_to_lo(urgent)
    assert node_priorities(hi.bind_lane(0, [1], urgent)) == {int(greatest)}
    assert at_high < 0.5 * at_equal, (at_high, at_equal)
