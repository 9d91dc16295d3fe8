"""``workbench calibrate`` and ``workbench diff``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from workbench._args import bounded_float, bounded_int, finite_float, level_or_off, positive_int
from workbench._io import validate_outputs
from workbench.calib.rounding import WEIGHT_ROUNDING_CHOICES
from workbench.calib.search import DEFAULT_SCREEN, resolve_confidence
from workbench.errors import WorkbenchError
from workbench.log import SHOWN_WARNINGS, warnings_as_lines

if TYPE_CHECKING:
    import onnx

    from workbench.calib.diff import LayerDiff
    from workbench.calib.session import CalibrationSession
    from workbench.model import OnnxModel
    from workbench.progress import ProgressEvent
    from workbench.zoo.base import ZooEntry
    from workbench.zoo.onnx_file import OnnxFileEntry


def register(subparsers: argparse._SubParsersAction) -> None:
    calibrate = subparsers.add_parser(
        "calibrate",
        help="INT8 calibration: write a Q/DQ ONNX (TensorRT explicit quantization) and a calibration cache",
        description="Collect activation histograms in one streaming pass, pick ranges (max / percentile / entropy / mse), "
        "insert Q/DQ per TensorRT's rules; with --target-drop, search the most INT8 whose task metric stays within "
        "that drop of FP32 (the one way to ask for an accuracy target).",
    )
    calibrate.add_argument("model", help="FP32 .onnx file, or a zoo model name (digits-cnn, ocr-cls, ocr-rec, ...)")
    calibrate.add_argument(
        "--data",
        default=None,
        help="calibration folder (.npz batches keyed by input name, or images for zoo models), "
        "'zoo' for the zoo model's calibration split, or 'random' (warned about)",
    )
    calibrate.add_argument(
        "--format",
        default="int8",
        choices=("int8", "fp8"),
        help="quantized format: int8 (default) or fp8 (E4M3, needs a GPU of compute capability 8.9+ to run)",
    )
    calibrate.add_argument(
        "--method",
        default=None,
        choices=("max", "percentile", "entropy", "mse"),
        help="range method (default mse, over the FP8 grid for fp8: the best or near-best INT8 on every zoo model, "
        "where entropy gives ocr-rec 0.0000 exact match; entropy is int8 only). INT8's mse prices a value inside "
        "the range at its expected rounding error, so the range does not hang on where the grid lands on one "
        "frequent value (ocr-rec all-INT8 on 1,000 lines, mean of four calibration sets: 0.9505 -> 0.9702)",
    )
    calibrate.add_argument(
        "--weight-rounding",
        default=None,
        choices=WEIGHT_ROUNDING_CHOICES,
        help="how weights are rounded onto their per-channel grid: nearest (each weight on its own), gptq (each "
        "layer's output error on the calibration data is minimised, one extra pass over the data, kept per layer only "
        "where it gains on held-out batches) or auto: the plan is scored both ways on the evaluation samples and GPTQ "
        "is kept when its paired 95 %% interval of gain is above zero (with --target-drop: the search's start plan on "
        "its screening samples). Default: auto for models with a task metric (zoo models, your own file with "
        "--target-drop), else nearest. With --align-grids auto too, the two are chosen together: each rounding gets "
        "the alignment its own output noise favours, then the task metric picks the rounding. Measured 2026-12-06 "
        "(bench/calibrate.py --rounding-alignment, 1,000 crops): EfficientNet-Lite0 all-INT8 agreement 0.910 nearest, "
        "0.930 GPTQ, 0.966 GPTQ grid-aligned",
    )
    calibrate.add_argument(
        "--align-grids",
        default=None,
        choices=("on", "off", "auto"),
        help="on: put INT8 inputs made from 8-bit pixels on their own grid (quantized exactly) and shift non-negative "
        "activations (Relu/Clip outputs read by Convs) by half their range, which halves their INT8 step; exact in "
        "float, folded into the Convs' weights and biases, same engine layers; the border maps of padded Convs add "
        "bytes (EfficientNet-Lite0's engine 12.5 -> 23.4 MB). auto: the plan (with --target-drop: the search's start "
        "plan) is quantized with and without; alignment is kept when its output noise against FP32 is clearly lower "
        "(under 80 %% of the other), or the noise is close and the task metric clearly gains (paired 99 %% interval "
        "above 0), else it stays off. Default: auto for "
        "models with a task metric (zoo models, your own file with --target-drop), else off. Measured 2026-12-06 "
        "(1,000 crops): EfficientNet-Lite0 all-INT8 with GPTQ weights 0.930 -> 0.966 top-1 agreement, its output "
        "noise 6.9e-3 -> 2.8e-3; with nearest weights 0.910 -> 0.914",
    )
    calibrate.add_argument(
        "--percentile",
        type=bounded_float(0.0, 100.0, low_inclusive=False),
        default=None,
        help="for --method percentile (default 99.99)",
    )
    calibrate.add_argument("-o", "--output", required=True, help="Q/DQ ONNX to write")
    calibrate.add_argument(
        "--cache",
        default=None,
        help="calibration cache JSON: read if it exists (also a TensorRT <=10 text cache), written otherwise",
    )
    calibrate.add_argument("--recalibrate", action="store_true", help="ignore an existing --cache and overwrite it")
    calibrate.add_argument(
        "--max-batches", type=positive_int, default=None, help="use at most this many calibration batches"
    )
    calibrate.add_argument(
        "--keep", default="", help="comma-separated node names kept out of INT8 (at --fallback-precision)"
    )
    calibrate.add_argument(
        "--fallback-precision", default="fp32", choices=("fp16", "fp32"), help="precision of the --keep nodes"
    )
    for removed in REMOVED_TARGET_OPTIONS:  # refused with the one way to ask for a target (see _refuse_removed)
        calibrate.add_argument(removed, default=None, help=argparse.SUPPRESS)
    calibrate.add_argument(
        "--target-drop",
        type=bounded_float(0.0, 1.0, low_inclusive=False),
        default=None,
        help="accuracy-target mixed precision (revert the worst fusion group, re-rank, step back): the most INT8 "
        "whose task metric is within this drop of FP32. Zoo models use their task metric; your own .onnx file uses "
        "top-1 accuracy when its .npz batches carry 'labels' (one integer class per sample), else agreement with its "
        "FP32 outputs judged on the worst output; the samples of --data are split in half: calibration, evaluation",
    )
    calibrate.add_argument(
        "--fallback", default=None, choices=("fp16", "fp32"), help="precision of reverted groups (--target-drop)"
    )
    calibrate.add_argument(
        "--budget", type=bounded_int(1, 10_000), default=None, help="--target-drop: at most N task evaluations"
    )
    calibrate.add_argument(
        "--confidence",
        type=level_or_off,
        default=None,
        help="--target-drop: the target is met only when the plan's metric meets it at the worst end of its two-sided "
        "interval at this level (default 0.95; the low end, or the high end for a lower-is-better metric), paired per "
        "sample with FP32, not by the point estimate alone; off: the point estimate decides. Measured "
        "2026-12-05: EfficientNet-Lite0's all-INT8 0.953 on 1,000 crops has a 95 %% low end of 0.940, so a 0.95 "
        "target at 0.95 confidence goes on to the residual-skip trial (0.964, low end 0.952)",
    )
    calibrate.add_argument(
        "--formats",
        default=None,
        help="--target-drop: the formats a fusion group may take, in the order tried, e.g. int8,fp8,fp16 (a group "
        "that hurts in INT8 is tried in FP8 before FP16; default int8,FALLBACK)",
    )
    calibrate.add_argument(
        "--groups", default=None, choices=("fusion", "block"), help="--target-drop: revert fusion groups or blocks"
    )
    calibrate.add_argument(
        "--keep-8bit",
        default=None,
        metavar="OPS",
        help="--target-drop: op types that stay in 8 bits (INT8 or FP8), e.g. Conv: their groups try only the 8-bit "
        "formats of --formats, and only the group's other nodes (a fused Add) may go wider; with Conv the search's "
        "stem trial (the leading convs of few channels per group in the fallback format) does not run",
    )
    calibrate.add_argument(
        "--screen",
        type=bounded_int(0, 1_000_000),
        default=None,
        metavar="N",
        help=f"--target-drop: score trials on the first N evaluation samples, confirm the plan that meets the target "
        f"on the whole set (default {DEFAULT_SCREEN}; 0: every trial on the whole set)",
    )
    calibrate.add_argument(
        "--eval-limit",
        type=positive_int,
        default=None,
        help="evaluation samples of the task metric (the search's and the one printed at the end; default: the whole "
        "set)",
    )
    calibrate.add_argument(
        "--search-report", default=None, help="--target-drop: MixedPrecisionResult JSON (default: OUTPUT.mixed.json)"
    )
    calibrate.add_argument(
        "--quantize-attention",
        action="store_true",
        help="also quantize attention MatMuls (two activation inputs), which TensorRT's rules leave out by default",
    )
    calibrate.add_argument("--plan", default=None, help="precision plan JSON (PrecisionPlan) to start from")
    calibrate.add_argument("--diff", default=None, help="also write the per-layer diff JSON here")
    calibrate.add_argument("--no-progress", action="store_true")
    calibrate.set_defaults(func=warnings_as_lines(_cli_calibrate))

    diff = subparsers.add_parser(
        "diff",
        help="per-layer accuracy diff of a Q/DQ model against its FP32 original (SQNR, cosine, clipping)",
        description="Run both models with ONNX Runtime (optimizations off) on the same inputs and report per tensor "
        "local and accumulated SQNR, cosine, max abs error and clipped fraction.",
    )
    diff.add_argument("fp32", help="FP32 .onnx file or zoo model name")
    diff.add_argument("quantized", help="Q/DQ .onnx made from it")
    diff.add_argument("--data", default=None, help="folder of .npz batches / images, 'zoo' or 'random'")
    diff.add_argument("-o", "--output", required=True, help="DIFF.json to write")
    diff.add_argument("--max-batches", type=positive_int, default=8)
    diff.add_argument("--top", type=bounded_int(0, 100_000), default=10, help="print this many worst layers")
    diff.add_argument(
        "--eval-limit",
        type=positive_int,
        default=None,
        help="zoo models: evaluation samples of the task metric printed at the end (default: the whole set)",
    )
    diff.add_argument(
        "--threshold",
        type=finite_float,
        default=None,
        metavar="DB",
        help="name the first tensor (topological order) whose accumulated SQNR falls below DB, with its ONNX nodes "
        "and the engine layers of a TensorRT-RTX build of the quantized model",
    )
    diff.add_argument("--no-engine", action="store_true", help="--threshold: do not build the engine for layer names")
    diff.add_argument("--no-progress", action="store_true")
    diff.set_defaults(func=warnings_as_lines(_cli_diff))


def resolve_model(value: str) -> tuple[OnnxModel, ZooEntry | None]:
    """(OnnxModel, zoo entry or None) for a path or a zoo name."""
    from workbench.model import load_onnx
    from workbench.zoo import resolve_model as resolve_path_or_zoo_name

    path, entry = resolve_path_or_zoo_name(value)
    return load_onnx(path), entry


def _say(text: str) -> None:
    if text.startswith("warning: ") and text.removeprefix("warning: ") in SHOWN_WARNINGS:
        return  # already shown when the stage warned
    print(text, file=sys.stdout, flush=True)


class _StepBars:
    """A calibration session's steps (ProgressEvent task "calibration") as tqdm bars on standard error, one per kind
    of step (the weights GPTQ rounds, the samples an evaluation scores), like the CLI's other slow loops; the steps
    whose loops draw their own bar (statistics, GPTQ's layer inputs) are left to it."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.step = ""

    def __call__(self, event: ProgressEvent) -> None:
        if event.name in ("statistics", "gptq_inputs"):
            return
        if self.bar is None or event.name != self.step or event.index < self.bar.n:  # a new step, or a new pass
            from tqdm.auto import tqdm

            self.close()
            self.bar = tqdm(total=event.total, desc=event.message, leave=False)
            self.step = event.name
        self.bar.set_description_str(event.message, refresh=False)
        self.bar.n = event.index
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.step = None, ""


REMOVED_TARGET_OPTIONS = {
    "--fallback-worst": "it fell back a fixed number of layers whatever the accuracy",
    "--target": "it asked for an absolute metric value through a second search",
}


def _refuse_removed(args: argparse.Namespace) -> None:
    """``calibrate`` keeps one way to ask for an accuracy target; the removed options say what replaces them."""
    for option, why in REMOVED_TARGET_OPTIONS.items():
        value = getattr(args, option.removeprefix("--").replace("-", "_"))
        if value is not None:
            raise WorkbenchError(
                f"{option} {value} was removed ({why}): calibrate has one way to ask for an accuracy target.",
                expected="--target-drop D: the most INT8 whose task metric stays within D of FP32 (e.g. 0.01); "
                "--keep NODE,... keeps named nodes out of INT8",
            )


def _op_types(text: str | None, session: CalibrationSession) -> tuple[str, ...]:
    """``--keep-8bit Conv,Gemm`` -> ("Conv", "Gemm"); an op type the model's quantizable nodes lack is refused."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    present = {op for _, op in session.quantizable_nodes()}
    unknown = [name for name in names if name not in present]
    if unknown:
        raise WorkbenchError(
            f"--keep-8bit names op type(s) {unknown} that no quantizable node of this model has.",
            expected=f"some of {', '.join(sorted(present))} (comma-separated)",
        )
    return names


def _refuse_ignored_options(args: argparse.Namespace) -> None:
    """Options that the other options make meaningless would be dropped without a word: refuse them instead."""
    _refuse_removed(args)
    first = args.formats.split(",")[0].strip() if args.formats else ""
    if first in ("int8", "fp8"):  # the search's ladder starts where every group starts
        args.format = first
    if args.method is None:
        args.method = "mse"  # entropy: ocr-rec 0.0000 exact match, mse 0.9533 (bench/calibrate.py --loss-sources)
    if args.format == "fp8" and args.method == "entropy":
        raise WorkbenchError(
            "--method entropy is INT8's (KL divergence over 128 uniform levels); FP8 ranges use max, percentile or mse.",
            expected="--format fp8 with --method max, percentile or mse (the default)",
        )
    if args.percentile is not None and args.method != "percentile":
        raise WorkbenchError(
            f"--percentile {args.percentile} is used by --method percentile only; --method {args.method} ignores it.",
            expected="--method percentile --percentile P, or no --percentile",
        )
    if args.target_drop is None:
        given = [
            flag
            for flag, value in (
                ("--fallback", args.fallback),
                ("--budget", args.budget),
                ("--confidence", args.confidence),
                ("--formats", args.formats),
                ("--groups", args.groups),
                ("--keep-8bit", args.keep_8bit),
                ("--screen", args.screen),
                ("--search-report", args.search_report),
            )
            if value is not None
        ]
        if given:
            raise WorkbenchError(
                f"{', '.join(given)} configure the accuracy-target search, which runs only with --target-drop.",
                expected=f"--target-drop D {' '.join(given)}, or none of them",
            )
    if args.recalibrate and not args.cache:
        raise WorkbenchError(
            "--recalibrate ignores an existing --cache, but no --cache was given.",
            expected="--cache CACHE.json --recalibrate, or no --recalibrate",
        )
    if args.keep and not [name for name in args.keep.split(",") if name.strip()]:
        raise WorkbenchError(f"--keep {args.keep!r} names no node.", expected="comma-separated ONNX node names")
    args.percentile = 99.99 if args.percentile is None else args.percentile
    args.fallback = args.fallback or "fp16"
    args.budget = 30 if args.budget is None else args.budget
    args.groups = args.groups or "fusion"


def _cli_calibrate(args: argparse.Namespace) -> int:
    from workbench.calib.session import CalibrationSession
    from workbench.calib.stats import CalibrationRanges
    from workbench.precision import PrecisionPlan

    _refuse_ignored_options(args)
    model, entry = resolve_model(args.model)
    data_dir = args.data if args.data not in (None, "zoo", "random") else None
    if args.target_drop is not None and entry is None:
        model, entry = _own_file_entry(model, args.data)
    # auto (measured on the task metric) is the default where there is one; without, auto is refused
    rounding = args.weight_rounding or ("auto" if entry is not None else "nearest")
    alignment = args.align_grids or ("auto" if entry is not None else "off")
    for option, value, keeps, others in (
        ("--weight-rounding", rounding, "the rounding with the better task metric", "nearest / gptq"),
        ("--align-grids", alignment, "grid alignment only where it measurably helps", "on / off"),
    ):
        if value == "auto" and entry is None:
            raise WorkbenchError(
                f"{option} auto keeps {keeps}, and {model.path} has a task metric only with --target-drop (its --data "
                "is split in half: calibration, evaluation).",
                expected=f"--target-drop D --data DIR, or {option} {others}",
            )
    # the cache is read when it exists, so it is an output only when it will be (re)written
    search_report = None
    if getattr(args, "target_drop", None) is not None:
        search_report = args.search_report or str(Path(args.output).with_suffix(".mixed.json"))
    validate_outputs(
        {"-o": args.output, "--cache": args.cache, "--diff": args.diff, "--search-report": search_report},
        inputs=[model.path, args.plan, data_dir],
    )
    from workbench.model.resources import guard_model_inputs
    from workbench.precision.qdq_rules import QUANTIZABLE_OPS

    graph = model.proto.graph
    weights = {initializer.name for initializer in graph.initializer}
    if not any(value.name not in weights for value in graph.input):  # before "nothing to quantize": the cause
        from workbench.calib.stats import no_graph_inputs

        raise no_graph_inputs(str(model.path))
    from workbench.calib.session import refuse_quantized

    refuse_quantized(model)  # before "nothing to quantize": QLinearConv is no Conv, yet the model is quantized
    if not any(node.op_type in QUANTIZABLE_OPS for node in graph.node):
        ops = sorted({node.op_type for node in graph.node})
        raise WorkbenchError(
            f"{model.path}: nothing to quantize: INT8 applies to {', '.join(QUANTIZABLE_OPS)} nodes of the main "
            f"graph and this model has none (its ops: {', '.join(ops[:12])}{' ...' if len(ops) > 12 else ''}).",
            expected="a model with convolutions or matrix products; build this one as FP32 or FP16 "
            "(`workbench build --precision fp16`)",
        )
    guard_model_inputs(model, what=str(model.path), batch=8, copies=2)
    data = args.data if args.data is not None else ("zoo" if entry is not None else None)
    if _is_own_file(entry):
        from workbench.calib.data import ZooSource

        # the entry's calibration half of --data (its other half scores the search), or its seeded random inputs:
        # calibrated on the same kind of inputs the search is scored on (still warned about when random)
        data = ZooSource(entry, is_random=args.data == "random")
    cache_path = Path(args.cache) if args.cache else None
    session = (
        CalibrationSession(
            model,
            data=data if data is not None else "zoo",
            entry=entry,
            max_batches=args.max_batches,
            progress=not args.no_progress,
            quantize_attention=args.quantize_attention,
            weight_rounding="gptq" if rounding == "gptq" else "nearest",  # auto: chosen on the plan below
            align_grids=alignment == "on",  # auto: chosen on the plan below
        )
        if (data or entry)
        else None
    )
    ranges = None
    if cache_path is not None and cache_path.exists() and not args.recalibrate:
        loaded = CalibrationRanges.load(cache_path, model_sha256=model.sha256)
        if loaded.statistics is not None and (
            loaded.method != args.method or loaded.percentile not in (None, args.percentile)
        ):
            ranges = loaded.statistics.ranges(args.method, percentile=args.percentile)  # switch method, no data re-read
        else:
            ranges = loaded
        _say(
            f"calibration cache {cache_path}: {len(ranges.amax)} tensor ranges ({ranges.method}), no statistics gathered"
        )
        if session is None:
            session = _cacheless_session(model, entry)
            if rounding == "gptq":  # asked for, but there is no data to fit it on
                _say("note: weights rounded to nearest: GPTQ needs calibration data and only a cache was given")
            if args.align_grids == "on":  # asked for (auto without a task metric was refused above)
                _say("note: no grid alignment: it reads the calibration inputs and only a cache was given")
            alignment = "off"
        if loaded.statistics is not None:
            session.use_statistics(loaded.statistics)
    if session is None:
        raise WorkbenchError(
            "no calibration data given.",
            expected="--data DIR (or 'zoo' with a zoo model); --data random only if you mean it",
        )
    if ranges is None:
        statistics = session.statistics()
        ranges = statistics.ranges(args.method, percentile=args.percentile)
        _say(
            f"statistics: {len(statistics.histograms)} tensors, {statistics.num_batches} batches / {statistics.num_samples} samples "
            f"in {statistics.seconds:.2f} s from {statistics.data_name}"
        )
        if cache_path is not None:
            ranges.save(cache_path)
            _say(f"wrote calibration cache {cache_path}")
    plan = PrecisionPlan.load(args.plan) if args.plan else session.default_plan(args.format)
    keep = [name.strip() for name in args.keep.split(",") if name.strip()]
    if keep:
        known = {name for name, _ in session.quantizable_nodes()} | {n.name for n in model.proto.graph.node}
        unknown = [k for k in keep if k not in known]
        if unknown:
            raise WorkbenchError(
                f"--keep names unknown node(s) {unknown}.",
                expected="node names of the model (see `workbench diff` output)",
            )
        plan = plan.with_overrides({k: args.fallback_precision for k in keep})
    # with a target, the search chooses on its start plan; both on the samples the metric printed below is scored on
    # (that evaluation is then reused): a gain of a few points needs them all to be clear of zero (EfficientNet-Lite0
    # FP8 on 256 crops: +0.027 [-0.015, +0.070])
    if session is not None and not args.no_progress:  # the choices' GPTQ roundings and evaluations as bars too
        session.events = _StepBars()
    if rounding == "auto" and alignment == "auto" and args.target_drop is None:
        from workbench.calib.quantization_choice import choose_rounding_and_alignment

        _say(
            "weight rounding auto: scoring the plan with nearest and with GPTQ weight rounding (grid alignment auto: "
            "chosen with it)"
        )
        for choice in choose_rounding_and_alignment(session, ranges, plan, args.eval_limit):
            _say(choice.note)
    elif rounding == "auto" and args.target_drop is None:
        from workbench.calib.rounding_choice import choose_weight_rounding

        _say("weight rounding auto: scoring the plan with nearest and with GPTQ weight rounding")
        rounding_choice = choose_weight_rounding(session, ranges, plan, args.eval_limit)
        _say(rounding_choice.note)
    elif alignment == "auto" and args.target_drop is None:
        from workbench.calib.alignment_choice import choose_grid_alignment

        _say("grid alignment auto: quantizing the plan with and without it")
        _say(choose_grid_alignment(session, ranges, plan, args.eval_limit).note)
    if session is not None and isinstance(session.events, _StepBars):
        session.events.close()
        session.events = None  # the search reports its evaluations as lines of its own
    quantized = session.quantize(ranges, plan)
    diff = session.diff(quantized) if args.diff else None
    mixed = None
    if args.target_drop is not None:
        from workbench.calib.search import search_mixed_precision

        if args.target_drop < 0 or args.budget < 1:
            raise WorkbenchError(
                f"--target-drop {args.target_drop} / --budget {args.budget} out of range.",
                expected="a drop >= 0 and a budget >= 1",
            )
        mixed = search_mixed_precision(
            session,
            target_drop=args.target_drop,
            fallback=args.fallback,
            budget=args.budget,
            ranges=ranges,
            limit=args.eval_limit,
            granularity=args.groups,
            base_plan=plan,
            progress=None if args.no_progress else lambda event: _say(event.message),
            formats=[f.strip() for f in args.formats.split(",") if f.strip()] if args.formats else None,
            keep_8bit=_op_types(args.keep_8bit, session),
            screen=(DEFAULT_SCREEN if args.screen is None else args.screen) or None,
            weight_rounding=rounding,
            align_grids="auto" if alignment == "auto" else None,  # on / off: the session's own setting
            confidence=resolve_confidence(args.confidence),
        )
        report = Path(args.search_report or Path(args.output).with_suffix(".mixed.json"))
        mixed.save(report)
        _say(f"mixed precision: {mixed.summary()}")
        _say(f"wrote search report {report} ({len(mixed.evaluated)} evaluated plans, {len(mixed.reverts)} reverts)")
        plan = mixed.plan
        quantized = session.quantize(ranges, plan)
    quantized.save(args.output)
    counts = quantized.counts()
    placement = quantized.placement
    formats = ", ".join(
        f"{len(nodes)} {name} nodes"
        for name, nodes in (("INT8", placement.int8_nodes), ("FP8", placement.fp8_nodes))
        if nodes or name == "INT8"
    )
    if quantized.fp16_nodes:  # e.g. the FP8 plan's stem (qdq_rules.fp8_stem_layers)
        formats += f", {len(quantized.fp16_nodes)} FP16 nodes"
    method = session.fp8_ranges(ranges).method if placement.uses_fp8 else ranges.method
    _say(f"wrote {args.output}: {counts.get('QuantizeLinear', 0)} Q/DQ pairs, {formats}, method {method}")
    for note in quantized.notes + ranges.warnings:
        _say(f"warning: {note}")
    if args.diff and diff is not None:
        final_diff = session.diff(quantized, with_metric=entry is not None)
        final_diff.save(args.diff)
        _say(f"wrote per-layer diff {args.diff}")
    if entry is not None:
        fp32 = session.evaluate(limit=args.eval_limit)
        searched = mixed.chosen if mixed is not None else None
        if searched is not None and searched.n_samples == fp32.n_samples:  # the search scored this plan on them all
            value, samples = searched.metric, searched.n_samples
        else:
            int8 = session.evaluate(quantized, limit=args.eval_limit)
            value, samples = int8.value, int8.n_samples
        _say(f"task metric {fp32.name}: FP32 {fp32.value:.4f}  quantized {value:.4f}  ({samples} samples)")
    return 0


def _is_own_file(entry: ZooEntry | None) -> bool:
    from workbench.zoo.onnx_file import OnnxFileEntry

    return isinstance(entry, OnnxFileEntry)


def _own_file_entry(model: OnnxModel, data: str | None) -> tuple[OnnxModel, OnnxFileEntry]:
    """Your own ONNX file as an entry with a task metric (labels in the .npz batches, else agreement with its FP32
    outputs), so --target-drop works on it; the model calibrated is the one the entry runs (a proven batch copy of a
    fixed-batch-1 file)."""
    from workbench.model import load_onnx
    from workbench.zoo.onnx_file import OnnxFileEntry

    if data is None or data == "zoo":
        raise WorkbenchError(
            f"--target-drop on your own file {model.path} needs samples to calibrate and to evaluate on.",
            expected="--data DIR (.npz batches keyed by input name, optionally with 'labels'), or --data random",
        )
    entry = OnnxFileEntry(model.path, data=None if data == "random" else data)
    _say(f"note: {entry.inputs_note}")
    for note in entry.notes:
        _say(f"note: {note}")
    return (model if entry.onnx_path() == model.path else load_onnx(entry.onnx_path())), entry


def _cacheless_session(model: OnnxModel, entry: ZooEntry | None) -> CalibrationSession:
    """A session for a cache-only run: no data is read, so a placeholder source that refuses to be used."""
    from workbench.calib.data import IterableSource
    from workbench.calib.session import CalibrationSession

    def no_data() -> NoReturn:
        raise WorkbenchError("this step needs data but only a cache was given.", expected="--data DIR")

    return CalibrationSession(model, data=IterableSource(no_data, name="cache only"), entry=entry, progress=False)


def _cli_diff(args: argparse.Namespace) -> int:
    from workbench.calib.session import CalibrationSession
    from workbench.model import load_onnx

    model, entry = resolve_model(args.fp32)
    data_dir = args.data if args.data not in (None, "zoo", "random") else None
    validate_outputs({"-o": args.output}, inputs=[model.path, args.quantized, data_dir])
    from workbench.model.resources import guard_model_inputs

    guard_model_inputs(model, what=str(model.path), batch=8, copies=2)
    quantized = load_onnx(args.quantized, check=False)
    data = args.data if args.data is not None else ("zoo" if entry is not None else None)
    if data is None:
        raise WorkbenchError("no data for the diff.", expected="--data DIR (or 'zoo' with a zoo model)")
    session = CalibrationSession(model, data=data, entry=entry, progress=not args.no_progress)
    diff = session.diff(
        quantized.proto, max_batches=args.max_batches, with_metric=entry is not None, metric_limit=args.eval_limit
    )
    diff.save(args.output)
    _say(f"wrote {args.output}: {len(diff.tensors)} tensors, {diff.num_samples} samples in {diff.seconds:.2f} s")
    for row in diff.ranking(args.top):
        _say(
            f"  {row.name:<40.40} {row.op:<18} accumulated {row.sqnr_db_accumulated:6.1f} dB  drop {row.drop_db:6.1f} dB"
        )
    quantized_rows = sorted(
        (r for r in diff.tensors if r.sqnr_db_local is not None and r.kind != "weight"),
        key=lambda r: r.sqnr_db_local or 0.0,
    )[:3]
    for row in quantized_rows:
        _say(
            f"  lowest local SQNR: {row.name} {row.sqnr_db_local:.1f} dB, clipped {row.clipped_fraction:.2e}: {row.cause}"
        )
    if args.threshold is not None:
        _report_divergence(diff, args.threshold, quantized.proto, build=not args.no_engine)
    if diff.task_metric:
        _say(f"task metric {diff.task_metric['name']}: {diff.task_metric['value']:.4f}")
    for note in diff.warnings:
        _say(f"warning: {note}")
    return 0


def _report_divergence(diff: LayerDiff, threshold: float, quantized_proto: onnx.ModelProto, *, build: bool) -> None:
    from workbench.calib.diff import first_divergence

    layer_map = None
    if build:
        from workbench.calib.cost import build_plan_engine

        try:
            _, layer_map = build_plan_engine(quantized_proto, name="diff")
        except WorkbenchError as error:
            _say(f"warning: no engine layers (the build failed: {error.problem})")
    found = first_divergence(diff, threshold, layer_map)
    if found is None:
        _say(f"first divergence: no tensor falls below {threshold:g} dB accumulated SQNR")
        return
    _say(
        f"first divergence below {threshold:g} dB: tensor {found.tensor} (node {found.node}, {found.op}, position "
        f"{found.index}) at {found.sqnr_db_accumulated:.1f} dB, inputs at {found.sqnr_db_before:.1f} dB"
    )
    _say(f"  ONNX nodes: {', '.join(found.onnx_nodes)}")
    if found.engine_layers:
        for name, kind, precision in zip(found.engine_layers, found.engine_layer_types, found.engine_layer_precisions):
            _say(f"  engine layer: {name} ({kind}, {precision})")
    elif layer_map is not None:
        _say("  engine layers: none (the node was folded away in the build)")
