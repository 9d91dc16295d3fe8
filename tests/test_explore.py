"""Engine explorer graphs, overlays, linter and export, on real TensorRT-RTX builds of zoo models (no browser)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from workbench.cli import main
from workbench.engine import engine_for_model
from workbench.engine.build import BuildOptions, engine_from_onnx
from workbench.engine.layermap import HEAVY_OPS
from workbench.engine.lint import lint
from workbench.explore import graphs as g
from workbench.explore import overlays as ov
from workbench.explore.explorer import build_explorer
from workbench.model import load_onnx


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, g.BuildView]:
    out = tmp_path_factory.mktemp("explore-builds")
    views = {}
    for model, precision in (("digits-cnn", "fp32"), ("ocr-cls", "fp32"), ("ocr-cls", "fp16")):
        artifact = engine_for_model(model, precision, out)
        views[f"{model}.{precision}"] = g.view_from_artifact(artifact)
    return views


def _namespace_leaf(node) -> str:
    return node.namespace.rsplit("/", 1)[-1]


@pytest.mark.parametrize("name", ["digits-cnn.fp32", "ocr-cls.fp32", "ocr-cls.fp16"])
def test_every_onnx_node_sits_in_exactly_the_group_of_a_layer_that_runs_it(builds, name) -> None:
    view = builds[name]
    assert view.has_onnx_edges  # the built ONNX (FP16: the AutoCast rewrite, checked by hash) was recovered
    graph = g.onnx_graph(view)
    by_id = {}
    for node in graph.nodes:
        assert node.id not in by_id, f"duplicate node id {node.id}"
        by_id[node.id] = node
    layers = {layer.name: layer for layer in view.layer_map.layers}
    heavy_seen = 0
    for entry in view.layer_map.nodes:
        node = by_id[g.onnx_node_id(entry.name)]  # every ONNX node is in the graph, once (ids are unique)
        if entry.folded:
            assert _namespace_leaf(node) == g.FOLDED_GROUP  # inside the group of the layer that used it, if any
            assert entry.op_type not in HEAVY_OPS
            continue
        # in the group of the first layer that executes it, and that group is named after that layer
        assert _namespace_leaf(node) == g.layer_group_name(layers[entry.engine_layers[0]])
        heavy_seen += entry.op_type in HEAVY_OPS
    assert heavy_seen == sum(1 for n in view.layer_map.nodes if n.op_type in HEAVY_OPS) > 0
    # each layer is a node: pinned on top of its group, or standing alone in "inserted by TensorRT"
    for layer in view.layer_map.layers:
        node = by_id[layer.name]
        if layer.inserted:
            assert _namespace_leaf(node) == g.INSERTED_GROUP  # among its neighbours' block, when there are blocks
        else:
            assert node.config.pinToGroupTop and _namespace_leaf(node) == g.layer_group_name(layer)
            members = {n.id for n in graph.nodes if n.namespace == node.namespace and n.id != layer.name}
            expected = {g.onnx_node_id(n) for n in layer.onnx_nodes if g.node_home_layer(view.layer_map)[n] is layer}
            assert members == expected
    # edges point at real nodes and follow the ONNX tensors
    for node in graph.nodes:
        for edge in node.incomingEdges:
            assert edge.sourceNodeId in by_id
    edges = sum(len(n.incomingEdges) for n in graph.nodes)
    assert edges >= len(view.layer_map.nodes) - len(view.layer_map.folded_nodes)


def _boxes_per_level(graph) -> dict[str, set[str]]:
    """Namespace -> the boxes drawn directly inside it (child groups and nodes), '' for the top level."""
    children: dict[str, set[str]] = {}
    for node in graph.nodes:
        path = ""
        for part in node.namespace.split("/") if node.namespace else []:
            children.setdefault(path, set()).add(f"{path}/{part}")
            path = f"{path}/{part}" if path else part
        children.setdefault(path, set()).add(node.id)
    return children


@pytest.mark.parametrize("name", ["digits-cnn.fp32", "ocr-cls.fp32"])
def test_no_level_of_either_graph_holds_more_than_40_boxes_and_blocks_are_consecutive_layers(builds, name) -> None:
    view = builds[name]
    nesting = g.layer_nesting(view.layer_map)
    for graph in (g.onnx_graph(view), g.engine_graph(view)):
        levels = _boxes_per_level(graph)
        assert max(len(boxes) for boxes in levels.values()) <= g.MAX_BOXES_PER_LEVEL
        if nesting.blocked:
            assert len(levels[""]) <= 8  # the first paint: a few labelled boxes (blocks, inputs, outputs)
    layers = view.layer_map.layers
    if len(layers) <= g.MAX_BOXES_PER_LEVEL:
        assert not nesting.blocked  # a small engine keeps its layer groups at the top
        return
    # ocr-cls (77 layers, short name scopes): topological blocks of consecutive engine layers, named after them
    assert nesting.blocked
    for block, attrs in nesting.blocks.items():
        members = [layer for layer in layers if nesting.parents[layer.name].startswith(block)]
        assert [layer.index for layer in members] == list(range(members[0].index, members[-1].index + 1))
        assert block.rsplit("/", 1)[-1] == g.block_name(members)
        assert attrs["engine layers"].startswith(f"{len(members)} ")


def test_topological_blocks_nest_10000_layers_at_most_40_per_level() -> None:
    from workbench.engine.layermap import LayerEntry

    def layers(count: int) -> list[LayerEntry]:
        return [LayerEntry(i, f"layer{i}", "Convolution", "fp32", "", (f"n{i}",), (), ()) for i in range(count)]

    for count in (40, 41, 199, 1600, 1601, 10_000):
        nested = g.topological_blocks(layers(count))
        depth = {len(path) for path in nested.values()}
        assert len(depth) == 1  # every layer at the same depth
        levels: dict[tuple, set] = {}
        for name, path in nested.items():
            for level in range(len(path) + 1):
                parent = tuple(block[0].index for block in path[:level])
                levels.setdefault(parent, set()).add(path[level][0].index if level < len(path) else name)
        assert max(len(children) for children in levels.values()) <= g.MAX_BOXES_PER_LEVEL
        expected_depth = 0 if count <= 40 else 1 if count <= 1600 else 2
        assert depth == {expected_depth}
        assert len(levels[()]) == (count if count <= 40 else -(-count // 40**expected_depth))


@pytest.mark.parametrize("name", ["digits-cnn.fp32", "ocr-cls.fp32", "ocr-cls.fp16"])
def test_engine_graph_has_every_layer_and_its_edges_connect_inputs_to_outputs(builds, name) -> None:
    view = builds[name]
    graph = g.engine_graph(view)
    ids = {node.id for node in graph.nodes}
    assert {layer.name for layer in view.layer_map.layers} <= ids
    inputs = {i for i in ids if i.startswith(g.INPUT_ID_PREFIX)}
    outputs = {i for i in ids if i.startswith(g.OUTPUT_ID_PREFIX)}
    assert inputs and outputs
    children: dict[str, set[str]] = {}
    for node in graph.nodes:
        for edge in node.incomingEdges:
            assert edge.sourceNodeId in ids
            children.setdefault(edge.sourceNodeId, set()).add(node.id)
    reached, stack = set(inputs), list(inputs)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in reached:
                reached.add(child)
                stack.append(child)
    assert outputs <= reached, "every engine output is reachable from an input along layer edges"
    attrs = {kv.key for kv in next(n for n in graph.nodes if n.id == view.layer_map.layers[-1].name).attrs}
    assert {"layer type", "tactic", "precision", "formats", "ONNX nodes"} <= attrs
    # labels name the fused ONNX op types, readable without hovering
    conv_layers = [n for n in graph.nodes if n.label.startswith("Conv")]
    assert conv_layers, [n.label for n in graph.nodes][:10]


def test_overlays_are_valid_node_data_on_real_nodes(builds) -> None:
    view = builds["ocr-cls.fp32"]
    onnx_ids = {n.id for n in g.onnx_graph(view).nodes}
    engine_ids = {n.id for n in g.engine_graph(view).nodes}
    report = lint(view.layer_map, view.engine_layers)
    for overlay in ov.build_overlays(view, lint_report=report):
        data = json.loads(overlay.data.to_json_string())
        assert set(data) == {g.ONNX_GRAPH_ID, g.ENGINE_GRAPH_ID}
        assert set(data[g.ONNX_GRAPH_ID]["results"]) <= onnx_ids
        assert set(data[g.ENGINE_GRAPH_ID]["results"]) <= engine_ids
        assert overlay.legend
        assert (
            data[g.ONNX_GRAPH_ID].get("gradient")
            or data[g.ONNX_GRAPH_ID].get("thresholds")
            or all("bgColor" in r for r in data[g.ONNX_GRAPH_ID]["results"].values())
        )
    # the precision overlay covers every node of both graphs (graph inputs/outputs included)
    assert set(ov.precision_overlay(view).values(g.ONNX_GRAPH_ID)) == onnx_ids
    assert set(ov.precision_overlay(view).values(g.ENGINE_GRAPH_ID)) == engine_ids
    precision = ov.precision_overlay(view).values(g.ONNX_GRAPH_ID)
    # every ONNX node has a value (folded ones "folded"), and they match the layer map
    for entry in view.layer_map.nodes:
        value = precision[g.onnx_node_id(entry.name)]
        assert value == ("folded" if entry.folded else view.layer_map.layer(entry.engine_layers[0]).precision)
    sizes = ov.fusion_size_overlay(view).values(g.ENGINE_GRAPH_ID)
    assert sizes == {layer.name: float(len(layer.onnx_nodes)) for layer in view.layer_map.layers}


def test_compare_marks_fusions_gained_and_lost(builds, tmp_path: Path) -> None:
    fp32, fp16 = builds["ocr-cls.fp32"], builds["ocr-cls.fp16"]
    explorer = build_explorer(fp32, compare=fp16, directory=tmp_path)
    diff = explorer.fusion_diff
    assert diff is not None and diff.gained and diff.lost
    after = next(o for o in explorer.overlays if o.key == "fusion_diff_after").values(f"{fp16.label}:engine")
    before = next(o for o in explorer.overlays if o.key == "fusion_diff_before").values(f"{fp32.label}:engine")
    assert {k for k, v in after.items() if v == "gained"} == {group.layer for group in diff.gained}
    assert {k for k, v in before.items() if v == "lost"} == {group.layer for group in diff.lost}
    assert [p["selectedGraphId"] for p in explorer.ui_state["paneStates"]] == [
        f"{fp32.label}:engine",
        f"{fp16.label}:engine",
    ]
    # Model Explorer selects each node-data file as it adds it: the last one of a build is the overlay it opens with
    assert [_last_overlay(explorer, index) for index in (0, 1)] == ["fusion_diff_before", "fusion_diff_after"]
    assert _last_overlay(build_explorer(fp32, directory=tmp_path / "one"), 0) == "precision"


def _last_overlay(explorer, index: int) -> str:
    files = [path.name for path in explorer.node_data_files if path.name.startswith(f"{index}-")]
    return files[-1].split(".")[-3]


def test_export_is_what_model_explorer_loads(builds, tmp_path: Path) -> None:
    from model_explorer.config import ModelExplorerConfig

    explorer = build_explorer(builds["digits-cnn.fp32"], directory=tmp_path / "work")
    out = explorer.export(tmp_path / "export")
    graphs = sorted(out.glob("*.graphs.json"))
    node_data = sorted(out.glob("*.nodedata.json"))
    assert len(graphs) == 2 and len(node_data) == 3
    # the shape Model Explorer's JSON loader accepts: one collection {label, graphs:[{id, nodes}]} per file
    collections = [json.loads(path.read_text()) for path in graphs]
    assert sorted(graph["id"] for c in collections for graph in c["graphs"]) == ["engine", "onnx"]
    assert all(c["label"] for c in collections)
    config = ModelExplorerConfig()
    for path in graphs:
        config.add_model_from_path(str(path))
    for path in node_data:
        config.add_node_data_from_path(str(path))
        data = json.loads(path.read_text())
        assert all("results" in graph for graph in data.values())
    assert config.has_data_to_encode_in_url() and len(config.node_data_sources) == 3
    assert "model-explorer" in (out / "README.txt").read_text()


def test_graph_and_node_data_files_are_the_stock_writers_documents_less_what_the_page_does_not_need(builds) -> None:
    """The explorer writes its JSON with its own fast converter: the node data are exactly what Model Explorer's
    ``to_json_string`` writes; the graphs are ``remove_none(asdict(...))`` less the empty optional lists; the ONNX
    graph's layer nodes carry a short summary (the engine graph's node of the same id carries the whole record)."""
    import dataclasses

    from model_explorer.utils import remove_none

    view = builds["ocr-cls.fp32"]
    for overlay in ov.build_overlays(view, lint_report=lint(view.layer_map, view.engine_layers)):
        assert json.loads(overlay.json_text()) == json.loads(overlay.data.to_json_string()), overlay.key
    onnx_graph, engine_graph = g.onnx_graph(view), g.engine_graph(view)
    for graph in (onnx_graph, engine_graph):
        ours = g.graphs_json(g.graph_collection("x", [graph]))
        stock = remove_none(dataclasses.asdict(g.graph_collection("x", [graph])))
        for node in stock["graphs"][0]["nodes"]:
            for key in [k for k, v in node.items() if v == [] and k in g._OPTIONAL_NODE_LISTS]:
                del node[key]
        assert json.loads(json.dumps(ours)) == json.loads(json.dumps(stock))
    layer = next(layer for layer in view.layer_map.layers if not layer.inserted)
    in_onnx = {kv.key for kv in next(n for n in onnx_graph.nodes if n.id == layer.name).attrs}
    in_engine = {kv.key for kv in next(n for n in engine_graph.nodes if n.id == layer.name).attrs}
    assert {"layer type", "precision"} <= in_onnx and {"tactic", "inputs", "outputs"} <= in_engine - in_onnx
    onnx_node = next(n for n in onnx_graph.nodes if n.id.startswith(g.ONNX_ID_PREFIX))
    assert "ONNX node" not in {kv.key for kv in onnx_node.attrs}  # the id says it


def _bad_qdq_digits(tmp_path: Path) -> Path:
    """digits-cnn with a Q/DQ pair on the softmax-side output, where no INT8 convolution/GEMM can absorb it."""
    from workbench.zoo import get_entry

    proto = onnx.load(str(get_entry("digits-cnn").load().path))
    graph = proto.graph
    out = graph.output[0].name
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name == out:
                node.output[i] = out + "_pre_q"
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(0.05, np.float32), "bad_q_scale"),
            numpy_helper.from_array(np.array(0, np.int8), "bad_q_zero"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("QuantizeLinear", [out + "_pre_q", "bad_q_scale", "bad_q_zero"], ["bad_q"], name="bad_Q"),
            helper.make_node("DequantizeLinear", ["bad_q", "bad_q_scale", "bad_q_zero"], [out], name="bad_DQ"),
        ]
    )
    path = tmp_path / "digits-bad-qdq.onnx"
    onnx.save(proto, str(path))
    return path


def test_lint_finds_the_standalone_qdq_of_a_bad_placement_and_none_in_a_clean_fp16_build(builds, tmp_path) -> None:
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    artifact = engine_from_onnx(
        load_onnx(_bad_qdq_digits(tmp_path)),
        tmp_path / "bad.engine",
        BuildOptions(shapes=dict(entry.input_profiles()), progress=False),
    )
    report = lint(artifact.layer_map, artifact.engine_layers)
    standalone = report.of_kind("standalone-qdq")
    assert standalone, report.counts()
    assert any({"bad_Q", "bad_DQ"} & set(f.onnx_nodes) for f in standalone)
    assert all(f.fix for f in report.findings)
    clean = builds["ocr-cls.fp16"]
    assert lint(clean.layer_map, clean.engine_layers).of_kind("standalone-qdq") == []


def test_cli_export_and_bad_input(builds, tmp_path: Path, capsys) -> None:
    layers = tmp_path / "x.layers.json"
    assert main(["explore", "/nonexistent/model.engine", "--export", str(tmp_path / "e")]) == 2
    assert "workbench explore: error:" in capsys.readouterr().err
    layers.write_text("{}")
    assert main(["explore", str(layers), "--export", str(tmp_path / "e")]) == 2
    assert not (tmp_path / "e").exists()


def test_int8_damage_overlays_from_a_real_diff_on_the_mixed_build(tmp_path: Path) -> None:
    """The quickstart stages on digits-cnn (FP32 engine, calibration, per-layer INT8 diff by ONNX Runtime) and a mixed
    INT8 engine whose plan keeps the diff's two worst INT8 nodes FP32."""
    from workbench.engine import engine_from_onnx
    from workbench.flow import QuickstartConfig, QuickstartSession
    from workbench.model import load_onnx

    session = QuickstartSession(
        QuickstartConfig(model="digits-cnn", out_dir=str(tmp_path / "run"), calibration_samples=64, diff_samples=16)
    )
    run = session.run_stages(["clean", "build_fp32", "calibrate", "layer_diff"])
    assert run.fp32_engine is not None and run.layer_diff is not None and run.calibration is not None
    workspace = session.prepare()
    calibration = workspace.calibration_session(run)
    plan = calibration.fallback_plan(list(run.layer_diff.int8_nodes_worst_first[:2]), "fp32")
    calibration.quantize(run.calibration.ranges, plan).save(tmp_path / "mixed.onnx")
    mixed_engine = engine_from_onnx(
        load_onnx(tmp_path / "mixed.onnx"), tmp_path / "mixed.engine", workspace.build_options("int8")
    )
    diff = run.layer_diff.diff
    explorer = build_explorer(run.fp32_engine, compare=mixed_engine, diff=diff, directory=tmp_path / "x")
    mixed = explorer.views[1]
    ids = (f"{mixed.label}:onnx", f"{mixed.label}:engine")
    onnx_ids = {n.id for n in g.onnx_graph(mixed, graph_id=ids[0]).nodes}
    drop = next(o for o in explorer.overlays if o.key == "int8_sqnr_drop")
    noise = next(o for o in explorer.overlays if o.key == "int8_noise_added")
    rows = {r.node: r for r in diff.tensors if r.kind == "activation" and r.drop_db is not None}
    onnx_values = drop.values(ids[0])
    assert onnx_values and set(onnx_values) <= onnx_ids  # values sit on real nodes of the mixed build's graph
    for node, row in rows.items():
        if g.onnx_node_id(node) in onnx_values:
            assert onnx_values[g.onnx_node_id(node)] >= row.drop_db  # a node shows its worst tensor
    # a layer shows the worst of the nodes it executes
    for layer in mixed.layer_map.layers:
        values = [rows[n].drop_db for n in layer.onnx_nodes if n in rows]
        if values:
            assert drop.values(ids[1])[layer.name] == pytest.approx(max(values))
    noisy = {r.node: r.noise_added for r in diff.tensors if r.kind == "activation" and r.noise_added is not None}
    worst = max(noise.values(ids[1]).items(), key=lambda kv: kv[1])
    assert worst[1] == pytest.approx(max(noisy[n] for n in mixed.layer_map.layer(worst[0]).onnx_nodes if n in noisy))
    assert explorer.fusion_diff is not None
    assert _last_overlay(explorer, 1) == "int8_sqnr_drop"  # the page opens on where INT8 hurts
    # the linter says why math layers stayed FP32 in the INT8 engine: the fallback kept their nodes FP32
    kept = {node for node, precision in plan.overrides.items() if precision == "fp32"}
    matched = [f for f in explorer.lint_reports[1].of_kind("fp32-in-reduced") if kept & set(f.onnx_nodes)]
    assert matched and all("the precision plan keeps it FP32" in f.message for f in matched)


def test_layer_time_overlay_from_a_real_torch_profile(tmp_path: Path) -> None:
    """A small PyTorch CNN: exported to ONNX, built with TensorRT-RTX, profiled per module with torch.profiler (CPU
    time here, labelled so), and the profile mapped onto the engine layers that fused those ONNX nodes."""
    import torch
    from torch import nn

    from workbench.timing.layer_profile import torch_layer_profile

    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
    ).eval()
    example = torch.randn(1, 3, 32, 32)
    onnx_path = tmp_path / "small.onnx"
    torch.onnx.export(module, (example,), str(onnx_path), input_names=["x"], output_names=["y"], dynamo=False)
    artifact = engine_from_onnx(load_onnx(onnx_path), tmp_path / "small.engine", BuildOptions(progress=False))
    profile = torch_layer_profile(module, example, onnx_model=str(onnx_path), iterations=3, warmup=1)
    view = g.view_from_artifact(artifact)
    overlay = ov.profile_overlay(view, profile)
    per_node = profile.per_onnx_node()
    per_layer = overlay.values(g.ENGINE_GRAPH_ID)
    assert per_layer and profile.clock in overlay.name
    for layer in view.layer_map.layers:
        times = [per_node[n] for n in layer.onnx_nodes if n in per_node]
        if times:
            assert per_layer[layer.name] == pytest.approx(sum(times))
    conv_layers = [layer for layer in view.layer_map.layers if any("Conv" in n for n in layer.onnx_nodes)]
    assert conv_layers and all(per_layer.get(layer.name, 0) > 0 for layer in conv_layers)


def test_cli_explore_exports(tmp_path: Path, capsys) -> None:
    # --print-url serves until Ctrl+C now: tests/test_seams_server.py runs it in a child process and interrupts it
    engine = engine_for_model("digits-cnn", "fp32", tmp_path).engine_path
    assert main(["explore", str(engine), "--export", str(tmp_path / "share")]) == 0
    assert "digits-cnn.fp32: 13 ONNX nodes -> 10 layers" in capsys.readouterr().out
    assert (tmp_path / "share" / "README.txt").is_file() and len(list((tmp_path / "share").glob("*.json"))) >= 5


def test_static_engine_view_names_every_layer_and_sections_large_engines(builds, tmp_path: Path) -> None:
    from workbench.viz.engine_view import fused_ops_label, fusions_page, sections

    fp32, fp16 = builds["ocr-cls.fp32"], builds["ocr-cls.fp16"]
    page = fusions_page(
        fp16.layer_map, tmp_path / "f.html", engine_layers=fp16.engine_layers, compare_with=fp32.layer_map
    ).read_text()
    assert page.count('<g class="layer"') == len(fp16.layer_map.layers)
    op_types = {n.name: n.op_type for n in fp16.layer_map.nodes}
    for layer in fp16.layer_map.layers:  # each box says what it fused, readable without hovering
        assert f">{html.escape(fused_ops_label(layer, op_types))}</text>" in page
    assert "<script src" not in page and "Plotly" not in page
    for node in fp16.layer_map.nodes:  # the searchable node -> layer table has every node
        assert f"<td>{html.escape(node.name)}</td>" in page
    cut = sections(fp32.layer_map, chunk=20, min_layers=10)
    assert [layer for s in cut for layer in s.layers] == list(fp32.layer_map.layers)
    assert all(len(s.layers) <= 20 for s in cut) and len(cut) >= 4


def test_the_built_onnx_is_recovered_only_while_its_source_is_unchanged(tmp_path: Path) -> None:
    """One recovery of the built ONNX (engine.built_onnx): the FP16 rewrite is made again and matched by hash; once
    the source file changes, nothing is recovered (the linter then says less, rather than something wrong)."""
    import shutil

    from workbench.engine.build import EngineArtifact
    from workbench.zoo import get_entry

    source = tmp_path / "digits.onnx"
    shutil.copy(get_entry("digits-cnn").onnx_path(), source)
    artifact = engine_for_model(str(source), "fp16", tmp_path)
    proto = artifact.built_onnx()
    assert proto is not None and any(node.op_type == "Cast" for node in proto.graph.node)  # the AutoCast rewrite
    assert EngineArtifact.load(artifact.engine_path).built_onnx() is not None  # read back from the .layers.json
    model = onnx.load(str(source))
    model.doc_string = "edited after the build"
    onnx.save(model, str(source))
    assert artifact.built_onnx() is None
