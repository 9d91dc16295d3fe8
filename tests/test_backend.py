"""Backend resolution, forcing, and a mypy check of every direct TensorRT call against tensorrt-stubs (TRT 10.13)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.engine.backend import BACKEND_ENV, available_backends, get_backend
from workbench.errors import BackendUnavailable, WorkbenchError

REPO = Path(__file__).resolve().parents[1]


def test_default_resolution_picks_rtx_when_full_tensorrt_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    backend = get_backend()
    if "tensorrt" in available_backends():  # a user's machine with full TensorRT prefers it
        assert backend.name == "tensorrt"
    else:
        assert backend.name == "tensorrt_rtx"
        assert backend.is_rtx
        assert re.match(r"^1\.\d+\.\d+", backend.version)


def test_stub_only_tensorrt_package_is_not_taken_for_a_backend() -> None:
    # tensorrt-stubs installs a bare `tensorrt` namespace with .pyi files only; importing it "works".
    import importlib

    module = importlib.import_module("tensorrt")
    if hasattr(module, "Builder"):
        pytest.skip("a real tensorrt is installed here")
    assert "tensorrt" not in available_backends()


def test_env_var_forces_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV, "rtx")
    assert get_backend().name == "tensorrt_rtx"
    monkeypatch.setenv(BACKEND_ENV, "tensorrt_rtx")
    assert get_backend().name == "tensorrt_rtx"


def test_forcing_an_absent_backend_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if "tensorrt" in available_backends():
        pytest.skip("full tensorrt is installed here")
    monkeypatch.setenv(BACKEND_ENV, "tensorrt")
    with pytest.raises(BackendUnavailable, match="pip install tensorrt"):
        get_backend()


def test_unknown_backend_name_lists_choices() -> None:
    with pytest.raises(WorkbenchError, match="tensorrt or tensorrt_rtx"):
        get_backend("tensorrt-llm")


def _sanitized_stubs(target: Path) -> Path:
    """Copy tensorrt-stubs' .pyi files and fix the two syntax errors they ship with (a parameter named `in`,
    a required parameter after defaults), so mypy can read them."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or spec.origin is None:
        pytest.fail("tensorrt-stubs is not installed; `make test` installs it")
    site = Path(spec.origin).parent.parent
    for package in ("tensorrt", "tensorrt_bindings"):
        shutil.copytree(site / package, target / package)
    bindings = target / "tensorrt_bindings" / "tensorrt.pyi"
    text = bindings.read_text()
    text = re.sub(r"(?m)^(\s*def .*?)([(,] ?)in: ", lambda m: m.group(1) + m.group(2) + "in_: ", text)
    text = re.sub(r"(?m)^(\s*def .*?)([(,] ?)in: ", lambda m: m.group(1) + m.group(2) + "in_: ", text)
    text = text.replace("power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = ...)")
    bindings.write_text(text)
    return target


# The check is of our TensorRT calls against the stubs: modules outside workbench (numpy, onnx, torch...) are not
# followed (their types become Any), which takes a cold mypy run from ~40 s to ~2 s; stubs are always followed.
_MYPY_CONFIG = """\
[mypy]
python_version = 3.11
ignore_missing_imports = True
follow_imports = skip

[mypy-workbench.*]
follow_imports = silent

[mypy-tensorrt,tensorrt.*,tensorrt_bindings,tensorrt_bindings.*]
follow_imports = normal
# tensorrt-stubs itself does not type-check cleanly; we check our calls against it, not its own text
ignore_errors = True
"""


def _mypy(paths: list[str], stubs: Path) -> subprocess.CompletedProcess[str]:
    env = {"MYPYPATH": str(stubs), "PATH": "/usr/bin:/bin"}
    config = stubs / "mypy.ini"
    config.write_text(_MYPY_CONFIG)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", str(config), *paths],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sanitized_stubs(tmp_path_factory.mktemp("stubs"))


def test_backend_module_type_checks_against_tensorrt_10_stubs(stubs: Path) -> None:
    # the backend (every TensorRT call, incl. the full-TensorRT inspector path) and the build that picks a path
    result = _mypy(["workbench/engine/backend.py", "workbench/engine/build.py"], stubs)
    assert result.returncode == 0, result.stdout + result.stderr


def test_type_check_catches_calls_the_stubs_do_not_have(stubs: Path, tmp_path: Path) -> None:
    # Negative control: prove the check really sees the stubs (a silent `Any` would pass everything): an attribute
    # and a method no TensorRT class has are reported.
    probe = tmp_path / "probe_missing_api.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import tensorrt as trt\n"
        "def f(config: 'trt.IBuilderConfig', context: 'trt.IExecutionContext') -> None:\n"
        "    config.workspace_probe_limit = 1 << 30\n"
        "    context.enqueue_probe([], 0)\n"
    )
    result = _mypy([str(probe)], stubs)
    assert result.returncode != 0
    assert "workspace_probe_limit" in result.stdout and "enqueue_probe" in result.stdout


def test_type_check_sees_the_stubs_inside_the_backend_module(stubs: Path, tmp_path: Path) -> None:
    # Negative control on the checked module itself: the backend with a call the stubs lack slipped in fails the check
    # (its own ``import tensorrt`` resolves to the stubs, not to an Any the skipped imports would give).
    source = (REPO / "workbench" / "engine" / "backend.py").read_text()
    anchor = "    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED\n"
    assert anchor in source
    broken = tmp_path / "workbench" / "engine" / "backend.py"
    broken.parent.mkdir(parents=True)
    broken.write_text(source.replace(anchor, anchor + "    config.workspace_probe_limit = 1 << 30\n"))
    result = _mypy([str(broken)], stubs)
    assert result.returncode != 0 and "workspace_probe_limit" in result.stdout, result.stdout
