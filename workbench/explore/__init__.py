"""The engine explorer: what TensorRT did to the model, layer by layer, in Google's Model Explorer.

:mod:`.graphs` builds the ONNX graph grouped by engine layer and the engine graph (Model Explorer ``graph_builder``),
:mod:`.overlays` the node-data overlays (precision, fusion size, INT8 damage, lint, layer time), :mod:`workbench.engine.lint` the
engine linter, :mod:`.server` this kernel's Model Explorer server, :mod:`.explorer` :func:`explore`, :mod:`.cli`
``workbench explore``. Model Explorer is imported only when a graph is built, so ``workbench --help`` stays fast.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from workbench.engine.lint import Finding, LintReport, lint

if TYPE_CHECKING:
    from workbench.explore.explorer import Explorer

__all__ = ["Explorer", "Finding", "LintReport", "build_explorer", "explore", "lint"]


def explore(*args: Any, **kwargs: Any) -> Explorer:
    """See :func:`workbench.explore.explorer.explore`."""
    from workbench.explore.explorer import explore as _explore

    return _explore(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("Explorer", "build_explorer"):
        from workbench.explore import explorer

        return getattr(explorer, name)
    raise AttributeError(f"module 'workbench.explore' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """``workbench.explore(...)`` calls :func:`explore` although ``workbench.explore`` is this package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Explorer:
        return explore(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
