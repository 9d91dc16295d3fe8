"""H200 benchmark of serving (issue 15). Run ON the GPU machine; prints a table, writes JSON (and .md).

    python3 bench/serving_gpu.py --out $OUT/serving_h200.json [--quick] [--sections ceiling,sla,priority,reload,layers]
    python3 bench/serving_gpu.py --render RUN.json [RUN2.json ...]   # markdown tables (no GPU needed)

One process, ResNet-50 FP16 (torchvision, random weights), PyTorch CUDA-graph executor (one graph per lane and
batch bucket), pinned copies both ways on every batch, open-loop Poisson arrivals of single-image requests:

  * ceiling: back-to-back batch-256 graph launches on one stream (no copies), and the closed-loop pipeline at
    batch 256 on 2 lanes (copies included); the larger is "the batch-256 ceiling";
  * sla: p99-budget searches over lanes x max batch x max queue delay: coordinate ascent at 10 ms and 25 ms, and the
    exhaustive grid at 10 ms to check the coordinate search against (rate found, runs used);
  * priority: a high-priority model at a fixed rate alone, then next to a low-priority model offered far more than
    it can serve (admission control refuses the excess); stream priorities only, plus host-side dispatch gating, plus
    an equal-priority control;
  * reload: hot reload of a new version (same weights, fresh executor) under a steady load at 80 % of the 10 ms
    sustainable rate, then a broken version (perturbed weights) that must be rejected while serving continues;
  * layers: per-layer CUDA kernel time of ResNet-50 at batch 1 and 32 from torch.profiler, mapped to the node names
    of the model exported to ONNX.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import io
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.timing.lanes import request_hardware_queues  # noqa: E402

request_hardware_queues()  # before anything touches CUDA

from workbench.timing import RunConfig, measure_compute_limit, run_pipeline  # noqa: E402
from workbench.timing.layer_profile import torch_layer_profile  # noqa: E402
from workbench.timing.serving import (  # noqa: E402
    EngineManager,
    ModelServer,
    ServeConfig,
    sla_search,
)
from workbench.timing.serving.search import ServingProbe  # noqa: E402
from workbench.timing.torch_executor import TorchExecutor, torch_module_for  # noqa: E402

SHAPE = (3, 224, 224)


def log(line: str) -> None:
    print(line, flush=True)


def resnet() -> Any:
    module, _shape, _desc = torch_module_for("resnet50")
    return module.eval()


def executor_for(module: Any) -> TorchExecutor:
    return TorchExecutor(copy.deepcopy(module), SHAPE, dtype="float16", description="resnet50 (torchvision, random)")


def section_ceiling(module: Any, quick: bool) -> dict[str, Any]:
    import torch

    ex = executor_for(module)
    limit = measure_compute_limit(ex, 256, iterations=10 if quick else 30, warmup=3)
    window = dict(warmup_s=0.3, window_s=0.5, min_windows=3, max_windows=4 if quick else 6)
    piped = run_pipeline(ex, RunConfig(streams=2, batch=256, depth=2, **window), model="resnet50")
    out = {
        "gpu_limit_b256": limit,
        "pipeline_b256_2lanes": {
            "throughput_per_s": piped.throughput_per_s,
            "p99_ms": piped.latency_ms["p99"],
            "n_requests": piped.n_requests,
            "stable": piped.stable,
        },
    }
    out["ceiling_per_s"] = max(limit["throughput_per_s"], piped.throughput_per_s)
    log(
        f"ceiling: one-stream b256 {limit['throughput_per_s']:,.0f} img/s ({limit['iterations']} launches), "
        f"pipeline b256 x2 lanes {piped.throughput_per_s:,.0f} img/s (n={piped.n_requests} batches)"
    )
    del ex
    torch.cuda.empty_cache()
    return out


def make_probe(executor: TorchExecutor, budget_ms: float, quick: bool) -> ServingProbe:
    return ServingProbe(
        lambda c: ModelServer("resnet50", lambda: executor, "1", c, owns_executor=False),
        budget_ms,
        duration_s=0.3 if quick else 0.4,
        warmup_s=0.15,
        min_requests=600,
    )


def print_probe(result: Any) -> None:
    c = result.config
    best = result.best
    log(
        f"  L={c.lanes} B={c.max_batch:3d} D={c.max_queue_delay_ms:g}ms: best {result.best_rate_per_s:8,.0f} req/s "
        f"({len(result.probes)} probes"
        + (
            f"; p99 {best.p99_ms:.2f} ms n={best.n_requests}, mean batch {best.mean_batch:.1f}, "
            f"padding {best.padding_fraction:.1%})"
            if best
            else ")"
        )
    )


def section_sla(module: Any, quick: bool, doc: dict[str, Any]) -> dict[str, Any]:
    executor = executor_for(module)
    if quick:
        space10 = {"lanes": (1, 2), "max_batch": (16, 64), "max_queue_delay_ms": (0, 2)}
        space25 = space10
    else:
        space10 = {"lanes": (1, 2, 4), "max_batch": (16, 32, 64, 128), "max_queue_delay_ms": (0, 1, 2, 4)}
        space25 = {"lanes": (1, 2, 4), "max_batch": (32, 64, 128, 256), "max_queue_delay_ms": (0, 2, 5, 10)}
    # Capture every lane's graphs for every bucket once (the searches' servers reuse them).
    for space in (space10, space25):
        warm = ModelServer(
            "resnet50",
            lambda: executor,
            "1",
            ServeConfig(lanes=max(space["lanes"]), max_batch=max(space["max_batch"])),
            owns_executor=False,
        )
        warm.close()
    out: dict[str, Any] = {}
    for budget, space, strategies in ((10.0, space10, ("coordinate", "grid")), (25.0, space25, ("coordinate",))):
        for strategy in strategies:
            probe = make_probe(executor, budget, quick)
            t0 = time.perf_counter()
            log(f"SLA search p99 <= {budget:g} ms, {strategy}:")
            try:
                result = sla_search(
                    probe,
                    budget,
                    space,
                    base=ServeConfig(depth=2, queue_capacity=4096),
                    strategy=strategy,
                    start_rate=lambda c, probe=probe: 0.6 * probe.capacity_estimate(c),
                    max_probes=6,
                    rel_tol=0.05,
                    model="resnet50",
                    progress=print_probe,
                )
            finally:
                probe.close()
            key = f"sla_{budget:g}ms_{strategy}"
            out[key] = result.to_json()
            out[key + "_seconds"] = time.perf_counter() - t0
            chosen = result.chosen
            log(
                f"=> {strategy} {budget:g} ms: {result.best_rate_per_s:,.0f} req/s at "
                f"{chosen.config.label() if chosen else '-'}; {result.configurations}/{result.grid_size} "
                f"configurations, {result.runs} runs, {out[key + '_seconds']:.0f} s"
            )
            doc["sections"]["sla"] = out
            write(doc)
    return out


def section_priority(
    module: Any, quick: bool, hi_rate: float, partitions: tuple[int, ...] = (), only_partitions: bool = False
) -> dict[str, Any]:
    seconds = 1.0 if quick else 2.0
    hi_ex, lo_ex = executor_for(module), executor_for(module)
    # 4 lanes of depth 1: a batch never waits behind the model's own previous batch on a stream (p99 2.08 ms alone
    # vs 2.37 with 2 lanes x depth 2, bench/priority_probe.py); the same config alone and contended.
    hi_cfg = dict(lanes=4, depth=1, max_batch=8, max_queue_delay_ms=0.5, queue_capacity=4096)
    lo_cfg = dict(lanes=2, depth=2, max_batch=64, max_queue_delay_ms=2.0, queue_capacity=256)
    lo_rate = 13000.0  # above what ResNet-50 serves (~10k/s at batch 64): admission control refuses the excess
    out: dict[str, Any] = {
        "hi_rate_per_s": hi_rate,
        "lo_offered_per_s": lo_rate,
        "seconds": seconds,
        "hi_config": hi_cfg,
        "lo_config": lo_cfg,
    }

    def run(
        label: str,
        hi_priority: str,
        lo_priority: str,
        gate: int | None,
        with_hi: bool,
        with_lo: bool,
        lo_sms: int | None = None,
        hi_sms: int | None = None,
    ) -> None:
        manager = EngineManager(contended_inflight=gate)
        try:
            servers = {}
            models = {"hi": (hi_ex, hi_priority, hi_cfg, 1), "lo": (lo_ex, lo_priority, lo_cfg, 2)}

            def add(name: str, sms: int | None) -> None:
                executor, priority, cfg, seed = models[name]
                servers[name] = manager.add(
                    name,
                    lambda: executor,
                    "1",
                    ServeConfig(priority=priority, sm_count=sms, **cfg),
                    seed=seed,
                    owns_executor=False,
                )

            if with_hi and hi_sms is None:
                add("hi", None)
            if with_lo:
                add("lo", lo_sms)
            if with_hi and hi_sms is not None:  # the rest of the GPU: what the low partition was granted leaves
                lanes = servers["lo"]._active.lanes
                add("hi", min(hi_sms, lanes.partition.device_sm_count - lanes.sm_count))
            warm = 0.3
            starts = {}
            for name, server in servers.items():
                starts[name] = server.start_load(hi_rate if name == "hi" else lo_rate, seconds + warm, seed=11)
            for server in servers.values():
                server.wait_load(timeout_s=seconds + 60)
            result: dict[str, Any] = {}
            if with_lo and lo_sms is not None:
                result["lo_sms_granted"] = servers["lo"]._active.lanes.sm_count
            if with_hi and hi_sms is not None:
                result["hi_sms_granted"] = servers["hi"]._active.lanes.sm_count
            for name, server in servers.items():
                s = server.stats(since_s=starts[name] + warm, until_s=starts[name] + warm + seconds)
                result[name] = s.to_json()
                log(f"  {label:28s} {s.summary()}")
            out[label] = result
        finally:
            manager.close()

    run("hi alone", "high", "low", None, True, False)
    run("lo alone", "high", "low", None, False, True)
    compared = []
    if not only_partitions:
        run("both, stream priorities", "high", "low", None, True, True)
        run("both, priorities + gate 1", "high", "low", 1, True, True)
        run("both, equal priority", "normal", "normal", None, True, True)
        compared += ["both, stream priorities", "both, priorities + gate 1", "both, equal priority"]
    for sms in partitions:  # the low-priority model confined to a green context of `sms` SMs
        label = f"both, priorities, low on {sms} SMs"
        run(label, "high", "low", None, True, True, lo_sms=sms)
        compared.append(label)
        import torch

        total = torch.cuda.get_device_properties(0).multi_processor_count
        rest = total - sms  # the high model asks for what the low partition leaves (granted: all of it)
        if rest >= 8:
            label = f"both, low on {sms} SMs, high on {rest}"
            run(label, "high", "low", None, True, True, lo_sms=sms, hi_sms=rest)
            compared.append(label)
    hi_alone = out["hi alone"]["hi"]["latency_ms"]["p99"]
    lo_alone = out["lo alone"]["lo"]["throughput_per_s"]
    for label in compared:
        hi = out[label]["hi"]["latency_ms"]["p99"]
        lo = out[label]["lo"]["throughput_per_s"]
        out[label]["verdict"] = {
            "hi_p99_over_alone": hi / hi_alone,
            "lo_throughput_over_alone": lo / lo_alone,
            "target_hi_p99_1.25x": hi <= 1.25 * hi_alone,
            "target_lo_0.6x": lo >= 0.6 * lo_alone,
        }
        log(f"  => {label}: hi p99 {hi / hi_alone:.2f}x alone, lo throughput {lo / lo_alone:.2f}x alone")
    return out


def section_reload(module: Any, quick: bool, rate: float, config: ServeConfig) -> dict[str, Any]:
    import torch

    broken = copy.deepcopy(module)
    with torch.no_grad():
        broken.fc.weight.mul_(1.5)  # loads and runs, answers differently
        broken.fc.bias.add_(1.0)
    server = ModelServer("resnet50", lambda: executor_for(module), "v1", config, seed=3)
    total = 6.0 if quick else 13.0  # long enough for both reloads (each ~3.5 s with 4 lanes) to happen under load
    start = server.start_load(rate, total, seed=21)
    time.sleep(1.5 if quick else 2.5)
    good = server.reload(lambda: executor_for(module), "v2", rtol=2e-2, atol=2e-2)
    time.sleep(0.5 if quick else 1.0)
    bad = server.reload(lambda: executor_for(broken), "v3-broken", rtol=2e-2, atol=2e-2)
    server.wait_load(timeout_s=total + 60)
    arrivals, latencies, versions = server.responses_log()
    whole = server.stats(since_s=start + 0.3, until_s=start + total)
    steady = server.stats(since_s=start + 0.3, until_s=good.started_s)
    swap_end = max(good.swapped_s, good.drained_s if math.isfinite(good.drained_s) else good.swapped_s)
    during = server.stats(since_s=good.started_s, until_s=swap_end)
    bad_end = bad.started_s + (bad.load_s if math.isfinite(bad.load_s) else 0.0)
    bad_end += bad.check_s if math.isfinite(bad.check_s) else 0.0
    during_bad = server.stats(since_s=bad.started_s, until_s=bad_end)
    after = server.stats(since_s=swap_end, until_s=bad.started_s)
    phase_p99 = {}
    marks = [("started", good.started_s)] + sorted(good.phases.items(), key=lambda kv: kv[1])
    marks = [m for m in marks if m[1] <= swap_end + 1e-9] + [("swap_end", swap_end)]
    for (a, ta), (b, tb) in zip(marks, marks[1:]):
        if tb > ta:
            s_ = server.stats(since_s=ta, until_s=tb)
            phase_p99[f"{a} -> {b}"] = {
                "seconds": tb - ta,
                "p99_ms": s_.latency_ms["p99"],
                "n": s_.latency_n,
            }
    server.close()
    out = {
        "rate_per_s": rate,
        "config": config.to_json(),
        "good": good.to_json(),
        "bad": bad.to_json(),
        "whole": whole.to_json(),
        "steady": steady.to_json(),
        "during_swap": during.to_json(),
        "during_rejected_load": during_bad.to_json(),
        "after_swap": after.to_json(),
        "phase_p99": phase_p99,
        "phases_rel_s": {k: v - good.started_s for k, v in good.phases.items()},
        "timeline": {
            "t0_s": start,
            "arrival_s": [round(a - start, 5) for a in arrivals[::5].tolist()],
            "latency_ms": [round(v, 3) for v in latencies[::5].tolist()],
            "version": versions[::5],
            "note": "every 5th completed request",
        },
    }
    ratio = during.latency_ms["p99"] / steady.latency_ms["p99"]
    out["verdict"] = {
        "failed_or_refused": whole.refused + whole.failed + whole.expired,
        "responses_by_version": whole.responses_by_version,
        "rejected_version_responses": whole.responses_by_version.get("v3-broken", 0),
        "p99_swap_over_steady": ratio,
        "target_p99_2x": ratio <= 2.0,
        "broken_rejected": not bad.accepted,
    }
    log(f"  steady      {steady.summary()}")
    log(f"  during swap {during.summary()} (window {during.window_s:.2f} s)")
    log(f"  rejected    {during_bad.summary()}")
    log(f"  whole run   {whole.summary()}")
    log(
        f"  good reload: load {good.load_s:.2f} s, check {good.check_s * 1e3:.1f} ms, max abs err {good.max_abs_error:.3g}"
    )
    log(f"  bad reload: accepted={bad.accepted} stage={bad.stage}: {bad.reason}")
    for name, value in phase_p99.items():
        log(f"    {name:32s} {value['seconds']:.3f} s  p99 {value['p99_ms']:.2f} ms (n={value['n']})")
    return out


def section_layers(module: Any, quick: bool) -> dict[str, Any]:
    import onnx
    import torch

    buffer = io.BytesIO()
    torch.onnx.export(
        copy.deepcopy(module).float().cpu(),
        (torch.randn(1, *SHAPE),),
        buffer,
        dynamo=False,
        opset_version=17,
        input_names=["input"],
        output_names=["output"],
    )
    proto = onnx.load_from_string(buffer.getvalue())
    gpu_module = copy.deepcopy(module).cuda().half()
    out: dict[str, Any] = {"onnx_nodes": len(proto.graph.node)}
    for batch in (1, 32):
        x = torch.randn(batch, *SHAPE, device="cuda", dtype=torch.float16)
        profile = torch_layer_profile(gpu_module, x, onnx_model=proto, iterations=10 if quick else 30, model="resnet50")
        mapped = sum(layer.time_ms for layer in profile.layers if layer.onnx_nodes)
        out[f"batch{batch}"] = profile.to_json()
        out[f"batch{batch}_mapped_fraction"] = mapped / profile.total_ms if profile.total_ms else math.nan
        log(
            f"layers b{batch}: {profile.total_ms:.3f} ms kernel time per forward, {len(profile.layers)} modules, "
            f"{mapped / profile.total_ms:.1%} of it on ONNX nodes, unmapped ONNX nodes {len(profile.unmapped_onnx_nodes)}"
        )
        for layer in profile.top(5):
            log(f"    {layer.name:28s} {layer.time_ms:7.3f} ms  {layer.share:5.1%}  {','.join(layer.onnx_nodes)[:60]}")
    return out


DOC_PATH: Path | None = None


def write(doc: dict[str, Any]) -> None:
    assert DOC_PATH is not None
    DOC_PATH.write_text(json.dumps(doc, indent=1, default=float))


def main() -> int:
    global DOC_PATH
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "serving_h200.json"))
    parser.add_argument("--quick", action="store_true", help="small spaces, short runs (smoke test)")
    parser.add_argument("--sections", default="ceiling,sla,priority,reload,layers")
    parser.add_argument(
        "--reload-from",
        help="results JSON of an earlier run on the same GPU: the reload section takes the configuration chosen by "
        "its 10 ms SLA search and 80 %% of that rate (when this run has no sla section)",
    )
    parser.add_argument(
        "--partitions",
        default="66,88,100,112",
        help="SM counts for the low-priority model's green context in the priority section (comma list; empty: none)",
    )
    parser.add_argument(
        "--only-partitions", action="store_true", help="priority section: skip the runs without SM partitions"
    )
    args = parser.parse_args()
    DOC_PATH = Path(args.out)
    import torch

    env = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "precision": "fp16",
        "model": "resnet50 (torchvision, random weights)",
        "load": "open loop, Poisson arrivals, 1 image per request",
        "transfers": "pinned H2D + D2H on every batch",
        "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "quick": args.quick,
    }
    log(json.dumps(env))
    doc: dict[str, Any] = {"environment": env, "sections": {}, "errors": {}}
    module = resnet()
    sections = args.sections.split(",")
    t_start = time.perf_counter()

    def guarded(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            value = fn()
            doc["sections"][name] = value
            return value
        except Exception as error:
            doc["errors"][name] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
            log(f"SECTION {name} FAILED: {doc['errors'][name]}")
            return None
        finally:
            doc.setdefault("seconds", {})[name] = time.perf_counter() - t0
            write(doc)

    ceiling = guarded("ceiling", lambda: section_ceiling(module, args.quick)) if "ceiling" in sections else None
    sla = guarded("sla", lambda: section_sla(module, args.quick, doc)) if "sla" in sections else None
    chosen10 = None
    if sla and sla.get("sla_10ms_coordinate", {}).get("chosen"):
        chosen10 = sla["sla_10ms_coordinate"]["chosen"]
    elif args.reload_from:
        earlier = json.loads(Path(args.reload_from).read_text())
        chosen10 = earlier["sections"]["sla"]["sla_10ms_coordinate"]["chosen"]
        doc["environment"]["reload_config_from"] = f"{args.reload_from} ({earlier['environment']['date_utc']})"
    if "priority" in sections:
        partitions = tuple(int(x) for x in args.partitions.split(",") if x)
        guarded(
            "priority",
            lambda: section_priority(
                module, args.quick, hi_rate=1000.0, partitions=partitions, only_partitions=args.only_partitions
            ),
        )
    if "reload" in sections:
        if chosen10:
            config = ServeConfig.from_json(chosen10["config"])
            rate = 0.8 * chosen10["best_rate_per_s"]
        else:
            config = ServeConfig(lanes=2, max_batch=32, max_queue_delay_ms=2.0, queue_capacity=4096)
            rate = 3000.0
        guarded("reload", lambda: section_reload(module, args.quick, rate, config))
    if "layers" in sections:
        guarded("layers", lambda: section_layers(module, args.quick))
    verdicts: dict[str, Any] = {}
    if ceiling and sla:
        c = ceiling["ceiling_per_s"]
        for key, factor in (("sla_10ms_coordinate", 0.6), ("sla_10ms_grid", 0.6), ("sla_25ms_coordinate", 0.8)):
            if key in sla:
                best = (sla[key].get("chosen") or {}).get("best_rate_per_s", 0.0)
                verdicts[key] = {"rate_per_s": best, "over_ceiling": best / c, f"target_{factor}x": best >= factor * c}
        if "sla_10ms_grid" in sla and "sla_10ms_coordinate" in sla:
            g, q = sla["sla_10ms_grid"], sla["sla_10ms_coordinate"]
            g_best = (g.get("chosen") or {}).get("best_rate_per_s", 0.0)
            q_best = (q.get("chosen") or {}).get("best_rate_per_s", 0.0)
            verdicts["coordinate_vs_grid_10ms"] = {
                "rate_fraction": q_best / g_best if g_best else math.nan,
                "runs_fraction": q["runs"] / g["runs"],
                "configurations": [q["configurations"], g["configurations"]],
                "target_95pct_rate_25pct_runs": bool(
                    g_best and q_best >= 0.95 * g_best and q["runs"] <= 0.25 * g["runs"]
                ),
            }
    doc["verdicts"] = verdicts
    doc["total_seconds"] = time.perf_counter() - t_start
    write(doc)
    log("VERDICTS " + json.dumps(verdicts, indent=1, default=float))
    log(f"total {doc['total_seconds']:.0f} s; errors: {list(doc['errors'])}")
    return 0


def render_markdown(docs: list[dict[str, Any]], names: list[str]) -> str:
    """Tables of one or more runs (each run's ratios are computed within that run)."""
    lines: list[str] = []

    def _n(value: Any) -> float:  # JSON null (a NaN when written) back to NaN for formatting
        return math.nan if value is None else value

    for doc, name in zip(docs, names):
        env, sections = doc["environment"], doc["sections"]
        lines += [f"## Run `{name}` ({env['date_utc']}, {env['gpu']}, torch {env['torch']})", ""]
        ceiling = sections.get("ceiling")
        if ceiling:
            lim, pipe = ceiling["gpu_limit_b256"], ceiling["pipeline_b256_2lanes"]
            lines += [
                f"Batch-256 ceiling: {lim['throughput_per_s']:,.0f} img/s one stream without copies "
                f"({lim['iterations']} launches); {pipe['throughput_per_s']:,.0f} img/s pipeline with copies, 2 lanes "
                f"({pipe['n_requests']} batches). Ceiling used: {ceiling['ceiling_per_s']:,.0f} img/s.",
                "",
            ]
        sla = sections.get("sla") or {}
        rows = [k for k in sla if not k.endswith("_seconds")]
        if rows:
            lines += [
                "| search | best rate (req/s) | x ceiling | chosen lanes / max batch / delay | p99 at best (ms, 95 % CI, n) "
                "| mean batch | padding | configurations | runs | seconds |",
                "|---|---:|---:|---|---|---:|---:|---:|---:|---:|",
            ]
            for key in rows:
                r = sla[key]
                ch = r.get("chosen") or {}
                best = ch.get("best") or {}
                c = ch.get("config") or {}
                ci = best.get("p99_ci_ms") or [math.nan, math.nan]
                ratio = ch.get("best_rate_per_s", 0.0) / ceiling["ceiling_per_s"] if ceiling else math.nan
                lines.append(
                    f"| {r['strategy']}, p99 <= {r['budget_ms']:g} ms | {ch.get('best_rate_per_s', 0):,.0f} | "
                    f"{_n(ratio):.2f} | {c.get('lanes')} / {c.get('max_batch')} / {c.get('max_queue_delay_ms')} ms | "
                    f"{_n(best.get('p99_ms', math.nan)):.2f} ({_n(ci[0]):.2f}-{_n(ci[1]):.2f}, n={best.get('n_requests')}) | "
                    f"{_n(best.get('mean_batch', math.nan)):.1f} | {_n(best.get('padding_fraction', math.nan)):.1%} | "
                    f"{r['configurations']}/{r['grid_size']} | {r['runs']} | {_n(sla.get(key + '_seconds', math.nan)):.0f} |"
                )
            lines.append("")
        prio = sections.get("priority")
        if prio:
            # runs before 2026-12-04 17:00 did not record their configs: these were the values then
            hi_cfg = prio.get("hi_config") or {"lanes": 2, "depth": 2, "max_batch": 8}
            lo_cfg = prio.get("lo_config") or {"lanes": 2, "depth": 2, "max_batch": 64, "queue_capacity": 256}
            lines += [
                f"Priorities: high-priority model offered {prio['hi_rate_per_s']:,.0f} req/s ({_cfg(hi_cfg)}), "
                f"low-priority model offered {prio['lo_offered_per_s']:,.0f} req/s ({_cfg(lo_cfg)}); "
                f"{prio['seconds']:g} s measured each.",
                "",
                "| run | high: p99 ms (95 % CI, n) | high: x alone | low: req/s | low: x alone | low refused |",
                "|---|---|---:|---:|---:|---:|",
            ]
            for label, value in prio.items():
                if not isinstance(value, dict):
                    continue
                hi, lo, v = value.get("hi"), value.get("lo"), value.get("verdict", {})
                hi_cell = (
                    f"{_n(hi['latency_ms']['p99']):.2f} ({_n(hi['latency_ci_ms']['p99'][0]):.2f}-"
                    f"{_n(hi['latency_ci_ms']['p99'][1]):.2f}, n={hi['latency_n']})"
                    if hi
                    else ""
                )
                if value.get("lo_sms_granted"):
                    granted = f"low {value['lo_sms_granted']}" + (
                        f", high {value['hi_sms_granted']}" if value.get("hi_sms_granted") else ""
                    )
                    label = f"{label} (granted: {granted} SMs)"
                lines.append(
                    f"| {label} | {hi_cell} | {_n(v.get('hi_p99_over_alone', math.nan)):.2f} | "
                    f"{lo['throughput_per_s'] if lo else math.nan:,.0f} | {_n(v.get('lo_throughput_over_alone', math.nan)):.2f} | "
                    f"{lo['refused'] if lo else ''} |"
                )
            lines.append("")
        reload = sections.get("reload")
        if reload:
            c = reload["config"]
            v = reload["verdict"]
            lines += [
                f"Hot reload: {c['lanes']} lanes, max batch {c['max_batch']}, delay {c['max_queue_delay_ms']} ms, "
                f"open loop at {reload['rate_per_s']:,.0f} req/s (0.8 x the 10 ms sustainable rate). "
                f"Failed + refused + expired: {v['failed_or_refused']}; responses by version "
                f"{v['responses_by_version']}; broken version rejected: {v['broken_rejected']} "
                f"({reload['bad']['reason'][:90]}...).",
                "",
                "| window | seconds | p99 ms (95 % CI) | n |",
                "|---|---:|---|---:|",
            ]
            for label in ("steady", "during_swap", "after_swap", "during_rejected_load"):
                s = reload[label]
                ci = s["latency_ci_ms"]["p99"]
                lines.append(
                    f"| {label.replace('_', ' ')} | {_n(s['window_s']):.2f} | {_n(s['latency_ms']['p99']):.2f} "
                    f"({_n(ci[0]):.2f}-{_n(ci[1]):.2f}) | {s['latency_n']} |"
                )
            for label, value in reload.get("phase_p99", {}).items():
                lines.append(
                    f"| reload phase {label} | {_n(value['seconds']):.3f} | {_n(value['p99_ms']):.2f} | {value['n']} |"
                )
            lines += ["", f"p99 during swap / steady: {_n(v['p99_swap_over_steady']):.2f} (target <= 2).", ""]
        layers = sections.get("layers")
        if layers:
            for batch in (1, 32):
                p = layers[f"batch{batch}"]
                lines += [
                    f"Per-layer CUDA kernel time, batch {batch}: {_n(p['total_ms']):.3f} ms per forward (eager, "
                    f"{p['iterations']} forwards), {layers[f'batch{batch}_mapped_fraction']:.0%} on ONNX nodes of "
                    f"the exported model ({layers['onnx_nodes']} nodes; {len(p['unmapped_onnx_nodes'])} unscoped "
                    "Identity nodes). Top 5:",
                    "",
                    "| module | ms | share | ONNX node | folded in |",
                    "|---|---:|---:|---|---|",
                ]
                top = sorted(p["layers"], key=lambda layer: layer["time_ms"], reverse=True)[:5]
                for layer in top:
                    lines.append(
                        f"| {layer['name']} | {_n(layer['time_ms']):.3f} | {_n(layer['share']):.1%} | "
                        f"{', '.join(layer['onnx_nodes'])} | {', '.join(layer['folded'])} |"
                    )
                lines.append("")
    return "\n".join(lines)


def _cfg(config: dict[str, Any]) -> str:
    text = f"{config['lanes']} lanes x depth {config.get('depth', 2)}, max batch {config['max_batch']}"
    return text + (f", queue {config['queue_capacity']}" if config.get("queue_capacity", 0) < 1000 else "")


def _render_cli() -> int:
    paths = sys.argv[2:]
    docs = [json.loads(Path(p).read_text()) for p in paths]
    print(render_markdown(docs, [Path(p).stem for p in paths]))
    return 0


if __name__ == "__main__":
    sys.exit(_render_cli() if sys.argv[1:2] == ["--render"] else main())
