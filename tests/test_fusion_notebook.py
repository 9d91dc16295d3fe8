"""notebooks/02_fusions.ipynb runs headless (nbclient, kernel python3 from .venv) and its widgets drive the views."""

from __future__ import annotations

from pathlib import Path

from notebook_runner import execute_notebook

from workbench.zoo import DEFAULT_MODEL

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "02_fusions.ipynb"

# Appended to the notebook in memory: drives the widgets of the objects the notebook created.
DRIVE = """
from workbench.viz import engine as ff
nodes = panel._trace(ff.NODES_TRACE)
assert nodes.selectedpoints is None
layer = max(panel.layer_map.layers, key=lambda l: len(l.onnx_nodes))
panel.layer_picker.value = layer.name
assert len(nodes.selectedpoints) == len(layer.onnx_nodes) > 1, nodes.selectedpoints
assert layer.name in panel.details.value
table_before = list(panel.table.data[0].cells.values[3])
panel.sort_picker.value = "precision"
assert list(panel.table.data[0].cells.values[3]) == sorted(table_before)
# choose another precision and comparison with the explorer's widgets, then press Build
explorer.precision.value = "fp32"
explorer.compare.value = "fp16"
explorer.build_button.click()
assert explorer.panel is not panel and explorer.panel.layer_map.label.endswith(".fp32")
assert explorer.panel.compare_with.label.endswith(".fp16")
assert explorer.progress.events > 0
print("DRIVEN", len(explorer.maps))
"""


def test_notebook_02_executes_and_its_panel_is_driven(tmp_path: Path) -> None:
    run = execute_notebook(NOTEBOOK.name, workdir=tmp_path, extra_cells=[DRIVE])
    seconds, outputs, text = run.seconds, run.outputs, run.stream_text
    assert f"{DEFAULT_MODEL}.fp16:" in text and "DRIVEN 2" in text
    widget_views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    plotly_figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert widget_views and len(plotly_figures) >= 2  # the explorer, the stats and diff figures
    assert (tmp_path / "out" / "notebook-02" / f"{DEFAULT_MODEL}.fp16.fusions.html").stat().st_size > 1_000_000
    assert seconds < 60, f"notebook 02 took {seconds:.0f} s"
