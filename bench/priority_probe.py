"""Where does a high-priority model's latency go next to a saturating low-priority one? (issue 15, H200 probe)

    python3 bench/priority_probe.py --out $OUT/priority_probe.json [--lo-sms 72] [--seconds 2]

Same models and load as ``bench/serving_gpu.py --sections priority`` (ResNet-50 FP16, CUDA-graph executor, high
model at 1,000 req/s with max batch 8 on 2 lanes; low model offered 13,000 req/s with max batch 64). For every
batch of the high model it records the host queue (first arrival -> dispatch), the launch lag (dispatch -> the
GPU starting the batch's input copy), the input copy, the compute and the output copy, and prints their p50/p99
for several low-priority loads that each remove one kind of contention:

  * ``server``: the low model served as in the bench (pinned input copies of 19 MB per batch of 64);
  * ``server, tiny copies``: the same, its input copies shrunk to 64 bytes (copy engines no longer shared);
  * ``server, chunked copies``: its input copy cut into 1 MiB pieces (other streams' copies can slip in between);
  * ``gpu loop``: batch-64 graph launches on the low partition from one thread, no copies, no per-request Python.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_gpu import executor_for, resnet  # noqa: E402  (sets CUDA_DEVICE_MAX_CONNECTIONS first)

from workbench.timing.lanes import CudaLanes  # noqa: E402
from workbench.timing.nvml import NvmlSampler  # noqa: E402
from workbench.timing.serving import EngineManager, ServeConfig  # noqa: E402

NVML = NvmlSampler()
HI_CFG = dict(lanes=2, depth=2, max_batch=8, max_queue_delay_ms=0.5, queue_capacity=4096)
LO_CFG = dict(lanes=2, depth=2, max_batch=64, max_queue_delay_ms=2.0, queue_capacity=256)


def record_batches(server: Any, sink: list[tuple[float, ...]]) -> None:
    """Wrap the server's completion hook to log (first arrival, dispatch, h2d start, h2d end, compute end, d2h end)."""
    original = server._complete

    def complete(k: Any, error: Any) -> None:
        batch = server._inflight[k]
        if error is None:
            runtime = batch.runtime
            spans = runtime.lanes.spans_ms(*batch.key)
            host = [runtime.t0_host + s / 1e3 for s in spans]
            sink.append((min(r.arrival_s for r in batch.requests), batch.dispatch_s, *host, len(batch.requests)))
        original(k, error)

    server._complete = complete


def shrink_copies(lanes: Any) -> None:
    lanes._sizes_nbytes = {s: ([64 for _ in ins], outs) for s, (ins, outs) in lanes._sizes_nbytes.items()}


def chunk_copies(lanes: Any, chunk: int = 1 << 20) -> None:
    h2d = lanes._h2d

    def chunked(dst: int, src: int, nbytes: int, stream: Any) -> Any:
        offset = 0
        while offset < nbytes:
            n = min(chunk, nbytes - offset)
            h2d(int(dst) + offset, int(src) + offset, n, stream)
            offset += n

    lanes._h2d = chunked


def summarize(rows: list[tuple[float, ...]], t_from: float, t_to: float) -> dict[str, Any]:
    a = np.array([r for r in rows if t_from <= r[0] < t_to], dtype=float)
    if not len(a):
        return {"batches": 0}
    parts = {
        "queue": a[:, 1] - a[:, 0],
        "launch_lag": a[:, 2] - a[:, 1],
        "h2d": a[:, 3] - a[:, 2],
        "compute": a[:, 4] - a[:, 3],
        "d2h": a[:, 5] - a[:, 4],
        "first_request_latency": a[:, 5] - a[:, 0],
    }
    out: dict[str, Any] = {"batches": len(a)}
    for name, v in parts.items():
        out[name] = {"p50_ms": float(np.percentile(v, 50) * 1e3), "p99_ms": float(np.percentile(v, 99) * 1e3)}
    return out


def gpu_loop(lo_ex: Any, sms: int | None, stop: threading.Event, counter: list[int], batch: int = 64, prio: int = 0):
    lanes = CudaLanes(lo_ex, 2, 1, [batch], priorities=[prio, prio], sm_count=sms, sm_owner="lo-loop")

    def work() -> None:
        from cuda.core import Device

        Device().set_current()
        while not stop.is_set():
            for lane in range(2):
                lanes.bindings[lane].enqueue(batch, lanes.streams[lane])
            for lane in range(2):
                lanes.streams[lane].sync()
            counter[0] += 2 * batch

    thread = threading.Thread(target=work, daemon=True)
    return thread, lanes


def gpu_hog(kind: str, sms: int, stop: threading.Event, counter: list[int]) -> tuple[threading.Thread, Any]:
    """A synthetic low-priority load on an SM partition: ``bw`` copies 512 MiB tensors (memory-bound), ``mm`` runs
    4096^2 FP16 matmuls (compute-bound); captured as one CUDA graph on the partition's stream."""
    import torch

    from workbench.timing.green import SmPartition

    if sms:
        part = SmPartition(sms, 0, owner=f"hog-{kind}")
        green = part.create_stream(0)
        side = torch.cuda.ExternalStream(int(green.handle))
    else:  # the whole GPU at the lowest priority
        part, side = None, torch.cuda.Stream(priority=0)
        green = side
    if kind == "bw":
        a = torch.randn(256 << 20, device="cuda", dtype=torch.float16)
        b = torch.empty_like(a)

        def step() -> None:
            b.copy_(a)
    else:
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
        b = torch.empty_like(a)

        def step() -> None:
            torch.mm(a, a, out=b)

    warm = torch.cuda.Stream()
    with torch.cuda.stream(warm):
        step()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        for _ in range(8):
            step()
        graph.capture_end()
    torch.cuda.synchronize()

    def work() -> None:
        from cuda.core import Device

        Device().set_current()
        with torch.cuda.stream(side):
            while not stop.is_set():
                graph.replay()
                green.synchronize() if part is None else green.sync()
                counter[0] += 8

    thread = threading.Thread(target=work, daemon=True)

    class Closer:
        def close(self) -> None:
            if part is not None:
                green.close()
                part.close()

    return thread, Closer()


def pin_weights_in_l2(executor: Any) -> dict[str, Any]:
    """Pack the executor's weights into one buffer and reserve the GPU's persisting L2 for it (``hi_l2=1``).

    A batch-1 model re-reads all its weights on every request; next to a saturating model they are evicted from L2
    and each kernel waits on contended DRAM. An access-policy window marks the buffer as persisting in L2."""
    import torch
    from cuda.bindings import driver

    from workbench.timing.lanes import _check

    module = executor.module
    tensors = [t for t in [*module.parameters(), *module.buffers()] if t.is_cuda and t.numel()]
    sizes = [(t.numel() * t.element_size() + 255) // 256 * 256 for t in tensors]
    flat = torch.empty(sum(sizes), dtype=torch.uint8, device="cuda")
    offset = 0
    with torch.no_grad():
        for t, n in zip(tensors, sizes):
            nbytes = t.numel() * t.element_size()
            view = flat[offset : offset + nbytes].view(t.dtype).as_strided(t.size(), t.stride())
            view.copy_(t)
            t.data = view
            offset += n
    torch.cuda.synchronize()
    device = _check(driver.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
    attr = driver.CUdevice_attribute
    info = {
        name: int(_check(driver.cuDeviceGetAttribute(getattr(attr, key), device), key))
        for name, key in (
            ("l2_bytes", "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
            ("max_persisting_bytes", "CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE"),
            ("max_window_bytes", "CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE"),
        )
    }
    _check(
        driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, info["max_persisting_bytes"]), "limit"
    )
    window = min(flat.numel(), info["max_window_bytes"])
    info.update(
        weights_bytes=int(flat.numel()),
        window_bytes=int(window),
        hit_ratio=min(1.0, info["max_persisting_bytes"] / window),
        base=int(flat.data_ptr()),
    )
    executor._l2_flat = flat  # keep the packed weights alive with the executor
    print(f"L2 persisting window: {info}", flush=True)
    return info


def set_access_window(graph: Any, info: dict[str, Any]) -> int:
    from cuda.bindings import driver

    from workbench.timing.graph_priority import set_kernel_attribute

    value = getattr(driver, "CUkernelNodeAttrValue", driver.CUlaunchAttributeValue)()
    window = value.accessPolicyWindow
    window.base_ptr = info["base"]
    window.num_bytes = info["window_bytes"]
    window.hitRatio = float(info["hit_ratio"])
    window.hitProp = driver.CUaccessProperty.CU_ACCESS_PROPERTY_PERSISTING
    window.missProp = driver.CUaccessProperty.CU_ACCESS_PROPERTY_STREAMING
    value.accessPolicyWindow = window
    return set_kernel_attribute(graph, driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, value)


def reset_l2() -> None:
    from cuda.bindings import driver

    driver.cuCtxResetPersistingL2Cache()
    driver.cuCtxSetLimit(driver.CUlimit.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 0)


def plain_instantiate(graph: Any, priority: int) -> Any:
    from cuda.bindings import driver

    graph = graph if isinstance(graph, driver.CUgraph) else driver.CUgraph(int(graph))
    status, graph_exec = driver.cuGraphInstantiate(graph, 0)
    assert int(status) == 0, status
    return graph_exec


def run(
    label,
    module_execs,
    lo_mode,
    lo_sms,
    seconds,
    with_hi=True,
    hi_sms=None,
    hi_lanes=2,
    lo_batch=64,
    hi_eager=0,
    lo_prio=0,
    plain=0,
    fresh=0,
    fresh_hi=0,
    fresh_lo=0,
    lo_tiny=0,
    hi_tiny=0,
    cl=0,
    lo_rate=13000,
    hi_l2=0,
):
    hi_ex, lo_ex, hi_eager_ex = module_execs
    restore = None
    if plain:  # the graphs instantiated the usual way (no kernel priorities)
        import workbench.timing.graph_priority as graph_priority

        restore = graph_priority.instantiate_at_priority
        graph_priority.instantiate_at_priority = plain_instantiate
    if fresh or fresh_hi or fresh_lo:  # executors whose graphs are captured for this run only
        module = resnet()
        hi_ex = executor_for(module) if fresh or fresh_hi else hi_ex
        lo_ex = executor_for(module) if fresh or fresh_lo else lo_ex
    if cl:  # both models channels-last (NHWC): no layout conversions around cuDNN's tensor-core kernels
        hi_ex, lo_ex = CHANNELS_LAST
    manager = EngineManager()
    rows: list[tuple[float, ...]] = []
    stop = threading.Event()
    loop = None
    counter = [0]
    result: dict[str, Any] = {"label": label}
    try:
        lo = None
        if lo_mode is not None and lo_mode.startswith("server"):
            lo = manager.add(
                "lo",
                lambda: lo_ex,
                "1",
                ServeConfig(
                    priority="high" if lo_prio < 0 else "low",
                    sm_count=lo_sms or None,
                    **dict(LO_CFG, max_batch=lo_batch),
                ),
                seed=2,
                owns_executor=False,
            )
            lanes = lo._active.lanes
            if lo_mode == "server, tiny copies" or lo_tiny:
                shrink_copies(lanes)
            elif lo_mode == "server, chunked copies":
                chunk_copies(lanes)
        elif lo_mode == "gpu loop":
            loop = gpu_loop(lo_ex, lo_sms or None, stop, counter, lo_batch, lo_prio)
        elif lo_mode in ("bw", "mm"):
            loop = gpu_hog(lo_mode, lo_sms, stop, counter)
        hi = None
        if with_hi:
            hi_cfg = dict(HI_CFG, lanes=hi_lanes, depth=2 if hi_lanes <= 2 else 1)
            executor = hi_eager_ex if hi_eager else hi_ex
            patched = None
            if hi_l2:  # a fresh executor whose packed weights persist in L2 (its graphs carry the window)
                import copy

                import workbench.timing.graph_priority as graph_priority
                from workbench.timing.torch_executor import TorchExecutor

                executor = TorchExecutor(
                    copy.deepcopy(MODULE[0]), (3, 224, 224), dtype="float16", channels_last=bool(cl), description="l2"
                )
                info = pin_weights_in_l2(executor)
                result["l2"] = info
                patched = graph_priority.instantiate_at_priority

                def with_window(graph: Any, priority: int) -> Any:
                    result["l2_nodes"] = set_access_window(graph, info)
                    return patched(graph, priority)

                graph_priority.instantiate_at_priority = with_window
            try:
                hi = manager.add(
                    "hi",
                    lambda: executor,
                    "1",
                    ServeConfig(priority="high", sm_count=hi_sms, **hi_cfg),
                    seed=1,
                    owns_executor=False,
                )
            finally:
                if patched is not None:
                    graph_priority.instantiate_at_priority = patched
            record_batches(hi, rows)
            if hi_tiny:  # what the high model's latency would be if its input copy never waited (upper bound)
                shrink_copies(hi._active.lanes)
        if loop is not None:
            loop[0].start()  # after the high model's graphs are captured
            time.sleep(0.2)
        warm = 0.3
        c0 = counter[0]
        t_loop0 = time.perf_counter()
        start_hi = hi.start_load(1000.0, seconds + warm, seed=11) if hi is not None else None
        start_lo = lo.start_load(float(lo_rate), seconds + warm, seed=11) if lo is not None else None
        time.sleep(warm + seconds / 2)
        result["nvml"] = NVML.sample(label)
        if hi is not None:
            hi.wait_load(timeout_s=seconds + 60)
        if lo is not None:
            lo.wait_load(timeout_s=seconds + 60)
        if hi is not None:
            hi_stats = hi.stats(since_s=start_hi + warm, until_s=start_hi + warm + seconds)
            result["hi_p99_ms"] = hi_stats.latency_ms["p99"]
            result["hi_p50_ms"] = hi_stats.latency_ms["p50"]
            result["hi_n"] = hi_stats.latency_n
            result["batches"] = summarize(rows, start_hi + warm, start_hi + warm + seconds)
        if lo is not None:
            lo_stats = lo.stats(since_s=start_lo + warm, until_s=start_lo + warm + seconds)
            result["lo_per_s"] = lo_stats.throughput_per_s
        if loop is not None:
            result["lo_per_s"] = (counter[0] - c0) / (time.perf_counter() - t_loop0)
    finally:
        if restore is not None:
            graph_priority.instantiate_at_priority = restore
        stop.set()
        if loop is not None:
            loop[0].join(timeout=10)
            loop[1].close()
        manager.close()
        if hi_l2:
            reset_l2()
    if not with_hi:
        print(f"{label:40s} lo {result['lo_per_s']:,.0f}/s", flush=True)
        return result
    b = result["batches"]
    parts = " ".join(
        f"{k} {b[k]['p50_ms']:.2f}/{b[k]['p99_ms']:.2f}" for k in ("queue", "launch_lag", "h2d", "compute", "d2h")
    )
    clocks = result.get("nvml") or {}
    print(
        f"[{clocks.get('sm_clock_mhz')} MHz {clocks.get('power_w')} W] "
        f"{label:40s} hi p50 {result['hi_p50_ms']:.2f} p99 {result['hi_p99_ms']:.2f} ms (n={result['hi_n']}) "
        f"lo {result.get('lo_per_s', float('nan')):,.0f}/s | p50/p99 ms: {parts}",
        flush=True,
    )
    return result


# mode|options: hi_sms, hi_lanes, hi_eager, lo_sms (0 = whole GPU), lo_batch, lo_prio, plain (no kernel priorities),
# hi_l2 (the high model's weights packed and persisting in L2)
DEFAULT_MODES = ";".join(
    [
        "alone|hi_lanes=4,cl=1",
        "lo alone|cl=1,lo_rate=20000",
        "server|lo_sms=72,hi_lanes=4,cl=1,lo_rate=20000",
        "server|lo_sms=64,hi_lanes=4,cl=1,lo_rate=20000",
        "server|lo_sms=56,hi_lanes=4,cl=1,lo_rate=20000",
        "server|lo_sms=48,hi_lanes=4,cl=1,lo_rate=20000",
    ]
)


CHANNELS_LAST: tuple[Any, Any] = (None, None)
MODULE: list[Any] = []


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="priority_probe.json")
    parser.add_argument("--lo-sms", type=int, default=72)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--modes", default=DEFAULT_MODES)
    args = parser.parse_args()
    module = resnet()
    MODULE.append(module)
    import copy

    from workbench.timing.torch_executor import TorchExecutor

    eager = TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", cuda_graph=False, description="eager")
    execs = (executor_for(module), executor_for(module), eager)
    if "cl=1" in args.modes:
        global CHANNELS_LAST
        CHANNELS_LAST = tuple(  # type: ignore[assignment]
            TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", channels_last=True, description="cl")
            for _ in range(2)
        )
    results = []
    for mode in args.modes.split(";"):
        name, _, opts = mode.strip().partition("|")
        kw = {k: int(v) for k, v in (o.split("=") for o in opts.split(",") if o)}
        lo_sms = kw.pop("lo_sms", args.lo_sms)
        if name == "lo alone":
            results.append(run(mode, execs, "server", lo_sms if "lo_sms" in opts else 0, args.seconds, False, **kw))
        else:
            results.append(run(mode, execs, None if name == "alone" else name, lo_sms, args.seconds, **kw))
        Path(args.out).write_text(json.dumps(results, indent=1))  # after every mode: a later crash keeps the rest
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
