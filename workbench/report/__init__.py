"""The main job's report: a self-contained ``report.html`` and the bottleneck diagnosis, read from a quickstart run."""

from workbench.report.html import diagnose, metrics_table_html, render_report, timing_table_html, write_report

__all__ = ["diagnose", "metrics_table_html", "render_report", "timing_table_html", "write_report"]
