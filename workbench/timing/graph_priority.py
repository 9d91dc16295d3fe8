"""Instantiate a captured CUDA graph so that its kernels run at a chosen stream priority.

Why by hand: measured on an H200 (bench/priority_probe.py, bench/results/priority_probe_h200_2026-12-04.md), a graph
instantiated the usual way (torch's ``CUDAGraph``, ``cuGraphInstantiate(graph, 0)``) and launched into a
high-priority stream did not get ahead of a low-priority model's work: next to a saturating low-priority graph its
batch-1 compute went from 1.1 ms to 13 ms, the same as at equal priority, while the same model launched kernel by
kernel (eager) kept 3.7 ms. The CUDA API lets each kernel node carry its own priority
(``CU_LAUNCH_ATTRIBUTE_PRIORITY``) and ``CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`` makes the executable
graph use it, so lanes set every kernel node to their stream's priority and instantiate with that flag.
Neither torch nor cuda.core exposes this, hence the few driver calls (cuda.bindings).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.timing.lanes import _check as _ok  # (status, *values) -> values, raising on an error

if TYPE_CHECKING:
    from cuda.bindings import driver


def stream_priority(stream_handle: driver.CUstream | int) -> int:
    """The priority a stream was created with (0 = the default, lower = more urgent)."""
    from cuda.bindings import driver  # type: ignore[import-not-found]

    handle = stream_handle if isinstance(stream_handle, driver.CUstream) else driver.CUstream(int(stream_handle))
    return int(_ok(driver.cuStreamGetPriority(handle), "cuStreamGetPriority"))


def set_kernel_priorities(graph: driver.CUgraph | int, priority: int) -> int:
    """Give every kernel node of ``graph`` (a CUgraph or its raw address) the launch priority; returns how many."""
    from cuda.bindings import driver  # type: ignore[import-not-found]

    # cuda.bindings names the value type of kernel-node attributes CUkernelNodeAttrValue (older: CUlaunchAttributeValue)
    value = getattr(driver, "CUkernelNodeAttrValue", driver.CUlaunchAttributeValue)()
    value.priority = int(priority)
    return set_kernel_attribute(graph, driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PRIORITY, value)


def set_kernel_attribute(
    graph: driver.CUgraph | int, attribute: driver.CUlaunchAttributeID, value: driver.CUlaunchAttributeValue
) -> int:
    """Set one launch attribute (``CUlaunchAttributeID``) on every kernel node of ``graph``; returns how many."""
    from cuda.bindings import driver  # type: ignore[import-not-found]

    graph = graph if isinstance(graph, driver.CUgraph) else driver.CUgraph(int(graph))
    _nodes, count = _ok(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")
    nodes, _count = _ok(driver.cuGraphGetNodes(graph, int(count)), "cuGraphGetNodes")
    kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
    changed = 0
    for node in nodes:
        if _ok(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType") == kernel:
            _ok(driver.cuGraphKernelNodeSetAttribute(node, attribute, value), "cuGraphKernelNodeSetAttribute")
            changed += 1
    return changed


def instantiate_at_priority(graph: driver.CUgraph | int, priority: int) -> driver.CUgraphExec:
    """A CUgraphExec of ``graph`` whose kernels run at ``priority`` wherever it is launched."""
    from cuda.bindings import driver  # type: ignore[import-not-found]

    graph = graph if isinstance(graph, driver.CUgraph) else driver.CUgraph(int(graph))
    set_kernel_priorities(graph, priority)
    flag = driver.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
    return _ok(driver.cuGraphInstantiate(graph, int(flag)), "cuGraphInstantiate")


def destroy_exec(graph_exec: driver.CUgraphExec) -> None:
    from cuda.bindings import driver  # type: ignore[import-not-found]

    driver.cuGraphExecDestroy(graph_exec)
