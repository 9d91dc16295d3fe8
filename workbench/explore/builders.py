"""Model Explorer's graph and node-data builders, imported without torch.

``model_explorer`` imports torch when it is installed (``try: import torch``, for its PyTorch adapter, which the
explorer never uses); in a process that has not imported torch yet that import costs seconds (7 of the 8.6 s an
import of model_explorer took on a loaded 2-core machine). Here that one import, made by a ``model_explorer`` module,
fails as if torch were absent; any other import of torch, from any thread, finds it as usual.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import FrameType, ModuleType


def _imported_by_model_explorer() -> bool:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "model_explorer" or name.startswith("model_explorer."):
            return True
        frame = frame.f_back
    return False


class _NoTorchForModelExplorer(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torch" and _imported_by_model_explorer():
            raise ImportError("torch is not imported for model_explorer inside the workbench explorer")
        return None


def _import_without_torch() -> None:
    if "model_explorer" in sys.modules or "torch" in sys.modules:
        return
    finder = _NoTorchForModelExplorer()
    sys.meta_path.insert(0, finder)
    try:
        import model_explorer  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


_import_without_torch()

from model_explorer import graph_builder, node_data_builder  # noqa: E402

__all__ = ["graph_builder", "node_data_builder"]
