"""Stage 0: an ONNX model loaded and checked (:class:`OnnxModel`), and the graph facts every stage shares."""

from workbench.model.graph import (
    QDQ_OPS,
    has_qdq,
    is_constant,
    name_unnamed_nodes,
    onnx_node_list,
    onnx_node_name,
    producer,
    qdq_edges,
    subgraph_node_count,
)
from workbench.model.onnx_model import (
    PROTOBUF_LIMIT_BYTES,
    OnnxModel,
    TensorSpec,
    load_onnx,
    shape_template,
    tensor_specs,
)

__all__ = [
    "shape_template",
    "PROTOBUF_LIMIT_BYTES",
    "QDQ_OPS",
    "OnnxModel",
    "TensorSpec",
    "has_qdq",
    "is_constant",
    "load_onnx",
    "name_unnamed_nodes",
    "onnx_node_list",
    "onnx_node_name",
    "producer",
    "qdq_edges",
    "subgraph_node_count",
    "tensor_specs",
]
