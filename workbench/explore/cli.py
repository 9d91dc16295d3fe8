"""``workbench explore``: open the engine explorer on a build, or export its graphs and node data."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.calib.diff import LayerDiff
    from workbench.timing.layer_profile import LayerProfile


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "explore",
        help="open the engine explorer (Model Explorer) on a build; --export writes shareable graph/node-data JSON",
        description="Show a build as two linked graphs in Google's Model Explorer: the ONNX graph grouped by the engine "
        "layer that executes each node, and the engine graph. BUILD is an .engine (with its .layers.json), a "
        ".layers.json, or a zoo name / .onnx (built here at --precision).",
    )
    parser.add_argument("build", help="MODEL.engine, MODEL.layers.json, a zoo name or an .onnx path")
    parser.add_argument("--compare", help="a second build shown beside the first, fusions gained/lost marked")
    parser.add_argument("--diff", help="DIFF.json from `workbench diff`: INT8 damage overlays")
    parser.add_argument("--profile", help="a per-layer profile JSON (LayerProfile): layer-time overlay")
    parser.add_argument(
        "--precision", default=None, choices=["fp32", "fp16"], help="when BUILD is a model (default fp32)"
    )
    parser.add_argument("--export", metavar="DIR", help="write the graphs JSON and node-data JSON here and exit")
    parser.add_argument(
        "--print-url",
        action="store_true",
        help="print only the page URL on stdout (the summary goes to stderr) and serve until Ctrl+C",
    )
    parser.set_defaults(func=_cli_explore)


def _cli_explore(args: argparse.Namespace) -> int:
    from workbench._io import read_json, validate_outputs

    # outputs and JSON inputs are checked before any build (issue 12): --export is a folder (existing ones are reused)
    validate_outputs(
        {"--export": args.export},
        inputs=[args.build, args.compare, args.diff, args.profile],
        directories=("--export",),
        overwrite=True,
        is_ours=lambda path: True,
    )
    if args.export:  # a user's README.txt / view.json / lint.json there is never overwritten (issue 23)
        from workbench._io import refuse_foreign_outputs

        refuse_foreign_outputs(args.export, ["README.txt", "view.json", "lint.json"], label="--export")
    if args.precision is not None:
        built = [str(b) for b in (args.build, args.compare) if b and str(b).endswith((".engine", ".json", ".log"))]
        if len(built) == len([b for b in (args.build, args.compare) if b]):
            from workbench.errors import WorkbenchError

            raise WorkbenchError(
                f"--precision {args.precision} picks the precision of a build made here, but {' and '.join(built)} "
                "are already built.",
                expected="--precision with a zoo name or an .onnx path, or no --precision",
            )
    args.precision = args.precision or "fp32"
    diff = profile = None
    if args.diff:
        from workbench.calib.diff import LayerDiff

        diff = LayerDiff.from_json(read_json(args.diff, what="DIFF.json written by `workbench diff`"))
    if args.profile:
        from workbench.timing.layer_profile import LayerProfile

        profile = LayerProfile.from_json(read_json(args.profile, what="a LayerProfile JSON"))
    try:
        return _build_and_serve(args, diff, profile)
    finally:  # now, not at interpreter exit: the session folder (builds, graphs) is gone when the command returns
        from workbench.explore.server import remove_session_folder, stop_server

        stop_server()
        remove_session_folder()


def _build_and_serve(args: argparse.Namespace, diff: LayerDiff | None, profile: LayerProfile | None) -> int:
    from workbench.explore.explorer import build_explorer

    if not args.export:  # the server comes up while the graphs are written (the URL waits for it)
        from workbench.explore.server import start_server_in_background

        start_server_in_background()
    explorer = build_explorer(args.build, compare=args.compare, diff=diff, profile=profile, precision=args.precision)
    info = sys.stderr if args.print_url else sys.stdout  # with --print-url, stdout is the URL alone
    print(explorer.summary(), file=info)
    for report in explorer.lint_reports:
        for finding in report.findings:
            print(f"[{finding.severity}] {finding.kind} {finding.layer}: {finding.message}", file=info)
    if args.export:
        out = explorer.export(args.export)
        print(
            f"wrote {len(explorer.graph_files)} graphs JSON and {len(explorer.node_data_files)} node-data files to {out}"
        )
        print(f"open with: cd {out} && model-explorer " + ",".join(p.name for p in explorer.graph_files))
        return 0
    print(explorer.url, flush=True)
    print(
        "serving on 127.0.0.1 until Ctrl+C (open the URL above in a browser on this machine; it holds this session's "
        "token, and the server answers nothing without it)",
        file=info,
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    return 0
