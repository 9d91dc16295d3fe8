"""trt-workbench: a TensorRT optimization workbench.

The core API is plain Python over small dataclasses. Importing ``workbench`` never imports TensorRT, plotly or
ipywidgets; each stage imports what it needs when it runs.
"""

import sys

from workbench.errors import WorkbenchError

__version__ = "0.1.0"

__all__ = ["WorkbenchError", "__version__", "explore"]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """``workbench.explore(...)``: the engine explorer, imported on first use (it pulls in Model Explorer)."""
    if name == "explore":
        import workbench.explore  # noqa: F401  (registers the submodule)

        return sys.modules["workbench.explore"]
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")
