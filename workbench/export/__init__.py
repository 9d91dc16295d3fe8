"""Stage 7: an engine bundle you can trust and reload (:class:`Bundle`), optionally with a Triton model repository."""

from workbench.export.bundle import (
    BUNDLE_FORMAT,
    CALIBRATION_FILE,
    ENGINE_FILE,
    LAYERS_FILE,
    MANIFEST_FILE,
    Bundle,
    LoadedEngine,
    check_engine_compatible,
    export_bundle,
    load_engine,
    normalize_compute_capability,
    read_bundle,
    target_compute_capabilities,
)
from workbench.export.triton import TritonOptions, triton_config, validate_triton_config

__all__ = [
    "BUNDLE_FORMAT",
    "CALIBRATION_FILE",
    "ENGINE_FILE",
    "LAYERS_FILE",
    "MANIFEST_FILE",
    "Bundle",
    "LoadedEngine",
    "TritonOptions",
    "check_engine_compatible",
    "export_bundle",
    "load_engine",
    "normalize_compute_capability",
    "read_bundle",
    "target_compute_capabilities",
    "triton_config",
    "validate_triton_config",
]
