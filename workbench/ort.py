"""ONNX Runtime on CPU, the project's numeric reference, in one place.

With graph optimizations off (``ORT_DISABLE_ALL``, the default here) ONNX Runtime runs Q/DQ models as
deterministic simulated quantization in float, matching TensorRT's round-half-even and clamp; with optimizations
on it switches to integer kernels whose accuracy depends on the CPU. Every numeric comparison in the workbench
(cleaning checks, calibration statistics, per-layer diffs, task metrics) builds its session here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Union

import numpy as np

from workbench.errors import WorkbenchError

Feed = dict[str, np.ndarray]
Outputs = dict[str, np.ndarray]
PredictFn = Callable[[Feed], Outputs]

if TYPE_CHECKING:
    import onnx
    import onnxruntime

# what ONNX Runtime can load: a ModelProto, its serialized bytes, or a path to a file
ModelSource = Union["onnx.ModelProto", bytes, str, os.PathLike[str]]


def cpu_session(
    model: ModelSource,
    *,
    extra_outputs: Iterable[str] = (),
    optimized: bool = False,
    what: str = "the model",
    external_initializers: Mapping[str, np.ndarray] | None = None,
    quiet: bool = False,
) -> onnxruntime.InferenceSession:
    """An ``onnxruntime.InferenceSession`` on CPU for a ModelProto, its serialized bytes or a file path.

    ``extra_outputs`` exposes intermediate tensors as graph outputs (on a copy; the caller's model is untouched).
    ``external_initializers``: arrays for the top-level initializers the model declares as external data (they
    are read from memory, never from a file), so a model with large weights need not be serialized with them.
    A model ONNX Runtime cannot load raises WorkbenchError naming ``what``. ``quiet``: a probe expected to fail may
    (a batch the graph hard-codes): ONNX Runtime's own error log stays silent, the exception still says why.
    """
    import onnxruntime as ort

    source: onnx.ModelProto | bytes | str
    extra = [name for name in extra_outputs]
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        from workbench._io import refuse_special_file

        refuse_special_file(path, expected="a path to a regular .onnx file")
        if not path.is_file():
            raise WorkbenchError(f"{path}: no such ONNX file.", expected="a path to an existing .onnx file")
        source = str(path)
        if extra:
            import onnx

            source = onnx.load(str(path))
    else:
        source = model
    if extra:
        source = _with_outputs(source, extra)
    if not isinstance(source, (str, bytes)):
        source = source.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 4 if quiet else 3
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    if external_initializers:
        names = list(external_initializers)
        values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(external_initializers[n])) for n in names]
        options.add_external_initializers(names, values)
    try:
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        if external_initializers:
            session.workbench_external_values = values  # ORT reads these buffers: keep them alive with it
        return session
    except Exception as error:  # onnxruntime raises its own exception classes (Fail, InvalidGraph, ...)
        if "is not a registered function/op" in str(error):
            raise WorkbenchError(
                f"ONNX Runtime cannot load {what}: it has no kernel for a custom op ({error}).",
                expected="a model of standard ONNX ops, or the op's custom-op library registered with ONNX Runtime",
                hint="every check and INT8 step here runs the model in ONNX Runtime; replace the op with standard "
                "ONNX ops (or a function), or export the model without it",
            ) from error
        raise WorkbenchError(f"ONNX Runtime cannot load {what} ({error}).", expected="a valid ONNX model") from error


def _with_outputs(model: onnx.ModelProto | bytes, names: list[str]) -> onnx.ModelProto:
    import onnx

    if isinstance(model, bytes):
        model = onnx.load_from_string(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    existing = {output.name for output in copy.graph.output}
    for name in names:
        if name not in existing:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
    return copy


def session_predict(session: onnxruntime.InferenceSession, *, what: str = "the model") -> PredictFn:
    """``predict(feed) -> {output name: array}`` over a session; a feed missing an input is a WorkbenchError."""
    output_names = [output.name for output in session.get_outputs()]
    input_names = [inp.name for inp in session.get_inputs()]

    def predict(feed: Feed) -> Outputs:
        missing = [name for name in input_names if name not in feed]
        if missing:
            raise WorkbenchError(f"{what}: the feed lacks model input(s) {missing}.", expected=f"inputs {input_names}")
        return dict(zip(output_names, session.run(output_names, {name: feed[name] for name in input_names})))

    return predict


def cpu_predict(model: ModelSource, *, optimized: bool = False, what: str = "the model") -> PredictFn:
    """``predict(feed)`` for a ModelProto, bytes or path, with ONNX Runtime CPU (optimizations off by default)."""
    return session_predict(cpu_session(model, optimized=optimized, what=what), what=what)
