"""Regenerate docs/fusions-ocr-cls.html: the fusions page of the PP-OCR direction classifier, FP16 vs FP32.

    PYTHONPATH=. .venv/bin/python docs/make_fusions_example.py

Builds both engines with the backend available (TensorRT-RTX on a CPU-only machine), then writes the page the
`workbench fusions ocr-cls.fp16.layers.json --compare ocr-cls.fp32.layers.json --html ...` command writes: the static
SVG drawing of the FP16 engine (fusions gained vs FP32 outlined), statistics, fusion diff, lint and Q/DQ audit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from workbench.engine import engine_for_model
from workbench.engine.lint import lint
from workbench.explore.graphs import view_from_artifact
from workbench.viz.engine_view import fusions_page

HERE = Path(__file__).resolve().parent


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = view_from_artifact(engine_for_model("ocr-cls", "fp32", tmp), label="ocr-cls fp32")
        fp16 = view_from_artifact(engine_for_model("ocr-cls", "fp16", tmp), label="ocr-cls fp16")
    page = fusions_page(
        fp16.layer_map,
        HERE / "fusions-ocr-cls.html",
        engine_layers=fp16.engine_layers,
        compare_with=fp32.layer_map,
        lint_rows=lint(fp16.layer_map, fp16.engine_layers).rows(),
    )
    print(f"wrote {page} ({page.stat().st_size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
