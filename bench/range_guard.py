"""The calibration range guard on the zoo models: how many ranges it changes and what that does to the task metric.

For each model: the entropy ranges with the guard (what `calibrate` uses) and without it (the method's raw amax),
the largest share of calibration values a raw entropy range clips, and the task metric of FP32, raw-entropy INT8 and
guarded INT8 on the same evaluation samples. Prints a table and writes JSON.

    python bench/range_guard.py --limit 256 -o bench/results/range_guard_2026-12-05.json digits-cnn ocr-cls ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings
from pathlib import Path


def measure(name: str, limit: int) -> dict[str, object]:
    from workbench.calib.methods import clipped_fraction, compute_amax
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry(name)
    start = time.perf_counter()
    session = CalibrationSession(entry.onnx_path(), entry=entry, progress=False)
    statistics = session.statistics()
    guarded = statistics.ranges("entropy")
    raw_amax = {n: compute_amax(h, "entropy") for n, h in statistics.histograms.items()}
    raw = dataclasses.replace(guarded, amax={n: (a if a > 0 else 1.0) for n, a in raw_amax.items()})
    live = [n for n, h in statistics.histograms.items() if h.amax > 0]
    clipped = {n: clipped_fraction(statistics.histograms[n], raw_amax[n]) for n in live}
    fp32 = session.evaluate(limit=limit)
    metric_raw = session.evaluate(session.quantize(raw), limit=limit)
    metric_guarded = session.evaluate(session.quantize(guarded), limit=limit)
    return {
        "model": name,
        "tensors": len(statistics.histograms),
        "calibration_samples": statistics.num_samples,
        "raw_entropy_max_clipped": max(clipped.values()) if clipped else 0.0,
        "raw_entropy_over_5pct": sum(1 for v in clipped.values() if v > 0.05),
        "ranges_changed": len(guarded.range_notes),
        "notes": guarded.range_notes,
        "metric": fp32.name,
        "samples": fp32.n_samples,
        "fp32": fp32.value,
        "int8_raw_entropy": metric_raw.value,
        "int8_guarded": metric_guarded.value,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--limit", type=int, default=256, help="evaluation samples per model")
    parser.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    print(
        f"{'model':20s} {'tensors':>7s} {'>5% clip':>8s} {'max clip':>8s} {'changed':>7s}  metric: fp32 / raw / guarded"
    )
    for name in args.models:
        row = measure(name, args.limit)
        rows.append(row)
        print(
            f"{name:20s} {row['tensors']:7d} {row['raw_entropy_over_5pct']:8d} {100 * row['raw_entropy_max_clipped']:7.2f}% "
            f"{row['ranges_changed']:7d}  {row['metric']} {row['fp32']:.4f} / {row['int8_raw_entropy']:.4f} / "
            f"{row['int8_guarded']:.4f} ({row['samples']} samples, {row['seconds']} s)",
            flush=True,
        )
    if args.output:
        args.output.write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
