"""``workbench time MODEL``: time the async pipeline at several stream counts, with a synchronous baseline."""

from __future__ import annotations

import argparse
import math
from typing import Any

from workbench.errors import WorkbenchError
from workbench.timing.factory import EXECUTORS, make_executor


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers (e.g. 1,2,4)")
    return values


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "time",
        help="time the async pipeline (streams, batching, CUDA graphs) with a synchronous baseline",
        description="Time MODEL through the async pipeline at each stream count, plus the synchronous "
        "single-stream loop as a baseline, and write the results as JSON.",
    )
    p.add_argument(
        "model", metavar="MODEL", help="ONNX path or zoo name (cpu), zoo/torchvision name (torch), .engine path (trt)"
    )
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="cpu",
        help="cpu: ONNX Runtime on worker threads; torch: PyTorch CUDA graphs; trt: TensorRT engine",
    )
    p.add_argument("--streams", type=_int_list, default=[1, 2, 4], help="lane counts to time, e.g. 1,2,4")
    p.add_argument("--batch", type=int, default=1, help="samples per request")
    p.add_argument("--depth", type=int, default=2, help="requests in flight per lane")
    p.add_argument(
        "--load",
        choices=("closed", "open"),
        default="closed",
        help="closed loop (streams x depth outstanding) or open loop (Poisson arrivals, needs --rate)",
    )
    p.add_argument("--rate", type=float, default=None, help="open loop: requests per second")
    p.add_argument("--dynamic-batching", action="store_true", help="batch queued requests (open loop)")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-delay-ms", type=float, default=0.5, help="dynamic batcher's max queue delay")
    p.add_argument("--timeout-ms", type=float, default=None, help="per-request timeout")
    p.add_argument("--no-cuda-graph", action="store_true", help="torch: run eager instead of CUDA graphs")
    p.add_argument(
        "--priorities",
        default=None,
        metavar="P,P,...",
        help="CUDA stream priority per lane, cycled; lower is higher priority (write --priorities=-1,0)",
    )
    p.add_argument("--spin-wait", action="store_true", help="busy-wait on completion events (faster wake-up)")
    p.add_argument("--no-baseline", action="store_true", help="skip the synchronous single-stream baseline")
    p.add_argument(
        "--shape",
        action="append",
        default=None,
        metavar="NAME:DxD",
        help="full input shape for symbolic dims (cpu), e.g. x:1x3x48x192; repeatable",
    )
    p.add_argument("--warmup", type=float, default=0.2, help="seconds of warm-up, discarded")
    p.add_argument("--window", type=float, default=0.5, help="seconds per measurement window")
    p.add_argument("--max-windows", type=int, default=10)
    p.add_argument("--trace", default=None, metavar="PATH", help="write the best run's Chrome/Perfetto trace here")
    p.add_argument("-o", "--output", required=True, metavar="TIMING.json")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from workbench._io import write_json_atomic
    from workbench.timing.pipeline import RunConfig, run_pipeline

    if args.batch < 1:
        raise WorkbenchError(f"--batch {args.batch} is not allowed.", expected="--batch >= 1")
    if args.load == "open" and not args.rate:
        raise WorkbenchError("--load open needs --rate.", expected="--rate REQUESTS_PER_SECOND > 0")
    if args.dynamic_batching and args.load != "open":
        raise WorkbenchError(
            "--dynamic-batching needs open-loop load (requests arriving independently).",
            expected="--load open --rate R --dynamic-batching",
        )
    executor, label = make_executor(
        args.model, args.executor, batch=args.batch, shapes=args.shape, cuda_graph=not args.no_cuda_graph
    )
    priorities = None
    if args.priorities:
        try:
            priorities = tuple(int(p) for p in args.priorities.split(","))
        except ValueError as error:
            raise WorkbenchError(
                f"--priorities {args.priorities!r} is not a list of integers.", expected="e.g. --priorities=-1,0"
            ) from error
    common = dict(
        batch=args.batch,
        depth=args.depth,
        warmup_s=args.warmup,
        window_s=args.window,
        max_windows=args.max_windows,
        timeout_ms=args.timeout_ms,
        stream_priorities=priorities,
        spin_wait=args.spin_wait,
    )
    runs = []
    try:
        baseline = None
        if not args.no_baseline:
            baseline = run_pipeline(executor, RunConfig(load="sync", **common), model=label)
            _print_row("sync baseline", baseline)
        for streams in args.streams:
            config = RunConfig(
                streams=streams,
                load=args.load,
                rate_per_s=args.rate,
                dynamic_batching=args.dynamic_batching,
                max_batch=args.max_batch,
                max_queue_delay_ms=args.max_delay_ms,
                **common,
            )
            result = run_pipeline(executor, config, model=label)
            _print_row(f"{streams} stream(s)", result)
            runs.append(result)
    finally:
        executor.close()
    best = max(runs, key=lambda r: r.throughput_per_s)
    doc: dict[str, Any] = {
        "executor": best.executor,
        "executor_label": best.executor_label,
        "model": label,
        "streams": list(args.streams),
        "batch": args.batch,
        "load": args.load,
        "best_streams": best.streams,
        "throughput_per_s": best.throughput_per_s,
        "latency_ms": {k: best.latency_ms[k] for k in ("p50", "p90", "p95", "p99")},
        "stages_ms": best.stages_ms,
        "busy_fraction": best.busy_fraction,
        "runs": [r.to_json() for r in runs],
        "baseline": baseline.to_json() if baseline is not None else None,
        "speedup_vs_baseline": (
            best.throughput_per_s / baseline.throughput_per_s
            if baseline is not None and baseline.throughput_per_s
            else None
        ),
    }
    if executor.device == "cpu":
        doc["note"] = "CPU executor: ONNX Runtime on host threads; no GPU, no copies; not TensorRT numbers"
    path = write_json_atomic(args.output, doc)
    print(f"wrote {path}")
    if args.trace:
        from workbench.timing.trace import export_trace

        print(f"wrote {export_trace(best, args.trace)} (open in ui.perfetto.dev)")
    return 0


def _print_row(label: str, r: Any) -> None:
    p50, p99 = r.latency_ms.get("p50", math.nan), r.latency_ms.get("p99", math.nan)
    print(
        f"{label:>14s}: {r.throughput_per_s:9.1f} samples/s  p50 {p50:7.3f} ms  p99 {p99:7.3f} ms  "
        f"enqueue {r.enqueue_us_p50:6.1f} us  busy {r.busy_fraction:.2f}"
    )
