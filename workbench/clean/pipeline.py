"""Runs the named passes in order, checks each one and rolls back the ones that fail."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench.clean.checks import (
    EquivalenceChecker,
    cap_batch,
    default_probe_shapes,
    io_specs,
    probe_shapes_from_profile,
)
from workbench.clean.graph_utils import (
    apply_inferred_shapes,
    export_graph,
    import_graph,
    light_export,
    model_bytes,
    node_names,
    node_skeleton,
    op_counts,
    opset_of,
    prune_dead_nodes,
    toposort,
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
from workbench.model import PROTOBUF_LIMIT_BYTES, TensorSpec


@dataclass
class CleanOptions:
    """How to clean.

    ``passes``: names (or CleanPass objects) in order; None means DEFAULT_PASSES. ``input_shapes``: per input,
    one entry per dimension: an int pins it, a string names it (symbolic), None keeps it. ``profile``: TensorRT
    style ``{input: (min, opt, max)}`` shapes the outputs are compared at (default: batch 1/2/3, other dynamic
    dims 32/64/96). ``check``: run the equivalence checks after every pass.
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

    def resolved_passes(self) -> list[CleanPass]:
        chosen = DEFAULT_PASSES if self.passes is None else self.passes
        return [item if isinstance(item, CleanPass) else get_pass(item) for item in chosen]


def _load(model: Any) -> tuple[Any, str]:
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


def _same_graph(a: Any, b: Any) -> bool:
    """Same nodes, I/O and constants. ``b`` may be a full model and ``a`` a light one (weights as stubs): a
    stub never equals a full tensor, so the first light export after the original always counts as a change
    (harmless: it is checked)."""
    ga, gb = a.graph, b.graph
    if list(ga.node) != list(gb.node) or list(ga.input) != list(gb.input) or list(ga.output) != list(gb.output):
        return False
    if len(ga.initializer) != len(gb.initializer):
        return False
    by_name = {init.name: init for init in gb.initializer}
    return all(init.name in by_name and init == by_name[init.name] for init in ga.initializer)


@dataclass
class _Snapshot:
    """What the report needs about one state of the graph."""

    light: Any  # light ModelProto (weights as stubs), for change detection
    counts: dict[str, int]
    bytes: int
    names: list[str]
    skeleton: Any  # node-only GraphProto for the before/after picture

    @property
    def nodes(self) -> int:
        return len(self.light.graph.node)


def _tidy(graph: Any) -> None:
    prune_dead_nodes(graph)
    graph.cleanup(remove_unused_graph_inputs=False)
    toposort(graph)


def _restore(accepted_full: Any, original: Any, replay: list[CleanPass], context: PassContext) -> Any:
    """The graph as it was after the last kept pass. With checks on that model was exported; with checks off
    (no full export per pass, to stay fast) the kept passes are replayed on the original: they are deterministic."""
    if accepted_full is not None:
        return import_graph(accepted_full)
    graph = import_graph(original)
    for clean_pass in replay:
        context.shapes_fresh = False
        graph = clean_pass.run(graph, context) or graph
        _tidy(graph)
    return graph


def _names_diff(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    old, new = Counter(before), Counter(after)
    return sorted((old - new).elements()), sorted((new - old).elements())


def clean_model(model: Any, options: CleanOptions | None = None) -> CleanResult:
    """Clean ``model`` (path, OnnxModel or ModelProto; never modified) pass by pass and return the result,
    with the cleaned ModelProto in ``result.model``."""
    options = options or CleanOptions()
    run_start = time.perf_counter()
    original, source = _load(model)
    if original.ByteSize() >= options.max_model_bytes:
        raise WorkbenchError(
            f"{source}: the model is {original.ByteSize() / 1024**3:.2f} GiB; the cleaner keeps whole models in one "
            f"protobuf message, which cannot exceed 2 GiB.",
            expected="a model under 2 GiB",
            hint="clean a smaller export, or run polygraphy surgeon sanitize with --external-data-path",
        )
    passes = options.resolved_passes()
    opset = opset_of(original)
    inputs, outputs = io_specs(original)
    overrides = {name: list(dims) for name, dims in options.input_shapes.items()}
    overridden_inputs = _apply_overrides(inputs, overrides)
    if overrides and not any(p.run is get_pass("override_input_shapes").run for p in passes):
        raise WorkbenchError(
            "input-shape overrides were given but the override_input_shapes pass is not selected.",
            expected="override_input_shapes among the passes",
        )

    checker = None
    probe_shapes: list[dict[str, tuple[int, ...]]] = []
    check_seconds = 0.0
    if options.check:
        probes = (
            probe_shapes_from_profile(overridden_inputs, options.profile)
            if options.profile
            else default_probe_shapes(overridden_inputs)
        )
        probes = cap_batch(probes, overridden_inputs, options.max_probe_batch)
        checker = EquivalenceChecker(original, probes, seed=options.seed, extra_feeds=options.extra_feeds)
        probe_shapes = checker.probe_shapes
        check_seconds += checker.baseline_seconds
    expected_io = (inputs, outputs)

    context = PassContext(template=original, input_shapes=overrides, fold_size_threshold=options.fold_size_threshold)
    # One gs graph lives across passes. Per pass only a light export (weights as stubs) is made, for counting and
    # change detection; a full export only when the checks need the real model. A failed pass restores ``graph``
    # from the last accepted full model (checks on) or from a copy taken before the pass (checks off).
    graph = import_graph(original)
    accepted_full: Any = original  # last accepted model as a full ModelProto; None when only ``graph`` has it
    light, stub_bytes = light_export(graph, original)  # compare light with light
    current = _Snapshot(
        light, op_counts(original), model_bytes(original), node_names(original), node_skeleton(original)
    )
    shapes_fresh = False
    reports: list[PassReport] = []
    pass_seconds = 0.0
    replay: list[CleanPass] = []  # passes kept without a full export since the last one (checks off)

    def report(clean_pass: CleanPass, status: str, *, after: _Snapshot | None = None, **extra: Any) -> None:
        after = after or current
        removed, added = _names_diff(current.names, after.names) if after is not current else ([], [])
        extra.setdefault("tolerance", clean_pass.tolerance)
        extra.setdefault("findings", list(context.findings))
        reports.append(
            PassReport(
                clean_pass.name,
                status,
                nodes_before=current.nodes,
                nodes_after=after.nodes,
                op_counts_before=current.counts,
                op_counts_after=after.counts,
                bytes_before=current.bytes,
                bytes_after=after.bytes,
                nodes_removed=removed,
                nodes_added=added,
                graph_before=current.skeleton if after is not current else None,
                graph_after=after.skeleton if after is not current else None,
                **extra,
            )
        )

    for clean_pass in passes:
        context.findings = []
        no_check: dict[str, Any] = {"check_seconds": 0.0, "max_abs_diff": None}
        if opset < clean_pass.min_opset:
            report(
                clean_pass,
                "unchanged",
                seconds=0.0,
                failure=f"skipped: needs opset >= {clean_pass.min_opset}, model has {opset}",
                **no_check,
            )
            continue
        if clean_pass.name == "override_input_shapes" and not overrides:
            report(clean_pass, "unchanged", seconds=0.0, failure="skipped: no input shapes to override", **no_check)
            continue
        context.shapes_fresh = shapes_fresh
        start = time.perf_counter()
        try:
            returned = clean_pass.run(graph, context)
            graph = returned if returned is not None else graph
            if clean_pass.tolerance != "report":
                _tidy(graph)
                light, stub_bytes = light_export(graph, original)
        except WorkbenchError:
            raise  # the user's options are wrong (e.g. an override naming no input): stop, do not roll back silently
        except Exception as error:
            graph, shapes_fresh = _restore(accepted_full, original, replay, context), False
            seconds = time.perf_counter() - start
            pass_seconds += seconds
            message = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
            report(
                clean_pass,
                "rolled_back",
                seconds=seconds,
                failure=f"the pass raised {type(error).__name__}: {message}",
                **no_check,
            )
            continue
        seconds = time.perf_counter() - start
        pass_seconds += seconds
        if clean_pass.tolerance == "report":
            report(clean_pass, "report_only", seconds=seconds, **no_check)
            shapes_fresh = context.shapes_fresh
            continue
        if _same_graph(light, current.light):
            report(clean_pass, "unchanged", seconds=seconds, **no_check)
            shapes_fresh = context.shapes_fresh
            continue
        is_override = clean_pass.name == "override_input_shapes"
        wanted_io = (overridden_inputs, outputs) if is_override else expected_io
        after = _Snapshot(
            light, op_counts(light), model_bytes(light, stub_bytes), node_names(light), node_skeleton(light)
        )
        if checker is None:
            report(clean_pass, "unchecked", after=after, seconds=seconds, **no_check)
            accepted_full, current, shapes_fresh = None, after, False
            replay.append(clean_pass)
            continue
        check_start = time.perf_counter()
        candidate = export_graph(graph, original)
        outcome = checker.check(candidate, clean_pass.tolerance, wanted_io, light=light)
        check_time = time.perf_counter() - check_start
        check_seconds += check_time
        status = "accepted" if outcome.ok else "rolled_back"
        report(
            clean_pass,
            status,
            after=after,
            seconds=seconds,
            check_seconds=check_time,
            max_abs_diff=outcome.max_abs_diff,
            failure=outcome.failure,
        )
        if not outcome.ok:
            graph, shapes_fresh = import_graph(accepted_full), False
            continue
        if is_override:
            expected_io = wanted_io
        accepted_full, current = candidate, after
        replay.clear()
        shapes_fresh = outcome.inferred_model is not None
        if shapes_fresh:
            apply_inferred_shapes(graph, outcome.inferred_model)

    final = accepted_full if accepted_full is not None else export_graph(graph, original)
    return CleanResult(
        source=source,
        passes=reports,
        nodes_before=len(original.graph.node),
        nodes_after=len(final.graph.node),
        bytes_before=model_bytes(original),
        bytes_after=model_bytes(final),
        op_counts_before=op_counts(original),
        op_counts_after=op_counts(final),
        seconds=time.perf_counter() - run_start,
        pass_seconds=pass_seconds,
        check_seconds=check_seconds,
        probe_shapes=[{name: list(shape) for name, shape in probe.items()} for probe in probe_shapes],
        baseline_issues=list(checker.baseline_issues) if checker else [],
        checks_enabled=options.check,
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
