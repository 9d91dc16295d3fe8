"""The quickstart session: holds a run and re-runs only what a changed setting affects.

:meth:`QuickstartSession.plan_update` is the one place that knows which stages a change re-runs (the whole run for
a new model, data or output folder; else from the first stage that reads a changed setting); the notebook panel
asks it once per change to mark those stages stale, and :meth:`QuickstartSession.update` follows the same plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from workbench.engine import detect_gpu
from workbench.engine.backend import get_backend
from workbench.flow.artifacts import Environment, QuickstartRun, StageResult, StageStatus
from workbench.flow.config import QuickstartConfig, SettingValue
from workbench.flow.stages import STAGE_BY_NAME, STAGE_NAMES, STAGES, cancel_stages, run_stage
from workbench.flow.workspace import Workspace
from workbench.progress import ProgressEvent, ProgressFn, report

# progress: a ProgressEvent(task="stage", name=stage) before each stage (and a "finish" after the last); a callback
# returning False cancels the stages not yet run
ResultFn = Callable[[StageResult, int, int], None]  # (result, index, total) after each stage

# settings every stage depends on (a new workspace): no stage lists them among what it reads
WHOLE_RUN_SETTINGS = frozenset({"model", "data", "out_dir"})


@dataclass(frozen=True)
class UpdatePlan:
    """What a change of settings does: the validated config, what changed, and which stages re-run (in order)."""

    config: QuickstartConfig
    changed: frozenset[str]
    stages: tuple[str, ...]  # empty: nothing to re-run
    whole_run: bool  # every earlier result is cleared first (a new model, data or output folder, or nothing ran yet)
    why: str


def _environment() -> Environment:
    backend = get_backend()
    gpu = detect_gpu()
    return Environment(
        backend.name,
        backend.version,
        gpu.name if gpu.present else None,
        tuple(gpu.compute_capability) if gpu.compute_capability else None,
    )


class QuickstartSession:
    """Holds a run and re-runs only what a changed setting affects (the notebook panel drives this)."""

    def __init__(
        self,
        config: QuickstartConfig | None = None,
        progress: ProgressFn | None = None,
        on_result: ResultFn | None = None,
    ) -> None:
        self.config = config or QuickstartConfig()
        self.progress = progress
        self.on_result = on_result
        self.run = QuickstartRun(self.config)
        self.workspace: Workspace | None = None

    def prepare(self) -> Workspace:
        """The workspace of the current model and output folder (a new model or folder starts a new record)."""
        if self.workspace is None or not self.workspace.matches(self.config):
            self.workspace = Workspace(self.config)
            self.run = QuickstartRun(self.config)
        if self.run.environment is None:
            self.run = replace(self.run, environment=_environment())
        self.workspace.progress = self.progress  # stages with steps of their own report them to the same callback
        return self.workspace

    def run_all(self) -> QuickstartRun:
        return self.run_from(STAGE_NAMES[0])

    def run_from(self, first: str) -> QuickstartRun:
        ws = self.prepare()
        names = STAGE_NAMES[STAGE_NAMES.index(first) :]
        for index, name in enumerate(names):
            event = ProgressEvent("stage", STAGE_BY_NAME[name].title, index, len(names), name=name)
            if not report(self.progress, event):
                self.run = cancel_stages(self.run, names[index:])  # nothing from the old settings stays
                return self.run
            self.run = run_stage(self.run, name, ws)
            if self.on_result:
                self.on_result(self.run.stages[name], index, len(names))
            if self.run.stages[name].status is StageStatus.CANCELLED:  # stopped while it ran: the rest does not run
                self.run = cancel_stages(self.run, names[index + 1 :])
                return self.run
        report(self.progress, ProgressEvent("stage", "finished", len(names), len(names), name="done", kind="finish"))
        return self.run

    def run_stages(self, names: Iterable[str]) -> QuickstartRun:
        """Run the named stages (in journey order) on the current record, e.g. select + timing for another precision."""
        ws = self.prepare()
        wanted = set(names)
        for name in (n for n in STAGE_NAMES if n in wanted):
            self.run = run_stage(self.run, name, ws)
        return self.run

    def plan_update(self, changes: Mapping[str, SettingValue]) -> UpdatePlan:
        """What applying ``changes`` would do; an unknown setting or a value out of range raises (nothing changes)."""
        config = self.config.validated(**changes)
        changed = frozenset(key for key in changes if getattr(self.config, key) != getattr(config, key))
        if not changed:
            return UpdatePlan(config, changed, (), False, "nothing changed")
        listed = ", ".join(sorted(changed))
        if "model" in changed:
            return UpdatePlan(
                config, changed, STAGE_NAMES, True, f"model changed to {config.model}: every stage re-runs"
            )
        if changed & WHOLE_RUN_SETTINGS:
            return UpdatePlan(config, changed, STAGE_NAMES, True, f"{listed} changed: every stage re-runs")
        if not self.run.stages:
            return UpdatePlan(config, changed, STAGE_NAMES, True, f"{listed} set: every stage runs")
        first = next((stage.name for stage in STAGES if stage.is_affected(self.config, config)), None)
        # a stage cancelled in the last run (a setting changed while it ran) has no result for later stages to use
        cancelled = next((n for n in STAGE_NAMES if self.run.stage(n).status is StageStatus.CANCELLED), None)
        if cancelled is not None and (first is None or STAGE_NAMES.index(cancelled) < STAGE_NAMES.index(first)):
            why = f"{listed} changed; the last run was cancelled at {cancelled}, so the journey goes on from there"
            return UpdatePlan(config, changed, STAGE_NAMES[STAGE_NAMES.index(cancelled) :], False, why)
        if first is None:
            return UpdatePlan(config, changed, (), False, f"{listed} changed: no stage reads it")
        return UpdatePlan(config, changed, STAGE_NAMES[STAGE_NAMES.index(first) :], False, f"{listed} changed")

    def update(self, **changes: SettingValue) -> QuickstartRun:
        """Apply new settings and re-run what :meth:`plan_update` says they affect."""
        plan = self.plan_update(changes)
        self.config = plan.config
        self.run = replace(self.run, config=plan.config)
        if not plan.stages:
            return self.run
        return self.run_from(plan.stages[0])


def run_quickstart(
    config: QuickstartConfig | None = None, progress: ProgressFn | None = None, on_result: ResultFn | None = None
) -> QuickstartRun:
    """Run the whole journey headless and return its results."""
    return QuickstartSession(config, progress, on_result).run_all()
