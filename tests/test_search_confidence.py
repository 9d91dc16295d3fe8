"""The accuracy-target search's confidence rule and its residual-skip trial, on real models and real ONNX Runtime.

* ``confidence``: a plan meets the target only when its metric does at the low end of its paired interval with FP32
  (not the point estimate alone); a screened plan is confirmed on the whole set only when its screening score clears
  the target by the half-width the whole set's interval would have.
* the first trial of a search that misses takes every residual Add's skip input out of 8 bits and keeps every math
  op in its 8-bit format.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from workbench.calib.search import DEFAULT_CONFIDENCE, SKIP_GROUP, paired_bound, search_mixed_precision
from workbench.errors import WorkbenchError


@pytest.fixture(scope="module")
def digits():  # type: ignore[no-untyped-def]
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=32, batch_size=8))
    return CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)


def test_paired_bound_is_the_normal_interval_of_the_per_sample_difference() -> None:
    plan = np.array([1.0] * 90 + [0.0] * 10)
    fp32 = np.ones(100)
    # the difference is -0.1 on average with sd sqrt(0.1 * 0.9 * 100 / 99): 0.9 - 1.96 * sd / 10
    expected = 0.9 - 1.959963984540054 * math.sqrt(0.09 * 100 / 99) / 10
    assert paired_bound(plan, fp32, 1.0, 0.95, higher=True) == pytest.approx(expected)
    # samples both get wrong cost nothing: a plan that errs exactly where FP32 errs has a zero-width interval
    same = np.array([1.0] * 95 + [0.0] * 5)
    assert paired_bound(same, same, 0.95, 0.95, higher=True) == pytest.approx(0.95)
    # lower-is-better metrics take the high end
    assert paired_bound(np.zeros(100) + plan * 0.1, np.zeros(100), 0.0, 0.95, higher=False) > 0.09
    assert math.isnan(paired_bound([1.0], [1.0], 1.0, 0.95, higher=True))  # one sample: no interval


def test_confidence_holds_back_a_plan_whose_interval_misses_the_target(digits) -> None:  # type: ignore[no-untyped-def]
    """On 120 digits, all-INT8 meets FP32 - 0.005 by its point estimate; at 99.9 % confidence with the target at the
    point estimate itself its interval's low end cannot, so the search goes on (and reports the bound)."""
    kwargs = {"limit": 120, "build_costs": False, "budget": 2}
    plain = search_mixed_precision(digits, target_drop=0.005, confidence=None, **kwargs)  # the point estimate
    assert plain.met and plain.confidence == 0.0 and math.isnan(plain.metric_bound)
    default = search_mixed_precision(digits, target_drop=0.005, **kwargs)  # 95 % unless asked otherwise
    assert default.confidence == DEFAULT_CONFIDENCE == 0.95 and not math.isnan(default.metric_bound)
    assert "at 95% confidence, interval end" in default.summary()
    start = plain.evaluated[0]
    fp32 = digits.evaluate(limit=120)
    differing = sum(a != b for a, b in zip(start.scores, fp32.scores, strict=True))
    strict = search_mixed_precision(digits, target=start.metric, confidence=0.999, **kwargs)
    if differing:  # the interval has a width: its low end lies below the point estimate that equals the target
        assert strict.metric_bound < strict.metric and (strict.met is (strict.metric_bound >= strict.target - 1e-9))
        assert strict.stop_reason != "target met by all-INT8"
    else:  # all-INT8 agrees with FP32 on every sample: a zero-width interval, met at any confidence
        assert strict.met and strict.metric_bound == pytest.approx(strict.metric)
    assert "confidence" in strict.summary()
    with pytest.raises(WorkbenchError, match="confidence"):
        search_mixed_precision(digits, target_drop=0.01, confidence=1.0, **kwargs)


def test_cli_confidence_needs_target_drop_and_a_level(tmp_path: Path) -> None:
    from cli_runner import run_cli_forked

    out = str(tmp_path / "q.onnx")
    alone = run_cli_forked(["calibrate", "digits-cnn", "--confidence", "0.95", "-o", out], cwd=tmp_path)
    assert alone.returncode == 2 and "--confidence" in alone.stderr and "--target-drop" in alone.stderr
    too_high = run_cli_forked(
        ["calibrate", "digits-cnn", "--target-drop", "0.01", "--confidence", "1.5", "-o", out], cwd=tmp_path
    )
    assert too_high.returncode == 2 and "--confidence" in too_high.stderr and "or off" in too_high.stderr
    assert not (tmp_path / "q.onnx").exists()
    # off: the point estimate decides (the summary names no level); the default: 95 %
    for flag, level in ((["--confidence", "off"], None), ([], "at 95% confidence")):
        run = run_cli_forked(
            ["calibrate", "digits-cnn", "--target-drop", "0.01", "--budget", "1", "--eval-limit", "60", *flag]
            + ["-o", out, "--no-progress"],
            cwd=tmp_path,
        )
        assert run.returncode == 0, run.stderr
        summary = next(line for line in run.stdout.splitlines() if line.startswith("mixed precision:"))
        assert (level in summary) if level else ("confidence" not in summary), summary


def _residual_cnn(path: Path) -> Path:
    """Conv -> Relu -> Conv -> Add(skip) -> Relu -> GlobalAveragePool -> Flatten -> MatMul: one residual block."""
    rng = np.random.default_rng(7)

    def weight(name: str, *shape: int) -> TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual_add"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("MatMul", ["f", "wf"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6])],
        [weight("w1", 8, 3, 3, 3), weight("b1", 8), weight("w2", 8, 8, 3, 3), weight("b2", 8), weight("wf", 8, 6)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_a_missing_search_first_takes_the_residual_skips_out_of_8_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreachable target: the first trial moves only the residual Add (its skip input loses its Q/DQ pair), every
    Conv and the MatMul stay INT8; later group trials never pull the Add back into 8 bits."""
    from workbench.calib.session import CalibrationSession
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    entry = OnnxFileEntry(_residual_cnn(tmp_path / "residual.onnx"))
    session = CalibrationSession(entry.load(), entry=entry, data="zoo", progress=False)
    assert session.placement(session.default_plan("int8")).residual_skips == {"residual_add": "r1"}
    result = search_mixed_precision(session, target=1.01, budget=3, limit=64, build_costs=False)
    first = result.reverts[0]
    assert first.group == SKIP_GROUP and first.nodes == ("residual_add",) and first.format == "fp16"
    trial = result.evaluated[1]
    plan = result.plan_of(1)
    assert plan.precision_of("residual_add") == "fp16"
    assert {plan.precision_of(n) for n in ("conv1", "conv2", "fc")} == {"int8"}
    assert trial.int8_math_nodes == trial.math_nodes == 3
    quantized = session.quantize(session.ranges("mse"), plan)
    assert "r1" not in quantized.placement.activations or quantized.placement.activations["r1"] != ["residual_add"]
    assert "residual_add" not in quantized.placement.residual_skips
    if first.kept:  # later trials leave the Add where the skip trial put it
        assert result.plan.precision_of("residual_add") == "fp16"


def test_screening_with_confidence_keeps_every_record_consistent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Screened trials, whole-set confirmations at 95 % confidence (a residual CNN on seeded random inputs, scored by
    agreement with FP32): every whole-set record's ``meets_target`` is the point estimate AND the interval's end
    against the target, a record whose point estimate meets it but whose interval does not ends no search, and the
    result agrees with its chosen record."""
    from workbench.calib.session import CalibrationSession
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    entry = OnnxFileEntry(_residual_cnn(tmp_path / "residual.onnx"))
    session = CalibrationSession(entry.load(), entry=entry, data="zoo", progress=False)
    fp32 = session.evaluate(limit=128)
    kwargs = {"limit": 128, "screen": 32, "build_costs": False, "budget": 4}
    for target in (0.8, 0.92):
        result = search_mixed_precision(session, target=target, confidence=0.95, **kwargs)
        for record in result.evaluated:
            assert isinstance(record.meets_target, bool)
            if record.n_samples == 128:
                bound = paired_bound(record.scores, fp32.scores, fp32.value, 0.95, higher=True)
                assert record.meets_target == (record.metric >= target - 1e-9 and bound >= target - 1e-9)
        assert result.chosen.n_samples == 128 and result.met == result.chosen.meets_target
        assert result.metric_bound == pytest.approx(
            paired_bound(result.chosen.scores, fp32.scores, fp32.value, 0.95, higher=True)
        )
        if result.metric >= target and not result.met:  # the interval held it back: the search did not stop there
            assert not result.stop_reason.startswith("target met")


def test_kept_8bit_convs_and_the_skip_trial_keep_plan_and_fallback_nodes_in_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``keep_8bit`` the widest plan is scored after the skip trial: whichever plan the search ends on, its
    overrides are exactly its fallback nodes at the fallback precision, and ``plan_of`` rebuilds it."""
    from workbench.calib.session import CalibrationSession
    from workbench.zoo.onnx_file import OnnxFileEntry

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))
    entry = OnnxFileEntry(_residual_cnn(tmp_path / "residual.onnx"))
    session = CalibrationSession(entry.load(), entry=entry, data="zoo", progress=False)
    result = search_mixed_precision(session, target=1.01, budget=4, limit=64, build_costs=False, keep_8bit=("Conv",))
    assert result.reverts[0].group == SKIP_GROUP
    assert dict(result.plan.overrides) == dict.fromkeys(result.fallback_nodes, result.fallback)
    assert result.plan_of(result.chosen.index).overrides == result.plan.overrides
    assert {result.plan.precision_of(n) for n in ("conv1", "conv2")} == {"int8"}


def test_a_missing_search_then_takes_the_stem_out_of_8_bits_unless_convs_stay_8_bit() -> None:
    """ocr-cls against an unreachable target: after the residual-skip trial the search tries its stem (the two
    leading convolutions of few channels per group) in FP16, every other node as it was; with ``keep_8bit=("Conv",)``
    the stem stays in 8 bits and no such trial runs."""
    from workbench.calib.search import STEM_GROUP
    from workbench.calib.session import CalibrationSession
    from workbench.precision.qdq_rules import fp8_stem_layers
    from workbench.zoo import get_entry

    entry = get_entry("ocr-cls")
    session = CalibrationSession(entry.load(), entry=entry, max_batches=2, progress=False)
    stem = tuple(fp8_stem_layers(session.prepared, prepared=True))
    assert len(stem) == 2
    kwargs = {"target": 1.01, "limit": 48, "build_costs": False, "confidence": None}
    result = search_mixed_precision(session, budget=3, **kwargs)
    trial = next(r for r in result.reverts if r.group == STEM_GROUP)
    assert trial.nodes == stem and trial.format == "fp16"
    tried = result.plan_of(next(p.index for p in result.evaluated if set(stem) <= set(p.fallback_nodes)))
    assert all(tried.precision_of(n) == "fp16" for n in stem)
    assert {tried.precision_of(n) for n, _ in session.quantizable_nodes() if n not in stem} == {"int8"}  # math ops
    kept_8bit = search_mixed_precision(session, budget=3, keep_8bit=("Conv",), **kwargs)
    assert all(r.group != STEM_GROUP for r in kept_8bit.reverts)
    assert all(kept_8bit.plan.precision_of(n) == "int8" for n in stem)
