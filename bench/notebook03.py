"""Notebook 03 with its defaults, timed: does it keep its promise, and how long does it take?

Executes ``notebooks/03_int8_calibration.ipynb`` headless exactly as shipped (ocr-rec, all 300 evaluation samples,
the search over formats with its default budget), then prints one table and writes JSON:

* seconds per code cell and in all, with the load average before and after (a busy machine says so);
* the INT8 row's paired 95% interval of the difference to FP32, and whether it excludes zero (the notebook's promise);
* the search's summary and every point of the Pareto front across formats.

    .venv/bin/python bench/notebook03.py            # -> bench/results/notebook03_defaults.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def _cell_seconds(cell: dict) -> float | None:
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return None
    parse = dt.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(REPO / "bench" / "results" / "notebook03_defaults.json"))
    args = parser.parse_args()
    from notebook_runner import execute_notebook

    load_before = os.getloadavg()
    run = execute_notebook("03_int8_calibration.ipynb", timeout_s=1800)
    load_after = os.getloadavg()
    cells = [
        {"cell": index, "first_line": cell.source.splitlines()[0][:70] if cell.source else "", "seconds": seconds}
        for index, cell in enumerate(run.notebook.cells)
        if cell.cell_type == "code" and (seconds := _cell_seconds(cell)) is not None
    ]
    text = run.stream_text
    int8 = next((line for line in text.splitlines() if line.startswith("INT8 (max)") and "vs FP32" in line), "")
    found = re.search(r"vs FP32 ([+-][\d.]+) \[([+-][\d.]+), ([+-][\d.]+)\]", int8)
    delta, low, high = (float(v) for v in found.groups()) if found else (None, None, None)
    summary = next((line for line in text.splitlines() if " task evaluations (+1 FP32) " in line), "")
    front = [  # the front-across-formats cell's lines (not the search's "front:" lines by INT8 share)
        line.strip()
        for line in text.splitlines()
        if line.startswith("  ") and " MB" in line and "(n=" in line and not line.strip().startswith("front:")
    ]
    document = {
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds_total": run.seconds,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "cells": cells,
        "int8_row": int8,
        "int8_vs_fp32": {"delta": delta, "low": low, "high": high},
        "interval_excludes_zero": high is not None and high < 0,
        "search": summary,
        "front_across_formats": front,
    }
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print(f"{'cell':>5}  {'seconds':>8}  first line")
    for cell in cells:
        print(f"{cell['cell']:>5}  {cell['seconds']:8.1f}  {cell['first_line']}")
    print(f"{'all':>5}  {run.seconds:8.1f}  (load average {load_before[0]:.1f} before, {load_after[0]:.1f} after)")
    print(f"\nINT8 vs FP32: {int8.strip() or 'not printed'}")
    print(f"interval excludes zero: {document['interval_excludes_zero']}")
    print(f"search: {summary or 'not printed'}")
    for line in front:
        print(f"  {line}")
    print(f"\nwrote {output}")
    return 0 if document["interval_excludes_zero"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
