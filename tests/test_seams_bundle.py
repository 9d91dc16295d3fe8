"""Issue 23, bundles that cannot be downgraded or escaped: each case here passed `verify` (or crashed it) before.

Real bundles from a real TensorRT-RTX build of digits-cnn; the reader is also fuzzed with Hypothesis (random manifests
and random edits of a sealed bundle: never anything but a WorkbenchError or a failed check, never a pass)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from cli_runner import run_cli_forked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.engine.build import BuildOptions, EngineArtifact, engine_from_onnx
from workbench.errors import WorkbenchError
from workbench.export import TritonOptions, export_bundle, read_bundle
from workbench.export.bundle import BUNDLE_KEY_ENV, MAX_BUNDLE_DEPTH, is_bundle_dir, verify_bundle, walk_bundle
from workbench.zoo import get_entry


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> EngineArtifact:
    entry = get_entry("digits-cnn")
    out = tmp_path_factory.mktemp("seams-bundle")
    return engine_from_onnx(
        entry.load(),
        out / "digits.engine",
        BuildOptions(shapes=dict(entry.input_profiles()), precision="fp16", progress=False),
    )


@pytest.fixture(scope="module")
def sealed(artifact: EngineArtifact, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sealed bundle with a Triton repository, exported once; tests copy it."""
    return export_bundle(artifact, tmp_path_factory.mktemp("sealed") / "bundle", triton=TritonOptions()).path


def _copy(sealed: Path, tmp_path: Path, name: str = "b") -> Path:
    target = tmp_path / name
    shutil.copytree(sealed, target, symlinks=True)
    return target


def _edit_manifest(bundle: Path, edit) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _problems(bundle: Path, **kwargs) -> str:
    check = verify_bundle(bundle, **kwargs)
    assert not check.ok, "the bundle passed verify"
    return " ".join(check.problems)


def _downgrade(bundle: Path, keep_file_list: bool) -> None:
    """The issue's attack: format_version 1 (sealing off), then a garbage layer map, Triton config and plan, and an
    added shared library."""

    def edit(manifest: dict) -> None:
        manifest["format_version"] = 1
        if not keep_file_list:
            del manifest["files"]

    _edit_manifest(bundle, edit)
    (bundle / "model.layers.json").write_text("garbage")
    (bundle / "triton" / "model" / "config.pbtxt").write_text("garbage")
    (bundle / "triton" / "model" / "1" / "model.plan").write_bytes(b"garbage")
    (bundle / "triton" / "model" / "1" / "libevil.so").write_bytes(b"\x7fELF")


@pytest.mark.parametrize("keep_file_list", [True, False])
def test_a_sealed_bundle_edited_to_format_1_fails_verify(sealed: Path, tmp_path: Path, keep_file_list: bool) -> None:
    bundle = _copy(sealed, tmp_path)
    _downgrade(bundle, keep_file_list)
    assert "format_version 1" in _problems(bundle)
    with pytest.raises(WorkbenchError, match="format_version 1"):
        read_bundle(bundle)
    run = run_cli_forked(["verify", str(bundle)], tmp_path)
    assert run.returncode == 2 and "format_version 1" in run.stderr and "Traceback" not in run.stderr
    if keep_file_list:  # a sealed bundle's file list gives the edit away even with --allow-unsealed
        assert "edited down" in _problems(bundle, allow_unsealed=True)


def test_format_1_only_with_allow_unsealed_and_never_with_a_key(
    sealed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _copy(sealed, tmp_path)
    shutil.rmtree(bundle / "triton")

    def old_format(manifest: dict) -> None:
        manifest["format_version"] = 1
        for key in ("files", "layers", "triton"):
            manifest.pop(key)

    _edit_manifest(bundle, old_format)
    assert "--allow-unsealed" in _problems(bundle)
    check = verify_bundle(bundle, allow_unsealed=True)
    assert check.ok and check.files_checked == 1
    run = run_cli_forked(["verify", str(bundle), "--allow-unsealed"], tmp_path)
    assert run.returncode == 0 and "only the engine is hashed" in run.stdout
    monkeypatch.setenv(BUNDLE_KEY_ENV, "k1")
    assert "is set" in _problems(bundle, allow_unsealed=True)
    run = run_cli_forked(["verify", str(bundle), "--allow-unsealed"], tmp_path, env={BUNDLE_KEY_ENV: "k1"})
    assert run.returncode == 2 and "only a sealed, signed bundle" in run.stderr


@pytest.mark.parametrize("name", ["manifest.json", "manifest.json.hmac"])
def test_manifest_names_in_subfolders_are_ordinary_unlisted_files(sealed: Path, tmp_path: Path, name: str) -> None:
    bundle = _copy(sealed, tmp_path)
    (bundle / "triton" / "model" / name).write_text('{"format": "evil"}')
    assert f"triton/model/{name}: not listed" in _problems(bundle)
    assert not is_bundle_dir(bundle)


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_key_is_an_error_for_export_and_verify(
    artifact: EngineArtifact, sealed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(BUNDLE_KEY_ENV, value)
    with pytest.raises(WorkbenchError, match="set but empty"):
        export_bundle(artifact, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    with pytest.raises(WorkbenchError, match="set but empty"):
        verify_bundle(sealed)
    for argv in (["verify", str(sealed)], ["export", str(artifact.engine_path), "-o", str(tmp_path / "new")]):
        run = run_cli_forked(argv, tmp_path, env={BUNDLE_KEY_ENV: value})
        assert run.returncode == 2 and "set but empty" in run.stderr, run.stderr


def test_a_key_that_is_not_utf8_is_an_error_not_a_traceback(sealed: Path, tmp_path: Path) -> None:
    key = os.fsdecode(b"\xff\xfekey")  # how undecodable bytes in the environment reach Python
    run = run_cli_forked(["verify", str(sealed)], tmp_path, env={BUNDLE_KEY_ENV: key})
    assert run.returncode == 2 and "not valid UTF-8" in run.stderr and "Traceback" not in run.stderr


def test_a_symlinked_hmac_is_never_followed_or_read(
    sealed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _copy(sealed, tmp_path)
    huge = tmp_path / "huge.bin"
    with open(huge, "wb") as handle:  # 3 GB, sparse: reading it whole took 31 s and 6.3 GB before
        handle.truncate(3 * 1024**3)
    (bundle / "manifest.json.hmac").symlink_to(huge)
    monkeypatch.setenv(BUNDLE_KEY_ENV, "k1")
    started = time.monotonic()
    problems = _problems(bundle)
    assert time.monotonic() - started < 5
    assert "symbolic link" in problems
    # a regular .hmac that is far too big is not read either
    (bundle / "manifest.json.hmac").unlink()
    with open(bundle / "manifest.json.hmac", "wb") as handle:
        handle.truncate(3 * 1024**3)
    started = time.monotonic()
    assert "above the limit" in _problems(bundle)
    assert time.monotonic() - started < 5


def test_1500_nested_folders_are_a_problem_not_a_recursion_error(sealed: Path, tmp_path: Path) -> None:
    bundle = _copy(sealed, tmp_path)
    cwd = os.getcwd()
    os.chdir(bundle)
    try:  # by relative mkdir: the absolute path would pass PATH_MAX
        for _ in range(1500):
            os.mkdir("d")
            os.chdir("d")
    finally:
        os.chdir(cwd)
    try:
        assert f"deeper than {MAX_BUNDLE_DEPTH} levels" in _problems(bundle)
        assert not is_bundle_dir(bundle)
        tree = walk_bundle(bundle)
        assert tree.problems and len(tree.files) < 20
        run = run_cli_forked(["verify", str(bundle)], tmp_path)
        assert run.returncode == 2 and "deeper than" in run.stderr and "RecursionError" not in run.stderr
    finally:  # remove the chain bottom-up (shutil.rmtree of Python 3.11 recurses and would fail on it)
        os.chdir(bundle)
        try:
            depth = 0
            while os.path.isdir("d"):
                os.chdir("d")
                depth += 1
            for _ in range(depth):
                os.chdir("..")
                os.rmdir("d")
        finally:
            os.chdir(cwd)


def test_symlinks_anywhere_are_not_followed(sealed: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    bundle = _copy(sealed, tmp_path)
    (bundle / "triton" / "link").symlink_to(outside, target_is_directory=True)
    problems = _problems(bundle)
    assert "triton/link: not listed" in problems and "secret" not in problems
    bundle = _copy(sealed, tmp_path, "b2")
    (bundle / "manifest.json").rename(tmp_path / "real-manifest.json")
    (bundle / "manifest.json").symlink_to(tmp_path / "real-manifest.json")
    with pytest.raises(WorkbenchError, match="not a workbench bundle"):
        verify_bundle(bundle)


# --- Hypothesis: the bundle reader -------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_MANIFEST_KEYS = ["format", "format_version", "engine", "backend", "target_compute_capabilities", "files", "layers"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.dictionaries(st.sampled_from(_MANIFEST_KEYS), _json_values, min_size=1, max_size=4))
def test_random_manifest_fields_are_a_check_or_an_error_and_never_pass_signed(
    artifact: EngineArtifact, tmp_path_factory, edits: dict
) -> None:
    bundle = tmp_path_factory.mktemp("hyp") / "b"
    os.environ[BUNDLE_KEY_ENV] = "hypothesis-key"
    try:
        export_bundle(artifact, bundle)
        before = (bundle / "manifest.json").read_bytes()
        _edit_manifest(bundle, lambda manifest: manifest.update(edits))
        changed = (bundle / "manifest.json").read_bytes() != before
        for allow_unsealed in (False, True):
            try:
                check = verify_bundle(bundle, allow_unsealed=allow_unsealed)
            except WorkbenchError:
                continue
            assert not (check.ok and changed), "an edited signed manifest passed"
    finally:
        del os.environ[BUNDLE_KEY_ENV]
    for allow_unsealed in (False, True):  # without the key: a check or a WorkbenchError, nothing else
        try:
            verify_bundle(bundle, allow_unsealed=allow_unsealed)
        except WorkbenchError:
            pass


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_byte_changed_in_a_sealed_file_is_caught(sealed: Path, tmp_path_factory, data) -> None:
    bundle = _copy(sealed, tmp_path_factory.mktemp("hyp"))
    # every sealed file (the unsigned manifest itself is no seal: test_random_manifest_fields_* signs it)
    files = sorted(p for p in bundle.rglob("*") if p.is_file() and p.parent != bundle or p.name.startswith("model."))
    target = data.draw(st.sampled_from(files), label="file")
    content = bytearray(target.read_bytes())
    if data.draw(st.booleans(), label="truncate") and content:
        content = content[: data.draw(st.integers(0, len(content) - 1), label="length")]
    else:
        index = data.draw(st.integers(0, max(0, len(content) - 1)), label="index")
        if content:
            content[index] ^= data.draw(st.integers(1, 255), label="xor")
        else:
            content = bytearray(b"x")
    target.write_bytes(bytes(content))
    try:
        check = verify_bundle(bundle)
    except WorkbenchError:
        return
    assert not check.ok


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    paths=st.lists(
        st.lists(
            st.sampled_from(["a", "b", "manifest.json", "manifest.json.hmac", "..", "model.engine"]),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=4,
    ),
    as_link=st.booleans(),
)
def test_added_files_and_links_anywhere_fail_verify(sealed: Path, tmp_path_factory, paths, as_link: bool) -> None:
    bundle = _copy(sealed, tmp_path_factory.mktemp("hyp"))
    added = False
    for parts in paths:
        if ".." in parts or parts == ["manifest.json.hmac"]:  # only the top-level .hmac is special (a signature)
            continue
        path = bundle.joinpath(*parts)
        if (
            path.exists()
            or path.is_symlink()
            or any(p.is_file() for p in path.parents if p != bundle and bundle in p.parents)
        ):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if as_link:
            path.symlink_to("/etc/hostname")
        else:
            path.write_text("added")
        added = True
    if not added:
        return
    assert not verify_bundle(bundle).ok
    assert not is_bundle_dir(bundle)
