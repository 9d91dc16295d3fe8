"""The optimization profile a model was prepared with, carried inside the ONNX file (``metadata_props``).

A Q/DQ model written by calibration records the (min, opt, max) shapes of its inputs that it was calibrated for, so
``workbench build QDQ.onnx`` needs no ``--shapes`` for it: the command the calibration notebook prints runs as printed.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from workbench.errors import WorkbenchError
from workbench.model.metadata import get_metadata, set_metadata

if TYPE_CHECKING:
    import onnx

PROFILE_METADATA_KEY = "workbench.optimization_profile"
Shape = tuple[int, ...]
ShapeRange = tuple[Shape, Shape, Shape]


def write_profile_metadata(proto: onnx.ModelProto, profiles: dict[str, ShapeRange], source: str) -> None:
    """Record ``profiles`` ({input: (min, opt, max)}) in ``proto.metadata_props`` (replacing an earlier record)."""
    text = json.dumps(
        {"source": source, "inputs": {name: [list(shape) for shape in ranges] for name, ranges in profiles.items()}}
    )
    set_metadata(proto, PROFILE_METADATA_KEY, text)


def read_profile_metadata(proto: onnx.ModelProto, what: str = "the model") -> tuple[dict[str, ShapeRange], str]:
    """The recorded profiles and where they came from; ({}, "") when the model carries none."""
    text = get_metadata(proto, PROFILE_METADATA_KEY)
    if text is None:
        return {}, ""
    try:
        record = json.loads(text)
        profiles = {
            str(name): tuple(tuple(int(dim) for dim in shape) for shape in ranges)
            for name, ranges in record["inputs"].items()
        }
        if any(len(ranges) != 3 or any(dim < 1 for shape in ranges for dim in shape) for ranges in profiles.values()):
            raise ValueError("each input needs three shapes of positive sizes")
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise WorkbenchError(
            f"{what}: its metadata {PROFILE_METADATA_KEY!r} is not a readable optimization profile ({error}).",
            expected='{"inputs": {"NAME": [[MIN...], [OPT...], [MAX...]]}} as calibration writes it, or --shapes',
        ) from None
    return profiles, str(record.get("source", ""))  # type: ignore[return-value]
