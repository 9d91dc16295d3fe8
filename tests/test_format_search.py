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
    # the search chose the weight rounding by the start plan's score (--weight-rounding auto, its default)
    assert report["weight_rounding"] in ("nearest", "gptq")
    assert any(note.startswith("weights rounded by") for note in report["notes"])
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


def test_screening_scores_trials_on_a_subset_and_the_pick_on_the_whole_set(digits) -> None:  # type: ignore[no-untyped-def]
    """With ``screen`` the trials run on the first samples only; the plan the search ends on is evaluated on the
    whole set, and that whole-set number is the result's (the same as a plain evaluation of the plan)."""
    kwargs = {"budget": 3, "limit": 200, "formats": ("int8", "fp8", "fp16"), "build_costs": False, "screen": 64}
    result = search_mixed_precision(digits, target=1.01, **kwargs)
    assert result.screening_samples == 64 and not result.met
    trials = [p for p in result.evaluated if not p.chosen]
    assert trials and all(p.n_samples <= 64 for p in trials)
    chosen = result.chosen
    assert chosen.n_samples == result.evaluation_samples == 200
    whole = digits.evaluate(digits.quantize(digits.ranges("mse"), result.plan), limit=200)
    assert result.metric == whole.value and list(chosen.scores) == list(whole.scores)
    assert result.evaluations_used == len(result.evaluated) == 1 + len(result.reverts) + 1  # + the confirmation
    again = search_mixed_precision(digits, target=1.01, **kwargs)  # the same command gives the same plans and scores
    assert [(p.overrides, p.scores) for p in again.evaluated] == [(p.overrides, p.scores) for p in result.evaluated]
    easy = search_mixed_precision(digits, target_drop=0.5, **kwargs)  # all-INT8 meets it on the screen and the set
    assert easy.met and easy.stop_reason == "target met by all-INT8" and easy.evaluation_samples == 200
    assert [p.n_samples for p in easy.evaluated] == [64, 200]


# a target above 1.0 over formats int8,fp8,fp16 with every Conv kept in 8 bits
UNREACHABLE_WITH_8_BIT_CONVS = {
    "target": 1.01,
    "formats": ("int8", "fp8", "fp16"),
    "build_costs": False,
    "keep_8bit": ("Conv",),
}


def test_keep_8bit_never_moves_those_ops_out_of_8_bits(digits) -> None:  # type: ignore[no-untyped-def]
    """``keep_8bit=("Conv",)``: an unreachable target walks the ladder, yet every Conv stays INT8 or FP8 (groups
    with nothing but Convs stop at FP8); other ops may still go to FP16."""
    result = search_mixed_precision(digits, budget=8, limit=120, reach_check=False, **UNREACHABLE_WITH_8_BIT_CONVS)
    ops = {node.name: node.op_type for node in digits.prepared.graph.node}
    convs = [name for name, op in ops.items() if op == "Conv"]
    assert any(r.format == "fp8" for r in result.reverts)
    for revert in result.reverts:
        if revert.format == "fp16":
            assert not any(ops[n] == "Conv" for n in revert.nodes), revert
    assert all(result.plan.precision_of(n) in ("int8", "fp8") for n in convs)
    assert result.ops_by_type["Conv"] == [len(convs), len(convs)]


def test_the_search_uses_fp8_where_an_outlier_ruins_int8() -> None:
    """One hot pixel (200 where images hold -1..1) in one calibration image: max ranges then span the outlier on
    every layer it reaches, INT8's 255 levels leave typical values almost nothing (real model, real ONNX Runtime:
    all-INT8 collapses), while FP8's exponent keeps them. Searching over int8,fp8,fp16, the per-layer diff puts
    those layers in FP8 in its first trial and the target is met with every math node in 8 bits, none in FP16."""
    from workbench.calib.session import CalibrationSession
    from workbench.zoo import get_entry

    entry = get_entry("digits-cnn")
    feeds = list(entry.calibration_batches(limit=32, batch_size=8))
    name = next(iter(feeds[0]))
    feeds[0][name] = feeds[0][name].copy()
    feeds[0][name][0, ..., 3, 3] = 200.0
    session = CalibrationSession(entry.load(), data=feeds, entry=entry, progress=False)
    ranges = session.ranges("max")
    int8 = session.evaluate(session.quantize(ranges, session.default_plan("int8")), limit=200).value
    fp8 = session.evaluate(session.quantize(ranges, session.default_plan("fp8")), limit=200).value
    fp32 = session.evaluate(limit=200).value
    assert int8 < fp32 - 0.3 and fp8 >= fp32 - 0.01  # INT8 fails, FP8 holds
    result = search_mixed_precision(
        session,
        target_drop=0.01,
        ranges=ranges,
        limit=200,
        budget=6,
        formats=("int8", "fp8", "fp16"),
        build_costs=False,
    )
    assert result.met and result.metric >= fp32 - 0.01
    counts = result.chosen.format_counts
    assert counts.get("fp8", 0) >= 1 and "fp16" not in counts and "fp32" not in counts
    first = result.reverts[0]  # the first trial (no residual skips here): each node in its better 8-bit format
    assert first.group == "8-bit mix (per-layer diff)" and first.kept and first.metric_after >= fp32 - 0.01


def test_efficientnet_crops_are_cached_exactly(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The resized crops kept in memory and in the cache folder give the very arrays the uncached preprocessing
    gives (a search scores every plan on 1,000 of them)."""
    import numpy as np

    from workbench.zoo import efficientnet

    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    entry = efficientnet.EfficientNetLite0Entry()
    entry.split_sizes = {"calibration": 8, "evaluation": 12}  # a small split: the file is written once all are made
    expected = [
        efficientnet.preprocess_photo(efficientnet.random_crop(efficientnet.sample_rng("evaluation", i, salt=4)))
        for i in range(12)
    ]
    first = [entry._sample("evaluation", i)[0]["image"] for i in range(12)]
    assert all(np.array_equal(a, b) for a, b in zip(first, expected))
    files = list(tmp_path.glob("zoo/efficientnet-lite0/crops-evaluation-12-*.npy"))
    assert len(files) == 1
    again = efficientnet.EfficientNetLite0Entry()
    again.split_sizes = entry.split_sizes
    assert all(np.array_equal(again._sample("evaluation", i)[0]["image"], expected[i]) for i in range(12))
    assert isinstance(again._crops["evaluation"], np.ndarray)  # read from the file, not made again


def test_the_fp32_metric_is_kept_in_the_cache_folder(digits) -> None:  # type: ignore[no-untyped-def]
    """The FP32 model's metric (a search's first, full pass) is stored with its per-sample scores and read back
    unchanged by a new session."""
    from workbench.calib.session import CalibrationSession

    entry = digits.entry
    stored = list((entry.cache_folder / "metrics").glob("*-limit37.json"))
    for path in stored:
        path.unlink()
    first = digits.evaluate(limit=37)
    written = list((entry.cache_folder / "metrics").glob("*-limit37.json"))
    assert len(written) == 1
    fresh = CalibrationSession(entry.load(), data=digits.source, entry=entry, progress=False)
    second = fresh.evaluate(limit=37)
    assert second.value == first.value and second.scores == first.scores and second.n_samples == 37
    direct = entry.evaluate_onnx(entry.onnx_path(), limit=37)
    assert direct.scores == first.scores
    written[0].unlink()


def test_onnx_runtime_threads_are_pinned(digits, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every numeric session runs on the same thread counts whatever the machine (2 intra-op, 1 inter-op), unless
    WORKBENCH_ORT_THREADS says otherwise; a bad value is refused."""
    from workbench.errors import WorkbenchError
    from workbench.ort import cpu_session

    options = cpu_session(digits.prepared).get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    monkeypatch.setenv("WORKBENCH_ORT_THREADS", "3")
    assert cpu_session(digits.prepared).get_session_options().intra_op_num_threads == 3
    monkeypatch.setenv("WORKBENCH_ORT_THREADS", "many")
    with pytest.raises(WorkbenchError, match="WORKBENCH_ORT_THREADS"):
        cpu_session(digits.prepared)


def test_waiting_threads_sleep_when_asked_with_the_same_outputs(digits, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """WORKBENCH_ORT_SPIN=0 (make test sets it) lets waiting intra-op threads sleep: a scheduling choice, the same
    output bits; unset or 1 leaves ONNX Runtime's default (spin); another value is refused."""
    import numpy as np

    from workbench.errors import WorkbenchError
    from workbench.ort import cpu_session
    from workbench.zoo import get_entry

    feed = next(iter(get_entry("digits-cnn").calibration_batches(limit=8, batch_size=8)))
    outputs = {}
    for value in ("0", "1"):
        monkeypatch.setenv("WORKBENCH_ORT_SPIN", value)
        session = cpu_session(digits.prepared)
        try:
            entry = session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
        except RuntimeError:  # not set: ONNX Runtime's default (spin)
            entry = None
        assert entry == ("0" if value == "0" else None), entry
        outputs[value] = session.run(None, feed)
    assert all(np.array_equal(a, b) for a, b in zip(outputs["0"], outputs["1"]))
    monkeypatch.setenv("WORKBENCH_ORT_SPIN", "off")
    with pytest.raises(WorkbenchError, match="WORKBENCH_ORT_SPIN='off' is not a switch"):
        cpu_session(digits.prepared)


def test_an_unreachable_target_with_8_bit_convs_stops_after_the_widest_plan(digits) -> None:  # type: ignore[no-untyped-def]
    """With every Conv kept in 8 bits, a target no plan can reach (above 1.0) is found out of reach from the widest
    plan the rules allow (everything else in FP16): the search stops there instead of spending its budget, and its
    answer is scored on the whole set."""
    result = search_mixed_precision(digits, budget=10, limit=200, screen=64, **UNREACHABLE_WITH_8_BIT_CONVS)
    assert not result.met and "out of reach" in result.stop_reason
    assert result.evaluations_used <= 3 and not result.reverts
    assert result.chosen.n_samples == 200
    ops = {node.name: node.op_type for node in digits.prepared.graph.node}
    assert all(result.plan.precision_of(n) in ("int8", "fp8") for n, op in ops.items() if op == "Conv")
