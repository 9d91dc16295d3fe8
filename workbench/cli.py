"""`workbench` command line. Each feature module contributes its subcommands through ``register(subparsers)``.

Errors the user can fix (WorkbenchError) print one readable line on stderr and exit 2; no traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from workbench.errors import WorkbenchError

# Modules that define ``register(subparsers)``; each owns its own subcommands so features stay independent.
COMMAND_MODULES: tuple[str, ...] = (
    "workbench.calib.cli",
    "workbench.doctor",
    "workbench.zoo.cli",
    "workbench.build",
    "workbench.demo",
    "workbench.clean.cli",
    "workbench.fusions_cli",
    "workbench.timing.cli",
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="TensorRT optimization workbench: clean ONNX, build engines, calibrate INT8, time pipelines, export.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def _version() -> str:
    from workbench import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        result = args.func(args)
    except WorkbenchError as error:
        print(f"workbench {args.command}: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly, as Unix tools do
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"workbench {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
