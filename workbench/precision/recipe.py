"""How a Q/DQ model was made from its calibration ranges, carried inside the ONNX file (``metadata_props``).

The calibration cache holds the ranges; the same ranges give different models with GPTQ or nearest weight rounding
and with or without grid alignment (which also halves some scales and adds border maps). ``calibrate``, the
quickstart and the calibration panel choose both by measurement, so the model records what was done, and an export
of its engine says it in the bundle's manifest without the session that made it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from workbench._io import sha256_bytes
from workbench.artifact import Artifact
from workbench.errors import WorkbenchError
from workbench.model.metadata import get_metadata, set_metadata

if TYPE_CHECKING:
    import onnx

QUANTIZATION_METADATA_KEY = "workbench.quantization"


@dataclass(frozen=True)
class QuantizationRecipe(Artifact):
    """What turned the FP32 model and its ranges into this Q/DQ model."""

    ranges_method: str  # the activation ranges' method, as `calibrate` prints it (e.g. mse, or mse-fp8 with FP8)
    weight_rounding: str  # "gptq" when GPTQ's rounding shipped on at least one weight, else "nearest"
    gptq_weights: int  # weights whose GPTQ rounding shipped (it gained on held-out batches; the others: nearest)
    grid_alignment: bool  # workbench.calib.align rewrote at least one tensor
    aligned_inputs: int  # inputs quantized on their 8-bit pixel grid (scale 1)
    shifted_tensors: int  # non-negative activations shifted by half their range (half the INT8 step)
    border_maps: int  # constant maps added after padded Convs (engine bytes)
    int8_nodes: int
    fp8_nodes: int
    regridded_weights: int = 0  # Conv weights re-rounded to nearest after an input grid scaled them
    graph_sha256: str = ""  # the graph it describes: a later rewrite (a cleaner, a hand edit) makes the record stale

    def text(self) -> str:
        weights = f"GPTQ on {self.gptq_weights} weight(s)" if self.weight_rounding == "gptq" else "nearest"
        grids = "not aligned"
        if self.grid_alignment:
            counts = [
                f"{self.aligned_inputs} input grid(s)",
                f"{self.shifted_tensors} shifted",
                f"{self.border_maps} border map(s)",
            ]
            if self.regridded_weights:
                counts.append(f"{self.regridded_weights} weight(s) re-rounded to nearest")
            grids = f"aligned ({', '.join(counts)})"
        return (
            f"{self.ranges_method} ranges, weights {weights}, grids {grids}; {self.int8_nodes} INT8 and "
            f"{self.fp8_nodes} FP8 node(s)"
        )


def _graph_sha256(proto: Any) -> str:
    return sha256_bytes(proto.graph.SerializeToString())


def write_recipe(proto: onnx.ModelProto, recipe: QuantizationRecipe) -> None:
    """Record ``recipe`` in ``proto.metadata_props`` (replacing an earlier record), bound to the graph as it is."""
    recipe = replace(recipe, graph_sha256=_graph_sha256(proto))
    set_metadata(proto, QUANTIZATION_METADATA_KEY, json.dumps(recipe.to_json(), sort_keys=True))


def read_recipe(proto: Any, what: str = "the model") -> QuantizationRecipe | None:
    """The recipe recorded in ``proto`` (None when the model was not quantized by a calibration session); a record
    that is not a recipe, or describes another graph than ``proto``'s, is refused."""
    text = get_metadata(proto, QUANTIZATION_METADATA_KEY)
    if text is None:
        return None
    try:
        recipe = QuantizationRecipe.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError, WorkbenchError) as error:
        raise WorkbenchError(
            f"{what}: its {QUANTIZATION_METADATA_KEY!r} metadata is not a quantization recipe ({error}).",
            expected="the record `workbench calibrate` writes, or none",
        ) from None
    if recipe.graph_sha256 and recipe.graph_sha256 != _graph_sha256(proto):
        raise WorkbenchError(
            f"{what}: its {QUANTIZATION_METADATA_KEY!r} metadata describes the graph as calibration wrote it, and the "
            "graph has changed since (cleaned or edited), so it no longer says how this model was made.",
            expected="the Q/DQ model as `workbench calibrate` wrote it, or a record written after the change",
        )
    return recipe
