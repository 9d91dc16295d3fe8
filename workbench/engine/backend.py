"""The one module that calls TensorRT directly.

Written against the API common to TensorRT 10.x, 11.x and TensorRT-RTX (strongly typed networks,
``build_serialized_network``, memory pools, ``set_tensor_address`` + ``execute_async_v3``), and type-checked
with mypy against ``tensorrt-stubs`` (the TensorRT 10.13 API) in the tests. Which module backs it is decided at
run time: ``tensorrt`` when a real one is importable, else ``tensorrt_rtx``; ``WORKBENCH_TRT_BACKEND`` forces one.

Every other module goes through the functions here, so a call full TensorRT would reject is caught in one place.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.errors import BackendUnavailable, EngineCannotRun, WorkbenchError
from workbench.progress import ProgressEvent, ProgressFn, report

if TYPE_CHECKING:
    # mypy checks every call below against the TensorRT 10.13 stubs; at run time ``trt`` is whichever
    # backend module was resolved (see _bind).
    import tensorrt as trt
else:
    trt = None

BACKEND_ENV = "WORKBENCH_TRT_BACKEND"
BACKEND_MODULES = ("tensorrt", "tensorrt_rtx")
# TensorRT-RTX 1.x runs on these compute capabilities only (it refuses Hopper, 9.0).
RTX_RUNTIME_COMPUTE_CAPABILITIES = ((7, 5), (8, 0), (8, 6), (8, 9), (12, 0), (12, 1))


@dataclass(frozen=True)
class Backend:
    name: str  # "tensorrt" or "tensorrt_rtx"
    module: Any = field(repr=False)
    version: str

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt_rtx"


def _import_real(name: str) -> Any | None:
    """Import a backend module, ignoring stub-only namespace packages (tensorrt-stubs installs a bare ``tensorrt``)."""
    try:
        module = importlib.import_module(name)
    except Exception as error:  # ImportError, or a broken native library raising OSError
        cause: BaseException | None = error
        while cause is not None:  # Ctrl-C during the import, wrapped by the extension: not a missing backend
            if isinstance(cause, KeyboardInterrupt):
                raise KeyboardInterrupt from None
            cause = cause.__cause__ or cause.__context__
        return None
    if not hasattr(module, "Builder") or not hasattr(module, "__version__"):
        return None
    return module


def available_backends() -> list[str]:
    return [name for name in BACKEND_MODULES if _import_real(name) is not None]


def get_backend(force: str | None = None) -> Backend:
    """Resolve the TensorRT backend: ``force`` or $WORKBENCH_TRT_BACKEND if set, else tensorrt, else tensorrt_rtx."""
    wanted = force or os.environ.get(BACKEND_ENV) or None
    if wanted:
        wanted = {"trt": "tensorrt", "rtx": "tensorrt_rtx", "tensorrt-rtx": "tensorrt_rtx"}.get(wanted, wanted)
        if wanted not in BACKEND_MODULES:
            raise WorkbenchError(
                f"unknown TensorRT backend {wanted!r} (from {'argument' if force else BACKEND_ENV}).",
                expected="tensorrt or tensorrt_rtx",
            )
        module = _import_real(wanted)
        if module is None:
            hint = (
                "full TensorRT installs with `pip install tensorrt` from NVIDIA's index (extra `trt`)"
                if wanted == "tensorrt"
                else "`pip install tensorrt-rtx-cu13`"
            )
            raise BackendUnavailable(f"TensorRT backend {wanted!r} was requested but cannot be imported.", hint=hint)
        return Backend(wanted, module, str(module.__version__))
    for name in BACKEND_MODULES:
        module = _import_real(name)
        if module is not None:
            return Backend(name, module, str(module.__version__))
    raise BackendUnavailable(
        "no TensorRT backend is importable (tried tensorrt, tensorrt_rtx).",
        expected="`pip install tensorrt-rtx-cu13` (CPU-capable builder) or full `tensorrt`",
    )


_bind_lock = threading.Lock()


def dims_tuple(dims: trt.Dims) -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


def _bind(backend: Backend) -> None:
    # Route the module-level name ``trt`` (typed by the stubs) to the resolved backend module.
    with _bind_lock:
        globals()["trt"] = backend.module


# --- logging -----------------------------------------------------------------------------------------------

SEVERITY_NAMES = {0: "INTERNAL_ERROR", 1: "ERROR", 2: "WARNING", 3: "INFO", 4: "VERBOSE"}


def make_logger(backend: Backend, sink: Callable[[int, str], None]) -> trt.ILogger:
    """A TensorRT logger that forwards every message (VERBOSE included) to ``sink(severity, text)``."""
    _bind(backend)

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        interrupted = False  # Ctrl-C arrived inside this callback, where TensorRT would swallow the exception

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            try:
                sink(int(severity), msg)
            except KeyboardInterrupt:
                self.interrupted = True

    return _Logger()


_INTERRUPT_REQUESTED = threading.Event()


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C while TensorRT parses or builds, then raise KeyboardInterrupt once it returns.

    A KeyboardInterrupt raised inside a TensorRT callback (logger, progress monitor) is caught and printed by
    TensorRT, which then finishes the build as if nothing happened, or fails it with a misleading message. Here
    SIGINT only sets a flag; the progress monitor cancels the build when it sees it. Main thread only (elsewhere
    signals are not ours to handle)."""
    _INTERRUPT_REQUESTED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, lambda signum, frame: _INTERRUPT_REQUESTED.set())
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if _INTERRUPT_REQUESTED.is_set():
        _INTERRUPT_REQUESTED.clear()
        raise KeyboardInterrupt


def _raise_if_interrupted(*callbacks: object) -> None:
    """Re-raise a Ctrl-C that a TensorRT callback caught (TensorRT would otherwise finish or fail the build with a
    misleading message such as "logged no per-layer records")."""
    if any(getattr(callback, "interrupted", False) for callback in callbacks):
        raise KeyboardInterrupt


def make_progress_monitor(backend: Backend, on_event: ProgressFn) -> trt.IProgressMonitor:
    """Report TensorRT's builder phases to ``on_event`` as :class:`ProgressEvent` s (task ``build``, kind
    start/step/finish, ``parent`` "" for top-level phases); returning False from a step cancels the build."""
    _bind(backend)

    class _Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            try:
                on_event(_build_event("start", phase_name, parent_phase or "", 0, int(num_steps)))
            except KeyboardInterrupt:
                self.interrupted = True

        interrupted = False

        def step_complete(self, phase_name: str, step: int) -> bool:
            if _INTERRUPT_REQUESTED.is_set():  # Ctrl-C held by _sigint_deferred: cancel the build
                return False
            try:
                return report(on_event, _build_event("step", phase_name, "", int(step), None))
            except KeyboardInterrupt:  # cancel the build; build_serialized re-raises it afterwards
                self.interrupted = True
                return False

        def phase_finish(self, phase_name: str) -> None:
            try:
                on_event(_build_event("finish", phase_name, "", 0, None))
            except KeyboardInterrupt:
                self.interrupted = True

    return _Monitor()


def _build_event(kind: str, phase: str, parent: str, step: int, total: int | None) -> ProgressEvent:
    return ProgressEvent("build", phase, index=step, total=total, name=phase, kind=kind, parent=parent)


# --- building ----------------------------------------------------------------------------------------------


@dataclass
class NetworkBuildRequest:
    """Everything the builder needs; produced by workbench.engine.build from user options."""

    onnx_path: str
    profiles: Sequence[Mapping[str, tuple[Sequence[int], Sequence[int], Sequence[int]]]] = field(default_factory=list)
    workspace_bytes: int | None = None
    optimization_level: int | None = None
    compute_capabilities: tuple[str, ...] = ()  # RTX only, e.g. ("SM86",); empty = backend default
    timing_cache: bytes | None = None
    # what messages name: the user's model (the parsed file may be its rewrite in a temporary folder, gone afterwards)
    source: str = ""


@dataclass
class NetworkBuildOutput:
    serialized_engine: bytes
    timing_cache: bytes | None
    parser_errors: list[str]
    network_inputs: list[tuple[str, tuple[int, ...], str]]


def _parser_error_text(error: Any) -> str:
    """A parser error's text, with the ONNX node and op it names where the binding gives them."""
    text = str(error.desc())
    code = str(getattr(error, "code", lambda: "")()).rsplit(".", 1)[-1]
    if text.strip() in ("", "false") and code:  # an assertion with no message: the error code is all it says
        text = f"{code.lower().replace('_', ' ')} (the parser gives no other reason)"
    try:
        node, op = str(error.node_name()), str(error.node_operator())
    except Exception:  # older bindings have no node_name()/node_operator()
        return text
    return f"node {node!r} ({op}): {text}" if node else text


def build_serialized(
    backend: Backend,
    request: NetworkBuildRequest,
    log_sink: Callable[[int, str], None],
    progress: ProgressFn | None = None,
) -> NetworkBuildOutput:
    """Parse the ONNX file into a strongly typed network and build a serialized engine with DETAILED verbosity."""
    _bind(backend)
    logger = make_logger(backend, log_sink)
    builder = trt.Builder(logger)
    flags = 0
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is not None:  # TensorRT 11 and RTX are always strongly typed; 10.x needs the flag
        flags |= 1 << int(strongly_typed)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with _sigint_deferred():
        parsed = parser.parse_from_file(request.onnx_path)
    _raise_if_interrupted(logger)
    if not parsed:
        errors = [_parser_error_text(parser.get_error(i)) for i in range(parser.num_errors)]
        plugin = any("Plugin not found" in error for error in errors)
        raise WorkbenchError(
            f"{request.source or request.onnx_path}: the TensorRT ONNX parser ({backend.name} {backend.version}) "
            "rejected the model: " + "; ".join(errors[:5]),
            expected="an ONNX graph TensorRT supports (try `workbench clean` first)"
            if not plugin
            else "standard ONNX ops, or a TensorRT plugin registered for the custom op (this op is not built in)",
        )
    inputs = []
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        inputs.append((tensor.name, dims_tuple(tensor.shape), str(tensor.dtype)))

    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if request.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(request.workspace_bytes))
    if request.optimization_level is not None:
        config.builder_optimization_level = int(request.optimization_level)
    if request.compute_capabilities:
        _set_compute_capabilities(config, request.compute_capabilities, backend)
    # the parser renames a graph input that is also a graph output to "__<name>" (its copy keeps the name)
    input_names = {name for name, _, _ in inputs}
    network_name = {name[2:]: name for name in input_names if name.startswith("__") and name[2:] not in input_names}
    for profile_shapes in request.profiles:
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in profile_shapes.items():
            profile.set_shape(
                network_name.get(name, name),
                trt.Dims([int(d) for d in low]),
                trt.Dims([int(d) for d in opt]),
                trt.Dims([int(d) for d in high]),
            )
        config.add_optimization_profile(profile)
    cache = None
    # TensorRT-RTX keeps the timing-cache API but documents it as a no-op (deprecated since RTX 1.2).
    if supports_timing_cache(backend):
        cache = config.create_timing_cache(request.timing_cache or b"")
        config.set_timing_cache(cache, False)
    # always a monitor: it is how a held Ctrl-C cancels the build (see _sigint_deferred)
    monitor = make_progress_monitor(backend, progress if progress is not None else (lambda *event: True))
    config.progress_monitor = monitor
    with _sigint_deferred():
        serialized = builder.build_serialized_network(network, config)
    _raise_if_interrupted(logger, monitor)
    if serialized is None:
        raise WorkbenchError(
            f"{request.onnx_path}: {backend.name} {backend.version} failed to build an engine (see the errors logged above).",
            expected="a network and optimization profile the builder accepts",
        )
    cache_bytes = None
    if cache is not None:
        cache_bytes = bytes(memoryview(config.get_timing_cache().serialize()))
    return NetworkBuildOutput(bytes(memoryview(serialized)), cache_bytes, [], inputs)


def inspect_engine_json(backend: Backend, serialized_engine: bytes) -> str:
    """The engine inspector's JSON for every layer (``LayerInformationFormat.JSON``), full TensorRT's layer records.

    The engine must be deserialized on a GPU it runs on (the build GPU for full TensorRT); it was built with
    ``ProfilingVerbosity.DETAILED``, so each layer carries its ONNX nodes, tactic, formats and datatypes.
    Unverified on our machines: full TensorRT cannot be installed there.
    """
    _bind(backend)
    messages: list[tuple[int, str]] = []
    logger = make_logger(backend, lambda severity, text: messages.append((severity, text)))
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(serialized_engine)
    if engine is None:
        detail = "; ".join(text for severity, text in messages if severity <= 1)[:500]
        raise EngineCannotRun(
            f"{backend.name} {backend.version} could not deserialize the engine it built, so its layer records cannot "
            f"be read: {detail or 'no error logged'}",
            expected="a GPU that can run the engine (full TensorRT reads layer records through the engine inspector)",
        )
    inspector = engine.create_engine_inspector()
    return str(inspector.get_engine_information(trt.LayerInformationFormat.JSON))


def supports_timing_cache(backend: Backend) -> bool:
    return not backend.is_rtx


def _set_compute_capabilities(config: Any, names: Sequence[str], backend: Backend) -> None:
    # Choosing target compute capabilities at build time is a TensorRT-RTX feature; full TensorRT builds for the
    # GPU it runs on.
    if not backend.is_rtx:
        raise WorkbenchError(
            "target compute capabilities can only be chosen with the tensorrt_rtx backend.",
            expected="no --compute-capability with full TensorRT (it targets the build GPU)",
        )
    members = backend.module.ComputeCapability.__members__
    config.num_compute_capabilities = len(names)
    for index, name in enumerate(names):
        key = name.upper().replace(".", "")
        key = key if key.startswith("SM") else "SM" + key
        if key not in members:
            raise WorkbenchError(
                f"unknown compute capability {name!r}.", expected=", ".join(m for m in members if m.startswith("SM"))
            )
        config.set_compute_capability(members[key], index)


# --- can an engine run here? -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuInfo:
    present: bool
    name: str = ""
    compute_capability: tuple[int, int] | None = None
    driver: str = ""
    source: str = ""  # how it was found


def detect_gpu() -> GpuInfo:
    """Find an NVIDIA GPU through cuda-bindings if installed, else nvidia-smi. Never raises."""
    try:
        from cuda.bindings import driver as cuda_driver  # type: ignore[import-not-found]

        (status,) = cuda_driver.cuInit(0)
        if int(status) == 0:
            status, count = cuda_driver.cuDeviceGetCount()
            if int(status) == 0 and count > 0:
                status, device = cuda_driver.cuDeviceGet(0)
                _, raw_name = cuda_driver.cuDeviceGetName(64, device)
                attr = cuda_driver.CUdevice_attribute
                _, major = cuda_driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
                _, minor = cuda_driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
                name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
                return GpuInfo(True, name, (int(major), int(minor)), source="cuda.bindings")
    except Exception:
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = (
                subprocess.run(
                    [smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=True,
                )
                .stdout.strip()
                .splitlines()
            )
            if out:
                name, cap, driver = (part.strip() for part in out[0].split(","))
                major, minor = (int(x) for x in cap.split("."))
                return GpuInfo(True, name, (major, minor), driver, source="nvidia-smi")
        except Exception:
            pass
    return GpuInfo(False, source="cuda.bindings / nvidia-smi found no NVIDIA GPU")


def engine_runnable(backend: Backend, gpu: GpuInfo | None = None) -> tuple[bool, str]:
    """Whether an engine built by ``backend`` can execute on this machine, and why not."""
    gpu = gpu or detect_gpu()
    if not gpu.present:
        return False, "no NVIDIA GPU is present; engines can be built here (ahead of time) but not executed"
    if backend.is_rtx and gpu.compute_capability not in RTX_RUNTIME_COMPUTE_CAPABILITIES:
        cc = ".".join(map(str, gpu.compute_capability or ()))
        supported = ", ".join(f"{a}.{b}" for a, b in RTX_RUNTIME_COMPUTE_CAPABILITIES)
        return False, f"TensorRT-RTX does not run on compute capability {cc} ({gpu.name}); it supports {supported}"
    return True, f"{gpu.name} (compute capability {'.'.join(map(str, gpu.compute_capability or ()))})"


# --- runtime: the thin adapter the pipeline's TensorRT executor uses (unverified on our machines) ------------


@dataclass
class IOBinding:
    name: str
    is_input: bool
    dtype: str
    shape: tuple[int, ...]


class EngineRunner:
    """Deserialize an engine and drive execution contexts with ``set_tensor_address`` + ``execute_async_v3``.

    One execution context per lane (contexts running in parallel must not share scratch memory). This path needs
    a GPU the backend supports; none of our machines has one, so it is type-checked but not executed in CI.
    """

    def __init__(self, backend: Backend, serialized_engine: bytes) -> None:
        _bind(backend)
        ok, why = engine_runnable(backend)
        if not ok:
            raise EngineCannotRun(f"cannot execute a {backend.name} engine here: {why}.")
        self.backend = backend
        self._messages: list[tuple[int, str]] = []
        self._logger = make_logger(backend, lambda sev, msg: self._messages.append((sev, msg)))
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(serialized_engine)
        if engine is None:
            detail = "; ".join(m for s, m in self._messages if s <= 1)[:500]
            raise WorkbenchError(
                f"{backend.name} {backend.version} could not deserialize the engine: {detail}",
                expected="an engine built by the same backend version for this GPU",
            )
        self.engine = engine

    def bindings(self) -> list[IOBinding]:
        result = []
        for index in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(index)
            result.append(
                IOBinding(
                    name=name,
                    is_input=self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                    dtype=str(self.engine.get_tensor_dtype(name)),
                    shape=dims_tuple(self.engine.get_tensor_shape(name)),
                )
            )
        return result

    def context_memory_bytes(self, profile_index: int = 0) -> int:
        return int(self.engine.get_device_memory_size_for_profile_v2(profile_index))

    def create_context(self, user_managed_memory: bool = False) -> trt.IExecutionContext:
        strategy = (
            trt.ExecutionContextAllocationStrategy.USER_MANAGED
            if user_managed_memory
            else trt.ExecutionContextAllocationStrategy.STATIC
        )
        context = self.engine.create_execution_context(strategy)
        if context is None:
            raise WorkbenchError("TensorRT could not create an execution context (out of device memory?).")
        return context

    @staticmethod
    def set_device_memory(context: trt.IExecutionContext, address: int, size: int) -> None:
        context.set_device_memory(address, size)

    @staticmethod
    def select_profile(context: trt.IExecutionContext, profile_index: int, stream_handle: int) -> None:
        if not context.set_optimization_profile_async(profile_index, stream_handle):
            raise WorkbenchError(f"could not select optimization profile {profile_index}.")

    @staticmethod
    def set_input_shape(context: trt.IExecutionContext, name: str, shape: Sequence[int]) -> None:
        if not context.set_input_shape(name, tuple(shape)):
            raise WorkbenchError(f"input {name!r}: shape {tuple(shape)} is outside the engine's optimization profile.")

    @staticmethod
    def bind(context: trt.IExecutionContext, addresses: dict[str, int]) -> None:
        """Bind device buffers once per lane; the same addresses serve every later enqueue."""
        for name, address in addresses.items():
            if not context.set_tensor_address(name, int(address)):
                raise WorkbenchError(f"could not bind tensor {name!r} to address {address:#x}.")

    @staticmethod
    def set_input_consumed_event(context: trt.IExecutionContext, event_handle: int) -> None:
        context.set_input_consumed_event(int(event_handle))

    @staticmethod
    def enqueue(context: trt.IExecutionContext, stream_handle: int) -> None:
        if not context.execute_async_v3(int(stream_handle)):
            raise WorkbenchError("execute_async_v3 failed (see the TensorRT log).")
