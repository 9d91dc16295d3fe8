"""The ONNX graph an engine was built from: the source model, or its precision rewrite (made again, checked by hash).

One place for both the build (:func:`precision_rewrite` gives the graph the builder parses) and everything that reads
an engine back (:func:`built_onnx`: the linter, the layer map of an older ``.layers.json``, the explorer, the report).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from workbench._io import sha256_bytes
from workbench.errors import WorkbenchError
from workbench.model import OnnxModel, load_onnx
from workbench.model.graph import fix_node_names, node_names_to_fix
from workbench.precision import PrecisionPlan
from workbench.precision.autocast import apply_precision_plan


def precision_rewrite(model: OnnxModel, plan: PrecisionPlan) -> onnx.ModelProto | None:
    """The graph the builder parses for ``plan``: None when that is ``model`` itself (FP32, no overrides, node names
    unique and printable; otherwise names are made so by :func:`~workbench.model.graph.fix_node_names`).

    TensorRT 10/11 are strongly typed, so precision lives in the graph: the AutoCast rewrite casts FP16 nodes and
    refuses INT8 on a graph without Q/DQ nodes (workbench.precision.autocast owns both rules).
    """
    bad_names = node_names_to_fix(model.proto)
    if plan.default == "fp32" and not plan.overrides and not bad_names:
        return None
    if plan.default == "fp32" and not plan.overrides:
        proto = onnx.ModelProto()
        proto.CopyFrom(model.proto)
    else:
        proto = apply_precision_plan(model, plan).proto
    # duplicate names would merge nodes in the layer map, a newline would cut TensorRT's line-based layer records
    fix_node_names(proto)
    return proto


def _plan_of(options: Mapping[str, Any]) -> PrecisionPlan:
    """The plan a build's recorded options realise: the explicit plan, or the precision applied to every node."""
    plan = options.get("plan")
    return PrecisionPlan.from_json(plan) if plan else PrecisionPlan(default=options.get("precision", "fp32"))


def built_onnx(document: Mapping[str, Any]) -> onnx.ModelProto | None:
    """The ONNX an engine was built from, from its ``.layers.json`` document: the source ONNX (unchanged since, by
    hash) or its precision rewrite made again and checked by hash. None when neither can be had."""
    build = document.get("build") or {}
    path = build.get("onnx")
    if not path or not Path(path).is_file():
        return None
    try:
        model = load_onnx(path, check=False)
        if model.sha256 != build.get("onnx_sha256"):
            return None  # the file changed since the build
        if build.get("built_onnx_sha256") in ("", None, build.get("onnx_sha256")):
            return model.proto
        proto = precision_rewrite(model, _plan_of(build.get("options") or {}))
    except WorkbenchError:
        return None
    if proto is None or sha256_bytes(proto.SerializeToString()) != build.get("built_onnx_sha256"):
        return None
    return proto
