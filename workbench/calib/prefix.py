"""Prefix cache: a plan's task evaluation reuses the activations of a base plan up to the first node it changes.

A precision search evaluates many Q/DQ models that differ from one base model (the all-INT8 plan) in a few groups.
Everything computed before the first changed node is the same in both, so it is computed once: the base model runs
over the evaluation set once and keeps, per batch, the tensors that cross a few **cuts** (positions in the
topological order of the FP32 graph, at fusion-group starts). A later plan runs only its **suffix**: the nodes at
or after the latest cut before its first change, fed the cached tensors.

Correctness does not rest on the plan's description: the prefix of the plan's Q/DQ model (the original nodes before
the cut, and the inserted Q/DQ / Cast nodes that only they read) must be node for node and initializer for
initializer the base model's prefix, or an earlier cut is used (zero-Pad moves and Concat-shared scales can change a
prefix node's quantization). The suffix run is ONNX Runtime with optimizations off, exactly like the full run, so
the per-sample outputs are the same (``tests/test_format_search.py`` checks the metric and every score).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from workbench.errors import WorkbenchError
from workbench.model.graph import subgraph_reads

if TYPE_CHECKING:
    import onnx

    from workbench.calib.qdq import QdqModel
    from workbench.zoo.base import Label, MetricResult, Prediction

DEFAULT_BUDGET_BYTES = 1 << 30
MAX_CUTS = 12
EVAL_BATCH = 8  # the zoo's evaluation batch (ZooEntry.evaluate's default), so batches match the base run's
MIN_SAMPLES = 64  # a stop rule is asked from this many samples on
StopRule = Callable[[Any], bool]


def _fingerprint(feed: Mapping[str, np.ndarray]) -> str:
    """A cheap identity of one evaluation batch (shapes and a strided sample of every input)."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(feed):
        array = np.ascontiguousarray(feed[name])
        digest.update(name.encode() + str(array.shape).encode() + str(array.dtype).encode())
        digest.update(array.ravel()[:: max(1, array.size // 4096)].tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class _Cut:
    position: int  # index in the FP32 graph's topological order: nodes before it are the prefix
    tensors: tuple[str, ...]  # FP32-graph tensors made before it and read at or after it


def _node_signature(node: onnx.NodeProto, initializers: Mapping[str, onnx.TensorProto]) -> bytes:
    """A node's definition with the values of the initializers it reads (two models' nodes compare by this)."""
    parts = [node.SerializeToString(deterministic=True)]
    parts += [initializers[name].SerializeToString(deterministic=True) for name in node.input if name in initializers]
    return b"\x00".join(parts)


class PrefixCache:
    """Evaluate Q/DQ models of one session by reusing a base model's activations up to their first change."""

    def __init__(
        self,
        session: Any,
        base_proto: Any,
        *,
        limit: int | None = None,
        cut_nodes: Sequence[str] = (),
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
    ) -> None:
        if session.entry is None:
            raise WorkbenchError("a prefix cache needs a task metric.", expected="a session made from a zoo model")
        self.session = session
        self.limit = limit
        self.base_proto = getattr(base_proto, "proto", base_proto)
        fp32 = session.prepared
        self.order = {node.name: index for index, node in enumerate(fp32.graph.node)}
        self.graph_inputs = [i.name for i in fp32.graph.input]
        produced_at = {out: self.order[node.name] for node in fp32.graph.node for out in node.output}
        last_read: dict[str, int] = {}
        for node in fp32.graph.node:
            for name in node.input:
                if name in produced_at:
                    last_read[name] = max(last_read.get(name, -1), self.order[node.name])
        for output in fp32.graph.output:  # the result reads every graph output: a later cut keeps one made before it
            if output.name in produced_at:
                last_read[output.name] = len(fp32.graph.node)
        positions = sorted({self.order[n] for n in cut_nodes if n in self.order and self.order[n] > 0})
        cuts = [
            _Cut(p, tuple(t for t, made in produced_at.items() if made < p and last_read.get(t, -1) >= p))
            for p in positions
        ]
        self.cuts = self._within_budget(cuts, budget_bytes)
        self.stored: dict[str, list[np.ndarray]] = {}
        self.fingerprints: list[str] = []
        self.base_outputs: tuple[list[Prediction], list[Label], list[int]] | None = None
        self.base_result = self._run_base()
        self.last_cut: int = 0  # the cut the latest evaluation started from (0: a full run)

    def _within_budget(self, cuts: list[_Cut], budget: int) -> list[_Cut]:
        """At most :data:`MAX_CUTS` cuts spread over the graph, latest first (they save the most), whose tensors fit
        ``budget`` bytes over the evaluation set."""
        import onnx

        inferred = onnx.shape_inference.infer_shapes(self.session.prepared)
        shapes = {
            info.name: [d.dim_value if d.dim_value > 0 else 1 for d in info.type.tensor_type.shape.dim]
            for info in list(inferred.graph.value_info) + list(inferred.graph.input)
        }
        size = int(self.session.entry.split_size("evaluation"))  # not an FP32 run just to count the samples
        samples = max(1, min(size, self.limit) if self.limit is not None else size)
        if len(cuts) > MAX_CUTS:
            picks = sorted({int(round(i)) for i in np.linspace(0, len(cuts) - 1, MAX_CUTS)})
            cuts = [cuts[i] for i in picks]
        chosen: list[_Cut] = []
        used = 0
        tensors: set[str] = set()
        for cut in sorted(cuts, key=lambda c: -c.position):
            extra = [t for t in cut.tensors if t not in tensors]
            size = sum(4 * samples * int(np.prod(shapes.get(t, [1 << 20])[1:] or [1])) for t in extra)
            if len(chosen) >= MAX_CUTS or used + size > budget:
                continue
            chosen.append(cut)
            used += size
            tensors.update(extra)
        return sorted(chosen, key=lambda c: c.position)

    def _run_base(self) -> MetricResult:
        """Run the base model once over the evaluation set, keeping every cut's tensors per batch."""
        result = self._run(self.base_proto, None, record_batches=True)
        self.stored = self._pending
        self.base_outputs = self._pending_outputs
        return result

    def _run(
        self, proto: onnx.ModelProto, cut: _Cut | None, *, record_batches: bool = False, stop: StopRule | None = None
    ) -> MetricResult:
        """The task metric of ``proto`` run from ``cut`` (None: from the graph inputs); the tensors of the later
        cuts are kept in ``_pending`` (they become the cache when the model is adopted as the new base).

        ``stop(partial)`` sees the metric of the samples run so far after every batch from :data:`MIN_SAMPLES` on;
        True ends the run there (the result then covers those samples only, ``details["stopped_early"]``)."""
        from workbench.ort import cpu_session

        start = cut.position if cut is not None else 0
        keep = sorted({t for c in self.cuts if c.position > start for t in c.tensors})
        model = self._suffix_model(proto, cut) if cut is not None else proto
        outputs = [o.name for o in model.graph.output]
        session = cpu_session(model, extra_outputs=keep, what="a plan's Q/DQ model" if cut is None else "its suffix")
        names = [i.name for i in session.get_inputs()]
        pending: dict[str, list[np.ndarray]] = {name: [] for name in keep}
        batch = iter(range(1 << 62))

        def predict(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            index = next(batch)
            if record_batches:
                self.fingerprints.append(_fingerprint(feed))
            elif index >= len(self.fingerprints) or _fingerprint(feed) != self.fingerprints[index]:
                raise WorkbenchError(
                    "the evaluation batches changed since the prefix cache was filled.",
                    expected="the same evaluation set and limit",
                )
            inputs = {name: feed[name] if name in feed else self.stored[name][index] for name in names}
            values = dict(zip(outputs + keep, session.run(outputs + keep, inputs)))
            for name in keep:
                pending[name].append(values[name])
            return {name: values[name] for name in outputs}

        entry = self.session.entry
        predictions: list[Prediction] = []
        labels: list[Label] = []
        indices: list[int] = []
        stopped = False
        for feed, batch_labels, batch_indices in entry._batches("evaluation", self.limit, EVAL_BATCH):
            predictions.extend(entry._reduce(predict(feed), feed))
            labels.extend(batch_labels)
            indices.extend(batch_indices)
            if stop is not None and len(indices) >= MIN_SAMPLES and stop(entry._metric(predictions, labels, indices)):
                stopped = True
                break
        result = entry._metric(predictions, labels, indices)
        if stopped:
            result.details["stopped_early"] = True
        self._pending = pending if not stopped else {}
        self._pending_proto = proto
        # the per-sample predictions: a whole-set evaluation of this model runs only the samples after them
        self._pending_outputs = (predictions, labels, indices) if not stopped else None
        return result

    @property
    def last_outputs(self) -> tuple[list[Prediction], list[Label], list[int]] | None:
        """(predictions, labels, indices) of the latest evaluation (None when it stopped early)."""
        return getattr(self, "_pending_outputs", None)

    def adopt(self) -> None:
        """Make the model evaluated last the new base (a search kept it): later plans reuse its activations."""
        if not self._pending and any(c.position > self.last_cut for c in self.cuts):
            raise WorkbenchError("the last evaluation stopped early: it cannot become the base.")
        self.stored = {**self.stored, **self._pending}
        self.base_proto = self._pending_proto
        self.base_outputs = self._pending_outputs

    # ------------------------------------------------------------------------------------------------ a plan's run
    def _prefix(self, proto: onnx.ModelProto, position: int) -> set[str]:
        """Names of the nodes of ``proto`` that belong before the cut at ``position``."""
        consumers: dict[str, list[str]] = {}
        for node in proto.graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node.name)
        prefix = {n.name for n in proto.graph.node if self.order.get(n.name, position) < position}
        for node in reversed(proto.graph.node):  # inserted Q/DQ and Casts: prefix when only prefix nodes read them
            if node.name in self.order:
                continue
            readers = [c for out in node.output for c in consumers.get(out, [])]
            if readers and all(r in prefix for r in readers):
                prefix.add(node.name)
        return prefix

    def _same_prefix(self, proto: onnx.ModelProto, position: int) -> bool:
        mine, base = self._prefix(proto, position), self._prefix(self.base_proto, position)
        if mine != base:
            return False
        inits = {i.name: i for i in proto.graph.initializer}
        base_inits = {i.name: i for i in self.base_proto.graph.initializer}
        base_nodes = {n.name: n for n in self.base_proto.graph.node if n.name in base}
        return all(
            _node_signature(node, inits) == _node_signature(base_nodes[node.name], base_inits)
            for node in proto.graph.node
            if node.name in mine
        )

    def _suffix_model(self, proto: onnx.ModelProto, cut: _Cut) -> onnx.ModelProto:
        import onnx
        from onnx import helper

        prefix = self._prefix(proto, cut.position)
        nodes = [n for n in proto.graph.node if n.name not in prefix]
        read = {name for node in nodes for name in node.input if name}
        read |= subgraph_reads(nodes)  # what If/Loop bodies take from the outer scope
        made = {out for node in nodes for out in node.output}
        read |= {output.name for output in proto.graph.output} - made  # made in the prefix: passed through
        inits = [i for i in proto.graph.initializer if i.name in read]
        init_names = {i.name for i in inits}
        inputs = [i for i in proto.graph.input if i.name in read and i.name not in init_names]
        boundary = sorted(read - made - init_names - {i.name for i in inputs})
        missing = [t for t in boundary if t not in cut.tensors]
        if missing:
            raise KeyError(missing[0])
        inputs += [helper.make_tensor_value_info(t, self._elem_type(t), None) for t in boundary]
        graph = helper.make_graph(nodes, proto.graph.name, inputs, list(proto.graph.output), inits)
        model = helper.make_model(graph, opset_imports=list(proto.opset_import))
        model.ir_version = proto.ir_version
        del onnx
        return model

    def _elem_type(self, tensor: str) -> int:
        from onnx import helper

        return helper.np_dtype_to_tensor_dtype(self.stored[tensor][0].dtype)

    def evaluate(
        self, model: QdqModel | onnx.ModelProto, first_change: str | None = None, stop: StopRule | None = None
    ) -> MetricResult:
        """The task metric of ``model`` (a Q/DQ model of this session), from the latest usable cut before
        ``first_change`` (an FP32-graph node name; None: try every cut, latest first); ``stop`` as in :meth:`_run`."""
        proto = cast("onnx.ModelProto", getattr(model, "proto", model))
        limit_position = self.order.get(first_change, len(self.order)) if first_change else len(self.order)
        for cut in reversed(self.cuts):
            if cut.position > limit_position or not self._same_prefix(proto, cut.position):
                continue
            try:
                self._suffix_model(proto, cut)
            except KeyError:  # it reads a tensor this cut did not keep
                continue
            self.last_cut = cut.position
            return self._run(proto, cut, stop=stop)
        self.last_cut = 0
        return self._run(proto, None, stop=stop)
