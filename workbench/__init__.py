"""trt-workbench: a TensorRT optimization workbench.

The core API is plain Python over small dataclasses. Importing ``workbench`` never imports TensorRT, plotly or
ipywidgets; each stage imports what it needs when it runs.
"""

from workbench.errors import WorkbenchError

__version__ = "0.1.0"

__all__ = ["WorkbenchError", "__version__"]
