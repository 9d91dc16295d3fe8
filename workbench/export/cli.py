"""CLI: ``workbench export`` (an engine bundle, optionally with a Triton model repository)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.engine import EngineArtifact
from workbench.errors import WorkbenchError
from workbench.export.bundle import export_bundle
from workbench.export.triton import TritonOptions
from workbench.precision import PrecisionPlan


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser(
        "export",
        help="write an engine bundle (engine, manifest.json, layer map, optional Triton repository)",
        description="Write BUNDLE/ atomically: model.engine, manifest.json (ONNX sha256, backend and version, target "
        "compute capabilities, precision plan, layer map, build options, and calibration cache / accuracy / timing when "
        "given), model.layers.json, and with --triton a Triton model repository validated against Triton's schema.",
    )
    export.add_argument("engine", help="engine written by `workbench build` (its .layers.json must lie beside it)")
    export.add_argument("-o", "--output", required=True, help="bundle directory to create")
    export.add_argument("--layers", help="layer records if not ENGINE's .layers.json")
    export.add_argument("--plan", help="precision plan JSON used for the build")
    export.add_argument("--calibration-cache", help="INT8 calibration cache to include")
    export.add_argument("--accuracy", help="accuracy results JSON to record")
    export.add_argument("--timing", help="timing results JSON to record")
    export.add_argument("--triton", action="store_true", help="also write a Triton model repository")
    export.add_argument("--model-name", default="model", help="Triton model name (default: model)")
    export.add_argument(
        "--max-batch", type=int, help="Triton max_batch_size (default: the profile's max batch, 0 if static)"
    )
    export.add_argument("--instances", type=int, default=1, help="Triton instance count (default 1)")
    export.add_argument(
        "--no-dynamic-batching", action="store_true", help="leave dynamic batching off in the Triton config"
    )
    export.add_argument("--overwrite", action="store_true", help="replace an existing bundle directory")
    export.set_defaults(func=_cli_export)


def _read_json(path: str | None, what: str) -> dict | None:
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise WorkbenchError(f"{path}: no such {what} file.", expected=f"a JSON {what} file") from error
    except json.JSONDecodeError as error:
        raise WorkbenchError(f"{path}: not valid JSON ({error}).", expected=f"a JSON {what} file") from error


def _cli_export(args: argparse.Namespace) -> int:
    triton = None
    if args.triton:
        triton = TritonOptions(
            model_name=args.model_name,
            max_batch_size=args.max_batch,
            instance_count=args.instances,
            dynamic_batching=not args.no_dynamic_batching,
        )
    bundle = export_bundle(
        EngineArtifact.load(args.engine, args.layers),
        args.output,
        plan=PrecisionPlan.load(args.plan) if args.plan else None,
        calibration_cache=args.calibration_cache,
        accuracy=_read_json(args.accuracy, "accuracy"),
        timing=_read_json(args.timing, "timing"),
        triton=triton,
        overwrite=args.overwrite,
    )
    manifest = bundle.manifest
    print(f"bundle      {bundle.path}")
    print(f"engine      {manifest['engine']['bytes'] / 1e6:.2f} MB  sha256 {manifest['engine']['sha256'][:16]}…")
    print(
        f"backend     {manifest['backend']['name']} {manifest['backend']['version']}; runs on compute capability "
        + ", ".join(manifest["target_compute_capabilities"])
    )
    if manifest["triton"]:
        print(f"triton      {bundle.path / manifest['triton']['config']} (validated with Triton's ModelConfig schema)")
    return 0
