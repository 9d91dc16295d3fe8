"""Stage 3: ONNX (+ precision plan) → TensorRT engine artifact, with the builder's per-layer records.

Works on a CPU-only machine with TensorRT-RTX (ahead-of-time build). The engine and its ``.layers.json``
are written atomically; a failed build leaves any earlier files untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench._io import sha256_bytes, sha256_file, write_bytes_atomic, write_json_atomic, write_text_atomic
from workbench.artifact import NOT_SERIALIZED, Artifact, JsonObject
from workbench.engine.backend import (
    RTX_RUNTIME_COMPUTE_CAPABILITIES,
    Backend,
    NetworkBuildRequest,
    build_serialized,
    get_backend,
    inspect_engine_json,
    supports_timing_cache,
)
from workbench.engine.built_onnx import built_onnx, precision_rewrite
from workbench.engine.layermap import LayerMap
from workbench.engine.precision_check import PrecisionCheck, check_precision
from workbench.engine.records import (
    EngineLayers,
    engine_layers_from_document,
    find_rtx_layers_message,
    layers_document,
    parse_rtx_layers_message,
    read_inspector_json,
    read_layers_document,
    summarize,
)
from workbench.engine.targets import FP8_GPUS, fp8_incapable, fp8_support_line, rtx_fp8_targets
from workbench.errors import WorkbenchError
from workbench.log import get_logger
from workbench.model import OnnxModel, load_onnx, shape_template
from workbench.model.graph import node_names_to_fix
from workbench.precision import PRECISIONS, Precision, PrecisionPlan
from workbench.precision.autocast import apply_precision_plan
from workbench.precision.qdq_rules import qdq_formats
from workbench.precision.recipe import QuantizationRecipe, read_recipe
from workbench.progress import ProgressEvent, ProgressFn

if TYPE_CHECKING:
    import onnx

Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]
# (kind: start|step|finish, phase, parent phase or "", step, total) -> False cancels the build
LOG = get_logger(__name__)
ProgressCallback = ProgressFn  # the one progress type: builder phases arrive as ProgressEvent(task='build')


@dataclass(frozen=True)
class BuildOptions(Artifact):
    """How to build. ``shapes`` gives (min, opt, max) per dynamic input; unspecified dynamic batch dims become 1.

    ``compute_capabilities`` (TensorRT-RTX only): the GPUs the engine is compiled for, e.g. ``("SM89",)``; an FP8
    Q/DQ model needs targets of 8.9+ and, when none are given, is built for every FP8-capable RTX target."""

    shapes: dict[str, ShapeRange] = field(default_factory=dict)
    precision: Precision = "fp32"
    plan: PrecisionPlan | None = None
    workspace_bytes: int | None = None
    optimization_level: int = 3
    compute_capabilities: tuple[str, ...] = ()
    timing_cache_path: str | None = None
    # fail the build (nothing written) when any node runs at another precision than requested (PrecisionCheck)
    strict_precision: bool = False
    # how this build reports progress and which backend runs it: run-time choices, not part of the build's record
    progress: bool = field(default=True, metadata=NOT_SERIALIZED)
    progress_callback: ProgressCallback | None = field(default=None, metadata=NOT_SERIALIZED)
    backend: str | None = field(default=None, metadata=NOT_SERIALIZED)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise WorkbenchError(
                f"unknown build precision {self.precision!r}.",
                expected="fp32, fp16, int8 or fp8 (int8 and fp8 need a Q/DQ model from `workbench calibrate`)",
            )
        if not 0 <= int(self.optimization_level) <= 5:
            raise WorkbenchError(
                f"builder optimization level {self.optimization_level} is out of range.", expected="0..5"
            )
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise WorkbenchError(
                f"memory-pool limit {self.workspace_bytes} bytes is not positive.", expected="a positive size"
            )
        shapes = {name: _check_range(name, rng) for name, rng in dict(self.shapes).items()}
        object.__setattr__(self, "shapes", shapes)

    @property
    def effective_plan(self) -> PrecisionPlan:
        """The plan the build realises: the explicit one, or the precision applied to every node."""
        return self.plan or PrecisionPlan(default=self.precision)


_MAX_DIM = 2**31 - 1  # TensorRT dimensions are int64, real ones far smaller; keeps overflow out of the builder


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
    if any(d > _MAX_DIM for d in high + opt + low):
        raise WorkbenchError(
            f"input {name!r}: shape range {low}/{opt}/{high} has a dimension above {_MAX_DIM}.",
            expected=f"dimensions in 1..{_MAX_DIM}",
        )
    if not all(a <= b <= c and a > 0 for a, b, c in zip(low, opt, high)):
        raise WorkbenchError(
            f"input {name!r}: shapes {low}/{opt}/{high} are not ordered min <= opt <= max with positive dims.",
            expected="min <= opt <= max per dimension, all > 0",
        )
    return (low, opt, high)


@dataclass(frozen=True)
class EngineArtifact(Artifact):
    """A built engine on disk, everything known about how it was built, and its layer map (ONNX nodes <-> layers).

    The layer map is made at build time from the build's own layer records (TensorRT-RTX: the verbose build log;
    full TensorRT: the engine inspector) and the ONNX that was built, and saved in the ``.layers.json`` beside the
    engine; :meth:`load` reads both back and checks that they belong together.
    """

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
    precision: str  # the plan's label, e.g. fp16 or int8+fp32
    target_compute_capabilities: tuple[str, ...]
    profiles: dict[str, ShapeRange]
    options: BuildOptions
    onnx_node_count: int
    layer_records_from: str  # which TensorRT output the layer records were read from
    engine_layers: EngineLayers = field(metadata=NOT_SERIALIZED, repr=False)
    layer_map: LayerMap = field(metadata=NOT_SERIALIZED, repr=False)
    warnings: tuple[str, ...] = ()
    precision_check: PrecisionCheck | None = None  # requested vs actual precision per ONNX node
    quantization: QuantizationRecipe | None = None  # how the Q/DQ model was made from its ranges (its metadata)

    @property
    def layer_count(self) -> int:
        return len(self.engine_layers.layers)

    @property
    def label(self) -> str:
        return self.engine_path.stem

    def summary(self) -> dict[str, Any]:
        return summarize(self.engine_layers)

    def to_json(self) -> JsonObject:
        return super().to_json() | {"engine_layer_count": self.layer_count}

    @classmethod
    def from_json(cls, data: object) -> EngineArtifact:
        """An artifact's JSON names its files; the artifact is read back from them (and checked) by :meth:`load`."""
        if not isinstance(data, Mapping) or not isinstance(data.get("engine_path"), str):
            raise WorkbenchError("engine artifact JSON has no 'engine_path'.", expected="the JSON of an EngineArtifact")
        return cls.load(data["engine_path"], data.get("layers_path"))

    def built_onnx(self) -> onnx.ModelProto | None:
        """The ONNX this engine was built from (see :func:`built_onnx`); None when it cannot be had."""
        try:
            return built_onnx(read_layers_document(self.layers_path))
        except (WorkbenchError, OSError):
            return None

    @classmethod
    def load(
        cls, engine_path: str | os.PathLike[str], layers_path: str | os.PathLike[str] | None = None
    ) -> EngineArtifact:
        """The artifact of an engine written by :func:`engine_from_onnx`, from the ``.layers.json`` beside it.

        Refuses an engine whose bytes are not the ones its layer records were written for.
        """
        engine_path = Path(engine_path)
        layers_path = Path(layers_path) if layers_path is not None else layers_path_for(engine_path)
        if not engine_path.is_file():
            raise WorkbenchError(
                f"{engine_path}: no such engine file.", expected="an engine written by `workbench build`"
            )
        document = read_layers_document(layers_path)
        build = document.get("build")
        if not isinstance(build, Mapping) or not build.get("backend") or not build.get("backend_version"):
            raise WorkbenchError(
                f"{layers_path}: does not say which TensorRT built the engine.",
                expected="a 'build' section with backend and backend_version (written by `workbench build`)",
            )
        engine_sha = sha256_file(engine_path)
        recorded = build.get("engine_sha256")
        if recorded and recorded != engine_sha:
            raise WorkbenchError(
                f"{layers_path}: describes an engine with sha256 {str(recorded)[:12]}…, but {engine_path} has "
                f"{engine_sha[:12]}….",
                expected="the .layers.json written together with this engine",
                hint="rebuild, or pass the layer records of this engine",
            )
        try:
            engine_layers = engine_layers_from_document(document)
            options = BuildOptions.from_json(build.get("options") or {})
            recorded_recipe = build.get("quantization")
            quantization = (
                QuantizationRecipe.from_json(recorded_recipe) if isinstance(recorded_recipe, Mapping) else None
            )
        except (TypeError, ValueError, KeyError, AttributeError, WorkbenchError) as error:
            raise WorkbenchError(
                f"{layers_path}: the build section cannot be read ({error}).",
                expected="the .layers.json written by `workbench build`",
            ) from error
        return cls(
            engine_path=engine_path,
            layers_path=layers_path,
            build_log_path=engine_path.with_name(engine_path.stem + ".build.log"),
            onnx_path=Path(str(build.get("onnx", ""))),
            onnx_sha256=str(build.get("onnx_sha256", "")),
            built_onnx_sha256=str(build.get("built_onnx_sha256", "")),
            engine_sha256=engine_sha,
            engine_bytes=engine_path.stat().st_size,
            build_seconds=float(build.get("build_seconds", math.nan)),
            backend=str(build["backend"]),
            backend_version=str(build["backend_version"]),
            precision=str(build.get("precision", options.effective_plan.label)),
            target_compute_capabilities=tuple(
                build.get("target_compute_capabilities", build.get("compute_capabilities", ()))
            ),
            profiles={name: _check_range(name, rng) for name, rng in (build.get("profiles") or {}).items()},
            options=options,
            onnx_node_count=len(document.get("onnx_nodes", ())),
            layer_records_from=str(build.get("layer_records_from", engine_layers.source_format)),
            warnings=tuple(build.get("warnings", ())),
            precision_check=(
                PrecisionCheck.from_json(document["precision_check"])
                if isinstance(document.get("precision_check"), Mapping)
                else None
            ),
            quantization=quantization,
            engine_layers=engine_layers,
            layer_map=LayerMap.from_document(document, label=engine_path.stem),
        )


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
    unsized = [
        spec
        for spec in model.inputs
        if spec.name not in shapes and any(not (isinstance(d, int) and d > 0) for d in spec.shape[1:])
    ]
    if len(unsized) > 1:  # every input that needs --shapes named at once, not one refusal per build
        raise WorkbenchError(
            f"inputs {[spec.name for spec in unsized]} have dynamic non-batch dimensions and no shapes were given "
            f"for them ({'; '.join(f'{spec.name}: {list(spec.shape)}' for spec in unsized)}).",
            expected=" ".join(f"--shapes {spec.name}:MIN,OPT,MAX" for spec in unsized)
            + " with shapes like "
            + ", ".join(shape_template(spec.shape) for spec in unsized),
        )
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
                    expected=f"--shapes {spec.name}:MIN,OPT,MAX with shapes like {shape_template(spec.shape)}",
                )
        profiles[spec.name] = (tuple(dims), tuple(dims), tuple(dims))
    return profiles


def _prepare_onnx(model: OnnxModel, options: BuildOptions, workdir: Path) -> tuple[Path, str, list[str]]:
    """The ONNX file the builder parses (the model itself, or its rewrite for the precision plan and for node names
    the layer records cannot carry), its sha256, and a note when node names were rewritten."""
    proto = precision_rewrite(model, options.effective_plan)
    if proto is None:
        return model.path, model.sha256, []
    bad = node_names_to_fix(model.proto)
    notes = (
        [
            f"{len(bad)} ONNX node name(s) were duplicate or not printable and were renamed for the build "
            f"(repeats get ~2, ~3, ...; control characters become escapes; the layer map uses the new names), "
            f"e.g. {bad[0]!r}"
        ]
        if bad
        else []
    )
    out = workdir / (model.path.stem + f".{options.effective_plan.label}.onnx")
    data = proto.SerializeToString()
    out.write_bytes(data)
    return out, sha256_bytes(data), notes


class _TqdmProgress:
    """Show TensorRT's top-level builder phases as tqdm bars (nested phases are too many and too short to show)."""

    def __init__(self) -> None:
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self._bars: dict[str, Any] = {}

    def __call__(self, event: ProgressEvent) -> bool:
        phase = event.message
        if event.kind == "start" and event.total and not event.parent:
            self._bars[phase] = self._tqdm(total=event.total, desc=phase[:40], leave=False, unit="step")
        elif event.kind == "step" and phase in self._bars:
            bar = self._bars[phase]
            bar.n = event.index + 1
            bar.refresh()
        elif event.kind == "finish" and phase in self._bars:
            self._bars.pop(phase).close()
        return True


def _unbuildable_quantization(model: OnnxModel) -> str | None:
    """Why the parser will refuse ``model``'s quantization, in our words, or None: ONNX Runtime's integer operators,
    or a Q/DQ pair with a non-zero zero point or a scale that is not > 0 (``workbench.model.graph.parser_refused_qdq``;
    the engine cannot call ``clean.qdq_lint``, a package above it in the layering ``tests/test_architecture.py`` checks)."""
    from workbench.model.graph import ort_operator_quantization, parser_refused_qdq

    problem = ort_operator_quantization(model.proto)
    if problem is not None:
        return problem
    refused = parser_refused_qdq(model.proto)
    if not refused:
        return None
    node, why = refused[0]
    origin = " (ONNX Runtime's QDQ default is asymmetric uint8 activations)" if "zero point" in why else ""
    return f"{len(refused)} Q/DQ node(s) break TensorRT's quantization rules, e.g. {node!r}: {why}{origin}"


def engine_from_onnx(
    model: OnnxModel | str | os.PathLike[str],
    engine_path: str | os.PathLike[str],
    options: BuildOptions | None = None,
) -> EngineArtifact:
    """Build a strongly typed engine from ``model`` and write ``engine_path`` and its ``.layers.json``."""
    options = options or BuildOptions()
    if not isinstance(model, OnnxModel):
        model = load_onnx(model)
    problem = _unbuildable_quantization(model)  # said before the parser's "Assertion failed: ..."
    if problem is not None:
        raise WorkbenchError(
            f"{model.path}: {problem}.",
            expected="the FP32 model (then `workbench calibrate`), or a Q/DQ model with symmetric INT8 (zero point 0, "
            "scales > 0)",
        )
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

    quantization, quantization_note = _quantization_of(model)  # read before the build: a bad record costs no build
    with tempfile.TemporaryDirectory(prefix="workbench-build-") as tmp:
        onnx_for_build, built_sha, name_notes = _prepare_onnx(model, options, Path(tmp))
        built_model = model if onnx_for_build == model.path else load_onnx(onnx_for_build, check=False)
        built_proto = built_model.proto
        formats = qdq_formats(built_proto)
        options, target_note = _targets_for_formats(options, backend, formats)
        rewritten = Path(onnx_for_build) != Path(model.path)
        request = NetworkBuildRequest(
            onnx_path=str(onnx_for_build),
            source=f"{model.path} (as rewritten for the {options.effective_plan.label} build)" if rewritten else "",
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

    engine_layers, records_from = _layer_records(backend, messages, output.serialized_engine)
    engine_sha = sha256_bytes(output.serialized_engine)
    notes = name_notes + [msg for sev, msg in messages if sev == 2] + ([target_note] if target_note else [])
    notes += [quantization_note] if quantization_note else []
    if options.timing_cache_path and not output.timing_cache:
        notes.append(f"timing cache not saved: {backend.name} {backend.version} does not support timing caches (no-op)")
    targets = options.compute_capabilities or (("runtime-selected (RTX JIT)",) if backend.is_rtx else ("build GPU",))
    layers_path = layers_path_for(engine_path)
    log_path = engine_path.with_name(engine_path.stem + ".build.log")
    layer_map = LayerMap.from_engine_layers(engine_layers, onnx_proto=built_proto, label=engine_path.stem)
    check = check_precision(
        layer_map,
        built_proto,
        options.effective_plan,
        backend=f"{backend.name} {backend.version}",
        kept_fp32=lambda: apply_precision_plan(model, options.effective_plan).kept_fp32,
    )
    if options.strict_precision and not check.ok:
        raise WorkbenchError(
            f"--strict-precision: {len(check.mismatches)} ONNX node(s) run at another precision than requested: "
            + "; ".join(check.lines(5))
            + ("; ..." if len(check.mismatches) > 5 else "")
            + ". Nothing was written.",
            expected="an engine that runs every node as the plan and the Q/DQ graph ask",
            hint="change the plan for these nodes, or build without --strict-precision to keep the engine",
        )
    document = layers_document(engine_layers, built_proto)
    document["precision_check"] = check.to_json()
    document["build"] = {
        "backend": backend.name,
        "backend_version": backend.version,
        "onnx": str(model.path),
        "onnx_sha256": model.sha256,
        "built_onnx_sha256": built_sha,
        "engine_sha256": engine_sha,  # pairs these records with exactly one engine file
        "engine_bytes": len(output.serialized_engine),
        "build_seconds": round(seconds, 3),
        "precision": options.effective_plan.label,
        "compute_capabilities": list(options.compute_capabilities),
        "target_compute_capabilities": list(targets),
        "quantized_formats": sorted(formats),
        "profiles": {k: [list(s) for s in v] for k, v in profiles.items()},
        "options": options.to_json(),
        "layer_records_from": records_from,
        "warnings": notes,
        "quantization": quantization.to_json() if quantization is not None else None,
    }
    write_bytes_atomic(engine_path, output.serialized_engine)
    write_json_atomic(layers_path, document)
    write_text_atomic(log_path, "\n".join(f"[{_severity(sev)}] {msg}" for sev, msg in messages) + "\n")
    if options.timing_cache_path and output.timing_cache:
        write_bytes_atomic(options.timing_cache_path, output.timing_cache)
    LOG.info(
        "built %s: %d bytes, %d layers in %.1f s (%s %s, %s)",
        engine_path,
        len(output.serialized_engine),
        len(engine_layers.layers),
        seconds,
        backend.name,
        backend.version,
        options.effective_plan.label,
    )

    return EngineArtifact(
        engine_path=engine_path,
        layers_path=layers_path,
        build_log_path=log_path,
        onnx_path=model.path,
        onnx_sha256=model.sha256,
        built_onnx_sha256=built_sha,
        engine_sha256=engine_sha,
        engine_bytes=len(output.serialized_engine),
        build_seconds=seconds,
        backend=backend.name,
        backend_version=backend.version,
        precision=options.effective_plan.label,
        target_compute_capabilities=tuple(targets),
        profiles=profiles,
        options=options,
        onnx_node_count=len(built_proto.graph.node),
        layer_records_from=records_from,
        engine_layers=engine_layers,
        layer_map=layer_map,
        warnings=tuple(notes),
        precision_check=check,
        quantization=quantization,
    )


def _quantization_of(model: OnnxModel) -> tuple[QuantizationRecipe | None, str]:
    """The model's quantization record (:mod:`workbench.precision.recipe`); an unreadable one is reported, not fatal:
    it only describes the model, which builds the same without it."""
    try:
        return read_recipe(model.proto, what=str(model.path)), ""
    except WorkbenchError as error:
        return None, f"quantization record ignored: {error.problem}"


def _targets_for_formats(options: BuildOptions, backend: Backend, formats: set[str]) -> tuple[BuildOptions, str]:
    """Build options whose targets can run the model's Q/DQ formats, and a note when they were chosen here.

    FP8 Q/DQ compiles only for compute capability 8.9+: with TensorRT-RTX and no target given, every FP8-capable RTX
    target is chosen (RTX would otherwise drop the older targets itself and say so only in its verbose log); a
    requested older target is refused before building. Full TensorRT builds for its own GPU, which must be 8.9+."""
    if "fp8" not in formats:
        return options, ""
    if backend.is_rtx:
        if not options.compute_capabilities:
            targets = rtx_fp8_targets(RTX_RUNTIME_COMPUTE_CAPABILITIES)
            note = f"FP8 Q/DQ model: built for the FP8-capable targets {', '.join(targets)} ({FP8_GPUS})"
            return replace(options, compute_capabilities=targets), note
        incapable = fp8_incapable(options.compute_capabilities)
        if incapable:
            raise WorkbenchError(
                f"the model has FP8 Q/DQ nodes, but target(s) {', '.join(incapable)} have no FP8 tensor cores.",
                expected=f"--compute-capability SM89 or SM120 ({FP8_GPUS})",
                hint="or calibrate with --format int8 for older GPUs",
            )
        return options, ""
    from workbench.engine.backend import detect_gpu

    gpu = detect_gpu()
    capable, line = fp8_support_line(gpu.name, gpu.compute_capability)
    if gpu.present and not capable:
        raise WorkbenchError(
            f"the model has FP8 Q/DQ nodes, but full TensorRT builds for this GPU: {line}.",
            expected=f"a GPU of {FP8_GPUS}",
            hint="or calibrate with --format int8 for this GPU",
        )
    return options, ""


def _layer_records(backend: Backend, messages: list[tuple[int, str]], serialized: bytes) -> tuple[EngineLayers, str]:
    """The built engine's per-layer records and where they came from.

    TensorRT-RTX logs them during the build (its ``Layers:`` message; there is no inspector before deserialization,
    and RTX builds on machines without a GPU). Full TensorRT has no such message: its records come from the engine
    inspector, which needs the engine deserialized on the GPU that built it (unverified on our machines).
    """
    if backend.is_rtx:
        message = find_rtx_layers_message(msg for _, msg in messages)
        if message is None:
            raise WorkbenchError(
                f"{backend.name} {backend.version} built the engine but logged no per-layer records.",
                expected="a 'Layers:' message, which TensorRT-RTX logs with DETAILED profiling verbosity and a VERBOSE logger",
            )
        return parse_rtx_layers_message(message), "tensorrt-rtx build log ('Layers:' message)"
    return read_inspector_json(json.loads(inspect_engine_json(backend, serialized))), "engine inspector (JSON)"


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
        if name in result:
            raise WorkbenchError(
                f"--shapes gives input {name!r} twice ({value!r} and an earlier one).",
                expected="one --shapes per input",
            )
        result[name] = _check_range(name, dims * 3 if len(dims) == 1 else dims)
    return result


def model_and_shapes(spec: str) -> tuple[OnnxModel, dict[str, ShapeRange]]:
    """A MODEL argument: an ONNX path (with the optimization profile it carries, e.g. a Q/DQ model from calibration),
    or a zoo name with its optimization profiles."""
    from workbench.model.profile import read_profile_metadata
    from workbench.zoo import resolve_model

    path, entry = resolve_model(spec)
    if entry is None:
        model = load_onnx(path)
        return model, read_profile_metadata(model.proto, str(path))[0]
    return entry.load(), dict(entry.input_profiles())


def engine_for_model(
    spec: str,
    precision: Precision,
    out_dir: str | os.PathLike[str],
    *,
    progress_callback: ProgressCallback | None = None,
) -> EngineArtifact:
    """Build ``spec`` (a zoo name, with its optimization profiles, or an ONNX path) at ``precision`` into
    ``out_dir/NAME.PRECISION.engine``: the one way panels, the explorer and tests build a model by name."""
    model, shapes = model_and_shapes(spec)
    options = BuildOptions(
        shapes=shapes,
        precision=precision,
        progress=progress_callback is not None,
        progress_callback=progress_callback,
    )
    name = Path(spec).stem if spec.endswith(".onnx") else spec
    return engine_from_onnx(model, Path(out_dir) / f"{name}.{precision}.engine", options)
