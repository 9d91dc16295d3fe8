"""CLI of the engine stage: ``workbench build``, ``workbench fusions`` and ``workbench doctor``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from workbench._args import bounded_int
from workbench._io import validate_outputs
from workbench.engine.build import (
    BuildOptions,
    EngineArtifact,
    engine_from_onnx,
    layers_path_for,
    model_and_shapes,
    parse_shapes_arg,
)
from workbench.engine.doctor import diagnose, format_report
from workbench.engine.layermap import LayerMap
from workbench.engine.records import EngineLayers, engine_layers_from_document, read_layers, read_layers_document
from workbench.errors import WorkbenchError
from workbench.model import load_onnx
from workbench.precision import PrecisionPlan

if TYPE_CHECKING:
    import onnx


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_build(subparsers)
    _register_doctor(subparsers)
    fusions = subparsers.add_parser(
        "fusions",
        help="show which ONNX nodes each engine layer executes; write an HTML page",
        description="Read engine layer records (.layers.json, TensorRT <=10/11 inspector JSON, or a TensorRT-RTX verbose "
        "build log) and summarise the fusions; --html writes a self-contained page (an SVG drawing of the engine: named layer boxes "
        "coloured by precision with the ONNX nodes each fused; works offline).",
    )
    fusions.add_argument("layers", help="MODEL.layers.json, inspector JSON or build log")
    fusions.add_argument(
        "--onnx", help="the ONNX that was built (needed for inspector JSON / logs; optional for .layers.json)"
    )
    fusions.add_argument("--html", help="write the fusions page here")
    fusions.add_argument("--compare", help="another build's layer records: adds a fusion diff (it is the 'before')")
    fusions.add_argument("--compare-onnx", help="the ONNX of the --compare build")
    fusions.add_argument("--json", action="store_true", help="print the full layer map as JSON")
    fusions.set_defaults(func=_cli_fusions)


def _cli_fusions(args: argparse.Namespace) -> int:
    validate_outputs({"--html": args.html}, inputs=[args.layers, args.onnx, args.compare, args.compare_onnx])
    if args.compare_onnx and not args.compare:
        raise WorkbenchError(
            f"--compare-onnx {args.compare_onnx} is the ONNX of a --compare build, but no --compare was given.",
            expected="--compare OTHER.layers.json --compare-onnx OTHER.onnx, or no --compare-onnx",
        )
    layer_map = LayerMap.load(args.layers, args.onnx)
    before = LayerMap.load(args.compare, args.compare_onnx) if args.compare else None
    if args.json:
        print(json.dumps(layer_map.to_json(), indent=2))
    else:
        stats = layer_map.stats()
        audit = layer_map.qdq_audit()
        print(
            f"{layer_map.label}: {stats.onnx_nodes} ONNX nodes ({stats.onnx_compute_nodes} compute) -> "
            f"{stats.engine_layers} engine layers ({stats.inserted_layers} inserted by TensorRT)"
        )
        if layer_map.onnx_order_inferred:
            print("no ONNX given (--onnx): nodes are taken from the layers' metadata, so folded nodes are unknown")
        print(
            f"folded away: {stats.folded_nodes} nodes; largest fusion: {stats.largest_group} nodes; "
            f"nodes split over several layers: {stats.nodes_in_several_layers}"
        )
        print("precision   " + ", ".join(f"{k} {v}" for k, v in stats.by_precision.items()))
        print("layer types " + ", ".join(f"{k} {v}" for k, v in stats.by_type.items()))
        if audit:
            counts: dict[str, int] = {}
            for pair in audit:
                counts[pair.status] = counts.get(pair.status, 0) + 1
            print("Q/DQ pairs  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if before is not None:
            from workbench.viz.engine_view import fusion_diff_of

            summary = fusion_diff_of(before, layer_map).summary()  # keyed by compute nodes (no Q/DQ, Casts)
            print("vs " + before.label + ": " + ", ".join(f"{k} {v}" for k, v in summary.items()))
    if args.html:
        from workbench.engine.lint import lint
        from workbench.engine.precision_check import PrecisionCheck
        from workbench.viz.engine_view import fusions_page

        engine_layers = _engine_layers_of(args.layers)
        document = read_layers_document(args.layers) if args.layers.endswith(".layers.json") else {}
        check = document.get("precision_check")
        report = lint(
            layer_map,
            engine_layers,
            _built_onnx_of(args.layers, args.onnx),
            PrecisionCheck.from_json(check) if isinstance(check, dict) else None,
        )
        path = fusions_page(
            layer_map, args.html, engine_layers=engine_layers, compare_with=before, lint_rows=report.rows()
        )
        print(f"wrote {path} ({Path(path).stat().st_size / 1e6:.2f} MB, self-contained, no script library)")
    return 0


def _built_onnx_of(layers: str, onnx_path: str | None) -> onnx.ModelProto | None:
    """The ONNX that was built: --onnx, or the one a .layers.json names (checked by hash); None if unknown."""
    if onnx_path:
        return load_onnx(onnx_path, check=False).proto
    if layers.endswith(".layers.json"):
        from workbench.engine.built_onnx import built_onnx

        return built_onnx(read_layers_document(layers))
    return None


def _engine_layers_of(path: str) -> EngineLayers:
    """The layer records behind a fusions argument (for the drawing's edges)."""
    if path.endswith(".layers.json"):
        return engine_layers_from_document(read_layers_document(path))
    return read_layers(path)


def _register_build(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build",
        help="build a TensorRT engine from ONNX (works without a GPU via TensorRT-RTX)",
        description="Build a strongly typed engine and write OUT.engine, OUT.layers.json and OUT.build.log.",
    )
    parser.add_argument("model", help="path to an .onnx file, or a zoo model name (see `workbench zoo`)")
    parser.add_argument(
        "-o", "--output", help="engine path (default: <model>.engine next to the model, or ./out/<zoo name>.engine)"
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "fp16", "int8", "fp8"],
        default="fp32",
        help="fp16 rewrites the graph with casts (AutoCast-style); int8 / fp8 build a Q/DQ model from "
        "`workbench calibrate` (--format fp8 for fp8), refusing one without such Q/DQ nodes",
    )
    parser.add_argument("--plan", help="precision plan JSON (per-node fp32/fp16/int8); overrides --precision")
    parser.add_argument(
        "--shapes",
        action="append",
        default=[],
        metavar="NAME:MIN[,OPT,MAX]",
        help="optimization profile for an input (repeatable)",
    )
    parser.add_argument("--workspace-mib", type=bounded_int(1, 2**30), help="memory-pool (workspace) limit in MiB")
    parser.add_argument(
        "--opt-level", type=bounded_int(0, 5), default=3, help="builder optimization level 0..5 (default 3)"
    )
    parser.add_argument(
        "--compute-capability",
        action="append",
        default=[],
        help="target compute capability, RTX only (e.g. SM86; repeatable); FP8 Q/DQ models need SM89 or SM120 "
        "(default for them: every FP8-capable target)",
    )
    parser.add_argument("--timing-cache", help="timing cache file to read and update")
    parser.add_argument(
        "--strict-precision",
        action="store_true",
        help="fail (exit 2, nothing written) when any ONNX node runs at another precision than requested",
    )
    parser.add_argument(
        "--backend",
        choices=["tensorrt", "tensorrt_rtx"],
        help="force a backend (default: tensorrt if importable, else tensorrt_rtx)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the build progress bars")
    parser.add_argument("--json", action="store_true", help="print the artifact description as JSON")
    parser.set_defaults(func=_cli_build)


def _cli_build(args: argparse.Namespace) -> int:
    import json

    shapes_arg = parse_shapes_arg(args.shapes)
    model, zoo_shapes = model_and_shapes(args.model)
    from workbench.model.resources import refuse_string_inputs

    refuse_string_inputs(model.inputs, what=str(model.path))
    shapes = {**zoo_shapes, **shapes_arg}
    output = args.output or (
        str(model.path.with_suffix(".engine")) if os.path.exists(args.model) else f"out/{args.model}.engine"
    )
    validate_outputs(
        {
            "-o": output,
            "layer records": str(layers_path_for(output)),
            "build log": str(Path(output).with_name(Path(output).stem + ".build.log")),
            "--timing-cache": args.timing_cache,
        },
        inputs=[model.path, args.plan],
    )
    options = BuildOptions(
        shapes=shapes,
        precision=args.precision,
        plan=PrecisionPlan.load(args.plan) if args.plan else None,
        workspace_bytes=args.workspace_mib * 1024 * 1024 if args.workspace_mib else None,
        optimization_level=args.opt_level,
        compute_capabilities=tuple(args.compute_capability),
        timing_cache_path=args.timing_cache,
        strict_precision=args.strict_precision,
        progress=not args.no_progress,
        backend=args.backend,
    )
    artifact = engine_from_onnx(model, output, options)
    if args.json:
        print(json.dumps(artifact.to_json(), indent=2))
    else:
        print(format_summary(artifact))
    return 0


def format_summary(artifact: EngineArtifact) -> str:
    summary = artifact.summary()
    lines = [
        f"engine      {artifact.engine_path}  ({artifact.engine_bytes / 1e6:.2f} MB, built in {artifact.build_seconds:.1f} s "
        f"by {artifact.backend} {artifact.backend_version})",
        f"layers      {artifact.layers_path}",
        f"build log   {artifact.build_log_path}",
        f"ONNX nodes  {artifact.onnx_node_count}  ->  engine layers {summary['layers']}",
        "by type     " + ", ".join(f"{k} {v}" for k, v in sorted(summary["by_type"].items(), key=lambda kv: -kv[1])),
        "precision   " + ", ".join(f"{k} {v}" for k, v in sorted(summary["by_precision"].items())),
    ]
    if artifact.options.compute_capabilities:
        lines.append("targets     " + ", ".join(artifact.target_compute_capabilities))
    check = artifact.precision_check
    if check is not None:
        lines.append("precision   " + check.summary())
        lines.extend(f"  mismatch  {line}" for line in check.lines(10))
        if len(check.mismatches) > 10:
            lines.append(f"  ... {len(check.mismatches) - 10} more in {artifact.layers_path} (precision_check)")
    if artifact.quantization is not None:
        lines.append(f"quantized   {artifact.quantization.text()}")
    lines.extend(f"quantized   {w}" for w in artifact.warnings if w.startswith("quantization record ignored"))
    if artifact.profiles:
        lines.append(
            "profile     "
            + "; ".join(f"{k}: {'/'.join('x'.join(map(str, s)) for s in v)}" for k, v in artifact.profiles.items())
        )
    return "\n".join(lines)


def _register_doctor(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="show the TensorRT backend, GPU and whether engines can run here")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=_cli_doctor)


def _cli_doctor(args: argparse.Namespace) -> int:
    report = diagnose()
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    return 0
