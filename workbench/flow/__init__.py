"""The quickstart journey: every stage in order over typed artifacts, re-running only what a changed setting affects."""

from workbench.flow.quickstart import (
    QuickstartConfig,
    QuickstartRun,
    QuickstartSession,
    run_quickstart,
)

__all__ = ["QuickstartConfig", "QuickstartRun", "QuickstartSession", "run_quickstart"]
