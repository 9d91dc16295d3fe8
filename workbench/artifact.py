"""One JSON round trip for every stage's typed result.

Stage results are frozen dataclasses that inherit :class:`Artifact`; ``to_json`` and ``from_json`` come from the field
types, so no stage writes its own serializer. Rules:

* an ``Enum`` member becomes its value (and is read back as the member);
* nested artifacts, dataclasses, tuples, lists, dicts, ``Path``, numpy scalars and arrays become plain JSON;
* a non-finite float becomes ``null`` (JSON has no NaN or Infinity; ``from_json`` reads ``null`` back as NaN for a
  ``float`` field);
* a field declared with ``field(metadata=NOT_SERIALIZED)`` (an ONNX proto, a callback) is left out and must have a
  default; ``from_json`` restores that default;
* ``from_json`` checks every value against the field's type and raises a :class:`WorkbenchError` naming the field,
  the value and what was expected.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar, Union

from workbench.errors import WorkbenchError

NOT_SERIALIZED = {"json": False}

# A decoded JSON object. Its values are typed ``object``: whoever reads one checks each value's type (as
# ``from_json`` does against the field types), so nothing is assumed about JSON read from disk.
JsonObject = dict[str, object]

A = TypeVar("A", bound="Artifact")


class Artifact:
    """Mixin for frozen dataclass results: JSON out and back in, from the field types."""

    def to_json(self) -> JsonObject:
        return {
            item.name: to_jsonable(getattr(self, item.name))
            for item in dataclasses.fields(self)  # type: ignore[arg-type]
            if item.metadata.get("json", True)
        }

    @classmethod
    def from_json(cls: type[A], data: object) -> A:
        return _from_json(cls, data, cls.__name__)


_ARTIFACT_FROM_JSON = Artifact.from_json.__func__  # type: ignore[attr-defined]


def to_jsonable(value: object) -> object:
    """``value`` as plain JSON data (see the module rules)."""
    if isinstance(value, Enum):  # a typed name (e.g. a precision Variant) is written as its stable value
        return to_jsonable(value.value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Artifact) or (dataclasses.is_dataclass(value) and hasattr(value, "to_json")):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            item.name: to_jsonable(getattr(value, item.name))
            for item in dataclasses.fields(value)
            if item.metadata.get("json", True)
        }
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [to_jsonable(item) for item in items]
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return to_jsonable(value.tolist())
    raise TypeError(f"cannot write a {type(value).__name__} as JSON")


def _fail(where: str, value: object, expected: str) -> WorkbenchError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return WorkbenchError(f"{where}: {shown} is not valid.", expected=expected)


def _from_json(kind: object, data: object, where: str) -> Any:  # the value of any field type
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if kind is Any or kind is object:  # plain JSON values (JsonObject fields) pass as read
        return data
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [option for option in args if option is not type(None)]
        if len(options) == 1:  # X | None: X's own error says best what was wrong
            return _from_json(options[0], data, where)
        errors = []
        for option in args:
            if option is type(None):
                continue
            try:
                return _from_json(option, data, where)
            except WorkbenchError as error:
                errors.append(error.expected or str(error))
        raise _fail(where, data, " or ".join(errors))
    if origin is typing.Literal:
        if data in args:
            return data
        raise _fail(where, data, " / ".join(repr(a) for a in args))
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if isinstance(data, kind):
            return data
        reader = getattr(kind, "from_json", None)
        if reader is not None and getattr(reader, "__func__", None) is not _ARTIFACT_FROM_JSON:
            return reader(data)  # the type reads itself (e.g. a model reloaded from its path)
        return _dataclass_from_json(kind, data, where)
    if origin in (list, tuple, set, frozenset) or kind in (list, tuple):
        if not isinstance(data, (list, tuple)):
            raise _fail(where, data, "a JSON list")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(data):
                raise _fail(where, data, f"a list of {len(args)} items")
            return tuple(_from_json(arg, item, f"{where}[{i}]") for i, (arg, item) in enumerate(zip(args, data)))
        item_kind = args[0] if args else Any
        items = [_from_json(item_kind, item, f"{where}[{i}]") for i, item in enumerate(data)]
        if origin is list or kind is list:
            return items
        return (origin or tuple)(items)
    if origin in (dict, collections.abc.Mapping) or kind is dict:
        if not isinstance(data, Mapping):
            raise _fail(where, data, "a JSON object")
        key_kind, value_kind = args if args else (Any, Any)
        result = {}
        for key, item in data.items():
            if key_kind is int:
                try:
                    key = int(key)
                except (TypeError, ValueError):
                    raise _fail(f"{where} key", key, "an integer key") from None
            elif isinstance(key_kind, type) and issubclass(key_kind, Enum):
                key = _from_json(key_kind, key, f"{where} key")
            result[key] = _from_json(value_kind, item, f"{where}[{key!r}]")
        return result
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(data)
        except ValueError:
            raise _fail(where, data, " / ".join(repr(member.value) for member in kind)) from None
    if kind is Path:
        if not isinstance(data, str) or not data:
            raise _fail(where, data, "a path string")
        return Path(data)
    if kind is float:
        if data is None:
            return math.nan
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise _fail(where, data, "a number")
        return float(data)
    if kind is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise _fail(where, data, "an integer")
        return data
    if kind is bool:
        if not isinstance(data, bool):
            raise _fail(where, data, "true or false")
        return data
    if kind is str:
        if not isinstance(data, str):
            raise _fail(where, data, "a string")
        return data
    if kind is type(None):
        if data is not None:
            raise _fail(where, data, "null")
        return None
    raise _fail(where, data, f"a value of type {getattr(kind, '__name__', kind)}")


def _dataclass_from_json(kind: type, data: object, where: str) -> object:
    if not isinstance(data, Mapping):
        raise _fail(where, data, f"a JSON object for {kind.__name__}")
    hints = typing.get_type_hints(kind)
    values: dict[str, object] = {}
    for item in dataclasses.fields(kind):
        if not item.init:
            continue
        if not item.metadata.get("json", True):
            continue
        if item.name in data:
            values[item.name] = _from_json(hints.get(item.name, Any), data[item.name], f"{where}.{item.name}")
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            raise WorkbenchError(
                f"{where}: the field {item.name!r} is missing.", expected=f"a {kind.__name__} written by trt-workbench"
            )
    try:
        return kind(**values)
    except WorkbenchError:
        raise
    except (TypeError, ValueError) as error:
        raise WorkbenchError(
            f"{where}: cannot build a {kind.__name__} ({error}).",
            expected=f"a {kind.__name__} written by trt-workbench",
        ) from error
