"""Notebook 03 runs headless, and its calibration panel is driven through its widgets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from notebook_runner import execute_notebook

from workbench.errors import WorkbenchError

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "03_int8_calibration.ipynb"


def test_notebook_03_executes_headless() -> None:
    """The notebook's mechanics on 32 evaluation samples, a search budget of 2, nearest weight rounding and no grid
    alignment (its defaults evaluate all 300 with a budget of 4, GPTQ and alignment where they measure better: the
    slow test below; the panel's auto choices are tested in test_calibration_panel_rounds_weights_as_calibrate_does_
    and_offers_fp8_per_layer and test_calibration_panel_aligns_grids_as_calibrate_does)."""
    parameters = {"EVAL_SAMPLES": "32", "SEARCH_BUDGET": "2", "WEIGHT_ROUNDING": '"nearest"', "GRID_ALIGNMENT": '"off"'}
    run = execute_notebook(NOTEBOOK.name, parameters=parameters)
    assert run.seconds < 120
    # histogram + SQNR chart + Pareto of the search + the front across formats
    assert run.count("application/vnd.plotly.v1+json") >= 4
    text = run.stream_text
    assert "tensors from 16 samples" in text and "accumulated" in text and "lowest local SQNR" in text
    assert "FP32" in text and "INT8 (max)" in text and "mixed (int8+fp32)" in text
    assert "task evaluations (+1 FP32)" in text  # the accuracy-target search ran
    assert "  front: plan " in text and "(n=32)" in text  # its Pareto front, each plan with interval and samples
    # the front across formats: the FP32 model's build and metric on the search's samples, and every plan
    reference = next(line for line in text.splitlines() if line.strip().startswith("FP32 (reference)"))
    assert "fp32 51" in reference and "(n=32)" in reference and " MB" in reference


@pytest.mark.slow
def test_notebook_03_defaults_show_the_int8_loss_it_describes() -> None:
    """With its defaults (every one of ocr-rec's 300 evaluation samples) the notebook shows what its text says: INT8
    costs ocr-rec accuracy, with a paired 95% interval of the difference to FP32 that excludes zero (the first 32, or
    even 150, samples show no difference at all)."""
    run = execute_notebook(NOTEBOOK.name, timeout_s=900)
    int8_line = next(
        line for line in run.stream_text.splitlines() if line.startswith("INT8 (max)") and "vs FP32" in line
    )
    assert "(n=300)" in int8_line and "within noise" not in int8_line, int8_line
    low, high = (float(v) for v in re.search(r"vs FP32 [+-][\d.]+ \[([+-][\d.]+), ([+-][\d.]+)\]", int8_line).groups())
    assert low < high < 0, int8_line  # a loss, and the interval excludes zero
    # the search over formats works on the same 300 samples, so it starts from that loss and tries FP8 first
    text = run.stream_text
    assert "all-INT8" in text and "to fp8:" in text, text[-2000:]
    fronts = [line for line in text.splitlines() if line.endswith("(on the front)")]
    assert fronts and all("(n=300)" in line for line in fronts)


def test_calibration_panel_is_driven_by_its_widgets() -> None:
    from workbench.ui.calib_panel import CalibrationPanel

    panel = CalibrationPanel("ocr-cls", method="max", max_batches=1, eval_limit=16, worst_n=2)
    assert panel.session is None and len(panel.sqnr.data) == 0 and len(panel.table.data) == 0  # constructor is idle
    panel.run()
    assert panel.status.kind == "ok", panel.status.text
    assert [row["variant"] for row in panel.metric_rows] == ["FP32", "INT8 (max)"]
    first_curve = list(panel.sqnr.data[0].y)
    assert len(first_curve) > 50 and list(panel.table.data[0].cells.values[0]) == ["FP32", "INT8 (max)"]

    panel.method.value = "percentile"  # switching method: new ranges from the same histograms, redrawn
    assert panel.status.kind == "ok", panel.status.text
    assert panel.statistics is panel.session.statistics(1)  # no new statistics pass
    assert panel.metric_rows[1]["variant"] == "INT8 (percentile)" and list(panel.sqnr.data[0].y) != first_curve

    panel.tensor.value = panel.tensor.options[3]  # histogram of the chosen tensor with each method's threshold
    assert panel.histogram.layout.title.text.startswith(panel.tensor.options[3])
    assert {a.text.split()[0] for a in panel.histogram.layout.annotations} == {"max", "percentile", "entropy", "mse"}
    panel.percentile.value = 99.9
    assert "percentile 99.9" not in str(panel.histogram.layout.annotations)  # a new threshold, redrawn
    assert panel.status.kind == "ok"

    worst = panel.fall_back_worst()
    assert len(worst) == 2 and all(panel.plan.precision_of(node) == "fp32" for node in worst)
    assert panel.metric_rows[-1]["variant"] == "mixed (int8+fp32)" and panel.metric_rows[-1]["fallback"] == 2
    assert len(panel.table.data[0].cells.values[0]) == 3  # the table updated in place with the mixed row
    assert any(trace.name == "worst layers" for trace in panel.sqnr.data)

    node = panel.node.options[0]
    panel.set_precision(node, "fp16")  # per-layer precision widget
    assert panel.plan.precision_of(node) == "fp16" and panel.status.kind == "ok", panel.status.text
    assert panel.metric_rows[-1]["variant"] == "mixed (int8+fp16+fp32)"


def test_calibration_panel_rounds_weights_as_calibrate_does_and_offers_fp8_per_layer() -> None:
    """The weights dropdown starts on auto, calibrate's default for zoo models: all-INT8 is scored with both roundings
    on the panel's evaluation samples (GPTQ's layer inputs read the panel's calibration batches); GPTQ can be forced,
    and any layer can be put in FP8."""
    import onnx

    from workbench.ui.calib_panel import CalibrationPanel

    with pytest.raises(WorkbenchError, match="weight rounding 'round' is not known"):
        CalibrationPanel("ocr-cls", weight_rounding="round")  # type: ignore[arg-type]
    # grids off: the rows below name the weights alone (the grids dropdown has its own test)
    panel = CalibrationPanel("ocr-cls", method="max", max_batches=1, eval_limit=16, grid_alignment="off")
    assert panel.rounding.value == "auto"
    panel.rounding.value = "gptq"  # before a run: nothing to redo yet
    assert panel.session is None
    panel.run()
    # GPTQ forced on one calibration batch cannot round (no held-out batch): the row says what the weights are
    assert panel.status.kind == "ok" and panel.metric_rows[1]["variant"] == "INT8 (max)", panel.status.text
    panel.rounding.value = "auto"
    panel.run()
    # one calibration batch: nothing to check GPTQ on, so auto keeps nearest without scoring it, and says why
    assert panel.status.kind == "ok" and "GPTQ has no layer to round here" in panel.status.text, panel.status.text
    assert panel.session.weight_rounding == "nearest" and panel.metric_rows[1]["variant"] == "INT8 (max)"

    panel.batches.value = 2  # new statistics; auto measures again, now on two batches
    assert panel.status.kind == "ok", panel.status.text
    assert "with GPTQ on the first 16 evaluation samples" in panel.status.text
    assert "(weight rounding auto: 2 evaluations)" in panel.status.text
    # GPTQ's layer inputs were read on the panel's batches (1, then 2), never on all 16 calibration batches
    assert set(panel.session._layer_inputs) == {1, 2} and not panel.session._layer_inputs[1]

    panel.rounding.value = "gptq"
    assert panel.status.kind == "ok" and "GPTQ (chosen in the panel)" in panel.status.text, panel.status.text
    assert panel.session.weight_rounding == "gptq" and panel.metric_rows[1]["variant"] == "INT8 (max, GPTQ weights)"
    assert panel.quantized.weight_rounding  # the Q/DQ model's weights were rounded by GPTQ

    node = panel.node.options[-1]
    panel.set_precision(node, "fp8")
    assert panel.status.kind == "ok", panel.status.text
    assert panel.plan.precision_of(node) == "fp8" and node in panel.quantized.placement.quantized_nodes
    assert panel.metric_rows[-1]["variant"] == "mixed (int8+fp8)"
    assert panel.metric_rows[-1]["fp8_nodes"] == 1 and panel.metric_rows[-1]["fallback"] == 0  # FP8 is not "wider"
    fp8 = onnx.TensorProto.FLOAT8E4M3FN  # FP8 Q/DQ in the graph: their zero points are E4M3
    assert any(init.data_type == fp8 for init in panel.quantized.proto.graph.initializer)

    # a rounding whose scoring fails: the error is shown, and the session, the dropdown and the table go back
    panel.rounding.value = "nearest"
    assert panel.status.kind == "ok" and panel.metric_rows[1]["variant"] == "INT8 (max)", panel.status.text
    evaluate = panel.session.evaluate

    def fails_with_gptq(model=None, *, limit=None):
        if panel.session.weight_rounding == "gptq":
            raise OSError("disk full while scoring")
        return evaluate(model, limit=limit)

    panel.session.evaluate = fails_with_gptq
    panel.rounding.value = "gptq"
    assert panel.status.kind == "error" and "disk full" in panel.status.text
    assert panel.rounding.value == "nearest" == panel.session.weight_rounding
    assert panel.metric_rows[1]["variant"] == "INT8 (max)" and not panel.quantized.weight_rounding


def test_calibration_panel_aligns_grids_as_calibrate_does() -> None:
    """The grids dropdown starts on auto, calibrate's default: all-INT8 is quantized with and without grid alignment
    after the rounding is chosen, the status says what was measured, and the rows, the session and the Q/DQ model
    follow the choice; on and off are forced; an alignment that fails puts everything back."""
    import re

    from workbench.ui.calib_panel import CalibrationPanel

    with pytest.raises(WorkbenchError, match="grid alignment 'yes' is not known"):
        CalibrationPanel("digits-cnn", grid_alignment="yes")
    panel = CalibrationPanel("digits-cnn", method="max", max_batches=2, eval_limit=32)
    assert panel.alignment.value == "auto"
    panel.run()
    assert panel.status.kind == "ok", panel.status.text
    choice = re.search(r"grid alignment (on|off): output noise", panel.status.text)
    assert choice is not None, panel.status.text
    aligned = choice.group(1) == "on"
    assert panel.session.align_grids == aligned
    assert bool(panel.quantized.alignment and panel.quantized.alignment.rewritten) == aligned
    assert panel.metric_rows[1]["variant"].endswith(", grids aligned)") == aligned

    for forced in ("off", "on"):
        panel.alignment.value = forced
        assert panel.status.kind == "ok" and f"grid alignment {forced} (chosen in the panel)" in panel.status.text
        assert panel.session.align_grids == (forced == "on")
        assert panel.metric_rows[1]["variant"].endswith(", grids aligned)") == (forced == "on")

    def refuses(quantized):
        raise ValueError("border map of an unknown shape")

    for previous in ("off", "auto"):  # a failed change puts the dropdown back on what it was, auto included
        panel.alignment.value = previous
        assert panel.status.kind == "ok", panel.status.text
        in_use, rows = panel.session.align_grids, list(panel.metric_rows)
        original = panel.session._aligned
        panel.session._aligned = refuses
        panel.session._quantized.clear()  # the model aligned above is kept by the session: a fresh alignment fails
        panel.alignment.value = "on"
        assert panel.status.kind == "error" and "border map of an unknown shape" in panel.status.text
        assert panel.alignment.value == previous and panel.session.align_grids == in_use
        assert panel.metric_rows == rows
        panel.session._aligned = original


def test_calibration_panel_falls_back_by_the_core_rule_keeping_one_int8_layer() -> None:
    """The panel's "fall back worst N" is the session's (the journey's rule too): one INT8 layer always stays."""
    from workbench.ui.calib_panel import CalibrationPanel

    panel = CalibrationPanel("digits-cnn", method="max", max_batches=1, eval_limit=16, worst_n=1)
    panel.run()
    assert panel.status.kind == "ok", panel.status.text
    int8 = panel.session.int8_nodes()
    assert len(int8) >= 2
    reference, quantized = panel.metric_rows  # intervals and paired differences come from flow.uncertainty
    assert reference["vs_fp32"] == "reference" and quantized["n"] == 16 and quantized["interval"].startswith("[")
    panel.worst_n.value = len(int8)  # every INT8 layer: refused, the field goes back
    assert (
        panel.status.text
        == f"Error: N={len(int8)} is out of range. Expected: 1..{len(int8) - 1} (the INT8 layers of this model but one)."
    )
    assert panel.worst_n.value == 1
    panel.percentile.value = 100.5  # the range method's own rule refuses it, as the CLI's --percentile does
    assert panel.status.text.startswith("Error: percentile 100.5 is out of range.") and panel.percentile.value == 99.99
    worst = panel.fall_back_worst(len(int8) + 3)  # asked in code for more than there are: all but one
    assert len(worst) == len(int8) - 1
    assert [node for node in int8 if panel.plan.precision_of(node) == "int8"] == [n for n in int8 if n not in worst]
