"""Proof that a pass was harmless: ONNX checker, strict shape inference, unchanged graph I/O and Q/DQ count, and
ONNX Runtime outputs (graph optimizations off) equal to the original model's at the probe shapes."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from workbench.clean.graph_utils import RANDOM_OPS, iter_node_protos
from workbench.errors import WorkbenchError
from workbench.model import QDQ_OPS, TensorSpec, tensor_specs

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort
    from numpy.typing import ArrayLike

RTOL, ATOL = 1e-4, 1e-5  # for "numeric" passes (folding, fusion); "exact" passes must match bit for bit

# Default probe values for dynamic dimensions: (min, opt, max). The first dimension is taken to be the batch.
DEFAULT_BATCH_PROBE = (1, 2, 3)
DEFAULT_DIM_PROBE = (32, 64, 96)  # multiples of 32: detection/segmentation nets downsample by 32

ProbeShapes = list[dict[str, tuple[int, ...]]]
Prepared = tuple["onnx.ModelProto", dict[str, np.ndarray]]  # a light model and the arrays of its data-free stubs
HintValue = int | float  # a value a model compares a small integer/bool input with (bools are ints)
IOSpecs = tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]


def io_specs(model: onnx.ModelProto) -> IOSpecs:
    initializers = {init.name for init in model.graph.initializer}
    return tensor_specs(model.graph.input, initializers), tensor_specs(model.graph.output)


def default_probe_shapes(inputs: Sequence[TensorSpec]) -> ProbeShapes:
    """min/opt/max shapes for every input: fixed dims as they are, the batch dim 1/2/3, other dynamic dims
    32/64/96. Dimensions sharing a symbolic name get the same value."""
    probes: ProbeShapes = [{}, {}, {}]
    named: dict[str, tuple[int, int, int]] = {}
    for spec in inputs:
        per_level: list[list[int]] = [[], [], []]
        for index, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim >= 0:
                values = (dim, dim, dim)
            else:
                default = DEFAULT_BATCH_PROBE if index == 0 else DEFAULT_DIM_PROBE
                values = named.setdefault(dim, default) if isinstance(dim, str) and dim not in ("?", "") else default
            for level in range(3):
                per_level[level].append(values[level])
        for level in range(3):
            probes[level][spec.name] = tuple(per_level[level])
    return _unique(probes)


def probe_shapes_from_profile(
    inputs: Sequence[TensorSpec], profile: Mapping[str, Sequence[Sequence[int]]]
) -> ProbeShapes:
    """Turn a TensorRT-style profile ``{input: (min, opt, max)}`` into three probe feeds' shapes."""
    defaults = default_probe_shapes(inputs)
    while len(defaults) < 3:
        defaults.append(dict(defaults[-1]))
    names = {spec.name for spec in inputs}
    unknown = sorted(set(profile) - names)
    if unknown:
        raise WorkbenchError(
            f"profile names {unknown}, which are not graph inputs.", expected=f"names among {sorted(names)}"
        )
    probes: ProbeShapes = [{}, {}, {}]
    for spec in inputs:
        levels = profile.get(spec.name)
        for level in range(3):
            if levels is None:
                probes[level][spec.name] = defaults[level][spec.name]
                continue
            if len(levels) != 3:
                raise WorkbenchError(f"profile for {spec.name!r} has {len(levels)} shapes.", expected="(min, opt, max)")
            shape = tuple(int(v) for v in levels[level])
            if len(shape) != len(spec.shape) or any(
                isinstance(dim, int) and dim >= 0 and dim != value for dim, value in zip(spec.shape, shape)
            ):
                raise WorkbenchError(
                    f"profile shape {shape} for {spec.name!r} does not fit the input shape {list(spec.shape)}.",
                    expected="same rank, fixed dimensions unchanged",
                )
            probes[level][spec.name] = shape
    return _unique(probes)


def cap_batch(probes: ProbeShapes, inputs: Sequence[TensorSpec], max_batch: int | None) -> ProbeShapes:
    """Limit a dynamic leading (batch) dimension to ``max_batch``: batch size rarely changes what a rewrite
    does, while ORT time grows with it (a batch-32 OCR recognizer takes seconds per check)."""
    if max_batch is None:
        return probes
    batch_axes = {
        (spec.name, 0) for spec in inputs if spec.shape and not (isinstance(spec.shape[0], int) and spec.shape[0] >= 0)
    }
    # a dimension named like a batch dimension elsewhere (an RNN state's [layers, batch, hidden]) keeps equal to it
    batch_names = {spec.shape[0] for spec in inputs if (spec.name, 0) in batch_axes and isinstance(spec.shape[0], str)}
    batch_axes |= {
        (spec.name, axis) for spec in inputs for axis, dim in enumerate(spec.shape) if dim in batch_names and dim
    }
    capped = [
        {
            name: tuple(
                min(value, max_batch) if (name, axis) in batch_axes else value for axis, value in enumerate(shape)
            )
            for name, shape in probe.items()
        }
        for probe in probes
    ]
    return _unique(capped)


def _unique(probes: ProbeShapes) -> ProbeShapes:
    unique: ProbeShapes = []
    for probe in probes:
        if probe not in unique:
            unique.append(probe)
    return unique


def make_feed(
    inputs: Sequence[TensorSpec],
    shapes: Mapping[str, tuple[int, ...]],
    seed: int,
    hints: Mapping[str, Sequence[HintValue]] | None = None,
    variant: int = 0,
) -> dict[str, np.ndarray]:
    """Seeded inputs: floats ~ N(0, 1); integers in {0, 1} (valid token ids, masks and segment ids); bools random.
    An input with value hints (constants the model compares it with, see :func:`value_hints`) is filled with one
    of them instead, ``variant`` choosing which, so that probes take the branches the model was built for."""
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = shapes[spec.name]
        dtype = np.dtype(spec.dtype) if spec.dtype not in ("bfloat16",) else np.dtype("float32")
        choices = (hints or {}).get(spec.name)
        if choices:
            feed[spec.name] = np.full(shape, choices[variant % len(choices)], dtype=dtype)
        elif dtype.kind == "f":
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise WorkbenchError(
                f"input {spec.name!r} has type {spec.dtype}, which the equivalence check cannot generate.",
                expected="float, integer or bool inputs",
            )
    return feed


_COMPARISONS = frozenset({"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"})
_VALUE_PASSTHROUGH = frozenset({"Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten"})
MAX_HINTS = 4


def value_hints(model: onnx.ModelProto) -> dict[str, list[HintValue]]:
    """Values worth feeding to small fixed-size integer and bool graph inputs (scalars such as a sample rate or a
    mode flag): the constants the model compares them with (``Equal(sr, 16000)`` feeding an ``If``, in any
    subgraph), followed through Cast/Squeeze/Reshape-like nodes. A random integer would send such a model down a
    branch it rejects. Masks and token ids (dynamic shapes) keep random {0, 1}. Inputs with no hint are absent."""
    import onnx

    from workbench.clean.graph_utils import iter_graph_protos

    graphs = list(iter_graph_protos(model.graph))
    constants: dict[str, np.ndarray] = {}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for graph in graphs:
        for init in graph.initializer:
            if init.data_type != onnx.TensorProto.STRING and np.prod(init.dims, dtype=np.int64) <= 16:
                constants[init.name] = onnx.numpy_helper.to_array(init)
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value" and attr.t.data_type != onnx.TensorProto.STRING:
                        value = onnx.numpy_helper.to_array(attr.t)
                        if value.size <= 16:
                            constants[node.output[0]] = value
                    elif attr.name in ("value_int", "value_float"):
                        constants[node.output[0]] = np.array(onnx.helper.get_attribute_value(attr))
            for name in node.input:
                consumers.setdefault(name, []).append(node)
    initializers = {init.name for init in model.graph.initializer}
    hints: dict[str, list[HintValue]] = {}
    for spec in tensor_specs(model.graph.input, initializers):
        if np.dtype(spec.dtype if spec.dtype != "bfloat16" else "float32").kind not in "iub":
            continue
        if spec.is_dynamic or math.prod(int(dim) for dim in spec.shape if isinstance(dim, int)) > MAX_HINTS:
            continue  # only small fixed-size inputs (a sample rate, a mode flag): masks and ids stay random
        found: list[HintValue] = []
        frontier, seen = [spec.name], {spec.name}
        while frontier:
            name = frontier.pop()
            for node in consumers.get(name, []):
                if node.op_type in _VALUE_PASSTHROUGH and node.input and node.input[0] == name:
                    for out in node.output:
                        if out not in seen:
                            seen.add(out)
                            frontier.append(out)
                elif node.op_type in _COMPARISONS:
                    for other in node.input:
                        if other != name and other in constants:
                            for value in np.asarray(constants[other]).reshape(-1).tolist():
                                if value not in found:
                                    found.append(value)
        if found:
            hints[spec.name] = found[:MAX_HINTS]
    return hints


def check_batch(feed: Mapping[str, ArrayLike], inputs: Sequence[TensorSpec], label: str) -> dict[str, np.ndarray]:
    """One user batch made fit to feed (integer widths and float widths cast to the input's type), or a
    WorkbenchError naming the batch, the input and what was wrong with it."""
    names = [spec.name for spec in inputs]
    missing = [name for name in names if name not in feed]
    if missing:
        raise WorkbenchError(
            f"{label} lacks model input(s) {missing} (it has {sorted(feed)}).", expected=f"arrays keyed by {names}"
        )
    result: dict[str, np.ndarray] = {}
    for spec in inputs:
        array = np.asarray(feed[spec.name])
        want = np.dtype(spec.dtype if spec.dtype != "bfloat16" else "float32")
        if array.dtype.kind not in "iufb" or (array.dtype.kind == "f") != (want.kind == "f"):
            raise WorkbenchError(
                f"{label}: input {spec.name!r} is {array.dtype}, the model expects {want}.",
                expected=f"{want} values for {spec.name!r}",
            )
        if array.ndim != len(spec.shape) or any(
            isinstance(dim, int) and dim >= 0 and dim != got for dim, got in zip(spec.shape, array.shape)
        ):
            raise WorkbenchError(
                f"{label}: input {spec.name!r} has shape {list(array.shape)}, the model expects {list(spec.shape)}.",
                expected="the same rank and the model's fixed dimensions",
            )
        from workbench._arrays import cast_exactly

        result[spec.name] = cast_exactly(array, want, f"{label}: input {spec.name!r}")  # refuses values that wrap
    return result


def _describe_feed(feed: Mapping[str, np.ndarray]) -> str:
    parts = []
    for name, value in feed.items():
        text = f"{name}: {value.dtype} {list(value.shape)}"
        if value.dtype.kind in "iub" and value.size:
            low, high = value.min(), value.max()
            text += f" = {low}" if low == high else f" in [{low}, {high}]"
        parts.append(text)
    return ", ".join(parts)


def ort_session(
    model: onnx.ModelProto | bytes, external: Mapping[str, np.ndarray] | None = None
) -> ort.InferenceSession:
    """An ONNX Runtime CPU session with graph optimizations off, from a ModelProto or its serialized bytes;
    ``external``: arrays of the top-level initializers the model declares as external data."""
    from workbench.ort import cpu_session

    return cpu_session(
        model, what="the model under check (the input or a pass's result)", external_initializers=external
    )


EXTERNAL_LOCATION = "workbench-in-memory"  # never read: ONNX Runtime gets these arrays as external initializers


def split_large_initializers(model: onnx.ModelProto, threshold: int = 4096) -> Prepared:
    """(``model`` with its top-level numeric initializers over ``threshold`` bytes as data-free stubs, their
    arrays by name). The weights are copied once, never serialized; the model is not modified."""
    import onnx

    light = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(light, name, getattr(model, name))
    light.opset_import.extend(model.opset_import)
    light.metadata_props.extend(model.metadata_props)
    light.functions.extend(model.functions)
    source, graph = model.graph, light.graph
    graph.name, graph.doc_string = source.name, source.doc_string
    for name in ("node", "input", "output", "value_info", "sparse_initializer", "quantization_annotation"):
        getattr(graph, name).extend(getattr(source, name))
    external: dict[str, np.ndarray] = {}
    numeric = {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BOOL,
    }
    for init in source.initializer:
        if (
            init.data_type in numeric
            and init.HasField("raw_data")
            and math.prod(init.dims) * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize > threshold
            and init.data_location != onnx.TensorProto.EXTERNAL
        ):
            external[init.name] = onnx.numpy_helper.to_array(init)
            graph.initializer.append(onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims))
        else:
            graph.initializer.append(init)
    return light, external


def _external_view(model: onnx.ModelProto, external: Mapping[str, np.ndarray], *, as_inputs: bool) -> bytes:
    """``model`` serialized with its top-level initializers named in ``external`` declared as external data (for
    ONNX Runtime with the arrays as external initializers) or, ``as_inputs``, moved to the graph inputs (for
    onnx.checker, which wants external data in a file: the nodes are checked the same way)."""
    import onnx

    view = onnx.ModelProto()
    view.CopyFrom(model)
    graph = view.graph
    if as_inputs:
        stubs = [init for init in graph.initializer if init.name in external]
        kept = [init for init in graph.initializer if init.name not in external]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        declared = {inp.name for inp in graph.input}
        graph.input.extend(
            onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            for init in stubs
            if init.name not in declared
        )
    else:
        for init in graph.initializer:
            if init.name in external:
                init.data_location = onnx.TensorProto.EXTERNAL
                del init.external_data[:]
                init.external_data.add(key="location", value=EXTERNAL_LOCATION)
    return view.SerializeToString()


def compare_outputs(reference: np.ndarray, actual: np.ndarray, tolerance: str) -> tuple[bool, float, str | None]:
    """(ok, max_abs_diff, why not ok). NaN and inf must sit at the same places with the same values."""
    if reference.shape != actual.shape:
        return False, float("inf"), f"shape {actual.shape} != {reference.shape}"
    if reference.dtype != actual.dtype:
        return False, float("inf"), f"dtype {actual.dtype} != {reference.dtype}"
    if reference.dtype.kind not in "fc":
        equal = bool(np.array_equal(reference, actual))
        diff = (
            0.0
            if equal
            else float(np.max(np.abs(reference.astype(np.float64) - actual.astype(np.float64))))
            if reference.dtype.kind in "iub"
            else float("inf")
        )
        return equal, diff, None if equal else "integer/bool outputs differ"
    ref64, act64 = reference.astype(np.float64), actual.astype(np.float64)
    finite = np.isfinite(ref64) & np.isfinite(act64)
    same_special = np.array_equal(np.where(finite, 0, ref64), np.where(finite, 0, act64), equal_nan=True)
    diff = float(np.max(np.abs(ref64[finite] - act64[finite]))) if finite.any() else 0.0
    if not same_special:
        return False, diff if diff else float("inf"), "NaN/inf at different places"
    if tolerance == "exact":
        ok = bool(np.array_equal(ref64[finite], act64[finite]))
        return ok, diff, None if ok else f"not bit-exact (max abs diff {diff:.3g})"
    ok = bool(np.allclose(act64[finite], ref64[finite], rtol=RTOL, atol=ATOL))
    return ok, diff, None if ok else f"outside rtol {RTOL}/atol {ATOL} (max abs diff {diff:.3g})"


@dataclass
class CheckOutcome:
    ok: bool
    max_abs_diff: float | None
    failure: str | None
    inferred_model: onnx.ModelProto | None  # the candidate after strict shape inference (None if that failed)
    seconds: float
    outputs: list[list[np.ndarray]] | None = None  # the candidate's outputs per probe (when every check passed)
    candidate: Prepared | None = (
        None  # what was checked, for the caller to keep (the pipeline's light model and arrays)
    )


def _op_count(model: onnx.ModelProto, ops: frozenset[str]) -> int:
    return sum(1 for node in iter_node_protos(model.graph) if node.op_type in ops)


class EquivalenceChecker:
    """Holds what every check compares against: the original's I/O, Q/DQ and random-op counts, the feeds and the
    original's ORT outputs on them (computed once), and the last accepted model's outputs.

    Feeds: seeded probes at ``probe_shapes`` (integer inputs filled from ``hints``, by default
    :func:`value_hints`), plus ``extra_feeds``; or, when ``data_feeds`` (the user's own batches) are given, those
    alone. A user batch the original cannot run is an error, a generated probe it cannot run is dropped."""

    def __init__(
        self,
        original: onnx.ModelProto,
        probe_shapes: ProbeShapes,
        *,
        seed: int = 0,
        extra_feeds: Sequence[Mapping[str, np.ndarray]] = (),
        data_feeds: Sequence[Mapping[str, np.ndarray]] = (),
        data_label: str = "--data",
        hints: Mapping[str, Sequence[HintValue]] | None = None,
        search_sizes: bool = False,
    ) -> None:
        start = time.perf_counter()
        self.baseline_issues: list[str] = []
        self.inputs, self.outputs = io_specs(original)
        self.qdq_count = _op_count(original, QDQ_OPS)
        self.random_count = _op_count(original, RANDOM_OPS)
        self.run_checker = self.run_shape_inference = True
        light, external = split_large_initializers(original)  # serialize the weights never, copy them once
        try:
            self._checker(_external_view(light, external, as_inputs=True) if external else original)
        except Exception as error:
            self.run_checker = False
            self.baseline_issues.append(
                f"the original fails onnx.checker (full): {_first_line(error)}; that check is skipped"
            )
        try:
            self._strict_inference(light)
        except Exception as error:
            self.run_shape_inference = False
            self.baseline_issues.append(
                f"the original fails strict shape inference: {_first_line(error)}; that check is skipped"
            )
        session = (
            ort_session(_external_view(light, external, as_inputs=False), external)
            if external
            else ort_session(original)
        )
        self.output_names = [out.name for out in session.get_outputs()]
        self.feeds: list[dict[str, np.ndarray]] = []
        self.references: list[list[np.ndarray]] = []
        self.probe_shapes: ProbeShapes = []
        self.labels: dict[int, str] = {}  # id(probe shapes) -> how to name that probe in a failure
        self.hints = dict(hints) if hints is not None else value_hints(original)
        self.data_source = data_label if data_feeds else None
        candidates: list[tuple[dict[str, tuple[int, ...]], dict[str, np.ndarray], str | None]] = []
        if not data_feeds:
            candidates += [
                (dict(shapes), make_feed(self.inputs, shapes, seed + index, self.hints, index), None)
                for index, shapes in enumerate(probe_shapes)
            ]
        real = [(f"sample {index}", feed) for index, feed in enumerate(extra_feeds)]
        real += [(f"{data_label} batch {index}", feed) for index, feed in enumerate(data_feeds)]
        for batch_label, feed in real:
            checked = check_batch(feed, self.inputs, batch_label)
            candidates.append(({name: tuple(value.shape) for name, value in checked.items()}, checked, batch_label))
        failures: list[str] = []
        dropped: list[str] = []
        for shapes, feed, label in candidates:
            try:
                outputs: list[np.ndarray] = session.run(self.output_names, feed, quiet_run())
            except Exception as error:
                where = label or f"probe {_describe_feed(feed)}"
                if label is not None:
                    raise WorkbenchError(
                        f"the original model fails in ONNX Runtime on {label} ({_describe_feed(feed)}): "
                        f"{_ort_reason(error)}",
                        expected="inputs the original model accepts",
                    ) from None
                failures.append(f"{where}: {_ort_reason(error)}")
                dropped.append(
                    f"the original does not run at input shapes {shapes}: {_first_line(error)}; shape dropped"
                )
                continue
            self._keep_probe(shapes, feed, outputs, label)
        searched = ""
        if not self.feeds and search_sizes:
            searched = self._search(original, session, seed, failures)
        if not searched:
            self.baseline_issues.extend(dropped)
        if not self.feeds:
            hinted = ", ".join(f"{name} in {values}" for name, values in self.hints.items()) or "none found"
            raise WorkbenchError(
                "the original model runs in ONNX Runtime on none of the generated probe inputs, so equivalence "
                "cannot be checked. " + "; ".join(failures) + f". Value hints used: {hinted}.",
                expected="inputs the model accepts",
                hint="give real inputs with --data DIR (.npz batches keyed by input name, or .npy for a one-input "
                "model), or --profile shapes for every dynamic input, or switch the checks off with --no-check",
            )
        self.accepted_outputs = list(self.references)
        self.baseline_seconds = time.perf_counter() - start

    def _keep_probe(
        self,
        shapes: dict[str, tuple[int, ...]],
        feed: dict[str, np.ndarray],
        outputs: list[np.ndarray],
        label: str | None,
    ) -> None:
        self.probe_shapes.append(shapes)
        if label is not None:
            self.labels[id(shapes)] = label
        self.feeds.append(feed)
        self.references.append(outputs)

    def _search(self, original: onnx.ModelProto, session: ort.InferenceSession, seed: int, failures: list[str]) -> str:
        """When no default probe runs: probe shapes found by :func:`search_probe_shapes`, kept as probes; the note
        that says so goes to the baseline issues (returned; "" when none was found, and then the search's first and
        last failures are added to ``failures`` for the error)."""
        lower, sizes = size_hints(original)
        outputs_of: dict[str, tuple[dict[str, np.ndarray], list[np.ndarray]]] = {}

        def runs(shapes: dict[str, tuple[int, ...]]) -> str | None:
            feed = make_feed(self.inputs, shapes, seed + len(outputs_of), self.hints, len(outputs_of))
            try:
                outputs_of[repr(shapes)] = (feed, session.run(self.output_names, feed, quiet_run()))
            except Exception as error:
                return _ort_reason(error)
            return None

        found, search_failures = search_probe_shapes(self.inputs, runs, lower, sizes)
        for shapes in found:
            feed, outputs = outputs_of[repr(shapes)]
            self._keep_probe(shapes, feed, outputs, None)
        if not found:
            if search_failures:
                failures.append(
                    f"a search over larger sizes (from {lower}, up to {MAX_SEARCH_LENGTH}) found none either: "
                    + " ... ".join(dict.fromkeys([search_failures[0], search_failures[-1]]))
                )
            return ""
        note = (
            f"the original runs at none of the default probe shapes ({failures[0] if failures else 'no reason'}); "
            f"compared at shapes found by a search over sizes from {lower}: "
            + "; ".join(_format_shapes(shapes) for shapes in found)
        )
        self.baseline_issues.append(note)
        return note

    @staticmethod
    def _checker(model: onnx.ModelProto | bytes) -> None:
        import onnx

        onnx.checker.check_model(model, full_check=False)

    @staticmethod
    def _strict_inference(model: onnx.ModelProto) -> onnx.ModelProto:
        import onnx

        # full_check's strict inference, plus data propagation for shape tensors
        return onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)

    def check(
        self,
        candidate: onnx.ModelProto,
        tolerance: str,
        expected_io: IOSpecs | None = None,
        light: onnx.ModelProto | None = None,
        external: Mapping[str, np.ndarray] | None = None,
    ) -> CheckOutcome:
        """Run every check on ``candidate`` (``tolerance`` "none": all but the output comparison; the outcome's
        outputs are the candidate's, for :meth:`compare`). ``light`` (the same graph with weights as data-free stubs) lets
        shape inference skip serializing the weights. ``external``: ``candidate``'s top-level initializers with
        these names are data-free stubs and these are their arrays; ONNX Runtime reads them from memory (external
        initializers) and onnx.checker sees them as graph inputs, so the weights are never copied or serialized
        (the candidate is the same graph as its full export, weights stored apart)."""
        start = time.perf_counter()

        def fail(why: str, diff: float | None = None, inferred: onnx.ModelProto | None = None) -> CheckOutcome:
            return CheckOutcome(False, diff, why, inferred, time.perf_counter() - start)

        inputs, outputs = expected_io or (self.inputs, self.outputs)
        got_inputs, got_outputs = io_specs(candidate)
        if got_inputs != inputs:
            return fail(f"graph inputs changed: {[s.to_json() for s in got_inputs]} != {[s.to_json() for s in inputs]}")
        if got_outputs != outputs:
            return fail(
                f"graph outputs changed: {[s.to_json() for s in got_outputs]} != {[s.to_json() for s in outputs]}"
            )
        if _op_count(candidate, QDQ_OPS) != self.qdq_count:
            return fail(f"Q/DQ node count changed from {self.qdq_count} to {_op_count(candidate, QDQ_OPS)}")
        if _op_count(candidate, RANDOM_OPS) != self.random_count:
            return fail(f"random-op count changed from {self.random_count} to {_op_count(candidate, RANDOM_OPS)}")
        data = candidate.SerializeToString() if not external else _external_view(candidate, external, as_inputs=False)
        if self.run_checker:
            try:
                self._checker(data if not external else _external_view(candidate, external, as_inputs=True))
            except Exception as error:
                return fail(f"onnx.checker: {_first_line(error)}")
        inferred = None
        if self.run_shape_inference:
            try:
                inferred = self._strict_inference(light if light is not None else candidate)
            except Exception as error:
                return fail(f"strict shape inference: {_first_line(error)}")
        try:
            session = ort_session(data, external)
        except Exception as error:
            return fail(f"ONNX Runtime cannot load it: {_first_line(error)}", inferred=inferred)
        run_outputs: list[list[np.ndarray]] = []
        for shapes, feed in zip(self.probe_shapes, self.feeds):
            try:
                run_outputs.append(session.run(self.output_names, feed, quiet_run()))
            except Exception as error:
                return fail(f"ONNX Runtime fails at {self._where(shapes)}: {_first_line(error)}", inferred=inferred)
        if tolerance == "none":  # evaluate only: the caller compares (see compare)
            outcome = CheckOutcome(True, None, None, inferred, time.perf_counter() - start)
        else:
            ok, worst, why = self.compare(run_outputs, tolerance)
            outcome = CheckOutcome(ok, worst, why, inferred, time.perf_counter() - start)
        outcome.outputs = run_outputs
        return outcome

    def compare(
        self,
        outputs: Sequence[Sequence[np.ndarray]],
        tolerance: str,
        against: Sequence[Sequence[np.ndarray]] | None = None,
    ) -> tuple[bool, float, str | None]:
        """(ok, max abs diff, why not) of a candidate's outputs per probe. "exact": bit-exact against ``against``
        (default: the last accepted model's outputs; numeric drift of earlier folding does not accumulate into a
        failure); "numeric": within tolerance of the original's."""
        if tolerance == "exact":
            references = self.accepted_outputs if against is None else against
        else:
            references = self.references
        worst = 0.0
        for shapes, reference, got in zip(self.probe_shapes, references, outputs):
            for name, ref, act in zip(self.output_names, reference, got):
                ok, diff, why = compare_outputs(np.asarray(ref), np.asarray(act), tolerance)
                worst = max(worst, diff)
                if not ok:
                    return False, worst, f"output {name!r} at {self._where(shapes)}: {why}"
        return True, worst, None

    def accept(self, outcome: CheckOutcome) -> None:
        """The candidate behind ``outcome`` was kept: exact passes are compared with its outputs from now on."""
        if outcome.outputs is not None:
            self.accepted_outputs = outcome.outputs

    def _where(self, shapes: Mapping[str, tuple[int, ...]]) -> str:
        label = self.labels.get(id(shapes))
        return label if label else str(dict(shapes))


def quiet_run() -> ort.RunOptions:
    """ONNX Runtime run options that keep its logger quiet: a failing run is reported in our own error (its
    message kept), not also as red lines on the terminal."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal only
    return options


def _ort_reason(error: BaseException) -> str:
    """The innermost reason of an ONNX Runtime error (the failing node and its message), one line."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    marker = "Non-zero status code returned while running "
    if marker in text:
        text = text[text.rindex(marker) + len(marker) :]
    return text[:300]


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


# ------------------------------------------------------------------------------------------------ probe search

MAX_SEARCH_LENGTH = 16384  # longest size tried along a dynamic non-batch axis (a second of 16 kHz audio)
MAX_SEARCH_ELEMENTS = 1 << 22  # per input: a larger probe would cost more memory and time than it proves
SEARCH_SECONDS = 30.0
MAX_SEARCH_VARIANTS = 8  # ways of reading unnamed dims (length or batch) tried per size  # the search stops trying new sizes after this much time
SEARCH_LADDER = (128, 192, 256, 320, 384, 512, 640, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
_WINDOW_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"})
_SIZE_OPS = frozenset({"Slice", "Reshape"})


def size_hints(model: onnx.ModelProto) -> tuple[int, list[int]]:
    """(lower bound, sizes worth trying) for dynamic non-batch dimensions, read from the graph: a reflect/edge Pad
    needs an axis longer than its padding, a Conv or pooling window (dilated) must fit in its input; constants
    of Slice and Reshape (a frame length, a context window) are sizes the model may be built around."""
    import onnx

    from workbench.clean.graph_utils import iter_graph_protos

    constants: dict[str, np.ndarray] = {}
    weight_shapes: dict[str, tuple[int, ...]] = {}  # of initializers that may be Conv weights
    graphs = list(iter_graph_protos(model.graph))
    for graph in graphs:
        for init in graph.initializer:
            if init.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and math.prod(init.dims) <= 16:
                constants[init.name] = onnx.numpy_helper.to_array(init)
            elif len(init.dims) >= 3:
                weight_shapes[init.name] = tuple(int(d) for d in init.dims)
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value" and attr.t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
                        constants[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
    lower, sizes = 1, set[int]()
    for graph in graphs:
        for node in graph.node:
            attrs = {attr.name: onnx.helper.get_attribute_value(attr) for attr in node.attribute}
            if node.op_type == "Pad":
                mode = attrs.get("mode", b"constant")
                pads = attrs.get("pads")
                if pads is None and len(node.input) > 1 and node.input[1] in constants:
                    pads = constants[node.input[1]].reshape(-1).tolist()
                if mode in (b"reflect", b"edge", "reflect", "edge") and pads:
                    lower = max(lower, int(max(pads)) + 1)
            elif node.op_type in _WINDOW_OPS:
                kernel = list(attrs.get("kernel_shape", []))
                if not kernel and len(node.input) > 1 and node.input[1] in weight_shapes:
                    kernel = list(weight_shapes[node.input[1]][2:])
                dilations = list(attrs.get("dilations", [1] * len(kernel)))
                for size, dilation in zip(kernel, dilations):
                    lower = max(lower, (int(size) - 1) * int(dilation) + 1)
            elif node.op_type in _SIZE_OPS:
                for name in node.input[1:]:
                    if name in constants and constants[name].dtype.kind in "iu":
                        sizes.update(int(v) for v in constants[name].reshape(-1) if 1 < v <= MAX_SEARCH_LENGTH)
    return lower, sorted(sizes)


def _dim_keys(inputs: Sequence[TensorSpec]) -> dict[tuple[str, int], tuple[str, object]]:
    """(input, axis) of every dynamic dimension -> ("batch" or "length", the key dimensions sharing a value have)."""
    keys: dict[tuple[str, int], tuple[str, object]] = {}
    batch_names = {spec.shape[0] for spec in inputs if spec.shape and isinstance(spec.shape[0], str)}
    for spec in inputs:
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int) and dim >= 0:
                continue
            named = isinstance(dim, str) and dim not in ("?", "")
            key: object = dim if named else (spec.name, axis)
            batch = axis == 0 or (named and dim in batch_names)  # a state's [layers, batch, hidden] too
            keys[(spec.name, axis)] = ("batch" if batch else "length", key)
    return keys


def search_probe_shapes(
    inputs: Sequence[TensorSpec],
    runs: Callable[[dict[str, tuple[int, ...]]], str | None],
    lower: int,
    sizes: Sequence[int],
) -> tuple[ProbeShapes, list[str]]:
    """Probe shapes the model runs at, found by trying growing sizes for the dynamic non-batch dimensions.

    ``runs(shapes)``: None when the model runs at these shapes, else why not. Sizes from ``sizes`` and a ladder up
    to :data:`MAX_SEARCH_LENGTH` at or above ``lower`` are tried in order (within :data:`SEARCH_SECONDS`). An input's
    unnamed non-leading dynamic dimensions (an RNN state's batch axis, say) are tried as lengths and as batches,
    input by input, fewest batches first. The first size that runs gives the first probe at batch 1; the next sizes
    that run (at most two, batch 2) give the others. Returns (probe shapes, the failures seen)."""
    keys = _dim_keys(inputs)
    if not any(role == "length" for role, _ in keys.values()):
        return [], []  # only batch dimensions: no size to search
    # inputs with unnamed non-leading dynamic dims: each may hold a length or a batch there (an RNN state)
    unnamed = sorted({key[0] for role, key in keys.values() if role == "length" and isinstance(key, tuple)})
    variants = sorted(
        (frozenset(chosen) for chosen in _subsets(unnamed)), key=lambda chosen: (len(chosen), sorted(chosen))
    )[:MAX_SEARCH_VARIANTS]
    candidates = sorted({s for s in (*sizes, *SEARCH_LADDER) if lower <= s <= MAX_SEARCH_LENGTH})
    failures: list[str] = []
    start = time.perf_counter()

    def shapes_for(length: int, batch: int, batch_inputs: frozenset[str]) -> dict[str, tuple[int, ...]] | None:
        shapes: dict[str, tuple[int, ...]] = {}
        for spec in inputs:
            dims = []
            for axis, dim in enumerate(spec.shape):
                role, key = keys.get((spec.name, axis), ("fixed", None))
                if role == "fixed":
                    dims.append(int(dim))  # type: ignore[arg-type]
                elif role == "batch" or (spec.name in batch_inputs and isinstance(key, tuple)):
                    dims.append(batch)
                else:
                    dims.append(length)
            if math.prod(dims) > MAX_SEARCH_ELEMENTS:
                return None
            shapes[spec.name] = tuple(dims)
        return shapes

    found: ProbeShapes = []
    chosen: frozenset[str] | None = None
    misses_after_first = 0
    for length in candidates:
        if time.perf_counter() - start > SEARCH_SECONDS or len(found) == 3 or misses_after_first > 3:
            break
        for batch_inputs in variants if chosen is None else (chosen,):
            shapes = shapes_for(length, 1 if not found else 2, batch_inputs)
            if shapes is None:
                return found, failures  # larger sizes only grow
            why = runs(shapes)
            if why is None:
                found.append(shapes)
                chosen = batch_inputs
                break
            if not found:
                failures.append(f"{_format_shapes(shapes)}: {why}")
            else:
                misses_after_first += 1
    return _unique(found), failures


def _subsets(items: Sequence[str]) -> list[list[str]]:
    subsets: list[list[str]] = [[]]
    for item in items:
        subsets += [subset + [item] for subset in subsets]
    return subsets


def _format_shapes(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
