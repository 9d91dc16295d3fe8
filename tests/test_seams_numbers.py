"""Issue 23, seams: numbers that were wrong without a word, and tracebacks at the readers (each through the real CLI
in its own process).

Numbers: a range method that clipped most of a one-sided distribution (entropy on data in [0.1, 1]), a dead tensor
whose scale 0 the next run refused, big-endian .npz batches read as raw bytes, narrowing casts that wrapped int64
or turned 1e300 into inf, duplicate or newline node names that merged nodes in `fusions`.
Tracebacks: a corrupt deflate stream, an .npz header declaring 4 TiB, a sparse 8 GiB .npy, a 20000 x 20000 PNG and
a 48 KB image bomb, WORKBENCH_CACHE on a file or an uncreatable path, an ASCII-only output encoding, a Reshape that
bakes the sequence length (`demo --model`), a ConstantOfShape of 16 GiB.

Refusals follow tests/test_bad_inputs.py's rule: exit 2, one `workbench CMD: error:` line, no traceback, no file
of the workspace changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_runner import REPO, run_cli_forked, run_cli_subprocess, tiny_onnx

BIG_FILE = 64 * 1024 * 1024  # files above this are compared by size and mtime (the sparse 8 GiB .npy)


def _snapshot(root: Path) -> dict[str, str]:
    result: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_dir():
            result[rel + "/"] = "dir"
        elif path.stat().st_size > BIG_FILE:
            result[rel] = f"{path.stat().st_size}:{path.stat().st_mtime_ns}"
        else:
            result[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return result


def _save(model: Any, path: Path) -> None:
    import onnx

    model.ir_version = 8
    onnx.save(model, str(path))


def _graph_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _png(path: Path, width: int, height: int, rows: int | None = None) -> None:
    """A grayscale PNG; ``rows`` limits the pixel data actually written (the header still says ``height``)."""
    compressor = zlib.compressobj(9)
    chunks = []
    line = b"\x00" * (width + 1)
    for _ in range(height if rows is None else rows):
        chunks.append(compressor.compress(line))
    data = b"".join(chunks) + compressor.flush()

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def _npz_with_header(path: Path, shape: tuple[int, ...], payload: bytes) -> None:
    """An .npz whose one member's .npy header declares ``shape`` float32 but holds only ``payload``."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", buffer.getvalue() + payload)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    root = tmp_path_factory.mktemp("seams-numbers")
    rng = np.random.default_rng(0)
    tiny_onnx(root / "tiny.onnx")
    vi = helper.make_tensor_value_info
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0 - 0.5, "W")
    # dead: Relu first, so on all-negative data the MatMul's quantized input is zero everywhere
    _save(
        _graph_model(
            [
                helper.make_node("Relu", ["x"], ["r"], name="relu"),
                helper.make_node("MatMul", ["r", "W"], ["y"], name="mm"),
            ],
            [vi("x", TensorProto.FLOAT, ["N", 4])],
            [vi("y", TensorProto.FLOAT, ["N", 3])],
            [weight],
        ),
        root / "dead.onnx",
    )
    # an int32 input, cast to float before the MatMul
    _save(
        _graph_model(
            [
                helper.make_node("Cast", ["x"], ["f"], name="cast", to=TensorProto.FLOAT),
                helper.make_node("MatMul", ["f", "W"], ["y"], name="mm"),
            ],
            [vi("x", TensorProto.INT32, ["N", 4])],
            [vi("y", TensorProto.FLOAT, ["N", 3])],
            [weight],
        ),
        root / "int32.onnx",
    )
    # two nodes named 'mm' and two named 'act\nrelu'
    w4 = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4) / 10.0 - 0.5, "W4")
    _save(
        _graph_model(
            [
                helper.make_node("MatMul", ["x", "W4"], ["h"], name="mm"),
                helper.make_node("Relu", ["h"], ["r"], name="act\nrelu"),
                helper.make_node("MatMul", ["r", "W"], ["h2"], name="mm"),
                helper.make_node("Sigmoid", ["h2"], ["y"], name="act\nrelu"),
            ],
            [vi("x", TensorProto.FLOAT, ["N", 4])],
            [vi("y", TensorProto.FLOAT, ["N", 3])],
            [w4, weight],
        ),
        root / "names.onnx",
    )
    # the exporter baked batch 1 and sequence 8 into a Reshape
    w16 = numpy_helper.from_array(np.arange(256, dtype=np.float32).reshape(16, 16) / 256.0 - 0.5, "W16")
    baked_shape = numpy_helper.from_array(np.array([1, 8, 2, 8], dtype=np.int64), "baked_shape")
    _save(
        _graph_model(
            [
                helper.make_node("MatMul", ["x", "W16"], ["h"], name="mm"),
                helper.make_node("Reshape", ["h", "baked_shape"], ["r"], name="reshape"),
                helper.make_node("Relu", ["r"], ["y"], name="relu"),
            ],
            [vi("x", TensorProto.FLOAT, ["batch", "seq", 16])],
            [vi("y", TensorProto.FLOAT, [1, 8, 2, 8])],
            [w16, baked_shape],
        ),
        root / "baked.onnx",
    )
    # a ConstantOfShape of 4 x 1024^3 float32 = 16 GiB
    big_shape = numpy_helper.from_array(np.array([4, 1024, 1024, 1024], dtype=np.int64), "big_shape")
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    _save(
        _graph_model(
            [
                helper.make_node("ConstantOfShape", ["big_shape"], ["big"], name="cos", value=one),
                helper.make_node("ReduceMax", ["big"], ["m"], name="rmax", keepdims=0),
                helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
                helper.make_node("Mul", ["h", "m"], ["y"], name="mul"),
            ],
            [vi("x", TensorProto.FLOAT, ["N", 4])],
            [vi("y", TensorProto.FLOAT, ["N", 3])],
            [weight, big_shape],
        ),
        root / "bigconst.onnx",
    )

    def batches(folder: str, feeds: list[dict[str, np.ndarray]]) -> None:
        (root / folder).mkdir()
        for index, feed in enumerate(feeds):
            np.savez(root / folder / f"batch_{index:03d}.npz", **feed)

    one_sided = [rng.uniform(0.1, 1.0, (64, 4)).astype(np.float32) for _ in range(4)]
    batches("onesided", [{"x": x} for x in one_sided])
    batches("negative", [{"x": -rng.uniform(0.5, 1.0, (64, 4)).astype(np.float32)} for _ in range(4)])
    normal = [rng.standard_normal((32, 4)).astype(np.float32) for _ in range(3)]
    batches("little", [{"x": x} for x in normal])
    batches("big", [{"x": x.astype(">f4")} for x in normal])
    batches("wide_int", [{"x": np.array([[1, 2, 3, 2**32 + 5]] * 4, dtype=np.int64)}])
    batches("huge_float", [{"x": np.array([[1.0, 2.0, 3.0, 1e300]] * 4, dtype=np.float64)}])
    # a corrupt deflate stream inside a compressed .npz (the CRC-checked zip directory is intact)
    (root / "corrupt").mkdir()
    np.savez_compressed(root / "corrupt" / "batch_000.npz", x=rng.standard_normal((256, 4)).astype(np.float32))
    with zipfile.ZipFile(root / "corrupt" / "batch_000.npz") as archive:
        info = archive.infolist()[0]
    raw = bytearray((root / "corrupt" / "batch_000.npz").read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for offset in range(start + 8, start + 40):
        raw[offset] ^= 0x5A
    (root / "corrupt" / "batch_000.npz").write_bytes(bytes(raw))
    (root / "tib").mkdir()
    _npz_with_header(root / "tib" / "batch_000.npz", (2**40, 1), b"\x00" * 64)
    # a sparse .npy of 2**29 x 4 float32 = 8 GiB (no disk used)
    sparse = root / "sparse.npy"
    with open(sparse, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<f4", "fortran_order": False, "shape": (2**29, 4)})
        handle.truncate(handle.tell() + 2**29 * 4 * 4)
    (root / "bigimage").mkdir()
    _png(root / "bigimage" / "digit.png", 20_000, 20_000, rows=16)
    (root / "bomb").mkdir()
    _png(root / "bomb" / "digit.png", 9_000, 9_000)  # ~80 KB on disk, 81 megapixels decoded
    (root / "notes.txt").write_text("a user's file\n")
    made = run_cli_forked(["calibrate", "tiny.onnx", "--data", "little", "-o", "q0.onnx", "--no-progress"], root)
    assert made.returncode == 0, made.stderr
    return root


@pytest.fixture(autouse=True)
def _user_files_unchanged(request: pytest.FixtureRequest) -> Any:
    """Every test given the workspace leaves its files as they were (outputs go to tmp_path)."""
    if "ws" not in request.fixturenames:
        yield
        return
    root = request.getfixturevalue("ws")
    before = _snapshot(root)
    yield
    assert _snapshot(root) == before, "a file of the workspace changed"


def _c(id_: str, argv: str, match: str, env: dict[str, str] | None = None) -> Any:
    return pytest.param(argv.split(), match, env, id=id_)


CAL = "calibrate tiny.onnx -o q.onnx --no-progress --data"
REFUSED = [
    # --- narrowing casts that overflow ---------------------------------------------------------------------------
    _c("clean-data-int64-wraps-int32", "clean int32.onnx -o c.onnx --data wide_int", r"outside int32"),
    _c("clean-data-1e300-to-inf", "clean tiny.onnx -o c.onnx --data huge_float", r"overflow float32"),
    # --- .npz / .npy readers --------------------------------------------------------------------------------------
    _c("cal-data-corrupt-deflate", f"{CAL} corrupt", r"batch_000.npz: not a readable .npz"),
    _c(
        "diff-data-corrupt-deflate",
        "diff tiny.onnx q0.onnx --data corrupt -o d.json --no-progress",
        "not a readable .npz",
    ),
    _c("clean-data-corrupt-deflate", "clean tiny.onnx -o c.onnx --data corrupt", r"batch_000.npz: not a readable .npz"),
    _c("cal-data-npz-4tib-header", f"{CAL} tib", r"4\.0 TiB"),
    _c("clean-data-npz-4tib-header", "clean tiny.onnx -o c.onnx --data tib", r"4\.0 TiB"),
    _c("clean-data-sparse-8gib-npy", "clean tiny.onnx -o c.onnx --data sparse.npy", r"8\.0 GiB"),
    # --- image readers --------------------------------------------------------------------------------------------
    _c("cal-images-20000x20000", "calibrate digits-cnn --data bigimage -o q.onnx --no-progress", r"400,000,000 pix"),
    _c("cal-images-bomb", "calibrate digits-cnn --data bomb -o q.onnx --no-progress", r"81,000,000 pixels"),
    # --- the zoo cache --------------------------------------------------------------------------------------------
    _c("cache-is-a-file", "zoo eval digits-cnn --limit 8", "is a file", {"WORKBENCH_CACHE": "notes.txt"}),
    _c("cache-below-a-file", "zoo eval digits-cnn --limit 8", "cannot be created", {"WORKBENCH_CACHE": "notes.txt/c"}),
    _c("cache-uncreatable", "zoo eval digits-cnn --limit 8", "cannot be created", {"WORKBENCH_CACHE": "/proc/wb"}),
]


@pytest.mark.parametrize("argv, match, env", REFUSED)
def test_refused_cleanly(ws: Path, argv: list[str], match: str, env: dict[str, str] | None) -> None:
    before = _snapshot(ws)
    run = run_cli_forked(argv, ws, env=env)
    after = _snapshot(ws)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert [line for line in run.stderr.splitlines() if ": error:" in line], run.stderr
    assert re.search(match, run.stderr), (match, run.stderr)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, f"files changed: {sorted(changed)}"


def _limited_memory() -> None:  # in the child: the 16 GiB tensor must never be allocated, whatever the fix
    resource.setrlimit(resource.RLIMIT_AS, (6 * 1024**3, 6 * 1024**3))


def _run_limited(ws: Path, argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workbench", *argv.split()],
        cwd=ws,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited_memory,
    )


@pytest.mark.parametrize(
    "argv", ["calibrate bigconst.onnx --data little -o q.onnx --no-progress", "clean bigconst.onnx -o c.onnx"]
)
def test_constant_of_shape_16gib_refused_before_ort(ws: Path, argv: str) -> None:
    before = _snapshot(ws)
    proc = _run_limited(ws, argv)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert re.search(r"'cos' \(ConstantOfShape\).*16\.0 GiB", proc.stderr), proc.stderr
    assert "ONNXRuntimeError" not in proc.stderr and "Failed to allocate" not in proc.stderr  # refused before ORT
    assert _snapshot(ws) == before


def test_constant_folding_leaves_a_16gib_constant_unevaluated(ws: Path, tmp_path: Path) -> None:
    """`clean --no-check` runs no model, but folding ConstantOfShape -> ReduceMax would evaluate 16 GiB in ORT."""
    proc = _run_limited(ws, f"clean bigconst.onnx -o {tmp_path / 'c.onnx'} --no-check")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Failed to allocate" not in proc.stdout + proc.stderr  # ORT never asked for the 16 GiB
    assert (tmp_path / "c.onnx").is_file()


def test_demo_model_with_baked_reshape_is_an_error_with_a_report(ws: Path, tmp_path: Path) -> None:
    run = run_cli_forked(["demo", "--model", str(ws / "baked.onnx"), "--out", str(tmp_path / "demo")], ws, timeout=300)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Reshape" in run.stderr
    assert (tmp_path / "demo" / "report.html").is_file()


@pytest.mark.parametrize(
    "env",
    [{"PYTHONIOENCODING": "ascii"}, {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}],
    ids=["pythonioencoding-ascii", "lc-all-c"],
)
def test_unicode_output_in_an_ascii_locale(tmp_path: Path, env: dict[str, str]) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from fixtures.unseen_models import write_model

    path = write_model("odd-names", tmp_path)
    run = run_cli_subprocess(["model", str(path)], tmp_path, env=env)
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.returncode == 0, run.stderr[-3000:]
    assert "\\u03c0" in run.stdout  # 'π' in an output name, escaped


# --- numbers that stay true (exit 0, but the numbers are now right and the change is said) ----------------------


def test_entropy_on_one_sided_data_falls_back_and_says_so(ws: Path, tmp_path: Path) -> None:
    cache, diff = tmp_path / "c.json", tmp_path / "d.json"
    argv = (
        f"calibrate tiny.onnx --data onesided --method entropy -o {tmp_path}/q.onnx --no-progress --cache {cache} "
        f"--diff {diff}"
    )
    run = run_cli_forked(argv.split(), ws)
    assert run.returncode == 0, run.stderr
    assert re.search(r"warning: tensor 'x': entropy chose amax 0\.1\d*, which clips 9\d\.\d% ", run.stdout), run.stdout
    entry = json.loads(cache.read_text())["tensors"]["x"]
    assert 0.99 < entry["amax"] <= 1.0  # the data's range, not 0.1
    # the mse range may trim the last bins, where that saves more rounding error than it clips (0.6 %, 2026-12-06)
    assert entry["clipped_fraction"] < 0.01 and "entropy chose" in entry["note"]
    x = next(t for t in json.loads(diff.read_text())["tensors"] if t["name"] == "x")
    assert x["sqnr_db_local"] > 40.0  # 1.3 dB when 99 % of the values were clipped


def test_dead_tensor_gets_a_valid_scale_and_the_cache_is_reusable(ws: Path, tmp_path: Path) -> None:
    cache = tmp_path / "dead.json"
    argv = f"calibrate dead.onnx --data negative -o {tmp_path}/q.onnx --no-progress --cache {cache}"
    first = run_cli_forked(argv.split(), ws)
    assert first.returncode == 0, first.stderr
    assert "dead tensor" in first.stdout
    entry = json.loads(cache.read_text())["tensors"]["r"]
    assert entry["amax"] > 0 and entry["scale"] > 0 and "dead tensor" in entry["note"]
    written = cache.read_bytes()
    again = run_cli_forked(argv.split(), ws)  # the next run reads the cache instead of refusing it
    assert again.returncode == 0, again.stderr
    assert "no statistics gathered" in again.stdout
    assert cache.read_bytes() == written


def test_big_endian_batches_give_the_same_ranges_and_diff(ws: Path, tmp_path: Path) -> None:
    results = {}
    for folder in ("little", "big"):
        cache, diff = tmp_path / f"{folder}.json", tmp_path / f"{folder}-diff.json"
        argv = f"calibrate tiny.onnx --data {folder} -o {tmp_path}/{folder}.onnx --no-progress --cache {cache} --diff {diff}"
        run = run_cli_forked(argv.split(), ws)
        assert run.returncode == 0, run.stderr
        diffs = {t["name"]: t["sqnr_db_local"] for t in json.loads(diff.read_text())["tensors"]}
        results[folder] = (json.loads(cache.read_text())["tensors"]["x"]["amax"], diffs["x"])
    assert results["big"] == results["little"]
    assert results["big"][0] < 10.0  # standard normal data, not 5.8e37 from misread bytes


def test_duplicate_and_newline_node_names_stay_apart_in_fusions(ws: Path, tmp_path: Path) -> None:
    engine = tmp_path / "names.engine"
    build = run_cli_forked(
        ["build", "names.onnx", "-o", str(engine), "--shapes", "x:1x4,4x4,8x4", "--no-progress"], ws, timeout=300
    )
    assert build.returncode == 0, build.stderr
    document = json.loads((tmp_path / "names.layers.json").read_text())
    names = [node["name"] for node in document["onnx_nodes"]]
    assert names == ["mm", "act\\nrelu", "mm~2", "act\\nrelu~2"]  # unique, and the newline shown escaped
    assert all(node["engine_layers"] for node in document["onnx_nodes"])  # none lost to a merged or cut name
    assert any("renamed for the build" in note for note in document["build"]["warnings"])
    fusions = run_cli_forked(["fusions", str(tmp_path / "names.layers.json")], ws)
    assert fusions.returncode == 0, fusions.stderr
    assert "folded away: 0 nodes" in fusions.stdout, fusions.stdout
    # the user's own ONNX (names unfixed) maps the same way: the names are fixed as the build fixed them
    given = run_cli_forked(["fusions", str(tmp_path / "names.layers.json"), "--onnx", "names.onnx"], ws)
    assert given.returncode == 0 and "folded away: 0 nodes" in given.stdout, given.stdout + given.stderr
    assert "\n" not in "".join(names)


# --- the range guard on histograms (no model) ---------------------------------------------------------------------


def _statistics(values: dict[str, np.ndarray]) -> Any:
    from workbench.calib.histogram import TensorHistogram
    from workbench.calib.stats import CalibrationStatistics

    histograms = {}
    for name, array in values.items():
        histograms[name] = TensorHistogram(name)
        histograms[name].add(array)
    return CalibrationStatistics(histograms, "sha", "digest", "data", 1, 1000, 0.0)


def test_guard_changes_only_ranges_that_clip_most_of_the_data() -> None:
    from workbench.calib.methods import clipped_fraction, compute_amax

    rng = np.random.default_rng(1)
    statistics = _statistics(
        {
            "one_sided": rng.uniform(0.5, 1.0, 20_000).astype(np.float32),
            "negative_band": -rng.uniform(0.7, 1.7, 20_000).astype(np.float32),
            "gaussian": rng.standard_normal(20_000).astype(np.float32),
            "relu": np.maximum(rng.standard_normal(20_000), 0).astype(np.float32),
            "dead": np.zeros(20_000, np.float32),
        }
    )
    raw = {name: compute_amax(hist, "entropy") for name, hist in statistics.histograms.items()}
    assert clipped_fraction(statistics.histograms["one_sided"], raw["one_sided"]) > 0.9  # what entropy did
    ranges = statistics.ranges("entropy")
    assert set(ranges.range_notes) == {"one_sided", "negative_band", "dead"}
    assert ranges.amax["one_sided"] > 0.99 and ranges.amax["negative_band"] > 1.69
    assert ranges.amax["gaussian"] == raw["gaussian"] and ranges.amax["relu"] == raw["relu"]
    assert ranges.amax["dead"] == 1.0 and "dead tensor" in ranges.range_notes["dead"]
    assert max(ranges.clipped.values()) < 0.01
    assert any("one_sided" in warning for warning in ranges.warnings)
    for method in ("max", "percentile", "mse"):  # they never clip most of the data: nothing but the dead tensor
        assert set(statistics.ranges(method).range_notes) == {"dead"}
    reloaded = type(ranges).from_json(json.loads(json.dumps(ranges.to_json())))
    assert reloaded.range_notes == ranges.range_notes and reloaded.amax == ranges.amax


def test_demo_calibrate_summary_names_the_changed_ranges(tmp_path: Path) -> None:
    from workbench.flow.artifacts import Calibration
    from workbench.flow.stages import summary_calibrate

    ranges = _statistics({"x": np.random.default_rng(2).uniform(0.1, 1.0, 5_000).astype(np.float32)}).ranges("entropy")
    calibration = Calibration("entropy", ranges, 1000, 0.0, tmp_path / "c.json", tmp_path / "q.onnx", 2)
    summary = summary_calibrate(calibration, None)  # type: ignore[arg-type]
    assert "1 range(s) not the method's own choice" in summary and "entropy chose amax" in summary


def test_diff_reads_big_endian_batches_as_numbers(ws: Path, tmp_path: Path) -> None:
    sqnr = {}
    for folder in ("little", "big"):
        out = tmp_path / f"{folder}.json"
        run = run_cli_forked(["diff", "tiny.onnx", "q0.onnx", "--data", folder, "-o", str(out), "--no-progress"], ws)
        assert run.returncode == 0, run.stderr
        sqnr[folder] = {t["name"]: t["sqnr_db_local"] for t in json.loads(out.read_text())["tensors"]}
    assert sqnr["big"] == sqnr["little"]
    assert 20.0 < sqnr["big"]["x"] < 80.0  # int8 noise on standard normal data, not 0 dB from misread bytes
