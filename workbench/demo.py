"""`workbench demo`: the main job on built-in defaults.

Runs the quickstart flow headless (:mod:`workbench.flow.stages`: builds of every precision variant, the accuracy-target
search whose pick is the mixed engine, task metrics, the choice, timing, export), prints one line per stage and the
engine chosen, writes ``out/report.html`` (a self-contained page) and ``out/run.json`` next to the engines and the
exported bundle, and returns the typed run. An engine whose verdict is bad is not exported unless asked
(``--export-anyway``).
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workbench._args import level_or_off
from workbench._io import record_outputs, refuse_foreign_outputs, validate_outputs, write_json_atomic
from workbench.flow import QuickstartConfig, QuickstartRun, QuickstartSession, StageResult, StageStatus
from workbench.flow.config import SEARCH_BUDGET_RANGE, SettingValue
from workbench.log import warnings_as_lines
from workbench.precision.variant import CALIBRATION_METHODS, PRECISION_CHOICES
from workbench.progress import ProgressEvent, nested_detail
from workbench.report import diagnose, write_report
from workbench.timing.limits import STREAMS_EXPECTED
from workbench.zoo.onnx_file import OnnxFileEntry

_MARK = {
    StageStatus.DONE: "ok  ",
    StageStatus.FAILED: "FAIL",
    StageStatus.OFF: "off ",
    StageStatus.NOT_APPLICABLE: "n/a ",
    StageStatus.BLOCKED: "BLCK",
    StageStatus.CANCELLED: "cncl",
    StageStatus.PENDING: "... ",
}
STILL_RUNNING_EVERY_S = 15.0
DEFAULTS = QuickstartConfig()
DEMO_FILES = ("report.html", "run.json")  # never overwritten unless an earlier demo wrote them (issue 23)


class StillRunning:
    """Prints ``... TITLE: still running, N s`` every ``every_s`` while a stage runs, so a long stage (an engine build
    of a 2,000-node model takes a minute or more) never leaves the terminal silent, with what the stage reported it
    does now (``evaluation 3 of 8, 38 %: ...``) when it reports steps. Plain lines, not a tqdm bar: the output is read
    in CI logs and files as much as in terminals."""

    def __init__(self, every_s: float = STILL_RUNNING_EVERY_S) -> None:
        self.every_s = every_s
        self.detail = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, title: str, index: int, total: int) -> None:
        self.stop()
        self._stop = threading.Event()
        self.detail = ""
        started = time.perf_counter()

        def beat(stop: threading.Event = self._stop) -> None:
            while not stop.wait(self.every_s):
                elapsed = time.perf_counter() - started
                now = f" ({self.detail})" if self.detail else ""
                print(f"[{index + 1:2d}/{total}] ...  {title}: still running, {elapsed:.0f} s{now}", flush=True)

        self._thread = threading.Thread(target=beat, name="demo-still-running", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __call__(self, event: ProgressEvent) -> None:
        """A stage's event starts (or, at the end, stops) the beat; a nested task's event (an evaluation of the
        search, a calibration step) is the running stage's detail."""
        if event.task != "stage":
            detail = nested_detail(event)
            if detail is not None:
                self.detail = detail
        elif event.kind == "finish":
            self.stop()
        else:
            self.start(event.message, event.index, event.total or 0)


@dataclass(frozen=True)
class DemoResult:
    """What ``demo`` did: the typed run and where its report went."""

    run: QuickstartRun
    report: Path

    @property
    def failed(self) -> list[StageResult]:
        return [result for result in self.run.stages.values() if result.status is StageStatus.FAILED]


def run_demo(model_name: str | None = None, out_dir: str | Path = "out", **settings: SettingValue) -> DemoResult:
    """Run the quickstart flow and write ``<out_dir>/report.html`` (and ``run.json``); returns the typed run."""
    refuse_foreign_outputs(out_dir, DEMO_FILES, label="--out")
    if model_name:
        settings["model"] = model_name
    config = QuickstartConfig(out_dir=str(out_dir)).validated(**settings)
    print(
        f"quickstart  model {config.model}, precision {config.precision}, calibration {config.calibration_method}, "
        f"{config.streams} stream(s) x batch {config.batch}, output {config.out_dir}/",
        flush=True,
    )

    heartbeat = StillRunning()

    def show(result: StageResult, index: int, total: int) -> None:
        heartbeat.stop()
        print(
            f"[{index + 1:2d}/{total}] {_MARK[result.status]} {result.title:<34} {result.seconds:6.1f} s  {result.text}",
            flush=True,
        )

    session = QuickstartSession(config, progress=heartbeat, on_result=show)
    entry = session.prepare().entry
    if isinstance(entry, OnnxFileEntry):
        print(f"note        {entry.inputs_note}", flush=True)
        for note in entry.notes:
            print(f"note        {note}", flush=True)
    try:
        run = session.run_all()
    finally:
        heartbeat.stop()
    report = write_report(run, Path(out_dir) / "report.html")
    write_json_atomic(Path(out_dir) / "run.json", run.to_json())
    record_outputs(out_dir, [Path(out_dir) / name for name in DEMO_FILES])
    print("diagnosis:")
    for verdict in diagnose(run):
        print(f"  - {verdict.topic}: {verdict.text}")
    chosen = run.selection
    if chosen is not None:
        exported = f"exported to {run.bundle.path}" if run.bundle else f"not exported ({run.stage('export').status})"
        print(f"engine      {chosen.variant} ({chosen.choice.level}): {chosen.engine.engine_path}; {exported}")
    export = run.stage("export")
    if export.status is StageStatus.BLOCKED:
        print(f"export      blocked: {export.reason}")
    print(f"report      {report}  (self-contained; open it in a browser, no network needed)")
    return DemoResult(run, report)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="the main job: the quickstart flow on built-in defaults, writes out/report.html"
    )
    parser.add_argument(
        "--model",
        help="zoo model name (default: ocr-cls, ~25 s on 2 cores) or a path to your own .onnx file: it runs on "
        "seeded random inputs (or --data) and its metric is agreement with its own FP32 outputs judged on the worst "
        "output (not task accuracy), or top-1 accuracy when the --data batches carry 'labels'",
    )
    parser.add_argument("--out", default="out", help="output folder (default: ./out)")
    parser.add_argument(
        "--data",
        help="with your own .onnx file: a folder of .npz batches keyed by input name (batch first); the first half "
        "calibrates INT8, the second half is the evaluation set (default: seeded random inputs)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        help="engine to time and export (default auto: the cheapest within --max-metric-drop of FP32)",
    )
    parser.add_argument(
        "--max-metric-drop",
        type=float,
        help=f"task-metric loss vs FP32 an engine may have and be chosen (default {DEFAULTS.max_metric_drop:g})",
    )
    parser.add_argument(
        "--confidence",
        type=level_or_off,
        help=f"level at which the search calls its target met and the rule calls a loss within --max-metric-drop "
        f"(the worst end of the paired interval against FP32; default {DEFAULTS.confidence:g}), or off: the point "
        "estimate decides both",
    )
    parser.add_argument("--calibration-method", choices=CALIBRATION_METHODS, help="INT8 range method")
    parser.add_argument("--streams", type=int, help=f"pipeline streams (lanes), {STREAMS_EXPECTED}")
    parser.add_argument("--batch", type=int, help="samples per request")
    parser.add_argument(
        "--calibration-samples",
        type=int,
        help=f"samples for the INT8 range statistics (default {DEFAULTS.calibration_samples})",
    )
    parser.add_argument(
        "--eval-samples",
        type=int,
        help=f"evaluation samples per precision for the task metric (default {DEFAULTS.evaluation_samples})",
    )
    parser.add_argument(
        "--search-budget",
        type=int,
        help=f"task evaluations for the accuracy-target mixed-precision search, whose pick is the mixed engine "
        f"({SEARCH_BUDGET_RANGE[0]}..{SEARCH_BUDGET_RANGE[1]}, default {DEFAULTS.search_budget}; 0 turns it off)",
    )
    parser.add_argument(
        "--export-anyway",
        action="store_true",
        help="export the chosen engine even when its verdict is bad (by default the export stage is blocked then)",
    )
    parser.set_defaults(func=warnings_as_lines(_cli))


def _cli(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        from workbench.errors import WorkbenchError

        raise WorkbenchError(f"--out {out}: exists and is not a folder.", expected="an output folder")
    validate_outputs({"--out report.html": out / "report.html", "--out run.json": out / "run.json"})
    refuse_foreign_outputs(out, DEMO_FILES, label="--out")
    if args.data and not args.model:
        from workbench.errors import WorkbenchError

        raise WorkbenchError(
            f"--data {args.data} was given without --model.", expected="--model my.onnx --data DIR (data for your file)"
        )
    if args.model:
        from workbench.flow import quickstart_entry

        quickstart_entry(args.model, args.data or "")  # an unknown name, unreadable file or bad data: before any work
    settings = {
        key: value
        for key, value in {
            "precision": args.precision,
            "calibration_method": args.calibration_method,
            "streams": args.streams,
            "batch": args.batch,
            "calibration_samples": args.calibration_samples,
            "evaluation_samples": args.eval_samples,
            "max_metric_drop": args.max_metric_drop,
            "confidence": None if args.confidence is None else 0.0 if args.confidence == "off" else args.confidence,
            "search_budget": args.search_budget,
            "data": args.data,
            "export_bad": True if args.export_anyway else None,
        }.items()
        if value is not None
    }
    result = run_demo(args.model, args.out, **settings)
    if result.failed:
        from workbench.errors import WorkbenchError

        failed = "; ".join(f"{stage.name} ({stage.reason[:160]})" for stage in result.failed)
        raise WorkbenchError(
            f"{len(result.failed)} stage(s) failed: {failed}. The report shows what ran: {result.report}",
            expected="every stage done, or off / not applicable / blocked with its reason",
        )
    return 0
