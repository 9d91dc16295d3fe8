"""``workbench clean IN.onnx -o OUT.onnx --report REPORT.json``: the cleaner on the command line."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from workbench._args import bounded_int, positive_int
from workbench._io import validate_outputs
from workbench.errors import WorkbenchError
from workbench.model.resources import MAX_DIM

if TYPE_CHECKING:
    from workbench.clean.passes import DimSpec
    from workbench.clean.pipeline import CleanOptions

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "clean",
        help="clean an ONNX graph for TensorRT with named, checked passes",
        description="Run named cleaning passes; after each one check the model is still equivalent "
        "(onnx.checker, strict shape inference, graph I/O, Q/DQ count, ONNX Runtime outputs); failing passes are rolled back.",
    )
    parser.add_argument("model", nargs="?", help="input .onnx file, or a zoo model name (e.g. ocr-rec)")
    parser.add_argument("-o", "--output", help="where to write the cleaned model")
    parser.add_argument("--report", help="write the per-pass report here (JSON)")
    parser.add_argument("--passes", help="comma-separated pass names to run, in order (default: all default passes)")
    parser.add_argument("--skip", default="", help="comma-separated pass names to leave out of the default list")
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D0,D1,...",
        help="override an input shape: ints pin a dimension, names keep it symbolic, '?' leaves it (repeatable)",
    )
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME:MIN/OPT/MAX",
        help="shapes to compare outputs at, e.g. x:1x3x48x320/8x3x48x320/32x3x48x320 (repeatable)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="real inputs for every check instead of generated probes: a folder of .npz batches keyed by input name "
        "(as for calibrate), .npy files for a one-input model, one such file, or 'zoo' for a zoo model's calibration set",
    )
    parser.add_argument(
        "--check-batches", type=positive_int, default=None, help="compare on at most N batches of --data (default 4)"
    )
    parser.add_argument("--no-check", action="store_true", help="skip the equivalence checks (faster, unproven)")
    parser.add_argument(
        "--fold-size-threshold",
        type=bounded_int(0, 2**40),
        default=None,
        help="largest folded tensor in bytes (default 16 MiB)",
    )
    parser.add_argument("--list-passes", action="store_true", help="list the available passes and exit")
    parser.set_defaults(func=run_clean)


def _parse_shape(text: str) -> tuple[str, list[DimSpec]]:
    name, sep, dims = text.rpartition(":")
    if not sep or not name or not dims:
        raise WorkbenchError(f"--shape {text!r} is not NAME:D0,D1,...", expected="e.g. --shape x:1,3,batch_h,?")
    parsed: list[DimSpec] = []
    for dim in dims.split(","):
        dim = dim.strip()
        value = None if dim in ("?", "") else int(dim) if dim.lstrip("-").isdigit() else dim
        if isinstance(value, int) and not 0 < value <= MAX_DIM:
            raise WorkbenchError(f"--shape {text!r}: dimension {value} is out of range.", expected=f"1..{MAX_DIM}")
        parsed.append(value)
    return name, parsed


def _parse_profile(text: str) -> tuple[str, list[tuple[int, ...]]]:
    name, sep, levels = text.rpartition(":")
    try:
        shapes = [tuple(int(v) for v in level.split("x")) for level in levels.split("/")]
    except ValueError:
        shapes = []
    if not sep or not name or len(shapes) != 3:
        raise WorkbenchError(
            f"--profile {text!r} is not NAME:MIN/OPT/MAX.",
            expected="e.g. --profile x:1x3x48x320/8x3x48x320/32x3x48x320",
        )
    from workbench.model.resources import ensure_fits, tensor_bytes

    for shape in shapes:
        if any(not 0 < d <= MAX_DIM for d in shape):
            raise WorkbenchError(f"--profile {text!r}: dimension out of range in {shape}.", expected=f"1..{MAX_DIM}")
        ensure_fits(tensor_bytes(shape, "float32", what=f"--profile {name}"), what=f"--profile {name} shape {shape}")
    low, opt, high = shapes
    if len({len(low), len(opt), len(high)}) == 1 and not all(a <= b <= c for a, b, c in zip(low, opt, high)):
        raise WorkbenchError(
            f"--profile {text!r}: MIN/OPT/MAX are not ordered (every dimension needs MIN <= OPT <= MAX).",
            expected="e.g. --profile x:1x3x48x320/8x3x48x320/32x3x48x320",
        )
    return name, shapes


def _unique(label: str, pairs: list[tuple[str, T]]) -> dict[str, T]:
    """``--shape``/``--profile`` given twice for one input would silently keep the last: refuse it."""
    result: dict[str, T] = {}
    for name, value in pairs:
        if name in result:
            raise WorkbenchError(f"{label} gives input {name!r} twice.", expected=f"one {label} per input")
        result[name] = value
    return result


def _resolve_model(spec: str) -> tuple[Path, dict[str, list[tuple[int, ...]]] | None]:
    from workbench.zoo import resolve_model

    path, entry = resolve_model(spec)
    if entry is None:
        return path, None
    return path, {name: list(levels) for name, levels in entry.input_profiles().items()}


def _data_options(args: argparse.Namespace, options: CleanOptions) -> None:
    """--data / --check-batches onto the options (the zoo entry for --data zoo)."""
    if args.check_batches is not None:
        if args.data is None:
            raise WorkbenchError("--check-batches needs --data.", expected="--data DIR --check-batches N")
        if args.check_batches < 1:
            raise WorkbenchError(f"--check-batches {args.check_batches}.", expected="a positive number of batches")
        options.check_batches = args.check_batches
    if args.data is None:
        return
    if args.no_check:
        raise WorkbenchError("--data is for the checks, which --no-check switches off.", expected="one of the two")
    options.data = args.data
    if args.data == "zoo":
        from workbench.zoo import resolve_model

        _, entry = resolve_model(args.model)
        if entry is None:
            raise WorkbenchError("--data zoo needs a zoo model.", expected="a zoo model name, or --data DIR")
        options.data_entry = entry


def run_clean(args: argparse.Namespace) -> int:
    from workbench._io import write_json_atomic
    from workbench.clean import DEFAULT_PASSES, CleanOptions, available_passes, clean_file, get_pass

    if args.list_passes:
        for name in available_passes():
            clean_pass = get_pass(name)
            marker = "*" if name in DEFAULT_PASSES else " "
            print(f"{marker} {name:28s} [{clean_pass.tolerance}] {clean_pass.description}")
        return 0
    if not args.model or not args.output:
        raise WorkbenchError(
            "clean needs an input model and -o OUTPUT.",
            expected="workbench clean IN.onnx -o OUT.onnx [--report REPORT.json]",
        )
    model_path, zoo_profile = _resolve_model(args.model)
    data_path = args.data if args.data not in (None, "zoo") else None
    validate_outputs({"-o": args.output, "--report": args.report}, inputs=[model_path, data_path])
    _guard_inputs(model_path)
    passes = [name.strip() for name in args.passes.split(",") if name.strip()] if args.passes else list(DEFAULT_PASSES)
    if args.passes is not None and not passes:
        raise WorkbenchError(
            f"--passes {args.passes!r} names no pass.",
            expected="comma-separated pass names (see --list-passes), or no --passes for the default list",
        )
    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    for name in list(skip) + passes:
        get_pass(name)  # unknown names fail here, listing the valid ones
    passes = [name for name in passes if name not in skip]
    profile = dict(zoo_profile or {})
    profile.update(_unique("--profile", [_parse_profile(text) for text in args.profile]))
    options = CleanOptions(
        passes=passes,
        input_shapes=_unique("--shape", [_parse_shape(text) for text in args.shape]),
        profile=profile or None,
        check=not args.no_check,
    )
    if args.fold_size_threshold is not None:
        options.fold_size_threshold = args.fold_size_threshold
    _data_options(args, options)
    result = clean_file(model_path, args.output, options)
    for issue in result.baseline_issues:
        print(f"note: {issue}")
    if result.data_source:
        print(f"outputs compared on {len(result.probe_shapes)} batch(es) of {result.data_source}")
    elif result.probe_shapes:
        print(
            "outputs compared at: "
            + "; ".join(", ".join(f"{k}={v}" for k, v in probe.items()) for probe in result.probe_shapes)
        )
    for report in result.passes:
        diff = "-" if report.max_abs_diff is None else f"{report.max_abs_diff:.3g}"
        note = f"  ({report.failure})" if report.failure else ""
        if report.checked_with:
            note += f"  (proven in one check with {', '.join(n for n in report.checked_with if n != report.name)})"
        print(
            f"{report.name:28s} {report.status:12s} {report.nodes_before:5d} -> {report.nodes_after:5d}  {report.seconds:6.2f}s  max|diff| {diff}{note}"
        )
        for finding in report.findings:
            print(f"    {finding.severity}: {finding.rule} at {finding.node}: {finding.message}")
    if result.subgraph_nodes_before:
        print(
            f"nodes inside If/Loop/Scan bodies: {result.subgraph_nodes_before} -> {result.subgraph_nodes_after} "
            "(counted in the totals)"
        )
    print(
        f"{result.source}: {result.nodes_before} -> {result.nodes_after} nodes, {result.bytes_before} -> {result.bytes_after} bytes, {result.seconds:.2f}s; wrote {args.output}"
    )
    if args.report:
        write_json_atomic(args.report, result.to_json())
    return 0


def _guard_inputs(model_path: Path) -> None:
    """String inputs and inputs too large to feed are refused before the equivalence checks allocate them."""
    from workbench.model import load_onnx
    from workbench.model.resources import guard_model_inputs

    guard_model_inputs(load_onnx(model_path, check=False), what=str(model_path), copies=2)
