"""The quickstart journey with precision fp8: its FP8 stage calibrates FP8 from the same statistics, builds an
engine whose convolutions and GEMMs run FP8, measures it, and the choice is that engine."""

from __future__ import annotations

from pathlib import Path

from workbench.flow import QuickstartConfig, QuickstartSession
from workbench.precision.variant import PRECISION_CHOICES, Variant


def test_precision_fp8_builds_measures_and_selects_the_fp8_engine(tmp_path: Path) -> None:
    assert "fp8" in PRECISION_CHOICES  # offered by the precision widget (ui/controls reads the labels)
    config = QuickstartConfig(
        model="digits-cnn",
        precision="fp8",
        out_dir=str(tmp_path),
        timing_window_s=0.1,
        calibration_samples=64,
        diff_samples=16,
        search_budget=0,
    )
    session = QuickstartSession(config)
    run = session.run_all()
    assert run.stage("build_fp8_all").ok, run.stage("build_fp8_all")
    build = run.builds[Variant.FP8_ALL]
    math = [layer for layer in build.engine.layer_map.layers if layer.layer_type.lower() in ("correlation", "gemm")]
    assert math and all(layer.is_fp8_kernel for layer in math)
    assert build.engine.options.compute_capabilities == ("SM89", "SM120", "SM121")
    row = run.metrics.row(Variant.FP8_ALL)
    assert row is not None and row.value >= run.metrics.row(Variant.FP32).value - 0.02
    assert run.chosen_variant is Variant.FP8_ALL, run.stage("select")
