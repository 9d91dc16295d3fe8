"""A catalogue of bad inputs against every CLI command, through the real CLI in its own process.

Each case must: exit with status 2, print one `workbench CMD: error: ...` line naming the problem (the regex),
show no traceback, and leave every file in the workspace unchanged (sha256 of every file, hidden ones included,
before and after: no partial output, no temp file, no replaced input).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_runner import run_cli_forked, run_cli_subprocess, snapshot, tiny_onnx

BIG = str(2**40)
ABOVE_INT64 = str(2**64)


def _write(root: Path, name: str, content: Any) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))


def _npz(folder: Path, arrays: list[dict[str, Any]], *, allow_pickle: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for index, feed in enumerate(arrays):
        np.savez(folder / f"batch_{index:05d}.npz", **feed)


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnx import TensorProto

    root = tmp_path_factory.mktemp("bad-inputs")
    tiny_onnx(root / "tiny.onnx")
    tiny_onnx(root / "huge.onnx", shape=[2**40, 4])
    tiny_onnx(root / "string.onnx", shape=["N", 4], dtype=TensorProto.STRING)
    _write(root, "garbage.onnx", b"\x00\x01not an onnx model" * 10)
    _write(root, "empty.onnx", b"")
    _write(root, "notes.txt", "a user's file\n")
    (root / "link.onnx").symlink_to("tiny.onnx")
    import os

    os.link(root / "tiny.onnx", root / "hard.onnx")
    rng = np.random.default_rng(0)
    _npz(root / "data", [{"x": rng.standard_normal((8, 4)).astype(np.float32)} for _ in range(3)])
    _npz(root / "nan", [{"x": np.full((8, 4), np.nan, np.float32)}])
    _npz(root / "zero", [{"x": np.zeros((8, 4), np.float32)} for _ in range(2)])
    _npz(root / "nosamples", [{"x": np.zeros((0, 4), np.float32)}])
    _npz(root / "strings", [{"x": np.array([["a"] * 4] * 8)}])
    _npz(root / "wrongkey", [{"z": rng.standard_normal((8, 4)).astype(np.float32)}])
    (root / "pickled").mkdir()
    np.savez(root / "pickled" / "batch_00000.npz", x=np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (root / "nodata").mkdir()
    (root / "userdir").mkdir()
    _write(root, "userdir/thesis.txt", "precious\n")
    (root / "emptydir").mkdir()

    def setup(argv: list[str]) -> None:
        run = run_cli_forked(argv, root)
        assert run.returncode == 0, run.stderr

    setup(["calibrate", "tiny.onnx", "--data", "data", "-o", "q.onnx", "--cache", "c.json", "--no-progress"])
    shapes = ["--shapes", "x:1x4,4x4,8x4", "--no-progress"]
    setup(["build", "tiny.onnx", "-o", "d.engine", *shapes])
    setup(["build", "tiny.onnx", "-o", "d16.engine", "--precision", "fp16", *shapes])
    setup(["export", "d.engine", "-o", "bundle", "--triton"])
    _write(root, "plan.json", {"default": "fp32", "overrides": {}})

    # calibration caches: ours (JSON) and TensorRT <= 10 text caches
    good = json.loads((root / "c.json").read_text())
    first = next(iter(good["tensors"]))

    def cache(name: str, change: Any) -> None:
        data = json.loads(json.dumps(good))
        change(data)
        _write(root, f"caches/{name}.json", data)

    cache("amax_zero", lambda d: d["tensors"][first].update(amax=0.0))
    cache("amax_negative", lambda d: d["tensors"][first].update(amax=-3.0))
    cache("amax_string", lambda d: d["tensors"][first].update(amax="big"))
    cache("amax_null", lambda d: d["tensors"][first].update(amax=None))
    cache("tensors_list", lambda d: d.update(tensors=[1, 2]))
    cache("no_tensors", lambda d: d.pop("tensors"))
    cache("wrong_format", lambda d: d.update(format="something-else"))
    cache("percentile_200", lambda d: d.update(percentile=200))
    cache("warnings_int", lambda d: d.update(warnings=5))
    cache("stats_garbage", lambda d: d.update(statistics={"histograms": {"t": {"bins": "x"}}}))
    _write(root, "caches/amax_nan.json", (root / "caches/amax_zero.json").read_text().replace("0.0", "NaN", 1))
    _write(root, "caches/deep.json", "[" * 100000 + "]" * 100000)
    _write(root, "caches/truncated.json", (root / "c.json").read_text()[:50])
    _write(root, "caches/list.json", "[1, 2, 3]")
    _write(root, "caches/binary.json", b"\xff\xfe\x00garbage")
    _write(root, "caches/trt_zero.cache", f"TRT-8601-EntropyCalibration2\n{first}: 00000000\n")
    _write(root, "caches/trt_nan.cache", f"TRT-8601-EntropyCalibration2\n{first}: 7fc00000\n")
    _write(root, "caches/trt_negative.cache", f"TRT-8601-EntropyCalibration2\n{first}: bf800000\n")
    _write(root, "caches/trt_inf.cache", f"TRT-8601-EntropyCalibration2\n{first}: 7f800000\n")
    _write(root, "caches/trt_malformed.cache", "TRT-8601-EntropyCalibration2\nno colon here\n")
    _write(root, "caches/trt_badhex.cache", f"TRT-8601-EntropyCalibration2\n{first}: zzzz\n")
    _write(root, "caches/trt_empty.cache", "TRT-8601-EntropyCalibration2\n")

    # layer records: the real one, with one field broken at a time
    layers = json.loads((root / "d.layers.json").read_text())

    def layer_doc(name: str, change: Any) -> None:
        data = json.loads(json.dumps(layers))
        change(data)
        _write(root, f"layers/{name}.layers.json", data)

    layer_doc("no_engine_layers", lambda d: d.pop("engine_layers"))
    layer_doc("layers_dict", lambda d: d.update(engine_layers={"a": 1}))
    layer_doc("layer_int", lambda d: d["engine_layers"].__setitem__(0, 5))
    layer_doc("name_int", lambda d: d["engine_layers"][0].update(name=7))
    layer_doc("stream_negative", lambda d: d["engine_layers"][0].update(stream_id=-1))
    layer_doc("onnx_nodes_int", lambda d: d["engine_layers"][0].update(onnx_nodes=[1, 2]))
    layer_doc("inputs_dims_str", lambda d: d["engine_layers"][-1].update(inputs=[{"name": "a", "dimensions": ["x"]}]))
    layer_doc("io_not_list", lambda d: d.update(io_tensors="x"))
    layer_doc("qdq_edges_bad", lambda d: d.update(qdq_edges=[[1]]))
    layer_doc("build_sha_bad", lambda d: d["build"].update(engine_sha256="xyz"))
    layer_doc("build_profiles_bad", lambda d: d["build"].update(profiles={"x": [[0, 4], [1, 4]]}))
    layer_doc("build_seconds_str", lambda d: d["build"].update(build_seconds="fast"))
    layer_doc("build_list", lambda d: d.update(build=[1]))
    layer_doc("onnx_nodes_str", lambda d: d.update(onnx_nodes="x"))
    _write(root, "layers/deep.layers.json", '{"engine_layers": ' + "[" * 5000 + "]" * 5000 + "}")
    _write(root, "layers/truncated.layers.json", (root / "d.layers.json").read_text()[:100])
    _write(root, "layers/array.layers.json", "[]")

    # engines that must not be exported
    import hashlib

    for name, data in (("empty", b""), ("garbage", b"garbage!" * 200)):
        _write(root, f"{name}.engine", data)  # with layer records that claim exactly these bytes
        layers_doc = json.loads((root / "d.layers.json").read_text())
        layers_doc["build"]["engine_sha256"] = hashlib.sha256(data).hexdigest()
        _write(root, f"{name}.layers.json", layers_doc)
    shutil.copy(root / "d.engine", root / "swapped.engine")
    shutil.copy(root / "d16.layers.json", root / "swapped.layers.json")  # the kill-between-renames pairing
    shutil.copy(root / "d.engine", root / "nolayers.engine")

    # timing / accuracy JSON for export
    _write(root, "timing_list.json", "[1, 2]")
    _write(root, "timing_nan.json", '{"p50_ms": NaN}')
    _write(root, "timing_deep.json", '{"a": ' + "[" * 10000 + "]" * 10000 + "}")
    _write(root, "timing_bad.json", "{not json")

    # bundles broken in one way each (verify / export --overwrite)
    def bundle(name: str, change: Any) -> None:
        target = root / "bundles" / name
        shutil.copytree(root / "bundle", target, symlinks=True)
        change(target)

    def edit_manifest(change: Any) -> Any:
        def apply(target: Path) -> None:
            manifest = json.loads((target / "manifest.json").read_text())
            change(manifest)
            (target / "manifest.json").write_text(json.dumps(manifest))

        return apply

    def flip(rel: str) -> Any:
        def apply(target: Path) -> None:
            data = bytearray((target / rel).read_bytes())
            data[len(data) // 2] ^= 0xFF
            (target / rel).write_bytes(bytes(data))

        return apply

    bundle("engine_flipped", flip("model.engine"))
    bundle("layers_flipped", flip("model.layers.json"))
    bundle("plan_flipped", flip("triton/model/1/model.plan"))
    bundle("config_flipped", flip("triton/model/config.pbtxt"))
    bundle("engine_truncated", lambda t: (t / "model.engine").write_bytes((t / "model.engine").read_bytes()[:100]))
    bundle("engine_missing", lambda t: (t / "model.engine").unlink())
    bundle("extra_file", lambda t: (t / "evil.so").write_bytes(b"x"))
    bundle("engine_dotdot", edit_manifest(lambda m: m["engine"].update(file="../../d.engine")))
    bundle("files_dotdot", edit_manifest(lambda m: m["files"].update({"../d.engine": m["files"]["model.engine"]})))
    bundle("files_absolute", edit_manifest(lambda m: m["files"].update({"/etc/hostname": m["files"]["model.engine"]})))
    bundle("manifest_not_json", lambda t: (t / "manifest.json").write_text("{oops"))
    bundle("manifest_list", lambda t: (t / "manifest.json").write_text("[]"))
    bundle("manifest_format", edit_manifest(lambda m: m.update(format="other")))
    bundle("manifest_no_files", edit_manifest(lambda m: m.pop("files")))
    bundle("manifest_engine_str", edit_manifest(lambda m: m.update(engine="model.engine")))
    bundle("manifest_version", edit_manifest(lambda m: m.update(format_version=99)))
    bundle("manifest_sha_short", edit_manifest(lambda m: m["files"]["model.engine"].update(sha256="abc")))
    bundle("manifest_bytes_negative", edit_manifest(lambda m: m["files"]["model.engine"].update(bytes=-1)))

    def symlink_out(target: Path) -> None:
        (target / "model.engine").unlink()
        (target / "model.engine").symlink_to(root / "d.engine")

    bundle("engine_symlink_out", symlink_out)

    def swap_layers(target: Path) -> None:  # layer records of another engine, with the manifest "fixed" to match
        import hashlib

        shutil.copy(root / "d16.layers.json", target / "model.layers.json")
        data = (target / "model.layers.json").read_bytes()
        manifest = json.loads((target / "manifest.json").read_text())
        manifest["files"]["model.layers.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        (target / "manifest.json").write_text(json.dumps(manifest))

    bundle("layers_swapped", swap_layers)
    (root / "bundles" / "no_manifest").mkdir()
    _write(root, "bundles/no_manifest/model.engine", (root / "d.engine").read_bytes())
    return root


def _c(id_: str, argv: str | list[str], match: str, env: dict[str, str] | None = None) -> Any:
    return pytest.param(argv.split() if isinstance(argv, str) else argv, match, env, id=id_)


_DEMO_SETTING = {  # settings are checked by QuickstartConfig, whose messages name the setting
    "--streams": "streams=",
    "--batch": "batch=",
    "--max-metric-drop": "max_metric_drop=",
    "--calibration-samples": "calibration_samples=",
    "--eval-samples": "evaluation_samples=",
}
TIME = "time tiny.onnx --executor cpu -o t.json --no-baseline --streams 1"
CAL = "calibrate tiny.onnx --data data -o q2.onnx --no-progress"
BUILD = "build tiny.onnx --no-progress"

CASES = [
    # --- time: bounded options (argparse) -------------------------------------------------------------------
    *[
        _c(f"time-{opt}-{value}", f"{TIME} {opt} {value}", re.escape(opt))
        for opt, values in {
            "--warmup": ["-1", "nan", "inf", "abc", "1e309"],
            "--rate": ["nan", "0", "-5", "inf"],
            "--batch": ["0", "-1", BIG, "abc", "1.5"],
            "--streams": ["0", "-1", "a", "1,,x", "100000"],
            "--depth": ["0", "-3"],
            "--max-batch": ["0"],
            "--max-delay-ms": ["-1", "nan"],
            "--timeout-ms": ["0", "nan"],
            "--window": ["0", "nan", "-2"],
            "--max-windows": ["0"],
        }.items()
        for value in values
    ],
    _c(
        "time-batch-100000-memory",
        "time tiny.onnx -o t.json --batch 100000 --streams 1 --shape x:1x4000000",
        r"needs .*more than",
    ),
    _c("time-zoo-batch-100000", "time digits-cnn -o t.json --batch 100000", r"needs .*more than this machine"),
    _c("time-o-dir", "time tiny.onnx -o data", "is a directory"),
    _c("time-o-symlink-to-model", "time tiny.onnx -o link.onnx", "is the input"),
    _c("time-o-is-model", "time tiny.onnx -o tiny.onnx", "is the input"),
    _c("time-trace-dir", f"{TIME} --trace data", "is a directory"),
    _c("time-trace-same-as-o", f"{TIME} --trace t.json", "also given as"),
    _c("time-o-under-file", "time tiny.onnx -o notes.txt/t.json", "not a directory"),
    _c("time-o-proc", "time tiny.onnx -o /proc/t.json", "not writable"),
    _c("time-shape-huge", f"{TIME} --shape x:1x{BIG}", r"needs .*more than|out of range"),
    _c("time-string-input", "time string.onnx -o t.json --streams 1 --no-baseline", "string"),
    _c("time-huge-model", "time huge.onnx -o t.json --streams 1 --no-baseline", r"out of range|needs"),
    _c("time-open-no-rate", f"{TIME} --load open", "needs --rate"),
    _c("time-dynbatch-closed", f"{TIME} --dynamic-batching", "open-loop"),
    _c("time-trt-batch-above-profile", "time d.engine --executor trt -o t.json --batch 9", "profile maximum 8"),
    _c("time-missing-model", "time nope.onnx -o t.json", "nope"),
    _c("time-garbage-model", "time garbage.onnx -o t.json --no-baseline --streams 1", "garbage.onnx"),
    _c("time-priorities-bad", f"{TIME} --priorities=a,b", "priorities"),
    # --- build ------------------------------------------------------------------------------------------------
    _c("build-o-is-model", f"{BUILD} -o tiny.onnx", "is the input"),
    _c("build-o-dir", f"{BUILD} -o data", "is a directory"),
    _c("build-o-symlink-to-model", f"{BUILD} -o link.onnx", "is the input"),
    _c("build-o-hardlink-to-model", f"{BUILD} -o hard.onnx", "is the input"),
    _c("build-string-model", "build string.onnx -o s.engine --no-progress", "string-typed"),
    _c("build-o-proc", f"{BUILD} -o /proc/m.engine", "not writable"),
    _c("build-o-under-file", f"{BUILD} -o notes.txt/m.engine", "not a directory"),
    _c("build-o-trailing-slash", f"{BUILD} -o newdir/", "separator|directory"),
    _c(
        "build-layers-is-model",
        "build tiny.onnx --no-progress -o tiny.engine --plan tiny.layers.json",
        "no such|tiny.layers.json",
    ),
    _c("build-plan-is-output", f"{BUILD} -o plan.json --plan plan.json", "is the input"),
    _c("build-timing-cache-dir", f"{BUILD} -o m.engine --timing-cache data", "is a directory"),
    *[
        _c(f"build-shapes-{i}", f"{BUILD} -o m.engine --shapes {spec}", match)
        for i, (spec, match) in enumerate(
            [
                (f"x:1x{ABOVE_INT64}", "above|out of range"),
                (f"x:{BIG}x4", "above|out of range"),
                ("x:0x4", "positive"),
                ("x:abc", "cannot read --shapes"),
                ("x:1x4,2x4", "cannot read --shapes"),
                ("x:4x4,2x4,8x4", "ordered"),
                ("x:1x4,2x4x3,8x4", "rank"),
                ("y:1x4", "does not have"),
                ("1x4", "cannot read --shapes"),
                ("x:-1x4", "cannot read --shapes"),
            ]
        )
    ],
    *[
        _c(f"build-{opt}-{value}", f"{BUILD} -o m.engine {opt} {value}", re.escape(opt))
        for opt, values in {"--opt-level": ["9", "-1", "abc"], "--workspace-mib": ["0", "-5", BIG]}.items()
        for value in values
    ],
    _c("build-plan-missing", f"{BUILD} -o m.engine --plan nope.json", "no such file"),
    _c("build-plan-not-json", f"{BUILD} -o m.engine --plan timing_bad.json", "not valid JSON"),
    _c("build-plan-deep", f"{BUILD} -o m.engine --plan timing_deep.json", "nested"),
    _c("build-plan-list", f"{BUILD} -o m.engine --plan timing_list.json", "default"),
    _c("build-model-missing", f"{BUILD} nope.onnx -o m.engine", "nope"),
    _c("build-model-garbage", "build garbage.onnx -o m.engine --no-progress", "garbage.onnx"),
    _c("build-model-empty", "build empty.onnx -o m.engine --no-progress", "empty.onnx"),
    _c("build-model-dir", "build data -o m.engine --no-progress", "data"),
    # --- clean ------------------------------------------------------------------------------------------------
    _c("clean-o-is-input", "clean tiny.onnx -o tiny.onnx", "is the input"),
    _c("clean-o-dir", "clean tiny.onnx -o data", "is a directory"),
    _c("clean-report-dir", "clean tiny.onnx -o c.onnx --report data", "is a directory"),
    _c("clean-report-same-as-o", "clean tiny.onnx -o c.onnx --report c.onnx", "also given as"),
    _c("clean-report-is-input", "clean tiny.onnx -o c.onnx --report tiny.onnx", "is the input"),
    _c("clean-o-proc", "clean tiny.onnx -o /proc/c.onnx", "not writable"),
    _c("clean-o-under-file", "clean tiny.onnx -o notes.txt/c.onnx", "not a directory"),
    _c("clean-shape-huge", f"clean tiny.onnx -o c.onnx --shape x:{BIG},4", "out of range"),
    _c("clean-shape-negative", "clean tiny.onnx -o c.onnx --shape x:-4,4", "out of range"),
    _c("clean-shape-bad", "clean tiny.onnx -o c.onnx --shape nocolon", "NAME:D0"),
    _c("clean-profile-huge", f"clean tiny.onnx -o c.onnx --profile x:1x4/2x4/{BIG}x4", "out of range"),
    _c("clean-profile-memory", "clean tiny.onnx -o c.onnx --profile x:1x4/2x4/2000000000x4", "needs"),
    _c("clean-profile-bad", "clean tiny.onnx -o c.onnx --profile x:1x4/2x4", "MIN/OPT/MAX"),
    _c("clean-fold-negative", "clean tiny.onnx -o c.onnx --fold-size-threshold -1", "fold-size-threshold"),
    _c("clean-fold-abc", "clean tiny.onnx -o c.onnx --fold-size-threshold abc", "fold-size-threshold"),
    _c("clean-unknown-pass", "clean tiny.onnx -o c.onnx --passes nosuchpass", "nosuchpass"),
    _c("clean-huge-model", "clean huge.onnx -o c.onnx", r"out of range|needs"),
    _c("clean-string-model", "clean string.onnx -o c.onnx", "string"),
    _c("clean-missing", "clean nope.onnx -o c.onnx", "nope"),
    _c("clean-garbage", "clean garbage.onnx -o c.onnx", "garbage.onnx"),
    _c("clean-empty", "clean empty.onnx -o c.onnx", "empty.onnx"),
    _c("clean-no-output", "clean tiny.onnx", "-o OUTPUT"),
    _c("clean-o-in-data", "clean tiny.onnx -o data/c.onnx --data data", "inside the input folder"),
    _c("clean-check-batches-0", "clean tiny.onnx -o c.onnx --data data --check-batches 0", "--check-batches"),
    _c("clean-data-missing", "clean tiny.onnx -o c.onnx --data nofolder", "nofolder"),
    # --- calibrate --------------------------------------------------------------------------------------------
    _c("cal-o-is-model", "calibrate tiny.onnx --data data -o tiny.onnx", "is the input"),
    _c("cal-o-dir", "calibrate tiny.onnx --data data -o data", "is a directory"),
    _c("cal-o-in-data", "calibrate tiny.onnx --data data -o data/q.onnx", "inside the input folder"),
    _c("cal-cache-dir", f"{CAL} --cache data", "is a directory"),
    _c("cal-cache-same-as-o", f"{CAL} --cache q2.onnx", "also given as"),
    _c("cal-diff-dir", f"{CAL} --diff data", "is a directory"),
    _c("cal-diff-is-model", f"{CAL} --diff tiny.onnx", "is the input"),
    _c(
        "cal-search-report-dir",
        "calibrate digits-cnn -o q2.onnx --target-drop 0.01 --search-report data",
        "is a directory",
    ),
    _c(
        "cal-search-report-same-as-o",
        "calibrate digits-cnn -o q2.onnx --target-drop 0.01 --search-report q2.onnx",
        "also given as",
    ),
    _c("cal-target-drop-nan", f"{CAL} --target-drop nan", "--target-drop"),
    _c("cal-budget-0", f"{CAL} --budget 0", "--budget"),
    _c("diff-threshold-nan", "diff tiny.onnx q.onnx --data data -o d.json --threshold nan", "--threshold"),
    _c("cal-o-proc", "calibrate tiny.onnx --data data -o /proc/q.onnx", "not writable"),
    _c("cal-data-nan", "calibrate tiny.onnx --data nan -o q2.onnx --no-progress", "NaN"),
    _c("cal-data-zero", "calibrate tiny.onnx --data zero -o q2.onnx --no-progress", "zero in every batch"),
    _c("cal-data-no-samples", "calibrate tiny.onnx --data nosamples -o q2.onnx --no-progress", "no samples"),
    _c("cal-data-strings", "calibrate tiny.onnx --data strings -o q2.onnx --no-progress", "dtype"),
    _c("cal-data-wrong-key", "calibrate tiny.onnx --data wrongkey -o q2.onnx --no-progress", "model inputs|lacks"),
    _c("cal-data-pickled", "calibrate tiny.onnx --data pickled -o q2.onnx --no-progress", r"npz|pickle"),
    _c("cal-data-empty-folder", "calibrate tiny.onnx --data nodata -o q2.onnx --no-progress", "no .npz"),
    _c("cal-data-missing", "calibrate tiny.onnx --data nofolder -o q2.onnx --no-progress", "nofolder"),
    _c("cal-no-data", "calibrate tiny.onnx -o q2.onnx --no-progress", "no calibration data"),
    _c("cal-huge-model", "calibrate huge.onnx --data random -o q2.onnx --no-progress", r"out of range|needs"),
    _c("cal-string-model", "calibrate string.onnx --data random -o q2.onnx --no-progress", "string"),
    _c("cal-keep-unknown", f"{CAL} --keep nosuchnode", "unknown node"),
    _c("cal-target-removed", f"{CAL} --target 0.9", "--target 0.9 was removed.*--target-drop"),
    _c("cal-fallback-worst-removed", f"{CAL} --fallback-worst 3", "--fallback-worst 3 was removed.*--target-drop"),
    _c("cal-target-drop-own-file-no-data", "calibrate tiny.onnx --target-drop 0.01 -o q2.onnx", "needs samples"),
    *[
        _c(f"cal-{opt}-{value}", f"{CAL} {opt} {value}", re.escape(opt))
        for opt, values in {
            "--percentile": ["0", "101", "nan", "-1"],
            "--max-batches": ["0", "-1"],
            "--target-drop": ["0", "nan", "1.5"],
        }.items()
        for value in values
    ],
    *[
        _c(f"cal-cache-{name}", f"{CAL} --cache caches/{name}", match)
        for name, match in [
            ("amax_zero.json", "amax"),
            ("amax_negative.json", "amax"),
            ("amax_string.json", "amax"),
            ("amax_null.json", "amax"),
            ("amax_nan.json", "NaN"),
            ("tensors_list.json", "tensors"),
            ("no_tensors.json", "tensors"),
            ("wrong_format.json", "not a workbench calibration cache"),
            ("percentile_200.json", "percentile"),
            ("warnings_int.json", "warnings"),
            ("stats_garbage.json", "histograms"),
            ("deep.json", "nested"),
            ("truncated.json", "not valid JSON"),
            ("list.json", "not a workbench calibration cache"),
            ("binary.json", "UTF-8|JSON"),
            ("trt_zero.cache", "finite positive"),
            ("trt_nan.cache", "finite positive"),
            ("trt_negative.cache", "finite positive"),
            ("trt_inf.cache", "finite positive"),
            ("trt_malformed.cache", "malformed"),
            ("trt_badhex.cache", "hex float32"),
            ("trt_empty.cache", "no tensor ranges"),
        ]
    ],
    _c("cal-plan-bad", f"{CAL} --plan timing_list.json", "default"),
    # --- diff -------------------------------------------------------------------------------------------------
    _c("diff-o-is-fp32", "diff tiny.onnx q.onnx --data data -o tiny.onnx", "is the input"),
    _c("diff-o-is-quant", "diff tiny.onnx q.onnx --data data -o q.onnx", "is the input"),
    _c("diff-o-dir", "diff tiny.onnx q.onnx --data data -o data", "is a directory"),
    _c("diff-o-in-data", "diff tiny.onnx q.onnx --data data -o data/d.json", "inside the input folder"),
    _c("diff-o-proc", "diff tiny.onnx q.onnx --data data -o /proc/d.json", "not writable"),
    _c("diff-max-batches-0", "diff tiny.onnx q.onnx --data data -o d.json --max-batches 0", "--max-batches"),
    _c("diff-top-negative", "diff tiny.onnx q.onnx --data data -o d.json --top -1", "--top"),
    _c("diff-data-nan", "diff tiny.onnx q.onnx --data nan -o d.json --no-progress", "NaN"),
    _c("diff-data-no-samples", "diff tiny.onnx q.onnx --data nosamples -o d.json --no-progress", "no samples"),
    _c("diff-quant-missing", "diff tiny.onnx nope.onnx --data data -o d.json", "nope"),
    _c("diff-quant-garbage", "diff tiny.onnx garbage.onnx --data data -o d.json", "garbage"),
    _c("diff-no-data", "diff tiny.onnx q.onnx -o d.json", "no data"),
    _c("diff-string-model", "diff string.onnx q.onnx --data data -o d.json", "string"),
    # --- export -----------------------------------------------------------------------------------------------
    _c("export-overwrite-user-dir", "export d.engine -o userdir --overwrite", "not a bundle written"),
    _c("export-overwrite-data-dir", "export d.engine -o data --overwrite", "not a bundle"),
    _c("export-overwrite-bundle-plus-user-file", "export d.engine -o bundles/extra_file --overwrite", "not a bundle"),
    _c("export-existing-bundle", "export d.engine -o bundle", "already exists"),
    _c("export-o-is-file", "export d.engine -o notes.txt", "not a folder"),
    _c("export-o-is-engine", "export d.engine -o d.engine --overwrite", "not a folder"),
    _c("export-o-proc", "export d.engine -o /proc/b", "not writable"),
    _c(
        "export-o-contains-input",
        "export bundle/model.engine -o bundle --overwrite --layers d.layers.json",
        "contains the input|is the input",
    ),
    _c("export-empty-engine", "export empty.engine -o b2", "do not look like"),
    _c("export-garbage-engine", "export garbage.engine -o b2", "do not look like"),
    _c("export-swapped-layers", "export swapped.engine -o b2", "describes an engine with sha256"),
    _c(
        "export-layers-other-engine",
        "export d.engine -o b2 --layers d16.layers.json",
        "describes an engine with sha256",
    ),
    _c("export-missing-layers", "export nolayers.engine -o b2", "layer records are missing"),
    _c("export-missing-engine", "export nope.engine -o b2", "no such engine"),
    *[
        _c(f"export-layers-{name}", f"export d.engine -o b2 --layers layers/{name}.layers.json", match)
        for name, match in [
            ("no_engine_layers", "engine_layers"),
            ("layers_dict", "engine_layers"),
            ("layer_int", r"engine_layers\[0\]"),
            ("name_int", r"engine_layers\[0\]\.name"),
            ("stream_negative", "stream_id"),
            ("onnx_nodes_int", "onnx_nodes"),
            ("inputs_dims_str", "dimensions"),
            ("io_not_list", "io_tensors"),
            ("qdq_edges_bad", "qdq_edges"),
            ("build_sha_bad", "engine_sha256"),
            ("build_profiles_bad", "profiles"),
            ("build_seconds_str", "build_seconds"),
            ("build_list", "build"),
            ("onnx_nodes_str", "onnx_nodes"),
            ("deep", "nested"),
            ("truncated", "not valid JSON"),
            ("array", "not an object"),
        ]
    ],
    _c("export-timing-list", "export d.engine -o b2 --timing timing_list.json", "JSON object"),
    _c("export-timing-nan", "export d.engine -o b2 --timing timing_nan.json", "NaN"),
    _c("export-timing-deep", "export d.engine -o b2 --timing timing_deep.json", "nested"),
    _c("export-timing-bad", "export d.engine -o b2 --timing timing_bad.json", "not valid JSON"),
    _c("export-accuracy-missing", "export d.engine -o b2 --accuracy nope.json", "no such file"),
    _c("export-cache-bad", "export d.engine -o b2 --calibration-cache caches/trt_zero.cache", "finite positive"),
    _c("export-cache-missing", "export d.engine -o b2 --calibration-cache nope.cache", "no such"),
    _c("export-model-name-dotdot", "export d.engine -o b2 --triton --model-name ../evil", "plain folder name"),
    _c("export-model-name-slash", "export d.engine -o b2 --triton --model-name a/b", "plain folder name"),
    _c("export-max-batch-negative", "export d.engine -o b2 --triton --max-batch -1", "--max-batch"),
    _c("export-instances-0", "export d.engine -o b2 --triton --instances 0", "--instances"),
    _c("export-plan-bad", "export d.engine -o b2 --plan timing_list.json", "default"),
    # --- verify -----------------------------------------------------------------------------------------------
    *[
        _c(f"verify-{name}", f"verify bundles/{name}", match)
        for name, match in [
            ("engine_flipped", "model.engine: sha256"),
            ("layers_flipped", "model.layers.json: sha256"),
            ("plan_flipped", "model.plan: sha256"),
            ("config_flipped", "config.pbtxt: sha256"),
            ("engine_truncated", "model.engine: 100 bytes"),
            ("engine_missing", "model.engine: missing"),
            ("extra_file", "evil.so: not listed"),
            ("engine_dotdot", "not among the sealed files"),
            ("files_dotdot", r"leaves the bundle"),
            ("files_absolute", "absolute"),
            ("manifest_not_json", "not valid JSON"),
            ("manifest_list", "not an object"),
            ("manifest_format", "format is 'other'"),
            ("manifest_no_files", "'files' is missing"),
            ("manifest_engine_str", "field 'engine'"),
            ("manifest_version", "format_version 99"),
            ("manifest_sha_short", "64 hex"),
            ("manifest_bytes_negative", "non-negative"),
            ("engine_symlink_out", "symbolic link"),
            ("layers_swapped", "not this engine"),
            ("no_manifest", "not a workbench bundle"),
        ]
    ],
    _c("verify-missing", "verify nofolder", "no such bundle"),
    _c("verify-file", "verify notes.txt", "no such bundle"),
    _c("verify-hmac-unsigned", "verify bundle", "unsigned", env={"WORKBENCH_BUNDLE_KEY": "k1"}),
    # --- fusions ----------------------------------------------------------------------------------------------
    _c("fusions-html-dir", "fusions d.layers.json --html data", "is a directory"),
    _c("fusions-html-is-input", "fusions d.layers.json --html d.layers.json", "is the input"),
    _c("fusions-html-proc", "fusions d.layers.json --html /proc/f.html", "not writable"),
    _c("fusions-missing", "fusions nope.layers.json", "no such"),
    _c("fusions-garbage", "fusions garbage.onnx", "no layer records"),
    *[
        _c(f"fusions-layers-{name}", f"fusions layers/{name}.layers.json", match)
        for name, match in [
            ("layer_int", r"engine_layers\[0\]"),
            ("stream_negative", "stream_id"),
            ("inputs_dims_str", "dimensions"),
            ("build_sha_bad", "engine_sha256"),
            ("deep", "nested"),
            ("truncated", "not valid JSON"),
        ]
    ],
    _c("fusions-compare-bad", "fusions d.layers.json --compare layers/name_int.layers.json", "name"),
    # --- explore ------------------------------------------------------------------------------------------------
    _c("explore-export-file", "explore d.engine --export notes.txt", "not a folder"),
    _c("explore-export-proc", "explore d.engine --export /proc/ex", "not writable"),
    _c("explore-diff-bad-json", "explore d.engine --diff timing_bad.json --export ex", "not valid JSON"),
    _c("explore-diff-deep", "explore d.engine --diff timing_deep.json --export ex", "nested"),
    _c("explore-profile-list", "explore d.engine --profile timing_list.json --export ex", "LayerProfile"),
    _c("explore-missing", "explore nope.engine --export ex", "nope.engine"),
    _c("explore-garbage", "explore garbage.onnx --export ex", "garbage.onnx"),
    # --- zoo --------------------------------------------------------------------------------------------------
    _c("zoo-calib-data-existing", "zoo calib-data digits-cnn data", "already exists"),
    _c("zoo-calib-data-user-dir", "zoo calib-data digits-cnn userdir --overwrite", "not a calibration folder"),
    _c("zoo-calib-data-file", "zoo calib-data digits-cnn notes.txt", "not a folder"),
    _c("zoo-calib-data-batch-0", "zoo calib-data digits-cnn newdir --batch-size 0", "--batch-size"),
    _c("zoo-calib-data-limit-0", "zoo calib-data digits-cnn newdir --limit 0", "--limit"),
    _c("zoo-calib-data-unknown", "zoo calib-data nosuchmodel newdir", "nosuchmodel"),
    _c("zoo-eval-limit-0", "zoo eval digits-cnn --limit 0", "--limit"),
    _c("zoo-eval-unknown", "zoo eval nosuchmodel", "nosuchmodel"),
    _c("zoo-fetch-unknown", "zoo fetch nosuchmodel", "nosuchmodel"),
    # --- demo (the report) ------------------------------------------------------------------------------------
    *[
        _c(f"demo-{opt}-{value}", f"demo --out newout {opt} {value}", _DEMO_SETTING[opt])
        for opt, values in {
            "--streams": ["0", "65"],
            "--batch": ["0", "-1"],
            "--max-metric-drop": ["nan", "-1", "2", "inf"],
            "--calibration-samples": ["0"],
            "--eval-samples": ["-5"],
        }.items()
        for value in values
    ],
    _c("demo-out-file", "demo --out notes.txt", "not a folder"),
    _c("demo-unknown-model", "demo --model nosuchmodel --out newout", "nosuchmodel"),
    # --- precision / model ------------------------------------------------------------------------------------
    _c("precision-o-is-input", "precision tiny.onnx -o tiny.onnx", "is the input"),
    _c("precision-o-dir", "precision tiny.onnx -o data", "is a directory"),
    _c("model-garbage", "model garbage.onnx", "garbage.onnx"),
    _c("model-missing", "model nope.onnx", "nope"),
]


@pytest.mark.parametrize("argv, match, env", CASES)
def test_bad_input_is_refused_cleanly(ws: Path, argv: list[str], match: str, env: dict[str, str] | None) -> None:
    before = snapshot(ws)
    run = run_cli_forked(argv, ws, env=env)
    after = snapshot(ws)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    error_lines = [line for line in run.stderr.splitlines() if ": error:" in line]
    assert error_lines, run.stderr
    assert re.search(match, run.stderr), (match, run.stderr)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, f"files changed: {sorted(changed)}"


def test_catalogue_size() -> None:
    assert len(CASES) >= 150


@pytest.mark.parametrize(
    "argv",
    [
        "build tiny.onnx -o tiny.onnx --no-progress",
        "time tiny.onnx -o t.json --warmup nan",
        "export d.engine -o userdir --overwrite",
        "verify bundles/engine_flipped",
        "calibrate tiny.onnx --data nan -o q2.onnx --no-progress",
    ],
)
def test_plain_subprocess_agrees(ws: Path, argv: str) -> None:
    """The forked runner and `python -m workbench` give the same status and message."""
    forked = run_cli_forked(argv.split(), ws)
    plain = run_cli_subprocess(argv.split(), ws)
    assert plain.returncode == forked.returncode == 2
    assert "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines()[-1] == forked.stderr.strip().splitlines()[-1]
