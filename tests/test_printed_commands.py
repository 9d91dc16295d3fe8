"""Every command we print runs as printed: the commands in the notebooks, the README's command blocks, the report and
the hints of CLI messages are extracted from their text and checked against the real CLI, and the runnable ones are
run (the real `workbench` CLI in a forked child, real TensorRT-RTX builds, ONNX Runtime).

* every printed command names a real subcommand, real options and valid choices (templates included);
* the notebooks' command blocks run in order in one folder, as printed (a skip or a speed flag says why);
* the README's command templates each have a concrete instance here (its options a subset of the template's), run
  in order on digits-cnn; its concrete lines run as printed (a skip says why);
* the hint `export` prints (``check with `workbench verify BUNDLE```) runs as printed.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runner import CliRun, run_cli_forked

REPO = Path(__file__).resolve().parents[1]
PREFIXES = ("$W ", ".venv/bin/workbench ", "workbench ")


@dataclass(frozen=True)
class Printed:
    source: str  # where it is printed (file, cell)
    text: str  # the command without its program name: "build rec.qdq.onnx -o rec.engine"
    block: str = ""  # commands of one code block run in order, in one folder


def _command(line: str) -> str | None:
    line = line.strip()
    for prefix in PREFIXES:
        if line.startswith(prefix):
            return re.sub(r"\s+#.*$", "", line[len(prefix) :]).strip()
    return None


def _fenced_lines(text: str, languages: tuple[str, ...] = ("", "bash", "sh")) -> list[list[str]]:
    """Each shell code block's lines: comments dropped, continuation lines (ending in a backslash) joined, `a && b`
    split into two commands."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    language = ""
    for raw in text.splitlines():
        if raw.strip().startswith("```"):
            if current is None:
                current, language = [], raw.strip()[3:].strip()
            else:
                if language in languages:
                    blocks.append(current)
                current = None
            continue
        if current is not None:
            line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
            if current and current[-1].endswith("\\"):
                current[-1] = current[-1][:-1].rstrip() + " " + line.strip()
            elif line.strip():
                current.append(line)
    return [[part.strip() for line in block for part in line.split("&&")] for block in blocks]


def readme_commands() -> list[Printed]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = []
    for index, block in enumerate(_fenced_lines(text)):
        for line in block:
            command = _command(line)
            if command is not None:
                found.append(Printed("README.md", command, f"README block {index}"))
    return found


def notebook_commands() -> list[Printed]:
    found = []
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for number, cell in enumerate(cells):
            if cell["cell_type"] != "markdown":
                continue
            text = "".join(cell["source"])
            for block in _fenced_lines(text):
                for line in block:
                    command = _command(line)
                    if command is not None:
                        found.append(Printed(f"{path.name} cell {number}", command, path.name))
            for span in re.findall(r"`(workbench [^`]+)`", text):
                found.append(Printed(f"{path.name} cell {number} (inline)", span[len("workbench ") :]))
    return found


def source_commands() -> list[Printed]:
    """Commands in the package's messages, hints and report: `workbench SUB ...` in a string or code span."""
    from workbench.cli import make_parser

    names = "|".join(re.escape(name) for name in _subparsers(make_parser()))
    pattern = re.compile(rf"(?:`|\"|\(|<code>)workbench ((?:{names})\b[^`\"()<;]*)")
    found = []
    for path in sorted((REPO / "workbench").rglob("*.py")):
        if "_vendor" in path.parts:
            continue
        for match in pattern.finditer(path.read_text(encoding="utf-8")):
            found.append(Printed(str(path.relative_to(REPO)), match.group(1).strip().rstrip(".,;:")))
    return found


def _subparsers(parser: Any) -> dict[str, Any]:
    action = next((a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"), None)
    return dict(action.choices) if action is not None else {}


def _option_tokens(text: str) -> list[str]:
    """The words of a command or template: brackets of optional parts and alternatives' bars kept as written."""
    return shlex.split(text.replace("[", " ").replace("]", " "))


def option_problems(printed: Printed) -> list[str]:
    """What in a printed command the CLI does not have: its subcommand, an option, or a choice of an option."""
    from workbench.cli import make_parser

    words = _option_tokens(printed.text)
    parser = make_parser()
    subcommands = _subparsers(parser)
    if not words or words[0] not in subcommands:
        return [f"{printed.source}: no subcommand {words[:1]} in {printed.text!r}"]
    parser = subcommands[words[0]]
    if len(words) > 1 and words[1] in _subparsers(parser):
        parser = _subparsers(parser)[words[1]]
    options = parser._option_string_actions
    problems = []
    for position, word in enumerate(words):
        if not word.startswith("-") or re.fullmatch(r"-?\d[\d.e-]*", word):
            continue
        flag = word.split("=", 1)[0]
        if flag not in options:
            problems.append(f"{printed.source}: {printed.text!r} uses {flag}, which `{words[0]}` does not have")
            continue
        action = options[flag]
        value = word.split("=", 1)[1] if "=" in word else (words[position + 1] if position + 1 < len(words) else "")
        if action.choices is not None and value and not value.startswith("-"):
            problems += [
                f"{printed.source}: {printed.text!r}: {flag} {choice} not in {action.choices}"
                for choice in value.split("|")
                if not (choice.isupper() or choice == "...") and choice not in action.choices
            ]
    return problems


ALL_PRINTED = readme_commands() + notebook_commands() + source_commands()


def test_the_extraction_finds_the_printed_commands() -> None:
    texts = {printed.text for printed in ALL_PRINTED}
    assert "build rec.qdq.onnx -o rec.engine" in texts  # notebook 03's command block
    assert any(text.startswith("calibrate MODEL --data DIR|zoo --target-drop") for text in texts)  # README template
    assert any(text.startswith("build --precision fp16") for text in texts)  # a CLI hint
    assert any(text == "demo" for text in texts)  # the report's header
    assert len(ALL_PRINTED) >= 30


@pytest.mark.parametrize("printed", ALL_PRINTED, ids=lambda p: f"{p.source}: {p.text}"[:90])
def test_every_printed_command_names_real_options(printed: Printed) -> None:
    assert option_problems(printed) == []


# --- the notebooks' command blocks, run in order ------------------------------------------------------------------

# What a notebook command needs to run here in seconds, and why; a skipped command is still checked for its options.
NOTEBOOK_SPEED = {
    "calibrate ocr-rec": (
        ["--max-batches", "1", "--eval-limit", "32"],
        "one calibration batch instead of 32 and the printed task metric on 32 samples: the same kind of Q/DQ file",
    ),
    "diff ocr-rec": (["--max-batches", "1", "--eval-limit", "32"], "one diff batch instead of 8, the metric on 32"),
}
NOTEBOOK_SKIP = {
    "calibrate efficientnet-lite0": "a 30-evaluation accuracy-target search on EfficientNet-Lite0 takes ~25 min on 2 "
    "cores (bench/calibrate.py --mixed runs it); test_own_file.py and test_calib_mixed.py run --target-drop searches",
}


def _ok(run: CliRun, what: str) -> None:
    assert run.returncode == 0, f"{what}: exit {run.returncode}\n{run.stdout[-1500:]}\n{run.stderr[-2000:]}"
    assert "Traceback" not in run.stderr, run.stderr


def _argv(text: str) -> list[str]:
    return shlex.split(text)


NOTEBOOK_BLOCKS = sorted({p.block for p in notebook_commands() if p.block})


@pytest.mark.parametrize("notebook", NOTEBOOK_BLOCKS)
def test_notebook_command_blocks_run_as_printed(notebook: str, tmp_path: Path) -> None:
    commands = [p for p in notebook_commands() if p.block == notebook]
    ran = []
    for printed in commands:
        argv = _argv(printed.text)
        if any(printed.text.startswith(prefix) for prefix in NOTEBOOK_SKIP):
            continue
        extra = next((flags for prefix, (flags, _why) in NOTEBOOK_SPEED.items() if printed.text.startswith(prefix)), [])
        _ok(run_cli_forked([*argv, *extra], tmp_path, timeout=600), f"{notebook}: workbench {printed.text}")
        ran.append(printed.text)
    assert ran, f"{notebook}: no command ran"
    if notebook == "03_int8_calibration.ipynb":  # the command that failed ("... Expected: --shapes"), as printed
        assert "build rec.qdq.onnx -o rec.engine" in ran
        layers = json.loads((tmp_path / "rec.layers.json").read_text())["engine_layers"]
        assert any(layer.get("precision") == "int8" for layer in layers)


# --- the README: its templates each have a concrete instance; its concrete lines run --------------------------------

MODEL = "digits-cnn"
# (instance argv, the README template it instantiates by its first words), run in this order in one folder
README_INSTANCES = [
    ["doctor", "--json"],
    ["zoo"],
    ["clean", MODEL, "-o", "c.onnx", "--report", "c.json"],
    ["build", MODEL, "-o", "e.engine", "--precision", "fp16"],
    ["build", MODEL, "--plan", "plan.json", "--strict-precision", "-o", "strict.engine"],
    ["fusions", "e.layers.json", "--html", "f.html"],
    ["explore", "e.engine", "--export", "x"],
    ["calibrate", MODEL, "--data", "zoo", "--method", "entropy", "-o", "q.onnx", "--cache", "cache.json"],
    [
        "calibrate",
        MODEL,
        "--data",
        "zoo",
        "--target-drop",
        "0.01",
        "--fallback",
        "fp16",
        "--budget",
        "1",
        "--confidence",
        "0.95",
        "-o",
        "m.onnx",
    ],
    ["calibrate", MODEL, "--format", "fp8", "-o", "q8.onnx"],
    ["build", "q8.onnx", "--precision", "fp8", "-o", "q8.engine"],
    ["calibrate", MODEL, "--target-drop", "0.01", "--formats", "int8,fp8,fp16", "-o", "m8.onnx"],
    ["diff", MODEL, "q.onnx", "--data", "zoo", "-o", "d.json", "--threshold", "20"],
    ["time", MODEL, "--executor", "cpu", "--streams", "1,2", "--batch", "1", "-o", "t.json"],
    ["export", "e.engine", "-o", "bundle"],
    ["verify", "bundle"],
    ["clean", MODEL, "-o", "c2.onnx", "--data", "zoo", "--check-batches", "1"],
]
README_SKIP = {  # concrete README lines that cannot run here, and why (their options are still checked above)
    "time cls.engine --executor trt": "needs an NVIDIA GPU and full TensorRT, the premise of that README block",
    "clean silero_vad.onnx": "needs Silero VAD's files and input batches; tests/test_clean_models.py cleans them",
}


def _flags(words: list[str]) -> set[str]:
    return {word.split("=", 1)[0] for word in words if word.startswith("-") and not re.fullmatch(r"-?\d[\d.e-]*", word)}


def _is_template(text: str) -> bool:
    return bool(re.search(r"\b[A-Z][A-Z_]{2,}\b|\b[A-Z]\.|[|\[]", text))  # MODEL, M.fp8.onnx, a|b, [opt]


def test_every_readme_template_has_a_concrete_instance() -> None:
    templates = [p for p in readme_commands() if _is_template(p.text)]
    assert len(templates) >= 10
    for template in templates:
        words = _option_tokens(template.text)
        matching = [argv for argv in README_INSTANCES if argv[0] == words[0] and _flags(argv) <= _flags(words) | {"-o"}]
        assert matching, f"README template {template.text!r} has no instance in README_INSTANCES"
    for argv in README_INSTANCES:  # and no instance uses an option its README line does not print
        assert any(
            _option_tokens(p.text)[0] == argv[0] and _flags(argv) <= _flags(_option_tokens(p.text)) | {"-o"}
            for p in readme_commands()
        ), argv


def test_readme_templates_run_on_a_zoo_model_and_export_prints_a_verify_that_runs(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps({"default": "fp16", "overrides": {}, "note": "README instance"}))
    verified = []
    for argv in README_INSTANCES:
        run = run_cli_forked(argv, tmp_path, timeout=300)
        _ok(run, "workbench " + " ".join(argv))
        assert "Traceback" not in run.stdout + run.stderr
        if argv[0] == "export":  # its hint, as printed
            (hint,) = re.findall(r"check with `workbench (verify [^`]+)`", run.stdout)
            check = run_cli_forked(_argv(hint), tmp_path)
            _ok(check, "workbench " + hint)
            verified.append(hint)
    assert verified, "no README instance exports a bundle, so its printed verify hint was never run"


def test_readme_concrete_commands_run_as_printed(tmp_path: Path) -> None:
    concrete = [p for p in readme_commands() if not _is_template(p.text)]
    ran = []
    for printed in concrete:
        if any(printed.text.startswith(prefix) for prefix in README_SKIP):
            continue
        _ok(run_cli_forked(_argv(printed.text), tmp_path, timeout=300), "workbench " + printed.text)
        ran.append(printed.text)
    assert "doctor" in ran and "build ocr-cls -o cls.engine" in ran


README_OTHER = {  # the README's other command lines, and why this test does not run them
    "make demo": "runs `workbench demo`, which tests/test_quickstart.py and tests/test_unseen_models.py run",
    "make test": "the test suite itself",
    ".venv/bin/pip install": "installs full TensorRT from NVIDIA's package index, which this machine cannot reach",
    "W=": "sets the variable the lines below it use",
}


def test_the_readme_runs_or_explains_every_command_line() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = [line for block in _fenced_lines(text) for line in block]
    unexplained = [line for line in lines if _command(line) is None and not line.startswith(tuple(README_OTHER))]
    assert not unexplained, unexplained


def test_a_qdq_model_carries_the_profile_it_was_calibrated_with(tmp_path: Path, capsys) -> None:
    """So `workbench build QDQ.onnx` needs no --shapes (OCR's width is symbolic); --shapes still overrides it, and a
    damaged record is a message, not a traceback."""
    import onnx

    from workbench.cli import main as cli_main
    from workbench.engine.build import model_and_shapes
    from workbench.model.profile import PROFILE_METADATA_KEY, read_profile_metadata
    from workbench.zoo import get_entry

    out = tmp_path / "cls.qdq.onnx"
    argv = ["calibrate", "ocr-cls", "--data", "zoo", "--max-batches", "1", "--eval-limit", "8", "-o", str(out)]
    assert cli_main([*argv, "--no-progress"]) == 0, capsys.readouterr().err
    profiles, source = read_profile_metadata(onnx.load(out))
    assert profiles == get_entry("ocr-cls").input_profiles() and "ocr-cls" in source
    assert model_and_shapes(str(out))[1] == profiles
    damaged = onnx.load(out)
    next(p for p in damaged.metadata_props if p.key == PROFILE_METADATA_KEY).value = '{"inputs": {"x": [[1, 3]]}}'
    onnx.save(damaged, tmp_path / "damaged.onnx")
    capsys.readouterr()
    assert cli_main(["build", str(tmp_path / "damaged.onnx"), "-o", str(tmp_path / "d.engine")]) == 2
    assert "not a readable optimization profile" in capsys.readouterr().err


# --- the report's "next steps": its commands run as printed on the run they were printed for ------------------------


def test_report_next_steps_run_as_printed(tmp_path: Path) -> None:
    """A demo run's report prints its next steps with this run's own paths; each runs as printed, in order (the diff
    writes the JSON the explorer step overlays), and each names real options."""
    import html

    from workbench.demo import run_demo

    demo = run_demo("digits-cnn", tmp_path / "out", timing_window_s=0.1)
    steps = demo.report.read_text(encoding="utf-8").split('<section id="next-steps">')[1].split("</section>")[0]
    commands = [html.unescape(text) for text in re.findall(r"<code>workbench ([^<]+)</code>", steps)]
    names = [command.split()[0] for command in commands]
    assert names[:2] == ["diff", "explore"] and names[-1] == "verify", commands  # calibrate when the search kept wider
    for command in commands:
        assert option_problems(Printed("report next steps", command)) == []
        _ok(run_cli_forked(_argv(command), tmp_path, timeout=300), "workbench " + command)
    assert (tmp_path / "out" / "next" / "int8.diff.json").is_file()
    assert list((tmp_path / "out" / "next" / "explore").glob("*.graphs.json"))
