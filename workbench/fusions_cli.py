"""CLI: ``workbench fusions`` (layer map summary and self-contained HTML page) and ``workbench export`` (bundle)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.errors import WorkbenchError


def register(subparsers: argparse._SubParsersAction) -> None:
    fusions = subparsers.add_parser(
        "fusions", help="show which ONNX nodes each engine layer executes; write an HTML page",
        description="Read engine layer records (.layers.json, TensorRT <=10/11 inspector JSON, or a TensorRT-RTX verbose "
        "build log) and summarise the fusions; --html writes a self-contained page (plotly inline, works offline).")
    fusions.add_argument("layers", help="MODEL.layers.json, inspector JSON or build log")
    fusions.add_argument("--onnx", help="the ONNX that was built (needed for inspector JSON / logs; optional for .layers.json)")
    fusions.add_argument("--html", help="write the fusions page here")
    fusions.add_argument("--compare", help="another build's layer records: adds a fusion diff (it is the 'before')")
    fusions.add_argument("--compare-onnx", help="the ONNX of the --compare build")
    fusions.add_argument("--max-items", type=int, default=400, help="collapse ONNX nodes by name scope above this many (default 400)")
    fusions.add_argument("--json", action="store_true", help="print the full layer map as JSON")
    fusions.set_defaults(func=_cli_fusions)

    export = subparsers.add_parser(
        "export", help="write an engine bundle (engine, manifest.json, layer map, optional Triton repository)",
        description="Write BUNDLE/ atomically: model.engine, manifest.json (ONNX sha256, backend and version, target "
        "compute capabilities, precision plan, layer map, build options, and calibration cache / accuracy / timing when "
        "given), model.layers.json, and with --triton a Triton model repository validated against Triton's schema.")
    export.add_argument("engine", help="engine written by `workbench build` (its .layers.json must lie beside it)")
    export.add_argument("-o", "--output", required=True, help="bundle directory to create")
    export.add_argument("--layers", help="layer records if not ENGINE's .layers.json")
    export.add_argument("--plan", help="precision plan JSON used for the build")
    export.add_argument("--calibration-cache", help="INT8 calibration cache to include")
    export.add_argument("--accuracy", help="accuracy results JSON to record")
    export.add_argument("--timing", help="timing results JSON to record")
    export.add_argument("--triton", action="store_true", help="also write a Triton model repository")
    export.add_argument("--model-name", default="model", help="Triton model name (default: model)")
    export.add_argument("--max-batch", type=int, help="Triton max_batch_size (default: the profile's max batch, 0 if static)")
    export.add_argument("--instances", type=int, default=1, help="Triton instance count (default 1)")
    export.add_argument("--no-dynamic-batching", action="store_true", help="leave dynamic batching off in the Triton config")
    export.add_argument("--overwrite", action="store_true", help="replace an existing bundle directory")
    export.set_defaults(func=_cli_export)


def _cli_fusions(args: argparse.Namespace) -> int:
    from workbench.layermap import LayerMap, diff_layer_maps

    layer_map = LayerMap.load(args.layers, args.onnx)
    before = LayerMap.load(args.compare, args.compare_onnx) if args.compare else None
    if args.json:
        print(json.dumps(layer_map.to_json(), indent=2))
    else:
        stats = layer_map.stats()
        audit = layer_map.qdq_audit()
        print(f"{layer_map.label}: {stats.onnx_nodes} ONNX nodes ({stats.onnx_compute_nodes} compute) -> "
              f"{stats.engine_layers} engine layers ({stats.inserted_layers} inserted by TensorRT)")
        if layer_map.onnx_order_inferred:
            print("no ONNX given (--onnx): nodes are taken from the layers' metadata, so folded nodes are unknown")
        print(f"folded away: {stats.folded_nodes} nodes; largest fusion: {stats.largest_group} nodes; "
              f"nodes split over several layers: {stats.nodes_in_several_layers}")
        print("precision   " + ", ".join(f"{k} {v}" for k, v in stats.by_precision.items()))
        print("layer types " + ", ".join(f"{k} {v}" for k, v in stats.by_type.items()))
        if audit:
            counts: dict[str, int] = {}
            for pair in audit:
                counts[pair.status] = counts.get(pair.status, 0) + 1
            print("Q/DQ pairs  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if before is not None:
            summary = diff_layer_maps(before, layer_map).summary()
            print("vs " + before.label + ": " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if args.html:
        from workbench.viz.fusion_figures import fusions_html

        path = fusions_html(layer_map, args.html, compare_with=before, max_items=args.max_items)
        print(f"wrote {path} ({Path(path).stat().st_size / 1e6:.1f} MB, self-contained)")
    return 0


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
    from workbench.export import TritonOptions, export_bundle
    from workbench.precision import PrecisionPlan

    triton = None
    if args.triton:
        triton = TritonOptions(model_name=args.model_name, max_batch_size=args.max_batch, instance_count=args.instances,
                               dynamic_batching=not args.no_dynamic_batching)
    bundle = export_bundle(
        args.engine, args.output, layers_path=args.layers,
        plan=PrecisionPlan.load(args.plan) if args.plan else None,
        calibration_cache=args.calibration_cache, accuracy=_read_json(args.accuracy, "accuracy"),
        timing=_read_json(args.timing, "timing"), triton=triton, overwrite=args.overwrite,
    )
    manifest = bundle.manifest
    print(f"bundle      {bundle.path}")
    print(f"engine      {manifest['engine']['bytes'] / 1e6:.2f} MB  sha256 {manifest['engine']['sha256'][:16]}…")
    print(f"backend     {manifest['backend']['name']} {manifest['backend']['version']}; runs on compute capability "
          + ", ".join(manifest["target_compute_capabilities"]))
    if manifest["triton"]:
        print(f"triton      {bundle.path / manifest['triton']['config']} (validated with Triton's ModelConfig schema)")
    return 0
