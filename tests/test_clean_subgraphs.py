"""Cleaning models with control flow, recurrent layers and shared-value weights (issue 13), on real models:
Silero VAD as the silero-vad wheel ships it, and PyTorch modules exported here (scripted loop and if, GRU, equal
weights in separate parameters). Every pass is checked against ONNX Runtime; a broken pass is rolled back."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from workbench.clean import CleanOptions, CleanPass, clean_model
from workbench.clean.checks import ort_session, value_hints
from workbench.clean.graph_utils import iter_graph_protos, iter_node_protos, subgraph_node_count
from workbench.cli import main
from workbench.errors import WorkbenchError

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from control_flow_models import export_torch_model, silero_feeds, silero_vad_path  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("control_flow")
    cache: dict[str, tuple[Path, dict]] = {}

    def get(name: str) -> tuple[Path, dict]:
        if name not in cache:
            cache[name] = export_torch_model(name, folder)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def silero() -> Path:
    return silero_vad_path("silero_vad.onnx")


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in iter_node_protos(model.graph)]


def _assert_clean_run(result) -> None:
    assert not result.rolled_back, [(r.name, r.failure) for r in result.rolled_back]
    kept = [r for r in result.passes if r.status == "accepted"]
    assert kept and all(r.max_abs_diff is not None for r in kept)
    assert all(r.max_abs_diff == 0.0 for r in kept if r.tolerance == "exact")


def _same_outputs(original: onnx.ModelProto, cleaned: onnx.ModelProto, feeds: list[dict]) -> None:
    """Independent of the pipeline's own checks: both models in ORT on the same feeds."""
    a, b = ort_session(original), ort_session(cleaned)
    for feed in feeds:
        for ref, got in zip(a.run(None, feed), b.run(None, feed)):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def _outer_reads_defined(model: onnx.ModelProto) -> None:
    """Every name a subgraph reads from outside is still defined in an enclosing scope (never removed/renamed)."""

    def walk(graph: onnx.GraphProto, visible: set[str]) -> None:
        names = visible | {i.name for i in graph.input} | {i.name for i in graph.initializer}
        names |= {out for node in graph.node for out in node.output}
        for node in graph.node:
            for name in node.input:
                assert not name or name in names, f"{node.op_type} {node.name} reads undefined {name!r}"
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g, names)

    walk(model.graph, set())


def test_silero_vad_cleaned_with_real_batches_through_the_cli(silero, tmp_path, capsys):
    feeds = silero_feeds(3)
    data = tmp_path / "batches"
    data.mkdir()
    for index, feed in enumerate(feeds):
        np.savez(data / f"batch_{index:03d}.npz", **feed)
    out, report = tmp_path / "vad.onnx", tmp_path / "report.json"

    code = main(
        ["clean", str(silero), "-o", str(out), "--report", str(report), "--data", str(data), "--check-batches", "3"]
    )

    assert code == 0
    printed = capsys.readouterr().out
    assert "outputs compared on 3 batch(es)" in printed and "nodes inside If/Loop/Scan bodies" in printed
    original, cleaned = onnx.load(silero), onnx.load(out)
    before, after = subgraph_node_count(original), subgraph_node_count(cleaned)
    assert after < 0.5 * before  # the LSTM and STFT live inside the If branches
    assert len(_ops(cleaned)) < 0.5 * len(_ops(original))
    _same_outputs(original, cleaned, feeds)
    _outer_reads_defined(cleaned)


def test_silero_vad_runs_with_profile_thanks_to_value_hints(silero):
    model = onnx.load(silero)
    assert value_hints(model) == {"sr": [16000]}  # Equal(sr, 16000) feeds the top-level If
    profile = {"input": [(1, 512), (2, 512), (2, 512)], "state": [(2, 1, 128), (2, 2, 128), (2, 2, 128)]}

    result = clean_model(model, CleanOptions(profile=profile))

    _assert_clean_run(result)
    assert result.subgraph_nodes_after < result.subgraph_nodes_before
    _same_outputs(model, result.model, silero_feeds(2))
    # the nodes-per-pass figure counts the nodes inside the If branches too
    from workbench.viz.clean import node_waterfall_figure

    bars = node_waterfall_figure(result).data[0].y
    assert bars[0] == len(_ops(model)) == result.nodes_before and bars[-1] == len(_ops(result.model))
    assert len(model.graph.node) < 10 < result.nodes_after  # the top level alone holds almost nothing


def test_no_probe_runs_names_the_inputs_and_suggests_data(silero, capsys):
    # shapes the user chose are not searched around (without --profile the checker finds 256 samples; see
    # test_clean_probes.py): too short for the STFT's reflect padding, they fail with ORT's reason
    too_short = ["--profile", "input:1x32/1x32/1x32", "--profile", "state:2x1x128/2x1x128/2x1x128"]
    code = main(["clean", str(silero), "-o", "/tmp/never-written.onnx", *too_short])

    assert code == 2
    err = capsys.readouterr().err
    assert "runs in ONNX Runtime on none of the generated probe inputs" in err
    assert "input: float32 [1, 32]" in err and "sr: int64 [] = 16000" in err  # which inputs, with what values
    assert "Pad" in err  # and how it failed
    assert "--data" in err
    assert not Path("/tmp/never-written.onnx").exists()


def test_bad_user_batches_are_rejected_by_name(silero, tmp_path):
    model = onnx.load(silero)
    feed = silero_feeds(1)[0]
    with pytest.raises(WorkbenchError, match=r"lacks model input\(s\) \['sr'\]"):
        clean_model(model, CleanOptions(data=[{k: v for k, v in feed.items() if k != "sr"}]))
    with pytest.raises(WorkbenchError, match="input 'sr' is float32"):
        clean_model(model, CleanOptions(data=[{**feed, "sr": np.array(16000.0, np.float32)}]))
    with pytest.raises(WorkbenchError, match="fails in ONNX Runtime on data batch 0"):
        clean_model(model, CleanOptions(data=[{**feed, "input": feed["input"][:, :32]}]))
    np.save(tmp_path / "one.npy", feed["input"])
    with pytest.raises(WorkbenchError, match=r"\.npy batches hold one array, but the model has 3 inputs"):
        clean_model(model, CleanOptions(data=tmp_path))


def test_constant_condition_if_is_inlined(exported):
    path, profile = exported("torch-script-if")
    model = onnx.load(path)
    assert "If" in _ops(model) and subgraph_node_count(model) > 0

    result = clean_model(model, CleanOptions(profile=profile))

    _assert_clean_run(result)
    assert result.report("inline_constant_if").status == "accepted"
    assert "If" not in _ops(result.model) and result.subgraph_nodes_after == 0
    assert result.nodes_after < result.nodes_before / 3
    out = result.model.graph.output[0]
    assert out.name == "y" and out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    _same_outputs(model, result.model, [{"x": np.random.default_rng(1).standard_normal((3, 8), np.float32)}])


def test_loop_body_is_cleaned_and_outer_tensors_kept(exported):
    path, profile = exported("torch-script-loop")
    model = onnx.load(path)

    result = clean_model(model, CleanOptions(profile=profile))

    _assert_clean_run(result)
    assert "Loop" in _ops(result.model)
    assert 0 < result.subgraph_nodes_after < result.subgraph_nodes_before
    assert result.nodes_after < result.nodes_before
    body = next(g for g in iter_graph_protos(result.model.graph) if g is not result.model.graph)
    assert "x" in {name for node in body.node for name in node.input}  # the body still reads the outer input
    _outer_reads_defined(result.model)
    rng = np.random.default_rng(2)
    _same_outputs(
        model, result.model, [{"x": rng.standard_normal((b, s, 16), np.float32)} for b, s in ((1, 1), (3, 6))]
    )


def test_zero_initial_state_of_a_gru_is_dropped(exported):
    path, profile = exported("torch-gru")
    model = onnx.load(path)
    gru = next(node for node in model.graph.node if node.op_type == "GRU")
    assert len(gru.input) == 6 and gru.input[5]  # torch writes the zero initial_h, computed from the batch size

    result = clean_model(model, CleanOptions(profile=profile))

    _assert_clean_run(result)
    gru = next(node for node in result.model.graph.node if node.op_type == "GRU")
    assert len(gru.input) <= 5
    assert "ConstantOfShape" not in _ops(result.model)
    assert result.nodes_after < result.nodes_before / 2
    _same_outputs(model, result.model, [{"x": np.random.default_rng(3).standard_normal((2, 9, 12), np.float32)}])


def test_value_cse_merges_nodes_with_equal_weights_under_other_names(exported):
    path, profile = exported("shared-weights")
    model = onnx.load(path)
    assert _ops(model).count("Conv") == 2

    result = clean_model(model, CleanOptions(profile=profile))

    _assert_clean_run(result)
    cse = result.report("cse")
    assert cse.status == "accepted" and cse.max_abs_diff == 0.0
    assert _ops(result.model).count("Conv") == 1 and _ops(result.model).count("Gemm") <= 1
    _same_outputs(model, result.model, [{"x": np.random.default_rng(4).standard_normal((2, 3, 16, 16), np.float32)}])


def _break_subgraph_adds(graph, context) -> None:
    """A wrong rewrite, only inside subgraphs: Add becomes Sub."""
    if context.root is None:
        return
    for node in graph.nodes:
        if node.op == "Add":
            node.op = "Sub"


def test_a_broken_pass_inside_a_loop_body_is_rolled_back(exported):
    path, profile = exported("torch-script-loop")
    model = onnx.load(path)
    broken = CleanPass("break_subgraph_adds", _break_subgraph_adds, "exact", "test: breaks Add inside bodies")

    result = clean_model(model, CleanOptions(profile=profile, passes=["fold_constants", broken, "remove_noops"]))

    report = result.report("break_subgraph_adds")
    assert report.status == "rolled_back" and "output 'y'" in report.failure
    assert "Sub" not in _ops(result.model)
    assert result.report("remove_noops").status == "accepted"  # the run went on from the last good graph
    _same_outputs(model, result.model, [{"x": np.random.default_rng(5).standard_normal((2, 4, 16), np.float32)}])


def test_npy_batches_for_a_one_input_model_and_check_batches_bound(exported, tmp_path, capsys):
    path, _ = exported("torch-gru")
    data = tmp_path / "npy"
    data.mkdir()
    rng = np.random.default_rng(6)
    for index, steps in enumerate((4, 9, 13)):
        np.save(data / f"batch_{index}.npy", rng.standard_normal((index + 1, steps, 12), np.float32))

    code = main(["clean", str(path), "-o", str(tmp_path / "gru.onnx"), "--data", str(data), "--check-batches", "2"])

    assert code == 0
    assert "outputs compared on 2 batch(es)" in capsys.readouterr().out
    assert main(["clean", str(path), "-o", str(tmp_path / "x.onnx"), "--check-batches", "2"]) == 2
    assert "--check-batches needs --data" in capsys.readouterr().err

    nan_data = tmp_path / "nan"  # batches that cannot show a difference are refused, nothing is written
    nan_data.mkdir()
    np.save(nan_data / "batch_0.npy", np.full((1, 4, 12), np.nan, np.float32))
    assert main(["clean", str(path), "-o", str(tmp_path / "n.onnx"), "--data", str(nan_data)]) == 2
    assert "entirely NaN/Inf" in capsys.readouterr().err and not (tmp_path / "n.onnx").exists()
    np.save(nan_data / "batch_0.npy", np.zeros((0, 4, 12), np.float32))
    assert main(["clean", str(path), "-o", str(tmp_path / "n.onnx"), "--data", str(nan_data)]) == 2
    assert "holds no sample" in capsys.readouterr().err and not (tmp_path / "n.onnx").exists()


def test_consecutive_slices_merge_and_identity_reshape_goes(tmp_path):
    import torch

    class Crop(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x[:, 1:5, 2:7]  # PyTorch writes one Slice per axis
            z = torch.relu(y).reshape(y.size(0), 4, -1)  # the shape it already has
            return z[:, :, :] * 2.0  # a whole-range Slice

    path = tmp_path / "crop.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter is deprecated
        torch.onnx.export(
            Crop(),
            (torch.randn(2, 8, 9),),
            str(path),
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    model = onnx.load(path)
    assert _ops(model).count("Slice") >= 2 and "Reshape" in _ops(model)

    result = clean_model(model, CleanOptions(profile={"x": [(1, 8, 9), (2, 8, 9), (3, 8, 9)]}))

    _assert_clean_run(result)
    assert result.report("merge_consecutive").status == "accepted"
    assert _ops(result.model).count("Slice") == 1  # merged, and the whole-range one removed
    assert "Reshape" not in _ops(result.model)
    _same_outputs(model, result.model, [{"x": np.random.default_rng(7).standard_normal((3, 8, 9), np.float32)}])


def test_zoo_calibration_set_as_check_data(tmp_path, capsys):
    code = main(["clean", "digits-cnn", "-o", str(tmp_path / "d.onnx"), "--data", "zoo", "--check-batches", "2"])

    assert code == 0
    assert "outputs compared on 2 batch(es) of zoo:digits-cnn" in capsys.readouterr().out
