"""Issue 23, nothing deleted that we did not write: each case here lost a user's file (exit 0) before the fix.

Real exports of a real TensorRT-RTX build; the "folder appears while export runs" race is made certain (not left to
timing) by creating the folder from inside the export, after its output checks and before the bundle is placed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_runner import run_cli_forked, snapshot

import workbench.export.bundle as bundle_module
from workbench._io import OWNED_OUTPUTS_FILE, record_outputs, refuse_foreign_outputs
from workbench.cli import main
from workbench.engine.build import BuildOptions, EngineArtifact, engine_from_onnx
from workbench.errors import WorkbenchError
from workbench.export import export_bundle, read_bundle
from workbench.zoo import get_entry


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> EngineArtifact:
    entry = get_entry("digits-cnn")
    out = tmp_path_factory.mktemp("seams-files")
    return engine_from_onnx(
        entry.load(),
        out / "digits.engine",
        BuildOptions(shapes=dict(entry.input_profiles()), precision="fp32", progress=False),
    )


def _during_export(monkeypatch: pytest.MonkeyPatch, action) -> None:
    """Run ``action`` inside export_bundle, after its output checks and before the bundle is placed."""
    original = bundle_module.check_plausible_engine

    def hooked(path: Path) -> None:
        original(path)
        action()

    monkeypatch.setattr(bundle_module, "check_plausible_engine", hooked)


def test_a_folder_created_at_the_new_target_during_export_is_never_swapped_out(
    artifact: EngineArtifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "NEW"

    def user_creates_it() -> None:
        target.mkdir()
        (target / "thesis.tex").write_text("years of work")

    _during_export(monkeypatch, user_creates_it)
    with pytest.raises(WorkbenchError, match="appeared while this command ran"):
        export_bundle(artifact, target)
    assert (target / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in target.iterdir()) == ["thesis.tex"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["NEW"]  # no staging folder left either


def test_an_empty_folder_created_meanwhile_is_not_replaced_either(
    artifact: EngineArtifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "NEW"
    _during_export(monkeypatch, target.mkdir)
    with pytest.raises(WorkbenchError, match="appeared"):
        export_bundle(artifact, target)
    assert target.is_dir() and not list(target.iterdir())


def test_overwrite_refuses_a_bundle_holding_a_user_manifest_json_in_a_subfolder(
    artifact: EngineArtifact, tmp_path: Path
) -> None:
    bundle = export_bundle(artifact, tmp_path / "b").path
    (bundle / "notes").mkdir()
    (bundle / "notes" / "manifest.json").write_text('{"mine": true}')  # skipped by name at every depth before
    before = snapshot(bundle)
    run = run_cli_forked(["export", str(artifact.engine_path), "-o", str(bundle), "--overwrite"], tmp_path)
    assert run.returncode == 2 and "still verifies" in run.stderr, run.stderr
    assert snapshot(bundle) == before


def test_overwrite_never_cleans_a_format_1_bundle(artifact: EngineArtifact, tmp_path: Path) -> None:
    bundle = export_bundle(artifact, tmp_path / "b").path
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["format_version"] = 1
    del manifest["files"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    (bundle / "my-results.csv").write_text("a,b\n1,2\n")  # a format-1 bundle has no file list: this was deleted
    before = snapshot(bundle)
    with pytest.raises(WorkbenchError, match="still verifies"):
        export_bundle(artifact, bundle, overwrite=True)
    assert snapshot(bundle) == before


def test_overwrite_refuses_when_a_user_file_appears_before_the_swap(
    artifact: EngineArtifact, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = export_bundle(artifact, tmp_path / "b").path
    _during_export(monkeypatch, lambda: (bundle / "added-meanwhile.txt").write_text("mine"))
    with pytest.raises(WorkbenchError, match="left untouched"):
        export_bundle(artifact, bundle, overwrite=True)
    assert (bundle / "added-meanwhile.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_overwrite_replaces_our_own_bundle_and_deletes_only_its_listed_files(
    artifact: EngineArtifact, tmp_path: Path
) -> None:
    from workbench.export import TritonOptions

    first = export_bundle(artifact, tmp_path / "b", triton=TritonOptions())
    assert (first.path / "triton").is_dir()
    second = export_bundle(artifact, tmp_path / "b", overwrite=True)
    assert second.manifest["triton"] is None and not (second.path / "triton").exists()
    assert read_bundle(second.path).manifest["created_utc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no staging or kept folder


def test_explore_export_refuses_to_overwrite_the_users_files(artifact: EngineArtifact, tmp_path: Path) -> None:
    share = tmp_path / "share"
    share.mkdir()
    for name, text in (("README.txt", "my readme"), ("view.json", '{"mine": 1}'), ("lint.json", "[]")):
        (share / name).write_text(text)
    before = snapshot(share)
    run = run_cli_forked(["explore", str(artifact.engine_path), "--export", str(share)], tmp_path)
    assert run.returncode == 2 and "not written by the workbench" in run.stderr and "README.txt" in run.stderr
    assert snapshot(share) == before
    # a folder of our own earlier export is refreshed; a file the user changed since is refused
    fresh = tmp_path / "fresh"
    assert main(["explore", str(artifact.engine_path), "--export", str(fresh)]) == 0
    assert (fresh / OWNED_OUTPUTS_FILE).is_file()
    assert main(["explore", str(artifact.engine_path), "--export", str(fresh)]) == 0
    (fresh / "view.json").write_text('{"edited": true}')
    assert main(["explore", str(artifact.engine_path), "--export", str(fresh)]) == 2
    assert (fresh / "view.json").read_text() == '{"edited": true}'


def test_demo_out_refuses_to_overwrite_the_users_report_and_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("<p>my own report</p>")
    (out / "run.json").write_text('{"mine": true}')
    before = snapshot(out)
    run = run_cli_forked(["demo", "--model", "digits-cnn", "--out", str(out)], tmp_path, timeout=300)
    assert run.returncode == 2 and "report.html, run.json" in run.stderr and "not written" in run.stderr
    assert snapshot(out) == before


def test_owned_output_records(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("ours")
    with pytest.raises(WorkbenchError, match="a.txt"):
        refuse_foreign_outputs(folder, ["a.txt", "b.txt"], label="-o")
    record_outputs(folder, [folder / "a.txt"])
    refuse_foreign_outputs(folder, ["a.txt", "b.txt"], label="-o")  # ours, unchanged: may be replaced
    (folder / "a.txt").write_text("changed by the user")
    with pytest.raises(WorkbenchError, match="changed"):
        refuse_foreign_outputs(folder, ["a.txt"], label="-o")
    (folder / "a.txt").unlink()
    (folder / "a.txt").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(WorkbenchError, match="a.txt"):
        refuse_foreign_outputs(folder, ["a.txt"], label="-o")
    shutil.rmtree(folder)
    folder.mkdir()
    (folder / OWNED_OUTPUTS_FILE).write_text("not ours")
    with pytest.raises(WorkbenchError, match="not the workbench's record"):
        refuse_foreign_outputs(folder, ["x"], label="-o")
