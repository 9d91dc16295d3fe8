"""The main job's report: a self-contained ``report.html`` and the bottleneck diagnosis, read from a quickstart run."""

from workbench.report.diagnosis import Verdict, diagnose, kept_wider
from workbench.report.html import SECTION_IDS, render_report, write_report
from workbench.report.tables import (
    choice_html,
    front_table_html,
    metrics_table_html,
    precision_checks_html,
    stage_table_html,
    timing_table_html,
    verdicts_html,
)

__all__ = [
    "SECTION_IDS",
    "Verdict",
    "diagnose",
    "kept_wider",
    "choice_html",
    "front_table_html",
    "metrics_table_html",
    "precision_checks_html",
    "render_report",
    "stage_table_html",
    "timing_table_html",
    "verdicts_html",
    "write_report",
]
