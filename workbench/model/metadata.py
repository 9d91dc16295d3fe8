"""Named records carried inside an ONNX file (``metadata_props``): the optimization profile a model was prepared
with (:mod:`workbench.model.profile`) and how a Q/DQ model was made (:mod:`workbench.precision.recipe`)."""

from __future__ import annotations

from typing import Any


def set_metadata(proto: Any, key: str, value: str) -> None:
    """Record ``value`` under ``key`` in ``proto.metadata_props``, replacing an earlier record of that key."""
    kept = [prop for prop in proto.metadata_props if prop.key != key]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    entry = proto.metadata_props.add()
    entry.key, entry.value = key, value


def get_metadata(proto: Any, key: str) -> str | None:
    """The value recorded under ``key`` (None when there is none)."""
    return next((prop.value for prop in proto.metadata_props if prop.key == key), None)
