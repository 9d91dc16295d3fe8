"""Result dataclasses of the cleaner: one :class:`PassReport` per pass, a :class:`CleanResult` per run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.artifact import NOT_SERIALIZED, Artifact, JsonObject

# Pass statuses. "accepted": changed the graph and passed every check. "unchanged": the pass found nothing
# to do (no check needed). "rolled_back": the pass raised or failed a check; the graph before it was kept.
# "unchecked": changed the graph and was kept without the equivalence checks (checks switched off).
# "report_only": an analysis pass (the Q/DQ lint) that never changes the graph.
PASS_STATUSES = ("accepted", "unchanged", "rolled_back", "unchecked", "report_only")


@dataclass(frozen=True)
class Finding(Artifact):
    """One problem a lint found: which rule, on which node, explained in words."""

    rule: str
    node: str
    message: str
    severity: str = "warning"  # "error": TensorRT rejects it; "warning": TensorRT accepts it but runs slower


@dataclass(frozen=True)
class PassReport(Artifact):
    """What one named pass did to the graph and whether it was proven harmless."""

    name: str
    status: str  # one of PASS_STATUSES
    nodes_before: int
    nodes_after: int
    op_counts_before: dict[str, int]
    op_counts_after: dict[str, int]
    bytes_before: int
    bytes_after: int
    seconds: float  # time of the pass itself
    check_seconds: float  # time of the checks after it
    max_abs_diff: float | None  # largest |cleaned - original| over every output and probe shape; None if not run
    nodes_removed: tuple[str, ...] = ()
    # nodes_before/after count the whole model; these count only the nodes inside If/Loop/Scan bodies
    subgraph_nodes_before: int = 0
    subgraph_nodes_after: int = 0
    nodes_added: tuple[str, ...] = ()
    tolerance: str = "exact"
    failure: str | None = None  # why the pass was rolled back
    findings: tuple[Finding, ...] = ()
    # with checks on, consecutive changed passes are proven together by one ONNX Runtime evaluation where the bars
    # allow (see workbench.clean.pipeline._PassRunner): the names of the passes proven by the same step (this one
    # included; empty when it was proven alone). max_abs_diff is the step's, check_seconds sit on its last pass.
    checked_with: tuple[str, ...] = ()
    # node-only snapshots (onnx.GraphProto without weights) for the before/after picture
    graph_before: Any = field(default=None, repr=False, compare=False, metadata=NOT_SERIALIZED)
    graph_after: Any = field(default=None, repr=False, compare=False, metadata=NOT_SERIALIZED)

    @property
    def changed(self) -> bool:
        return self.status in ("accepted", "unchecked")

    def op_count_delta(self) -> dict[str, int]:
        """Op type -> (after - before), only the op types whose count changed."""
        ops = set(self.op_counts_before) | set(self.op_counts_after)
        delta = {op: self.op_counts_after.get(op, 0) - self.op_counts_before.get(op, 0) for op in ops}
        return {op: d for op, d in sorted(delta.items(), key=lambda item: (item[1], item[0])) if d}


@dataclass(frozen=True)
class CleanResult(Artifact):
    """Summary of a whole cleaning run, plus the cleaned model in memory."""

    source: str
    passes: tuple[PassReport, ...]
    nodes_before: int
    nodes_after: int
    bytes_before: int
    bytes_after: int
    op_counts_before: dict[str, int]
    op_counts_after: dict[str, int]
    seconds: float  # whole run, checks included
    pass_seconds: float  # the passes alone
    check_seconds: float  # the checks alone (baseline reference outputs included)
    probe_shapes: tuple[dict[str, list[int]], ...]  # the input shapes the outputs were compared at
    baseline_issues: tuple[str, ...] = ()  # checks the original itself fails (skipped after)
    # nodes_before/after count the whole model; these count only the nodes inside If/Loop/Scan bodies
    subgraph_nodes_before: int = 0
    subgraph_nodes_after: int = 0
    data_source: str | None = None  # where the real check inputs came from (--data), None: generated probes
    checks_enabled: bool = True
    model: Any = field(default=None, repr=False, compare=False, metadata=NOT_SERIALIZED)  # the cleaned ModelProto

    @property
    def rolled_back(self) -> list[PassReport]:
        return [report for report in self.passes if report.status == "rolled_back"]

    @property
    def findings(self) -> list[Finding]:
        return [finding for report in self.passes for finding in report.findings]

    def report(self, name: str) -> PassReport:
        for report in self.passes:
            if report.name == name:
                return report
        raise KeyError(name)

    def to_json(self) -> JsonObject:
        # the names of the rolled-back passes, for a reader of the JSON alone; from_json ignores the key
        return super().to_json() | {"rolled_back": [report.name for report in self.rolled_back]}
