"""GPU tests of the async pipeline (torch CUDA-graph executor, cuda.core lanes). Skipped without a CUDA GPU.

Run on the H200: ``python3 -m pytest tests/test_timing_gpu.py -q``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # CPU-only machines: skip the module (the torch build here has no CUDA)
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("cuda.core")

from workbench.timing import RunConfig, measure_compute_limit, run_pipeline  # noqa: E402
from workbench.timing.lanes import CudaLanes  # noqa: E402
from workbench.timing.torch_executor import TorchExecutor  # noqa: E402

pytestmark = pytest.mark.gpu
FAST = dict(warmup_s=0.1, window_s=0.15, min_windows=3, max_windows=4)


def small_cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    )


def test_graph_pipeline_outputs_match_eager_module_and_events_are_ordered() -> None:
    executor = TorchExecutor(small_cnn(), (3, 64, 64), dtype="float32", cuda_graph=True)
    assert executor.graph_status()["active"]
    lanes = CudaLanes(executor, n_lanes=2, depth=2, batch_sizes=[4])
    try:
        result = run_pipeline(executor, RunConfig(streams=2, batch=4, **FAST), lanes=lanes)
        for lane in range(2):
            for slot in range(2):
                host_in = lanes._host_in[lane][slot][0].array.view(np.float32)[: 4 * 3 * 64 * 64]
                x = torch.from_numpy(host_in.reshape(4, 3, 64, 64).copy()).cuda()
                with torch.inference_mode():
                    expected = executor.module(x).float().cpu().numpy()
                got = lanes.output_array(lane, slot)[: 4 * 10].reshape(4, 10)
                np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)
    finally:
        lanes.close()
    assert result.n_requests > 50 and result.throughput_per_s > 0
    for r in result.records:
        assert r.h2d_start_ms <= r.h2d_end_ms <= r.compute_end_ms <= r.d2h_end_ms
        assert r.dispatch_ms <= r.enqueue_end_ms
    assert 0 < result.busy_fraction <= 1.0
    assert result.littles_law.ok, result.littles_law


def test_pipeline_beats_synchronous_loop_on_a_real_cnn() -> None:
    torchvision = pytest.importorskip("torchvision")
    executor = TorchExecutor(torchvision.models.resnet18(weights=None), (3, 224, 224), dtype="float16")
    sync = run_pipeline(executor, RunConfig(load="sync", **FAST))
    piped = run_pipeline(executor, RunConfig(streams=4, depth=2, **FAST))
    limit = measure_compute_limit(executor, 1)
    print(
        f"resnet18 b1: sync {sync.throughput_per_s:.0f}/s (busy {sync.busy_fraction:.2f}), 4 lanes "
        f"{piped.throughput_per_s:.0f}/s (busy {piped.busy_fraction:.2f}), one-stream limit "
        f"{limit['throughput_per_s']:.0f}/s, enqueue p50 {piped.enqueue_us_p50:.1f} us"
    )
    # Batch-1 kernels use a fraction of the SMs and leave launch gaps; four lanes run them side by side.
    assert piped.throughput_per_s > 1.5 * sync.throughput_per_s
    assert piped.latency_ms["p50"] < 4 * sync.latency_ms["p50"]


def test_open_loop_dynamic_batching_reports_queue_time_and_batches() -> None:
    executor = TorchExecutor(small_cnn(), (3, 64, 64), dtype="float16", cuda_graph=True)
    cfg = RunConfig(
        streams=2, load="open", rate_per_s=4000, dynamic_batching=True, max_batch=8, max_queue_delay_ms=1.0, **FAST
    )
    result = run_pipeline(executor, cfg)
    sizes = [r.size for r in result.records if r.measured]
    assert max(sizes) > 1
    assert result.stages_ms["queue"] > 0
    assert abs(result.requests_per_s - 4000) / 4000 < 0.25


def test_capture_failure_falls_back_to_eager_and_says_why() -> None:
    # Runs last in this file: a failed capture can leave torch's CUDA state odd for later tests.
    class SyncsInForward(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum().item() > 1e30:  # .item() synchronizes: illegal during graph capture
                return x
            return x * 2

    executor = TorchExecutor(SyncsInForward(), (8,), dtype="float32", cuda_graph=True)
    result = run_pipeline(executor, RunConfig(streams=1, **FAST))
    status = executor.graph_status()
    assert status["requested"] and not status["active"]
    assert "capture failed" in status["fallback_reason"]
    assert result.cuda_graph["fallback_reason"] == status["fallback_reason"]
    assert result.n_requests > 0
