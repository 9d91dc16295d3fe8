"""CLI of the model stage: ``workbench model MODEL`` says what a model is (I/O, opset, ops, subgraph nodes)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench.model.graph import subgraph_node_count
from workbench.model.onnx_model import OnnxModel, load_onnx


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model",
        help="load and check an ONNX model; print its inputs, outputs, opset and op counts",
        description="Load MODEL (an .onnx path or a zoo name), run the ONNX checker and describe it.",
    )
    parser.add_argument("model", help="path to an .onnx file, or a zoo model name (see `workbench zoo`)")
    parser.add_argument("--json", action="store_true", help="print the description as JSON")
    parser.set_defaults(func=_cli_model)


def describe(model: OnnxModel) -> dict[str, Any]:
    """What `workbench model` prints: identity, I/O, opset, node counts (top level and inside subgraphs), ops."""
    return {
        "path": str(model.path),
        "sha256": model.sha256,
        "producer": model.producer,
        "opset": model.opset,
        "inputs": [spec.to_json() for spec in model.inputs],
        "outputs": [spec.to_json() for spec in model.outputs],
        "nodes": model.node_count,
        "subgraph_nodes": subgraph_node_count(model.proto.graph),
        "initializers": len(model.proto.graph.initializer),
        "ops": model.op_counts(),
    }


def _cli_model(args: argparse.Namespace) -> int:
    from workbench.zoo import resolve_model

    path, _entry = resolve_model(args.model)
    info = describe(load_onnx(path))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(
        f"model       {info['path']}  (sha256 {info['sha256'][:16]}…, {info['producer'] or 'unknown producer'}, opset {info['opset']})"
    )
    for kind in ("inputs", "outputs"):
        for spec in info[kind]:
            print(f"{kind[:-1]:<11} {spec['name']}  {spec['dtype']}  [{', '.join(str(d) for d in spec['shape'])}]")
    print(
        f"nodes       {info['nodes']} top level, {info['subgraph_nodes']} inside If/Loop/Scan bodies; "
        f"{info['initializers']} initializers"
    )
    print("ops         " + ", ".join(f"{op} {count}" for op, count in info["ops"].items()))
    return 0
