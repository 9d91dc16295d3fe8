"""Groups of fallback candidates that move together: what TensorRT fuses into one layer, and model blocks.

A search that reverts single nodes can split what the engine runs as one kernel (a residual Add fused into its
Conv's epilogue; a GEMM made of several ONNX MatMuls) and pays for it in reformats and standalone Q/DQ kernels. The
groups here come from the layer map of a **real build** of the all-INT8 model (TensorRT-RTX builds on CPU):

* candidates (INT8 Conv/ConvTranspose/Gemm/MatMul, residual Adds with a quantized skip) that share a math layer
  (convolution / GEMM kernel) are one group;
* a candidate that is not a math node (the residual Add) joins the math candidates of the pointwise layer that
  computes it (the Conv epilogue it was fused into).

A Myelin kernel that holds one Conv's epilogue together with the next Conv's input quantization does not join the
two: reverting the second Conv removes a Q from that kernel but leaves the first one INT8.

:func:`block_groups` merges fusion groups by model block (name scope such as ``/_blocks.3`` or
``/encoder/layer.2``): fewer, coarser groups, the block-wise stage of Intel Neural Compressor's tuning.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.artifact import Artifact

MATH_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
_NUMBERED = re.compile(r"[._](\d+)$")


@dataclass(frozen=True)
class PrecisionGroup(Artifact):
    """Fallback candidates that change precision together, and the engine layers that execute them."""

    name: str
    nodes: tuple[str, ...]  # in topological order
    ops: tuple[str, ...]
    layers: tuple[str, ...] = ()  # engine layers of the all-INT8 build that hold these nodes
    block: str = ""
    why: str = "own layer"  # "fused in layer L" / "own layer" / "block B" / "no layer map"


def block_of(node_name: str) -> str:
    """The model block a node belongs to: the name scope up to its first numbered component.

    ``/_blocks.3/_expand_conv/Conv`` -> ``/_blocks.3``; ``/encoder/layer.2/attention/self/query/MatMul`` ->
    ``/encoder/layer.2``; a name with no numbered scope -> its parent scope (``/_conv_head/Conv`` -> ``/_conv_head``).
    """
    parts = node_name.strip("/").split("/")
    for index, part in enumerate(parts[:-1]):
        if _NUMBERED.search(part):
            return "/" + "/".join(parts[: index + 1])
    return "/" + "/".join(parts[:-1]) if len(parts) > 1 else ""


class _UnionFind:
    def __init__(self, items: Iterable[str]) -> None:
        self.parent = {item: item for item in items}

    def find(self, item: str) -> str:
        while self.parent[item] != item:
            self.parent[item] = self.parent[self.parent[item]]
            item = self.parent[item]
        return item

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def fusion_groups(
    candidates: Sequence[str], ops: Mapping[str, str], layer_map: Any | None = None
) -> list[PrecisionGroup]:
    """Group ``candidates`` (topological order; ``ops`` maps node -> op type) by the fusions in ``layer_map``.

    Without a layer map every candidate is its own group (``why="no layer map"``).
    """
    from workbench.engine.layermap import MATH_LAYER_TYPES

    order = {name: index for index, name in enumerate(candidates)}
    union = _UnionFind(candidates)
    why: dict[str, str] = {}
    layers_of: dict[str, list[str]] = {name: [] for name in candidates}
    if layer_map is not None:
        for layer in layer_map.layers:
            present = [n for n in layer.onnx_nodes if n in order]
            for name in present:
                layers_of[name].append(layer.name)
            math_nodes = [n for n in present if ops.get(n) in MATH_OPS]
            if layer.layer_type.lower() in MATH_LAYER_TYPES:
                joined = math_nodes
            else:
                others = [n for n in present if ops.get(n) not in MATH_OPS]
                joined = others + math_nodes if others else []
            for name in joined[1:]:
                if union.find(name) != union.find(joined[0]):
                    why[name] = why[joined[0]] = f"fused in layer {layer.name}"
                union.union(joined[0], name)
    members: dict[str, list[str]] = {}
    for name in candidates:
        members.setdefault(union.find(name), []).append(name)
    groups = []
    for nodes in sorted(members.values(), key=lambda m: order[m[0]]):
        nodes.sort(key=order.__getitem__)
        layers = tuple(dict.fromkeys(layer for n in nodes for layer in layers_of[n]))
        reason = next((why[n] for n in nodes if n in why), "own layer" if layer_map is not None else "no layer map")
        groups.append(
            PrecisionGroup(
                name=nodes[0],
                nodes=tuple(nodes),
                ops=tuple(ops.get(n, "") for n in nodes),
                layers=layers,
                block=block_of(nodes[0]),
                why=reason,
            )
        )
    return groups


def block_groups(groups: Sequence[PrecisionGroup]) -> list[PrecisionGroup]:
    """Merge fusion groups that lie in one model block (fusion groups are never split)."""
    merged: dict[str, list[PrecisionGroup]] = {}
    for group in groups:
        merged.setdefault(group.block or group.name, []).append(group)
    result = []
    for block, parts in merged.items():
        nodes = tuple(n for g in parts for n in g.nodes)
        result.append(
            PrecisionGroup(
                name=block,
                nodes=nodes,
                ops=tuple(o for g in parts for o in g.ops),
                layers=tuple(dict.fromkeys(layer for g in parts for layer in g.layers)),
                block=block,
                why=f"block {block} ({len(parts)} fusion group(s))",
            )
        )
    return result
