"""Execute a notebook headless with nbclient (kernel python3 from .venv) and collect what it printed and showed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@dataclass
class ExecutedNotebook:
    notebook: Any
    outputs: list[Any]
    seconds: float

    @property
    def text(self) -> str:
        """Streams, plain-text/HTML results and (JSON-dumped) rich data, joined."""
        parts = []
        for output in self.outputs:
            parts.append(output.get("text", ""))
            for value in output.get("data", {}).values():
                parts.append(value if isinstance(value, str) else json.dumps(value))
        return "\n".join(parts)

    @property
    def stream_text(self) -> str:
        return "".join(o.get("text", "") for o in self.outputs if o.get("output_type") == "stream")

    def count(self, mime: str) -> int:
        return sum(mime in o.get("data", {}) for o in self.outputs)


def with_model(settings_source: str, model: str) -> str:
    """A notebook settings cell's source with its ``MODEL = (...)`` (the zoo's default) set to ``model``."""
    source = re.sub(r"^MODEL = \(.*?\n\)", f"MODEL = {model!r}", settings_source, count=1, flags=re.M | re.S)
    assert f"MODEL = {model!r}" in source, "no MODEL = (...) setting in the cell"
    return source


def execute_notebook(
    name: str,
    *,
    workdir: Path | None = None,
    extra_cells: Sequence[str] = (),
    parameters: Mapping[str, str] | None = None,
    model: str | None = None,
    timeout_s: int = 300,
) -> ExecutedNotebook:
    """Run ``notebooks/<name>`` (plus ``extra_cells`` appended in memory) in ``workdir`` (default: notebooks/).

    ``parameters``: ``NAME -> Python expression`` replacing the value of ``NAME = ...`` lines in the notebook's
    parameters cell (a quicker run than the defaults). ``model``: the zoo model the settings cell's ``MODEL = (...)``
    names instead of its default. Fails the test with the cell's error if any cell raised.
    """
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    if model is not None:
        cell = next(c for c in notebook.cells if c.cell_type == "code" and "MODEL = (" in c.source)
        cell.source = with_model(cell.source, model)
    for key, value in (parameters or {}).items():
        cell = next(c for c in notebook.cells if c.cell_type == "code" and c.source.lstrip().startswith("# parameters"))
        pattern = re.compile(rf"^{re.escape(key)} = .*$", flags=re.M)
        assert pattern.search(cell.source), f"{name}: no parameter {key}"
        cell.source = pattern.sub(f"{key} = {value}", cell.source, count=1)
    for source in extra_cells:
        notebook.cells.append(nbformat.v4.new_code_cell(source))
    started = time.perf_counter()
    NotebookClient(
        notebook, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(workdir or NOTEBOOKS)}}
    ).execute()
    seconds = time.perf_counter() - started
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{name}: cells failed: {errors}"
    return ExecutedNotebook(notebook, outputs, seconds)
