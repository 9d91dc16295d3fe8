"""Stage 2: the precision plan — which precision each ONNX node should run at.

TensorRT 10/11 strongly typed networks take precision from the graph itself, so a plan is realised by
rewriting the ONNX: FP16 nodes get Casts (AutoCast-style), INT8 and FP8 nodes get Q/DQ pairs (calibration).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from workbench.artifact import Artifact
from workbench.errors import WorkbenchError

Precision = Literal["fp32", "fp16", "int8", "fp8"]
PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8", "fp8")


def _check_precision(value: str, where: str) -> Precision:
    if value not in PRECISIONS:
        raise WorkbenchError(f"{where}: unknown precision {value!r}.", expected=" / ".join(PRECISIONS))
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class PrecisionPlan(Artifact):
    """Default precision for every node, plus per-node overrides keyed by ONNX node name."""

    default: Precision = "fp32"
    overrides: dict[str, Precision] = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", _check_precision(self.default, "precision plan default"))
        if not isinstance(self.overrides, Mapping):
            raise WorkbenchError(
                f"precision plan overrides {self.overrides!r} are not a mapping.", expected='{"node": "fp16"}'
            )
        checked = {
            str(name): _check_precision(value, f"precision plan override for node {name!r}")
            for name, value in sorted(dict(self.overrides).items())
        }
        object.__setattr__(self, "overrides", checked)

    def precision_of(self, node_name: str) -> Precision:
        return self.overrides.get(node_name, self.default)

    def with_overrides(self, changes: Mapping[str, Precision], note: str | None = None) -> PrecisionPlan:
        merged = dict(self.overrides)
        merged.update(changes)
        return PrecisionPlan(self.default, merged, self.note if note is None else note)

    def counts(self, node_names: list[str]) -> dict[str, int]:
        result: dict[str, int] = {p: 0 for p in PRECISIONS}
        for name in node_names:
            result[self.precision_of(name)] += 1
        return result

    @property
    def label(self) -> str:
        if not self.overrides:
            return self.default
        others = sorted({p for p in self.overrides.values() if p != self.default})
        return f"{self.default}+" + "+".join(others) if others else self.default

    @classmethod
    def from_json(cls, data: object) -> PrecisionPlan:
        if not isinstance(data, Mapping) or "default" not in data:
            raise WorkbenchError(
                "precision plan JSON lacks a 'default' key.",
                expected='{"default": "fp32", "overrides": {"node": "fp16"}}',
            )
        return cls(default=data["default"], overrides=data.get("overrides", {}), note=str(data.get("note", "")))

    @classmethod
    def load(cls, path: str | Path) -> PrecisionPlan:
        path = Path(path)
        from workbench._io import read_json

        data = read_json(path, what="a JSON precision plan", max_bytes=64 * 1024 * 1024)
        if isinstance(data, Mapping):  # a misspelt key ("override") would otherwise be dropped without a word
            unknown = sorted(str(key) for key in data if key not in ("default", "overrides", "note"))
            if unknown:
                raise WorkbenchError(
                    f"{path}: precision plan has unknown key(s) {unknown}.",
                    expected='only "default", "overrides" and "note", e.g. {"default": "fp32", "overrides": {"node": "fp16"}}',
                )
        return cls.from_json(data)
