"""Does a CUDA green context confine a PyTorch CUDA graph's kernels to its SMs? (H200 probe for issue 15.)

ResNet-50 FP16 batch 64, throughput of back-to-back launches: on the primary context, and on a green context of
N SMs with the graph captured (a) in the primary context, (b) with the green context current, (c) eager.
Confinement shows as throughput falling roughly with N/SMs. Prints a table, writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sms", default="32,66")
    args = parser.parse_args()
    import torch
    import torchvision
    from cuda.bindings import driver

    from workbench.timing.green import SmPartition

    torch.backends.cudnn.benchmark = True
    net = torchvision.models.resnet50().half().cuda().eval().to(memory_format=torch.channels_last)
    x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
    results: dict[str, float] = {}

    def rate(launch, stream_handle, n=30) -> float:
        ext = torch.cuda.ExternalStream(int(stream_handle)) if stream_handle else torch.cuda.current_stream()
        for _ in range(5):
            launch(ext)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            launch(ext)
        torch.cuda.synchronize()
        return 64 * n / (time.perf_counter() - t0)

    def capture(stream=None):
        g = torch.cuda.CUDAGraph()
        side = stream or torch.cuda.Stream()
        with torch.inference_mode():
            with torch.cuda.stream(side):
                for _ in range(3):
                    net(x)
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=side):
                net(x)
        return g

    def graph_launcher(g):
        exec_ = driver.CUgraphExec(int(g.raw_cuda_graph_exec()))

        def launch(ext):
            err = driver.cuGraphLaunch(exec_, ext.cuda_stream)[0]
            assert int(err) == 0, err

        return launch

    def eager(ext):
        with torch.inference_mode(), torch.cuda.stream(ext):
            net(x)

    g_primary = capture()
    results["primary, graph"] = rate(graph_launcher(g_primary), 0)
    results["primary, eager"] = rate(eager, 0)
    for sms in [int(s) for s in args.sms.split(",")]:
        part = SmPartition(sms)
        gs = part.create_stream(0)
        key = f"green {part.sm_count} SMs"
        results[f"{key}, graph captured in primary"] = rate(graph_launcher(g_primary), int(gs.handle))
        results[f"{key}, eager on green stream"] = rate(eager, int(gs.handle))
        try:
            ext = torch.cuda.ExternalStream(int(gs.handle))
            g_green = capture(ext)
            results[f"{key}, graph captured on green stream"] = rate(graph_launcher(g_green), int(gs.handle))
        except Exception as error:  # noqa: BLE001 - a probe: record what failed
            results[f"{key}, graph captured on green stream"] = float("nan")
            print("capture on green stream failed:", error)
        try:
            ctx = driver.cuCtxFromGreenCtx(part._context)[1]
            driver.cuCtxPushCurrent(ctx)
            try:
                g_cur = capture(torch.cuda.ExternalStream(int(gs.handle)))
            finally:
                driver.cuCtxPopCurrent()
            results[f"{key}, graph captured with green ctx current"] = rate(graph_launcher(g_cur), int(gs.handle))
        except Exception as error:  # noqa: BLE001
            results[f"{key}, graph captured with green ctx current"] = float("nan")
            print("capture with green ctx current failed:", error)
    try:
        from torch.cuda.green_contexts import GreenContext

        tctx = GreenContext.create(num_sms=66, device_id=0)
        tstream = tctx.Stream() if hasattr(tctx, "Stream") else None
        if tstream is not None:
            g_t = capture(tstream)
            results["torch GreenContext 66, graph captured on its stream"] = rate(
                graph_launcher(g_t), tstream.cuda_stream
            )
            results["torch GreenContext 66, eager on its stream"] = rate(eager, tstream.cuda_stream)
    except Exception as error:  # noqa: BLE001
        print("torch GreenContext failed:", repr(error))
    for k, v in results.items():
        print(f"{k:60s} {v:10,.0f} img/s")
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0), "img_per_s": results}, indent=1))
    return 0


def lanes_probe() -> None:
    """CudaLanes on a partition with the torch executor: does graph capture work there? (debugging aid)."""
    import copy
    import traceback

    import torchvision

    from workbench.timing.lanes import CudaLanes
    from workbench.timing.torch_executor import TorchExecutor

    module = torchvision.models.resnet50()
    for mode in ("global", "thread_local"):
        for sms in (None, 72):
            ex = TorchExecutor(copy.deepcopy(module), (3, 224, 224), dtype="float16", description="resnet50")
            ex.capture_error_mode = mode
            try:
                lanes = CudaLanes(ex, 2, 2, [1, 2, 4, 8, 16, 32, 64], sm_count=sms)
                granted = lanes.sm_count
                print(mode, sms, granted, "graph" if ex.cuda_graph_active else "eager", ex.fallback_reason, flush=True)
                lanes.close()
            except Exception:  # noqa: BLE001 - a probe: print what failed
                print(mode, sms, "FAILED", ex.fallback_reason, traceback.format_exc()[-1500:], flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--lanes"]:
        lanes_probe()
        raise SystemExit(0)
    raise SystemExit(main())
