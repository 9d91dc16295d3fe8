"""``workbench time MODEL``: time the async pipeline at several stream counts, with a synchronous baseline."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from workbench._args import bounded_float, bounded_int, int_list
from workbench.errors import WorkbenchError
from workbench.timing.factory import EXECUTORS, make_executor
from workbench.timing.limits import MAX_REQUEST_BATCH, MAX_STREAMS, MIN_STREAMS, STREAMS_EXPECTED

if TYPE_CHECKING:
    from workbench.timing.result import TimingResult


def register(subparsers: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "--streams",
        type=int_list(MIN_STREAMS, MAX_STREAMS),
        default=[1, 2, 4],
        help=f"lane counts to time ({STREAMS_EXPECTED}), e.g. 1,2,4",
    )
    p.add_argument("--batch", type=bounded_int(1, MAX_REQUEST_BATCH), default=1, help="samples per request")
    p.add_argument("--depth", type=bounded_int(1, 1024), default=2, help="requests in flight per lane")
    p.add_argument(
        "--load",
        choices=("closed", "open"),
        default="closed",
        help="closed loop (streams x depth outstanding) or open loop (Poisson arrivals, needs --rate)",
    )
    p.add_argument(
        "--rate", type=bounded_float(0.0, 1e9, low_inclusive=False), default=None, help="open loop: requests per second"
    )
    p.add_argument("--dynamic-batching", action="store_true", help="batch queued requests (open loop)")
    p.add_argument(
        "--max-batch", type=bounded_int(1, 2**16), default=None, help="dynamic batcher's largest batch (default 8)"
    )
    p.add_argument(
        "--max-delay-ms",
        type=bounded_float(0.0, 60_000.0),
        default=None,
        help="dynamic batcher's max queue delay (default 0.5)",
    )
    p.add_argument(
        "--timeout-ms",
        type=bounded_float(0.0, 3_600_000.0, low_inclusive=False),
        default=None,
        help="per-request timeout",
    )
    p.add_argument("--no-cuda-graph", action="store_true", help="torch/trt: run eager instead of CUDA graphs")
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
    p.add_argument("--warmup", type=bounded_float(0.0, 3600.0), default=0.2, help="seconds of warm-up, discarded")
    p.add_argument(
        "--window",
        type=bounded_float(0.0, 3600.0, low_inclusive=False),
        default=0.5,
        help="seconds per measurement window",
    )
    p.add_argument("--max-windows", type=bounded_int(1, 10_000), default=10)
    p.add_argument("--trace", default=None, metavar="PATH", help="write the best run's Chrome/Perfetto trace here")
    p.add_argument("-o", "--output", required=True, metavar="TIMING.json")
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from workbench._io import refuse_special_file, validate_outputs, write_json_atomic
    from workbench.timing.pipeline import RunConfig, run_pipeline
    from workbench.timing.sweep import grid_plan, run_sweep

    model_input = args.model if Path(args.model).exists() else None
    validate_outputs({"-o": args.output, "--trace": args.trace}, inputs=[model_input])
    refuse_special_file(args.model, expected="an .onnx file, a .engine file or a zoo name")
    _refuse_ignored_options(args)
    if args.max_batch is None:
        args.max_batch = 8
    if args.max_delay_ms is None:
        args.max_delay_ms = 0.5
    if args.executor == "trt":
        _check_engine_batch(args.model, max(args.batch, args.max_batch if args.dynamic_batching else 1))
    if args.batch < 1:
        raise WorkbenchError(f"--batch {args.batch} is not allowed.", expected="--batch >= 1")
    if args.load == "open" and not args.rate:
        raise WorkbenchError("--load open needs --rate.", expected="--rate REQUESTS_PER_SECOND > 0")
    if args.dynamic_batching and args.load != "open":
        raise WorkbenchError(
            "--dynamic-batching needs open-loop load (requests arriving independently).",
            expected="--load open --rate R --dynamic-batching",
        )
    if args.executor == "cpu":
        _guard_cpu_memory(args)
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
    base = RunConfig(
        batch=args.batch,
        depth=args.depth,
        warmup_s=args.warmup,
        window_s=args.window,
        max_windows=args.max_windows,
        timeout_ms=args.timeout_ms,
        stream_priorities=priorities,
        spin_wait=args.spin_wait,
        load=args.load,
        rate_per_s=args.rate,
        dynamic_batching=args.dynamic_batching,
        max_batch=args.max_batch,
        max_queue_delay_ms=args.max_delay_ms,
    )
    try:
        baseline = None
        if not args.no_baseline:  # one lane, one request at a time, no batcher
            sync = replace(base, load="sync", rate_per_s=None, dynamic_batching=False)
            baseline = run_pipeline(executor, sync, model=label)
            _print_row("sync baseline", baseline)
        sweep = run_sweep(
            executor,
            grid_plan(args.streams, [args.batch]),
            base,
            model=label,
            on_result=lambda result: _print_row(f"{result.streams} stream(s)", result),
        )
    finally:
        executor.close()
    runs = list(sweep.results)
    for skip in sweep.skipped:
        print(f"{skip.streams:>4d} stream(s): skipped, {skip.reason}")
    if not runs:
        raise WorkbenchError(
            "no stream count of --streams fits in device memory.", expected="fewer --streams or a smaller --batch"
        )
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
        "skipped": [skip.to_json() for skip in sweep.skipped],
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


def _refuse_ignored_options(args: argparse.Namespace) -> None:
    """Options that would be silently ignored with the others given: refuse them rather than mislead."""
    if args.rate is not None and args.load != "open":
        raise WorkbenchError(
            f"--rate {args.rate} applies only to open-loop load; with --load {args.load} it would be ignored.",
            expected="--load open --rate R, or no --rate",
        )
    if args.max_batch is not None and not args.dynamic_batching:
        raise WorkbenchError(
            f"--max-batch {args.max_batch} sizes the dynamic batcher, which is off.",
            expected="--load open --rate R --dynamic-batching --max-batch N, or no --max-batch",
        )
    if args.max_delay_ms is not None and not args.dynamic_batching:
        raise WorkbenchError(
            f"--max-delay-ms {args.max_delay_ms} is the dynamic batcher's queue delay, and the batcher is off.",
            expected="--load open --rate R --dynamic-batching --max-delay-ms D, or no --max-delay-ms",
        )
    if len(set(args.streams)) != len(args.streams):
        raise WorkbenchError(
            f"--streams {','.join(map(str, args.streams))} names a lane count twice.",
            expected="distinct lane counts, e.g. 1,2,4",
        )
    if args.executor == "cpu":
        for flag, given in (
            ("--priorities", bool(args.priorities)),
            ("--no-cuda-graph", args.no_cuda_graph),
            ("--spin-wait", args.spin_wait),
        ):
            if given:
                raise WorkbenchError(
                    f"{flag} sets CUDA streams, graphs or events; the cpu executor (ONNX Runtime on host threads) has none.",
                    expected=f"--executor torch or trt with {flag}, or no {flag}",
                )


def _print_row(label: str, r: TimingResult) -> None:
    """One configuration: throughput and p99 with their bootstrap 95% intervals (``[low, high]``) and n."""
    p50, p99 = r.latency_ms.get("p50", math.nan), r.latency_ms.get("p99", math.nan)
    t_low, t_high = r.throughput_ci_per_s
    p_low, p_high = r.latency_ci_ms.get("p99", (math.nan, math.nan))
    print(
        f"{label:>14s}: {r.throughput_per_s:9.1f} [{t_low:.1f}, {t_high:.1f}] samples/s  p50 {p50:7.3f} ms  "
        f"p99 {p99:7.3f} [{p_low:.3f}, {p_high:.3f}] ms (n={r.n_requests})  enqueue {r.enqueue_us_p50:6.1f} us  "
        f"busy {r.busy_fraction:.2f}"
    )


def _guard_cpu_memory(args: argparse.Namespace) -> None:
    """Refuse a batch whose buffers (inputs and activations, per lane) would not fit, before any allocation."""
    from workbench.model.resources import ensure_fits, format_bytes, per_sample_activation_bytes
    from workbench.timing.executors import parse_shape_overrides
    from workbench.zoo import resolve_model

    overrides = parse_shape_overrides(args.shape)
    path, _entry = resolve_model(args.model)
    if path.is_file():
        from workbench.model import load_onnx
        from workbench.model.resources import refuse_string_inputs

        refuse_string_inputs(load_onnx(path, check=False).inputs, what=str(path))
    per_sample = per_sample_activation_bytes(path, overrides)
    if not per_sample:
        return
    lanes = max(max(args.streams), 1)
    batch = max(args.batch, args.max_batch if args.dynamic_batching else 1)
    ensure_fits(
        per_sample * batch * lanes,
        what=f"--batch {args.batch} on {lanes} lane(s) ({format_bytes(per_sample)} of tensors per sample)",
        hint="lower --batch or --streams",
    )


def _check_engine_batch(engine: str, batch: int) -> None:
    """A batch above the engine profile's maximum is refused (read from the engine's .layers.json)."""
    from pathlib import Path

    from workbench.engine.build import layers_path_for
    from workbench.engine.records import read_layers_document

    layers = layers_path_for(engine)
    if not Path(engine).is_file() or not layers.is_file():
        return  # the executor reports the missing engine
    profiles = (read_layers_document(layers).get("build") or {}).get("profiles") or {}
    for name, levels in profiles.items():
        try:
            max_batch = int(levels[2][0])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if batch > max_batch:
            raise WorkbenchError(
                f"--batch {batch} is above the engine's profile maximum {max_batch} for input {name!r}.",
                expected=f"--batch between 1 and {max_batch}",
                hint="rebuild with a larger profile (`workbench build --shapes NAME:MIN,OPT,MAX`)",
            )
