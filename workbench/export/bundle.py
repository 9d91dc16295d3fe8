"""Export: an engine bundle directory (engine + manifest.json + layer map [+ Triton model repository]).

The bundle is written into a temporary sibling directory and renamed into place, so a failed export never leaves
a half-written bundle. ``load_engine(bundle)`` refuses an engine whose backend version or compute capability does
not match the machine, before TensorRT gets a chance to fail obscurely.

The optional Triton model repository comes from :mod:`workbench.export.triton`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench._io import sha256_file, write_json_atomic, write_text_atomic
from workbench.artifact import Artifact
from workbench.engine import EngineArtifact, LayerMap
from workbench.errors import EngineCannotRun, WorkbenchError
from workbench.export.triton import TritonOptions, triton_config
from workbench.precision import PrecisionPlan

BUNDLE_FORMAT = "trt-workbench-bundle"
BUNDLE_VERSION = 1
ENGINE_FILE = "model.engine"
LAYERS_FILE = "model.layers.json"
MANIFEST_FILE = "manifest.json"
CALIBRATION_FILE = "calibration.cache"


@dataclass(frozen=True)
class Bundle(Artifact):
    """An exported bundle on disk, read back and checked against its manifest."""

    path: Path
    manifest: dict[str, Any]
    engine_path: Path

    @classmethod
    def from_json(cls, data: Any) -> Bundle:
        """A bundle's JSON names its folder; the bundle is read back from it and checked (:func:`read_bundle`)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("path"), str):
            raise WorkbenchError("bundle JSON has no 'path'.", expected="the JSON of a Bundle")
        return read_bundle(data["path"])

    @property
    def layer_map(self) -> LayerMap:
        return LayerMap.load(self.path / LAYERS_FILE, label=self.manifest.get("label", ""))

    @property
    def triton_config_path(self) -> Path | None:
        triton = self.manifest.get("triton")
        return self.path / triton["config"] if triton else None


# --- compute capabilities ----------------------------------------------------------------------------------


def normalize_compute_capability(name: str) -> str:
    """'SM86', 'sm_86', '8.6' or '86' -> '8.6'."""
    text = name.strip().upper().replace("SM_", "").replace("SM", "")
    if "." in text:
        major, minor = text.split(".", 1)
        return f"{int(major)}.{int(minor)}"
    if text.isdigit() and len(text) >= 2:
        return f"{int(text[:-1])}.{int(text[-1])}"
    raise WorkbenchError(f"cannot read compute capability {name!r}.", expected="SM86, sm_86, 8.6 or 86")


def target_compute_capabilities(backend_name: str, requested: Sequence[str]) -> list[str]:
    """The compute capabilities an engine runs on: the requested ones; for RTX without a request, every one
    TensorRT-RTX supports (it builds a portable engine); for full TensorRT, the build GPU's ('build-gpu')."""
    from workbench.engine.backend import RTX_RUNTIME_COMPUTE_CAPABILITIES

    real = [name for name in requested if any(ch.isdigit() for ch in name)]
    if real:
        return [normalize_compute_capability(name) for name in real]
    if backend_name == "tensorrt_rtx":
        return [f"{major}.{minor}" for major, minor in RTX_RUNTIME_COMPUTE_CAPABILITIES]
    # full TensorRT builds for the GPU it builds on; exports normally run on the build machine
    from workbench.engine.backend import detect_gpu

    gpu = detect_gpu()
    return (
        [".".join(str(part) for part in gpu.compute_capability)]
        if gpu.present and gpu.compute_capability
        else ["build-gpu"]
    )


# --- export ------------------------------------------------------------------------------------------------


def export_bundle(
    engine: EngineArtifact,
    output_dir: str | os.PathLike[str],
    *,
    plan: PrecisionPlan | None = None,
    calibration_cache: str | os.PathLike[str] | None = None,
    accuracy: Mapping[str, Any] | None = None,
    timing: Mapping[str, Any] | None = None,
    triton: TritonOptions | None = None,
    overwrite: bool = False,
) -> Bundle:
    """Write a bundle for a built engine (from :func:`~workbench.engine.engine_from_onnx` or
    :meth:`EngineArtifact.load`). Every manifest field comes from the artifact; the optional extras are recorded
    when given. ``plan`` defaults to the plan the engine was built with."""
    engine_path = engine.engine_path
    if not engine_path.is_file():
        raise WorkbenchError(f"{engine_path}: no such engine file.", expected="an engine written by `workbench build`")
    if not engine.layers_path.is_file():
        raise WorkbenchError(
            f"{engine.layers_path}: the engine's layer records are missing.",
            expected="the .layers.json that `workbench build` writes next to the engine",
            hint="pass --layers",
        )
    output_dir = Path(output_dir)
    if output_dir.exists() and not overwrite:
        raise WorkbenchError(
            f"{output_dir}: already exists.", expected="a new bundle directory", hint="use --overwrite to replace it"
        )
    plan = plan if plan is not None else engine.options.plan
    manifest: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_VERSION,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "label": engine.label,
        "engine": {"file": ENGINE_FILE, "sha256": sha256_file(engine_path), "bytes": engine_path.stat().st_size},
        "onnx": {"path": str(engine.onnx_path), "sha256": engine.onnx_sha256, "built_sha256": engine.built_onnx_sha256},
        "backend": {"name": engine.backend, "version": engine.backend_version},
        "target_compute_capabilities": target_compute_capabilities(engine.backend, engine.options.compute_capabilities),
        "precision": engine.precision,
        "precision_plan": plan.to_json() if plan is not None else None,
        "build_options": engine.options.to_json(),
        "profiles": {k: [list(s) for s in v] for k, v in engine.profiles.items()},
        "io_tensors": [dataclasses.asdict(io) for io in engine.engine_layers.io_tensors],
        "layer_map": engine.layer_map.to_json(),
        "calibration_cache": None,
        "accuracy": dict(accuracy) if accuracy is not None else None,
        "timing": dict(timing) if timing is not None else None,
        "triton": None,
    }

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", suffix=".tmp", dir=output_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes 0700 directories; a bundle is meant to be shared
    try:
        shutil.copyfile(engine_path, staging / ENGINE_FILE)
        shutil.copyfile(engine.layers_path, staging / LAYERS_FILE)
        if calibration_cache is not None:
            cache = Path(calibration_cache)
            if not cache.is_file():
                raise WorkbenchError(
                    f"{cache}: no such calibration cache.", expected="the cache file written by calibration"
                )
            shutil.copyfile(cache, staging / CALIBRATION_FILE)
            manifest["calibration_cache"] = {
                "file": CALIBRATION_FILE,
                "sha256": sha256_file(cache),
                "source": str(cache),
            }
        if triton is not None:
            text = triton_config(manifest["io_tensors"], triton)
            model_dir = staging / "triton" / triton.model_name
            (model_dir / "1").mkdir(parents=True)
            shutil.copyfile(engine_path, model_dir / "1" / "model.plan")
            write_text_atomic(model_dir / "config.pbtxt", text)
            manifest["triton"] = {
                "repository": "triton",
                "model_name": triton.model_name,
                "config": f"triton/{triton.model_name}/config.pbtxt",
                "plan": f"triton/{triton.model_name}/1/model.plan",
                "validated_with": "inference.ModelConfig from tritonclient 2.73.0 (text_format parse)",
                "note": "Triton's TensorRT backend loads full-TensorRT engines of the same version; not loaded by a server here.",
            }
        write_json_atomic(staging / MANIFEST_FILE, manifest)
        if output_dir.exists():
            old = output_dir.with_name(f".{output_dir.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(output_dir, old)
            os.replace(staging, output_dir)
            shutil.rmtree(old)
        else:
            os.replace(staging, output_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return read_bundle(output_dir)


def read_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Open a bundle and check that its engine is the one the manifest describes."""
    path = Path(path)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise WorkbenchError(
            f"{path}: not a workbench bundle (no {MANIFEST_FILE}).",
            expected="a directory written by `workbench export`",
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise WorkbenchError(
            f"{manifest_path}: not valid JSON ({error}).", expected="the manifest written by `workbench export`"
        ) from error
    if manifest.get("format") != BUNDLE_FORMAT:
        raise WorkbenchError(f"{manifest_path}: format is {manifest.get('format')!r}.", expected=BUNDLE_FORMAT)
    engine_path = path / manifest["engine"]["file"]
    if not engine_path.is_file():
        raise WorkbenchError(
            f"{path}: the engine file {manifest['engine']['file']} is missing.", expected="a complete bundle"
        )
    digest = sha256_file(engine_path)
    if digest != manifest["engine"]["sha256"]:
        raise WorkbenchError(
            f"{engine_path}: sha256 {digest[:12]}… does not match the manifest ({manifest['engine']['sha256'][:12]}…).",
            expected="the engine the bundle was exported with",
            hint="the file was modified or truncated",
        )
    return Bundle(path, manifest, engine_path)


@dataclass
class LoadedEngine:
    bundle: Bundle
    runner: Any = field(repr=False)


def check_engine_compatible(bundle: Bundle, *, gpu: Any = None, backend: Any = None) -> None:
    """Raise if this machine's TensorRT version or GPU compute capability differs from what the engine needs."""
    from workbench.engine.backend import detect_gpu, get_backend

    wanted = bundle.manifest["backend"]
    backend = backend or get_backend(wanted["name"])
    if backend.name != wanted["name"] or backend.version != wanted["version"]:
        raise WorkbenchError(
            f"{bundle.path}: the engine was built by {wanted['name']} {wanted['version']}, but this machine has "
            f"{backend.name} {backend.version}; TensorRT engines only load in the exact version that built them.",
            expected=f"{wanted['name']}=={wanted['version']}",
            hint="rebuild the engine here from the ONNX (`workbench build`).",
        )
    gpu = gpu or detect_gpu()
    targets = bundle.manifest.get("target_compute_capabilities", [])
    if not gpu.present:
        raise EngineCannotRun(
            f"{bundle.path}: no NVIDIA GPU on this machine; the engine targets compute capability "
            f"{', '.join(targets)}.",
            expected="a machine with a matching GPU",
        )
    have = ".".join(str(part) for part in gpu.compute_capability or ())
    if "build-gpu" not in targets and have not in targets:
        raise WorkbenchError(
            f"{bundle.path}: the engine targets compute capability {', '.join(targets)}, but this GPU ({gpu.name}) is {have}.",
            expected=f"a GPU of compute capability {' or '.join(targets)}",
            hint="rebuild for this GPU (`workbench build --compute-capability`).",
        )


def load_engine(bundle: str | os.PathLike[str] | Bundle, *, gpu: Any = None) -> LoadedEngine:
    """Deserialize a bundle's engine after checking backend version and compute capability (refuses mismatches)."""
    from workbench.engine.backend import EngineRunner, get_backend

    bundle = bundle if isinstance(bundle, Bundle) else read_bundle(bundle)
    backend = get_backend(bundle.manifest["backend"]["name"])
    check_engine_compatible(bundle, gpu=gpu, backend=backend)
    return LoadedEngine(bundle, EngineRunner(backend, bundle.engine_path.read_bytes()))
