"""Fusion figures and the notebook panel, built headless and checked for content (traces, counts), not pixels."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.engine.layermap import LayerEntry, LayerMap, NodeEntry, diff_layer_maps
from workbench.engine.records import read_layers
from workbench.viz import engine as ff
from workbench.viz.palette import PRECISION_COLORS

FIXTURES = Path(__file__).parent / "fixtures" / "layers"
sys.path.insert(0, str(FIXTURES))  # capture_rtx: the fixtures' model builders


@pytest.fixture(scope="module")
def cls_maps(tmp_path_factory: pytest.TempPathFactory) -> tuple[LayerMap, LayerMap]:
    """Layer maps of the captured FP32 and FP16 RTX builds of the PP-OCR classifier, linked to the real ONNX."""
    from capture_rtx import pinned_cls_model

    from workbench.model import load_onnx
    from workbench.precision import PrecisionPlan
    from workbench.precision.autocast import apply_precision_plan

    out = tmp_path_factory.mktemp("figures")
    model = load_onnx(pinned_cls_model(out / "cls.onnx"))
    fp16 = apply_precision_plan(model, PrecisionPlan("fp16")).proto
    return (
        LayerMap.from_engine_layers(
            read_layers(FIXTURES / "rtx_cls_fp32.log"), onnx_proto=model.proto, label="cls fp32"
        ),
        LayerMap.from_engine_layers(read_layers(FIXTURES / "rtx_cls_fp16.log"), onnx_proto=fp16, label="cls fp16"),
    )


def _trace(fig, name):
    return next(trace for trace in fig.data if trace.name == name)


def test_side_by_side_has_one_marker_per_node_and_layer_and_every_link(cls_maps) -> None:
    fp32, _ = cls_maps
    fig = ff.side_by_side_figure(fp32, max_items=1000)
    nodes, layers, links = _trace(fig, ff.NODES_TRACE), _trace(fig, ff.LAYERS_TRACE), _trace(fig, ff.LINKS_TRACE)
    assert len(nodes.x) == len(fp32.nodes) == 566 and set(nodes.x) == {0.0}
    assert len(layers.x) == len(fp32.layers) == 76 and set(layers.x) == {1.0}
    pairs = sum(len(node.engine_layers) for node in fp32.nodes)
    assert len(links.x) == 3 * pairs  # x0, x1, None per link
    # colours: folded nodes grey, mapped nodes and layers fp32 blue; the inserted reformat is a diamond
    folded = sum(1 for node in fp32.nodes if node.folded)
    assert list(nodes.marker.color).count(PRECISION_COLORS["folded"]) == folded
    assert set(layers.marker.color) == {PRECISION_COLORS["fp32"]}
    assert list(layers.marker.symbol).count(ff.INSERTED_SYMBOL) == len(fp32.inserted_layers) == 1
    assert "Conv@0" in nodes.hovertext[[n.name for n in fp32.nodes].index("Conv@0")]
    assert "566 ONNX nodes" in fig.layout.title.text
    legend = {trace.name for trace in fig.data if trace.showlegend is not False}
    assert {"fp32", "folded", "inserted by TensorRT"} <= legend


def test_thousand_node_model_collapses_by_name_scope() -> None:
    nodes = [
        NodeEntry(
            i,
            f"/encoder/layer.{i // 100}/block{(i // 10) % 10}/op{i}",
            "MatMul" if i % 10 == 0 else "Add",
            (f"layer{i // 10}",),
        )
        for i in range(1200)
    ]
    layers = [
        LayerEntry(
            j,
            f"layer{j}",
            "gemm",
            "fp16",
            "",
            tuple(n.name for n in nodes[j * 10 : (j + 1) * 10]),
            ("fp16",),
            ("fp16",),
        )
        for j in range(120)
    ]
    layer_map = LayerMap(layers, nodes, "synthetic", "big")
    view = ff.side_by_side_layout(layer_map, max_items=400)
    assert view.collapsed_by == "scope depth 3" and len(view.items) == 120
    assert all(len(item.members) == 10 and item.layers == [index] for index, item in enumerate(view.items))
    fig = ff.side_by_side_figure(layer_map, layout=view)
    assert len(_trace(fig, ff.NODES_TRACE).x) == 120 and "collapsed by scope depth 3" in fig.layout.title.text
    coarse = ff.side_by_side_layout(layer_map, max_items=50)
    assert coarse.collapsed_by == "scope depth 2" and len(coarse.items) == 12
    flat = LayerMap(layers, [NodeEntry(n.index, f"n{n.index}", n.op_type, n.engine_layers) for n in nodes], "synthetic")
    chunks = ff.side_by_side_layout(flat, max_items=400)
    assert chunks.collapsed_by == "runs of 3 nodes" and len(chunks.items) == 400


def test_layer_table_sorts(cls_maps) -> None:
    _, fp16 = cls_maps
    by_index = ff.layer_table_figure(fp16)
    assert list(by_index.data[0].cells.values[0]) == list(range(len(fp16.layers)))
    by_nodes = ff.layer_table_figure(fp16, "onnx nodes", descending=True)
    counts = list(by_nodes.data[0].cells.values[4])
    assert counts == sorted(counts, reverse=True) and counts[0] == 6
    with pytest.raises(Exception, match="cannot sort"):
        ff.layer_table_rows(fp16, "latency")


def test_fusion_diff_and_stats_figures(cls_maps) -> None:
    fp32, fp16 = cls_maps
    diff = diff_layer_maps(fp32, fp16)
    fig = ff.fusion_diff_figure(diff)
    bars = fig.data[0]
    assert list(bars.x) == ["common", "gained", "lost", "precision_changed"]
    assert list(bars.y) == [len(diff.common), len(diff.gained), len(diff.lost), len(diff.precision_changes)]
    table = fig.data[1]
    assert len(table.cells.values[0]) == len(diff.gained) + len(diff.lost) + len(diff.precision_changes)
    stats = ff.fusion_stats_figure(fp32)
    assert sum(stats.data[0].y) == len(fp32.layers)


def test_fusions_html_is_self_contained(cls_maps, tmp_path: Path) -> None:
    fp32, fp16 = cls_maps
    page = ff.fusions_html(fp16, tmp_path / "f.html", compare_with=fp32).read_text()
    assert page.count("Plotly.newPlot") == 4  # side by side, stats, table, diff
    assert not re.search(r'<script[^>]+src="https?://', page)  # no CDN: works offline
    assert "plotly.js v" in page or "plotly.js" in page
    assert "ONNX nodes folded away (36)" in page


def test_panel_links_layer_and_node_selection(cls_maps) -> None:
    from workbench.ui.engine_panel import FusionPanel

    fp32, fp16 = cls_maps
    panel = FusionPanel(fp16, compare_with=fp32)
    nodes, layers = _trace(panel.figure, ff.NODES_TRACE), _trace(panel.figure, ff.LAYERS_TRACE)
    assert nodes.selectedpoints is None
    fused = max(fp16.layers, key=lambda layer: len(layer.onnx_nodes))
    panel.layer_picker.value = fused.name  # driving the widget selects the layer
    expected = sorted(panel.view.item_of_node[name] for name in fused.onnx_nodes)
    assert list(nodes.selectedpoints) == expected and len(expected) == len(fused.onnx_nodes)
    assert list(layers.selectedpoints) == [fused.index]
    assert len(_trace(panel.figure, ff.HIGHLIGHT_TRACE).x) == 3 * len(expected)
    # reverse direction: a node highlights every layer it is split over
    split = next(node for node in fp16.nodes if len(node.engine_layers) > 1)
    panel.select_node(split.name)
    assert list(layers.selectedpoints) == [fp16.layer(name).index for name in split.engine_layers]
    # sorting the table through its widgets changes the table figure
    first_before = panel.table.data[0].cells.values[1][0]
    panel.sort_picker.value = "onnx nodes"
    panel.descending.value = True
    assert panel.table.data[0].cells.values[4][0] == 6 and panel.table.data[0].cells.values[1][0] != first_before
    assert panel.diff_figure is not None and panel.widget.children[-1] is panel.diff_figure
    # hiding folded nodes shrinks the node column and keeps the selected layer highlighted
    panel.select_layer(fused.name)
    panel.hide_folded.value = True
    assert len(nodes.x) == len(fp16.nodes) - len(fp16.folded_nodes)
    assert len(nodes.selectedpoints) == len(fused.onnx_nodes)
    assert f"{len(fp16.nodes)} ONNX nodes" in panel.figure.layout.title.text


def test_cli_fusions_summary_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fusions", str(FIXTURES / "rtx_qdq_int8.log"), "--html", str(tmp_path / "q.html")]) == 0
    out = capsys.readouterr().out
    assert "5 engine layers" in out and "int8" in out
    page = (tmp_path / "q.html").read_text()
    # the static engine drawing: one named box per layer, no script library (small, opens offline at once)
    assert page.count('class="layer"') == 5 and "<svg" in page and "Plotly" not in page and len(page) < 200_000
    assert "no ONNX given" in out  # nodes came from the layers' metadata
    # TensorRT 11 inspector JSON of the same engine plus the ONNX that was built: Q/DQ audit and folded nodes
    from capture_rtx import make_qdq_conv_model

    onnx_path = make_qdq_conv_model(tmp_path / "qdq.onnx")
    assert main(["fusions", str(FIXTURES / "trt11_qdq_int8.json"), "--onnx", str(onnx_path)]) == 0
    out = capsys.readouterr().out
    assert "Q/DQ pairs  int8-kernel 4" in out and "folded away: 1 nodes" in out and "no ONNX given" not in out
    assert main(["fusions", str(tmp_path / "nothing.json")]) == 2
    assert "no such layer-records file" in capsys.readouterr().err
