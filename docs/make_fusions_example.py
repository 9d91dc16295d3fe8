"""Regenerate docs/fusions-ocr-cls.html: the fusions page of the PP-OCR direction classifier, FP16 vs FP32.

    .venv/bin/python docs/make_fusions_example.py

Builds both engines with the backend available (TensorRT-RTX on a CPU-only machine), then writes the page the
`workbench fusions ocr-cls.fp16.layers.json --compare ocr-cls.fp32.layers.json --html ...` command writes, with the
FP16 graph's unnamed nodes named as TensorRT's parser names them.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from workbench._io import sha256_bytes
from workbench.engine.build import BuildOptions, engine_from_onnx
from workbench.engine.layermap import LayerMap
from workbench.precision import PrecisionPlan
from workbench.precision.autocast import apply_precision_plan
from workbench.viz.engine import fusions_html
from workbench.zoo import get_entry

HERE = Path(__file__).resolve().parent


def main() -> None:
    entry = get_entry("ocr-cls")
    model = entry.load()
    maps = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("fp32", "fp16"):
            artifact = engine_from_onnx(
                model,
                Path(tmp) / f"ocr-cls.{precision}.engine",
                BuildOptions(shapes=dict(entry.input_profiles()), precision=precision, progress=False),
            )
            proto = model.proto if precision == "fp32" else apply_precision_plan(model, PrecisionPlan("fp16")).proto
            assert sha256_bytes(proto.SerializeToString()) == artifact.built_onnx_sha256 or precision == "fp32"
            maps[precision] = LayerMap.from_engine_layers(
                artifact.engine_layers, onnx_proto=proto, label=f"ocr-cls {precision}"
            )
            stats = maps[precision].stats()
            print(
                f"ocr-cls {precision}: {stats.onnx_nodes} ONNX nodes -> {stats.engine_layers} engine layers "
                f"({artifact.backend} {artifact.backend_version}, {artifact.build_seconds:.1f} s)"
            )
    page = fusions_html(maps["fp16"], HERE / "fusions-ocr-cls.html", compare_with=maps["fp32"])
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
