"""Issue 14 on real zoo models: per-tensor method choice, bias correction, fusion groups from a real TensorRT-RTX
build, the accuracy-target search (reachable and unreachable targets), the Pareto data, first divergence, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.calib.session import CalibrationSession, ort_predict
from workbench.cli import main as cli_main


def _session(name: str, samples: int = 32) -> tuple[object, CalibrationSession]:
    from workbench.zoo import get_entry

    entry = get_entry(name)
    feeds = list(entry.calibration_batches(limit=samples, batch_size=8))
    return entry, CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)


@pytest.fixture(scope="module")
def ocr_cls():
    return _session("ocr-cls")


@pytest.fixture(scope="module")
def digits():
    return _session("digits-cnn")


@pytest.fixture(scope="module")
def efficientnet():
    return _session("efficientnet-lite0", samples=64)


@pytest.mark.parametrize("model", ["ocr_cls", "digits"])
def test_per_tensor_choice_is_never_worse_than_the_best_single_method(model, request) -> None:
    from workbench.calib.choose import choose_methods, local_error
    from workbench.calib.methods import METHODS, compute_amax

    _, session = request.getfixturevalue(model)
    statistics = session.statistics()
    choice = choose_methods(statistics)
    assert len(choice.choices) == len(statistics.histograms) > 0
    for row in choice.choices:
        assert row.local_error <= min(row.errors.values()) + 1e-15
        assert choice.ranges.amax[row.name] == row.amax
    assert choice.total_error <= min(choice.total_error_by_method.values()) * (1 + 1e-12)
    # the errors are the ones each method's own ranges cause, recomputed independently for one tensor
    name, hist = next(iter(statistics.histograms.items()))
    row = next(c for c in choice.choices if c.name == name)
    for method in METHODS:
        assert row.errors[method] == pytest.approx(local_error(hist, compute_amax(hist, method)), rel=1e-9)
    # the chosen ranges make a working Q/DQ model
    assert session.evaluate(session.quantize(choice.ranges), limit=64).value > 0.9


@pytest.mark.slow  # 537 s on 2 busy cores (bias correction of EfficientNet on 4 batches): bench/calibrate.py --mixed
def test_bias_correction_reduces_mean_output_error_on_efficientnet(efficientnet) -> None:
    from workbench.calib.bias import bias_correct

    entry, session = efficientnet
    quantized = session.quantize(session.ranges("mse"))
    feeds = list(session.source.batches(4))
    corrected = bias_correct(session.prepared, quantized.proto, feeds)
    assert len(corrected.corrected) >= 40 and all(np.isfinite(v) for v in corrected.corrected.values())
    held_out = [feed for feed, _ in entry.evaluation_batches(limit=64)]
    reference, before, after = (ort_predict(p) for p in (session.prepared, quantized.proto, corrected.proto))

    def mean_error(predict) -> float:  # RMS over logits of the mean (signed) output error on held-out images
        errors = []
        for feed in held_out:
            ref, out = reference(feed), predict(feed)
            errors.extend((ref[k].astype(np.float64) - out[k]).reshape(len(ref[k]), -1) for k in ref)
        return float(np.sqrt((np.concatenate(errors).mean(axis=0) ** 2).mean()))

    assert mean_error(after) < mean_error(before)


def test_fusion_groups_move_together_as_in_a_real_build(efficientnet) -> None:
    from workbench.calib.cost import build_plan_engine
    from workbench.calib.groups import block_groups, block_of, fusion_groups
    from workbench.engine.layermap import MATH_LAYER_TYPES

    _, session = efficientnet
    ranges = session.ranges("mse")
    full = session.quantize(ranges)
    cost, layer_map = build_plan_engine(full, name="groups")
    placement = session.placement()
    candidates = list(placement.int8_nodes) + list(placement.residual_skips)
    ops = {n.name: n.op_type for n in session.prepared.graph.node}
    groups = fusion_groups(candidates, ops, layer_map)
    group_of = {n: g.name for g in groups for n in g.nodes}
    assert sorted(group_of) == sorted(candidates)
    for layer in layer_map.layers:  # every math kernel's candidates are one group
        present = [n for n in layer.onnx_nodes if n in group_of]
        if layer.layer_type.lower() in MATH_LAYER_TYPES:
            assert len({group_of[n] for n in present}) <= 1, layer.name
    # each residual Add moves with the Conv whose epilogue kernel computes it
    for add in placement.residual_skips:
        group = next(g for g in groups if add in g.nodes)
        assert any(ops[n] == "Conv" for n in group.nodes) and group.why.startswith("fused in layer")
        fused_layer = group.why.removeprefix("fused in layer ")
        assert add in layer_map.layer(fused_layer).onnx_nodes
    assert sum(len(g.nodes) > 1 for g in groups) >= 5
    assert cost.int8_math_layers == cost.math_layers > 40
    # reverting one group to FP16 takes its Conv out of INT8 in the engine
    group = next(g for g in groups if len(g.nodes) > 1)
    conv = next(n for n in group.nodes if ops[n] == "Conv")
    reverted = session.quantize(ranges, session.fallback_plan(group.nodes, "fp16"))
    cost2, layer_map2 = build_plan_engine(reverted, name="reverted")
    conv_layers = [layer_map2.layer(name) for name in layer_map2.layers_of(conv)]
    math = [layer for layer in conv_layers if layer.layer_type.lower() in MATH_LAYER_TYPES]
    assert math and not any(layer.is_int8_kernel for layer in math)
    assert cost2.int8_math_layers == cost.int8_math_layers - 1
    # blocks merge whole fusion groups by name scope
    blocks = block_groups(groups)
    assert block_of("/_blocks.3/_expand_conv/Conv") == "/_blocks.3"
    assert block_of("/encoder/layer.2/attention/self/query/MatMul") == "/encoder/layer.2"
    assert len(blocks) < len(groups)
    for block in blocks:
        for g in groups:
            assert set(g.nodes) <= set(block.nodes) or not set(g.nodes) & set(block.nodes)


def _check_result(result, budget: int) -> None:
    """Invariants of a search result: evaluations, reverts and the Pareto data agree with each other."""
    assert 1 <= result.evaluations_used <= budget
    assert len(result.evaluated) == result.evaluations_used  # the Pareto data holds every evaluated plan
    assert sum(p.chosen for p in result.evaluated) == 1
    assert len(result.reverts) == result.evaluations_used - 1
    group_nodes = {g.name: set(g.nodes) for g in result.groups}
    for plan in result.evaluated:  # a plan never splits a group
        fallen = set(plan.fallback_nodes)
        assert all(nodes <= fallen or not nodes & fallen for nodes in group_nodes.values())
        assert plan.cost is not None and plan.cost.engine_layers > 0 and "not speed" in plan.cost.label
    current = result.int8_metric
    for revert in result.reverts:
        assert revert.metric_before == current
        current = revert.metric_after if revert.kept else current
    assert current == result.metric == result.chosen.metric
    assert result.plan.overrides == dict.fromkeys(result.fallback_nodes, result.fallback)
    assert type(result).from_json(json.loads(json.dumps(result.to_json()))).metric == result.metric
    from workbench.viz.calib import pareto_figure, pareto_rows

    rows = pareto_rows(result)  # the Pareto data: every evaluated plan, the chosen one marked
    assert [r["index"] for r in rows] == list(range(result.evaluations_used))
    assert [r["metric"] for r in rows] == [p.metric for p in result.evaluated]
    assert sum(r["chosen"] for r in rows) == 1 and all(r["cost"] is not None for r in rows)
    figure = pareto_figure(result)
    plotted = sum(len(trace.x) for trace in figure.data if trace.name != "chosen plan")
    assert plotted == 2 * len(rows)  # every plan on both panels (INT8 share, engine cost)
    _check_front(result)


def _check_front(result) -> None:
    """The Pareto front: no plan on it is dominated, every plan off it is dominated by one on it."""

    def point(plan) -> tuple[float, float, float]:
        return (plan.metric if result.higher_is_better else -plan.metric, plan.int8_share, -plan.cost.score)

    def dominates(a, b) -> bool:
        return all(x >= y for x, y in zip(point(a), point(b))) and point(a) != point(b)

    front = result.front
    assert front and all(p in result.evaluated for p in front)
    for plan in result.evaluated:
        beaten = [other for other in result.evaluated if dominates(other, plan)]
        assert (plan in front) == (not beaten), plan.index
        if beaten:
            assert any(dominates(other, plan) for other in front)
    for plan in result.evaluated:  # every plan carries what its interval needs, and its plan rebuilds
        assert plan.n_samples == result.evaluation_samples == len(plan.scores)
        assert np.mean(plan.scores) == pytest.approx(plan.metric)
    assert result.plan_of(result.chosen.index).overrides == result.plan.overrides


def test_search_meets_a_reachable_target_on_ocr_cls(ocr_cls) -> None:
    from workbench.calib.search import search_mixed_precision

    _, session = ocr_cls
    result = search_mixed_precision(session, target_drop=0.02, budget=5, limit=200)
    assert result.met and result.metric >= result.target == pytest.approx(result.fp32_metric - 0.02)
    assert result.evaluation_samples == 200
    _check_result(result, 5)


def test_search_reports_an_unreachable_target_honestly(digits) -> None:
    from workbench.calib.search import search_mixed_precision

    _, session = digits
    result = search_mixed_precision(session, target=1.01, budget=3, limit=100, fallback="fp32")
    assert not result.met and result.metric < 1.01
    assert result.stop_reason in ("budget of 3 evaluations spent", "no group left to revert")
    assert "NOT met" in result.summary()
    _check_result(result, 3)


# The EfficientNet figure (>= 0.95 top-1 agreement, >= 80 % Conv INT8, <= 30 evaluations) takes ~25 min and
# sits on a knife edge (its interval's low end is 0.920): it lives in `bench/calibrate.py --mixed --models
# efficientnet-lite0`, which prints the check with its interval. The tests here check the mechanism on reachable cases.


def test_cli_target_drop_and_first_divergence(digits, tmp_path, capsys) -> None:
    out = tmp_path / "digits.onnx"
    code = cli_main(
        [
            "calibrate",
            "digits-cnn",
            "--target-drop",
            "0.01",
            "--budget",
            "2",
            "--eval-limit",
            "100",
            "--method",
            "max",
            "--max-batches",
            "4",
            "-o",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "mixed precision:" in printed and "task evaluations" in printed
    report = json.loads(out.with_suffix(".mixed.json").read_text())
    assert report["evaluations_used"] == len(report["evaluated"]) and report["fallback"] == "fp16"
    assert (
        cli_main(
            [
                "diff",
                "digits-cnn",
                str(out),
                "-o",
                str(tmp_path / "d.json"),
                "--max-batches",
                "2",
                "--threshold",
                "60",
                "--no-progress",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "first divergence below 60 dB: tensor" in printed and "engine layer:" in printed
    # bad input: a search on your own file without samples to evaluate on
    from workbench.zoo import get_entry

    plain = tmp_path / "plain.onnx"
    plain.write_bytes(get_entry("digits-cnn").onnx_path().read_bytes())
    assert cli_main(["calibrate", str(plain), "--target-drop", "0.01", "-o", str(tmp_path / "p.onnx")]) == 2
    assert "--target-drop on your own file" in capsys.readouterr().err


def test_first_divergence_names_the_first_tensor_below_the_threshold(ocr_cls) -> None:
    from workbench.calib.cost import build_plan_engine
    from workbench.calib.diff import first_divergence

    _, session = ocr_cls
    quantized = session.quantize(session.ranges("mse"))
    diff = session.diff(quantized, max_batches=1)
    _, layer_map = build_plan_engine(quantized, name="div")
    rows = sorted(
        (r for r in diff.tensors if r.kind == "activation" and r.sqnr_db_accumulated is not None), key=lambda r: r.index
    )
    threshold = float(np.median([r.sqnr_db_accumulated for r in rows]))
    found = first_divergence(diff, threshold, layer_map)
    assert found is not None and found.sqnr_db_accumulated < threshold
    assert all(r.sqnr_db_accumulated >= threshold for r in rows if r.index < found.index)
    assert found.engine_layers and all(found.node in layer_map.layer(n).onnx_nodes for n in found.engine_layers)
    assert first_divergence(diff, -1000.0, layer_map) is None


def test_quantize_attention_puts_qdq_on_both_attention_inputs() -> None:
    from workbench.zoo import get_entry

    entry = get_entry("minilm")
    feeds = list(entry.calibration_batches(limit=8, batch_size=8))
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False, quantize_attention=True)
    attention = session.attention_matmuls()
    assert len(attention) == 12  # 6 layers x (Q.K^T, softmax.V)
    quantized = session.quantize(session.ranges("mse"))
    assert set(attention) <= set(quantized.placement.int8_nodes)
    dq_outputs = {n.output[0] for n in quantized.proto.graph.node if n.op_type == "DequantizeLinear"}
    for node in quantized.proto.graph.node:
        if node.name in attention:
            assert all(name in dq_outputs for name in node.input[:2]), node.name
    # a revert to FP16 takes an attention MatMul out of INT8 again
    plan = session.fallback_plan([attention[0]], "fp16")
    assert attention[0] not in session.int8_nodes(plan) and attention[1] in session.int8_nodes(plan)
    assert session.evaluate(quantized, limit=16).value > 0.9
