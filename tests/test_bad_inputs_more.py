"""More bad inputs (sweep of 2026-12-04, bench/results/bad_inputs_sweep_2026-12-04.md), each through the real CLI in
its own process, with the same rule as tests/test_bad_inputs.py: exit status 2, one `workbench CMD: error: ...` line
naming the problem, no traceback, no file in the workspace changed (sha256 of every file, FIFOs included by kind).

New here: ONNX models the checker lets through (opset beyond ONNX's newest, no outputs, zero-size or UNDEFINED-typed
inputs), named pipes given as inputs (reading one blocks forever) or outputs (renaming over one replaces it),
truncated .npz batches, options the other options make meaningless (silently ignored before), duplicate keys in JSON,
misspelt precision-plan keys, bundles re-sealed after an edit that the hashes cannot catch (Triton config, plan copy),
a garbage HMAC file, and exporting a bundle into another bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_runner import run_cli_forked, snapshot, tiny_onnx


def _snapshot(root: Path) -> dict[str, str]:
    """cli_runner.snapshot plus special files (a FIFO replaced by a regular file must count as a change)."""
    result = snapshot(root)
    for path in root.rglob("*"):
        if not path.is_symlink() and stat.S_ISFIFO(path.lstat().st_mode):
            result[path.relative_to(root).as_posix()] = "fifo"
    return result


def _model(root: Path, name: str, *, opset: int = 17, outputs: bool = True, x: Any = None, nodes: Any = None) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0 - 0.5, "W")
    graph = helper.make_graph(
        nodes
        or [
            helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        "g",
        [] if x is False else [x or helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])] if outputs else [],
        initializer=[weight] if nodes is None else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(root / name))


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnx import TensorProto, helper, numpy_helper

    root = tmp_path_factory.mktemp("bad-inputs-more")
    tiny_onnx(root / "tiny.onnx")
    tiny_onnx(root / "other.onnx", name="entrée")  # same node names, another model
    _model(root, "opset99.onnx", opset=99)
    _model(root, "nooutputs.onnx", outputs=False)
    _model(root, "zerodim.onnx", x=helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, 4]))
    _model(root, "undefined.onnx", x=helper.make_tensor_value_info("x", TensorProto.UNDEFINED, ["N", 4]))
    const = numpy_helper.from_array(np.ones((1, 3), np.float32))
    _model(root, "noinputs.onnx", x=False, nodes=[helper.make_node("Constant", [], ["y"], value=const)])
    os.mkfifo(root / "fifo.onnx")
    (root / "notes.txt").write_text("a user's file\n")
    rng = np.random.default_rng(0)
    for folder, feeds in {
        "data": [{"x": rng.standard_normal((8, 4)).astype(np.float32)} for _ in range(3)],
        "wrongdim": [{"x": rng.standard_normal((8, 5)).astype(np.float32)}],
        "fifodata": [{"x": rng.standard_normal((8, 4)).astype(np.float32)}],
        "trunc": [{"x": rng.standard_normal((8, 4)).astype(np.float32)}],
    }.items():
        (root / folder).mkdir()
        for index, feed in enumerate(feeds):
            np.savez(root / folder / f"batch_{index:05d}.npz", **feed)
    os.mkfifo(root / "fifodata" / "batch_00001.npz")
    whole = (root / "trunc" / "batch_00000.npz").read_bytes()
    (root / "trunc" / "batch_00000.npz").write_bytes(whole[: len(whole) // 2])
    (root / "plan_typo.json").write_text(json.dumps({"default": "fp32", "override": {"mm": "fp16"}}))
    (root / "plan_unknown.json").write_text(json.dumps({"default": "int8", "overrides": {"nosuchnode": "fp16"}}))
    (root / "plan_dupkey.json").write_text('{"default": "fp32", "default": "fp16", "overrides": {}}')

    def setup(argv: list[str]) -> None:
        run = run_cli_forked(argv, root)
        assert run.returncode == 0, run.stderr

    setup(["build", "tiny.onnx", "-o", "d.engine", "--shapes", "x:1x4,4x4,8x4", "--no-progress"])
    setup(["export", "d.engine", "-o", "bundle", "--triton"])
    setup(["calibrate", "tiny.onnx", "--data", "data", "-o", "q.onnx", "--no-progress"])

    def bundle(name: str, change: Any) -> None:
        target = root / "bundles" / name
        shutil.copytree(root / "bundle", target, symlinks=True)
        change(target)

    def reseal(target: Path, rel: str) -> None:  # what someone who rewrites the bundle would do
        manifest = json.loads((target / "manifest.json").read_text())
        data = (target / rel).read_bytes()
        manifest["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        (target / "manifest.json").write_text(json.dumps(manifest))

    def edit_config(old: str, new: str) -> Any:
        def apply(target: Path) -> None:
            path = target / "triton/model/config.pbtxt"
            path.write_text(path.read_text().replace(old, new) if old else new)
            reseal(target, "triton/model/config.pbtxt")

        return apply

    def plan_differs(target: Path) -> None:
        path = target / "triton/model/1/model.plan"
        path.write_bytes(path.read_bytes()[:-1] + b"\x00")
        reseal(target, "triton/model/1/model.plan")

    bundle("unlisted_fifo", lambda t: os.mkfifo(t / "evil.pipe"))
    bundle("config_garbage", edit_config("", 'name: "model"\nplatform: 7 garbage {{{\n'))
    bundle("config_max_batch_64", edit_config("max_batch_size: 8", "max_batch_size: 64"))
    bundle("config_wrong_input", edit_config('name: "x"', 'name: "z"'))
    bundle("plan_differs", plan_differs)
    bundle("hmac_garbage", lambda t: (t / "manifest.json.hmac").write_bytes(b"\xff\xfe garbage"))
    return root


def _c(id_: str, argv: str, match: str, env: dict[str, str] | None = None) -> Any:
    return pytest.param(argv.split(), match, env, id=id_)


TIME = "time tiny.onnx -o t.json --no-baseline --streams 1 --window 0.05 --max-windows 1"
CAL = "calibrate tiny.onnx --data data -o q2.onnx --no-progress"
FIFO_OUT = "is a named pipe"
LONG = "x" * 300

CASES = [
    # --- ONNX models the checker accepts but no stage can use ---------------------------------------------------
    _c("model-opset99", "model opset99.onnx", "opset 99.*newest opset"),
    _c("build-opset99", "build opset99.onnx -o m.engine --no-progress", "opset 99"),
    _c("precision-opset99", "precision opset99.onnx -o p.onnx", "opset 99"),
    _c("model-no-outputs", "model nooutputs.onnx", "no outputs"),
    _c("model-zero-dim", "model zerodim.onnx", "fixed dimension of 0 at axis 0"),
    _c("build-zero-dim", "build zerodim.onnx -o m.engine --no-progress", "fixed dimension of 0"),
    _c("clean-zero-dim", "clean zerodim.onnx -o c.onnx", "fixed dimension of 0"),
    _c("model-undefined-type", "model undefined.onnx", "no element type"),
    _c("cal-no-inputs", "calibrate noinputs.onnx --data random -o q2.onnx --no-progress", "no graph inputs"),
    # --- a named pipe given as an input (reading blocks forever) or an output (a rename replaces it) -----------
    _c("model-fifo", "model fifo.onnx", "named pipe"),
    _c("build-fifo", "build fifo.onnx -o m.engine --no-progress", "named pipe"),
    _c("time-fifo", "time fifo.onnx -o t.json", "named pipe"),
    _c("build-plan-fifo", "build tiny.onnx -o m.engine --no-progress --plan fifo.onnx", "named pipe"),
    _c("export-timing-fifo", "export d.engine -o b2 --timing fifo.onnx", "named pipe"),
    _c("explore-diff-fifo", "explore d.engine --diff fifo.onnx --export ex", "named pipe"),
    _c("export-cache-fifo", "export d.engine -o b2 --calibration-cache fifo.onnx", "named pipe"),
    _c("export-layers-fifo", "export d.engine -o b2 --layers fifo.onnx", "named pipe"),
    _c("fusions-compare-fifo", "fusions d.layers.json --compare fifo.onnx", "named pipe"),
    _c("zoo-eval-onnx-fifo", "zoo eval digits-cnn --onnx fifo.onnx", "named pipe"),
    _c("clean-data-fifo", "clean tiny.onnx -o c.onnx --data fifodata", "named pipe"),
    _c("cal-data-fifo", "calibrate tiny.onnx --data fifodata -o q2.onnx --no-progress", "named pipe"),
    _c("diff-data-fifo", "diff tiny.onnx q.onnx --data fifodata -o d.json --no-progress", "named pipe"),
    _c("clean-o-fifo", "clean tiny.onnx -o fifo.onnx", FIFO_OUT),
    _c("build-o-fifo", "build tiny.onnx -o fifo.onnx --no-progress", FIFO_OUT),
    _c("cal-o-fifo", "calibrate tiny.onnx --data data -o fifo.onnx --no-progress", FIFO_OUT),
    _c("cal-cache-fifo", f"{CAL} --cache fifo.onnx", FIFO_OUT),
    _c("diff-o-fifo", "diff tiny.onnx q.onnx --data data -o fifo.onnx --no-progress", FIFO_OUT),
    _c("time-o-fifo", "time tiny.onnx -o fifo.onnx", FIFO_OUT),
    _c("time-trace-fifo", f"{TIME} --trace fifo.onnx", FIFO_OUT),
    _c("precision-o-fifo", "precision tiny.onnx -o fifo.onnx", FIFO_OUT),
    _c("fusions-html-fifo", "fusions d.layers.json --html fifo.onnx", FIFO_OUT),
    # --- broken calibration / check data ---------------------------------------------------------------------
    _c("clean-data-truncated-npz", "clean tiny.onnx -o c.onnx --data trunc", "not a readable .npz"),
    _c("cal-data-truncated-npz", "calibrate tiny.onnx --data trunc -o q2.onnx --no-progress", "not a readable .npz"),
    _c("diff-data-truncated-npz", "diff tiny.onnx q.onnx --data trunc -o d.json --no-progress", "not a readable .npz"),
    _c("diff-data-wrong-dim", "diff tiny.onnx q.onnx --data wrongdim -o d.json --no-progress", "invalid dimensions"),
    # --- JSON and precision plans ----------------------------------------------------------------------------
    _c("build-plan-misspelt-key", "build tiny.onnx -o m.engine --no-progress --plan plan_typo.json", "'override'"),
    _c("precision-plan-misspelt-key", "precision tiny.onnx -o p.onnx --plan plan_typo.json", "unknown key"),
    _c("export-plan-misspelt-key", "export d.engine -o b2 --plan plan_typo.json", "unknown key"),
    _c("build-plan-duplicate-key", "build tiny.onnx -o m.engine --no-progress --plan plan_dupkey.json", "twice"),
    # --- repeated or conflicting options (one of them was silently dropped) ----------------------------------
    _c("clean-passes-empty", "clean tiny.onnx -o c.onnx --passes ,", "names no pass"),
    _c("clean-shape-twice", "clean tiny.onnx -o c.onnx --shape x:1,4 --shape x:2,4", "twice"),
    _c("clean-profile-twice", "clean tiny.onnx -o c.onnx --profile x:1x4/2x4/4x4 --profile x:1x4/2x4/8x4", "twice"),
    _c("clean-profile-unordered", "clean tiny.onnx -o c.onnx --profile x:4x4/2x4/1x4", "not ordered"),
    _c("build-shapes-twice", "build tiny.onnx -o m.engine --no-progress --shapes x:1x4 --shapes x:2x4", "twice"),
    _c("time-shape-twice", f"{TIME} --shape x:1x4 --shape x:2x4", "twice"),
    _c("time-shape-unknown-input", f"{TIME} --shape nope:1x4", "not inputs of the model"),
    _c("time-rate-closed-loop", f"{TIME} --rate 100", "open-loop"),
    _c("time-max-batch-no-batcher", f"{TIME} --max-batch 4", "dynamic batcher"),
    _c("time-priorities-cpu", f"{TIME} --priorities=-1,0", "cpu executor"),
    _c("time-no-cuda-graph-cpu", f"{TIME} --no-cuda-graph", "cpu executor"),
    _c("time-streams-repeated", "time tiny.onnx -o t.json --no-baseline --streams 1,1", "twice"),
    _c("cal-percentile-with-max", f"{CAL} --method max --percentile 50", "--method percentile"),
    _c("cal-budget-without-target-drop", f"{CAL} --budget 3", "--target-drop"),
    _c("cal-fallback-without-target-drop", f"{CAL} --fallback fp16", "--target-drop"),
    _c("cal-groups-without-target-drop", f"{CAL} --groups block", "--target-drop"),
    _c("cal-recalibrate-without-cache", f"{CAL} --recalibrate", "no --cache"),
    _c("cal-keep-empty", f"{CAL} --keep ,", "names no node"),
    _c("fusions-compare-onnx-alone", "fusions d.layers.json --compare-onnx tiny.onnx", "no --compare"),
    _c("fusions-onnx-of-another-model", "fusions d.layers.json --onnx other.onnx", "not the ONNX these layer"),
    _c("explore-precision-with-engine", "explore d.engine --precision fp16 --export ex", "already built"),
    _c("export-model-name-without-triton", "export d.engine -o b2 --model-name foo", "only with --triton"),
    _c("export-instances-without-triton", "export d.engine -o b2 --instances 3", "only with --triton"),
    _c("export-max-batch-above-profile", "export d.engine -o b2 --triton --max-batch 64", "profile's maximum batch 8"),
    _c("export-into-a-bundle", "export d.engine -o bundle/sub", "lies inside the bundle"),
    _c("time-spin-wait-cpu", f"{TIME} --spin-wait", "cpu executor"),
    _c("time-max-delay-no-batcher", f"{TIME} --max-delay-ms 5", "batcher is off"),
    _c("cal-plan-unknown-node", f"{CAL} --plan plan_unknown.json", r"^(?!.*/tmp).*model does not have.*nosuchnode"),
    # --- file names longer than the filesystem allows (ENAMETOOLONG) -----------------------------------------
    _c("clean-o-long-name", f"clean tiny.onnx -o {LONG}.onnx", "at most 255 bytes"),
    _c("build-o-long-name", f"build tiny.onnx -o {LONG}.engine --no-progress", "at most 255 bytes"),
    _c("export-o-long-name", f"export d.engine -o {LONG}", "at most 255 bytes"),
    _c("time-o-long-name", f"time tiny.onnx -o {LONG}.json", "at most 255 bytes"),
    _c("model-long-name", f"model {LONG}.onnx", "at most 255 bytes"),
    # --- bundles re-sealed after an edit, a FIFO added, a garbage HMAC ---------------------------------------
    _c("verify-unlisted-fifo", "verify bundles/unlisted_fifo", "evil.pipe: not listed"),
    _c("verify-config-garbage-resealed", "verify bundles/config_garbage", "does not parse"),
    _c("verify-config-max-batch-resealed", "verify bundles/config_max_batch_64", "max_batch_size 64 is above"),
    _c("verify-config-wrong-input-resealed", "verify bundles/config_wrong_input", "not the engine's"),
    _c("verify-plan-not-engine-resealed", "verify bundles/plan_differs", "not the bundle's engine"),
    _c("verify-hmac-garbage", "verify bundles/hmac_garbage", "HMAC does not match", {"WORKBENCH_BUNDLE_KEY": "k1"}),
]


@pytest.mark.parametrize("argv, match, env", CASES)
def test_bad_input_is_refused_cleanly(ws: Path, argv: list[str], match: str, env: dict[str, str] | None) -> None:
    before = _snapshot(ws)
    run = run_cli_forked(argv, ws, env=env, timeout=60.0)
    after = _snapshot(ws)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    error_lines = [line for line in run.stderr.splitlines() if ": error:" in line]
    assert len(error_lines) == 1, run.stderr
    assert error_lines[0].startswith(f"workbench {argv[0]}"), error_lines
    assert re.search(match, error_lines[0]), (match, run.stderr)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, f"files changed: {sorted(changed)}"


def test_multiline_runtime_errors_print_as_one_line(ws: Path) -> None:
    """ONNX Runtime's messages span lines; the CLI prints one error line, with the details kept."""
    run = run_cli_forked("calibrate tiny.onnx --data wrongdim -o q2.onnx --no-progress".split(), ws)
    assert run.returncode == 2
    lines = [line for line in run.stderr.strip().splitlines() if not line.startswith("warning")]
    assert len(lines) == 1 and "index: 1 Got: 5 Expected: 4" in lines[0], run.stderr


# --- the same refusals through the Python API that notebooks call --------------------------------------------


def test_api_load_onnx_refuses_what_the_checker_lets_through(ws: Path) -> None:
    from workbench.errors import WorkbenchError
    from workbench.model import load_onnx

    for name, match in [
        ("opset99.onnx", "opset 99"),
        ("nooutputs.onnx", "no outputs"),
        ("zerodim.onnx", "fixed dimension of 0"),
        ("undefined.onnx", "no element type"),
        ("fifo.onnx", "named pipe"),
    ]:
        with pytest.raises(WorkbenchError, match=match):
            load_onnx(ws / name)
    assert load_onnx(ws / "tiny.onnx").inputs[0].name == "x"  # the valid model still loads


def test_api_data_readers_refuse_fifo_and_truncated_batches(ws: Path) -> None:
    from workbench.calib.data import FolderSource, read_npz_batch
    from workbench.errors import WorkbenchError
    from workbench.model import load_onnx

    with pytest.raises(WorkbenchError, match="named pipe"):
        FolderSource(ws / "fifodata")
    with pytest.raises(WorkbenchError, match="not a readable .npz"):
        read_npz_batch(ws / "trunc" / "batch_00000.npz")
    from workbench.calib.stats import collect_statistics

    with pytest.raises(WorkbenchError, match="no graph inputs"):
        collect_statistics(load_onnx(ws / "noinputs.onnx"), FolderSource(ws / "data"), progress=False)


def test_api_json_and_plan_readers(ws: Path) -> None:
    from workbench._io import read_json, validate_outputs
    from workbench.errors import WorkbenchError
    from workbench.precision import PrecisionPlan

    with pytest.raises(WorkbenchError, match="named pipe"):
        read_json(ws / "fifo.onnx", what="x")
    with pytest.raises(WorkbenchError, match="appears twice"):
        read_json(ws / "plan_dupkey.json", what="x")
    with pytest.raises(WorkbenchError, match="unknown key"):
        PrecisionPlan.load(ws / "plan_typo.json")
    with pytest.raises(WorkbenchError, match="named pipe"):
        validate_outputs({"-o": ws / "fifo.onnx"})
    assert stat.S_ISFIFO((ws / "fifo.onnx").stat().st_mode)


def test_api_verify_bundle_finds_resealed_edits(ws: Path) -> None:
    from workbench.export.bundle import verify_bundle

    assert verify_bundle(ws / "bundle").ok
    for name, match in [
        ("config_max_batch_64", "above the engine profile"),
        ("plan_differs", "not the bundle's engine"),
        ("unlisted_fifo", "not listed"),
    ]:
        check = verify_bundle(ws / "bundles" / name)
        assert not check.ok and any(match in problem for problem in check.problems), check.problems


def test_api_time_executor_refuses_unknown_shape(ws: Path) -> None:
    from workbench.errors import WorkbenchError
    from workbench.timing.factory import make_executor

    with pytest.raises(WorkbenchError, match="not inputs of the model"):
        make_executor(str(ws / "tiny.onnx"), "cpu", shapes=["nope:1x4"])
    with pytest.raises(WorkbenchError, match="twice"):
        make_executor(str(ws / "tiny.onnx"), "cpu", shapes=["x:1x4", "x:2x4"])


# --- a full disk: a 64 KiB tmpfs (root only; skipped elsewhere) -----------------------------------------------


@pytest.fixture()
def full_disk(tmp_path: Path) -> Any:
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)]).returncode:
        pytest.skip("mounting a tiny tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.parametrize(
    "argv",
    [
        "build tiny.onnx -o {full}/m.engine --shapes x:1x4,4x4,8x4 --no-progress",
        "export d.engine -o {full}/bundle --triton",
        "zoo calib-data digits-cnn {full}/cd",
    ],
    ids=["build", "export", "zoo-calib-data"],
)
def test_full_disk_is_one_line_and_leaves_nothing(ws: Path, full_disk: Path, argv: str) -> None:
    (full_disk / "old.engine").write_bytes(b"previous output")  # what was saved before must survive
    before = _snapshot(ws)
    run = run_cli_forked(argv.format(full=full_disk).split(), ws, timeout=120.0)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    error_lines = [line for line in run.stderr.splitlines() if ": error:" in line]
    assert len(error_lines) == 1 and "No space left on device" in error_lines[0], run.stderr
    assert sorted(p.name for p in full_disk.iterdir()) == ["old.engine"]  # no partial file or temp folder
    assert (full_disk / "old.engine").read_bytes() == b"previous output"
    assert _snapshot(ws) == before


def test_api_full_disk_atomic_write(full_disk: Path) -> None:
    from workbench._io import write_bytes_atomic
    from workbench.errors import WorkbenchError

    (full_disk / "m.bin").write_bytes(b"old")
    with pytest.raises(WorkbenchError, match="No space left on device"):
        write_bytes_atomic(full_disk / "m.bin", b"x" * 200_000)
    assert (full_disk / "m.bin").read_bytes() == b"old"
    assert [p.name for p in full_disk.iterdir()] == ["m.bin"]


# --- the quickstart settings notebooks pass ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting",
    [
        {"streams": "2"},
        {"streams": 2.5},
        {"streams": True},
        {"streams": float("nan")},
        {"batch": None},
        {"calibration_samples": float("inf")},
        {"max_metric_drop": "0.1"},
        {"max_metric_drop": True},
        {"sweep": "no"},
        {"export": "false"},
        {"search_budget": 2.7},
        {"model": 5},
        {"out_dir": 5},
    ],
    ids=lambda s: f"{next(iter(s))}={next(iter(s.values()))!r}",
)
def test_api_quickstart_config_refuses_wrong_types(setting: dict[str, Any]) -> None:
    from workbench.errors import WorkbenchError
    from workbench.flow import QuickstartConfig

    name = next(iter(setting))
    with pytest.raises(WorkbenchError, match=f"^{name}="):
        QuickstartConfig(**setting)
    with pytest.raises(WorkbenchError, match=f"^{name}="):
        QuickstartConfig().validated(**setting)  # what the panel's widgets call


@pytest.mark.parametrize("out", ["notes.txt", "fifo.onnx"])
def test_api_quickstart_out_dir_that_is_not_a_folder(ws: Path, out: str) -> None:
    from workbench.errors import WorkbenchError
    from workbench.flow import QuickstartConfig, run_quickstart

    before = _snapshot(ws)
    with pytest.raises(WorkbenchError, match="out_dir .* not a folder"):
        run_quickstart(QuickstartConfig(model="digits-cnn", out_dir=str(ws / out)))
    assert _snapshot(ws) == before


# --- Ctrl-C at any moment of a build --------------------------------------------------------------------------


def test_ctrl_c_during_build_is_an_interrupt_never_a_finished_or_misreported_build(ws: Path) -> None:
    """SIGINT while TensorRT parses or builds used to raise inside a TensorRT callback, which TensorRT caught: the
    build then finished (exit 0, Ctrl-C ignored) or failed with "logged no per-layer records" / "no TensorRT backend
    is importable". Now Ctrl-C is held during TensorRT calls and re-raised after: exit 130, one line, no files."""
    import signal
    import time

    from cli_runner import spawn_cli_forked

    argv = "build digits-cnn -o sig.engine --no-progress".split()
    started = time.monotonic()
    assert run_cli_forked(argv, ws).returncode == 0
    duration = time.monotonic() - started
    for path in ws.glob("sig.*"):
        path.unlink()
    before = _snapshot(ws)
    outcomes = []
    for step in range(10):
        child = spawn_cli_forked(argv, ws)
        child.wait_started()  # a signal inside the forked child's own set-up is the test harness's
        # not at 0 either: the interpreter's own start-up (threading._after_fork) is not the CLI's
        time.sleep(0.05 + duration * 0.8 * step / 10)
        child.signal(signal.SIGINT)
        run = child.wait(120.0)
        assert "Traceback" not in run.stderr, run.stderr
        assert "error:" not in run.stderr, run.stderr  # never a misleading build error
        assert run.returncode in (0, 130), run.stderr
        if run.returncode == 130:
            assert run.stderr.strip().endswith("interrupted"), run.stderr
        after = _snapshot(ws)
        written = {k for k in after if k.startswith("sig.")}
        assert {k: v for k, v in after.items() if k not in written} == before  # no temp file, nothing else touched
        if run.returncode == 0:
            assert written == {"sig.engine", "sig.layers.json", "sig.build.log"}, written
        if "sig.layers.json" in written:  # records present are those of the engine beside them
            assert (
                json.loads((ws / "sig.layers.json").read_text())["build"]["engine_sha256"]
                == hashlib.sha256((ws / "sig.engine").read_bytes()).hexdigest()
            )
        # a Ctrl-C between the engine's rename and the records' may leave the new engine alone: whole, and
        # refused by EngineArtifact.load / export without its records (README, "Atomic writes")
        outcomes.append(run.returncode)
        for path in ws.glob("sig.*"):
            path.unlink()
    assert outcomes.count(130) >= 3, outcomes
