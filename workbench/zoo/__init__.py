"""The built-in model zoo: real pretrained models with deterministic data and task metrics, all offline.

>>> from workbench.zoo import get_entry
>>> entry = get_entry("ocr-rec")
>>> path = entry.onnx_path()                      # materialized into cache_dir() once
>>> result = entry.evaluate_onnx(path, limit=50)  # FP32 metric with ONNX Runtime CPU

Importing this package never imports torch: only ``efficientnet-lite0`` and ``minilm`` need it, to export their
ONNX on first use (``requires_torch``).
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.zoo.base import MetricResult, ZooEntry, cache_dir, make_ort_predict
from workbench.zoo.digits import DigitsCnnEntry
from workbench.zoo.efficientnet import EfficientNetLite0Entry
from workbench.zoo.minilm import MiniLmEntry
from workbench.zoo.ocr import OcrClsEntry, OcrDetEntry, OcrRecEntry

# The main job's default (`make demo`, the quickstart): PP-OCR's text-direction classifier, a real pretrained
# model that needs no torch; the whole journey takes ~25 s on 2 CPU cores and entropy-calibrated INT8 visibly
# costs it accuracy (top-1 0.990 -> 0.9725), which the per-layer diff traces and the FP32 fallback repairs.
# ocr-rec breaks far more under INT8 but takes ~1.5 min (`workbench demo --model ocr-rec`).
DEFAULT_MODEL = "ocr-cls"

# Entry modules import only numpy at module level (torch and the models load on first use).
_ENTRY_CLASSES: dict[str, type[ZooEntry]] = {
    "digits-cnn": DigitsCnnEntry,
    "ocr-cls": OcrClsEntry,
    "ocr-rec": OcrRecEntry,
    "ocr-det": OcrDetEntry,
    "efficientnet-lite0": EfficientNetLite0Entry,
    "minilm": MiniLmEntry,
}
_instances: dict[str, ZooEntry] = {}


def entry_names() -> list[str]:
    return list(_ENTRY_CLASSES)


def get_entry(name: str) -> ZooEntry:
    """The zoo entry called ``name``; raises WorkbenchError listing the valid names otherwise."""
    if name not in _ENTRY_CLASSES:
        raise WorkbenchError(f"unknown zoo model {name!r}.", expected="one of " + ", ".join(_ENTRY_CLASSES))
    if name not in _instances:
        _instances[name] = _ENTRY_CLASSES[name]()
    return _instances[name]


def resolve_model(spec: str) -> tuple[Path, ZooEntry | None]:
    """A command line's MODEL argument: an ONNX path, or a zoo name (materialized; its entry comes with it).

    ``spec`` is a path when it exists, ends in ``.onnx`` or contains a path separator; otherwise it must be a zoo
    name. A path is returned as given (callers load it and report a missing file themselves).
    """
    path = Path(spec)
    if path.exists() or spec.endswith(".onnx") or "/" in spec or os.sep in spec:
        return path, None
    if spec not in _ENTRY_CLASSES:
        raise WorkbenchError(
            f"{spec}: no such file and not a zoo model name.",
            expected="a path to an .onnx file or one of " + ", ".join(_ENTRY_CLASSES),
        )
    entry = get_entry(spec)
    return entry.onnx_path(), entry


def list_entries() -> list[ZooEntry]:
    """Every zoo entry, in a fixed order (small and torch-free first)."""
    return [get_entry(name) for name in _ENTRY_CLASSES]


__all__ = [
    "DEFAULT_MODEL",
    "MetricResult",
    "ZooEntry",
    "cache_dir",
    "entry_names",
    "get_entry",
    "list_entries",
    "make_ort_predict",
    "resolve_model",
]
