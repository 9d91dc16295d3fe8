"""`workbench demo`: the main job on built-in defaults.

Fetches the default zoo model, builds its engine with the available TensorRT backend, and prints the engine's
layer summary and where every file went.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def run_demo(model_name: str | None = None, out_dir: str | Path = "out") -> dict[str, Any]:
    from workbench.backend import engine_runnable, get_backend
    from workbench.build import BuildOptions, build_engine, format_summary
    from workbench.zoo import DEFAULT_MODEL, get_entry

    out_dir = Path(out_dir)
    entry = get_entry(model_name or DEFAULT_MODEL)
    backend = get_backend()
    print(f"[1/3] model      {entry.name}: {entry.description}")
    model = entry.load()
    print(f"      ONNX       {model.path} ({model.node_count} nodes, opset {model.opset})")
    print(f"[2/3] build      FP32 engine with {backend.name} {backend.version}")
    artifact = build_engine(model, out_dir / f"{entry.name}.fp32.engine",
                            BuildOptions(shapes=dict(entry.input_profiles()), timing_cache_path=str(out_dir / "timing.cache")))
    print(format_summary(artifact))
    can_run, why = engine_runnable(backend)
    print(f"[3/3] run        {'this machine can run the engine' if can_run else 'engine not executed here: ' + why}")
    return {"model": entry.name, "artifact": artifact.to_json(), "engine_can_run": can_run, "reason": why}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="the main job on built-in defaults (fetch model, build engine, summarize)")
    parser.add_argument("--model", help="zoo model name (default: the zoo's default model)")
    parser.add_argument("--out", default="out", help="output folder (default: ./out)")
    parser.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    run_demo(args.model, args.out)
    return 0
