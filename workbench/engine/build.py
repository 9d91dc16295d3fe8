"""Stage 3: ONNX (+ precision plan) → TensorRT engine artifact, with the builder's per-layer records.

Works on a CPU-only machine with TensorRT-RTX (ahead-of-time build). The engine and its ``.layers.json``
are written atomically; a failed build leaves any earlier files untouched.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench._io import sha256_bytes, write_bytes_atomic, write_json_atomic, write_text_atomic
from workbench.engine.records import (
    EngineLayers,
    find_rtx_layers_message,
    layers_document,
    parse_rtx_layers_message,
    summarize,
)
from workbench.errors import WorkbenchError
from workbench.model import OnnxModel, load_onnx
from workbench.precision import PrecisionPlan

Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]
# (kind: start|step|finish, phase, parent phase or "", step, total) -> False cancels the build
ProgressCallback = Callable[[str, str, str, int, int], bool]


@dataclass
class BuildOptions:
    """How to build. ``shapes`` gives (min, opt, max) per dynamic input; unspecified dynamic batch dims become 1."""

    shapes: dict[str, ShapeRange] = field(default_factory=dict)
    precision: str = "fp32"
    plan: PrecisionPlan | None = None
    workspace_bytes: int | None = None
    optimization_level: int = 3
    compute_capabilities: tuple[str, ...] = ()
    timing_cache_path: str | None = None
    progress: bool = True
    progress_callback: ProgressCallback | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("fp32", "fp16", "int8"):
            raise WorkbenchError(
                f"unknown build precision {self.precision!r}.", expected="fp32, fp16 or int8 (int8 needs a Q/DQ model)"
            )
        if not 0 <= int(self.optimization_level) <= 5:
            raise WorkbenchError(
                f"builder optimization level {self.optimization_level} is out of range.", expected="0..5"
            )
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise WorkbenchError(
                f"memory-pool limit {self.workspace_bytes} bytes is not positive.", expected="a positive size"
            )
        self.shapes = {name: _check_range(name, rng) for name, rng in dict(self.shapes).items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "shapes": {k: [list(s) for s in v] for k, v in self.shapes.items()},
            "precision": self.precision,
            "plan": self.plan.to_json() if self.plan else None,
            "workspace_bytes": self.workspace_bytes,
            "optimization_level": self.optimization_level,
            "compute_capabilities": list(self.compute_capabilities),
            "timing_cache_path": self.timing_cache_path,
        }


def _check_range(name: str, rng: Any) -> ShapeRange:
    try:
        low, opt, high = (tuple(int(d) for d in shape) for shape in rng)
    except (TypeError, ValueError) as error:
        raise WorkbenchError(
            f"input {name!r}: shape range {rng!r} is not (min, opt, max).", expected="three shapes of equal rank"
        ) from error
    if not len(low) == len(opt) == len(high):
        raise WorkbenchError(
            f"input {name!r}: min/opt/max shapes {low}/{opt}/{high} differ in rank.",
            expected="three shapes of equal rank",
        )
    if not all(a <= b <= c and a > 0 for a, b, c in zip(low, opt, high)):
        raise WorkbenchError(
            f"input {name!r}: shapes {low}/{opt}/{high} are not ordered min <= opt <= max with positive dims.",
            expected="min <= opt <= max per dimension, all > 0",
        )
    return (low, opt, high)


@dataclass
class EngineArtifact:
    """A built engine on disk and everything known about how it was built."""

    engine_path: Path
    layers_path: Path
    build_log_path: Path
    onnx_path: Path
    onnx_sha256: str
    built_onnx_sha256: str
    engine_sha256: str
    engine_bytes: int
    build_seconds: float
    backend: str
    backend_version: str
    target_compute_capabilities: tuple[str, ...]
    profiles: dict[str, ShapeRange]
    options: BuildOptions
    engine_layers: EngineLayers
    onnx_node_count: int
    warnings: list[str] = field(default_factory=list)

    @property
    def layer_count(self) -> int:
        return len(self.engine_layers.layers)

    def summary(self) -> dict[str, Any]:
        return summarize(self.engine_layers)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine_path": str(self.engine_path),
            "layers_path": str(self.layers_path),
            "build_log_path": str(self.build_log_path),
            "onnx_path": str(self.onnx_path),
            "onnx_sha256": self.onnx_sha256,
            "built_onnx_sha256": self.built_onnx_sha256,
            "engine_sha256": self.engine_sha256,
            "engine_bytes": self.engine_bytes,
            "build_seconds": round(self.build_seconds, 3),
            "backend": self.backend,
            "backend_version": self.backend_version,
            "target_compute_capabilities": list(self.target_compute_capabilities),
            "profiles": {k: [list(s) for s in v] for k, v in self.profiles.items()},
            "options": self.options.to_json(),
            "onnx_node_count": self.onnx_node_count,
            "engine_layer_count": self.layer_count,
            "warnings": self.warnings,
        }


def layers_path_for(engine_path: str | os.PathLike[str]) -> Path:
    """``MODEL.engine`` → ``MODEL.layers.json`` (any other suffix is replaced the same way)."""
    path = Path(engine_path)
    return path.with_name(path.stem + ".layers.json")


def profiles_for(model: OnnxModel, shapes: Mapping[str, ShapeRange]) -> dict[str, ShapeRange]:
    """One optimization profile: given ranges for named inputs; a dynamic leading (batch) dim defaults to 1."""
    unknown = set(shapes) - {spec.name for spec in model.inputs}
    if unknown:
        raise WorkbenchError(
            f"shapes given for inputs the model does not have: {', '.join(sorted(unknown))}.",
            expected="one of " + ", ".join(spec.name for spec in model.inputs),
        )
    profiles: dict[str, ShapeRange] = {}
    for spec in model.inputs:
        if spec.name in shapes:
            low, opt, high = shapes[spec.name]
            if len(low) != len(spec.shape):
                raise WorkbenchError(
                    f"input {spec.name!r} has rank {len(spec.shape)} but the shapes given have rank {len(low)}.",
                    expected=f"shapes like {list(spec.shape)}",
                )
            for axis, dim in enumerate(spec.shape):
                if isinstance(dim, int) and dim > 0 and not low[axis] == opt[axis] == high[axis] == dim:
                    raise WorkbenchError(
                        f"input {spec.name!r} axis {axis} is fixed at {dim} in the model, but shapes "
                        f"{low[axis]}/{opt[axis]}/{high[axis]} were given.",
                        expected=f"{dim}",
                    )
            profiles[spec.name] = (low, opt, high)
            continue
        if not spec.is_dynamic:
            continue
        dims: list[int] = []
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim > 0:
                dims.append(dim)
            elif axis == 0:
                dims.append(1)
            else:
                raise WorkbenchError(
                    f"input {spec.name!r} has a dynamic dimension {dim!r} at axis {axis} and no shape was given for it.",
                    expected=f"--shapes {spec.name}:MIN,OPT,MAX with shapes like "
                    + "x".join(str(d) if isinstance(d, int) and d > 0 else "N" for d in spec.shape),
                )
        profiles[spec.name] = (tuple(dims), tuple(dims), tuple(dims))
    return profiles


def _prepare_onnx(model: OnnxModel, options: BuildOptions, workdir: Path) -> tuple[Path, str]:
    """The ONNX file the builder parses: the model itself, or its rewrite for the precision plan.

    TensorRT 10/11 are strongly typed, so precision lives in the graph: the AutoCast rewrite casts FP16 nodes and
    refuses INT8 on a graph without Q/DQ nodes (workbench.precision.autocast owns both rules).
    """
    from workbench.precision.autocast import apply_precision_plan

    plan = options.plan or PrecisionPlan(default=options.precision)  # type: ignore[arg-type]
    if plan.default == "fp32" and not plan.overrides:
        return model.path, model.sha256
    proto = apply_precision_plan(model, plan).proto
    out = workdir / (model.path.stem + f".{plan.label}.onnx")
    data = proto.SerializeToString()
    out.write_bytes(data)
    return out, sha256_bytes(data)


class _TqdmProgress:
    """Show TensorRT's top-level builder phases as tqdm bars (nested phases are too many and too short to show)."""

    def __init__(self) -> None:
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self._bars: dict[str, Any] = {}

    def __call__(self, kind: str, phase: str, parent: str, step: int, total: int) -> bool:
        if kind == "start" and total > 0 and not parent:
            self._bars[phase] = self._tqdm(total=total, desc=phase[:40], leave=False, unit="step")
        elif kind == "step" and phase in self._bars:
            bar = self._bars[phase]
            bar.n = step + 1
            bar.refresh()
        elif kind == "finish" and phase in self._bars:
            self._bars.pop(phase).close()
        return True


def engine_from_onnx(
    model: OnnxModel | str | os.PathLike[str],
    engine_path: str | os.PathLike[str],
    options: BuildOptions | None = None,
) -> EngineArtifact:
    """Build a strongly typed engine from ``model`` and write ``engine_path`` and its ``.layers.json``."""
    from workbench.engine.backend import NetworkBuildRequest, build_serialized, get_backend, supports_timing_cache

    options = options or BuildOptions()
    if not isinstance(model, OnnxModel):
        model = load_onnx(model)
    backend = get_backend(options.backend)
    engine_path = Path(engine_path)
    if engine_path.exists() and engine_path.is_dir():
        raise WorkbenchError(f"{engine_path}: is a directory.", expected="an engine file path such as model.engine")
    profiles = profiles_for(model, options.shapes)

    messages: list[tuple[int, str]] = []
    timing_cache = None
    if options.timing_cache_path and supports_timing_cache(backend) and Path(options.timing_cache_path).is_file():
        timing_cache = Path(options.timing_cache_path).read_bytes()

    progress: ProgressCallback | None = options.progress_callback
    if progress is None and options.progress:
        progress = _TqdmProgress()

    with tempfile.TemporaryDirectory(prefix="workbench-build-") as tmp:
        onnx_for_build, built_sha = _prepare_onnx(model, options, Path(tmp))
        request = NetworkBuildRequest(
            onnx_path=str(onnx_for_build),
            profiles=[profiles] if profiles else [],
            workspace_bytes=options.workspace_bytes,
            optimization_level=options.optimization_level,
            compute_capabilities=options.compute_capabilities,
            timing_cache=timing_cache,
        )
        started = time.perf_counter()
        try:
            output = build_serialized(backend, request, lambda sev, msg: messages.append((sev, msg)), progress)
        except WorkbenchError as error:
            errors = [msg for sev, msg in messages if sev <= 1]
            if errors and "see the errors" in str(error):
                raise WorkbenchError(
                    f"{error.problem} Builder errors: " + " | ".join(e[:300] for e in errors[:3]),
                    expected=error.expected,
                ) from error
            raise
        seconds = time.perf_counter() - started
        built_model = model if onnx_for_build == model.path else load_onnx(onnx_for_build, check=False)
        built_proto = built_model.proto

    layers_message = find_rtx_layers_message(msg for _, msg in messages)
    if layers_message is None:
        raise WorkbenchError(
            f"{backend.name} {backend.version} built the engine but logged no per-layer records.",
            expected="a backend that logs a 'Layers:' message with DETAILED profiling verbosity (TensorRT-RTX does); "
            "for full TensorRT use the engine inspector (workbench.engine.records readers)",
        )
    engine_layers = parse_rtx_layers_message(layers_message)

    layers_path = layers_path_for(engine_path)
    log_path = engine_path.with_name(engine_path.stem + ".build.log")
    write_bytes_atomic(engine_path, output.serialized_engine)
    document = layers_document(engine_layers, built_proto)
    document["build"] = {
        "backend": backend.name,
        "backend_version": backend.version,
        "onnx": str(model.path),
        "onnx_sha256": model.sha256,
        "built_onnx_sha256": built_sha,
        "precision": (options.plan.label if options.plan else options.precision),
        "compute_capabilities": list(options.compute_capabilities),
        "profiles": {k: [list(s) for s in v] for k, v in profiles.items()},
        "options": options.to_json(),
    }
    write_json_atomic(layers_path, document)
    write_text_atomic(log_path, "\n".join(f"[{_severity(sev)}] {msg}" for sev, msg in messages) + "\n")
    notes = [msg for sev, msg in messages if sev == 2]
    if options.timing_cache_path and output.timing_cache:
        write_bytes_atomic(options.timing_cache_path, output.timing_cache)
    elif options.timing_cache_path:
        notes.append(f"timing cache not saved: {backend.name} {backend.version} does not support timing caches (no-op)")

    return EngineArtifact(
        engine_path=engine_path,
        layers_path=layers_path,
        build_log_path=log_path,
        onnx_path=model.path,
        onnx_sha256=model.sha256,
        built_onnx_sha256=built_sha,
        engine_sha256=sha256_bytes(output.serialized_engine),
        engine_bytes=len(output.serialized_engine),
        build_seconds=seconds,
        backend=backend.name,
        backend_version=backend.version,
        target_compute_capabilities=options.compute_capabilities
        or (("runtime-selected (RTX JIT)",) if backend.is_rtx else ("build GPU",)),
        profiles=profiles,
        options=options,
        engine_layers=engine_layers,
        onnx_node_count=len(built_proto.graph.node),
        warnings=notes,
    )


def _severity(sev: int) -> str:
    return {0: "F", 1: "E", 2: "W", 3: "I", 4: "V"}.get(sev, str(sev))


_SHAPE = re.compile(r"^\d+(x\d+)*$")


def parse_shapes_arg(values: Sequence[str]) -> dict[str, ShapeRange]:
    """``name:1x3x48x320`` (fixed) or ``name:1x3x48x320,4x3x48x320,8x3x48x320`` (min,opt,max)."""
    result: dict[str, ShapeRange] = {}
    for value in values:
        name, sep, spec = value.rpartition(":")
        shapes = spec.split(",")
        if not sep or not name or len(shapes) not in (1, 3) or not all(_SHAPE.match(s) for s in shapes):
            raise WorkbenchError(
                f"cannot read --shapes {value!r}.",
                expected="NAME:1x3x224x224 or NAME:MIN,OPT,MAX like x:1x3x48x320,4x3x48x320,8x3x48x320",
            )
        dims = [tuple(int(d) for d in s.split("x")) for s in shapes]
        result[name] = _check_range(name, dims * 3 if len(dims) == 1 else dims)
    return result
