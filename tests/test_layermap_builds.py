"""Layer maps of real TensorRT-RTX builds (CPU-only ahead-of-time builds): zoo models in FP32 and FP16, and a Q/DQ model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from workbench.engine.build import BuildOptions, EngineArtifact, engine_from_onnx
from workbench.engine.layermap import HEAVY_OPS, LayerMap, diff_layer_maps, myelin_group, myelin_op_tokens
from workbench.model import load_onnx
from workbench.zoo import get_entry

FIXTURES = Path(__file__).parent / "fixtures" / "layers"
MODELS = ("digits-cnn", "ocr-cls", "minilm")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[EngineArtifact, LayerMap]]:
    out = tmp_path_factory.mktemp("layermap-builds")
    result = {}
    for name in MODELS:
        entry = get_entry(name)
        model = entry.load()
        for precision in ("fp32", "fp16"):
            if name == "minilm" and precision == "fp16":
                continue  # the FP16 path is covered by the CNNs; keep the suite's build time down
            artifact = engine_from_onnx(
                model,
                out / f"{name}.{precision}.engine",
                BuildOptions(shapes=dict(entry.input_profiles()), precision=precision, progress=False),
            )
            result[(name, precision)] = (artifact, LayerMap.load(artifact.layers_path))
    return result


@pytest.mark.parametrize("name", MODELS)
def test_every_conv_gemm_matmul_maps_to_an_engine_layer(builds: dict, name: str) -> None:
    artifact, layer_map = builds[(name, "fp32")]
    model = get_entry(name).load()
    heavy = [node.name for node in model.proto.graph.node if node.op_type in HEAVY_OPS]
    assert heavy, f"{name} has no Conv/Gemm/MatMul"
    for node_name in heavy:
        assert layer_map.layers_of(node_name), f"{node_name} is in no engine layer"
    assert layer_map.unmapped_heavy_nodes() == []
    assert len(layer_map.nodes) == model.node_count
    assert len(layer_map.layers) == artifact.layer_count
    assert layer_map.unknown_nodes == ()  # every node a layer names exists in the graph


@pytest.mark.parametrize("name", MODELS)
def test_folded_nodes_and_inserted_layers_are_listed(builds: dict, name: str) -> None:
    _, layer_map = builds[(name, "fp32")]
    stats = layer_map.stats()
    folded = layer_map.folded_nodes
    assert stats.folded_nodes == len(folded) > 0
    for node in folded:
        assert node.engine_layers == () and layer_map.layers_of(node.name) == ()
    # what gets folded are constants and shape bookkeeping, not the model's math
    assert all(node.op_type not in HEAVY_OPS for node in folded)
    assert stats.engine_layers == stats.layers_from_onnx + stats.inserted_layers
    assert all(layer.onnx_nodes == () for layer in layer_map.inserted_layers)
    assert stats.largest_group >= 2  # something fused
    mapped_pairs = sum(len(layer.onnx_nodes) for layer in layer_map.layers)
    assert mapped_pairs == sum(len(node.engine_layers) for node in layer_map.nodes)  # both directions agree


@pytest.mark.parametrize("name", ("digits-cnn", "ocr-cls"))
def test_fp16_build_shows_half_layers_and_diffs_against_fp32(builds: dict, name: str) -> None:
    _, fp32 = builds[(name, "fp32")]
    _, fp16 = builds[(name, "fp16")]
    assert set(fp32.stats().by_precision) - {"none"} == {"fp32"}  # "none": tensor-less shape-call layers
    half = [layer for layer in fp16.layers if layer.precision == "fp16"]
    assert len(half) >= 0.8 * len(fp16.layers)
    assert any("fp16" in layer.input_datatypes for layer in half)
    diff = diff_layer_maps(fp32, fp16)
    assert diff.common, "the same Conv groups should fuse in both builds"
    assert len(diff.precision_changes) >= len(half) // 2
    assert all(a.precision == "fp32" and b.precision != "fp32" for a, b in diff.precision_changes)
    same = diff_layer_maps(fp32, fp32)
    assert (
        same.gained == []
        and same.lost == []
        and len(same.common) == len({frozenset(lyr.onnx_nodes) for lyr in fp32.layers if lyr.onnx_nodes})
    )


def test_myelin_names_are_decoded(builds: dict) -> None:
    _, layer_map = builds[("ocr-cls", "fp32")]
    kgen = [layer for layer in layer_map.layers if layer.name.startswith("__myl_")]
    assert kgen and all(layer.op_tokens and layer.myelin_group is not None for layer in kgen)
    assert myelin_op_tokens("__myl_CorrMulAddRelu_myl0_2") == ("Corr", "Mul", "Add", "Relu")
    assert myelin_group("Conv@2_myl3_7") == 3 and myelin_group("/fc/Gemm") is None


@pytest.fixture(scope="module")
def qdq_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[EngineArtifact, LayerMap]:
    sys.path.insert(0, str(FIXTURES))
    from capture_rtx import make_qdq_conv_model

    out = tmp_path_factory.mktemp("qdq")
    model = load_onnx(make_qdq_conv_model(out / "qdq.onnx"))
    artifact = engine_from_onnx(model, out / "qdq.engine", BuildOptions(precision="int8", progress=False))
    return artifact, LayerMap.from_engine_layers(artifact.engine_layers, onnx_proto=model.proto, label="qdq")


def test_qdq_model_convolutions_are_int8(qdq_build: tuple[EngineArtifact, LayerMap]) -> None:
    _, layer_map = qdq_build
    for conv in ("conv0", "conv1"):
        kernels = [layer_map.layer(name) for name in layer_map.layers_of(conv)]
        assert any(layer.is_int8_kernel and layer.precision == "int8" for layer in kernels), [
            (layer.name, layer.layer_type, layer.input_datatypes) for layer in kernels
        ]


def test_qdq_audit_finds_every_pair_inside_an_int8_kernel(qdq_build: tuple[EngineArtifact, LayerMap]) -> None:
    _, layer_map = qdq_build
    audit = layer_map.qdq_audit()
    assert len(audit) == 4
    assert {pair.kind for pair in audit} == {"weights", "activations"}
    assert all(pair.status == "int8-kernel" for pair in audit), [(p.quantize, p.status) for p in audit]
    document = layer_map.to_json()
    assert document["stats"]["by_precision"]["int8"] >= 2
    assert "output_identity" in document["folded_nodes"]


def test_real_transformer_collapses_by_name_scope(builds: dict) -> None:
    from workbench.viz.engine import side_by_side_figure, side_by_side_layout

    _, layer_map = builds[("minilm", "fp32")]
    view = side_by_side_layout(layer_map, max_items=120)
    assert view.collapsed_by.startswith("scope depth") and 10 <= len(view.items) <= 120
    assert sum(len(item.members) for item in view.items) == len(layer_map.nodes)
    assert any("/encoder/layer." in item.label for item in view.items if item.collapsed)
    assert [m.index for item in view.items for m in item.members] == list(range(len(layer_map.nodes)))  # order kept
    figure = side_by_side_figure(layer_map, layout=view)
    assert len(next(t for t in figure.data if t.name == "ONNX nodes").x) == len(view.items)
