"""CLI of the precision stage: ``workbench precision MODEL`` writes the ONNX a precision plan becomes.

TensorRT 11 builds strongly typed networks, so a plan is realised in the graph: FP16 nodes get casts (AutoCast rules,
each node kept FP32 is listed with its rule); ``--qdq`` shows where TensorRT's rules would put INT8 Q/DQ pairs
(the scales themselves come from ``workbench calibrate``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from workbench._io import atomic_path
from workbench.errors import WorkbenchError
from workbench.model import load_onnx
from workbench.precision.autocast import apply_precision_plan
from workbench.precision.plan import PRECISIONS, PrecisionPlan
from workbench.precision.qdq_rules import placement_for_model


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "precision",
        help="rewrite an ONNX for a precision plan (FP16 casts) or show INT8 Q/DQ placement",
        description="Write the ONNX that a precision plan becomes (FP16 by casts, AutoCast rules) and say which nodes "
        "stayed FP32 and why; with --qdq, list where TensorRT's explicit-quantization rules place Q/DQ pairs.",
    )
    parser.add_argument("model", help="path to an .onnx file, or a zoo model name (see `workbench zoo`)")
    parser.add_argument("-o", "--output", help="write the rewritten ONNX here")
    parser.add_argument(
        "--default", choices=PRECISIONS, default="fp16", help="plan default when no --plan (default fp16)"
    )
    parser.add_argument("--plan", help="precision plan JSON (per-node fp32/fp16/int8); overrides --default")
    parser.add_argument("--qdq", action="store_true", help="show where INT8 Q/DQ pairs go for the plan's int8 nodes")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=_cli_precision)


def _cli_precision(args: argparse.Namespace) -> int:
    from workbench.zoo import resolve_model

    path, _entry = resolve_model(args.model)
    from workbench._io import validate_outputs

    validate_outputs({"-o": args.output}, inputs=[path, args.plan])
    model = load_onnx(path)
    plan = PrecisionPlan.load(args.plan) if args.plan else PrecisionPlan(default=args.default)
    report: dict[str, Any] = {"model": str(model.path), "plan": plan.to_json()}
    if args.qdq:
        int8_plan = (
            plan if (plan.default == "int8" or "int8" in plan.overrides.values()) else PrecisionPlan(default="int8")
        )
        report["qdq_placement"] = placement_for_model(model.proto, int8_plan).to_json()
    if plan.default == "fp16" or "fp16" in plan.overrides.values():
        result = apply_precision_plan(model, plan)
        report["autocast"] = result.to_json()
        if args.output:
            with atomic_path(args.output) as tmp:
                import onnx

                onnx.save(result.proto, str(tmp))
            report["output"] = args.output
    elif args.output:
        raise WorkbenchError(
            "the plan has no fp16 nodes, so there is nothing to rewrite.",
            expected="--default fp16 or a plan with fp16 entries (INT8 Q/DQ comes from `workbench calibrate`)",
        )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    if "autocast" in report:
        cast = report["autocast"]
        print(
            f"fp16        {len(cast['fp16_nodes'])} nodes compute in float16; {cast['casts_added']} casts added, "
            f"{cast['initializers_converted']} initializers converted"
        )
        if cast["kept_fp32_by_rule"]:
            print("kept fp32   " + ", ".join(f"{rule} {n}" for rule, n in cast["kept_fp32_by_rule"].items()))
    if "qdq_placement" in report:
        placement = report["qdq_placement"]
        print(
            f"int8        {len(placement['int8_nodes'])} nodes; Q/DQ on {len(placement['activations'])} activation "
            f"tensors and {len(placement['weights'])} weights; {len(placement['excluded'])} quantizable nodes left out"
        )
        for node, reason in list(placement["excluded"].items())[:10]:
            print(f"  left out  {node}: {reason}")
    if "output" in report:
        print(f"wrote       {report['output']}")
    return 0
