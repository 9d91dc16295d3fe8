"""Every built-in zoo model builds into a real engine (TensorRT-RTX on this CPU-only machine) with its layer JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.engine.build import BuildOptions, engine_from_onnx
from workbench.zoo import entry_names, get_entry


@pytest.mark.parametrize("name", entry_names())
def test_zoo_model_builds_with_layer_records(name: str, tmp_path: Path) -> None:
    entry = get_entry(name)
    model = entry.load()
    profiles = entry.input_profiles()
    artifact = engine_from_onnx(model, tmp_path / f"{name}.engine", BuildOptions(shapes=dict(profiles), progress=False))
    assert artifact.engine_path.stat().st_size > 10_000
    document = json.loads(artifact.layers_path.read_text())
    assert len(document["engine_layers"]) == artifact.layer_count > 0
    assert len(document["onnx_nodes"]) == model.node_count
    # the engine's I/O tensors are the model's inputs, with the zoo's profile
    io_inputs = {io["name"]: io for io in document["io_tensors"] if io["io_mode"] == "Input"}
    assert set(io_inputs) == {spec.name for spec in model.inputs}
    for input_name, (low, _opt, high) in profiles.items():
        if io_inputs[input_name]["profiles"]:
            assert io_inputs[input_name]["profiles"][0]["min"] == list(low)
            assert io_inputs[input_name]["profiles"][0]["max"] == list(high)
    # compute nodes end up inside engine layers (a model whose every node were folded away would be a bug)
    mapped = [node for node in document["onnx_nodes"] if node["engine_layers"]]
    assert len(mapped) >= min(5, model.node_count // 4)
