"""Export: an engine bundle directory (engine + manifest.json + layer map [+ Triton model repository]).

The bundle is written into a temporary sibling directory and renamed into place, so a failed export never leaves
a half-written bundle. ``load_engine(bundle)`` refuses an engine whose backend version or compute capability does
not match the machine, before TensorRT gets a chance to fail obscurely.

The optional Triton model repository comes from :mod:`workbench.export.triton`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import hmac
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from workbench._io import (
    dumps_json,
    loads_json,
    place_new_directory,
    refuse_special_file,
    sha256_file,
    staging_directory,
    validate_outputs,
    write_text_atomic,
)
from workbench.artifact import Artifact, JsonObject
from workbench.engine import EngineArtifact, LayerMap
from workbench.engine.records import read_layers_document
from workbench.errors import EngineCannotRun, WorkbenchError
from workbench.export.triton import TritonOptions, triton_config
from workbench.precision import PrecisionPlan

if TYPE_CHECKING:
    from workbench.engine.backend import Backend, EngineRunner, GpuInfo

BUNDLE_FORMAT = "trt-workbench-bundle"
BUNDLE_VERSION = 2
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
    def from_json(cls, data: object) -> Bundle:
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


def _fp8_requirement(engine: EngineArtifact) -> JsonObject | None:
    """For an engine with FP8 layers: how many, and which GPUs can run it (compute capability 8.9+); else None."""
    from workbench.engine.targets import FP8_GPUS, FP8_MIN_COMPUTE_CAPABILITY

    layers = sum(1 for layer in engine.layer_map.layers if layer.precision == "fp8")
    if not layers:
        return None
    return {
        "layers": layers,
        "min_compute_capability": ".".join(map(str, FP8_MIN_COMPUTE_CAPABILITY)),
        "runs_on": FP8_GPUS,
    }


# --- export ------------------------------------------------------------------------------------------------

MANIFEST_HMAC_FILE = "manifest.json.hmac"
BUNDLE_KEY_ENV = "WORKBENCH_BUNDLE_KEY"
# serialized TensorRT engines start with a 4-byte magic: "vtrt" (TensorRT-RTX, seen here), "ftrt" (full TensorRT)
_ENGINE_MAGIC = re.compile(rb"^[a-z]trt")
_MIN_ENGINE_BYTES = 64


def check_plausible_engine(path: Path) -> None:
    """Refuse a file that cannot be a serialized TensorRT engine (empty, tiny, or without the engine magic)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(16)
    if size < _MIN_ENGINE_BYTES or not _ENGINE_MAGIC.match(head):
        raise WorkbenchError(
            f"{path}: {size} bytes that do not look like a serialized TensorRT engine (header {head[:4]!r}).",
            expected="an engine written by `workbench build` (it starts with 'vtrt' or 'ftrt')",
        )


def is_bundle_dir(path: str | os.PathLike[str]) -> bool:
    """True only for a folder that verifies as our sealed bundle right now (every file listed in its manifest, each
    unchanged, nothing else there), so ``--overwrite`` may replace it. Never for other folders, and never for a
    format-1 bundle (it lists no files, so what is ours in it cannot be told from what the user put there)."""
    try:
        check = verify_bundle(path, signature=False)
    except WorkbenchError:
        return False
    return check.ok and check.format_version >= 2


# caps on what a bundle walk visits: a bundle holds a handful of files, a few folders deep
MAX_BUNDLE_DEPTH = 32
MAX_BUNDLE_FILES = 10_000
MAX_BUNDLE_BYTES = 1 << 40
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
MAX_HMAC_BYTES = 1024


@dataclass(frozen=True)
class BundleTree:
    """What is in a bundle folder, walked iteratively without following any symbolic link."""

    files: tuple[str, ...]  # POSIX paths relative to the root of every entry that is not a folder (links included)
    problems: tuple[str, ...]  # a cap exceeded or a folder that could not be listed


def walk_bundle(root: str | os.PathLike[str]) -> BundleTree:
    """Every non-folder entry under ``root`` (files, symbolic links, FIFOs…), iteratively (no recursion limit), with
    caps on depth (:data:`MAX_BUNDLE_DEPTH`), entries (:data:`MAX_BUNDLE_FILES`) and bytes (:data:`MAX_BUNDLE_BYTES`);
    a cap exceeded stops the walk with a problem instead of reading on."""
    files: list[str] = []
    total = 0
    stack: list[tuple[str, str, int]] = [(os.fspath(root), "", 0)]
    while stack:
        folder, prefix, depth = stack.pop()
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError as error:
            return BundleTree(tuple(sorted(files)), (f"{prefix or '.'}: cannot be listed ({error.strerror})",))
        for entry in listed:
            relative = prefix + entry.name
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 > MAX_BUNDLE_DEPTH:
                    problem = f"{relative}: folders nested deeper than {MAX_BUNDLE_DEPTH} levels (not a bundle)"
                    return BundleTree(tuple(sorted(files)), (problem,))
                stack.append((entry.path, relative + "/", depth + 1))
                continue
            files.append(relative)
            if len(files) > MAX_BUNDLE_FILES:
                return BundleTree(tuple(sorted(files)), (f"more than {MAX_BUNDLE_FILES} files (not a bundle)",))
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
                if total > MAX_BUNDLE_BYTES:
                    return BundleTree(tuple(sorted(files)), (f"more than {MAX_BUNDLE_BYTES} bytes (not a bundle)",))
    return BundleTree(tuple(sorted(files)), ())


def _read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file, read without following a symbolic link and only up to ``limit`` bytes."""
    import stat

    try:
        info = os.lstat(path)
    except OSError as error:
        raise WorkbenchError(f"{path}: cannot be read ({error.strerror}).", expected=what) from None
    if stat.S_ISLNK(info.st_mode):
        raise WorkbenchError(f"{path}: is a symbolic link; a bundle's links are never followed.", expected=what)
    if not stat.S_ISREG(info.st_mode):
        raise WorkbenchError(f"{path}: is not a regular file.", expected=what)
    if info.st_size > limit:
        raise WorkbenchError(f"{path}: {info.st_size} bytes, above the limit of {limit}.", expected=what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise WorkbenchError(f"{path}: cannot be opened ({error.strerror}).", expected=what) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise WorkbenchError(f"{path}: is not a regular file.", expected=what)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise WorkbenchError(f"{path}: grew above the limit of {limit} bytes while read.", expected=what)
    return data


def _file_entry(path: Path) -> JsonObject:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def _bundle_key() -> bytes | None:
    """The signing key from ``WORKBENCH_BUNDLE_KEY``; unset = no key. Set but empty, or not valid UTF-8, is an error
    (silently meaning "no key" would turn signing and checking off without a word)."""
    key = os.environ.get(BUNDLE_KEY_ENV)
    if key is None:
        return None
    if not key.strip():
        raise WorkbenchError(
            f"{BUNDLE_KEY_ENV} is set but empty; an empty key would sign nothing and check nothing.",
            expected=f"a non-empty key in {BUNDLE_KEY_ENV}, or the variable unset for unsigned bundles",
        )
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 reach Python as lone surrogates
        raise WorkbenchError(
            f"{BUNDLE_KEY_ENV} holds bytes that are not valid UTF-8.",
            expected=f"a key of UTF-8 text in {BUNDLE_KEY_ENV}",
        ) from None


def _manifest_hmac(data: bytes, key: bytes) -> str:
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def export_bundle(
    engine: EngineArtifact,
    output_dir: str | os.PathLike[str],
    *,
    plan: PrecisionPlan | None = None,
    calibration_cache: str | os.PathLike[str] | None = None,
    accuracy: Mapping[str, object] | None = None,
    timing: Mapping[str, object] | None = None,
    triton: TritonOptions | None = None,
    overwrite: bool = False,
) -> Bundle:
    """Write a sealed bundle for a built engine (from :func:`~workbench.engine.engine_from_onnx` or
    :meth:`EngineArtifact.load`). Every manifest field comes from the artifact; the optional extras are recorded
    when given. ``plan`` defaults to the plan the engine was built with.

    The manifest lists every file of the bundle with its size and sha256; with ``WORKBENCH_BUNDLE_KEY`` set, an
    HMAC-SHA256 of the manifest is written beside it. ``overwrite`` replaces only an earlier bundle (a directory
    with our manifest), atomically.
    """
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
    key = _bundle_key()  # an empty or undecodable key is refused before any work
    validate_outputs(
        {"bundle": output_dir},
        inputs=[engine_path, engine.layers_path, calibration_cache],
        directories=("bundle",),
        overwrite=overwrite,
        is_ours=is_bundle_dir,
        ours="a bundle written by `workbench export` that still verifies (format 2, nothing added or changed)",
    )
    replacing = os.path.lexists(output_dir)  # checked above: only then may the target be replaced
    check_plausible_engine(engine_path)
    engine_sha = sha256_file(engine_path)
    recorded = read_layers_document(engine.layers_path).get("build", {}).get("engine_sha256")
    if recorded != engine_sha or engine.engine_sha256 != engine_sha:
        raise WorkbenchError(
            f"{engine.layers_path}: its layer records belong to an engine with sha256 {str(recorded)[:12]}…, "
            f"but {engine_path} has {engine_sha[:12]}…; exporting them together would pair a layer map with the "
            "wrong engine.",
            expected="the .layers.json written together with this engine by `workbench build`",
            hint="rebuild the engine (an interrupted build can leave a new engine beside old records)",
        )
    if calibration_cache is not None:
        cache = Path(calibration_cache)
        refuse_special_file(cache, expected="the cache file written by calibration")
        if not cache.is_file():
            raise WorkbenchError(
                f"{cache}: no such calibration cache.", expected="the cache file written by calibration"
            )
        from workbench.calib.stats import CalibrationRanges

        CalibrationRanges.load(cache)  # refuses a cache that is not one (schema, ranges)
    plan = plan if plan is not None else engine.options.plan
    fp8 = _fp8_requirement(engine)
    manifest: dict[str, Any] = {
        "format": BUNDLE_FORMAT,
        "format_version": BUNDLE_VERSION,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "label": engine.label,
        "engine": {"file": ENGINE_FILE, "sha256": engine_sha, "bytes": engine_path.stat().st_size},
        "layers": {"file": LAYERS_FILE},
        "onnx": {"path": str(engine.onnx_path), "sha256": engine.onnx_sha256, "built_sha256": engine.built_onnx_sha256},
        "backend": {"name": engine.backend, "version": engine.backend_version},
        "target_compute_capabilities": target_compute_capabilities(engine.backend, engine.options.compute_capabilities),
        "precision": engine.precision,
        "precision_plan": plan.to_json() if plan is not None else None,
        "fp8": fp8,
        "build_options": engine.options.to_json(),
        "profiles": {k: [list(s) for s in v] for k, v in engine.profiles.items()},
        "io_tensors": [dataclasses.asdict(io) for io in engine.engine_layers.io_tensors],
        "layer_map": engine.layer_map.to_json(),
        "calibration_cache": None,
        # how the Q/DQ model was made from the cache's ranges (weight rounding, grid alignment), as the model records
        "quantization": (
            {**engine.quantization.to_json(), "text": engine.quantization.text()}
            if engine.quantization is not None
            else None
        ),
        "accuracy": dict(accuracy) if accuracy is not None else None,
        "timing": dict(timing) if timing is not None else None,
        "triton": None,
        "files": {},
    }

    with staging_directory(output_dir) as staging:
        shutil.copyfile(engine_path, staging / ENGINE_FILE)
        shutil.copyfile(engine.layers_path, staging / LAYERS_FILE)
        if sha256_file(staging / ENGINE_FILE) != engine_sha:  # the engine changed while we copied it
            raise WorkbenchError(f"{engine_path}: changed while being exported.", expected="a stable engine file")
        if calibration_cache is not None:
            shutil.copyfile(calibration_cache, staging / CALIBRATION_FILE)
            manifest["calibration_cache"] = {
                "file": CALIBRATION_FILE,
                "sha256": sha256_file(staging / CALIBRATION_FILE),
                "source": str(calibration_cache),
            }
        if triton is not None:
            parameters = {"precision": "fp8", "min_compute_capability": fp8["min_compute_capability"]} if fp8 else None
            text = triton_config(manifest["io_tensors"], triton, parameters)
            model_dir = staging / "triton" / triton.model_name
            (model_dir / "1").mkdir(parents=True)
            shutil.copyfile(staging / ENGINE_FILE, model_dir / "1" / "model.plan")
            write_text_atomic(model_dir / "config.pbtxt", text)
            manifest["triton"] = {
                "repository": "triton",
                "model_name": triton.model_name,
                "config": f"triton/{triton.model_name}/config.pbtxt",
                "plan": f"triton/{triton.model_name}/1/model.plan",
                "validated_with": "inference.ModelConfig from tritonclient 2.73.0 (text_format parse)",
                "note": "Triton's TensorRT backend loads full-TensorRT engines of the same version; not loaded by a server here.",
            }
        manifest["files"] = {name: _file_entry(staging / name) for name in walk_bundle(staging).files}
        text = dumps_json(manifest) + "\n"
        write_text_atomic(staging / MANIFEST_FILE, text)
        if key is not None:
            write_text_atomic(staging / MANIFEST_HMAC_FILE, _manifest_hmac(text.encode("utf-8"), key) + "\n")
        if replacing:
            _replace_bundle(staging, output_dir)
        else:  # a folder that appears at the target meanwhile is never swapped out: an error instead
            place_new_directory(staging, output_dir, label="bundle")
    return read_bundle(output_dir)


def _replace_bundle(staging: Path, target: Path) -> None:
    """Put the new bundle at ``target`` in place of the old one, then delete only the files the old manifest lists
    (and folders they leave empty). Anything else found in the old folder is kept, beside it, and reported."""
    import warnings

    from workbench._io import _renameat2_exchange

    old = verify_bundle(target, signature=False) if target.is_dir() and not target.is_symlink() else None
    if old is None or not old.ok or old.format_version < 2:
        raise WorkbenchError(
            f"{target}: changed while the new bundle was written and no longer verifies as a bundle written by "
            "`workbench export`; it was left untouched.",
            expected="an output folder nothing else writes to meanwhile",
        )
    listed = sorted(old.listed_files)
    if not _renameat2_exchange(staging, target):  # elsewhere: the old folder aside first, then the new one in
        os.replace(target, staging.with_name(staging.name + ".old"))
        os.replace(staging, target)
        staging.with_name(staging.name + ".old").rename(staging)
    # ``staging`` now holds the old bundle: remove what it listed, keep everything else (the staging folder's own
    # clean-up would delete it whole, so whatever is left is moved out of its way first, even on an error)
    try:
        folders = set()
        for name in (*listed, MANIFEST_FILE, MANIFEST_HMAC_FILE):
            path = staging / name
            if path.is_file() and not path.is_symlink():
                path.unlink()
            folders.update(str(parent) for parent in PurePosixPath(name).parents if str(parent) != ".")
        for folder in sorted(folders, key=lambda f: f.count("/"), reverse=True):
            with contextlib.suppress(OSError):  # not empty: something we did not write is there
                (staging / folder).rmdir()
        staging.rmdir()
    except BaseException:
        kept = target.with_name(f"{target.name}.kept-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S-%f')}")
        os.replace(staging, kept)
        warnings.warn(
            f"{target}: files found in the old bundle that its manifest does not list were kept in {kept}",
            stacklevel=3,
        )


# --- reading and verifying ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BundleCheck:
    """What :func:`verify_bundle` found: every problem (empty = intact) and what was checked."""

    path: Path
    problems: tuple[str, ...]
    files_checked: int
    signed: bool  # an HMAC was present and checked with WORKBENCH_BUNDLE_KEY
    notes: tuple[str, ...] = ()
    format_version: int = 0  # 0 when the manifest could not be read
    listed_files: tuple[str, ...] = ()  # the files the manifest seals (format 2)

    @property
    def ok(self) -> bool:
        return not self.problems


def _confined(root: Path, relative: object, what: str) -> tuple[Path | None, str | None]:
    """The file a manifest path names, if it is relative, stays inside ``root`` and crosses no symlink."""
    if not isinstance(relative, str) or not relative or "\x00" in relative:
        return None, f"{what}: path {relative!r} is not a non-empty relative path"
    pure = PurePosixPath(relative)
    if pure.is_absolute() or relative.startswith(("/", "\\")) or (len(relative) > 1 and relative[1] == ":"):
        return None, f"{what}: path {relative!r} is absolute"
    if any(part in ("..", "") for part in relative.replace("\\", "/").split("/")):
        return None, f"{what}: path {relative!r} leaves the bundle ('..')"
    current = root
    for part in pure.parts:
        current = current / part
        if current.is_symlink():
            return None, f"{what}: {relative!r} goes through a symbolic link ({current.name})"
    try:
        current.resolve().relative_to(root.resolve())
    except ValueError:
        return None, f"{what}: {relative!r} resolves outside the bundle"
    return current, None


_MANIFEST_SCHEMA: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "format_version": (int,),
    "engine": (dict,),
    "backend": (dict,),
    "target_compute_capabilities": (list,),
}


def _manifest_problems(manifest: object, where: Path) -> list[str]:
    if not isinstance(manifest, dict):
        return [f"{where}: the manifest is a {type(manifest).__name__}, not an object"]
    if manifest.get("format") != BUNDLE_FORMAT:
        return [f"{where}: format is {manifest.get('format')!r}, expected {BUNDLE_FORMAT!r}"]
    problems = []
    for key, types in _MANIFEST_SCHEMA.items():
        value = manifest.get(key)
        if isinstance(value, bool) or not isinstance(value, types):
            problems.append(f"{where}: field {key!r} is {value!r}, expected a {types[0].__name__}")
    if problems:
        return problems
    if manifest["format_version"] not in (1, BUNDLE_VERSION):
        problems.append(f"{where}: format_version {manifest['format_version']!r} is not 1 or {BUNDLE_VERSION}")
    engine = manifest["engine"]
    if not isinstance(engine.get("file"), str) or not _is_sha256(engine.get("sha256")):
        problems.append(f"{where}: 'engine' needs 'file' (string) and 'sha256' (64 hex digits), got {engine!r}")
    backend = manifest["backend"]
    if not isinstance(backend.get("name"), str) or not isinstance(backend.get("version"), str):
        problems.append(f"{where}: 'backend' needs string 'name' and 'version', got {backend!r}")
    if not all(isinstance(item, str) for item in manifest["target_compute_capabilities"]):
        problems.append(f"{where}: 'target_compute_capabilities' must be a list of strings")
    for section, keys in (("layers", ("file",)), ("calibration_cache", ("file",)), ("triton", ("plan", "config"))):
        value = manifest.get(section)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(value.get(key), str) for key in keys):
            problems.append(f"{where}: {section!r} is {value!r}, expected null or an object with string {keys}")
    if manifest["format_version"] >= 2:
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            problems.append(f"{where}: 'files' is missing or empty (a sealed bundle lists every file)")
        elif len(files) > MAX_BUNDLE_FILES:
            problems.append(f"{where}: 'files' lists {len(files)} files, above the limit of {MAX_BUNDLE_FILES}")
        else:
            for name, entry in files.items():
                if not isinstance(entry, dict) or not _is_sha256(entry.get("sha256")):
                    problems.append(f"{where}: files[{name!r}] needs a 'sha256' of 64 hex digits")
                elif (
                    isinstance(entry.get("bytes"), bool)
                    or not isinstance(entry.get("bytes"), int)
                    or entry["bytes"] < 0
                ):
                    problems.append(f"{where}: files[{name!r}] needs 'bytes', a non-negative integer")
    return problems


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def verify_bundle(path: str | os.PathLike[str], *, allow_unsealed: bool = False, signature: bool = True) -> BundleCheck:
    """Check a bundle against its manifest without trusting it: schema, confinement of every path (no ``..``,
    absolute paths or symlinks), every listed file's size and sha256, no unlisted files, the engine and its layer
    records belonging together, and the HMAC when ``WORKBENCH_BUNDLE_KEY`` is set.

    A format-1 (unsealed) bundle is read only with ``allow_unsealed``, never when a key is set, and never when it
    shows signs of a sealed bundle edited down (a file list or an HMAC file): a sealed format is never read as an
    unsealed one. Only the top-level ``manifest.json`` and ``manifest.json.hmac`` are special; no symbolic link is
    followed, the ``.hmac`` included. ``signature=False`` skips the HMAC (only to tell whether a folder is ours)."""
    root = Path(path)
    if not root.is_dir():
        raise WorkbenchError(f"{root}: no such bundle directory.", expected="a directory written by `workbench export`")
    manifest_path = root / MANIFEST_FILE
    if not manifest_path.is_file() or manifest_path.is_symlink():
        raise WorkbenchError(
            f"{root}: not a workbench bundle (no {MANIFEST_FILE}).",
            expected="a directory written by `workbench export`",
        )
    what = "the manifest written by `workbench export`"
    raw = _read_regular(manifest_path, MAX_MANIFEST_BYTES, what)  # the bytes the HMAC covers are the bytes parsed
    manifest = loads_json(raw, where=str(manifest_path), what=what)
    problems = _manifest_problems(manifest, manifest_path)
    notes: list[str] = []
    signed = False
    key = _bundle_key() if signature else None
    hmac_path = root / MANIFEST_HMAC_FILE
    hmac_present = os.path.lexists(hmac_path)
    if key is not None:
        if not hmac_present:
            problems.append(f"{root}: {BUNDLE_KEY_ENV} is set but the bundle has no {MANIFEST_HMAC_FILE} (unsigned)")
        else:
            try:
                wanted = _read_regular(hmac_path, MAX_HMAC_BYTES, "the HMAC written by `workbench export`").strip()
            except WorkbenchError as error:
                problems.append(error.problem.rstrip("."))
            else:
                if not hmac.compare_digest(wanted, _manifest_hmac(raw, key).encode("ascii")):
                    problems.append(f"{manifest_path}: HMAC does not match (manifest changed, or another key)")
                else:
                    signed = True
    elif hmac_present:
        notes.append(f"the manifest is signed; set {BUNDLE_KEY_ENV} to check the signature")
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version == 1:
        if "files" in manifest or hmac_present:
            problems.append(
                f"{manifest_path}: format_version 1 (unsealed) in a bundle that was sealed (it has "
                f"{'a file list' if 'files' in manifest else MANIFEST_HMAC_FILE}): its manifest was edited down"
            )
        elif signature and _bundle_key() is not None:
            problems.append(
                f"{manifest_path}: format_version 1 is unsealed and {BUNDLE_KEY_ENV} is set: only a sealed, signed "
                "bundle is read when a key is set"
            )
        elif not allow_unsealed:
            problems.append(
                f"{manifest_path}: format_version 1 is unsealed (only the engine is hashed); it is read only with "
                "--allow-unsealed (allow_unsealed=True), so an edited sealed bundle cannot pass as one"
            )
    if problems:
        return BundleCheck(root, tuple(problems), 0, signed, tuple(notes), _int_or_zero(version))
    checked = 0
    if manifest["format_version"] >= 2:
        listed = manifest["files"]
        named = {manifest["engine"]["file"]: "engine"}
        for key_name, field_name in (
            ("layers", "file"),
            ("calibration_cache", "file"),
            ("triton", "plan"),
            ("triton", "config"),
        ):
            section = manifest.get(key_name)
            if isinstance(section, dict) and field_name in section:
                named[section[field_name]] = f"{key_name}.{field_name}"
        for name, what in named.items():
            if name not in listed:
                problems.append(f"{what} {name!r} is not among the sealed files")
        # the walk first: a folder past the caps (depth, files, bytes) is refused before any file is hashed
        tree = walk_bundle(root)  # files, links, and FIFOs/sockets too; iteratively, with caps
        if tree.problems:
            return BundleCheck(root, (*problems, *tree.problems), 0, signed, tuple(notes), manifest["format_version"])
        for name, entry in listed.items():
            file_path, problem = _confined(root, name, "files")
            if problem:
                problems.append(problem)
                continue
            assert file_path is not None
            if not file_path.is_file():
                problems.append(f"{name}: missing")
                continue
            size = file_path.stat().st_size
            if size != entry["bytes"]:
                problems.append(f"{name}: {size} bytes, the manifest says {entry['bytes']}")
                continue
            digest = sha256_file(file_path)
            if digest != entry["sha256"]:
                problems.append(f"{name}: sha256 {digest[:12]}… differs from the manifest's {entry['sha256'][:12]}…")
            checked += 1
        extra = [name for name in tree.files if name not in listed and name not in (MANIFEST_FILE, MANIFEST_HMAC_FILE)]
        for name in extra[:50]:
            problems.append(f"{name}: not listed in the manifest (added after export)")
        if len(extra) > 50:
            problems.append(f"and {len(extra) - 50} more files not listed in the manifest")
        if manifest["engine"]["sha256"] != (listed.get(manifest["engine"]["file"]) or {}).get("sha256"):
            problems.append("engine.sha256 differs from the sealed engine file's sha256")
        triton = manifest.get("triton") if isinstance(manifest.get("triton"), dict) else {}
        if not problems and triton.get("plan") in listed:  # Triton's copy must be the sealed engine itself
            if listed[triton["plan"]]["sha256"] != manifest["engine"]["sha256"]:
                problems.append(f"{triton['plan']}: the Triton plan is not the bundle's engine (sha256 differs)")
        if not problems and triton.get("config") in listed:
            problems.extend(_triton_config_problems(root / triton["config"], manifest))
        layers = (manifest.get("layers") or {}).get("file")
        if layers and not problems:
            try:
                recorded = (read_layers_document(root / layers).get("build") or {}).get("engine_sha256")
            except WorkbenchError as error:
                problems.append(str(error))
            else:
                if recorded != manifest["engine"]["sha256"]:
                    problems.append(
                        f"{layers}: layer records of an engine with sha256 {str(recorded)[:12]}…, not this engine"
                    )
    else:
        notes.append("format_version 1 bundle: only the engine is hashed (re-export to seal every file)")
        engine_path, problem = _confined(root, manifest["engine"]["file"], "engine.file")
        if problem:
            problems.append(problem)
        elif engine_path is None or not engine_path.is_file():
            problems.append(f"the engine file {manifest['engine']['file']} is missing")
        else:
            digest = sha256_file(engine_path)
            if digest != manifest["engine"]["sha256"]:
                problems.append(
                    f"{engine_path}: sha256 {digest[:12]}… does not match the manifest "
                    f"({manifest['engine']['sha256'][:12]}…)"
                )
            checked = 1
    listed_names = tuple(manifest["files"]) if manifest["format_version"] >= 2 else ()
    return BundleCheck(root, tuple(problems), checked, signed, tuple(notes), manifest["format_version"], listed_names)


def _int_or_zero(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _triton_config_problems(config_path: Path, manifest: dict[str, Any]) -> list[str]:
    """The sealed config.pbtxt still parses with Triton's schema and fits the engine: its tensors are the engine's
    I/O tensors and its max_batch_size is within the optimization profile (hashes cannot tell a re-sealed edit)."""
    from workbench.export.triton import _batch_max, validate_triton_config

    name = config_path.name
    try:
        config = validate_triton_config(config_path.read_text(encoding="utf-8"))
    except (WorkbenchError, UnicodeDecodeError, OSError) as error:
        return [f"{name}: {error}"]
    listed = manifest.get("io_tensors")
    io_tensors = [io for io in listed if isinstance(io, dict)] if isinstance(listed, list) else []
    if not io_tensors:
        return []
    problems = []
    for mode, entries in (("input", config.input), ("output", config.output)):
        wanted = sorted(str(io.get("name")) for io in io_tensors if str(io.get("io_mode", "")).lower() == mode)
        got = sorted(entry.name for entry in entries)
        if got != wanted:
            problems.append(f"{name}: {mode}s {got} are not the engine's {wanted}")
    try:
        batch_max = _batch_max([io for io in io_tensors if str(io.get("io_mode", "")).lower() == "input"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return [*problems, f"{MANIFEST_FILE}: 'io_tensors' profiles are malformed (expected min/opt/max shape lists)"]
    if batch_max and config.max_batch_size > batch_max:
        problems.append(
            f"{name}: max_batch_size {config.max_batch_size} is above the engine profile's maximum batch {batch_max}"
        )
    return problems


def read_bundle(path: str | os.PathLike[str], *, allow_unsealed: bool = False) -> Bundle:
    """Open a bundle after :func:`verify_bundle`; any problem is a WorkbenchError listing what differs. A format-1
    (unsealed) bundle only with ``allow_unsealed`` and no key set."""
    check = verify_bundle(path, allow_unsealed=allow_unsealed)
    if not check.ok:
        raise WorkbenchError(
            f"{check.path}: the bundle does not match its manifest: "
            + "; ".join(check.problems[:5])
            + (f" (and {len(check.problems) - 5} more)" if len(check.problems) > 5 else "")
            + ".",
            expected="the files the bundle was exported with",
            hint="the bundle was modified or truncated; re-export it",
        )
    manifest = loads_json(
        _read_regular(Path(path) / MANIFEST_FILE, MAX_MANIFEST_BYTES, "the manifest written by `workbench export`"),
        where=str(Path(path) / MANIFEST_FILE),
        what="the manifest written by `workbench export`",
    )
    return Bundle(Path(path), manifest, Path(path) / manifest["engine"]["file"])


@dataclass
class LoadedEngine:
    bundle: Bundle
    runner: EngineRunner = field(repr=False)


def check_engine_compatible(bundle: Bundle, *, gpu: GpuInfo | None = None, backend: Backend | None = None) -> None:
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


def load_engine(
    bundle: str | os.PathLike[str] | Bundle, *, gpu: GpuInfo | None = None, allow_unsealed: bool = False
) -> LoadedEngine:
    """Deserialize a bundle's engine after checking backend version and compute capability (refuses mismatches)."""
    from workbench.engine.backend import EngineRunner, get_backend

    # verified now, not when first read
    bundle = read_bundle(bundle.path if isinstance(bundle, Bundle) else bundle, allow_unsealed=allow_unsealed)
    backend = get_backend(bundle.manifest["backend"]["name"])
    check_engine_compatible(bundle, gpu=gpu, backend=backend)
    data = bundle.engine_path.read_bytes()
    if hashlib.sha256(data).hexdigest() != bundle.manifest["engine"]["sha256"]:  # changed after the check
        raise WorkbenchError(f"{bundle.engine_path}: changed while being loaded.", expected="an unchanged bundle")
    return LoadedEngine(bundle, EngineRunner(backend, data))
