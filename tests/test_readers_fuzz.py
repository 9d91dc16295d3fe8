"""Property-based fuzzing of every reader of a file format we accept (Hypothesis).

Each reader, given any bytes/JSON (random values, or a real file with one field replaced, deleted or retyped),
either returns a valid object or raises WorkbenchError, never anything else (no KeyError, TypeError, RecursionError
...). Seeds are real files: a calibration cache, layer records and a bundle manifest written by the real CLI.
"""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from cli_runner import run_cli_forked, tiny_onnx  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbench.errors import WorkbenchError  # noqa: E402

EXAMPLES = 150  # per reader and strategy; the budget reported in the README
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "fp16", "int8", "../x", "/etc/passwd", "a" * 64, "0" * 64, "TRT-"]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:6]):  # a few items of long lists are enough
            found += _paths(item, (*prefix, index))
    return found


def _mutated(data: st.DataObject, seed: Any) -> Any:
    """The seed document with one to three places replaced by a random value, deleted, or retyped."""
    doc = json.loads(json.dumps(seed))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["replace", "delete", "stringify", "wrap"]))
        if not path:
            doc = data.draw(json_values) if action == "replace" else doc
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if action == "delete":
            del parent[key]
        elif action == "stringify":
            parent[key] = str(parent[key])
        elif action == "wrap":
            parent[key] = [parent[key]]
        else:
            parent[key] = data.draw(json_values)
    return doc


def _dumps(doc: Any) -> str:
    return json.dumps(doc, allow_nan=True)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("fuzz-seeds")
    tiny_onnx(root / "tiny.onnx")
    (root / "data").mkdir()
    np.savez(root / "data" / "b.npz", x=np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32))
    for argv in (
        ["calibrate", "tiny.onnx", "--data", "data", "-o", "q.onnx", "--cache", "c.json", "--no-progress"],
        ["build", "tiny.onnx", "-o", "d.engine", "--shapes", "x:1x4,4x4,8x4", "--no-progress"],
        ["export", "d.engine", "-o", "bundle", "--triton"],
    ):
        run = run_cli_forked(argv, root)
        assert run.returncode == 0, run.stderr
    return {
        "root": root,
        "cache": json.loads((root / "c.json").read_text()),
        "layers": json.loads((root / "d.layers.json").read_text()),
        "manifest": json.loads((root / "bundle" / "manifest.json").read_text()),
        "triton": (root / "bundle" / "triton" / "model" / "config.pbtxt").read_text(),
    }


def _only_workbench_errors(call: Any) -> Any:
    try:
        return call()
    except WorkbenchError:
        return None


# --- calibration caches -----------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_calibration_cache_json(seeds: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, data: Any) -> None:
    from workbench.calib.stats import CalibrationRanges

    path = seeds["root"] / "fuzz.calib.json"
    doc = _mutated(data, seeds["cache"]) if data.draw(st.booleans()) else data.draw(json_values)
    path.write_text(_dumps(doc))
    ranges = _only_workbench_errors(lambda: CalibrationRanges.load(path))
    if ranges is not None:  # accepted: every range is finite and positive, never silently replaced
        assert ranges.amax and all(np.isfinite(v) and v > 0 for v in ranges.amax.values())


tensor_names = st.text(alphabet=string.ascii_letters + string.digits + "/_.:- ", min_size=0, max_size=12)
hex_words = st.one_of(st.text(alphabet="0123456789abcdef", min_size=0, max_size=10), st.text(max_size=10))


@FUZZ
@given(
    header=st.sampled_from(["TRT-8601-EntropyCalibration2", "TRT-", "TRT-x", "TRT-1-2-3-4"]),
    lines=st.lists(st.tuples(tensor_names, st.sampled_from([": ", ":", " ", ""]), hex_words), max_size=6),
    raw=st.binary(max_size=64),
)
def test_tensorrt_text_cache(seeds: dict[str, Any], header: str, lines: list, raw: bytes) -> None:
    from workbench.calib.stats import CalibrationRanges

    path = seeds["root"] / "fuzz.cache"
    body = "\n".join(f"{name}{sep}{value}" for name, sep, value in lines)
    path.write_bytes((header + "\n" + body).encode("utf-8", "replace") + raw)
    ranges = _only_workbench_errors(lambda: CalibrationRanges.load(path))
    if ranges is not None:
        assert ranges.amax and all(np.isfinite(v) and v > 0 for v in ranges.amax.values())


# --- layer records ----------------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_layers_json(seeds: dict[str, Any], data: Any) -> None:
    from workbench.engine.layermap import LayerMap
    from workbench.engine.records import read_layers_document

    path = seeds["root"] / "fuzz.layers.json"
    doc = _mutated(data, seeds["layers"]) if data.draw(st.integers(0, 3)) else data.draw(json_values)
    path.write_text(_dumps(doc))
    document = _only_workbench_errors(lambda: read_layers_document(path))
    assert document is None or isinstance(document, dict)  # a valid document, or a WorkbenchError (nothing else)
    layer_map = _only_workbench_errors(lambda: LayerMap.load(path))
    assert layer_map is None or isinstance(layer_map, LayerMap)


@FUZZ
@given(data=st.data())
def test_engine_artifact_from_layers(seeds: dict[str, Any], data: Any) -> None:
    from workbench.engine.build import EngineArtifact

    root = seeds["root"]
    shutil.copy(root / "d.engine", root / "fz.engine")
    (root / "fz.layers.json").write_text(_dumps(_mutated(data, seeds["layers"])))
    artifact = _only_workbench_errors(lambda: EngineArtifact.load(root / "fz.engine"))
    assert artifact is None or isinstance(artifact, EngineArtifact)


rtx_lines = st.lists(
    st.one_of(
        st.builds(
            lambda n, t, i, o, m: f"Name: {n}, LayerType: {t}, Inputs: [{i}], Outputs: [{o}], Metadata: {m}",
            tensor_names,
            tensor_names,
            st.text(max_size=20),
            st.text(max_size=20),
            st.text(max_size=20),
        ),
        st.text(max_size=40),
    ),
    max_size=5,
)


@FUZZ
@given(lines=rtx_lines, tail=st.text(max_size=40))
def test_rtx_build_log(seeds: dict[str, Any], lines: list[str], tail: str) -> None:
    from workbench.engine.records import EngineLayers, read_layers

    path = seeds["root"] / "fuzz.build.log"
    path.write_text("Layers:\n" + "\n".join(lines) + "\n\nI/O Tensors:\n" + tail)
    layers = _only_workbench_errors(lambda: read_layers(path))
    assert layers is None or isinstance(layers, EngineLayers)


# --- timing JSON ------------------------------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_trtexec_profile_json(seeds: dict[str, Any], data: Any) -> None:
    from workbench.timing.layer_profile import read_trtexec_profile

    seed = [{"count": 10}, {"name": "conv1", "timeMs": 1.0, "averageMs": 0.1, "medianMs": 0.1, "percentage": 50.0}]
    path = seeds["root"] / "fuzz.profile.json"
    doc = _mutated(data, seed) if data.draw(st.booleans()) else data.draw(json_values)
    path.write_text(_dumps(doc))
    profile = _only_workbench_errors(lambda: read_trtexec_profile(path))
    if profile is not None:
        assert all(np.isfinite(layer.time_ms) and layer.time_ms >= 0 for layer in profile.layers)


@FUZZ
@given(doc=json_values)
def test_export_timing_and_accuracy_json(seeds: dict[str, Any], doc: Any) -> None:
    from workbench.export.cli import _read_json

    path = seeds["root"] / "fuzz.timing.json"
    path.write_text(_dumps(doc))
    result = _only_workbench_errors(lambda: _read_json(str(path), "timing"))
    assert result is None or isinstance(result, dict)


# --- bundle manifest and Triton config --------------------------------------------------------------------------


@FUZZ
@given(data=st.data())
def test_bundle_manifest(seeds: dict[str, Any], data: Any) -> None:
    from workbench.export import read_bundle
    from workbench.export.bundle import verify_bundle

    bundle = seeds["root"] / "bundle"
    manifest = bundle / "manifest.json"
    original = manifest.read_text()
    try:
        manifest.write_text(_dumps(_mutated(data, seeds["manifest"])))
        check = _only_workbench_errors(lambda: verify_bundle(bundle))
        loaded = _only_workbench_errors(lambda: read_bundle(bundle))
        if loaded is not None:  # accepted only when every sealed file still matches
            assert check is not None and check.ok
    finally:
        manifest.write_text(original)


@FUZZ
@given(data=st.data())
def test_triton_config(seeds: dict[str, Any], data: Any) -> None:
    from workbench.export import validate_triton_config

    lines = seeds["triton"].splitlines()
    choice = data.draw(st.integers(0, 2))
    if choice == 0 and lines:
        index = data.draw(st.integers(0, len(lines) - 1))
        lines[index] = data.draw(st.text(max_size=30))
        text = "\n".join(lines)
    elif choice == 1:
        text = seeds["triton"][: data.draw(st.integers(0, len(seeds["triton"])))]
    else:
        text = data.draw(st.text(max_size=80))
    config = _only_workbench_errors(lambda: validate_triton_config(text))
    assert config is None or config.platform == "tensorrt_plan" or config.backend == "tensorrt"


@FUZZ
@given(data=st.data())
def test_precision_plan(seeds: dict[str, Any], data: Any) -> None:
    from workbench.precision import PrecisionPlan

    path = seeds["root"] / "fuzz.plan.json"
    seed = {"default": "fp32", "overrides": {"mm": "fp16"}, "note": ""}
    path.write_text(_dumps(_mutated(data, seed) if data.draw(st.booleans()) else data.draw(json_values)))
    plan = _only_workbench_errors(lambda: PrecisionPlan.load(path))
    assert plan is None or isinstance(plan, PrecisionPlan)


FIXTURES = Path(__file__).parent / "fixtures" / "layers"


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("seed_name", ["trt10_resnet_block_fp16.json", "trt11_qdq_int8.json"])
def test_engine_inspector_json(seeds: dict[str, Any], seed_name: str, data: Any) -> None:
    from workbench.engine.records import EngineLayers, read_layers

    seed = json.loads((FIXTURES / seed_name).read_text())
    path = seeds["root"] / "fuzz.inspector.json"
    path.write_text(_dumps(_mutated(data, seed)))
    layers = _only_workbench_errors(lambda: read_layers(path))
    assert layers is None or isinstance(layers, EngineLayers)
