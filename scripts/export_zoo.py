"""Materialize every zoo model and report what each one is: node count, time to materialize, FP32 task metric.

    .venv/bin/python scripts/export_zoo.py [--cache DIR] [--limit N] [--json OUT.json] [NAME ...]

With ``--cache`` pointing at an empty folder the materialization times are those of a first run (the torch exports
of efficientnet-lite0 and minilm included). Metrics are measured with ONNX Runtime CPU, optimizations off.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="zoo names (default: all)")
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (sets WORKBENCH_CACHE)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N samples")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    args = parser.parse_args()
    if args.cache is not None:
        os.environ["WORKBENCH_CACHE"] = str(args.cache)

    from workbench._io import write_json_atomic
    from workbench.zoo import entry_names, get_entry

    rows = []
    for name in args.names or entry_names():
        entry = get_entry(name)
        was_cached = entry.is_cached()
        started = time.perf_counter()
        path = entry.onnx_path()
        materialize_seconds = time.perf_counter() - started
        model = entry.load()
        started = time.perf_counter()
        result = entry.evaluate_onnx(path, limit=args.limit)
        eval_seconds = time.perf_counter() - started
        row = {
            "name": name,
            "path": str(path),
            "bytes": path.stat().st_size,
            "nodes": model.node_count,
            "opset": model.opset,
            "inputs": [spec.to_json() for spec in model.inputs],
            "was_cached": was_cached,
            "materialize_seconds": round(materialize_seconds, 2),
            "metric": result.to_json(),
            "eval_seconds": round(eval_seconds, 2),
        }
        rows.append(row)
        extra = {k: v for k, v in result.details.items() if isinstance(v, float)}
        print(
            f"{name:20s} nodes {model.node_count:4d}  opset {model.opset:2d}  {path.stat().st_size / 1e6:6.1f} MB  "
            f"materialize {materialize_seconds:6.2f} s{' (cached)' if was_cached else ''}  "
            f"{result.name} = {result.value:.4f} on {result.n_samples}  "
            + "  ".join(f"{k} = {v:.4f}" for k, v in extra.items())
            + f"  (eval {eval_seconds:.1f} s)",
            flush=True,
        )
    if args.json:
        write_json_atomic(args.json, {"models": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
