"""Panels in the page (issue 24): how soon each notebook shows progress after Run All, how long the progress text a
person sees ever stands still while the first run works (the page on time, and separately where the browser itself got
no CPU), how late the page's own 250 ms sampler ran, and each notebook's seconds in the browser test.

    PYTHONPATH=. WORKBENCH_CACHE=.cache/zoo .venv/bin/python bench/panels.py [--out panels_YYYY-MM-DD] [--from-artifacts]

Runs ``tests/test_browser.py::test_every_notebook_in_chromium_at_900_1280_and_1920_px`` (JupyterLab + headless
Chromium; notebooks 00, 05, 01, 03, 04) and reads the numbers it leaves in test-artifacts/browser-notebooks.json
(``--from-artifacts``: read that file from the last run only). Prints a table and writes bench/results/<--out>.json
with the load average before and after: run it on a quiet machine, the page's lateness measures the CPU it got.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ARTIFACT = REPO / "test-artifacts" / "browser-notebooks.json"
TEST = "tests/test_browser.py::test_every_notebook_in_chromium_at_900_1280_and_1920_px"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=f"panels_{time.strftime('%Y-%m-%d', time.gmtime())}")
    parser.add_argument("--from-artifacts", action="store_true", help="only read the last test run's numbers")
    args = parser.parse_args()
    load_before = os.getloadavg()
    passed = None
    if not args.from_artifacts:
        started = time.monotonic()
        passed = subprocess.run([sys.executable, "-m", "pytest", TEST, "-q", "-x"], cwd=REPO).returncode == 0
        print(f"browser test {'passed' if passed else 'FAILED'} in {time.monotonic() - started:.0f} s")
    measured = json.loads(ARTIFACT.read_text())
    rows = []
    for notebook, cadence in measured["cadence"].items():
        rows.append(
            {
                "notebook": notebook,
                "progress_after_run_all_s": round(measured["first_progress_s"].get(notebook, float("nan")), 2),
                "longest_still_ms_page_on_time": cadence["still_ms"],
                "longest_still_ms_page_starved": cadence["starved_still_ms"],
                "page_sampler_latest_ms": cadence["late_ms"],
                "progress_busy_s": cadence["busy_s"],
                "samples_out_of_view": cadence["hidden"],
                "seconds_in_test": round(measured["seconds"].get(notebook, float("nan"))),
            }
        )
    header = list(rows[0]) if rows else []
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[key]) for key in header))
    result = {
        "test": TEST,
        "test_passed": passed,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    out = REPO / "bench" / "results" / f"{args.out}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out.relative_to(REPO)}")
    return 0 if passed is not False else 1


if __name__ == "__main__":
    raise SystemExit(main())
