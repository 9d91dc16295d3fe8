"""``workbench zoo``: list the built-in models, materialize them, score them in FP32 with ONNX Runtime,
and write their calibration sets as ``.npz`` batches (the ``calibration/`` folder format)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from workbench._args import bounded_int, positive_int
from workbench.errors import WorkbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    zoo = subparsers.add_parser(
        "zoo",
        help="built-in models with data and task metrics (list, fetch, eval, calib-data)",
        description="Built-in models that need no network. With no subcommand: list them.",
    )
    zoo.set_defaults(func=_list_command, json=False)
    actions = zoo.add_subparsers(dest="zoo_command", metavar="ACTION")

    listing = actions.add_parser("list", help="list the zoo models (the default action)")
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_list_command)

    fetch = actions.add_parser("fetch", help="materialize models into the cache and print their paths")
    fetch.add_argument("names", nargs="*", metavar="NAME", help="zoo model name(s)")
    fetch.add_argument("--all", action="store_true", help="every model (torch-exported ones need the dev extra)")
    fetch.set_defaults(func=_fetch_command)

    evaluate = actions.add_parser(
        "eval", help="FP32 task metric of a zoo model with ONNX Runtime CPU on its evaluation set"
    )
    evaluate.add_argument("name", metavar="NAME")
    evaluate.add_argument("--limit", type=positive_int, default=None, help="score only the first N evaluation samples")
    evaluate.add_argument(
        "--onnx", type=Path, default=None, help="score this ONNX file (e.g. a cleaned or quantized variant) instead"
    )
    evaluate.add_argument(
        "--ort-optimizations",
        action="store_true",
        help="enable ORT graph optimizations (default: ORT_DISABLE_ALL, the reference)",
    )
    evaluate.add_argument("--json", action="store_true", help="print the MetricResult as JSON")
    evaluate.set_defaults(func=_eval_command)

    calib = actions.add_parser(
        "calib-data", help="write the model's calibration set as .npz batches keyed by input name"
    )
    calib.add_argument("name", metavar="NAME")
    calib.add_argument("out", type=Path, metavar="FOLDER")
    calib.add_argument("--limit", type=positive_int, default=None, help="at most N samples")
    calib.add_argument("--batch-size", type=bounded_int(1, 65536), default=8)
    calib.add_argument(
        "--overwrite", action="store_true", help="replace an existing FOLDER (atomically; no stale batches kept)"
    )
    calib.add_argument(
        "--images",
        action="store_true",
        help="write PNG images before preprocessing instead of .npz batches (image models)",
    )
    calib.set_defaults(func=_calib_data_command)


def _list_command(args: argparse.Namespace) -> int:
    from workbench.zoo import DEFAULT_MODEL, list_entries

    rows = [entry.describe() for entry in list_entries()]
    if getattr(args, "json", False):
        print(json.dumps({"default": DEFAULT_MODEL, "models": rows}, indent=2))
        return 0
    header = ("name", "task", "metric", "needs torch", "cached")
    table = [header] + [
        (
            r["name"] + (" (default)" if r["name"] == DEFAULT_MODEL else ""),
            r["task"],
            r["metric"],
            "yes" if r["requires_torch"] else "no",
            "yes" if r["cached"] else "no",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def _fetch_command(args: argparse.Namespace) -> int:
    from workbench.zoo import entry_names, get_entry

    if args.all and args.names:
        raise WorkbenchError(
            "give model names or --all, not both.", expected="workbench zoo fetch NAME [NAME...] | --all"
        )
    names = entry_names() if args.all else args.names
    if not names:
        raise WorkbenchError(
            "no model named.",
            expected="workbench zoo fetch NAME [NAME...] or --all; names: " + ", ".join(entry_names()),
        )
    entries = [get_entry(name) for name in names]  # validate every name before any slow export
    for entry in entries:
        started = time.perf_counter()
        was_cached = entry.is_cached()
        path = entry.onnx_path()
        note = "cached" if was_cached else f"materialized in {time.perf_counter() - started:.1f} s"
        print(f"{entry.name}\t{path}\t({note})")
    return 0


def _eval_command(args: argparse.Namespace) -> int:
    from workbench.zoo import get_entry

    entry = get_entry(args.name)
    path = args.onnx if args.onnx is not None else entry.onnx_path()
    started = time.perf_counter()
    result = entry.evaluate_onnx(path, disable_optimizations=not args.ort_optimizations, limit=args.limit)
    seconds = time.perf_counter() - started
    if args.json:
        print(
            json.dumps(
                {"model": entry.name, "onnx": str(path), "seconds": round(seconds, 3), "metric": result.to_json()},
                indent=2,
            )
        )
    else:
        print(
            f"{entry.name}: {result} (ONNX Runtime CPU, {'optimized' if args.ort_optimizations else 'ORT_DISABLE_ALL'}, {seconds:.1f} s)"
        )
        for key, value in result.details.items():
            if not isinstance(value, (list, dict)):
                print(f"  {key}: {value:.6g}" if isinstance(value, float) else f"  {key}: {value}")
    return 0


def _calib_data_command(args: argparse.Namespace) -> int:
    from workbench._io import staging_directory, swap_directories, validate_outputs
    from workbench.zoo import get_entry
    from workbench.zoo.data import write_npz_batches

    entry = get_entry(args.name)
    out = Path(args.out)
    if out.exists() and out.is_dir() and not any(out.iterdir()):
        out.rmdir()  # an empty folder holds nothing to lose
    validate_outputs(
        {"FOLDER": out},
        directories=("FOLDER",),
        overwrite=args.overwrite,
        is_ours=_is_calib_folder,
        ours="a calibration folder (only .npz batches or images)",
    )
    # written into a staging folder and swapped in whole: a failed run keeps the old set, no stale batches mix in
    with staging_directory(out) as staging:
        if args.images:
            paths = entry.write_calibration_images(staging, limit=args.limit)
            what = "image(s)"
        else:
            paths = write_npz_batches(entry.calibration_batches(limit=args.limit, batch_size=args.batch_size), staging)
            what = "batch file(s)"
        if not paths:
            raise WorkbenchError(f"{entry.name}: no calibration samples to write.", expected="--limit >= 1")
        swap_directories(staging, out)
    print(f"wrote {len(paths)} {what} for {entry.name} to {args.out}")
    return 0


def _is_calib_folder(path: Path) -> bool:
    """--overwrite replaces only a folder of calibration batches/images (what calib-data writes), nothing else."""
    allowed = {".npz", ".png", ".jpg", ".jpeg"}
    return all(item.is_file() and item.suffix.lower() in allowed for item in path.iterdir())
