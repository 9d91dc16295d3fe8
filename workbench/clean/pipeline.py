"""Runs the named passes in order, checks each one and rolls back the ones that fail."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from workbench.clean.checks import (
    CheckOutcome,
    EquivalenceChecker,
    IOSpecs,
    Prepared,
    cap_batch,
    default_probe_shapes,
    io_specs,
    probe_shapes_from_profile,
)
from workbench.clean.data import DEFAULT_CHECK_BATCHES, CheckData, load_check_batches
from workbench.clean.graph_utils import (
    Key,
    LightExporter,
    all_subgraphs,
    apply_inferred_shapes,
    copy_model_metadata,
    fill_stubs,
    import_graph,
    model_bytes,
    node_names,
    node_skeleton,
    op_counts,
    opset_of,
    prune_dead_nodes,
    subgraph_node_count,
    toposort,
    total_node_count,
)
from workbench.clean.passes import (
    DEFAULT_FOLD_SIZE_THRESHOLD,
    DEFAULT_PASSES,
    CleanPass,
    DimSpec,
    PassContext,
    get_pass,
)
from workbench.clean.report import CleanResult, PassReport
from workbench.errors import WorkbenchError
from workbench.log import get_logger
from workbench.model import PROTOBUF_LIMIT_BYTES, TensorSpec

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from workbench.model import OnnxModel
    from workbench.zoo.base import ZooEntry

LOG = get_logger(__name__)

# the last accepted model: the original, a checked (light model, arrays) pair, or None (only the gs graph has it)
Accepted: TypeAlias = "onnx.ModelProto | Prepared | None"


@dataclass
class CleanOptions:
    """How to clean.

    ``passes``: names (or CleanPass objects) in order; None means DEFAULT_PASSES. ``input_shapes``: per input,
    one entry per dimension: an int pins it, a string names it (symbolic), None keeps it. ``profile``: TensorRT
    style ``{input: (min, opt, max)}`` shapes the outputs are compared at (default: batch 1/2/3, other dynamic
    dims 32/64/96). ``check``: run the equivalence checks after every pass. ``data``: the user's own inputs for
    every check instead of generated probes (a folder of .npz/.npy batches, one file, ``"zoo"`` with
    ``data_entry``, or a list of feeds), at most ``check_batches`` of them. Without ``data``, integer inputs of
    the generated probes take the model's value hints (:func:`workbench.clean.checks.value_hints`).
    """

    passes: Sequence[str | CleanPass] | None = None
    input_shapes: Mapping[str, Sequence[DimSpec]] = field(default_factory=dict)
    profile: Mapping[str, Sequence[Sequence[int]]] | None = None
    check: bool = True
    fold_size_threshold: int | None = DEFAULT_FOLD_SIZE_THRESHOLD
    seed: int = 0
    extra_feeds: Sequence[Mapping[str, np.ndarray]] = ()  # real samples to compare on, besides the seeded ones
    max_model_bytes: int = PROTOBUF_LIMIT_BYTES
    max_probe_batch: int | None = 2  # cap on the batch dimension of the probe shapes (None: the profile's own)
    data: CheckData | None = None  # real inputs for the checks: folder / file / "zoo" / list of feeds
    check_batches: int = DEFAULT_CHECK_BATCHES  # at most this many batches of ``data`` are compared
    data_entry: ZooEntry | None = None  # the zoo entry for data="zoo"

    def resolved_passes(self) -> list[CleanPass]:
        chosen = DEFAULT_PASSES if self.passes is None else self.passes
        return [item if isinstance(item, CleanPass) else get_pass(item) for item in chosen]


def _load(model: str | os.PathLike[str] | OnnxModel | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model, "<in-memory model>"
    if hasattr(model, "proto") and hasattr(model, "path"):  # OnnxModel
        return model.proto, str(model.path)
    if isinstance(model, (str, os.PathLike)):
        from workbench.model import load_onnx

        return load_onnx(model).proto, str(model)
    raise WorkbenchError(
        f"cannot clean a {type(model).__name__}.",
        expected="a path to an .onnx file, an OnnxModel or an onnx.ModelProto",
    )


def _apply_overrides(
    inputs: tuple[TensorSpec, ...], overrides: Mapping[str, Sequence[DimSpec]]
) -> tuple[TensorSpec, ...]:
    result = []
    for spec in inputs:
        dims = overrides.get(spec.name)
        if dims is None:
            result.append(spec)
            continue
        if len(dims) != len(spec.shape):
            raise WorkbenchError(
                f"input-shape override for {spec.name!r} has {len(dims)} dimensions but the input has rank {len(spec.shape)}.",
                expected=f"{len(spec.shape)} entries (int to pin, name to keep symbolic, None to keep)",
            )
        result.append(
            TensorSpec(spec.name, spec.dtype, tuple(old if new is None else new for old, new in zip(spec.shape, dims)))
        )
    unknown = sorted(set(overrides) - {spec.name for spec in inputs})
    if unknown:
        raise WorkbenchError(
            f"input-shape override names {unknown}, which are not graph inputs.",
            expected=f"names among {[s.name for s in inputs]}",
        )
    return tuple(result)


@dataclass
class _Snapshot:
    """What the report needs about one state of the graph."""

    light: onnx.ModelProto  # light ModelProto (weights as stubs), or the original model
    fingerprint: Key  # LightExporter.fingerprint of the graph: equal fingerprints, equal graphs
    counts: dict[str, int]
    bytes: int
    names: list[str]
    skeleton: onnx.GraphProto  # node-only GraphProto for the before/after picture

    @property
    def nodes(self) -> int:
        """Nodes in the whole model, subgraph nodes included."""
        return total_node_count(self.light)

    @property
    def subgraph_nodes(self) -> int:
        return subgraph_node_count(self.light)


def _tidy(graph: gs.Graph) -> bool:
    """Drop dead nodes and sort, bodies included; True when that changed any graph's node list (model-local
    functions included: graphsurgeon's cleanup drops their dead nodes too, and the fingerprint covers them)."""
    graphs = [graph, *all_subgraphs(graph)]
    before = [list(sub.nodes) for sub in graphs + list(graph.functions)]
    for sub in graphs:
        prune_dead_nodes(sub)
    graph.cleanup(remove_unused_graph_inputs=False)
    toposort(graph)
    after = [graph, *all_subgraphs(graph), *graph.functions]
    return len(after) != len(before) or any(
        len(sub.nodes) != len(nodes) or any(a is not b for a, b in zip(sub.nodes, nodes))
        for sub, nodes in zip(after, before)
    )


def run_pass(clean_pass: CleanPass, graph: gs.Graph, context: PassContext) -> gs.Graph:
    """Run ``clean_pass`` on the top-level graph, then (unless the pass says not to) on every If/Loop/Scan body,
    outer bodies first; the subgraph list is taken afresh after the top level (a pass may inline or remove
    subgraphs). Returns the top-level graph."""
    context.root = None
    graph = clean_pass.run(graph, context) or graph
    if clean_pass.recurse:
        try:
            context.root = graph
            for sub in all_subgraphs(graph):
                clean_pass.run(sub, context)
        finally:
            context.root = None
    return graph


def _restore(accepted: Accepted, original: onnx.ModelProto, replay: list[CleanPass], context: PassContext) -> gs.Graph:
    """The graph as it was after the last kept pass. With checks on that model was checked (``accepted``: a full
    ModelProto, or a light one with the arrays of its stubs); with checks off (no export per pass, to stay fast)
    the kept passes are replayed on the original: they are deterministic."""
    if isinstance(accepted, tuple):
        return import_graph(fill_stubs(*accepted))
    if accepted is not None:
        return import_graph(accepted)
    graph = import_graph(original)
    for clean_pass in replay:
        context.shapes_fresh = False
        graph = run_pass(clean_pass, graph, context)
        _tidy(graph)
    return graph


def _names_diff(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    old, new = Counter(before), Counter(after)
    return sorted((old - new).elements()), sorted((new - old).elements())


def _load_within_limit(
    model: str | os.PathLike[str] | OnnxModel | onnx.ModelProto, max_model_bytes: int
) -> tuple[onnx.ModelProto, str, int]:
    """(model, where it came from, its model_bytes)."""
    original, source = _load(model)
    size = model_bytes(original)
    # model_bytes (weights and nodes) is a fast lower bound; upb's exact ByteSize encodes the whole model
    if size >= max_model_bytes // 2 and original.ByteSize() >= max_model_bytes:
        raise WorkbenchError(
            f"{source}: the model is {original.ByteSize() / 1024**3:.2f} GiB; the cleaner keeps whole models in one "
            f"protobuf message, which cannot exceed 2 GiB.",
            expected="a model under 2 GiB",
            hint="clean a smaller export, or run polygraphy surgeon sanitize with --external-data-path",
        )
    return original, source, size


def _make_checker(
    original: onnx.ModelProto, inputs: tuple[TensorSpec, ...], options: CleanOptions
) -> EquivalenceChecker | None:
    """The checker with the original's reference outputs at the probe shapes, or None with checks off."""
    if not options.check:
        return None
    probes = probe_shapes_from_profile(inputs, options.profile) if options.profile else default_probe_shapes(inputs)
    probes = cap_batch(probes, inputs, options.max_probe_batch)
    data_feeds: list[dict[str, np.ndarray]] = []
    label = "--data"
    if options.data is not None:
        data_feeds, label = load_check_batches(
            options.data, io_specs(original)[0], options.check_batches, options.data_entry
        )
    return EquivalenceChecker(
        original,
        probes,
        seed=options.seed,
        extra_feeds=options.extra_feeds,
        data_feeds=data_feeds,
        data_label=label,
        search_sizes=not options.profile,  # sizes the user chose are kept as they are
    )


def _snapshot(light: onnx.ModelProto, fingerprint: Key, stub_bytes: int = 0) -> _Snapshot:
    return _Snapshot(
        light, fingerprint, op_counts(light), model_bytes(light, stub_bytes), node_names(light), node_skeleton(light)
    )


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


class _ReportPassChangedGraph(RuntimeError):
    """A pass of tolerance "report" changed the graph: nothing would prove that change, so it is rolled back."""


@dataclass
class _Deferred:
    """A pass that ran while a group of changed passes waits for its one check (reported once it is decided)."""

    clean_pass: CleanPass
    status: str  # "changed" (to be proven), "unchanged" or "report_only"
    before: _Snapshot
    after: _Snapshot
    seconds: float
    findings: tuple
    failure: str | None = None  # set only for a skipped pass: why
    checkpoint: Prepared | None = (
        None  # (light model, arrays) of the graph right after this pass, where the tolerance changes
    )


class _PassRunner:
    """Runs passes in order on one graph, proves them, keeps what a rollback needs and a report per pass.

    Mutable on purpose: it is the loop state of one cleaning run (never returned). One gs graph lives across
    passes. After a pass its fingerprint (no export) tells whether it changed anything; only a changed graph is
    exported, light (weights as stubs, unchanged nodes' protos reused), for counting and for the checks, which
    hand the weights to ONNX Runtime from memory.

    With checks on, changed passes wait and are proven together (:meth:`_resolve`): a step over several passes
    is kept when its result is bit-exact to the last accepted model's outputs, or, for numeric passes only, within
    tolerance of the original's: the bars of one check per pass ("exact" passes bit-exact, "numeric" ones within
    tolerance). Where the tolerance changes a light export of the graph is kept as a checkpoint, so a group that
    is not bit-exact as a whole is proven in steps without running passes again. If no step can be proven (or a
    pass raises while others wait) the graph goes back to the last accepted model and the remaining passes run
    again one at a time, each checked, so a failing pass is rolled back alone. The input-shape override is
    always checked alone. A failed pass restores ``graph`` from the last accepted model (checks on) or by
    replaying the kept passes on the original (checks off).
    """

    def __init__(
        self,
        original: onnx.ModelProto,
        checker: EquivalenceChecker | None,
        context: PassContext,
        overridden: tuple[TensorSpec, ...],
        original_bytes: int,
    ) -> None:
        self.original = original
        self.checker = checker
        self.context = context
        self.exporter = LightExporter()
        context.exporter = self.exporter
        inputs, outputs = io_specs(original)
        self.expected_io = (inputs, outputs)
        self.overridden_io = (overridden, outputs)
        self.graph = import_graph(original)
        # the last accepted model: the original ModelProto, a (light model, {stub name: array}) pair once a
        # checked pass was kept, or None when only ``graph`` has it (checks off)
        self.accepted: Accepted = original
        self.current = _Snapshot(
            original,
            self.exporter.fingerprint(self.graph),
            op_counts(original),
            original_bytes,
            node_names(original),
            node_skeleton(original),
        )
        self.accepted_snapshot = self.current  # the snapshot of ``accepted`` (checks on)
        self.pending: list[_Deferred] = []  # passes since the last check, waiting for the next one
        self.pending_tolerance: str | None = None
        self.strict = False  # one check per pass (while a failed group is proven again pass by pass)
        self._prepared: tuple[_Snapshot, Prepared] | None = None  # (state, its _prepare()) for _prepare_current
        self.shapes_fresh = False
        self.replay: list[CleanPass] = []  # passes kept without a check since the last checked one (checks off)
        self.reports: list[PassReport] = []
        self.pass_seconds = 0.0
        self.check_seconds = checker.baseline_seconds if checker is not None else 0.0

    def report(
        self,
        clean_pass: CleanPass,
        status: str,
        *,
        after: _Snapshot | None = None,
        before: _Snapshot | None = None,
        **extra: Any,
    ) -> None:
        before = before or self.current
        after = after or before
        changed = after is not before
        removed, added = _names_diff(before.names, after.names) if changed else ([], [])
        extra.setdefault("tolerance", clean_pass.tolerance)
        extra.setdefault("findings", tuple(self.context.findings))
        extra.setdefault("check_seconds", 0.0)
        extra.setdefault("max_abs_diff", None)
        self.reports.append(
            PassReport(
                clean_pass.name,
                status,
                nodes_before=before.nodes,
                nodes_after=after.nodes,
                subgraph_nodes_before=before.subgraph_nodes,
                subgraph_nodes_after=after.subgraph_nodes,
                op_counts_before=before.counts,
                op_counts_after=after.counts,
                bytes_before=before.bytes,
                bytes_after=after.bytes,
                nodes_removed=tuple(removed),
                nodes_added=tuple(added),
                graph_before=before.skeleton if changed else None,
                graph_after=after.skeleton if changed else None,
                **extra,
            )
        )

    def skip_reason(self, clean_pass: CleanPass, opset: int) -> str | None:
        if opset < clean_pass.min_opset:
            return f"skipped: needs opset >= {clean_pass.min_opset}, model has {opset}"
        if clean_pass.name == "override_input_shapes" and not self.context.input_shapes:
            return "skipped: no input shapes to override"
        return None

    def skip(self, clean_pass: CleanPass, reason: str) -> None:
        self.context.findings = []
        if self.pending:
            self.pending.append(_Deferred(clean_pass, "unchanged", self.current, self.current, 0.0, (), reason))
        else:
            self.report(clean_pass, "unchanged", seconds=0.0, failure=reason)

    def _grouped(self) -> bool:
        return self.checker is not None and not self.strict

    def run(self, clean_pass: CleanPass) -> None:
        """Apply one pass, then keep it (proven, or unchecked with checks off) or roll it back, and report it
        (with checks on, possibly later: see the class notes)."""
        is_override = clean_pass.name == "override_input_shapes"
        prepared = None
        if (
            self._grouped()
            and self.pending
            and clean_pass.tolerance != "report"  # never changes the graph (undone if it does): no checkpoint
            and (is_override or clean_pass.tolerance != self.pending_tolerance)
        ):
            # where the tolerance changes, keep the graph as it is (a light export, cheap): a checkpoint the group's
            # proof can fall back on (see _resolve), or the state to prove before the override is checked alone
            prepared = self._prepare_current()
        self.context.findings = []
        self.context.shapes_fresh = self.shapes_fresh
        start = time.perf_counter()
        try:
            after = self._apply(clean_pass)
        except WorkbenchError:
            raise  # the user's options are wrong (e.g. an override naming no input): stop, do not roll back silently
        except Exception as error:
            self.pass_seconds += time.perf_counter() - start
            if self.pending:  # others wait for a check: prove them one by one, then this pass alone
                self._fall_back(self.pending + [_Deferred(clean_pass, "changed", self.current, self.current, 0, ())])
                return
            self._restore()
            seconds = time.perf_counter() - start
            failure = (
                str(error)
                if isinstance(error, _ReportPassChangedGraph)
                else f"the pass raised {type(error).__name__}: {_first_line(error)}"
            )
            self.report(clean_pass, "rolled_back", seconds=seconds, failure=failure)
            return
        seconds = time.perf_counter() - start
        self.pass_seconds += seconds
        if after is None or after is self.current:
            status = "report_only" if after is None else "unchanged"
            self.shapes_fresh = self.context.shapes_fresh
            if self.pending:
                findings = tuple(self.context.findings)
                self.pending.append(_Deferred(clean_pass, status, self.current, self.current, seconds, findings))
            else:
                self.report(clean_pass, status, seconds=seconds)
            return
        if self.checker is None:
            self.report(clean_pass, "unchecked", after=after, seconds=seconds)
            self.accepted, self.current, self.shapes_fresh = None, after, False
            self.replay.append(clean_pass)
            return
        record = _Deferred(clean_pass, "changed", self.current, after, seconds, tuple(self.context.findings))
        if is_override and prepared is not None and not self._resolve(prepared, then=record):
            return  # the group failed: it and this pass were proven again one by one
        if not self._grouped() or is_override:
            self._check_and_keep(clean_pass, after, seconds)
            return
        if prepared is not None:
            next(r for r in reversed(self.pending) if r.status == "changed").checkpoint = prepared
        self.pending.append(record)
        self.pending_tolerance = clean_pass.tolerance
        self.current, self.shapes_fresh = after, False

    def finish(self) -> None:
        """Prove the passes still waiting for a check."""
        if self.pending:
            self._resolve()

    def _apply(self, clean_pass: CleanPass) -> _Snapshot | None:
        """Run the pass on the graph: None for a report-only pass, ``self.current`` when the graph is unchanged,
        else a snapshot of the new graph (from its light export)."""
        self.graph = run_pass(clean_pass, self.graph, self.context)
        fingerprint = self.exporter.fingerprint(self.graph)
        if clean_pass.tolerance == "report":
            if fingerprint != self.current.fingerprint:  # unproven and unreported: undone (see run's except)
                raise _ReportPassChangedGraph("a report-only pass changed the graph")
            return None
        if fingerprint == self.current.fingerprint:
            return self.current  # untouched: it is as tidy as it was
        if _tidy(self.graph):
            fingerprint = self.exporter.fingerprint(self.graph)
            if fingerprint == self.current.fingerprint:
                return self.current  # what it changed was dead code
        light, stub_bytes, _ = self.exporter.export(self.graph, self.original)
        return _snapshot(light, fingerprint, stub_bytes)

    def _prepare_current(self) -> Prepared:
        """:meth:`_prepare`, made once per graph state (unchanged passes keep the state)."""
        if self._prepared is None or self._prepared[0] is not self.current:
            self._prepared = (self.current, self._prepare())
        return self._prepared[1]

    def _prepare(self) -> Prepared:
        """What a check of the graph as it is now runs: its light export with value_info, body constants with
        their data, and the top-level stubs' arrays (handed to ONNX Runtime from memory)."""
        candidate, _, stubs = self.exporter.export(self.graph, self.original, value_info=True, stub_bodies=False)
        arrays = {name: np.asarray(tensor.values) for name, tensor in stubs.items()}
        for array in arrays.values():
            # the checked (and kept) state shares these arrays with the graph: a later pass that writes into one
            # in place (which the fingerprint would not see) fails loudly and is rolled back instead
            array.flags.writeable = False
        return candidate, arrays

    def _prove(
        self, tolerance: str, wanted_io: IOSpecs, light: onnx.ModelProto, prepared: Prepared | None = None
    ) -> tuple[CheckOutcome, float]:
        """Check the graph as it is now (or as ``prepared`` holds it): (outcome, seconds)."""
        assert self.checker is not None
        check_start = time.perf_counter()
        candidate, arrays = prepared if prepared is not None else self._prepare()
        outcome = self.checker.check(candidate, tolerance, wanted_io, light=light, external=arrays)
        outcome.candidate = (candidate, arrays)
        check_time = time.perf_counter() - check_start
        self.check_seconds += check_time
        return outcome, check_time

    def _keep(self, outcome: CheckOutcome, after: _Snapshot, graph_moved_on: bool = False) -> None:
        assert self.checker is not None
        self.checker.accept(outcome)
        self.accepted, self.current, self.accepted_snapshot = outcome.candidate, after, after
        self.replay.clear()
        inferred = outcome.inferred_model
        self.shapes_fresh = inferred is not None and not graph_moved_on
        if inferred is not None and self.shapes_fresh:
            apply_inferred_shapes(self.graph, inferred)

    def _check_and_keep(self, clean_pass: CleanPass, after: _Snapshot, seconds: float) -> None:
        is_override = clean_pass.name == "override_input_shapes"
        wanted_io = self.overridden_io if is_override else self.expected_io
        outcome, check_time = self._prove(clean_pass.tolerance, wanted_io, after.light)
        self.report(
            clean_pass,
            "accepted" if outcome.ok else "rolled_back",
            after=after,
            seconds=seconds,
            check_seconds=check_time,
            max_abs_diff=outcome.max_abs_diff,
            failure=outcome.failure,
        )
        if not outcome.ok:
            self._restore()
            return
        if is_override:
            self.expected_io = wanted_io
        self._keep(outcome, after)

    def _resolve(self, prepared: Prepared | None = None, then: _Deferred | None = None) -> bool:
        """Prove the waiting group (the graph now, or as ``prepared`` holds it before ``then`` ran) with as few
        ONNX Runtime evaluations as the bars allow; on failure, the rest again pass by pass. False when it fell back.

        The states to reach are the checkpoints (where the tolerance changes) and the group's end. A step from
        the last accepted state to a later one is proven when the later state's outputs are bit-exact to the
        accepted state's (any passes), or within tolerance of the original's (numeric passes only): the bars of
        one check per pass, for the step's passes together. The furthest provable state is taken first, so a group
        whose result is bit-exact costs one evaluation, and one ending in non-bit-exact fusions two.
        """
        assert self.checker is not None
        pending, self.pending = self.pending, []
        changed = [record for record in pending if record.status == "changed"]
        if not changed:
            for record in pending:
                self._report_deferred(record)
            return True
        states: list[tuple[int, Prepared, _Snapshot]] = [  # (index in changed, (light model, arrays), snapshot)
            (index, record.checkpoint, record.after)
            for index, record in enumerate(changed[:-1])
            if record.checkpoint is not None
        ]
        states.append((len(changed) - 1, prepared if prepared is not None else self._prepare(), self.current))
        evaluated: dict[int, CheckOutcome] = {}
        position, queue, spent = -1, list(pending), 0.0

        def evaluate(index: int, candidate: Prepared, light: onnx.ModelProto) -> CheckOutcome:
            nonlocal spent
            if index not in evaluated:
                outcome, seconds = self._prove("none", self.expected_io, light, candidate)
                evaluated[index], spent = outcome, spent + seconds
            return evaluated[index]

        failure: tuple[str | None, float | None] = (None, None)
        while position < len(changed) - 1:
            step = None
            for index, candidate, snapshot in reversed([state for state in states if state[0] > position]):
                outcome = evaluate(index, candidate, snapshot.light)
                if not outcome.ok or outcome.outputs is None:
                    failure = (outcome.failure, None)
                    continue
                passes = changed[position + 1 : index + 1]
                numeric = all(record.clean_pass.tolerance == "numeric" for record in passes)
                ok, diff, why = self.checker.compare(outcome.outputs, "numeric" if numeric else "exact")
                if ok:
                    step = (index, outcome, snapshot, diff, passes)
                    break
                failure = (why, diff)
            if step is None:
                break
            index, outcome, snapshot, diff, passes = step
            names = tuple(record.clean_pass.name for record in passes) if len(passes) > 1 else ()
            while queue:  # report the step's passes and the unchanged ones among them, in order
                record = queue.pop(0)
                if record.status != "changed":
                    self._report_deferred(record)
                    continue
                last = record is passes[-1]
                self._report_deferred(
                    record,
                    status="accepted",
                    check_seconds=spent if last else 0.0,
                    max_abs_diff=diff,
                    checked_with=names,
                )
                if last:
                    break
            spent = 0.0
            moved_on = prepared is not None or index != len(changed) - 1
            self._keep(outcome, snapshot, graph_moved_on=moved_on)
            position = index
        if position == len(changed) - 1:
            for record in queue:  # unchanged passes after the group's last change
                self._report_deferred(record)
            return True
        rest = queue + ([then] if then is not None else [])
        single = len(rest) == 1 and rest[0].status == "changed" and then is None and len(evaluated) == 1
        if single:  # one pass checked alone failed: it is rolled back, nothing to prove again
            record = rest[0]
            self._report_deferred(
                record, status="rolled_back", check_seconds=spent, max_abs_diff=failure[1], failure=failure[0]
            )
            self._restore()
            return True
        self._fall_back(rest)
        return False

    def _report_deferred(self, record: _Deferred, status: str | None = None, **extra: Any) -> None:
        self.report(
            record.clean_pass,
            status or record.status,
            before=record.before,
            after=record.after,
            seconds=record.seconds,
            findings=record.findings,
            **({"failure": record.failure} | extra),
        )

    def _fall_back(self, records: list[_Deferred]) -> None:
        """Back to the last accepted model, then the records' passes again, each proven on its own."""
        self.pending = []
        self._restore()
        self.strict = True
        try:
            for record in records:
                if record.failure is not None:  # a skipped pass
                    self.report(record.clean_pass, "unchanged", seconds=0.0, failure=record.failure)
                else:
                    self.run(record.clean_pass)
        finally:
            self.strict = False

    def _restore(self) -> None:
        self.graph = _restore(self.accepted, self.original, self.replay, self.context)
        self.shapes_fresh = False
        if self.checker is not None:
            self.current = self.accepted_snapshot
        self.current.fingerprint = self.exporter.fingerprint(self.graph)  # new objects, same graph

    def final_model(self) -> onnx.ModelProto:
        """The last accepted model as it was checked (weights filled in), or with checks off the graph's export."""
        if isinstance(self.accepted, tuple):
            return copy_model_metadata(fill_stubs(*self.accepted), self.original)
        if self.accepted is not None:
            return self.accepted
        # checks off: the light export (unchanged nodes' protos reused) with the weights filled in
        candidate, _, stubs = self.exporter.export(self.graph, self.original, value_info=True, stub_bodies=False)
        arrays = {name: tensor.values for name, tensor in stubs.items()}
        return copy_model_metadata(fill_stubs(candidate, arrays), self.original)


def clean_model(
    model: str | os.PathLike[str] | OnnxModel | onnx.ModelProto, options: CleanOptions | None = None
) -> CleanResult:
    """Clean ``model`` (path, OnnxModel or ModelProto; never modified) pass by pass and return the result,
    with the cleaned ModelProto in ``result.model``."""
    options = options or CleanOptions()
    run_start = time.perf_counter()
    original, source, original_bytes = _load_within_limit(model, options.max_model_bytes)
    passes = options.resolved_passes()
    overrides = {name: list(dims) for name, dims in options.input_shapes.items()}
    overridden_inputs = _apply_overrides(io_specs(original)[0], overrides)
    if overrides and not any(p.run is get_pass("override_input_shapes").run for p in passes):
        raise WorkbenchError(
            "input-shape overrides were given but the override_input_shapes pass is not selected.",
            expected="override_input_shapes among the passes",
        )
    checker = _make_checker(original, overridden_inputs, options)
    context = PassContext(template=original, input_shapes=overrides, fold_size_threshold=options.fold_size_threshold)
    runner = _PassRunner(original, checker, context, overridden_inputs, original_bytes)
    opset = opset_of(original)
    for clean_pass in passes:
        skipped = runner.skip_reason(clean_pass, opset)
        if skipped:
            runner.skip(clean_pass, skipped)
        else:
            runner.run(clean_pass)
    runner.finish()
    final = runner.final_model()
    for report in runner.reports:
        LOG.info("pass %s: %s", report.name, report.status)
    return CleanResult(
        source=source,
        passes=tuple(runner.reports),
        nodes_before=total_node_count(original),
        nodes_after=total_node_count(final),
        subgraph_nodes_before=subgraph_node_count(original),
        subgraph_nodes_after=subgraph_node_count(final),
        bytes_before=original_bytes,
        bytes_after=model_bytes(final),
        op_counts_before=op_counts(original),
        op_counts_after=op_counts(final),
        seconds=time.perf_counter() - run_start,
        pass_seconds=runner.pass_seconds,
        check_seconds=runner.check_seconds,
        probe_shapes=tuple(
            {name: list(shape) for name, shape in probe.items()} for probe in (checker.probe_shapes if checker else [])
        ),
        baseline_issues=tuple(checker.baseline_issues) if checker else (),
        checks_enabled=options.check,
        data_source=(checker.data_source if checker is not None else None),
        model=final,
    )


def clean_file(
    input_path: str | os.PathLike[str], output_path: str | os.PathLike[str], options: CleanOptions | None = None
) -> CleanResult:
    """Clean ``input_path`` into ``output_path`` (written atomically; the input is never touched)."""
    from workbench._io import write_bytes_atomic

    input_path, output_path = Path(input_path), Path(output_path)
    if output_path.exists() and input_path.exists() and output_path.resolve() == input_path.resolve():
        raise WorkbenchError(
            f"{output_path}: the output would overwrite the input model.", expected="a different output path"
        )
    result = clean_model(input_path, options)
    write_bytes_atomic(output_path, result.model.SerializeToString())
    return result
