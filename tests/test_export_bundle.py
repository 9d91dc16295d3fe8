"""Export bundles from a real build: round trip, version / compute-capability refusal, Triton config validation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.engine.backend import GpuInfo, get_backend
from workbench.engine.build import BuildOptions, EngineArtifact, engine_from_onnx
from workbench.errors import EngineCannotRun, WorkbenchError
from workbench.export import (
    TritonOptions,
    check_engine_compatible,
    export_bundle,
    load_engine,
    normalize_compute_capability,
    read_bundle,
    validate_triton_config,
)
from workbench.zoo import get_entry


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> EngineArtifact:
    entry = get_entry("digits-cnn")
    out = tmp_path_factory.mktemp("export")
    return engine_from_onnx(
        entry.load(),
        out / "digits.engine",
        BuildOptions(shapes=dict(entry.input_profiles()), precision="fp16", progress=False),
    )


def test_bundle_round_trip_with_triton_and_extras(artifact: EngineArtifact, tmp_path: Path) -> None:
    cache = tmp_path / "calib.cache"
    cache.write_bytes(b"TRT-1.7-EntropyCalibration2\nimage: 3c010a14\n")
    bundle = export_bundle(
        artifact,
        tmp_path / "bundle",
        calibration_cache=cache,
        accuracy={"metric": "top1", "value": 0.97},
        timing={"p50_ms": 0.12},
        triton=TritonOptions(model_name="digits", instance_count=2),
    )
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest == bundle.manifest
    assert manifest["onnx"]["sha256"] == artifact.onnx_sha256
    assert manifest["backend"] == {"name": artifact.backend, "version": artifact.backend_version}
    assert manifest["target_compute_capabilities"] == ["7.5", "8.0", "8.6", "8.9", "12.0", "12.1"]
    assert manifest["precision_plan"] is None and manifest["build_options"]["precision"] == "fp16"
    assert manifest["calibration_cache"]["file"] == "calibration.cache"
    assert (tmp_path / "bundle" / "calibration.cache").read_bytes() == cache.read_bytes()
    assert manifest["accuracy"]["value"] == 0.97 and manifest["timing"]["p50_ms"] == 0.12
    assert manifest["layer_map"]["stats"]["engine_layers"] == artifact.layer_count
    assert bundle.engine_path.read_bytes() == artifact.engine_path.read_bytes()
    again = read_bundle(tmp_path / "bundle")
    assert [lyr.name for lyr in again.layer_map.layers] == [lyr.name for lyr in artifact.engine_layers.layers]
    # Triton repository: plan + config parsed back with Triton's ModelConfig schema
    plan = tmp_path / "bundle" / "triton" / "digits" / "1" / "model.plan"
    assert plan.read_bytes() == artifact.engine_path.read_bytes()
    config = validate_triton_config(again.triton_config_path.read_text())
    assert config.name == "digits" and config.platform == "tensorrt_plan"
    assert config.max_batch_size == 64  # the zoo profile's max batch
    assert [(i.name, list(i.dims)) for i in config.input] == [("image", [1, 32, 32])]
    assert config.HasField("dynamic_batching") and config.instance_group[0].count == 2
    assert not list(tmp_path.glob(".bundle.*"))  # no staging directory left behind
    assert manifest["quantization"] is None  # an FP16 engine of an FP32 model: no Q/DQ recipe


def test_the_manifest_says_how_the_qdq_model_was_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`calibrate` (its defaults: weight rounding and grid alignment chosen by measurement) records what it did in
    the Q/DQ model; `build` reads it into the engine's layer records and prints it, and `export` puts it in the
    manifest: the cache's ranges alone do not say which model the engine was built from."""
    import onnx

    from workbench.precision.recipe import QUANTIZATION_METADATA_KEY, QuantizationRecipe, read_recipe

    qdq, engine, bundle = tmp_path / "d.onnx", tmp_path / "d.engine", tmp_path / "bundle"
    assert main(["calibrate", "digits-cnn", "--data", "zoo", "-o", str(qdq), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    recipe = read_recipe(onnx.load(str(qdq)))
    assert recipe is not None and recipe.ranges_method == "mse" and recipe.int8_nodes == 6 and recipe.fp8_nodes == 0
    assert recipe.grid_alignment == ("grid alignment on:" in printed)  # the choice calibrate printed
    assert recipe.grid_alignment == ("warning: grid alignment: " in printed)  # and the model it wrote
    assert recipe.weight_rounding == ("gptq" if "weights rounded by GPTQ" in printed else "nearest")
    assert main(["build", str(qdq), "-o", str(engine)]) == 0
    assert f"quantized   {recipe.text()}" in capsys.readouterr().out
    assert EngineArtifact.load(engine).quantization == recipe  # read back from the .layers.json
    assert main(["export", str(engine), "-o", str(bundle)]) == 0
    assert f"quantized   {recipe.text()}" in capsys.readouterr().out
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert QuantizationRecipe.from_json({k: v for k, v in manifest["quantization"].items() if k != "text"}) == recipe
    assert main(["verify", str(bundle)]) == 0
    # a record someone edited is refused by the reader, naming it; `build` says so and builds the model anyway
    model = onnx.load(str(qdq))
    next(p for p in model.metadata_props if p.key == QUANTIZATION_METADATA_KEY).value = '{"ranges_method": 3}'
    with pytest.raises(WorkbenchError, match="metadata is not a quantization recipe"):
        read_recipe(model)
    # a record of another graph: a node renamed after calibration makes it stale
    stale = onnx.load(str(qdq))
    stale.graph.node[0].name += "_edited"
    with pytest.raises(WorkbenchError, match="the graph has changed since"):
        read_recipe(stale)
    edited = tmp_path / "edited.onnx"
    onnx.save(model, str(edited))
    capsys.readouterr()
    assert main(["build", str(edited), "-o", str(tmp_path / "edited.engine")]) == 0
    assert "quantized   quantization record ignored:" in capsys.readouterr().out
    rebuilt = EngineArtifact.load(tmp_path / "edited.engine")
    assert rebuilt.quantization is None
    assert any(w.startswith("quantization record ignored:") for w in rebuilt.warnings), rebuilt.warnings


def test_the_recipe_counts_the_gptq_rounding_that_shipped() -> None:
    """GPTQ runs on every weight it has inputs for but ships only where it gained on held-out batches: a model whose
    weights all stayed nearest says nearest."""
    from dataclasses import replace

    from workbench.calib.rounding import LayerRounding
    from workbench.calib.session import CalibrationSession, quantization_recipe

    entry = get_entry("digits-cnn")
    session = CalibrationSession(entry.load(), data=list(entry.calibration_batches(limit=16)), progress=False)
    quantized = session.quantize(session.ranges("max"))
    lost = LayerRounding("w1", "int8", nearest_db=30.0, gptq_db=30.0)  # nearest kept: equal numbers
    gained = LayerRounding("w2", "int8", nearest_db=30.0, gptq_db=31.5)
    none_kept = quantization_recipe(replace(quantized, weight_rounding=(lost,)), "max")
    assert none_kept.weight_rounding == "nearest" and none_kept.gptq_weights == 0
    one_kept = quantization_recipe(replace(quantized, weight_rounding=(lost, gained)), "max")
    assert one_kept.weight_rounding == "gptq" and one_kept.gptq_weights == 1
    assert "GPTQ on 1 weight(s)" in one_kept.text() and one_kept.int8_nodes == 6


def test_existing_bundle_is_refused_unless_overwrite(artifact: EngineArtifact, tmp_path: Path) -> None:
    export_bundle(artifact, tmp_path / "b")
    with pytest.raises(WorkbenchError, match="already exists"):
        export_bundle(artifact, tmp_path / "b")
    assert export_bundle(artifact, tmp_path / "b", overwrite=True).manifest["triton"] is None


def test_tampered_engine_and_mismatches_are_refused(artifact: EngineArtifact, tmp_path: Path) -> None:
    bundle_dir = tmp_path / "b"
    bundle = export_bundle(artifact, bundle_dir)
    # backend version mismatch, e.g. a bundle made with another TensorRT-RTX release
    manifest = dict(bundle.manifest)
    manifest["backend"] = {"name": artifact.backend, "version": "1.6.0.0"}
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        WorkbenchError,
        match=r"built by tensorrt_rtx 1\.6\.0\.0.*this machine has tensorrt_rtx "
        + get_backend().version.replace(".", r"\."),
    ):
        load_engine(bundle_dir)
    # compute capability: an H200 (9.0) is not among TensorRT-RTX's targets
    bundle = export_bundle(artifact, bundle_dir, overwrite=True)
    with pytest.raises(WorkbenchError, match=r"targets compute capability 7\.5, .* this GPU \(H200\) is 9\.0"):
        check_engine_compatible(bundle, gpu=GpuInfo(True, "H200", (9, 0)))
    check_engine_compatible(bundle, gpu=GpuInfo(True, "RTX 4090", (8, 9)))  # a supported GPU passes the checks
    with pytest.raises(EngineCannotRun, match="no NVIDIA GPU"):
        check_engine_compatible(bundle, gpu=GpuInfo(False))
    (bundle_dir / "model.engine").write_bytes(b"truncated")
    with pytest.raises(WorkbenchError, match="does not match its manifest.*model.engine"):
        read_bundle(bundle_dir)


@pytest.mark.parametrize(
    "text, problem",
    [
        ('name: "m"\nplatform: "tensorrt_plan"\nbogus_field: 1', "no field named"),
        (
            'name: "m"\nplatform: "tensorrt_plan"\nmax_batch_size: 0\ninput [{name: "x" data_type: TYPE_FP32 dims: [3]}]\n'
            'output [{name: "y" data_type: TYPE_FP32 dims: [2]}]\ndynamic_batching {}',
            "dynamic_batching needs max_batch_size",
        ),
        (
            'name: "m"\nplatform: "onnxruntime_onnx"\ninput [{name: "x" data_type: TYPE_FP32 dims: [3]}]\n'
            'output [{name: "y" data_type: TYPE_FP32 dims: [2]}]',
            "is not TensorRT",
        ),
        (
            'name: "m"\nplatform: "tensorrt_plan"\ninput [{name: "x" dims: [3]}]\noutput [{name: "y" data_type: TYPE_FP32 dims: [0]}]',
            "TYPE_INVALID",
        ),
    ],
)
def test_triton_config_validation_rejects_bad_configs(text: str, problem: str) -> None:
    with pytest.raises(WorkbenchError, match=problem):
        validate_triton_config(text)


def test_compute_capability_names() -> None:
    assert (
        normalize_compute_capability("SM86")
        == normalize_compute_capability("8.6")
        == normalize_compute_capability("sm_86")
        == "8.6"
    )
    assert normalize_compute_capability("SM120") == "12.0"
    with pytest.raises(WorkbenchError):
        normalize_compute_capability("ampere")


def test_cli_export_and_errors(artifact: EngineArtifact, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engine = tmp_path / "m.engine"
    shutil.copyfile(artifact.engine_path, engine)
    shutil.copyfile(artifact.layers_path, tmp_path / "m.layers.json")
    timing = tmp_path / "timing.json"
    timing.write_text('{"p50_ms": 0.2}')
    assert (
        main(
            [
                "export",
                str(engine),
                "-o",
                str(tmp_path / "out"),
                "--triton",
                "--max-batch",
                "16",
                "--timing",
                str(timing),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "validated with Triton's ModelConfig schema" in printed
    assert "max_batch_size: 16" in (tmp_path / "out" / "triton" / "model" / "config.pbtxt").read_text()
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["timing"] == {"p50_ms": 0.2}
    assert main(["export", str(tmp_path / "missing.engine"), "-o", str(tmp_path / "x")]) == 2
    assert "no such engine file" in capsys.readouterr().err


def test_cli_verify_reports_intact_and_tampered(
    artifact: EngineArtifact, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    export_bundle(artifact, tmp_path / "b", triton=TritonOptions())
    assert main(["verify", str(tmp_path / "b")]) == 0
    assert "4 file(s) match the manifest" in capsys.readouterr().out
    (tmp_path / "b" / "triton" / "model" / "config.pbtxt").write_text("max_batch_size: 4096\n")
    assert main(["verify", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "1 problem(s)" in err and "config.pbtxt" in err


def test_format_1_bundles_still_read_with_engine_hash_and_confinement(artifact: EngineArtifact, tmp_path: Path) -> None:
    export_bundle(artifact, tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    manifest["format_version"] = 1
    del manifest["files"], manifest["layers"]
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    from workbench.export.bundle import verify_bundle

    assert not verify_bundle(tmp_path / "b").ok  # format 1 only when asked for (issue 23: no silent downgrade)
    check = verify_bundle(tmp_path / "b", allow_unsealed=True)
    assert check.ok and check.files_checked == 1 and "only the engine is hashed" in check.notes[0]
    manifest["engine"]["file"] = "../b/model.engine"
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(WorkbenchError, match="leaves the bundle"):
        read_bundle(tmp_path / "b", allow_unsealed=True)
