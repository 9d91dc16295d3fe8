"""The accuracy-target search over formats on a real model: a group that hurts in INT8 is tried in FP8 before FP16,
every evaluated plan records its formats, the result is the same on a second run, and the CLI takes --formats."""

from __future__ import annotations

import pytest

from workbench.calib.search import search_mixed_precision


@pytest.fixture(scope="module")
def digits():  # type: ignore[no-untyped-def]
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=32, batch_size=8))
    return CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)


def test_fp8_is_tried_before_fp16_and_the_search_repeats_exactly(digits) -> None:  # type: ignore[no-untyped-def]
    """An unreachable target makes the search climb every ladder rung it can within the budget: each group goes to
    FP8 first, then FP16; two runs give the same plans, metrics and per-sample scores."""
    lines: list[str] = []
    kwargs = {"target": 1.01, "budget": 4, "limit": 120, "formats": ("int8", "fp8", "fp16"), "build_costs": False}
    first = search_mixed_precision(digits, progress=lambda event: lines.append(event.text()), **kwargs)
    assert not first.met and first.formats == ("int8", "fp8", "fp16")
    tried = [(r.group, r.format) for r in first.reverts]
    assert tried[0][1] == "fp8"
    for index, (group, fmt) in enumerate(tried):  # a group reaches FP16 only after its FP8 trial
        if fmt == "fp16":
            assert (group, "fp8") in tried[:index]
    # every evaluated plan records its per-node formats; its plan can be rebuilt from them
    trial = first.evaluated[1]
    assert trial.format_counts.get("fp8") or trial.format_counts.get("fp16")
    assert first.plan_of(1).overrides == trial.overrides
    assert sum(trial.format_counts.values()) == trial.math_nodes
    # progress: one line per evaluation, with the count and the elapsed time
    assert len(lines) == 1 + len(first.reverts) and all("evaluations" in line for line in lines)
    second = search_mixed_precision(digits, **kwargs)
    assert [(r.group, r.format, r.metric_after, r.kept) for r in second.reverts] == [
        (r.group, r.format, r.metric_after, r.kept) for r in first.reverts
    ]
    assert [p.scores for p in second.evaluated] == [p.scores for p in first.evaluated]
    assert second.plan == first.plan


def test_formats_must_be_a_ladder(digits) -> None:  # type: ignore[no-untyped-def]
    from workbench.errors import WorkbenchError

    with pytest.raises(WorkbenchError, match="not a ladder"):
        search_mixed_precision(digits, target_drop=0.01, formats=("fp16", "int8"), build_costs=False)
    with pytest.raises(WorkbenchError, match="not a ladder"):
        search_mixed_precision(digits, target_drop=0.01, formats=("int8", "int8"), build_costs=False)


def test_cli_formats(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from cli_runner import run_cli_forked

    out = tmp_path / "digits.onnx"
    run = run_cli_forked(
        [
            "calibrate",
            "digits-cnn",
            "--target-drop",
            "0.001",
            "--formats",
            "int8,fp8,fp16",
            "--budget",
            "2",
            "--eval-limit",
            "100",
            "--max-batches",
            "2",
            "-o",
            str(out),
            "--no-progress",
        ],
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "digits.mixed.json").read_text())
    assert report["formats"] == ["int8", "fp8", "fp16"]
    assert "mixed precision: top1_accuracy" in run.stdout
    no_search = run_cli_forked(["calibrate", "digits-cnn", "--formats", "int8,fp8", "-o", str(out)], cwd=tmp_path)
    assert no_search.returncode == 2 and "--target-drop" in no_search.stderr


def test_prefix_cache_gives_the_metric_of_a_full_evaluation(digits) -> None:  # type: ignore[no-untyped-def]
    """Plans evaluated from cached activations score every sample exactly as a full ONNX Runtime run does, also
    after the cache adopts a changed plan as its base; the search gives the same result with and without it."""
    from workbench.calib.prefix import PrefixCache

    session = digits
    ranges = session.ranges("mse")
    nodes = session.quantized_nodes()
    base = session.quantize(ranges)
    cache = PrefixCache(session, base, limit=120, cut_nodes=nodes)
    assert list(cache.base_result.scores) == list(session.evaluate(base, limit=120).scores)
    late = session.default_plan().with_overrides({nodes[-1]: "fp8"})
    late_model = session.quantize(ranges, late)
    cached = cache.evaluate(late_model, nodes[-1])
    assert cache.last_cut > 0  # it ran only the suffix
    full = session.evaluate(late_model, limit=120)
    assert cached.value == full.value and list(cached.scores) == list(full.scores)
    cache.adopt()  # the late plan becomes the base; a plan changing an earlier node on top of it
    both = late.with_overrides({nodes[2]: "fp16"})
    both_model = session.quantize(ranges, both)
    again = cache.evaluate(both_model, nodes[2])
    assert 0 < cache.last_cut
    assert list(again.scores) == list(session.evaluate(both_model, limit=120).scores)
    kwargs = {"target": 1.01, "budget": 3, "limit": 120, "formats": ("int8", "fp8", "fp16"), "build_costs": False}
    with_cache = search_mixed_precision(session, early_stop=False, **kwargs)
    without = search_mixed_precision(session, prefix_cache=False, **kwargs)
    assert [p.scores for p in with_cache.evaluated] == [p.scores for p in without.evaluated]


def test_early_stop_ends_an_evaluation_the_paired_interval_decides(digits) -> None:  # type: ignore[no-untyped-def]
    """A plan whose input ranges clip nearly everything is stopped once the paired 99 % interval of its per-sample
    difference to the base lies below zero; the samples it did run score exactly as in a full evaluation."""
    import numpy as np

    from workbench.calib.prefix import MIN_SAMPLES, PrefixCache

    session = digits
    ranges = session.ranges("mse")
    base = session.quantize(ranges)
    cache = PrefixCache(session, base, limit=200, cut_nodes=session.quantized_nodes())
    reference = np.asarray(cache.base_result.scores)
    clipped = {name: value / 1000.0 for name, value in ranges.amax.items()}  # a real model, ruinous ranges
    from workbench.calib.qdq import insert_qdq

    bad = insert_qdq(session.prepared, clipped, session.default_plan(), prepared=True)

    def decides(partial) -> bool:  # type: ignore[no-untyped-def]
        gain = np.asarray(partial.scores) - reference[: len(partial.scores)]
        return bool(gain.mean() + 2.576 * gain.std(ddof=1) / np.sqrt(gain.size) < 0)

    stopped = cache.evaluate(bad, None, decides)
    assert stopped.details.get("stopped_early") and MIN_SAMPLES <= stopped.n_samples < 200
    full = session.evaluate(bad, limit=200)
    assert list(stopped.scores) == list(full.scores)[: stopped.n_samples]
    assert full.value < cache.base_result.value - 0.2
