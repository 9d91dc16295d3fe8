"""The one logger set-up and the one progress-event type."""

from __future__ import annotations

import logging
import warnings

import pytest

import workbench.calib.stats as a_workbench_module
from workbench.log import LIBRARY_WARNINGS, get_logger, split_warnings
from workbench.progress import ProgressEvent, report


def test_loggers_are_named_per_package() -> None:
    assert get_logger("workbench.calib.stats").name == "workbench.calib.stats"
    assert get_logger("somewhere").name == "workbench.somewhere"
    assert get_logger("workbench.calib").parent is logging.getLogger("workbench")


def test_other_libraries_warnings_go_to_the_log_and_own_ones_to_the_panel(caplog: pytest.LogCaptureFixture) -> None:
    import locale

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        locale.getdefaultlocale()  # the standard library's own DeprecationWarning (Python 3.11+)
        warnings.warn_explicit("ranges from random data", UserWarning, filename=a_workbench_module.__file__, lineno=1)
    assert len(caught) == 2
    with caplog.at_level(logging.WARNING, logger=LIBRARY_WARNINGS):
        own = split_warnings(caught)
    assert own == ["UserWarning: ranges from random data"]
    assert [r.name for r in caplog.records] == [LIBRARY_WARNINGS]
    assert "getdefaultlocale" in caplog.records[0].getMessage()


def test_progress_event_text_and_cancel() -> None:
    event = ProgressEvent("evaluation", "plan 2", index=3, total=8)
    assert event.fraction == pytest.approx(0.375)
    assert event.text() == "evaluation 3 of 8, 38%: plan 2"
    assert ProgressEvent("build", "parsing").text() == "build: parsing"
    assert report(None, event) is True
    assert report(lambda e: False, event) is False
    assert report(lambda e: None, event) is True
    with pytest.raises(ValueError):
        ProgressEvent("x", "y", index=-1)


def test_cli_verbose_logs_each_cleaning_pass_to_stderr(tmp_path) -> None:
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper

    # a real model with one removable Identity: the cleaner's passes run and are logged under -v
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"], name="copy"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
    )
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    quiet = subprocess.run(
        [sys.executable, "-m", "workbench", "clean", str(source), "-o", str(tmp_path / "a.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    loud = subprocess.run(
        [sys.executable, "-m", "workbench", "-v", "clean", str(source), "-o", str(tmp_path / "b.onnx")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert "workbench.clean.pipeline: pass " not in quiet.stderr
    logged = [line for line in loud.stderr.splitlines() if line.startswith("workbench.clean.pipeline: pass ")]
    assert any("remove_noops" in line or "identity" in line.lower() for line in logged), loud.stderr


def test_cli_commands_show_a_warning_once_as_a_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`demo` printed Python's `session.py:434: UserWarning: GPTQ: 27 of 74 weighted layers keep nearest ...`
    followed by one of our source lines (ViT-B/16, 2026-12-06); the commands that run stages show `warning: TEXT`
    once instead, and Python's own display is back afterwards."""
    from workbench.cli import make_parser
    from workbench.demo import _cli as demo_command
    from workbench.log import warnings_as_lines

    def stage() -> int:
        for _ in range(2):
            warnings.warn("GPTQ: 2 of 5 weighted layers keep nearest rounding", UserWarning, stacklevel=1)
        return 0

    original = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert warnings_as_lines(stage)() == 0
    assert capsys.readouterr().out == "warning: GPTQ: 2 of 5 weighted layers keep nearest rounding\n"
    assert warnings.showwarning is original
    parser = make_parser()
    for argv in (["calibrate", "m.onnx", "-o", "q.onnx"], ["diff", "m.onnx", "q.onnx", "-o", "d.json"]):
        assert getattr(parser.parse_args(argv).func, "__wrapped__", None) is not None, argv
    assert make_parser().parse_args(["demo"]).func.__wrapped__ is demo_command
