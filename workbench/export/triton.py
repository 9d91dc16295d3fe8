"""Triton Inference Server model repository for a TensorRT plan: ``config.pbtxt`` from Triton's own
``inference.ModelConfig`` protobuf schema (:mod:`workbench._vendor.triton_model_config`), validated by parsing it back.

Whether a Triton server loads the plan is not verified here (no Triton and no GPU on our machines); Triton's TensorRT
backend loads engines of full TensorRT of the same version, not TensorRT-RTX engines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError

if TYPE_CHECKING:
    from workbench.timing.serving.config import ServeConfig

_TRITON_TYPES = {
    "float": "TYPE_FP32",
    "half": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "int32": "TYPE_INT32",
    "int64": "TYPE_INT64",
    "bool": "TYPE_BOOL",
    "fp32": "TYPE_FP32",
    "fp16": "TYPE_FP16",
}


@dataclass
class TritonOptions:
    model_name: str = "model"
    max_batch_size: int | None = None  # None: the max of the batch dimension's optimization profile, 0 if static
    instance_count: int = 1
    dynamic_batching: bool = True
    max_queue_delay_microseconds: int = 100
    preferred_batch_sizes: tuple[int, ...] = ()
    # Serving settings (see from_serving); None / () leaves Triton's defaults.
    max_queue_size: int | None = None  # dynamic_batching.default_queue_policy: requests beyond it are rejected
    queue_timeout_microseconds: int | None = None  # ... and requests waiting longer are rejected (REJECT)
    rate_limiter_priority: int | None = None  # instance_group.rate_limiter.priority (1 = scheduled most often)
    cuda_graph_batch_sizes: tuple[int, ...] = ()  # optimization.cuda graphs, one graph_spec per batch size
    version_policy_latest: int | None = None  # version_policy.latest.num_versions (hot reload: serve the newest)

    def __post_init__(self) -> None:
        import re

        from workbench.errors import WorkbenchError

        name = self.model_name
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", name):
            raise WorkbenchError(
                f"Triton model name {name!r} is not a plain folder name.",
                expected="letters, digits, '_', '.', '-' (no '/', no '..'), at most 128 characters",
            )
        if self.max_batch_size is not None and not 0 <= int(self.max_batch_size) <= 2**31 - 1:
            raise WorkbenchError(f"Triton max_batch_size {self.max_batch_size} is out of range.", expected="0..2**31-1")
        if not 1 <= int(self.instance_count) <= 4096:
            raise WorkbenchError(f"Triton instance count {self.instance_count} is out of range.", expected="1..4096")

    @classmethod
    def from_serving(cls, config: ServeConfig, model_name: str = "model", versions: int = 1) -> TritonOptions:
        """Triton settings for a :class:`workbench.timing.serving.ServeConfig` (e.g. an SLA search's choice).

        lanes -> instance_group count; max_batch -> max_batch_size; max_queue_delay_ms -> max_queue_delay_microseconds;
        queue_capacity -> default_queue_policy.max_queue_size; timeout_ms -> default_timeout_microseconds (REJECT);
        priority -> rate_limiter priority (high 1, normal 2, low 4); bucket sizes -> one CUDA graph_spec each;
        hot reload -> version_policy latest (``versions`` kept loaded).
        """
        from workbench.timing.serving.config import TRITON_PRIORITY

        return cls(
            model_name=model_name,
            max_batch_size=int(config.max_batch),
            instance_count=int(config.lanes),
            dynamic_batching=True,
            max_queue_delay_microseconds=int(round(config.max_queue_delay_ms * 1000)),
            max_queue_size=int(config.queue_capacity),
            queue_timeout_microseconds=None if config.timeout_ms is None else int(round(config.timeout_ms * 1000)),
            rate_limiter_priority=TRITON_PRIORITY[config.priority],
            cuda_graph_batch_sizes=tuple(config.bucket_sizes()),
            version_policy_latest=int(versions),
        )


def triton_config(
    io_tensors: Sequence[Mapping[str, Any]], options: TritonOptions, parameters: Mapping[str, str] | None = None
) -> str:
    """``config.pbtxt`` text for a TensorRT plan with these I/O tensors (``.layers.json`` ``io_tensors`` entries).

    ``parameters``: string facts for whoever deploys it (Triton's ``parameters`` map, which the TensorRT backend
    ignores), e.g. an FP8 engine's precision and the compute capability it needs."""
    from google.protobuf import text_format

    from workbench._vendor.triton_model_config import model_config_class

    if not io_tensors:
        raise WorkbenchError(
            "the engine's I/O tensors are unknown, so no Triton config can be written.",
            expected="a .layers.json with an 'io_tensors' list (written by `workbench build`)",
        )
    inputs = [io for io in io_tensors if str(io.get("io_mode", "")).lower() == "input"]
    outputs = [io for io in io_tensors if str(io.get("io_mode", "")).lower() == "output"]
    batch_max = _batch_max(inputs)
    max_batch = options.max_batch_size if options.max_batch_size is not None else batch_max
    if max_batch and batch_max == 0:
        raise WorkbenchError(
            f"max batch size {max_batch} asked for, but the engine's inputs have no dynamic batch dimension.",
            expected="--max-batch 0 (or omitted) for engines with static shapes",
        )
    if batch_max and max_batch > batch_max:  # Triton would send batches the engine's profile refuses
        raise WorkbenchError(
            f"max batch size {max_batch} is above the engine profile's maximum batch {batch_max}.",
            expected=f"--max-batch between 0 and {batch_max} (or omitted), or rebuild with a larger profile",
        )
    config = model_config_class()()
    config.name = options.model_name
    config.platform = "tensorrt_plan"
    config.max_batch_size = int(max_batch)
    for io, target in [(io, config.input) for io in inputs] + [(io, config.output) for io in outputs]:
        entry = target.add()
        entry.name = str(io["name"])
        datatype = str(io.get("datatype", "")).lower()
        if datatype not in _TRITON_TYPES:
            raise WorkbenchError(
                f"tensor {io['name']!r} has datatype {io.get('datatype')!r}, which has no Triton type here.",
                expected=", ".join(sorted(_TRITON_TYPES)),
            )
        entry.data_type = (
            entry.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_name[_TRITON_TYPES[datatype]].number
        )
        dims = list(io.get("dimensions", ()))
        entry.dims.extend(int(d) for d in (dims[1:] if max_batch else dims))
    if max_batch and options.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = int(options.max_queue_delay_microseconds)
        config.dynamic_batching.preferred_batch_size.extend(int(b) for b in options.preferred_batch_sizes)
        policy = config.dynamic_batching.default_queue_policy
        if options.max_queue_size is not None:
            policy.max_queue_size = int(options.max_queue_size)
        if options.queue_timeout_microseconds is not None:
            policy.default_timeout_microseconds = int(options.queue_timeout_microseconds)
            policy.timeout_action = policy.REJECT
    group = config.instance_group.add()
    group.count = int(options.instance_count)
    group.kind = group.KIND_GPU
    if options.rate_limiter_priority is not None:
        group.rate_limiter.priority = int(options.rate_limiter_priority)
    if options.cuda_graph_batch_sizes:
        config.optimization.cuda.graphs = True
        for size in options.cuda_graph_batch_sizes:
            config.optimization.cuda.graph_spec.add().batch_size = int(size)
    if options.version_policy_latest is not None:
        config.version_policy.latest.num_versions = int(options.version_policy_latest)
    for key, value in sorted((parameters or {}).items()):
        config.parameters[str(key)].string_value = str(value)
    text = text_format.MessageToString(config)
    validate_triton_config(text)
    return text


def _batch_max(inputs: Sequence[Mapping[str, Any]]) -> int:
    """Largest batch the profiles allow when every input has a dynamic leading dimension, else 0."""
    if not inputs or not all(list(io.get("dimensions", ()))[:1] == [-1] for io in inputs):
        return 0
    highs = [int(p["max"][0]) for io in inputs for p in io.get("profiles", ()) if p.get("max")]
    return min(highs) if highs else 0


def validate_triton_config(text: str) -> Any:
    """Parse ``config.pbtxt`` text with Triton's ModelConfig schema and check what a TensorRT plan needs.

    Returns the parsed message; raises WorkbenchError naming the first problem.
    """
    from google.protobuf import text_format

    from workbench._vendor.triton_model_config import model_config_class

    config = model_config_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as error:
        raise WorkbenchError(
            f"config.pbtxt does not parse with Triton's ModelConfig schema: {error}",
            expected="a text-format inference.ModelConfig",
        ) from error
    problems = []
    if not config.name:
        problems.append("no model name")
    if config.platform != "tensorrt_plan" and config.backend != "tensorrt":
        problems.append(f"platform {config.platform!r} / backend {config.backend!r} is not TensorRT")
    if not config.input or not config.output:
        problems.append("no inputs or no outputs")
    for entry in (*config.input, *config.output):
        if not entry.name:
            problems.append("a tensor without a name")
        if entry.data_type == 0:
            problems.append(f"tensor {entry.name!r} has TYPE_INVALID")
        if any(d < -1 or d == 0 for d in entry.dims):
            problems.append(f"tensor {entry.name!r} has dims {list(entry.dims)} (must be > 0 or -1)")
    if config.max_batch_size < 0:
        problems.append("negative max_batch_size")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        problems.append("dynamic_batching needs max_batch_size > 0")
    for group in config.instance_group:
        if group.count < 1:
            problems.append(f"instance_group count {group.count} < 1")
    if problems:
        raise WorkbenchError(
            "config.pbtxt is not a valid TensorRT model config: " + "; ".join(problems) + ".",
            expected="name, platform tensorrt_plan, typed inputs/outputs with positive or -1 dims",
        )
    return config
