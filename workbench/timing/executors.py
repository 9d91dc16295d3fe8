"""The executor protocol the pipeline drives, and the CPU executor (ONNX Runtime on worker threads).

An executor owns the model. For each lane it binds buffers once (``bind_lane``) and afterwards only enqueues
work for one of the batch sizes it prepared (``LaneBinding.enqueue(size, stream)``). GPU executors expose device
pointers so the pipeline can copy from its pinned host buffers; the CPU executor runs synchronously on the calling
worker thread (``stream`` is None) and is labelled as such in every result.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from workbench.errors import WorkbenchError
from workbench.model import shape_template


@dataclass(frozen=True)
class TensorSlot:
    """One input or output as the pipeline sees it: per-sample shape (batch dim excluded) and dtype."""

    name: str
    sample_shape: tuple[int, ...]
    dtype: np.dtype

    def nbytes(self, batch: int) -> int:
        return int(batch * int(np.prod(self.sample_shape, dtype=np.int64)) * self.dtype.itemsize)


class LaneBinding(Protocol):
    """Buffers and prepared work of one lane. Device pointers are valid for the binding's lifetime."""

    def input_pointers(self, size: int) -> list[int]: ...
    def output_pointers(self, size: int) -> list[int]: ...
    def enqueue(self, size: int, stream: Any) -> None: ...


class Executor(Protocol):
    name: str  # "cpu" | "torch" | "trt"
    device: str  # "cpu" | "cuda"
    inputs: list[TensorSlot]
    outputs: list[TensorSlot]

    def label(self) -> str: ...
    def bind_lane(self, lane: int, batch_sizes: Sequence[int], stream: Any) -> LaneBinding: ...
    def graph_status(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


# integer inputs in [low, high): 0 or 1. Measured 2026-12-05: ids 1..2 (and the pipeline's 1..99) failed MiniLM's
# token_type_embeddings Gather, a table of two rows, so the quickstart's timing stage failed on every BERT-style model
TIMING_INT_RANGE = (0, 2)


def random_feed(slots: Sequence[TensorSlot], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic inputs, not all zeros (zeros can hide bugs and time differently); integers are 0 or 1
    (:data:`TIMING_INT_RANGE`): valid ids for any embedding table of two rows or more, BERT's token types included (a
    model of unknown vocabulary must not fail on an out-of-range token), and valid masks."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for slot in slots:
        shape = (batch, *slot.sample_shape)
        if np.issubdtype(slot.dtype, np.integer):
            feed[slot.name] = rng.integers(*TIMING_INT_RANGE, size=shape).astype(slot.dtype)
        elif slot.dtype == np.bool_:
            feed[slot.name] = np.ones(shape, dtype=np.bool_)
        else:
            feed[slot.name] = rng.standard_normal(shape).astype(slot.dtype)
    return feed


_ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


def parse_shape_overrides(items: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``name:1x3x224x224`` strings (CLI ``--shape``) into full shapes, batch dimension included."""
    result: dict[str, tuple[int, ...]] = {}
    for item in items or ():
        name, sep, dims = item.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise WorkbenchError(f"--shape {item!r} is not understood.", expected="NAME:DxDxD, e.g. x:1x3x224x224")
        if name in result:
            raise WorkbenchError(
                f"--shape gives input {name!r} twice ({'x'.join(map(str, result[name]))} and {dims}).",
                expected="one --shape per input",
            )
        result[name] = shape
    return result


def _full_shape(value: Any) -> tuple[int, ...]:
    """A full shape, or the opt shape of a (min, opt, max) profile such as ZooEntry.input_profiles() returns."""
    items = tuple(value)
    if items and all(isinstance(v, (tuple, list)) for v in items):
        if len(items) != 3:
            raise WorkbenchError(f"shape profile {value!r} is not (min, opt, max).")
        items = tuple(items[1])
    return tuple(int(d) for d in items)


class OrtCpuExecutor:
    """ONNX Runtime CPU sessions, one per lane, each run on that lane's worker thread.

    This is not a GPU pipeline: there are no copies and no streams, so H2D/D2H are zero and "compute" is the
    ``session.run`` wall time on the worker. It exists so the notebook and CLI work on machines without a GPU.
    """

    name = "cpu"
    device = "cpu"

    def __init__(
        self,
        onnx_path: str | os.PathLike[str],
        shapes: dict[str, Any] | None = None,
        intra_op_threads: int = 1,
        seed: int = 0,
    ) -> None:
        import onnxruntime as ort

        self.onnx_path = Path(onnx_path)
        if not self.onnx_path.is_file():
            raise WorkbenchError(
                f"{self.onnx_path}: no such ONNX file.", expected="a path to a .onnx model or a zoo name"
            )
        self._ort = ort
        self._intra = int(intra_op_threads)
        self._seed = seed
        probe = self._new_session()
        shapes = {name: _full_shape(value) for name, value in (shapes or {}).items()}
        unknown = sorted(set(shapes) - {arg.name for arg in probe.get_inputs()})
        if unknown:
            raise WorkbenchError(
                f"{self.onnx_path}: --shape names {unknown}, which are not inputs of the model.",
                expected=f"names among {[arg.name for arg in probe.get_inputs()]}",
            )
        args = list(probe.get_inputs())
        unsized = [arg for arg in args if arg.name not in shapes and _symbolic_positions(list(arg.shape))]
        if len(unsized) > 1:  # every input that needs a --shape named at once, not one refusal per run
            raise WorkbenchError(
                f"inputs {[arg.name for arg in unsized]} have symbolic non-batch dimensions "
                f"({'; '.join(f'{arg.name}: {list(arg.shape)}' for arg in unsized)}).",
                expected="a fixed size for every non-batch dimension",
                hint="pass " + " ".join(f"--shape {arg.name}:{shape_template(list(arg.shape))}" for arg in unsized),
            )
        self.inputs = [self._slot(arg, shapes.get(arg.name)) for arg in args]
        self.outputs = [
            TensorSlot(o.name, (), np.dtype(_ORT_DTYPES.get(o.type, np.float32))) for o in probe.get_outputs()
        ]
        self._sessions: dict[int, Any] = {0: probe}

    def _new_session(self) -> Any:
        options = self._ort.SessionOptions()
        options.intra_op_num_threads = self._intra
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        try:
            return self._ort.InferenceSession(str(self.onnx_path), options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime raises its own Fail/InvalidGraph types
            raise WorkbenchError(
                f"{self.onnx_path}: ONNX Runtime could not load the model: {error}", expected="a valid ONNX model"
            ) from error

    def _slot(self, arg: Any, override: tuple[int, ...] | None) -> TensorSlot:
        dtype = np.dtype(_ORT_DTYPES.get(arg.type, np.float32))
        dims = list(arg.shape)
        if override is not None:
            if len(override) != len(dims):
                raise WorkbenchError(
                    f"input {arg.name!r}: shape {override} has {len(override)} dims, the model has "
                    f"{len(dims)} ({dims}).",
                    expected=f"{len(dims)} dimensions",
                )
            return TensorSlot(arg.name, tuple(int(d) for d in override[1:]), dtype)
        sample = []
        for index, dim in enumerate(dims[1:], start=1):
            if not isinstance(dim, int) or dim <= 0:
                raise WorkbenchError(
                    f"input {arg.name!r} has a symbolic dimension {dim!r} at position {index} ({dims}).",
                    expected="a fixed size for every non-batch dimension",
                    hint=f"pass --shape {arg.name}:{shape_template(dims)}",
                )
            sample.append(int(dim))
        return TensorSlot(arg.name, tuple(sample), dtype)

    def label(self) -> str:
        return f"ONNX Runtime CPU ({self._intra} intra-op thread(s) per lane; host threads, no GPU)"

    def bind_lane(self, lane: int, batch_sizes: Sequence[int], stream: Any = None) -> _OrtLane:
        session = self._sessions.get(lane)
        if session is None:
            session = self._sessions[lane] = self._new_session()
        return _OrtLane(session, self.inputs, seed=self._seed + lane)

    def graph_status(self) -> dict[str, Any]:
        return {"requested": False, "active": False, "fallback_reason": "CUDA graphs do not apply to the CPU executor"}

    def close(self) -> None:
        self._sessions.clear()


class _OrtLane:
    """One lane's ONNX Runtime session. The pipeline's CPU lanes run it on their slots' own inputs (``run``); the
    lane's seeded feed per batch size (``enqueue``) is made only when asked for, so no lane holds an unused copy."""

    def __init__(self, session: Any, inputs: Sequence[TensorSlot], seed: int) -> None:
        self._session = session
        self._inputs = list(inputs)
        self._seed = seed
        self._feeds: dict[int, dict[str, np.ndarray]] = {}
        self.last_outputs: list[np.ndarray] = []

    def _feed(self, size: int) -> dict[str, np.ndarray]:
        if size not in self._feeds:
            self._feeds[size] = random_feed(self._inputs, size, seed=self._seed)
        return self._feeds[size]

    def input_pointers(self, size: int) -> list[int]:
        return [int(a.ctypes.data) for a in self._feed(size).values()]

    def output_pointers(self, size: int) -> list[int]:
        return []

    def enqueue(self, size: int, stream: Any = None) -> None:
        # Synchronous: returns when the outputs exist.
        self.last_outputs = self._session.run(None, self._feed(size))

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run the lane's session on caller-owned inputs (the serving layer's per-slot buffers); synchronous."""
        return self._session.run(None, feed)


def _symbolic_positions(dims: list[Any]) -> list[int]:
    """The non-batch positions of ``dims`` (ONNX Runtime's input shape) that have no fixed size."""
    return [index for index, dim in enumerate(dims[1:], start=1) if not isinstance(dim, int) or dim <= 0]
