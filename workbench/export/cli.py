"""CLI: ``workbench export`` (an engine bundle, optionally with a Triton model repository)."""

from __future__ import annotations

import argparse
from pathlib import Path

from workbench._args import bounded_int
from workbench._io import read_json, validate_outputs
from workbench.engine import EngineArtifact
from workbench.errors import WorkbenchError
from workbench.export.bundle import BUNDLE_KEY_ENV, MANIFEST_HMAC_FILE, export_bundle, is_bundle_dir, verify_bundle
from workbench.export.triton import TritonOptions
from workbench.precision import PrecisionPlan


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser(
        "export",
        help="write an engine bundle (engine, manifest.json, layer map, optional Triton repository)",
        description="Write BUNDLE/ atomically: model.engine, manifest.json (ONNX sha256, backend and version, target "
        "compute capabilities, precision plan, layer map, build options, and calibration cache / accuracy / timing when "
        "given), model.layers.json, and with --triton a Triton model repository validated against Triton's schema.",
    )
    export.add_argument("engine", help="engine written by `workbench build` (its .layers.json must lie beside it)")
    export.add_argument("-o", "--output", required=True, help="bundle directory to create")
    export.add_argument("--layers", help="layer records if not ENGINE's .layers.json")
    export.add_argument("--plan", help="precision plan JSON used for the build")
    export.add_argument("--calibration-cache", help="INT8 calibration cache to include")
    export.add_argument("--accuracy", help="accuracy results JSON to record")
    export.add_argument("--timing", help="timing results JSON to record")
    export.add_argument("--triton", action="store_true", help="also write a Triton model repository")
    export.add_argument("--model-name", default=None, help="Triton model name (default: model)")
    export.add_argument(
        "--max-batch",
        type=bounded_int(0, 2**31 - 1),
        help="Triton max_batch_size (default: the profile's max batch, 0 if static)",
    )
    export.add_argument(
        "--instances", type=bounded_int(1, 4096), default=None, help="Triton instance count (default 1)"
    )
    export.add_argument(
        "--no-dynamic-batching", action="store_true", help="leave dynamic batching off in the Triton config"
    )
    export.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing bundle directory (only one written by `workbench export` that still verifies; "
        "atomically; only the files its manifest lists are deleted)",
    )
    export.set_defaults(func=_cli_export)

    verify = subparsers.add_parser(
        "verify",
        help="check an exported bundle against its manifest (exit 0 intact, 2 with what differs)",
        description="Verify BUNDLE/ without trusting it: manifest schema, every path relative and inside the bundle "
        "(no '..', absolute paths or symlinks), every file's size and sha256, no unlisted files, engine and layer "
        f"records belonging together, and the manifest's HMAC when {BUNDLE_KEY_ENV} is set.",
    )
    verify.add_argument("bundle", help="bundle directory written by `workbench export`")
    verify.add_argument(
        "--allow-unsealed",
        action="store_true",
        help="also accept a format-1 bundle (older exports: only the engine is hashed); never when "
        f"{BUNDLE_KEY_ENV} is set",
    )
    verify.set_defaults(func=_cli_verify)


def _read_json(path: str | None, what: str) -> dict | None:
    if path is None:
        return None
    data = read_json(Path(path), what=f"a JSON {what} file", max_bytes=16 * 1024 * 1024)
    if not isinstance(data, dict):
        raise WorkbenchError(f"{path}: the {what} JSON is a {type(data).__name__}.", expected="a JSON object")
    return data


def _refuse_inside_bundle(output: str) -> None:
    """A new bundle inside a sealed one adds unlisted files to it, so the old bundle no longer verifies."""
    from workbench.export.bundle import BUNDLE_FORMAT, MANIFEST_FILE

    def sealed(folder: Path) -> bool:
        manifest = folder / MANIFEST_FILE
        if not manifest.is_file():
            return False
        try:
            data = read_json(manifest, what="a bundle manifest", max_bytes=64 * 1024 * 1024)
        except WorkbenchError:
            return False
        return isinstance(data, dict) and data.get("format") == BUNDLE_FORMAT

    target = Path(output).resolve()
    for folder in target.parents:
        if sealed(folder):
            raise WorkbenchError(
                f"-o {output}: lies inside the bundle {folder}; writing there would add files its manifest does not "
                "list, and that bundle would fail `workbench verify`.",
                expected="a bundle folder outside every existing bundle",
            )


def _cli_export(args: argparse.Namespace) -> int:
    from workbench.engine.build import layers_path_for
    from workbench.export.bundle import _bundle_key

    _bundle_key()  # an empty or undecodable key: refused before any work

    validate_outputs(
        {"-o": args.output},
        inputs=[
            args.engine,
            args.layers or layers_path_for(args.engine),
            args.plan,
            args.calibration_cache,
            args.accuracy,
            args.timing,
        ],
        directories=("-o",),
        overwrite=args.overwrite,
        is_ours=is_bundle_dir,
        ours="a bundle written by `workbench export` that still verifies (format 2, nothing added or changed)",
    )
    if not args.triton:  # Triton options without --triton would be dropped without a word
        given = [
            flag
            for flag, value in (
                ("--model-name", args.model_name),
                ("--max-batch", args.max_batch),
                ("--instances", args.instances),
                ("--no-dynamic-batching", args.no_dynamic_batching or None),
            )
            if value is not None
        ]
        if given:
            raise WorkbenchError(
                f"{', '.join(given)} configure the Triton repository, which is written only with --triton.",
                expected=f"--triton {' '.join(given)}, or none of them",
            )
    _refuse_inside_bundle(args.output)
    triton = None
    if args.triton:
        triton = TritonOptions(
            model_name=args.model_name if args.model_name is not None else "model",
            max_batch_size=args.max_batch,
            instance_count=args.instances if args.instances is not None else 1,
            dynamic_batching=not args.no_dynamic_batching,
        )
    bundle = export_bundle(
        EngineArtifact.load(args.engine, args.layers),
        args.output,
        plan=PrecisionPlan.load(args.plan) if args.plan else None,
        calibration_cache=args.calibration_cache,
        accuracy=_read_json(args.accuracy, "accuracy"),
        timing=_read_json(args.timing, "timing"),
        triton=triton,
        overwrite=args.overwrite,
    )
    manifest = bundle.manifest
    print(f"bundle      {bundle.path}")
    print(f"engine      {manifest['engine']['bytes'] / 1e6:.2f} MB  sha256 {manifest['engine']['sha256'][:16]}…")
    print(
        f"backend     {manifest['backend']['name']} {manifest['backend']['version']}; runs on compute capability "
        + ", ".join(manifest["target_compute_capabilities"])
    )
    if manifest.get("fp8"):
        print(f"fp8         {manifest['fp8']['layers']} FP8 layers: runs on {manifest['fp8']['runs_on']}")
    if manifest.get("quantization"):
        print(f"quantized   {manifest['quantization']['text']}")
    if (bundle.path / MANIFEST_HMAC_FILE).is_file():
        print(f"signed      {MANIFEST_HMAC_FILE} (HMAC-SHA256 of the manifest with {BUNDLE_KEY_ENV})")
    print(
        f"sealed      {len(manifest['files'])} files hashed in manifest.json; check with `workbench verify {bundle.path}`"
    )
    if manifest["triton"]:
        print(f"triton      {bundle.path / manifest['triton']['config']} (validated with Triton's ModelConfig schema)")
    return 0


def _cli_verify(args: argparse.Namespace) -> int:
    check = verify_bundle(args.bundle, allow_unsealed=args.allow_unsealed)
    for note in check.notes:
        print(f"note: {note}")
    if not check.ok:
        raise WorkbenchError(
            f"{check.path}: {len(check.problems)} problem(s): " + "; ".join(check.problems) + ".",
            expected="a bundle whose files match its manifest",
            hint="the bundle was modified after export; re-export it",
        )
    if check.signed:
        signature = "HMAC checked"
    elif (check.path / MANIFEST_HMAC_FILE).is_file():
        signature = f"signed, signature not checked (no {BUNDLE_KEY_ENV})"
    else:
        signature = "unsigned (hashes checked; see README for what that protects)"
    print(f"ok          {check.path}: {check.files_checked} file(s) match the manifest; {signature}")
    return 0
