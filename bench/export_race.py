"""`workbench export -o NEW` while another process creates NEW: is the other process's folder ever swapped out?

Issue 23 found a folder created at the ``-o`` path while an export ran swapped out and deleted in 3 of 15 tries. Here
the race is made as likely as it can be: a thread watches the parent folder and creates ``NEW/user.txt`` the moment
the export's staging folder (``.NEW.<pid>.*.tmp``) appears, so the folder always exists before the bundle is placed.
Each try runs the real CLI (``python -m workbench export``) on a real engine built here. Prints a table and writes
JSON (``--json``).

    python bench/export_race.py [--tries 15] [--repo PATH_OF_A_CHECKOUT] [--json bench/results/export_race.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _try_once(repo: Path, engine: Path, parent: Path) -> str:
    parent.mkdir(parents=True)
    target = parent / "NEW"
    stop = threading.Event()

    def squat() -> None:
        while not stop.is_set():
            if any(p.name.startswith(".NEW.") for p in parent.iterdir()):
                try:
                    target.mkdir()
                    (target / "user.txt").write_text("mine")
                except OSError:
                    pass
                return
            time.sleep(0.0005)

    thread = threading.Thread(target=squat)
    thread.start()
    run = subprocess.run(
        [sys.executable, "-m", "workbench", "export", str(engine), "-o", str(target)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(repo)},
        cwd=parent,  # `python -m` puts the working folder first on sys.path: not a checkout's root
    )
    stop.set()
    thread.join()
    if not (target / "user.txt").exists():
        return f"lost (exit {run.returncode})"
    return "kept, export refused" if run.returncode == 2 else f"kept, exit {run.returncode}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=15)
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose `workbench` runs the exports")
    parser.add_argument("--json", type=Path, help="write the counts here")
    args = parser.parse_args()
    from workbench.engine import engine_for_model  # the engine is built by this checkout; --repo's CLI exports it

    work = Path(tempfile.mkdtemp(prefix="bench-export-race-"))
    engine = engine_for_model("digits-cnn", "fp32", work / "engine").engine_path
    outcomes: dict[str, int] = {}
    for index in range(args.tries):
        outcome = _try_once(args.repo, engine, work / f"try{index}")
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    print(f"{'outcome':<24} tries (of {args.tries})  [{args.repo}]")
    for outcome, count in sorted(outcomes.items()):
        print(f"{outcome:<24} {count}")
    if args.json:
        commit = subprocess.run(["git", "-C", str(args.repo), "rev-parse", "HEAD"], capture_output=True, text=True)
        record = {"repo": str(args.repo), "commit": commit.stdout.strip(), "tries": args.tries, "outcomes": outcomes}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
