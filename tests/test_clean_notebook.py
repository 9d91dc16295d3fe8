"""Notebook 01 runs headless, and its panel is driven: changing passes or the chosen pass changes the figures."""

from __future__ import annotations

from pathlib import Path

from notebook_runner import execute_notebook

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_clean_graph.ipynb"


def test_notebook_01_executes_headless():
    run = execute_notebook(NOTEBOOK.name)
    assert run.seconds < 120
    assert run.count("application/vnd.plotly.v1+json") >= 1
    outputs = run.outputs
    text = run.stream_text
    assert "fuse_conv_affine" in text and "accepted" in text
    assert "rolled_back" in str([o.get("data", {}).get("text/plain", "") for o in outputs])  # the demo pass was caught


def test_clean_panel_is_driven_by_its_widgets():
    from workbench.ui.clean_panel import CleanPanel

    panel = CleanPanel("ocr-cls")
    assert panel.result is None and len(panel.waterfall.data) == 0  # nothing runs or shows in the constructor
    panel.run()
    assert panel.status.kind == "ok", panel.status.text
    full_after = panel.result.nodes_after
    assert panel.waterfall.data[0].y[0] == panel.result.nodes_before

    panel.pass_picker.value = "fuse_conv_affine"
    title = panel.neighbourhood.layout.title.text
    assert title.startswith("fuse_conv_affine") and "BatchNormalization" in str(panel.neighbourhood.data[1].hovertext)
    assert "fuse_conv_affine" in panel.table.layout.title.text

    panel.pass_picker.value = "constants_to_initializers"
    assert panel.neighbourhood.layout.title.text.startswith("constants_to_initializers")

    panel.pass_boxes["fuse_conv_affine"].value = False  # untick a pass and re-run
    panel.run()
    assert panel.result.nodes_after > full_after
    assert "fuse_conv_affine" not in list(panel.waterfall.data[0].x)
    assert list(panel.waterfall.data[0].y)[-1] == panel.result.nodes_after

    panel.model_picker.value = "(path below)"
    panel.path_text.value = "/no/such/model.onnx"
    assert panel.run() is None and panel.status.kind == "error" and "no such file" in panel.status.text
