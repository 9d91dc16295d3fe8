"""notebooks/02_fusions.ipynb (the engine explorer) runs headless (nbclient, kernel python3 from .venv): its build panel
is driven, the explorer IFrames come from the kernel's Model Explorer server, lint and export run."""

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
assert explorer.progress.bar.max > 1 and explorer.progress.message == f"built {MODEL} fp32"  # fp16 was built before
print("DRIVEN", len(explorer.maps))
from workbench.explore.server import get_server, healthy
assert healthy(get_server().port, get_server().token) and view.url.startswith(get_server().base_url)
assert compared.url.startswith(get_server().base_url)  # one server per kernel, reused
print("EXPLORED", len(view.graph_files), len(compared.graph_files))
# the INT8 section: FP32 beside all-INT8, opening on where INT8 hurts (the last node data of the INT8 side)
assert hurts.views[1].label.endswith("int8-all") and hurts.node_data_files[-1].name.endswith("int8_sqnr_drop.nodedata.json")
print("INT8 HURTS", len(hurts.overlays))
"""


def test_notebook_02_executes_and_its_panel_is_driven(tmp_path: Path) -> None:
    run = execute_notebook(NOTEBOOK.name, workdir=tmp_path, extra_cells=[DRIVE])
    seconds, outputs, text = run.seconds, run.outputs, run.stream_text
    assert f"{DEFAULT_MODEL}.fp16:" in text and "DRIVEN 2" in text and "EXPLORED 2 4" in text
    assert "INT8 HURTS" in text and "largest SQNR drops (dB):" in text
    assert "'gained'" in text  # the compare cell printed the fusion diff summary
    widget_views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    plotly_figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    iframes = [o for o in outputs if "<iframe" in o.get("data", {}).get("text/html", "")]
    assert widget_views and plotly_figures and len(iframes) == 3  # build panel, stats, explorer, comparison, INT8
    out = tmp_path / "out" / "notebook-02"
    page = (out / f"{DEFAULT_MODEL}.fp16.fusions.html").read_text()
    assert '<g class="layer"' in page and "Plotly" not in page
    assert any(p.name.endswith(".graphs.json") for p in (out / "explorer-export").iterdir())
    assert seconds < 120, f"notebook 02 took {seconds:.0f} s"  # its INT8 section calibrates, builds and diffs
