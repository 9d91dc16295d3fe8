"""The code's shape, checked: no import cycles, plain imports, a headless core, ruff-clean sources.

Import edges are read from the source with ``ast`` (every ``import`` and ``from ... import``, inside functions and
``TYPE_CHECKING`` blocks too): ``from a.b import c`` is an edge to ``a.b.c`` when ``c`` is a module, else to ``a.b``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "workbench"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        if "_vendor" in path.parts:
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _import_edges() -> dict[str, set[str]]:
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    edges[name].add(target if target in modules else node.module)
            elif isinstance(node, ast.Import):
                edges[name].update(alias.name for alias in node.names)
    return {name: {t for t in targets if t in modules and t != name} for name, targets in edges.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_import_edges()) == []


def _unit(module: str) -> str:
    """A stage package, or its command line: ``X.cli`` is an entry point above the library code of every package
    (it may resolve zoo names, or write an HTML page with viz), so it counts as its own unit."""
    parts = module.split(".")[1:] or ["__init__"]
    return f"{parts[0]}.cli" if parts[-1] == "cli" and len(parts) > 1 else parts[0]


def test_no_import_cycle_between_stage_packages() -> None:
    """Packages (model, clean, precision, engine, calib, timing, export, flow, report, viz, ui, zoo) form layers."""
    units: dict[str, set[str]] = defaultdict(set)
    for source, targets in _import_edges().items():
        for target in targets:
            if _unit(source) != _unit(target):
                units[_unit(source)].add(_unit(target))
    assert _cycles(units) == []
    # the layering the README describes: the core never reaches up into figures, widgets, the flow or the report
    for core in ("model", "clean", "precision", "engine", "calib", "timing", "export", "zoo"):
        assert not units[core] & {"viz", "ui", "flow", "report", "demo"}, (core, units[core])


def test_imports_are_plain() -> None:
    """No import_module / __import__ except where the backend picks tensorrt or tensorrt_rtx."""
    offenders = []
    for name, path in _modules().items():
        if name == "workbench.engine.backend":
            continue
        text = path.read_text(encoding="utf-8")
        if "import_module" in text or "__import__" in text:
            offenders.append(name)
    assert offenders == []


def test_stages_share_typed_artifacts_not_string_keys() -> None:
    offenders = [name for name, path in _modules().items() if ".objects[" in path.read_text(encoding="utf-8")]
    assert offenders == []


BLOCKER = """
import importlib.abc, sys
BLOCKED = ("plotly", "ipywidgets", "tensorrt", "tensorrt_rtx", "IPython", "anywidget")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the core must import without it")
sys.meta_path.insert(0, Block())
import workbench.model, workbench.clean, workbench.precision, workbench.engine, workbench.calib, workbench.timing
import workbench.export, workbench.flow, workbench.zoo
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED))
print("loaded:", loaded)
"""


def test_core_imports_without_plotting_widgets_or_tensorrt() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCKER], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "loaded: []" in result.stdout


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    """ruff, configured in pyproject.toml, over the package, tests, benchmarks and scripts."""
    paths = [str(REPO / p) for p in ("workbench", "tests", "bench", "scripts", "docs") if (REPO / p).exists()]
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, *paths], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


# Measured when the workbench was typed (issue 22 item 7): 184 of 5,788 annotations = 3.2 % (474 of 5,739 = 8.3 %
# before; the target is <= 5 %); the limit leaves a few annotations of room above that. New code keeps below it:
# a value only passed through is ``object``, JSON is ``workbench.artifact.JsonObject``, ONNX / graphsurgeon / ORT /
# torch objects carry their own types.
MAX_ANY_SHARE = 0.033


def _annotations(tree: ast.AST) -> list[ast.expr]:
    """Every function-argument, return and annotated-assignment annotation of a module."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            found += [arg.annotation for arg in every if arg is not None and arg.annotation is not None]
            if node.returns is not None:
                found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def test_any_stays_in_few_annotations() -> None:
    """At most 3.3 % of the annotations in ``workbench/`` contain ``Any`` (184 of 5,788 = 3.2 % when this was
    written; issue 22 asks for <= 5 %). The message lists the modules with the most."""
    total = 0
    with_any: dict[str, int] = defaultdict(int)
    for name, path in _modules().items():
        for annotation in _annotations(ast.parse(path.read_text(encoding="utf-8"))):
            total += 1
            if "Any" in ast.unparse(annotation):
                with_any[name] += 1
    share = sum(with_any.values()) / total
    worst = sorted(with_any.items(), key=lambda item: -item[1])[:8]
    assert share <= MAX_ANY_SHARE, (
        f"{sum(with_any.values())} of {total} annotations ({share:.1%}) contain Any, above {MAX_ANY_SHARE:.1%}; "
        f"most in {worst}"
    )
