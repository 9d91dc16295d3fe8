"""Layer-record readers against the golden fixtures (RTX logs captured from real builds; TRT <=10/11 JSON from the docs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.engine.records import (
    datatype_from_format_string,
    engine_layers_from_document,
    layers_document,
    onnx_nodes_from_metadata,
    read_inspector_json,
    read_layers,
)
from workbench.errors import WorkbenchError

FIXTURES = Path(__file__).parent / "fixtures" / "layers"


def test_rtx_fp32_capture_parses_every_layer_with_fused_onnx_nodes() -> None:
    engine = read_layers(FIXTURES / "rtx_cls_fp32.log")
    assert engine.source_format == "tensorrt-rtx-verbose-log"
    raw = (FIXTURES / "rtx_cls_fp32.log").read_text()
    assert len(engine.layers) == raw.count("\nName: ") == 76
    assert "unparsed" not in {layer.layer_type for layer in engine.layers}
    assert {layer.precision for layer in engine.layers} == {"fp32"}
    first_conv = engine.layers[1]
    assert first_conv.layer_type == "runtime_fusion"
    assert first_conv.onnx_nodes == ("Conv@0", "BatchNormalization@0", "Clip@0", "Mul@0", "Add@0", "Div@0")
    assert engine.layers[0].onnx_nodes == ()  # the input reformat Myelin inserted
    assert engine.layers[3].tactic == "__myelin_CASK_STUB" and engine.layers[3].layer_type == "correlation"
    assert [io.name for io in engine.io_tensors] == ["x", "save_infer_model/scale_0.tmp_1"]
    assert engine.io_tensors[0].profiles[0]["max"] == [1, 3, 48, 192]
    assert engine.layers[1].inputs[0].dimensions == (1, 3, 48, 192)


def test_rtx_fp16_capture_shows_half_layers() -> None:
    engine = read_layers(FIXTURES / "rtx_cls_fp16.log")
    precisions = [layer.precision for layer in engine.layers]
    assert precisions.count("fp16") == len(engine.layers) == 75
    halves = [t for layer in engine.layers for t in layer.inputs if t.datatype == "Half"]
    assert len(halves) > 70


def test_rtx_qdq_capture_shows_int8_convolutions() -> None:
    engine = read_layers(FIXTURES / "rtx_qdq_int8.log")
    convs = [layer for layer in engine.layers if layer.layer_type == "correlation"]
    assert [layer.name for layer in convs] == ["conv0_myl0_1", "conv1_myl0_3"]
    for layer in convs:
        assert layer.inputs[0].datatype == "Int8"
        assert layer.constants[0].datatype == "Int8"  # the per-channel INT8 weights
        assert layer.precision == "int8"
    assert engine.layers[-1].precision == "fp32"  # the float epilogue writing the output


def test_rtx_multistream_capture_parses_signal_and_wait_layers() -> None:
    engine = read_layers(FIXTURES / "rtx_det_fp16_multistream.log")
    types = [layer.layer_type for layer in engine.layers]
    assert len(engine.layers) == 125 and "unparsed" not in types
    sync = [layer for layer in engine.layers if layer.layer_type in ("signal", "wait")]
    assert len(sync) == 29 and {layer.stream_id for layer in sync} >= {0, 2, 3}
    assert all(layer.inputs == layer.outputs == [] and layer.onnx_nodes == () for layer in sync)
    from workbench.engine.layermap import LayerMap

    layer_map = LayerMap.from_engine_layers(engine)
    assert layer_map.stats().stream_sync_layers == 29 and layer_map.stats().by_precision["none"] == 30
    assert {layer.stream_id for layer in engine.layers if layer.layer_type == "correlation"} >= {0, 1}


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("rtx_*.log")))
def test_no_rtx_fixture_line_is_left_unparsed(fixture: str) -> None:
    engine = read_layers(FIXTURES / fixture)
    assert engine.layers and all(layer.layer_type != "unparsed" for layer in engine.layers)
    assert all(layer.precision in ("fp32", "fp16", "int8", "none") for layer in engine.layers)
    assert all(layer.precision != "none" or not (layer.inputs or layer.outputs) for layer in engine.layers)


def test_trt10_json_bindings_format_datatype_and_all_separator_forms() -> None:
    engine = read_layers(FIXTURES / "trt10_resnet_block_fp16.json")
    assert engine.source_format == "tensorrt-10-inspector-json"
    by_name = {layer.name: layer for layer in engine.layers}
    reformat = by_name["Reformatting CopyNode for Input Tensor 0 to /conv1/Conv + /relu/Relu"]
    assert reformat.onnx_nodes == () and reformat.origin == "REFORMAT"
    assert reformat.inputs[0].datatype == "Float" and reformat.outputs[0].datatype == "Half"
    assert by_name["/conv1/Conv + /relu/Relu"].onnx_nodes == ("/conv1/Conv", "/relu/Relu")  # \x1f
    assert by_name["/layer1/layer1.0/conv1/Conv + /layer1/layer1.0/relu/Relu"].onnx_nodes == (
        "/layer1/layer1.0/conv1/Conv",
        "/layer1/layer1.0/relu/Relu",
    )  # \x1e (TensorRT 8.6)
    residual = by_name["/layer1/layer1.0/conv2/Conv + /layer1/layer1.0/Add + /layer1/layer1.0/relu_1/Relu"]
    assert residual.onnx_nodes == (
        "/layer1/layer1.0/conv2/Conv",
        "/layer1/layer1.0/Add",
        "/layer1/layer1.0/relu_1/Relu",
    )
    assert residual.precision == "fp16" and residual.layer_type == "CaskConvolution"
    assert residual.tactic.startswith("sm80_xmma_fprop_implicit_gemm_f16f16")
    assert [(io.name, io.io_mode, io.datatype) for io in engine.io_tensors] == [
        ("input", "Input", "Float"),
        ("output", "Output", "Float"),
    ]


def test_trt10_two_profile_engine_keeps_one_profile() -> None:
    data = json.loads((FIXTURES / "trt10_two_profiles_int8.json").read_text())
    profile0 = read_inspector_json(data)
    profile1 = read_inspector_json(data, profile=1)
    assert [layer.name for layer in profile0.layers] == ["input_QuantizeLinear", "conv0 + relu0"]
    assert profile0.layers[1].tactic != profile1.layers[1].tactic
    assert profile0.layers[0].origin == "QDQ"
    assert profile0.layers[1].inputs[0].datatype == "Int8" and profile0.layers[1].precision == "int8"
    assert profile0.layers[1].inputs[0].dimensions == (-1, 3, 32, 32)


def test_trt11_json_agrees_with_the_rtx_log_of_the_same_engine() -> None:
    json_engine = read_layers(FIXTURES / "trt11_qdq_int8.json")
    log_engine = read_layers(FIXTURES / "rtx_qdq_int8.log")
    assert json_engine.source_format == "tensorrt-11-inspector-json"
    assert [(lyr.name, lyr.layer_type, lyr.onnx_nodes, lyr.precision, lyr.tactic) for lyr in json_engine.layers] == [
        (lyr.name, lyr.layer_type, lyr.onnx_nodes, lyr.precision, lyr.tactic) for lyr in log_engine.layers
    ]
    assert [c.datatype for c in json_engine.layers[1].constants] == ["Int8", "Float", "Float"]
    assert json_engine.io_tensors[0].profiles[0]["opt"] == [1, 3, 32, 32]


@pytest.mark.parametrize(
    "metadata, expected",
    [
        ("[ONNX Layer: a]\x1f[ONNX Layer: b]", ("a", "b")),
        ("[ONNX Layer: a]\x1e[ONNX Layer: b]", ("a", "b")),
        ("[ONNX Layer: a][ONNX Layer: b][ONNX Layer: a]", ("a", "b")),
        ("[ONNX Layer: /enc/MatMul | /enc/attention]\x1f[ONNX Layer: /enc/Add | /enc]", ("/enc/MatMul", "/enc/Add")),
        ("", ()),
        ("a\x1fb", ("a", "b")),
    ],
)
def test_metadata_forms(metadata: str, expected: tuple[str, ...]) -> None:
    assert onnx_nodes_from_metadata(metadata) == expected


def test_format_datatype_strings() -> None:
    assert datatype_from_format_string("Row major linear FP32") == "Float"
    assert datatype_from_format_string("Channel major FP16 format where channel % 8 == 0") == "Half"
    assert datatype_from_format_string("Four wide channel vectorized row major Int8 format") == "Int8"
    assert datatype_from_format_string("Row major linear BF16 format") == "BFloat16"


def test_layers_message_inside_a_workbench_build_log(tmp_path: Path) -> None:
    message = (FIXTURES / "rtx_qdq_int8.log").read_text()
    log = tmp_path / "m.build.log"
    log.write_text("[VERBOSE] Parsing node: conv0\n[VERBOSE] " + message + "\n[INFO] Engine built\n")
    engine = read_layers(log)
    assert len(engine.layers) == 5 and len(engine.io_tensors) == 2


def test_document_round_trip_keeps_names_precisions_and_qdq_edges(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(FIXTURES))
    from capture_rtx import make_qdq_conv_model

    from workbench.model import load_onnx

    model = load_onnx(make_qdq_conv_model(tmp_path / "qdq.onnx"))
    engine = read_layers(FIXTURES / "rtx_qdq_int8.log")
    document = json.loads(json.dumps(layers_document(engine, model.proto)))
    assert {"name", "type", "precision", "onnx_nodes", "tactic"} <= set(document["engine_layers"][0])
    assert {"name", "op_type", "engine_layers"} <= set(document["onnx_nodes"][0])
    assert len(document["qdq_edges"]) == 4
    again = engine_layers_from_document(document)
    assert [(lyr.name, lyr.precision, lyr.onnx_nodes) for lyr in again.layers] == [
        (lyr.name, lyr.precision, lyr.onnx_nodes) for lyr in engine.layers
    ]
    assert read_layers(document).layers[1].onnx_nodes == engine.layers[1].onnx_nodes


def test_bad_inputs_are_explained(tmp_path: Path) -> None:
    with pytest.raises(WorkbenchError, match="no such layer-records file"):
        read_layers(tmp_path / "missing.json")
    names_only = tmp_path / "names.json"
    names_only.write_text(json.dumps({"Layers": ["conv1", "relu1"], "Bindings": ["x", "y"]}))
    with pytest.raises(WorkbenchError, match="DETAILED"):
        read_layers(names_only)
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("hello\nworld\n")
    with pytest.raises(WorkbenchError, match="no layer records"):
        read_layers(garbage)
    broken = tmp_path / "broken.json"
    broken.write_text('{"Layers": [')
    with pytest.raises(WorkbenchError, match="does not parse"):
        read_layers(broken)
    with pytest.raises(WorkbenchError, match="no 'Layers' key"):
        read_layers({"layers": []})
