"""The bottleneck diagnosis: one verdict per topic, each citing numbers measured in the run."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from workbench.artifact import Artifact
from workbench.calib.diff import LayerDiff, TensorDiff
from workbench.engine import EngineArtifact
from workbench.flow.artifacts import LayerDiffStage, Metrics, QuickstartRun, Timing
from workbench.flow.mixed import MixedSearch
from workbench.flow.rule import Choice, judge, next_steps
from workbench.precision.variant import COST_ORDER, VARIANTS, Variant

BUSY_ENOUGH = 0.8  # a device this busy with one stream has little left for a second
STREAMS_HELP_RATIO = 1.15  # a configuration "helps" when it gives at least 15 % more throughput


@dataclass(frozen=True)
class Verdict(Artifact):
    """One line of the bottleneck diagnosis and the measured numbers it rests on."""

    topic: str
    text: str
    evidence: dict[str, float] = field(default_factory=dict)
    level: str = "info"  # info, or the engine choice's ok / warning / bad


def diagnose(run: QuickstartRun) -> list[Verdict]:
    """What the processor was busy with, whether streams or batching help, and which layers cost accuracy."""
    verdicts: list[Verdict] = []
    if run.timing is not None:
        verdicts += _timing_verdicts(run.timing)
    if run.layer_diff is not None:
        verdicts += _accuracy_verdicts(run.layer_diff, kept_wider(run))
    if run.metrics is not None:
        verdicts += _metric_verdicts(run.metrics, kept_wider(run))
    if run.selection is not None:
        verdicts.append(_choice_verdict(run.selection.choice))
    if run.mixed_search is not None:
        verdicts += _search_verdicts(run.mixed_search, run)
    if run.fp32_engine is not None:
        verdicts += _fusion_verdicts(run.fp32_engine)
    verdicts += _precision_check_verdicts(run)
    return verdicts


def _precision_check_verdicts(run: QuickstartRun) -> list[Verdict]:
    """Requested vs actual precision over every built engine: the silent-FP32 builds TensorRT users keep meeting."""
    checks = {str(v): b.engine.precision_check for v, b in run.builds.items() if b.engine.precision_check is not None}
    if not checks:
        return []
    bad = {name: check for name, check in checks.items() if not check.ok}
    checked = sum(check.checked for check in checks.values())
    if not bad:
        text = f"all {checked} checked nodes of {len(checks)} engine(s) run at the precision requested"
        return [Verdict("requested vs actual precision", text + ".", {"checked": float(checked)}, level="ok")]
    parts = [f"{name}: {len(check.mismatches)} (first: {check.lines(1)[0]})" for name, check in bad.items()]
    text = (
        f"{sum(len(c.mismatches) for c in bad.values())} node(s) run at another precision than requested: "
        + "; ".join(parts)
    )
    evidence = {f"mismatches_{name}": float(len(check.mismatches)) for name, check in bad.items()}
    return [Verdict("requested vs actual precision", text + ".", evidence, level="warning")]


def _choice_verdict(choice: Choice) -> Verdict:
    """The engine chosen, by which rule, and (when it loses too much or the samples cannot tell) what to try next."""
    text = f"{choice.variant} engine ({choice.level}): {choice.reason}."
    steps = next_steps(choice)
    if steps:
        text += " " + steps
    chosen = next((j for j in choice.judgements if j.variant == choice.variant), None)
    evidence = {"max_metric_drop": choice.max_drop}
    if chosen is not None:
        evidence |= {"loss_vs_fp32": chosen.loss, "samples": float(chosen.estimate.n)}
    return Verdict("engine choice", text + " " + choice.rule, evidence, level=choice.level)


def kept_wider(run: QuickstartRun) -> tuple[str, ...]:
    """The nodes the mixed engine keeps wider than INT8: the search's pick's fallback (none without a mixed build)."""
    if run.mixed_build is None or run.mixed_search is None:
        return ()
    return run.mixed_search.result.chosen.fallback_nodes


def _search_verdicts(search: MixedSearch, run: QuickstartRun) -> list[Verdict]:
    """What the accuracy-target search picked, which engine that is, and whether the journey chose it: the search's
    pick is the mixed engine (or the all-INT8 engine when no node needed to stay wider)."""
    result = search.result
    pick = result.chosen
    interval = search.intervals[pick.index]
    text = (
        f"the search picked plan {pick.index}: {result.metric_name} {interval.text()}, INT8 "
        f"{pick.int8_math_nodes}/{pick.math_nodes} math nodes, target {result.target:.4f} "
        f"{result.target_verdict}, {result.evaluations_used} evaluation(s); stopped: {result.stop_reason}"
    )
    engine = run.search_pick or Variant.INT8_MIXED
    built = run.builds.get(engine)
    if built is None:
        text += f"; its engine ({engine}) was not built: {run.stage('build_mixed').text}"
    else:
        text += f"; that is the {engine} engine ({built.engine.engine_path.name}, {built.engine.layer_count} layers)"
        chosen = run.chosen_variant
        if chosen is engine:
            text += ", the engine chosen" + (" and exported" if run.bundle is not None else "")
        elif chosen is not None:
            text += f"; the rule chose {chosen} instead (see the engine choice)"
    evidence = {"metric": pick.metric, "samples": float(interval.n), "int8_share": pick.int8_share}
    return [Verdict("mixed-precision search", text + ".", evidence)]


def _timing_verdicts(timing: Timing) -> list[Verdict]:
    verdicts: list[Verdict] = []
    chosen = timing.chosen
    stages = chosen.stages_ms
    compute, latency = stages.get("compute", math.nan), chosen.latency_ms.get("p50", math.nan)
    device = "GPU" if chosen.executor != "cpu" else "CPU (ONNX Runtime, no GPU here)"
    share = compute / latency if latency and latency > 0 else math.nan
    waiting = stages.get("wait", 0.0) + stages.get("queue", 0.0)
    verdicts.append(
        Verdict(
            "busy with",
            (
                f"The {device} was busy computing {chosen.busy_fraction:.0%} of the measured time; a request's median "
                f"latency of {latency:.2f} ms was {compute:.2f} ms compute ({share:.0%}), {waiting:.2f} ms waiting for a "
                f"free lane and {stages.get('h2d', 0.0) + stages.get('d2h', 0.0):.2f} ms copies."
            ),
            {
                "busy_fraction": chosen.busy_fraction,
                "p50_latency_ms": latency,
                "compute_ms": compute,
                "wait_ms": waiting,
            },
        )
    )
    host_bound = chosen.enqueue_us_p50 > 0.8 * compute * 1e3
    enqueue_note = (
        f"host enqueue took {chosen.enqueue_us_p50:.0f} us per request vs {compute * 1e3:.0f} us of "
        f"compute: the host thread {'is' if host_bound else 'is not'} the bottleneck"
        + (" (CPU executor: enqueue hands the request to a worker thread)" if chosen.executor == "cpu" else "")
    )
    verdicts.append(
        Verdict(
            "host",
            enqueue_note[0].upper() + enqueue_note[1:] + ".",
            {"enqueue_us_p50": chosen.enqueue_us_p50, "compute_ms": compute},
        )
    )
    one_stream = timing.find(1, chosen.batch)
    if chosen.streams > 1 and one_stream is not None:
        ratio = chosen.throughput_per_s / one_stream.throughput_per_s
        helps = ratio >= STREAMS_HELP_RATIO
        verdicts.append(
            Verdict(
                "more streams",
                (
                    f"{chosen.streams} streams give {chosen.throughput_per_s:.0f} samples/s vs {one_stream.throughput_per_s:.0f} "
                    f"with 1 ({ratio:.2f}x): more streams {'help' if helps else 'do not help'}"
                    + ("" if helps else _why_streams_do_not_help(device, one_stream.busy_fraction))
                    + "."
                ),
                {
                    "ratio": ratio,
                    "throughput_streams": chosen.throughput_per_s,
                    "throughput_1_stream": one_stream.throughput_per_s,
                },
            )
        )
    else:
        verdicts.append(
            Verdict(
                "more streams",
                f"Timed with {chosen.streams} stream(s) only; raise the streams setting to compare.",
                {"streams": float(chosen.streams)},
            )
        )
    unbatched = timing.find(chosen.streams, 1)
    if chosen.batch > 1 and unbatched is not None:
        ratio = chosen.throughput_per_s / unbatched.throughput_per_s
        cost = chosen.latency_ms.get("p50", math.nan) / unbatched.latency_ms.get("p50", math.nan)
        verdicts.append(
            Verdict(
                "batching",
                (
                    f"Batch {chosen.batch} gives {chosen.throughput_per_s:.0f} samples/s vs {unbatched.throughput_per_s:.0f} at "
                    f"batch 1 ({ratio:.2f}x) for {cost:.1f}x the median latency: batching "
                    f"{'helps throughput' if ratio >= STREAMS_HELP_RATIO else 'does not help'}."
                ),
                {"ratio": ratio, "latency_ratio": cost},
            )
        )
    elif timing.fixed_batch is not None:
        verdicts.append(
            Verdict(
                "batching",
                f"The model's graph hard-codes a batch of {timing.fixed_batch}: every run takes one sample, so "
                "streams carry the concurrency instead of batching.",
                {"batch": float(chosen.batch)},
            )
        )
    else:
        verdicts.append(
            Verdict(
                "batching",
                f"Timed at batch {chosen.batch} only; raise the batch setting to compare.",
                {"batch": float(chosen.batch)},
            )
        )
    return verdicts


def _accuracy_verdicts(layer_diff: LayerDiffStage, kept: tuple[str, ...]) -> list[Verdict]:
    verdicts: list[Verdict] = []
    diff = layer_diff.diff
    worst = diff.ranking(3)
    if worst:
        parts = [
            f"{row.node} (adds {row.noise_added:.2g} relative noise power, accumulated SQNR "
            f"{row.sqnr_db_accumulated:.1f} dB, {row.drop_db:.1f} dB drop)"
            for row in worst
        ]
        text = "INT8 error enters most at " + "; ".join(parts) + "."
        if kept:
            text += f" Kept wider than INT8 in the mixed engine (the search's pick): {', '.join(kept)}."
        verdicts.append(
            Verdict(
                "accuracy", text, {f"noise_added_{i}": float(row.noise_added or 0.0) for i, row in enumerate(worst)}
            )
        )
    return verdicts


def _metric_verdicts(metrics: Metrics, kept: tuple[str, ...]) -> list[Verdict]:
    verdicts: list[Verdict] = []
    rows = {row.variant: row for row in metrics.rows}
    if Variant.FP32 in rows and any(VARIANTS[v].quantized for v in rows):
        fp32 = rows[Variant.FP32]
        judged = judge(metrics.rows)
        text = f"{fp32.metric}: FP32 {fp32.value:.4f}"
        evidence = {"fp32": fp32.value}
        for variant in reversed(COST_ORDER):
            if variant in rows and variant is not Variant.FP32:
                difference = judged[variant].vs_fp32
                text += f", {variant} {rows[variant].value:.4f} ({difference.text()}"
                text += ", within noise)" if difference.within_noise else ")"
                evidence[str(variant)] = rows[variant].value
        if kept:
            text += f"; the mixed engine keeps {len(kept)} node(s) wider: {', '.join(kept)}"
        method = fp32.estimate.method or "no interval"
        verdicts.append(
            Verdict(
                "task metric",
                text + f" (ONNX Runtime CPU, {fp32.n_samples} samples; differences with paired 95% intervals, "
                f"FP32 {fp32.estimate.text()} by {method}).",
                evidence,
            )
        )
    return verdicts


def _fusion_verdicts(artifact: EngineArtifact) -> list[Verdict]:
    stats = artifact.layer_map.stats()
    fused = sum(count for size, count in stats.group_sizes.items() if size > 1)
    return [
        Verdict(
            "fusion",
            (
                f"{artifact.onnx_node_count} ONNX nodes became {artifact.layer_count} engine layers; {fused} layers fuse two "
                "or more nodes."
            ),
            {"onnx_nodes": float(artifact.onnx_node_count), "engine_layers": float(artifact.layer_count)},
        )
    ]


NEXT_STEPS_NOTE = (
    "Paths are this run's own files. On a machine with an NVIDIA GPU and full TensorRT, time the chosen engine "
    "there too (the timing above is ONNX Runtime on the CPU when no GPU was found)."
)


def _data_option(run: QuickstartRun) -> list[str] | None:
    """The --data a command needs for this run's model: zoo, the run's own folder, or None (random inputs only)."""
    from workbench.zoo import entry_names

    if run.config.data:
        return ["--data", str(Path(run.config.data).resolve())]
    return ["--data", "zoo"] if run.config.model in entry_names() else None


def next_step_commands(run: QuickstartRun) -> list[tuple[str, str]]:
    """(why, command) per next step that applies to this run: where INT8 hurts (diff, then the explorer's damage
    overlay), the search over formats (FP8 before FP16) when the chosen engine is not an "ok" INT8 choice or the
    search missed its target, and checking the exported bundle. Commands are ``workbench`` arguments, quoted."""
    out = Path(run.config.out_dir).resolve() / "next"
    model = shlex.quote(run.config.model)
    data = _data_option(run)
    steps: list[tuple[str, str]] = []
    int8 = run.int8_all_build
    if int8 is not None and data is not None:
        worst = run.layer_diff.diff.ranking(1) if run.layer_diff is not None else []
        why = "See where INT8 error enters, with the engine layers that run it" + (
            f" (most noise is added at {worst[0].node} here)" if worst else ""
        )
        diff_json = out / "int8.diff.json"
        steps.append(
            (
                why,
                shlex.join(
                    ["diff", run.config.model, str(int8.onnx_path.resolve()), *data, "-o", str(diff_json)]
                    + ["--threshold", "20", "--max-batches", "1"]
                ),
            )
        )
        steps.append(
            (
                "Open the INT8 engine in the explorer with that damage overlaid (static files, no server)",
                shlex.join(
                    ["explore", str(int8.engine.engine_path.resolve()), "--diff", str(diff_json)]
                    + ["--export", str(out / "explore")]
                ),
            )
        )
    search = run.mixed_search.result if run.mixed_search is not None else None
    choice = run.selection.choice if run.selection is not None else None
    unmet = (search is not None and not search.met) or (choice is not None and not choice.ok)
    wider = search.chosen.math_nodes - search.chosen.int8_math_nodes if search is not None else 0
    if data is not None and run.calibration is not None and (unmet or wider > 0):
        why = (
            "The target was not met: search over formats (a group that fails in INT8 is tried in FP8 before FP16)"
            if unmet
            else f"The search kept {wider} math node(s) wider "
            "than INT8: search over formats, where FP8 may keep them 8-bit"
        )
        steps.append(
            (
                why,
                f"calibrate {model} {shlex.join(data)} --target-drop {run.config.max_metric_drop:g} "
                f"--formats int8,fp8,fp16 --budget 4 -o {shlex.quote(str(out / 'formats.qdq.onnx'))}",
            )
        )
    if run.bundle is not None:
        steps.append(
            (
                "Check the exported bundle (manifest, engine hash, config) before deploying it",
                shlex.join(["verify", str(run.bundle.path.resolve())]),
            )
        )
    return steps


def node_inputs(run: QuickstartRun) -> dict[str, tuple[str, ...]]:
    """Each node's input tensors in the FP32 model the diff compared (empty without an FP32 build)."""
    if run.fp32_build is None or not run.fp32_build.onnx_path.is_file():
        return {}
    import onnx

    graph = onnx.load(str(run.fp32_build.onnx_path), load_external_data=False).graph
    return {node.name: tuple(i for i in node.input if i) for node in graph.node}


def _local_text(tensor: TensorDiff) -> str:
    local = "-" if tensor.sqnr_db_local is None else f"{tensor.sqnr_db_local:.1f} dB"
    clipped = "-" if tensor.clipped_fraction is None else f"{tensor.clipped_fraction:.1e}"
    return f"local SQNR {local}, clipped {clipped}"


def layer_cause(diff: LayerDiff, row: TensorDiff, inputs: Mapping[str, Sequence[str]]) -> str:
    """Why INT8 adds noise at ``row`` (a ranked activation), from the diff's own numbers; never empty.

    Its own range's verdict when it is quantized and the range is wrong (clipping / outliers); else a quantized input
    of its node whose range is wrong; else an explicit "no known cause" that says what the data rules out: the
    quantized tensors it reads fit their ranges (the drop is rounding noise of its INT8 math), or it reads no INT8
    tensor at all (the noise comes from upstream)."""
    if row.cause and row.cause != "ok":
        return f"{row.cause}: {_local_text(row)}"
    by_name = {t.name: t for t in diff.tensors}
    read = [by_name[name] for name in inputs.get(row.node, ()) if name in by_name and by_name[name].quantized]
    read += [t for t in diff.tensors if t.quantized and t.kind != "activation" and t.node == row.node and t not in read]
    wrong = [t for t in read if t.cause and t.cause != "ok"]
    if wrong:
        worst = min(wrong, key=lambda t: t.sqnr_db_local if t.sqnr_db_local is not None else math.inf)
        return f"its {worst.kind} {worst.name}: {worst.cause}; {_local_text(worst)}"
    own = f"its own range fits ({_local_text(row)}); " if row.cause == "ok" else ""
    if read:
        worst = min(read, key=lambda t: t.sqnr_db_local if t.sqnr_db_local is not None else math.inf)
        fmt = (worst.format or "int8").upper()
        return (
            f"no known cause: {own}the {len(read)} {fmt} tensor(s) {row.op} reads fit their ranges (worst "
            f"{worst.name}, {_local_text(worst)}): the {row.drop_db or 0.0:.1f} dB drop is {fmt} rounding noise "
            "of its math"
        )
    upstream = (row.sqnr_db_accumulated or 0.0) + (row.drop_db or 0.0)
    return (
        f"no known cause: {own}{row.op} reads no quantized tensor; the noise comes from upstream (its inputs at "
        f"{upstream:.1f} dB accumulated SQNR)"
    )


def _why_streams_do_not_help(device: str, busy_fraction: float) -> str:
    # A device mostly idle with one stream is not what stops more streams from helping: say where to look instead.
    if busy_fraction >= BUSY_ENOUGH:
        return f" (the {device} is already {busy_fraction:.0%} busy with one stream)"
    return (
        f" although the {device} is only {busy_fraction:.0%} busy with one stream: the limit is elsewhere "
        "(host enqueue, or the cores a CPU executor shares; see the host verdict)"
    )
