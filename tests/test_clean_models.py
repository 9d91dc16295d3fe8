"""Real zoo models cleaned end to end with the equivalence checks, the CLI, and bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from workbench._io import sha256_file
from workbench.clean import CleanOptions, clean_file, clean_model
from workbench.clean.checks import ort_session
from workbench.cli import main
from workbench.errors import WorkbenchError


@pytest.fixture(scope="module")
def zoo():
    from workbench.zoo import get_entry

    return get_entry


@pytest.mark.parametrize("name", ["ocr-cls", "ocr-rec", "digits-cnn"])
def test_zoo_model_cleaned_end_to_end_and_still_equivalent(zoo, name, tmp_path):
    entry = zoo(name)
    source = tmp_path / f"{name}.onnx"
    shutil.copy(entry.onnx_path(), source)
    digest = sha256_file(source)

    result = clean_file(source, tmp_path / "clean.onnx", CleanOptions(profile=entry.input_profiles()))

    assert sha256_file(source) == digest  # the input is never modified
    assert not result.rolled_back, [(r.name, r.failure) for r in result.rolled_back]
    assert result.nodes_after <= result.nodes_before
    checked = [r for r in result.passes if r.status == "accepted"]
    assert all(r.max_abs_diff is not None for r in checked)
    assert all(r.status in ("accepted", "unchanged", "report_only") for r in result.passes)
    assert all(r.max_abs_diff == 0.0 for r in checked if r.tolerance == "exact")
    # independent of the pipeline's own check: real samples through original and cleaned model agree
    original, cleaned = ort_session(onnx.load(source)), ort_session(onnx.load(tmp_path / "clean.onnx"))
    feed, _ = next(iter(entry.evaluation_batches(limit=4, batch_size=4)))
    for ref, got in zip(original.run(None, feed), cleaned.run(None, feed)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    if name != "digits-cnn":  # the PP-OCR graphs carry Constant nodes, BN and shape subgraphs
        assert len(checked) >= 4
        assert result.nodes_after < 0.8 * result.nodes_before
        assert result.op_counts_after.get("Constant", 0) == 0


def test_cli_clean_writes_model_and_report(zoo, tmp_path, capsys):
    source = zoo("ocr-cls").onnx_path()
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"

    code = main(
        [
            "clean",
            str(source),
            "-o",
            str(out),
            "--report",
            str(report),
            "--profile",
            "x:1x3x48x192/2x3x48x192/2x3x48x192",
        ]
    )

    assert code == 0
    data = json.loads(report.read_text())
    assert data["nodes_before"] == len(onnx.load(source).graph.node)
    assert data["nodes_after"] == len(onnx.load(out).graph.node) < data["nodes_before"]
    assert {"name", "nodes_before", "nodes_after", "max_abs_diff", "seconds", "status"} <= set(data["passes"][0])
    assert [p["name"] for p in data["passes"]][:2] == ["override_input_shapes", "constants_to_initializers"]
    assert "fold_constants" in capsys.readouterr().out


def test_cli_accepts_zoo_name_and_pass_selection(tmp_path):
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    assert (
        main(["clean", "digits-cnn", "-o", str(out), "--report", str(report), "--passes", "cleanup_toposort,cse"]) == 0
    )
    assert [p["name"] for p in json.loads(report.read_text())["passes"]] == ["cleanup_toposort", "cse"]


def test_bad_input_gives_workbench_error_and_leaves_files_alone(zoo, tmp_path, capsys):
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(zoo("digits-cnn").onnx_path().read_bytes()[:300])
    digest = sha256_file(truncated)
    with pytest.raises(WorkbenchError, match="truncated"):
        clean_file(truncated, tmp_path / "out.onnx")
    assert sha256_file(truncated) == digest and not (tmp_path / "out.onnx").exists()

    good = tmp_path / "good.onnx"
    shutil.copy(zoo("digits-cnn").onnx_path(), good)
    digest = sha256_file(good)
    with pytest.raises(WorkbenchError, match="overwrite the input"):
        clean_file(good, good)
    with pytest.raises(WorkbenchError, match="2 GiB"):
        clean_model(good, CleanOptions(max_model_bytes=1000))  # the >2 GiB refusal, with a small limit
    with pytest.raises(WorkbenchError, match="not graph inputs"):
        clean_model(good, CleanOptions(profile={"nope": [(1,), (1,), (1,)]}))
    assert sha256_file(good) == digest

    assert main(["clean", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    assert main(["clean", "no-such-zoo-model", "-o", str(tmp_path / "o.onnx")]) == 2
    assert main(["clean", str(good), "-o", str(tmp_path / "o.onnx"), "--passes", "fold,cse"]) == 2
    assert main(["clean", str(good), "-o", str(tmp_path / "o.onnx"), "--shape", "image"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "unknown cleaning pass 'fold'" in err and "NAME:D0" in err
    assert not (tmp_path / "o.onnx").exists()


def test_model_with_external_data_is_cleaned(zoo, tmp_path):
    model = onnx.load(zoo("ocr-cls").onnx_path())
    path = tmp_path / "external.onnx"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="external.onnx.data",
        size_threshold=0,
    )
    result = clean_model(
        path,
        CleanOptions(passes=["constants_to_initializers", "cleanup_toposort"], profile={"x": [(1, 3, 48, 192)] * 3}),
    )
    assert result.report("constants_to_initializers").status == "accepted"
    assert not result.rolled_back


def test_cli_shape_override_and_no_check(zoo, tmp_path):
    out, report = tmp_path / "pinned.onnx", tmp_path / "r.json"
    code = main(
        [
            "clean",
            str(zoo("ocr-cls").onnx_path()),
            "-o",
            str(out),
            "--report",
            str(report),
            "--no-check",
            "--shape",
            "x:1,3,48,192",
            "--passes",
            "override_input_shapes,constants_to_initializers,fold_constants",
        ]
    )
    assert code == 0
    passes = json.loads(report.read_text())["passes"]
    assert [p["status"] for p in passes] == ["unchecked"] * 3
    dims = onnx.load(out).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, 48, 192]
